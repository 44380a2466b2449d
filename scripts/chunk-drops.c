/* What one 2 MiB chunk's drop costs (the residency cap's unit): gcc -O2 scripts/chunk-drops.c -o /tmp/drops && /tmp/drops FILE (a file of at least 256 MiB on a disk file system, written back). Maps it shared and advised random, then for every page and for one page in 8 resident: drops each chunk with MADV_DONTNEED + POSIX_FADV_DONTNEED, or with one MADV_PAGEOUT; prints the pages mincore finds before and after and the time per chunk. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif
static double now_ms(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
static size_t resident(char*p,size_t n){size_t np=n/4096,r=0;unsigned char*v=malloc(np);mincore(p,n,v);for(size_t i=0;i<np;i++)r+=v[i]&1;free(v);return r;}
int main(int c,char**a){
 if(c<2){fprintf(stderr,"usage: %s FILE\n",a[0]);return 2;}
 size_t n=(size_t)256<<20,ch=(size_t)2<<20;int fd=open(a[1],O_RDONLY);if(fd<0){perror(a[1]);return 1;}
 char*p=mmap(0,n,PROT_READ,MAP_SHARED,fd,0);if(p==MAP_FAILED){perror("mmap");return 1;}
 madvise(p,n,MADV_RANDOM);volatile long s=0;
 for(int mode=0;mode<4;mode++){size_t stride=(mode&2)?4096*8:4096;
  for(size_t i=0;i<n;i+=stride)s+=p[i];
  size_t r0=resident(p,n);double t0=now_ms();
  for(size_t o=0;o<n;o+=ch){if(mode&1)madvise(p+o,ch,MADV_PAGEOUT);else{madvise(p+o,ch,MADV_DONTNEED);posix_fadvise(fd,o,ch,POSIX_FADV_DONTNEED);}}
  double t1=now_ms();
  printf("%-28s 1 page in %zu resident: %6zu pages before, %3zu after, %.3f ms per chunk\n",(mode&1)?"MADV_PAGEOUT":"MADV_DONTNEED+FADV_DONTNEED",stride/4096,r0,resident(p,n),(t1-t0)/(n/ch));}
 return 0;}

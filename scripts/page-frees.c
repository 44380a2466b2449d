/* What frees a shared file mapping's memory: gcc -O2 scripts/page-frees.c -o /tmp/frees && /tmp/frees FILE (a file of at least 512 MiB on a disk file system). Prints mincore residency, VmRSS and Cached after MADV_DONTNEED, POSIX_FADV_DONTNEED, both, and MADV_PAGEOUT. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
static long cached_kb(void){FILE*f=fopen("/proc/meminfo","r");char l[256];long v=-1;while(fgets(l,sizeof l,f))if(!strncmp(l,"Cached:",7))v=atol(l+7);fclose(f);return v;}
static long rss_kb(void){FILE*f=fopen("/proc/self/status","r");char l[256];long v=-1;while(fgets(l,sizeof l,f))if(!strncmp(l,"VmRSS:",6))v=atol(l+6);fclose(f);return v;}
static size_t resident(char*p,size_t n){size_t ps=4096,np=n/ps,r=0;unsigned char*v=malloc(np);mincore(p,n,v);for(size_t i=0;i<np;i++)r+=v[i]&1;free(v);return r*4;}
int main(int c,char**a){size_t n=(size_t)512<<20;int fd=open(a[1],O_RDONLY);char*p=mmap(0,n,PROT_READ,MAP_SHARED,fd,0);
 volatile long s=0; for(size_t i=0;i<n;i+=4096)s+=p[i];
 printf("touched:        resident(mincore) %zu KiB, RSS %ld KiB, Cached %ld KiB\n",resident(p,n),rss_kb(),cached_kb());
 madvise(p,n,MADV_DONTNEED);
 printf("MADV_DONTNEED:  resident %zu KiB, RSS %ld KiB, Cached %ld KiB\n",resident(p,n),rss_kb(),cached_kb());
 for(size_t i=0;i<n;i+=4096)s+=p[i];
 posix_fadvise(fd,0,n,POSIX_FADV_DONTNEED);
 printf("touched again, FADV_DONTNEED (still mapped): resident %zu KiB, RSS %ld KiB, Cached %ld KiB\n",resident(p,n),rss_kb(),cached_kb());
 madvise(p,n,MADV_DONTNEED); posix_fadvise(fd,0,n,POSIX_FADV_DONTNEED);
 printf("MADV_DONTNEED then FADV_DONTNEED: resident %zu KiB, RSS %ld KiB, Cached %ld KiB\n",resident(p,n),rss_kb(),cached_kb());
 for(size_t i=0;i<n;i+=4096)s+=p[i];
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif
 int r=madvise(p,n,MADV_PAGEOUT);
 printf("touched again, MADV_PAGEOUT (rc %d): resident %zu KiB, RSS %ld KiB, Cached %ld KiB\n",r,resident(p,n),rss_kb(),cached_kb());
 return 0;}

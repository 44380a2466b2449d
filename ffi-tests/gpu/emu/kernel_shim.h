/*
 * What CUDA C++ provides to kernels/ple_kernels.cu, for a host build of that same file (the
 * emulated driver's kernels, host_kernels.cpp): the qualifiers, CUDA's built-in index variables
 * (per emulated CUDA thread), __syncthreads (a barrier of the block's fibers, emu_runtime.h),
 * atomics and fences, the conversion intrinsics (round to nearest even, as the PTX they stand
 * for), %globaltimer, and a host equivalent of every inline-PTX macro of the .cu (PTX_*).
 * Compiled with -ffp-contract=off: every fp32 product and sum rounds once, as __fmul_rn/__fadd_rn.
 */
#ifndef PLE_KERNEL_SHIM_H
#define PLE_KERNEL_SHIM_H

#define PLE_HOST_SHIM 1

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "emu_runtime.h"

#define __device__
#define __global__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(n)
/* one copy per block: a block's CUDA threads are fibers of one OS thread, blocks of a launch run
 * one after the other on it, and no two launches share an OS thread at a time */
#define __shared__ static thread_local

struct uint2 {
    unsigned int x, y;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};

#define threadIdx (emu_thread_idx)
#define blockIdx (emu_block_idx)
#define blockDim (emu_block_dim)
#define gridDim (emu_grid_dim)

static inline void __syncthreads(void) { emu_syncthreads(); }
static inline void __threadfence_system(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

static inline unsigned int atomicCAS(unsigned int *a, unsigned int cmp, unsigned int val) {
    __atomic_compare_exchange_n(a, &cmp, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp; /* the old value, whether or not it was swapped */
}

static inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
static inline int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, 4);
    return i;
}
/* x86-64 SSE / AArch64 scalar fp32 arithmetic is IEEE binary32, round to nearest even, no FTZ */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }

/* These conversions stand in for the PTX instructions the kernels use; they are deliberately not
 * common.h's ref_f16/ref_bf16. common.h is the tests' independent oracle (integer arithmetic), so the
 * emulated kernels' output is checked against a second implementation, not against itself.
 * cvt.rn.f16.f32: GCC's _Float16 conversion (IEEE, the current rounding mode: nearest even) */
static inline unsigned short emu_f32_to_f16_rn(float f) {
    _Float16 h = (_Float16)f;
    unsigned short b;
    memcpy(&b, &h, 2);
    return b;
}
static inline float emu_f16_to_f32(unsigned short b) {
    _Float16 h;
    memcpy(&h, &b, 2);
    return (float)h;
}
/* cvt.rn.bf16.f32 for a non-NaN input (the kernels handle NaN first): round to nearest even on
 * the 16 dropped bits; overflow carries into the exponent and gives infinity, as the PTX does */
static inline unsigned short emu_f32_to_bf16_rn(float f) {
    unsigned int x;
    memcpy(&x, &f, 4);
    return (unsigned short)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

static inline unsigned long long emu_globaltimer_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}
static inline void emu_nanosleep(unsigned int ns) {
    struct timespec ts = {0, (long)ns};
    nanosleep(&ts, 0);
}

/* the inline PTX of the .cu */
#define PTX_LD_ACQUIRE_SYS_U64(v, a) ((v) = __atomic_load_n((const unsigned long long *)(a), __ATOMIC_ACQUIRE))
#define PTX_GLOBALTIMER(t) ((t) = emu_globaltimer_ns())
#define PTX_NANOSLEEP(ns) emu_nanosleep(ns)
/* ld.global.cv: a fresh load of memory another agent (the host) writes: volatile */
#define PTX_LD_CV_U8(v, p) ((v) = *(const volatile unsigned char *)(p))
#define PTX_LD_CV_U16(v, p) ((v) = *(const volatile unsigned short *)(p))
#define PTX_LD_CV_V2(v, p)                                                                         \
    ((v).x = ((const volatile unsigned int *)(p))[0], (v).y = ((const volatile unsigned int *)(p))[1])
#define PTX_LD_CV_V4(v, p)                                                                         \
    ((v).x = ((const volatile unsigned int *)(p))[0], (v).y = ((const volatile unsigned int *)(p))[1], \
     (v).z = ((const volatile unsigned int *)(p))[2], (v).w = ((const volatile unsigned int *)(p))[3])
#define PTX_CVT_RN_F16_F32(h, f) ((h) = emu_f32_to_f16_rn(f))
#define PTX_CVT_RN_BF16_F32(h, f) ((h) = emu_f32_to_bf16_rn(f))
#define PTX_CVT_F32_F16(f, h) ((f) = emu_f16_to_f32(h))

#endif

/*
 * The emulated driver's execution model for kernels (shared by the driver, cuda_emu.cpp, and the
 * host build of the kernels, host_kernels.cpp). A launch runs its grid on the stream's OS thread,
 * block after block; the CUDA threads of a block are fibers (ucontext) of that OS thread, run one
 * at a time until each reaches __syncthreads (then the next) or returns, so a barrier holds for
 * the whole block before any thread passes it. The built-in index variables are those of the fiber
 * running.
 */
#ifndef PLE_EMU_RUNTIME_H
#define PLE_EMU_RUNTIME_H

#include <stddef.h>

struct emu_dim3 {
    unsigned int x, y, z;
};

extern thread_local emu_dim3 emu_thread_idx, emu_block_idx, emu_block_dim, emu_grid_dim;

/* __syncthreads: the running fiber yields to the block's scheduler (a no-op in a 1-thread block) */
void emu_syncthreads(void);

/* A kernel of the host build: its PTX entry name, its parameter block's size, and a trampoline
 * that calls it with the block (copied from the launch's parameters). */
struct emu_host_kernel {
    const char *name;
    size_t param_bytes;
    void (*run)(const void *params);
};

extern const emu_host_kernel emu_host_kernels[];
extern const size_t emu_host_kernel_count;

#endif

/*
 * Runs a kernel launch of the emulated driver on the calling (stream) thread: block after block;
 * in a block of more than one thread every CUDA thread is a fiber (ucontext), run in turn until it
 * reaches __syncthreads or returns, round after round, so no thread passes a barrier before every
 * thread of its block reached it (emu_runtime.h).
 */
#include <sys/mman.h>
#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "emu.h"

thread_local emu_dim3 emu_thread_idx, emu_block_idx, emu_block_dim, emu_grid_dim;

namespace emu {
namespace {

constexpr size_t FIBER_STACK = 64 << 10;

struct BlockRun {
    ucontext_t sched;
    std::vector<ucontext_t> fib;
    std::vector<char *> stacks;
    std::vector<unsigned char> done;
    size_t cur = 0, remaining = 0;
    bool active = false;
    const emu_host_kernel *k = nullptr;
    const void *params = nullptr;
};

thread_local BlockRun t_run;

void fiber_main() {
    BlockRun &b = t_run;
    b.k->run(b.params);
    b.done[b.cur] = 1;
    b.remaining--;
    /* returning resumes uc_link: the scheduler */
}

void set_tid(size_t i) {
    unsigned bx = emu_block_dim.x, by = emu_block_dim.y;
    emu_thread_idx = {unsigned(i % bx), unsigned((i / bx) % by), unsigned(i / (size_t(bx) * by))};
}

void run_block(const emu_host_kernel *k, const void *params) {
    size_t n = size_t(emu_block_dim.x) * emu_block_dim.y * emu_block_dim.z;
    if (n == 1) {
        emu_thread_idx = {0, 0, 0};
        k->run(params);
        return;
    }
    BlockRun &b = t_run;
    while (b.stacks.size() < n) {
        void *s = mmap(nullptr, FIBER_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        if (s == MAP_FAILED) {
            perror("cuda-emu: fiber stack");
            abort();
        }
        b.stacks.push_back(static_cast<char *>(s));
    }
    b.fib.resize(n);
    b.done.assign(n, 0);
    b.k = k;
    b.params = params;
    b.remaining = n;
    for (size_t i = 0; i < n; i++) {
        getcontext(&b.fib[i]);
        b.fib[i].uc_stack.ss_sp = b.stacks[i];
        b.fib[i].uc_stack.ss_size = FIBER_STACK;
        b.fib[i].uc_link = &b.sched;
        makecontext(&b.fib[i], fiber_main, 0);
    }
    b.active = true;
    while (b.remaining) {
        for (size_t i = 0; i < n; i++) {
            if (b.done[i]) continue;
            b.cur = i;
            set_tid(i);
            swapcontext(&b.sched, &b.fib[i]);
        }
    }
    b.active = false;
}

} // namespace

void run_kernel(const Op &op) {
    emu_grid_dim = op.grid;
    emu_block_dim = op.block;
    const emu_host_kernel *k = op.fn->host;
    for (unsigned z = 0; z < op.grid.z; z++)
        for (unsigned y = 0; y < op.grid.y; y++)
            for (unsigned x = 0; x < op.grid.x; x++) {
                emu_block_idx = {x, y, z};
                run_block(k, op.params.data());
            }
}

} // namespace emu

void emu_syncthreads(void) {
    emu::BlockRun &b = emu::t_run;
    if (!b.active) return; /* a one-thread block */
    swapcontext(&b.fib[b.cur], &b.sched);
}

/*
 * libple's kernels built for the host: kernels/ple_kernels.cu itself, compiled by g++ with the
 * shim of CUDA's built-ins (kernel_shim.h), and the table the emulated driver looks kernels up in
 * by their PTX entry names. Nothing of the kernels' bodies is here.
 */
#include "kernel_shim.h"

#include "../../../kernels/ple_kernels.cu" /* built with -Wno-unknown-pragmas (#pragma unroll) */

template <class P, void (*K)(P)> static void trampoline(const void *params) {
    P p;
    memcpy(&p, params, sizeof p);
    K(p);
}

const emu_host_kernel emu_host_kernels[] = {
    {"ple_wait_gate", sizeof(WaitParams), trampoline<WaitParams, ple_wait_gate>},
    {"ple_dequant", sizeof(DequantParams), trampoline<DequantParams, ple_dequant>},
    {"ple_graph_advance", sizeof(AdvanceParams), trampoline<AdvanceParams, ple_graph_advance>},
    {"ple_graph_set", sizeof(SetParams), trampoline<SetParams, ple_graph_set>},
};
const size_t emu_host_kernel_count = sizeof emu_host_kernels / sizeof emu_host_kernels[0];

/*
 * GPU benchmark of libple through its C API (run by device-check.sh). Writes OUTDIR/gpu_bench.json:
 *  - dequant_kernel: ple_dequant kernel time at 8192 tokens per format and output dtype, with the
 *    rows in device memory (host-wait mode, after libple's H2D copy) and read zero-copy from the
 *    mapped pinned staging (spin-kernel mode; the time includes the one-thread gate kernel); its
 *    effective bandwidth (rows read + output written), the rows' read rate (rows_GBps: the
 *    zero-copy PCIe rate in that mode) and the ratio to a device-to-device copy
 *    (cuMemcpyDtoDAsync of the output's bytes: it reads and writes them, 2x bytes moved). GPU time
 *    only: the stream is held by a host-function gate while the work is enqueued.
 *  - rows_to_device: the library's host->device copy per step (ple_stats.copy_ns) vs a pinned
 *    cuMemcpyHtoDAsync of the same bytes.
 *  - step_latency: submit -> dequant done on the stream (cuStreamSynchronize), decode (1 token:
 *    the kernel takes microseconds, so this is close to submit -> kernel start) and prefill (2048
 *    tokens), per wait mode and for a CUDA Graph replay; with the host time blocked inside
 *    ple_dequant_fuse (and so in the host wait) per step (the goal in device-wait modes: 0).
 * Usage: gpu_bench TABLE_ROOT OUTDIR
 * PLE_GPU_BENCH_REPS=N caps every repetition count at N (the emulated run: CPU time per kernel).
 */
#include <cuda.h>

#include "common.h"

static CUdevice g_dev;
static CUcontext g_ctx;
static CUstream g_s;
static int g_stream_ops;
static uint64_t g_seq;
static FILE *g_json;

static int g_gate_open;
static void CUDA_CB gate_fn(void *p) {
    (void)p;
    while (!__atomic_load_n(&g_gate_open, __ATOMIC_ACQUIRE)) {
    }
}
/* Holds the stream until gate_release(), so what is enqueued after runs back to back. */
static void gate_hold(void) {
    __atomic_store_n(&g_gate_open, 0, __ATOMIC_RELEASE);
    CU(cuLaunchHostFunc(g_s, gate_fn, NULL));
}
static void gate_release(void) { __atomic_store_n(&g_gate_open, 1, __ATOMIC_RELEASE); }

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n ? v[n / 2] : 0;
}

static double ev_ms(CUevent a, CUevent b) {
    float ms = 0;
    CU(cuEventElapsedTime(&ms, a, b));
    return ms;
}

/* `dflt` repetitions, or fewer under PLE_GPU_BENCH_REPS */
static int reps_of(int dflt) {
    const char *v = getenv("PLE_GPU_BENCH_REPS");
    int cap = v ? atoi(v) : 0;
    return cap > 0 && cap < dflt ? cap : dflt;
}

static int token_bytes(int fmt) { return 16 * row_bytes_of(fmt == 1 ? "nvfp4" : fmt == 2 ? "fp8" : "bf16"); }

static void bench_kernel(const char *root) {
    const char *fmts[3] = {"nvfp4", "fp8", "bf16"};
    const int dtypes[2] = {PLE_DTYPE_F32, PLE_DTYPE_BF16};
    const uint32_t n = 8192;
    const int reps = reps_of(15);
    CUevent e0, e1;
    CU(cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CU(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    fprintf(g_json, "  \"dequant_kernel\": [");
    int first = 1;
    for (int zc = 0; zc < 2; zc++)
    for (int f = 0; f < 3; f++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/%s", root, fmts[f]);
        ple_handle *h = NULL;
        if (open_gpu(dir, zc ? PLE_WAIT_SPIN_KERNEL : PLE_WAIT_HOST, 0, 2, &h) != PLE_OK) {
            fprintf(stderr, "open %s: %s\n", dir, ple_last_error_message());
            continue;
        }
        rng_t r = {99 + (uint64_t)f};
        batch_buf bb;
        make_batch(&bb, &r, n, 8, 1);
        for (int d = 0; d < 2; d++) {
            int es = dtype_size(dtypes[d]);
            size_t out_bytes = (size_t)n * EMBED * (size_t)es;
            CUdeviceptr out, src;
            CU(cuMemAlloc(&out, out_bytes));
            CU(cuMemAlloc(&src, out_bytes));
            CU(cuMemsetD8(src, 0x3C, out_bytes));
            double tk[32], tc[32];
            int ok = 1;
            for (int i = 0; i < reps && ok; i++) {
                uint64_t seq = ++g_seq;
                ok = ple_submit(h, &bb.b, seq) == PLE_OK && ple_wait(h, seq, UINT64_MAX) == PLE_OK;
                gate_hold();
                CU(cuEventRecord(e0, g_s));
                ok = ok && ple_dequant_fuse(h, (void *)g_s, seq, (void *)(uintptr_t)out, dtypes[d],
                                            EMBED, 0) == PLE_OK;
                CU(cuEventRecord(e1, g_s));
                gate_release();
                CU(cuStreamSynchronize(g_s));
                tk[i] = ev_ms(e0, e1);
                gate_hold();
                CU(cuEventRecord(e0, g_s));
                CU(cuMemcpyDtoDAsync(out, src, out_bytes, g_s));
                CU(cuEventRecord(e1, g_s));
                gate_release();
                CU(cuStreamSynchronize(g_s));
                tc[i] = ev_ms(e0, e1);
            }
            if (!ok) fprintf(stderr, "bench %s: %s\n", fmts[f], ple_last_error_message());
            double k = median(tk, reps), c = median(tc, reps);
            double kbytes = (double)n * token_bytes(f + 1) + (double)out_bytes;
            double kbw = kbytes / (k * 1e-3) / 1e9, cbw = 2.0 * out_bytes / (c * 1e-3) / 1e9;
            double rbw = (double)n * token_bytes(f + 1) / (k * 1e-3) / 1e9;
            fprintf(g_json,
                    "%s\n    {\"format\": \"%s\", \"dtype\": \"%s\", \"rows\": \"%s\", "
                    "\"tokens\": %u, \"ok\": %s, \"kernel_ms\": %.4f, \"kernel_GBps\": %.1f, "
                    "\"rows_GBps\": %.2f, \"d2d_copy_ms\": %.4f, \"d2d_GBps\": %.1f, "
                    "\"ratio_to_d2d\": %.3f}",
                    first ? "" : ",", fmts[f], dtype_name(dtypes[d]), zc ? "zero_copy" : "device", n,
                    ok ? "true" : "false", k, kbw, rbw, c, cbw, kbw / cbw);
            first = 0;
            fprintf(stderr,
                    "kernel %s->%s (%s rows) %u tokens: %.4f ms, %.1f GB/s, rows %.2f GB/s; D2D %.1f "
                    "GB/s; ratio %.3f\n",
                    fmts[f], dtype_name(dtypes[d]), zc ? "zero-copy" : "device", n, k, kbw, rbw, cbw,
                    kbw / cbw);
            cuMemFree(out);
            cuMemFree(src);
        }
        free_batch(&bb);
        ple_close(h);
    }
    fprintf(g_json, "\n  ],\n");
    cuEventDestroy(e0);
    cuEventDestroy(e1);
}

static void bench_h2d(const char *root) {
    const uint32_t n = 8192;
    const int reps = reps_of(10);
    size_t bytes = (size_t)n * 1440;
    void *pinned;
    CUdeviceptr d;
    CU(cuMemHostAlloc(&pinned, bytes, CU_MEMHOSTALLOC_PORTABLE));
    CU(cuMemAlloc(&d, bytes));
    memset(pinned, 1, bytes);
    CUevent e0, e1;
    CU(cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CU(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    double t[16];
    for (int i = 0; i < reps; i++) {
        gate_hold();
        CU(cuEventRecord(e0, g_s));
        CU(cuMemcpyHtoDAsync(d, pinned, bytes, g_s));
        CU(cuEventRecord(e1, g_s));
        gate_release();
        CU(cuStreamSynchronize(g_s));
        t[i] = ev_ms(e0, e1);
    }
    double pin = median(t, reps);
    /* the library: copy_ns of ple_stats over `reps` steps of the same size */
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/nvfp4", root);
    ple_handle *h = NULL;
    double lib_ms = -1;
    if (open_gpu(dir, PLE_WAIT_HOST, 0, 2, &h) == PLE_OK) {
        rng_t r = {5};
        batch_buf bb;
        make_batch(&bb, &r, n, 4, 1);
        ple_counters s0, s1;
        memset(&s0, 0, sizeof s0);
        s0.struct_size = sizeof s0;
        s1 = s0;
        ple_stats(h, &s0);
        CUdeviceptr out;
        CU(cuMemAlloc(&out, (size_t)n * EMBED * 2));
        int ok = 1;
        for (int i = 0; i < reps && ok; i++) {
            uint64_t seq = ++g_seq;
            ok = ple_submit(h, &bb.b, seq) == PLE_OK &&
                 ple_dequant_fuse(h, (void *)g_s, seq, (void *)(uintptr_t)out, PLE_DTYPE_BF16,
                                  EMBED, 0) == PLE_OK;
            CU(cuStreamSynchronize(g_s));
        }
        ple_stats(h, &s1);
        if (ok && s1.copy_ns > s0.copy_ns) lib_ms = (double)(s1.copy_ns - s0.copy_ns) / reps / 1e6;
        cuMemFree(out);
        free_batch(&bb);
        ple_close(h);
    }
    fprintf(g_json,
            "  \"rows_to_device\": {\"bytes\": %zu, \"pinned_memcpy_ms\": %.4f, \"pinned_GBps\": %.2f, "
            "\"library_copy_ms\": %.4f, \"library_GBps\": %.2f, \"note\": \"library from "
            "ple_stats.copy_ns (negative: not reported by the pipeline)\"},\n",
            bytes, pin, bytes / (pin * 1e-3) / 1e9, lib_ms,
            lib_ms > 0 ? bytes / (lib_ms * 1e-3) / 1e9 : -1.0);
    fprintf(stderr, "rows to device %zu B: pinned %.4f ms, library %.4f ms\n", bytes, pin, lib_ms);
    cuMemFreeHost(pinned);
    cuMemFree(d);
    cuEventDestroy(e0);
    cuEventDestroy(e1);
}

static void bench_latency(const char *root) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/nvfp4", root);
    /* stream op last of the direct fuses: a stream memory wait has no timeout of its own */
    const int modes[3] = {PLE_WAIT_HOST, PLE_WAIT_SPIN_KERNEL, PLE_WAIT_STREAM_OP};
    const uint32_t sizes[2] = {1, 2048};
    const int reps[2] = {reps_of(200), reps_of(20)};
    fprintf(g_json, "  \"step_latency\": [");
    int first = 1;
    for (int m = 0; m < 4; m++) {
        int graph = m == 3;
        int mode = graph ? PLE_WAIT_AUTO : modes[m];
        if (mode == PLE_WAIT_STREAM_OP && !g_stream_ops) continue;
        ple_handle *h = NULL;
        if (open_gpu(dir, mode, 0, 2, &h) != PLE_OK) {
            fprintf(stderr, "open (%s): %s\n", wait_name(mode), ple_last_error_message());
            continue;
        }
        for (int z = 0; z < 2; z++) {
            uint32_t n = sizes[z];
            rng_t r = {31 + (uint64_t)z};
            batch_buf bb;
            make_batch(&bb, &r, n, 1, 1);
            CUdeviceptr out;
            CU(cuMemAlloc(&out, (size_t)n * EMBED * 2));
            CUgraphExec exec = NULL;
            if (graph) {
                CUgraph g;
                ple_graph_prepare(h, (void *)g_s, g_seq + 1);
                CU(cuStreamSynchronize(g_s));
                CU(cuStreamBeginCapture(g_s, CU_STREAM_CAPTURE_MODE_GLOBAL));
                ple_status st = ple_dequant_fuse_graph(h, (void *)g_s, n, (void *)(uintptr_t)out,
                                                       PLE_DTYPE_BF16, EMBED, 0);
                CU(cuStreamEndCapture(g_s, &g));
                if (st != PLE_OK) {
                    fprintf(stderr, "graph capture: %s\n", ple_last_error_message());
                    cuGraphDestroy(g);
                    cuMemFree(out);
                    free_batch(&bb);
                    continue;
                }
                CU(cuGraphInstantiateWithFlags(&exec, g, 0));
                cuGraphDestroy(g);
            }
            double lat[256], blocked[256];
            int ok = 1, k = reps[z];
            for (int i = 0; i < k && ok; i++) {
                uint64_t seq = ++g_seq;
                double t0 = now_s();
                ok = ple_submit(h, &bb.b, seq) == PLE_OK;
                double t1 = now_s();
                if (graph)
                    CU(cuGraphLaunch(exec, g_s));
                else
                    ok = ok && ple_dequant_fuse(h, (void *)g_s, seq, (void *)(uintptr_t)out,
                                                PLE_DTYPE_BF16, EMBED, 0) == PLE_OK;
                double t2 = now_s();
                CU(cuStreamSynchronize(g_s));
                double t3 = now_s();
                lat[i] = (t3 - t0) * 1e6;
                blocked[i] = (t2 - t1) * 1e6;
            }
            if (graph) ok = ok && ple_check_device(h) == PLE_OK;
            if (!ok) fprintf(stderr, "latency %s: %s\n", wait_name(mode), ple_last_error_message());
            double ml = median(lat, k), mb = median(blocked, k);
            fprintf(g_json,
                    "%s\n    {\"wait\": \"%s\", \"graph\": %s, \"tokens\": %u, \"ok\": %s, "
                    "\"step_us_median\": %.1f, \"host_blocked_in_fuse_us_median\": %.1f}",
                    first ? "" : ",", wait_name(mode), graph ? "true" : "false", n,
                    ok ? "true" : "false", ml, mb);
            first = 0;
            fprintf(stderr, "latency %s%s %u tokens: step %.1f us, host blocked %.1f us\n",
                    wait_name(mode), graph ? " (graph)" : "", n, ml, mb);
            if (exec) cuGraphExecDestroy(exec);
            cuMemFree(out);
            free_batch(&bb);
        }
        ple_close(h);
    }
    fprintf(g_json, "\n  ]\n");
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gpu_bench TABLE_ROOT OUTDIR\n");
        return 2;
    }
    mkdir(argv[1], 0755);
    CU(cuInit(0));
    CU(cuDeviceGet(&g_dev, 0));
    CU(cuDevicePrimaryCtxRetain(&g_ctx, g_dev));
    CU(cuCtxSetCurrent(g_ctx));
    CU(cuStreamCreate(&g_s, CU_STREAM_NON_BLOCKING));
    CU(cuDeviceGetAttribute(&g_stream_ops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, g_dev));
    const char *fmts[3] = {"nvfp4", "fp8", "bf16"};
    for (int f = 0; f < 3; f++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/%s", argv[1], fmts[f]);
        if (write_table(dir, fmts[f], 20011, 500 + (uint64_t)f, 0.0123f, NULL) != 0) {
            fprintf(stderr, "write_table %s failed\n", dir);
            return 2;
        }
    }
    char p[4200], name[256] = "";
    cuDeviceGetName(name, sizeof name, g_dev);
    snprintf(p, sizeof p, "%s/gpu_bench.json", argv[2]);
    g_json = fopen(p, "w");
    if (!g_json) {
        perror(p);
        return 2;
    }
    fprintf(g_json, "{\n  \"device\": \"%s\",\n  \"stream_mem_ops\": %d,\n  \"libple\": \"%s\",\n",
            name, g_stream_ops, ple_version_string());
    /* flushed after each part: a program killed later keeps the parts it finished */
    bench_kernel(argv[1]);
    fflush(g_json);
    bench_h2d(argv[1]);
    fflush(g_json);
    bench_latency(argv[1]);
    fprintf(g_json, "}\n");
    fclose(g_json);
    return 0;
}

/*
 * GPU checks of libple through its C API (run by device-check.sh on a machine with a GPU):
 *  (a) kernel vs CPU dequant (ple_dequant_cpu) vs an independent reference, bit for bit, on
 *      random rows, every format and dtype, with and without accumulate, with padded and odd
 *      strides; argument checks of ple_dequant_fuse (buffer too small, host memory);
 *  (b) submit -> ple_dequant_fuse for a 2048-token prefill and decode shapes;
 *  (c) every wait mode, the spin kernel forced also where stream memory operations exist;
 *  (d) CUDA Graph: capture once, 100 replays of fresh steps, each checked; a step over the
 *      captured capacity raises a device error and fills NaN; ple_dequant_fuse refuses capture;
 *  (e) a device wait that times out is reported as an error and fills NaN, not a hang;
 *  (f) head shards (ple_options.shard_count/shard_index): each shard's kernel output equals its
 *      CPU dequant bit for bit, holds the whole handle's values in its heads' columns and -0.0
 *      elsewhere; accumulating every shard into one buffer equals the whole accumulate.
 * Robustness (engine copies, close under load, VMM buffers, re-prepare) is gpu_robust.c.
 * Order: the sections that do not test a wait mode run in SPIN_KERNEL (or graph) mode first, then
 * (c) with stream op after host and spin kernel, then (b) in AUTO (stream op where the device has
 * it): a stream memory wait has no timeout of its own, so a stuck one loses only what runs after
 * it (each section's JSON is flushed when it ends).
 * Usage: gpu_test TABLE_ROOT OUTDIR   (writes OUTDIR/gpu_test.json; exit 0 iff every check passed)
 */
#include "harness.h"

/* ---------------------------------------------------------------------------------------- */
/* (a) correctness: GPU vs CPU vs reference                                                   */
/* ---------------------------------------------------------------------------------------- */

static uint64_t g_seq = 0;

static void test_a(table_t tabs[4]) {
    int p0 = g_pass, f0 = g_fail;
    rng_t r = {1001};
    const size_t strides[3] = {2560, 2560 + 64, 2563};
    for (int ti = 0; ti < 4; ti++) {
        table_t *t = &tabs[ti];
        ple_handle *h = NULL;
        if (PLE_OK_OR_FAIL(open_gpu(t->dir, PLE_WAIT_SPIN_KERNEL, 0, 4, &h)) != PLE_OK) continue;
        ple_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        PLE_OK_OR_FAIL(ple_table_info(h, &info));
        CHECK(info.format == t->format && info.row_bytes == (uint32_t)t->row_bytes,
              "table_info format %d/%u", info.format, info.row_bytes);
        CHECK(f32_bits(info.global_scale) == f32_bits(t->gs), "global scale %g vs %g",
              (double)info.global_scale, (double)t->gs);
        for (int dtype = 0; dtype < 3; dtype++)
            for (int acc = 0; acc < 2; acc++)
                for (int si = 0; si < 3; si++) {
                    size_t stride = strides[si];
                    uint32_t n = 37;
                    batch_buf bb;
                    make_batch(&bb, &r, n, 3, 100 + g_seq);
                    uint64_t seq = ++g_seq, twin = ++g_seq;
                    uint8_t *rows = ref_rows(h, t, &bb.b);
                    PLE_OK_OR_FAIL(ple_submit(h, &bb.b, seq));
                    PLE_OK_OR_FAIL(ple_submit(h, &bb.b, twin));
                    outbuf o;
                    out_alloc(&o, &r, n, stride, dtype);
                    ple_status st = fuse(h, seq, o.d, dtype, stride, acc ? PLE_FUSE_ACCUMULATE : 0);
                    CHECK(st == PLE_OK, "fuse %s: %s", ple_status_name(st), ple_last_error_message());
                    /* the twin: gather check, then the CPU dequant */
                    const uint8_t *prow = NULL;
                    uint32_t pn = 0;
                    PLE_OK_OR_FAIL(ple_packed_rows(h, twin, &prow, &pn));
                    CHECK(pn == n && prow && !memcmp(prow, rows, (size_t)n * HEADS * t->row_bytes),
                          "packed rows of step %llu differ from the table rows at its ids",
                          (unsigned long long)twin);
                    uint8_t *cpu = malloc(o.bytes);
                    memcpy(cpu, o.init, o.bytes);
                    PLE_OK_OR_FAIL(ple_dequant_cpu(h, twin, cpu, dtype, stride,
                                                   acc ? PLE_FUSE_ACCUMULATE : 0));
                    CU(cuStreamSynchronize(g_s));
                    out_fetch(&o);
                    char what[128];
                    snprintf(what, sizeof what, "fmt %d %s acc %d stride %zu", t->format,
                             dtype_name(dtype), acc, stride);
                    CHECK(compare_ref(o.host, o.init, o.bytes, t, rows, n, dtype, stride, acc,
                                      what) == 0,
                          "GPU vs reference: %s", what);
                    CHECK(compare_ref(cpu, o.init, o.bytes, t, rows, n, dtype, stride, acc,
                                      what) == 0,
                          "CPU vs reference: %s", what);
                    CHECK(!memcmp(cpu, o.host, o.bytes), "GPU vs CPU: %s", what);
                    PLE_OK_OR_FAIL(ple_check_device(h));
                    free(cpu);
                    free(rows);
                    out_free(&o);
                    free_batch(&bb);
                }
        /* argument checks: a buffer a whole token too small, host memory, a bad stride */
        {
            batch_buf bb;
            make_batch(&bb, &r, 4, 1, 9000);
            uint64_t seq = ++g_seq;
            PLE_OK_OR_FAIL(ple_submit(h, &bb.b, seq));
            /* `out` placed 3 tokens before the end of its allocation as the driver reports it
             * (a driver may round cuMemAlloc sizes up): the 4-token step overruns it by a token */
            const size_t tok = 2560 * 4;
            CUdeviceptr small, base;
            size_t size = 0;
            CU(cuMemAlloc(&small, 3 * tok));
            CU(cuMemGetAddressRange(&base, &size, small));
            CUdeviceptr short_out = base + size - 3 * tok;
            ple_status st = ple_dequant_fuse(h, (void *)g_s, seq, (void *)(uintptr_t)short_out,
                                             PLE_DTYPE_F32, 2560, 0);
            CHECK(st == PLE_E_INVALID_ARGUMENT, "out buffer a token too small: %s (%s)",
                  ple_status_name(st), ple_last_error_message());
            float *hostbuf = malloc(4 * 2560 * 4);
            st = ple_dequant_fuse(h, (void *)g_s, seq, hostbuf, PLE_DTYPE_F32, 2560, 0);
            CHECK(st == PLE_E_INVALID_ARGUMENT, "host out buffer: %s", ple_status_name(st));
            st = ple_dequant_fuse(h, (void *)g_s, seq, (void *)(uintptr_t)small, PLE_DTYPE_F32,
                                  2559, 0);
            CHECK(st == PLE_E_INVALID_ARGUMENT, "stride 2559: %s", ple_status_name(st));
            /* the step is still there: consume it properly */
            CUdeviceptr ok;
            CU(cuMemAlloc(&ok, 4 * 2560 * 4));
            st = ple_dequant_fuse(h, (void *)g_s, seq, (void *)(uintptr_t)ok, PLE_DTYPE_F32,
                                  2560, 0);
            CHECK(st == PLE_OK, "fuse after refused calls: %s (%s)", ple_status_name(st),
                  ple_last_error_message());
            CU(cuStreamSynchronize(g_s));
            cuMemFree(ok);
            cuMemFree(small);
            free(hostbuf);
            free_batch(&bb);
        }
        ple_close(h);
    }
    section_result("a_kernel_vs_cpu", f0, p0, "4 formats x 3 dtypes x accumulate x 3 strides");
}

/* ---------------------------------------------------------------------------------------- */
/* steps through one handle: submit then fuse (pipelined), checked against the reference     */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    batch_buf bb;
    uint8_t *rows;
    outbuf o;
    uint64_t seq;
} step_t;

/* Submits k steps of the given sizes, fuses each right after its submit (so device waits really
 * wait), then checks all. */
static void run_steps(ple_handle *h, const table_t *t, const uint32_t *sizes, const uint32_t *reqs,
                      int k, int dtype, const char *what) {
    rng_t r = {(uint64_t)k * 7919 + sizes[0]};
    step_t *s = calloc((size_t)k, sizeof *s);
    for (int i = 0; i < k; i++) {
        make_batch(&s[i].bb, &r, sizes[i], reqs[i], 5000 + (uint64_t)i * 100);
        s[i].rows = ref_rows(h, t, &s[i].bb.b);
        out_alloc(&s[i].o, &r, sizes[i], 2560, dtype);
    }
    CU(cuCtxSynchronize());
    for (int i = 0; i < k; i++) {
        s[i].seq = ++g_seq;
        PLE_OK_OR_FAIL(ple_submit(h, &s[i].bb.b, s[i].seq));
        ple_status st = fuse(h, s[i].seq, s[i].o.d, dtype, 2560, 0);
        CHECK(st == PLE_OK, "%s: fuse step %d: %s (%s)", what, i, ple_status_name(st),
              ple_last_error_message());
    }
    CU(cuStreamSynchronize(g_s));
    PLE_OK_OR_FAIL(ple_check_device(h));
    for (int i = 0; i < k; i++) {
        out_fetch(&s[i].o);
        char w[160];
        snprintf(w, sizeof w, "%s step %d (%u tokens, %u requests)", what, i, sizes[i], reqs[i]);
        CHECK(compare_ref(s[i].o.host, s[i].o.init, s[i].o.bytes, t, s[i].rows, sizes[i], dtype,
                          2560, 0, w) == 0,
              "%s", w);
        free(s[i].rows);
        out_free(&s[i].o);
        free_batch(&s[i].bb);
    }
    free(s);
}

static void test_b(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    ple_handle *h = NULL;
    if (PLE_OK_OR_FAIL(open_gpu(t->dir, PLE_WAIT_AUTO, 0, 4, &h)) == PLE_OK) {
        const uint32_t prefill[1] = {2048}, prefill_r[1] = {1};
        run_steps(h, t, prefill, prefill_r, 1, PLE_DTYPE_BF16, "prefill");
        const uint32_t decode[4] = {1, 64, 8, 300}, decode_r[4] = {1, 64, 8, 5};
        run_steps(h, t, decode, decode_r, 4, PLE_DTYPE_BF16, "decode");
        const uint32_t big[2] = {8192, 1}, big_r[2] = {4, 1};
        run_steps(h, t, big, big_r, 2, PLE_DTYPE_F32, "max");
        ple_close(h);
    }
    section_result("b_prefill_decode", f0, p0, "nvfp4; prefill 2048; decode 1/64x1/8x1/300; 8192");
}

static void test_c(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    /* stream op (and AUTO, stream op where supported) last: no timeout of their own */
    const int modes[4] = {PLE_WAIT_HOST, PLE_WAIT_SPIN_KERNEL, PLE_WAIT_STREAM_OP, PLE_WAIT_AUTO};
    char note[256] = "";
    for (int m = 0; m < 4; m++) {
        ple_handle *h = NULL;
        ple_status st = open_gpu(t->dir, modes[m], 0, 4, &h);
        if (modes[m] == PLE_WAIT_STREAM_OP && !g_stream_ops) {
            CHECK(st == PLE_E_UNSUPPORTED, "STREAM_OP without stream mem ops opened: %s",
                  ple_status_name(st));
            strncat(note, "stream_op unsupported here (refused as expected); ", sizeof note - strlen(note) - 1);
            if (st == PLE_OK) ple_close(h);
            continue;
        }
        CHECK(st == PLE_OK, "open wait mode %s: %s (%s)", wait_name(modes[m]), ple_status_name(st),
              ple_last_error_message());
        if (st != PLE_OK) continue;
        ple_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        PLE_OK_OR_FAIL(ple_table_info(h, &info));
        CHECK(info.device_wait_supported == (modes[m] != PLE_WAIT_HOST),
              "%s: device_wait_supported %d", wait_name(modes[m]), info.device_wait_supported);
        const uint32_t sizes[6] = {1, 17, 8192, 300, 1, 2048}, reqs[6] = {1, 3, 2, 300, 1, 1};
        run_steps(h, t, sizes, reqs, 4, PLE_DTYPE_BF16, wait_name(modes[m]));
        run_steps(h, t, sizes + 4, reqs + 4, 2, PLE_DTYPE_F16, wait_name(modes[m]));
        ple_close(h);
    }
    section_result("c_wait_modes", f0, p0, note);
}

/* ---------------------------------------------------------------------------------------- */
/* (d) CUDA Graph                                                                             */
/* ---------------------------------------------------------------------------------------- */

static void test_d(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    ple_handle *h = NULL;
    if (PLE_OK_OR_FAIL(open_gpu(t->dir, PLE_WAIT_SPIN_KERNEL, 0, 2, &h)) != PLE_OK) {
        section_result("d_graph", f0, p0, "open failed");
        return;
    }
    rng_t r = {4242};
    const uint32_t cap = 64;
    const size_t stride = 2560 + 8;
    outbuf o;
    out_alloc(&o, &r, cap, stride, PLE_DTYPE_BF16);

    /* ple_dequant_fuse must refuse capture */
    {
        batch_buf bb;
        make_batch(&bb, &r, 3, 1, 7000);
        uint64_t seq = ++g_seq;
        PLE_OK_OR_FAIL(ple_submit(h, &bb.b, seq));
        CU(cuStreamBeginCapture(g_s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        ple_status st = ple_dequant_fuse(h, (void *)g_s, seq, (void *)(uintptr_t)o.d,
                                         PLE_DTYPE_BF16, stride, 0);
        CHECK(st == PLE_E_INVALID_ARGUMENT, "ple_dequant_fuse under capture: %s",
              ple_status_name(st));
        CUgraph g0 = NULL;
        cuStreamEndCapture(g_s, &g0);
        if (g0) cuGraphDestroy(g0);
        PLE_OK_OR_FAIL(ple_dequant_fuse(h, (void *)g_s, seq, (void *)(uintptr_t)o.d,
                                        PLE_DTYPE_BF16, stride, 0));
        CU(cuStreamSynchronize(g_s));
        free_batch(&bb);
    }

    uint64_t base = g_seq + 1;
    PLE_OK_OR_FAIL(ple_graph_prepare(h, (void *)g_s, base));
    CUgraph graph;
    CUgraphExec exec;
    CU(cuStreamBeginCapture(g_s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    ple_status cst = ple_dequant_fuse_graph(h, (void *)g_s, cap, (void *)(uintptr_t)o.d,
                                            PLE_DTYPE_BF16, stride, 0);
    CU(cuStreamEndCapture(g_s, &graph));
    CHECK(cst == PLE_OK, "ple_dequant_fuse_graph under capture: %s (%s)", ple_status_name(cst),
          ple_last_error_message());
    if (cst != PLE_OK) {
        ple_close(h);
        out_free(&o);
        section_result("d_graph", f0, p0, "capture failed");
        return;
    }
    CU(cuGraphInstantiateWithFlags(&exec, graph, 0));

    /* 100 replays, each of a fresh step (new tokens, new size), one over capacity (k = 50) */
    const int replays = 100;
    for (int k = 0; k < replays; k++) {
        uint32_t n = k == 50 ? cap + 1 : 1 + (uint32_t)((k * 37) % cap);
        batch_buf bb;
        make_batch(&bb, &r, n, n > 4 ? 4 : 1, 8000 + (uint64_t)k * 10);
        uint8_t *rows = ref_rows(h, t, &bb.b);
        uint64_t seq = ++g_seq;
        CHECK(seq == base + (uint64_t)k, "graph steps must be consecutive");
        out_fill(&o, (uint8_t)(0x11 * (k + 1)));
        CU(cuCtxSynchronize());
        PLE_OK_OR_FAIL(ple_submit(h, &bb.b, seq));
        CU(cuGraphLaunch(exec, g_s));
        CU(cuStreamSynchronize(g_s));
        out_fetch(&o);
        ple_status dev = ple_check_device(h);
        char w[96];
        snprintf(w, sizeof w, "replay %d (step %llu, %u tokens)", k, (unsigned long long)seq, n);
        if (n > cap) {
            CHECK(dev == PLE_E_STATE, "%s: over capacity reported as %s", w, ple_status_name(dev));
            CHECK(all_nan(o.host, o.init, o.bytes, cap, PLE_DTYPE_BF16, stride),
                  "%s: the capacity's tokens are not NaN-filled", w);
        } else {
            CHECK(dev == PLE_OK, "%s: device error %s (%s)", w, ple_status_name(dev),
                  ple_last_error_message());
            CHECK(compare_ref(o.host, o.init, o.bytes, t, rows, n, PLE_DTYPE_BF16, stride, 0, w) ==
                      0,
                  "%s", w);
        }
        free(rows);
        free_batch(&bb);
    }
    cuGraphExecDestroy(exec);
    cuGraphDestroy(graph);
    ple_close(h);
    out_free(&o);
    section_result("d_graph", f0, p0,
                   "capture once; 100 replays of fresh steps of 1..64 tokens; 65 > capacity: NaN + error");
}

/* ---------------------------------------------------------------------------------------- */
/* (e) a device wait that times out                                                           */
/* ---------------------------------------------------------------------------------------- */

static void test_e(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    ple_handle *h = NULL;
    const uint64_t timeout_us = 300000;
    char note[160] = "";
    if (PLE_OK_OR_FAIL(open_gpu(t->dir, PLE_WAIT_AUTO, timeout_us, 2, &h)) == PLE_OK) {
        rng_t r = {77};
        outbuf o;
        out_alloc(&o, &r, 8, 2560, PLE_DTYPE_F32);
        uint64_t base = ++g_seq; /* never submitted */
        PLE_OK_OR_FAIL(ple_graph_prepare(h, (void *)g_s, base));
        PLE_OK_OR_FAIL(
            ple_dequant_fuse_graph(h, (void *)g_s, 8, (void *)(uintptr_t)o.d, PLE_DTYPE_F32, 2560, 0));
        double t0 = now_s();
        CUresult cr = cuStreamSynchronize(g_s);
        double dt = now_s() - t0;
        CHECK(cr == CUDA_SUCCESS, "stream sync after a timed-out wait: %d", (int)cr);
        CHECK(dt < 10.0 && dt > 0.25, "device wait returned after %.3f s (timeout 0.3 s)", dt);
        ple_status dev = ple_check_device(h);
        CHECK(dev == PLE_E_TIMEOUT, "timed-out device wait reported as %s (%s)", ple_status_name(dev),
              ple_last_error_message());
        CHECK(ple_check_device(h) == PLE_OK, "device error not cleared by ple_check_device");
        out_fetch(&o);
        CHECK(all_nan(o.host, o.init, o.bytes, 8, PLE_DTYPE_F32, 2560),
              "timed-out step: output not NaN-filled");
        (void)t;
        snprintf(note, sizeof note, "spin wait returned after %.3f s", dt);
        out_free(&o);
        t0 = now_s();
        ple_close(h);
        CHECK(now_s() - t0 < 10.0, "ple_close took %.3f s", now_s() - t0);
    }
    section_result("e_timeout", f0, p0, note);
}

/* ---------------------------------------------------------------------------------------- */
/* (f) head shards: kernel vs CPU per shard, columns, and the accumulate of all shards        */
/* ---------------------------------------------------------------------------------------- */

static ple_status open_shard(const char *dir, uint32_t count, uint32_t index, ple_handle **h) {
    ple_options o;
    ple_options_default(&o);
    o.cuda_device = 0;
    o.wait_mode = PLE_WAIT_SPIN_KERNEL;
    o.wait_timeout_us = TEST_WAIT_TIMEOUT_US;
    o.max_tokens_per_step = 256;
    o.max_in_flight = 4;
    o.shard_count = count;
    o.shard_index = index;
    return ple_open(dir, &o, h);
}

static void test_f(table_t tabs[4]) {
    int p0 = g_pass, f0 = g_fail;
    rng_t r = {4242};
    const uint32_t counts[3] = {3, 5, 16};
    for (int ti = 0; ti < 4; ti++) {
        table_t *t = &tabs[ti];
        ple_handle *whole = NULL;
        if (PLE_OK_OR_FAIL(open_shard(t->dir, 1, 0, &whole)) != PLE_OK) continue;
        for (int ci = 0; ci < 3; ci++) {
            uint32_t count = counts[ci];
            ple_handle *sh[16] = {0};
            int opened = 1;
            for (uint32_t k = 0; k < count; k++)
                opened &= PLE_OK_OR_FAIL(open_shard(t->dir, count, k, &sh[k])) == PLE_OK;
            for (int dtype = 0; dtype < 3 && opened; dtype++) {
                uint32_t n = 29;
                int es = dtype_size(dtype);
                batch_buf bb;
                make_batch(&bb, &r, n, 3, 20000 + g_seq);
                uint64_t seq = ++g_seq, twin = ++g_seq, acc = ++g_seq;
                outbuf w, wacc, all;
                out_alloc(&w, &r, n, 2560, dtype);
                out_alloc(&wacc, &r, n, 2560, dtype);
                out_alloc(&all, &r, n, 2560, dtype);
                memcpy(all.init, wacc.init, all.bytes);
                CU(cuMemcpyHtoD(all.d, all.init, all.bytes));
                PLE_OK_OR_FAIL(ple_submit(whole, &bb.b, seq));
                PLE_OK_OR_FAIL(ple_submit(whole, &bb.b, acc));
                CHECK(fuse(whole, seq, w.d, dtype, 2560, 0) == PLE_OK, "whole fuse: %s",
                      ple_last_error_message());
                CHECK(fuse(whole, acc, wacc.d, dtype, 2560, PLE_FUSE_ACCUMULATE) == PLE_OK,
                      "whole accumulate: %s", ple_last_error_message());
                CU(cuStreamSynchronize(g_s));
                out_fetch(&w);
                out_fetch(&wacc);
                for (uint32_t k = 0; k < count; k++) {
                    ple_info info;
                    memset(&info, 0, sizeof info);
                    info.struct_size = sizeof info;
                    PLE_OK_OR_FAIL(ple_table_info(sh[k], &info));
                    /* round-robin heads: k, k + count, ... */
                    uint32_t h0 = info.shard_first_head, hs = info.shard_head_stride;
                    CHECK(h0 == k && hs == count && info.shard_heads == (16 - k + count - 1) / count,
                          "shard %u/%u: heads %u + j*%u, %u of them", k, count, h0, hs,
                          info.shard_heads);
                    outbuf o;
                    out_alloc(&o, &r, n, 2560, dtype);
                    PLE_OK_OR_FAIL(ple_submit(sh[k], &bb.b, seq));
                    PLE_OK_OR_FAIL(ple_submit(sh[k], &bb.b, twin));
                    PLE_OK_OR_FAIL(ple_submit(sh[k], &bb.b, acc));
                    CHECK(fuse(sh[k], seq, o.d, dtype, 2560, 0) == PLE_OK, "shard fuse: %s",
                          ple_last_error_message());
                    CHECK(fuse(sh[k], acc, all.d, dtype, 2560, PLE_FUSE_ACCUMULATE) == PLE_OK,
                          "shard accumulate: %s", ple_last_error_message());
                    uint8_t *cpu = malloc(o.bytes);
                    memcpy(cpu, o.init, o.bytes);
                    PLE_OK_OR_FAIL(ple_dequant_cpu(sh[k], twin, cpu, dtype, 2560, 0));
                    CU(cuStreamSynchronize(g_s));
                    out_fetch(&o);
                    CHECK(!memcmp(cpu, o.host, o.bytes), "fmt %d %s shard %u/%u: GPU vs CPU",
                          t->format, dtype_name(dtype), k, count);
                    size_t bad = 0;
                    for (uint32_t tok = 0; tok < n; tok++)
                        for (uint32_t e = 0; e < 2560; e++) {
                            size_t at = ((size_t)tok * 2560 + e) * (size_t)es;
                            uint32_t hd = e / 160;
                            int mine = hd >= h0 && (hd - h0) % hs == 0;
                            uint32_t neg0 = es == 4 ? 0x80000000u : 0x8000u, v = 0;
                            memcpy(&v, o.host + at, (size_t)es);
                            bad += mine ? memcmp(o.host + at, w.host + at, (size_t)es) != 0
                                        : v != neg0;
                        }
                    CHECK(bad == 0, "fmt %d %s shard %u/%u: %zu elements not the whole's / -0.0",
                          t->format, dtype_name(dtype), k, count, bad);
                    free(cpu);
                    out_free(&o);
                }
                CU(cuStreamSynchronize(g_s));
                out_fetch(&all);
                CHECK(!memcmp(all.host, wacc.host, all.bytes),
                      "fmt %d %s: accumulating %u shards differs from the whole accumulate",
                      t->format, dtype_name(dtype), count);
                out_free(&w);
                out_free(&wacc);
                out_free(&all);
                free_batch(&bb);
            }
            for (uint32_t k = 0; k < count; k++) ple_close(sh[k]);
        }
        PLE_OK_OR_FAIL(ple_check_device(whole));
        ple_close(whole);
    }
    section_result("f_head_shards", f0, p0, "4 formats x shard counts 3, 5, 16 x 3 dtypes");
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gpu_test TABLE_ROOT OUTDIR\n");
        return 2;
    }
    mkdir(argv[1], 0755);
    harness_init();
    char name[256] = "";
    cuDeviceGetName(name, sizeof name, g_dev);
    int drv = 0;
    cuDriverGetVersion(&drv);
    fprintf(stderr, "device 0: %s, driver API %d, 64-bit stream mem ops %d, libple %s\n", name, drv,
            g_stream_ops, ple_version_string());

    char p[4200];
    snprintf(p, sizeof p, "%s/gpu_test.json", argv[2]);
    g_json = fopen(p, "w");
    if (!g_json) {
        perror(p);
        return 2;
    }
    fprintf(g_json, "{\n  \"device\": \"%s\",\n  \"driver_api\": %d,\n  \"stream_mem_ops\": %d,\n"
                    "  \"libple\": \"%s\",\n  \"sections\": {",
            name, drv, g_stream_ops, ple_version_string());

    table_t tabs[4];
    open_table(&tabs[0], argv[1], "nvfp4", 11);
    open_table(&tabs[1], argv[1], "fp8", 12);
    open_table(&tabs[2], argv[1], "bf16", 13);
    open_table(&tabs[3], argv[1], "f32", 14);

    test_a(tabs);
    test_d(&tabs[0]);
    test_e(&tabs[0]);
    test_f(tabs);
    test_c(&tabs[0]);
    test_b(&tabs[0]);

    fprintf(g_json, "\n  },\n  \"passed\": %d,\n  \"failed\": %d\n}\n", g_pass, g_fail);
    fclose(g_json);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

/*
 * Robustness checks of libple's GPU path (run by device-check.sh on a machine with a GPU). The
 * process runs with CUDA_DEVICE_MAX_CONNECTIONS=1 (set before cuInit), so every stream shares one
 * hardware queue: a hidden dependency of the engine's stream on a stream of libple's would hang.
 *  (f) engine copies queued right after each ple_dequant_fuse, on the engine's stream and on a
 *      second engine stream, in every device-wait mode: steps correct, no stall, no device error;
 *  (g) ple_wait on a consumed step is PLE_OK once complete; on a seq never submitted PLE_E_STATE;
 *  (h) output checks: a tensor inside a VMM mapping (two chunks, cuMemMap) is accepted and written
 *      correctly; a misaligned out is refused;
 *  (i) ple_graph_prepare is refused while the stream captures;
 *  (j) re-preparing a graph after replays consumed steps does not strand their ring slots;
 *  (k) ple_close under load (a spinning replay and a queued stream-op wait) returns promptly and
 *      the engine's stream drains, with the pending launches NaN-filled.
 * Order: (g), (h), (i)/(j) in SPIN_KERNEL mode first, then (f) spin kernel before stream op, then
 * (k) with the graph's spin before the stream op: a stream memory wait has no timeout of its own,
 * so a stuck one loses only what runs after it (each section's JSON is flushed when it ends).
 * Usage: gpu_robust TABLE_ROOT OUTDIR   (writes OUTDIR/gpu_robust.json; exit 0 iff all passed)
 */
#include "harness.h"

static uint64_t g_seq;

static void fuse_ok(ple_handle *h, CUstream s, uint64_t seq, CUdeviceptr out, int dtype, const char *w) {
    ple_status st = ple_dequant_fuse(h, (void *)s, seq, (void *)(uintptr_t)out, dtype, EMBED, 0);
    CHECK(st == PLE_OK, "%s: fuse step %llu: %s (%s)", w, (unsigned long long)seq,
          ple_status_name(st), ple_last_error_message());
}

static void test_f(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    const int modes[2] = {PLE_WAIT_SPIN_KERNEL, PLE_WAIT_STREAM_OP};
    char note[200] = "";
    CUstream s2;
    CU(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    size_t big = 64u << 20;
    CUdeviceptr a, b, c;
    CU(cuMemAlloc(&a, big));
    CU(cuMemAlloc(&b, big));
    CU(cuMemAlloc(&c, big));
    for (int m = 0; m < 2; m++) {
        if (modes[m] == PLE_WAIT_STREAM_OP && !g_stream_ops) continue;
        ple_handle *h = NULL;
        if (PLE_OK_OR_FAIL(open_gpu(t->dir, modes[m], 5000000, 4, &h)) != PLE_OK) continue;
        rng_t r = {600 + (uint64_t)m};
        const int k = 12;
        batch_buf bb[12];
        uint8_t *rows[12];
        outbuf o[12];
        for (int i = 0; i < k; i++) {
            uint32_t n = i % 3 == 0 ? 2048 : 1 + (uint32_t)i;
            make_batch(&bb[i], &r, n, 1, 20000 + (uint64_t)i * 10 + (uint64_t)m * 1000);
            rows[i] = ref_rows(h, t, &bb[i].b);
            out_alloc(&o[i], &r, n, EMBED, PLE_DTYPE_BF16);
        }
        CU(cuCtxSynchronize());
        double t0 = now_s();
        for (int i = 0; i < k; i++) {
            uint64_t seq = ++g_seq;
            PLE_OK_OR_FAIL(ple_submit(h, &bb[i].b, seq));
            fuse_ok(h, g_s, seq, o[i].d, PLE_DTYPE_BF16, wait_name(modes[m]));
            /* the engine's next work, right behind the fuse, on both of its streams */
            CU(cuMemcpyDtoDAsync(b, a, big, g_s));
            CU(cuMemcpyDtoDAsync(c, a, big, s2));
        }
        CUresult r1 = cuStreamSynchronize(g_s), r2 = cuStreamSynchronize(s2);
        double dt = now_s() - t0;
        CHECK(r1 == CUDA_SUCCESS && r2 == CUDA_SUCCESS, "%s: stream sync %d %d", wait_name(modes[m]),
              (int)r1, (int)r2);
        ple_status dev = ple_check_device(h);
        CHECK(dev == PLE_OK, "%s: device error %s (%s)", wait_name(modes[m]), ple_status_name(dev),
              ple_last_error_message());
        CHECK(dt < 4.0, "%s: %d steps with engine copies took %.3f s (a stall?)", wait_name(modes[m]),
              k, dt);
        for (int i = 0; i < k; i++) {
            out_fetch(&o[i]);
            char w[96];
            snprintf(w, sizeof w, "%s step %d", wait_name(modes[m]), i);
            CHECK(compare_ref(o[i].host, o[i].init, o[i].bytes, t, rows[i], bb[i].b.num_tokens,
                              PLE_DTYPE_BF16, EMBED, 0, w) == 0,
                  "%s", w);
            free(rows[i]);
            out_free(&o[i]);
            free_batch(&bb[i]);
        }
        size_t len = strlen(note);
        snprintf(note + len, sizeof note - len, "%s %.3f s; ", wait_name(modes[m]), dt);
        ple_close(h);
    }
    cuMemFree(a);
    cuMemFree(b);
    cuMemFree(c);
    cuStreamDestroy(s2);
    section_result("f_engine_copies_max_connections_1", f0, p0, note);
}

static void test_g(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    ple_handle *h = NULL;
    if (PLE_OK_OR_FAIL(open_gpu(t->dir, PLE_WAIT_SPIN_KERNEL, 0, 2, &h)) == PLE_OK) {
        rng_t r = {700};
        batch_buf bb;
        make_batch(&bb, &r, 3, 1, 30000);
        outbuf o;
        out_alloc(&o, &r, 3, EMBED, PLE_DTYPE_F32);
        uint64_t seq = ++g_seq;
        PLE_OK_OR_FAIL(ple_submit(h, &bb.b, seq));
        fuse_ok(h, g_s, seq, o.d, PLE_DTYPE_F32, "g");
        CU(cuStreamSynchronize(g_s));
        ple_status st = ple_wait(h, seq, 0);
        CHECK(st == PLE_OK, "ple_wait on a consumed step: %s (%s)", ple_status_name(st),
              ple_last_error_message());
        st = ple_wait(h, seq + 5, 1000);
        CHECK(st == PLE_E_STATE, "ple_wait on a seq never submitted: %s", ple_status_name(st));
        PLE_OK_OR_FAIL(ple_check_device(h));
        out_free(&o);
        free_batch(&bb);
        ple_close(h);
    }
    section_result("g_wait_semantics", f0, p0, "");
}

static void test_h(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    char note[160] = "";
    ple_handle *h = NULL;
    if (PLE_OK_OR_FAIL(open_gpu(t->dir, PLE_WAIT_SPIN_KERNEL, 0, 2, &h)) == PLE_OK) {
        /* two physical chunks mapped back to back; the tensor straddles the boundary */
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        size_t gran = 0;
        CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        size_t chunk = gran < (2u << 20) ? (2u << 20) : gran;
        CUmemGenericAllocationHandle m0, m1;
        CU(cuMemCreate(&m0, chunk, &prop, 0));
        CU(cuMemCreate(&m1, chunk, &prop, 0));
        CUdeviceptr va;
        CU(cuMemAddressReserve(&va, 2 * chunk, 0, 0, 0));
        CU(cuMemMap(va, chunk, 0, m0, 0));
        CU(cuMemMap(va + chunk, chunk, 0, m1, 0));
        CUmemAccessDesc acc;
        memset(&acc, 0, sizeof acc);
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CU(cuMemSetAccess(va, 2 * chunk, &acc, 1));
        const uint32_t n = 100; /* 512000 B of bf16, from 256 KiB before the boundary */
        CUdeviceptr out = va + chunk - (256u << 10);
        size_t bytes = (size_t)n * EMBED * 2;
        rng_t r = {800};
        batch_buf bb;
        make_batch(&bb, &r, n, 2, 31000);
        uint8_t *rows = ref_rows(h, t, &bb.b);
        uint8_t *init = malloc(bytes), *got = malloc(bytes);
        rng_fill(&r, init, bytes);
        CU(cuMemcpyHtoD(out, init, bytes));
        uint64_t seq = ++g_seq;
        PLE_OK_OR_FAIL(ple_submit(h, &bb.b, seq));
        ple_status st = ple_dequant_fuse(h, (void *)g_s, seq, (void *)(uintptr_t)(out + 1),
                                         PLE_DTYPE_BF16, EMBED, 0);
        CHECK(st == PLE_E_INVALID_ARGUMENT, "misaligned bf16 out: %s", ple_status_name(st));
        st = ple_dequant_fuse(h, (void *)g_s, seq, (void *)(uintptr_t)(out + 2), PLE_DTYPE_F32,
                              EMBED, 0);
        CHECK(st == PLE_E_INVALID_ARGUMENT, "misaligned f32 out: %s", ple_status_name(st));
        st = ple_dequant_fuse(h, (void *)g_s, seq, (void *)(uintptr_t)out, PLE_DTYPE_BF16, EMBED, 0);
        CHECK(st == PLE_OK, "VMM out straddling two chunks refused: %s (%s)", ple_status_name(st),
              ple_last_error_message());
        CU(cuStreamSynchronize(g_s));
        CU(cuMemcpyDtoH(got, out, bytes));
        if (st == PLE_OK) {
            table_t tt = *t;
            CHECK(compare_ref(got, init, bytes, &tt, rows, n, PLE_DTYPE_BF16, EMBED, 0, "vmm") == 0,
                  "VMM output differs from the reference");
        }
        snprintf(note, sizeof note, "chunk %zu B", chunk);
        free(rows);
        free(init);
        free(got);
        free_batch(&bb);
        ple_close(h);
        cuMemUnmap(va, 2 * chunk);
        cuMemAddressFree(va, 2 * chunk);
        cuMemRelease(m0);
        cuMemRelease(m1);
    }
    section_result("h_output_checks_vmm_alignment", f0, p0, note);
}

/* Submits and replays `k` steps of graph `exec` (capacity cap) into out; checks each. */
static void replay_steps(ple_handle *h, table_t *t, CUgraphExec exec, outbuf *o, uint32_t cap,
                         int k, rng_t *r, const char *what) {
    for (int i = 0; i < k; i++) {
        uint32_t n = 1 + (uint32_t)(rng_next(r) % cap);
        batch_buf bb;
        make_batch(&bb, r, n, 1, 40000 + g_seq * 3);
        uint8_t *rows = ref_rows(h, t, &bb.b);
        CU(cuStreamSynchronize(g_s));
        out_fill(o, 0x5A);
        ple_status st = ple_submit(h, &bb.b, ++g_seq);
        CHECK(st == PLE_OK, "%s: submit step %llu: %s (%s)", what, (unsigned long long)g_seq,
              ple_status_name(st), ple_last_error_message());
        CU(cuGraphLaunch(exec, g_s));
        CU(cuStreamSynchronize(g_s));
        out_fetch(o);
        char w[96];
        snprintf(w, sizeof w, "%s replay %d (%u tokens)", what, i, n);
        CHECK(compare_ref(o->host, o->init, o->bytes, t, rows, n, PLE_DTYPE_F32, EMBED, 0, w) == 0,
              "%s", w);
        free(rows);
        free_batch(&bb);
    }
}

static void test_ij(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    char note[160] = "";
    ple_handle *h = NULL;
    /* two slots, a 2 s timeout: a stranded slot turns the next submit into a timeout */
    if (PLE_OK_OR_FAIL(open_gpu(t->dir, PLE_WAIT_SPIN_KERNEL, 2000000, 2, &h)) == PLE_OK) {
        CU(cuStreamBeginCapture(g_s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        ple_status st = ple_graph_prepare(h, (void *)g_s, g_seq + 1);
        CUgraph g0 = NULL;
        cuStreamEndCapture(g_s, &g0);
        if (g0) cuGraphDestroy(g0);
        CHECK(st == PLE_E_INVALID_ARGUMENT, "ple_graph_prepare under capture: %s",
              ple_status_name(st));
        rng_t r = {900};
        const uint32_t cap = 16;
        outbuf o;
        out_alloc(&o, &r, cap, EMBED, PLE_DTYPE_F32);
        PLE_OK_OR_FAIL(ple_graph_prepare(h, (void *)g_s, g_seq + 1));
        CUgraph g;
        CUgraphExec exec;
        CU(cuStreamBeginCapture(g_s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        st = ple_dequant_fuse_graph(h, (void *)g_s, cap, (void *)(uintptr_t)o.d, PLE_DTYPE_F32,
                                    EMBED, 0);
        CU(cuStreamEndCapture(g_s, &g));
        CHECK(st == PLE_OK, "capture: %s (%s)", ple_status_name(st), ple_last_error_message());
        CU(cuGraphInstantiateWithFlags(&exec, g, 0));
        double t0 = now_s();
        replay_steps(h, t, exec, &o, cap, 3, &r, "first base");
        /* re-prepare with the next step (the documented recovery), then go on */
        PLE_OK_OR_FAIL(ple_graph_prepare(h, (void *)g_s, g_seq + 1));
        replay_steps(h, t, exec, &o, cap, 6, &r, "after re-prepare");
        double dt = now_s() - t0;
        CHECK(dt < 1.5, "9 graph steps around a re-prepare took %.3f s (a stranded slot?)", dt);
        PLE_OK_OR_FAIL(ple_check_device(h));
        snprintf(note, sizeof note, "9 replays around a re-prepare in %.3f s", dt);
        cuGraphExecDestroy(exec);
        cuGraphDestroy(g);
        out_free(&o);
        ple_close(h);
    }
    section_result("ij_prepare_capture_and_re_prepare", f0, p0, note);
}

static void test_k(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    char note[200] = "";
    for (int k = 0; k < 2; k++) {
        int graph = k == 0; /* the graph's spin first, then the stream op */
        int mode = graph ? PLE_WAIT_SPIN_KERNEL : (g_stream_ops ? PLE_WAIT_STREAM_OP : PLE_WAIT_SPIN_KERNEL);
        ple_handle *h = NULL;
        if (PLE_OK_OR_FAIL(open_gpu(t->dir, mode, 60000000, 4, &h)) != PLE_OK) continue;
        rng_t r = {1000 + (uint64_t)graph};
        outbuf o;
        const uint32_t n = 8192;
        out_alloc(&o, &r, n, EMBED, PLE_DTYPE_BF16);
        CUgraph g = NULL;
        CUgraphExec exec = NULL;
        batch_buf bb;
        make_batch(&bb, &r, n, 4, 50000 + (uint64_t)graph * 100);
        if (graph) {
            /* a replay of a step never submitted: its gate spins (60 s timeout) until close */
            PLE_OK_OR_FAIL(ple_graph_prepare(h, (void *)g_s, g_seq + 1));
            CU(cuStreamBeginCapture(g_s, CU_STREAM_CAPTURE_MODE_GLOBAL));
            PLE_OK_OR_FAIL(ple_dequant_fuse_graph(h, (void *)g_s, n, (void *)(uintptr_t)o.d,
                                                  PLE_DTYPE_BF16, EMBED, 0));
            CU(cuStreamEndCapture(g_s, &g));
            CU(cuGraphInstantiateWithFlags(&exec, g, 0));
            CU(cuGraphLaunch(exec, g_s));
            usleep(50000); /* the replay is running (spinning) when close comes */
        } else {
            /* steps in flight: submitted and fused (device waits queued), then closed at once */
            for (int i = 0; i < 3; i++) {
                uint64_t seq = ++g_seq;
                PLE_OK_OR_FAIL(ple_submit(h, &bb.b, seq));
                fuse_ok(h, g_s, seq, o.d, PLE_DTYPE_BF16, "close under load");
            }
        }
        double t0 = now_s();
        ple_close(h);
        double dc = now_s() - t0;
        CUresult cr = cuStreamSynchronize(g_s);
        double ds = now_s() - t0;
        CHECK(dc < 15.0, "%s: ple_close took %.3f s", graph ? "graph" : wait_name(mode), dc);
        CHECK(cr == CUDA_SUCCESS && ds < 20.0, "%s: the engine's stream drained after %.3f s (%d)",
              graph ? "graph" : wait_name(mode), ds, (int)cr);
        if (graph) {
            out_fetch(&o);
            CHECK(all_nan(o.host, o.init, o.bytes, n, PLE_DTYPE_BF16, EMBED),
                  "graph replay cut short by close: output not NaN-filled");
        }
        size_t len = strlen(note);
        snprintf(note + len, sizeof note - len, "%s: close %.3f s, drained %.3f s; ",
                 graph ? "graph spin" : wait_name(mode), dc, ds);
        if (exec) cuGraphExecDestroy(exec);
        if (g) cuGraphDestroy(g);
        free_batch(&bb);
        out_free(&o);
    }
    section_result("k_close_under_load", f0, p0, note);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gpu_robust TABLE_ROOT OUTDIR\n");
        return 2;
    }
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1); /* before cuInit: one hardware queue */
    mkdir(argv[1], 0755);
    harness_init();
    char name[256] = "", p[4200];
    cuDeviceGetName(name, sizeof name, g_dev);
    snprintf(p, sizeof p, "%s/gpu_robust.json", argv[2]);
    g_json = fopen(p, "w");
    if (!g_json) {
        perror(p);
        return 2;
    }
    fprintf(g_json, "{\n  \"device\": \"%s\",\n  \"max_connections\": 1,\n  \"stream_mem_ops\": %d,\n"
                    "  \"libple\": \"%s\",\n  \"sections\": {",
            name, g_stream_ops, ple_version_string());
    table_t tab;
    open_table(&tab, argv[1], "nvfp4", 21);
    test_g(&tab);
    test_h(&tab);
    test_ij(&tab);
    test_f(&tab);
    test_k(&tab);
    fprintf(g_json, "\n  },\n  \"passed\": %d,\n  \"failed\": %d\n}\n", g_pass, g_fail);
    fclose(g_json);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

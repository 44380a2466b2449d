/*
 * GPU-path checks written for the emulated driver (ffi-tests/gpu/emulated.sh; they run on a real
 * GPU too, through the same C API), beyond gpu_test/gpu_robust:
 *  (m) every row format x output dtype x accumulate x token count (1, odd, the step maximum)
 *      x stride (3 strides; the step maximum at the odd one): ple_dequant_fuse bit-identical to
 *      ple_dequant_cpu of the same step and to the independent reference;
 *  (w) each wait mode (host, stream op where the device has it, spin kernel): steps correct;
 *  (f) a step that fails on the host (its table's rows file truncated after open): ple_wait
 *      reports it; device-wait modes fill NaN and report the device error via ple_check_device;
 *  (l) CUDA Graph replays launched before their step is submitted: the stream really waits
 *      (its event stays pending), then the step is correct;
 *  (r) ring reuse while a kernel has not yet read its slot (the engine's stream held back by a
 *      host function): the reusing step waits, every output correct;
 *  (g) 100 graph replays with accumulate into an odd stride and varying token counts, two over
 *      the captured capacity (NaN + device error, then correct again);
 *  (c) ple_close with fuses queued behind a held stream: returns, no use after free, NaN-filled;
 *  (x) misuse: a stream of another context and freed output memory are refused; the legacy
 *      NULL stream works;
 *  (q) 6 graph replays queued before their 6 steps are submitted through 2 ring slots;
 *  (y) ple_open and ple_close while the calling thread captures a graph in global mode;
 *  (t) two engine threads with a stream each fusing alternate steps of one handle;
 *  (p) a host-wait fuse whose wait spans ple_graph_prepare (the worker then copies no rows to the
 *      device): the step is read from where the worker left it;
 *  (v) ple_dequant_fuse_graph captured in global mode into a VMM tensor straddling two chunks
 *      (the output check must probe for VMM there): the capture stays valid, replays correct.
 *      (The emulator counts that probe, cuMemRetainAllocationHandle, as unsafe under capture,
 *      so every capture of the other sections also checks that a buffer one allocation holds is
 *      checked without it.)
 * Usage: gpu_emu_test TABLE_ROOT OUTDIR [quick]   (writes OUTDIR/gpu_emu_test.json)
 */
#include <pthread.h>

#include "harness.h"

static uint64_t g_seq;
static int g_quick;

/* the step maximum of the handles here (gpu_test covers 8192, open_gpu's) */
#define STEP_MAX 1024

/* open_gpu with max_tokens_per_step = STEP_MAX (timeout 0: TEST_WAIT_TIMEOUT_US) */
static ple_status open_emu(const char *dir, int wait_mode, uint64_t timeout_us, uint32_t in_flight,
                           ple_handle **h) {
    ple_options o;
    ple_options_default(&o);
    o.cuda_device = 0;
    o.wait_mode = wait_mode;
    o.max_tokens_per_step = STEP_MAX;
    o.max_in_flight = in_flight;
    o.wait_timeout_us = timeout_us ? timeout_us : TEST_WAIT_TIMEOUT_US;
    return ple_open(dir, &o, h);
}

/* ple_dequant_fuse of a fresh step vs ple_dequant_cpu of its twin (same batch) vs the reference;
 * the output starts `skip` elements into its allocation (1: aligned to the dtype only) */
static void fuse_vs_cpu_at(ple_handle *h, const table_t *t, rng_t *r, uint32_t n, int dtype,
                           size_t stride, int acc, size_t skip, const char *what) {
    batch_buf bb;
    make_batch(&bb, r, n, n > 3 ? 3 : 1, 100 + g_seq);
    uint64_t seq = ++g_seq, twin = ++g_seq;
    uint8_t *rows = ref_rows(h, t, &bb.b);
    PLE_OK_OR_FAIL(ple_submit(h, &bb.b, seq));
    PLE_OK_OR_FAIL(ple_submit(h, &bb.b, twin));
    outbuf o;
    out_alloc(&o, r, n, stride, dtype);
    size_t off = skip * (size_t)dtype_size(dtype), bytes = o.bytes - off;
    uint32_t fl = acc ? PLE_FUSE_ACCUMULATE : 0;
    ple_status st = fuse(h, seq, o.d + off, dtype, stride, fl);
    CHECK(st == PLE_OK, "%s: fuse %s (%s)", what, ple_status_name(st), ple_last_error_message());
    uint8_t *cpu = malloc(o.bytes);
    memcpy(cpu, o.init, o.bytes);
    PLE_OK_OR_FAIL(ple_dequant_cpu(h, twin, cpu + off, dtype, stride, fl));
    CU(cuStreamSynchronize(g_s));
    out_fetch(&o);
    CHECK(!memcmp(cpu, o.host, o.bytes), "%s: GPU vs ple_dequant_cpu differ", what);
    CHECK(compare_ref(o.host + off, o.init + off, bytes, t, rows, n, dtype, stride, acc, what) == 0,
          "%s: GPU vs reference", what);
    PLE_OK_OR_FAIL(ple_check_device(h));
    free(cpu);
    free(rows);
    out_free(&o);
    free_batch(&bb);
}

static void fuse_vs_cpu(ple_handle *h, const table_t *t, rng_t *r, uint32_t n, int dtype,
                        size_t stride, int acc, const char *what) {
    fuse_vs_cpu_at(h, t, r, n, dtype, stride, acc, 0, what);
}

static void test_m(table_t tabs[4]) {
    int p0 = g_pass, f0 = g_fail;
    rng_t r = {31};
    const size_t strides[3] = {2560, 2560 + 64, 2563};
    const uint32_t counts[3] = {1, 37, STEP_MAX};
    int combos = 0;
    for (int ti = 0; ti < 4; ti++) {
        ple_handle *h = NULL;
        if (PLE_OK_OR_FAIL(open_emu(tabs[ti].dir, PLE_WAIT_AUTO, 0, 4, &h)) != PLE_OK) continue;
        for (int dtype = 0; dtype < 3; dtype++)
            for (int acc = 0; acc < 2; acc++)
                for (int si = 0; si < 3; si++)
                    for (int ci = 0; ci < 3; ci++) {
                        /* the step maximum at the odd stride only (CI time); quick: fewer */
                        if (ci == 2 && si != 2) continue;
                        if (g_quick && (si != 2 || acc != ci % 2)) continue;
                        char w[128];
                        snprintf(w, sizeof w, "fmt %d %s acc %d stride %zu n %u", tabs[ti].format,
                                 dtype_name(dtype), acc, strides[si], counts[ci]);
                        fuse_vs_cpu(h, &tabs[ti], &r, counts[ci], dtype, strides[si], acc, w);
                        combos++;
                    }
        /* out one element past 16-byte alignment: the kernels' scalar stores */
        for (int dtype = 0; dtype < 3; dtype++) {
            char w[96];
            snprintf(w, sizeof w, "fmt %d %s out + 1 element", tabs[ti].format, dtype_name(dtype));
            fuse_vs_cpu_at(h, &tabs[ti], &r, 37, dtype, 2560, dtype == 1, 1, w);
            combos++;
        }
        ple_close(h);
    }
    char note[96];
    snprintf(note, sizeof note, "%d combinations of format x dtype x stride x accumulate x tokens", combos);
    section_result("m_matrix_vs_cpu", f0, p0, note);
}

static void test_w(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    const int modes[3] = {PLE_WAIT_HOST, PLE_WAIT_STREAM_OP, PLE_WAIT_SPIN_KERNEL};
    char note[160] = "";
    rng_t r = {32};
    for (int m = 0; m < 3; m++) {
        ple_handle *h = NULL;
        ple_status st = open_emu(t->dir, modes[m], 0, 4, &h);
        if (modes[m] == PLE_WAIT_STREAM_OP && !g_stream_ops) {
            CHECK(st == PLE_E_UNSUPPORTED, "STREAM_OP without stream mem ops: %s", ple_status_name(st));
            strncat(note, "stream_op refused (no 64-bit stream mem ops); ", sizeof note - strlen(note) - 1);
            if (st == PLE_OK) ple_close(h);
            continue;
        }
        CHECK(st == PLE_OK, "open %s: %s (%s)", wait_name(modes[m]), ple_status_name(st),
              ple_last_error_message());
        if (st != PLE_OK) continue;
        const uint32_t counts[3] = {1, 37, STEP_MAX};
        for (int i = 0; i < 3; i++) {
            char w[96];
            snprintf(w, sizeof w, "%s n %u", wait_name(modes[m]), counts[i]);
            fuse_vs_cpu(h, t, &r, counts[i], PLE_DTYPE_BF16, 2560, i == 1, w);
        }
        ple_close(h);
    }
    section_result("w_wait_modes", f0, p0, note);
}

static void hold_stream(void *arg) { usleep((useconds_t)(uintptr_t)arg); }

/* copies table dir `src` to `dst` (table.json + table.rows) */
static void copy_table(const char *src, const char *dst) {
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dst, src, dst);
    if (system(cmd) != 0) {
        fprintf(stderr, "FATAL: %s\n", cmd);
        exit(2);
    }
}

/* A step B fails on the host (its table's rows file is truncated after step A was gathered).
 * One ring slot, and A's kernel held back on the engine's stream, so B is still pending when
 * ple_dequant_fuse(B) is called: device-wait modes enqueue B's wait, whose gate then finds B
 * failed (NaN fill + device error, ple_wait(B) the host's error); host wait returns B's error
 * from the fuse and writes nothing. A fuse called after B already failed returns B's error in
 * every mode (then B is released, as by ple_dequant_cpu). */
static void test_f(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    const int modes[3] = {PLE_WAIT_HOST, PLE_WAIT_STREAM_OP, PLE_WAIT_SPIN_KERNEL};
    rng_t r = {33};
    for (int m = 0; m < 3; m++) {
        if (modes[m] == PLE_WAIT_STREAM_OP && !g_stream_ops) continue;
        const char *wn = wait_name(modes[m]);
        char dir[4200], rowsf[4300];
        snprintf(dir, sizeof dir, "%s-broken", t->dir);
        copy_table(t->dir, dir);
        ple_handle *h = NULL;
        if (PLE_OK_OR_FAIL(open_emu(dir, modes[m], 5000000, 1, &h)) != PLE_OK) continue;
        const uint32_t n = 5;
        batch_buf ba, bb;
        make_batch(&ba, &r, n, 1, 60000);
        make_batch(&bb, &r, n, 1, 60100);
        uint8_t *rows_a = ref_rows(h, t, &ba.b);
        outbuf oa, ob;
        out_alloc(&oa, &r, n, 2560, PLE_DTYPE_F32);
        out_alloc(&ob, &r, n, 2560, PLE_DTYPE_F32);
        uint64_t a = ++g_seq, b = ++g_seq;
        PLE_OK_OR_FAIL(ple_submit(h, &ba.b, a));
        PLE_OK_OR_FAIL(ple_wait(h, a, 5000000));
        snprintf(rowsf, sizeof rowsf, "%s/table.rows", dir);
        CHECK(truncate(rowsf, 0) == 0, "truncate %s", rowsf);
        CU(cuLaunchHostFunc(g_s, hold_stream, (void *)(uintptr_t)300000));
        PLE_OK_OR_FAIL(fuse(h, a, oa.d, PLE_DTYPE_F32, 2560, 0));
        PLE_OK_OR_FAIL(ple_submit(h, &bb.b, b)); /* waits for A's kernel to free the slot */
        ple_status st = fuse(h, b, ob.d, PLE_DTYPE_F32, 2560, 0);
        CU(cuStreamSynchronize(g_s));
        out_fetch(&oa);
        out_fetch(&ob);
        CHECK(compare_ref(oa.host, oa.init, oa.bytes, t, rows_a, n, PLE_DTYPE_F32, 2560, 0, "A") == 0,
              "%s: step A before the failure", wn);
        if (modes[m] == PLE_WAIT_HOST) {
            CHECK(st == PLE_E_IO, "host wait: fuse of a failed step: %s", ple_status_name(st));
            CHECK(!memcmp(ob.host, ob.init, ob.bytes), "host wait: a refused fuse wrote the output");
            CHECK(ple_check_device(h) == PLE_OK, "host wait: a device error was recorded");
        } else {
            CHECK(st == PLE_OK, "%s: fuse enqueued before the failure: %s (%s)", wn,
                  ple_status_name(st), ple_last_error_message());
            CHECK(all_nan(ob.host, ob.init, ob.bytes, n, PLE_DTYPE_F32, 2560),
                  "%s: failed step not NaN-filled", wn);
            ple_status dev = ple_check_device(h);
            CHECK(dev == PLE_E_STATE && strstr(ple_last_error_message(), "failed"),
                  "%s: device error of a failed step: %s (%s)", wn, ple_status_name(dev),
                  ple_last_error_message());
            CHECK(ple_check_device(h) == PLE_OK, "%s: device error not cleared", wn);
            ple_status ws = ple_wait(h, b, 5000000);
            CHECK(ws == PLE_E_IO, "%s: ple_wait on the failed step: %s", wn, ple_status_name(ws));
        }
        /* a fuse after the failure: the step's error, nothing written */
        uint64_t c = ++g_seq;
        PLE_OK_OR_FAIL(ple_submit(h, &ba.b, c));
        ple_status wc = ple_wait(h, c, 5000000);
        CHECK(wc == PLE_E_IO, "%s: ple_wait on a failed step: %s", wn, ple_status_name(wc));
        out_fill(&ob, 0x77);
        st = fuse(h, c, ob.d, PLE_DTYPE_F32, 2560, 0);
        CU(cuStreamSynchronize(g_s));
        out_fetch(&ob);
        CHECK(st == PLE_E_IO && !memcmp(ob.host, ob.init, ob.bytes),
              "%s: fuse after the failure: %s, output %s", wn, ple_status_name(st),
              memcmp(ob.host, ob.init, ob.bytes) ? "written" : "untouched");
        free(rows_a);
        out_free(&oa);
        out_free(&ob);
        free_batch(&ba);
        free_batch(&bb);
        ple_close(h);
    }
    section_result("f_failed_step", f0, p0, "rows file truncated after open");
}

/* a capture of ple_dequant_fuse_graph into `o` (capacity cap) */
static CUgraphExec capture(ple_handle *h, outbuf *o, uint32_t cap, int dtype, size_t stride,
                           uint32_t flags, CUgraph *g) {
    CUgraphExec exec = NULL;
    CU(cuStreamBeginCapture(g_s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    ple_status st = ple_dequant_fuse_graph(h, (void *)g_s, cap, (void *)(uintptr_t)o->d, dtype,
                                           stride, flags);
    CU(cuStreamEndCapture(g_s, g));
    CHECK(st == PLE_OK, "capture: %s (%s)", ple_status_name(st), ple_last_error_message());
    CU(cuGraphInstantiateWithFlags(&exec, *g, 0));
    return exec;
}

static void test_l(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    rng_t r = {34};
    int waited = 0, launched = 0;
    const int k = 5, modes[2] = {PLE_WAIT_AUTO, PLE_WAIT_HOST};
    for (int m = 0; m < 2; m++) {
        ple_handle *h = NULL;
        if (PLE_OK_OR_FAIL(open_emu(t->dir, modes[m], 3000000, 2, &h)) != PLE_OK) continue;
        const uint32_t cap = 40;
        outbuf o;
        out_alloc(&o, &r, cap, 2560, PLE_DTYPE_F32);
        PLE_OK_OR_FAIL(ple_graph_prepare(h, (void *)g_s, g_seq + 1));
        CUgraph g;
        CUgraphExec exec = capture(h, &o, cap, PLE_DTYPE_F32, 2560, 0, &g);
        CUevent ev;
        CU(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
        for (int i = 0; i < k; i++) {
            uint32_t n = 1 + (uint32_t)(rng_next(&r) % cap);
            batch_buf bb;
            make_batch(&bb, &r, n, 1, 61000 + (uint64_t)i * 10);
            uint8_t *rows = ref_rows(h, t, &bb.b);
            CU(cuStreamSynchronize(g_s));
            out_fill(&o, 0x3C);
            CU(cuGraphLaunch(exec, g_s)); /* before its step is submitted */
            CU(cuEventRecord(ev, g_s));
            usleep(30000);
            CUresult q = cuEventQuery(ev);
            CHECK(q == CUDA_ERROR_NOT_READY, "%s: replay %d finished before its step was submitted (%d)",
                  wait_name(modes[m]), i, (int)q);
            waited += q == CUDA_ERROR_NOT_READY;
            launched++;
            PLE_OK_OR_FAIL(ple_submit(h, &bb.b, ++g_seq));
            CU(cuStreamSynchronize(g_s));
            PLE_OK_OR_FAIL(ple_check_device(h));
            out_fetch(&o);
            char w[64];
            snprintf(w, sizeof w, "%s: late replay %d (%u tokens)", wait_name(modes[m]), i, n);
            CHECK(compare_ref(o.host, o.init, o.bytes, t, rows, n, PLE_DTYPE_F32, 2560, 0, w) == 0, "%s", w);
            free(rows);
            free_batch(&bb);
        }
        cuEventDestroy(ev);
        cuGraphExecDestroy(exec);
        cuGraphDestroy(g);
        ple_close(h);
        out_free(&o);
    }
    char note[96];
    snprintf(note, sizeof note, "%d of %d replays (auto, host) still waiting 30 ms after launch",
             waited, launched);
    section_result("l_late_submit", f0, p0, note);
}

static void test_r(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    const int modes[3] = {PLE_WAIT_HOST, PLE_WAIT_STREAM_OP, PLE_WAIT_SPIN_KERNEL};
    char note[200] = "";
    rng_t r = {35};
    for (int m = 0; m < 3; m++) {
        if (modes[m] == PLE_WAIT_STREAM_OP && !g_stream_ops) continue;
        ple_handle *h = NULL;
        if (PLE_OK_OR_FAIL(open_emu(t->dir, modes[m], 5000000, 2, &h)) != PLE_OK) continue;
        batch_buf bb[3];
        uint8_t *rows[3];
        outbuf o[3];
        uint64_t seq[3];
        for (int i = 0; i < 3; i++) {
            make_batch(&bb[i], &r, 30 + (uint32_t)i, 1, 62000 + (uint64_t)i * 10);
            rows[i] = ref_rows(h, t, &bb[i].b);
            out_alloc(&o[i], &r, 30 + (uint32_t)i, 2560, PLE_DTYPE_BF16);
        }
        /* the engine's stream is held 400 ms: step 1's kernel has not read its slot when step 3
         * (the same slot of 2) is submitted */
        CU(cuLaunchHostFunc(g_s, hold_stream, (void *)(uintptr_t)400000));
        int held = 0;
        for (int i = 0; i < 3; i++) {
            seq[i] = ++g_seq;
            PLE_OK_OR_FAIL(ple_submit(h, &bb[i].b, seq[i]));
            if (modes[m] != PLE_WAIT_HOST || i < 2) {
                ple_status st = fuse(h, seq[i], o[i].d, PLE_DTYPE_BF16, 2560, 0);
                CHECK(st == PLE_OK, "%s: fuse %d: %s (%s)", wait_name(modes[m]), i,
                      ple_status_name(st), ple_last_error_message());
            }
            if (i == 2) {
                /* step 3 waits for its slot: not complete while step 1's kernel is held */
                ple_status ws = ple_wait(h, seq[2], 100000);
                held = ws == PLE_E_TIMEOUT;
                CHECK(held || modes[m] == PLE_WAIT_HOST,
                      "%s: step 3 completed while step 1's kernel still had to read the slot (%s)",
                      wait_name(modes[m]), ple_status_name(ws));
                if (modes[m] == PLE_WAIT_HOST) { /* host wait: fuse blocks until complete */
                    ple_status st = fuse(h, seq[2], o[2].d, PLE_DTYPE_BF16, 2560, 0);
                    CHECK(st == PLE_OK, "host: fuse 2: %s (%s)", ple_status_name(st), ple_last_error_message());
                }
            }
        }
        CU(cuStreamSynchronize(g_s));
        PLE_OK_OR_FAIL(ple_check_device(h));
        for (int i = 0; i < 3; i++) {
            out_fetch(&o[i]);
            char w[64];
            snprintf(w, sizeof w, "%s ring reuse step %d", wait_name(modes[m]), i);
            CHECK(compare_ref(o[i].host, o[i].init, o[i].bytes, t, rows[i], 30 + (uint32_t)i,
                              PLE_DTYPE_BF16, 2560, 0, w) == 0, "%s", w);
            free(rows[i]);
            out_free(&o[i]);
            free_batch(&bb[i]);
        }
        size_t len = strlen(note);
        snprintf(note + len, sizeof note - len, "%s: reuse %s; ", wait_name(modes[m]),
                 held ? "waited" : "not observed");
        ple_close(h);
    }
    section_result("r_ring_reuse_in_flight", f0, p0, note);
}

static void test_g(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    ple_handle *h = NULL;
    rng_t r = {36};
    if (PLE_OK_OR_FAIL(open_emu(t->dir, PLE_WAIT_AUTO, 0, 3, &h)) == PLE_OK) {
        const uint32_t cap = 24;
        const size_t stride = 2563;
        outbuf o;
        out_alloc(&o, &r, cap, stride, PLE_DTYPE_F16);
        PLE_OK_OR_FAIL(ple_graph_prepare(h, (void *)g_s, g_seq + 1));
        CUgraph g;
        CUgraphExec exec = capture(h, &o, cap, PLE_DTYPE_F16, stride, PLE_FUSE_ACCUMULATE, &g);
        const int replays = g_quick ? 20 : 100;
        for (int k = 0; k < replays; k++) {
            int over = k == 7 || k == replays - 3;
            uint32_t n = over ? cap + 1 + (uint32_t)k % 5 : 1 + (uint32_t)(rng_next(&r) % cap);
            batch_buf bb;
            make_batch(&bb, &r, n, n > 2 ? 2 : 1, 63000 + (uint64_t)k * 10);
            uint8_t *rows = ref_rows(h, t, &bb.b);
            CU(cuStreamSynchronize(g_s));
            rng_fill(&r, o.init, o.bytes);
            CU(cuMemcpyHtoD(o.d, o.init, o.bytes));
            PLE_OK_OR_FAIL(ple_submit(h, &bb.b, ++g_seq));
            CU(cuGraphLaunch(exec, g_s));
            CU(cuStreamSynchronize(g_s));
            out_fetch(&o);
            ple_status dev = ple_check_device(h);
            char w[96];
            snprintf(w, sizeof w, "replay %d (%u tokens, capacity %u)", k, n, cap);
            if (over) {
                CHECK(dev == PLE_E_STATE, "%s: over capacity reported as %s", w, ple_status_name(dev));
                CHECK(all_nan(o.host, o.init, o.bytes, cap, PLE_DTYPE_F16, stride), "%s: not NaN-filled", w);
            } else {
                CHECK(dev == PLE_OK, "%s: device error %s (%s)", w, ple_status_name(dev), ple_last_error_message());
                CHECK(compare_ref(o.host, o.init, o.bytes, t, rows, n, PLE_DTYPE_F16, stride, 1, w) == 0, "%s", w);
            }
            free(rows);
            free_batch(&bb);
        }
        cuGraphExecDestroy(exec);
        cuGraphDestroy(g);
        ple_close(h);
        out_free(&o);
    }
    section_result("g_graph_replays", f0, p0, "f16 accumulate, stride 2563, capacity 24, two steps over it");
}

static void test_c(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    char note[160] = "";
    rng_t r = {37};
    const int mode = g_stream_ops ? PLE_WAIT_STREAM_OP : PLE_WAIT_SPIN_KERNEL;
    ple_handle *h = NULL;
    if (PLE_OK_OR_FAIL(open_emu(t->dir, mode, 0, 4, &h)) == PLE_OK) {
        const uint32_t n = 300;
        batch_buf bb;
        make_batch(&bb, &r, n, 2, 64000);
        outbuf o[3];
        for (int i = 0; i < 3; i++) out_alloc(&o[i], &r, n, 2560, PLE_DTYPE_BF16);
        CU(cuLaunchHostFunc(g_s, hold_stream, (void *)(uintptr_t)300000));
        for (int i = 0; i < 3; i++) {
            uint64_t seq = ++g_seq;
            PLE_OK_OR_FAIL(ple_submit(h, &bb.b, seq));
            ple_status st = fuse(h, seq, o[i].d, PLE_DTYPE_BF16, 2560, 0);
            CHECK(st == PLE_OK, "fuse %d: %s (%s)", i, ple_status_name(st), ple_last_error_message());
        }
        double t0 = now_s();
        ple_close(h); /* the three kernels are still queued behind the held stream */
        double dc = now_s() - t0;
        CUresult cr = cuStreamSynchronize(g_s);
        CHECK(dc < 12.0, "ple_close took %.3f s", dc);
        CHECK(cr == CUDA_SUCCESS, "stream after close: %d", (int)cr);
        int nan = 0;
        for (int i = 0; i < 3; i++) {
            out_fetch(&o[i]);
            nan += all_nan(o[i].host, o[i].init, o[i].bytes, n, PLE_DTYPE_BF16, 2560);
            out_free(&o[i]);
        }
        CHECK(nan == 3, "%d of 3 launches cut short by close were NaN-filled", nan);
        snprintf(note, sizeof note, "%s: close %.3f s with 3 fuses queued", wait_name(mode), dc);
        free_batch(&bb);
    }
    section_result("c_close_in_flight", f0, p0, note);
}

static void test_x(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    ple_handle *h = NULL;
    rng_t r = {38};
    if (PLE_OK_OR_FAIL(open_emu(t->dir, PLE_WAIT_AUTO, 0, 4, &h)) == PLE_OK) {
        batch_buf bb;
        make_batch(&bb, &r, 7, 1, 65000);
        uint8_t *rows = ref_rows(h, t, &bb.b);
        uint64_t seq = ++g_seq;
        PLE_OK_OR_FAIL(ple_submit(h, &bb.b, seq));
        outbuf o;
        out_alloc(&o, &r, 7, 2560, PLE_DTYPE_F32);
        /* a stream of another context */
        CUcontext other;
        CUstream so;
        CU(cuCtxCreate(&other, 0, g_dev));
        CU(cuStreamCreate(&so, CU_STREAM_NON_BLOCKING));
        CU(cuCtxSetCurrent(g_ctx));
        ple_status st = ple_dequant_fuse(h, (void *)so, seq, (void *)(uintptr_t)o.d, PLE_DTYPE_F32, 2560, 0);
        CHECK(st == PLE_E_INVALID_ARGUMENT, "a stream of another context: %s", ple_status_name(st));
        /* freed output memory */
        CUdeviceptr gone;
        CU(cuMemAlloc(&gone, 7 * 2560 * 4));
        CU(cuMemFree(gone));
        st = ple_dequant_fuse(h, (void *)g_s, seq, (void *)(uintptr_t)gone, PLE_DTYPE_F32, 2560, 0);
        CHECK(st == PLE_E_INVALID_ARGUMENT, "freed out memory: %s", ple_status_name(st));
        /* the legacy NULL stream */
        st = ple_dequant_fuse(h, NULL, seq, (void *)(uintptr_t)o.d, PLE_DTYPE_F32, 2560, 0);
        CHECK(st == PLE_OK, "legacy stream: %s (%s)", ple_status_name(st), ple_last_error_message());
        CU(cuCtxSynchronize());
        out_fetch(&o);
        CHECK(compare_ref(o.host, o.init, o.bytes, t, rows, 7, PLE_DTYPE_F32, 2560, 0, "legacy") == 0,
              "legacy stream output");
        PLE_OK_OR_FAIL(ple_check_device(h));
        ple_close(h);
        cuCtxDestroy(other);
        CU(cuCtxSetCurrent(g_ctx));
        free(rows);
        out_free(&o);
        free_batch(&bb);
    }
    section_result("x_misuse", f0, p0, "another context's stream, freed out, legacy stream");
}

/* (q) replays queued ahead of their steps: 6 replays launched at once, then the 6 steps
 * submitted back to back through 2 ring slots; the last replay's output is the last step's */
static void test_q(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    ple_handle *h = NULL;
    rng_t r = {39};
    if (PLE_OK_OR_FAIL(open_emu(t->dir, PLE_WAIT_AUTO, 3000000, 2, &h)) == PLE_OK) {
        const uint32_t cap = 16;
        const int k = 6;
        outbuf o;
        out_alloc(&o, &r, cap, 2560, PLE_DTYPE_BF16);
        PLE_OK_OR_FAIL(ple_graph_prepare(h, (void *)g_s, g_seq + 1));
        CUgraph g;
        CUgraphExec exec = capture(h, &o, cap, PLE_DTYPE_BF16, 2560, 0, &g);
        for (int i = 0; i < k; i++) CU(cuGraphLaunch(exec, g_s));
        batch_buf bb[6];
        uint8_t *rows = NULL;
        double t0 = now_s();
        for (int i = 0; i < k; i++) {
            make_batch(&bb[i], &r, 1 + (uint32_t)i * 2, 1, 66000 + (uint64_t)i * 10);
            if (i == k - 1) rows = ref_rows(h, t, &bb[i].b);
            PLE_OK_OR_FAIL(ple_submit(h, &bb[i].b, ++g_seq));
        }
        CU(cuStreamSynchronize(g_s));
        double dt = now_s() - t0;
        PLE_OK_OR_FAIL(ple_check_device(h));
        out_fetch(&o);
        CHECK(compare_ref(o.host, o.init, o.bytes, t, rows, bb[k - 1].b.num_tokens, PLE_DTYPE_BF16,
                          2560, 0, "queued replays") == 0, "the last queued replay's output");
        CHECK(dt < 2.5, "6 queued replays took %.3f s (a slot wait ran into its timeout?)", dt);
        for (int i = 0; i < k; i++) free_batch(&bb[i]);
        free(rows);
        cuGraphExecDestroy(exec);
        cuGraphDestroy(g);
        ple_close(h);
        out_free(&o);
    }
    section_result("q_replays_queued_ahead", f0, p0, "6 replays queued, then 6 steps, 2 slots");
}

/* (y) ple_open and ple_close while the calling thread captures in global mode: libple's own
 * driver calls must neither fail nor invalidate the engine's capture */
static void test_y(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    CUstream s2;
    CU(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CU(cuStreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_GLOBAL));
    ple_handle *h = NULL;
    ple_status st = open_emu(t->dir, PLE_WAIT_AUTO, 0, 2, &h);
    CHECK(st == PLE_OK, "ple_open during a global capture: %s (%s)", ple_status_name(st),
          ple_last_error_message());
    if (st == PLE_OK) ple_close(h);
    CUgraph g = NULL;
    CUresult r = cuStreamEndCapture(s2, &g);
    CHECK(r == CUDA_SUCCESS, "the engine's capture after ple_open/ple_close: %d", (int)r);
    if (g) cuGraphDestroy(g);
    cuStreamDestroy(s2);
    section_result("y_open_close_during_capture", f0, p0, "");
}

/* (t) two engine threads, each with its own stream, fusing the steps of one handle: thread i
 * fuses the steps with seq % 2 == i while the main thread submits them in order */
typedef struct {
    ple_handle *h;
    const table_t *t;
    int parity, k, bad;
    uint64_t base;
    batch_buf *bb;
    uint8_t **rows;
} fuser_t;

static void *fuser(void *arg) {
    fuser_t *f = arg;
    CU(cuCtxSetCurrent(g_ctx));
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    rng_t r = {90 + (uint64_t)f->parity};
    for (int i = f->parity; i < f->k; i += 2) {
        uint64_t seq = f->base + (uint64_t)i;
        uint32_t n = f->bb[i].b.num_tokens;
        outbuf o;
        out_alloc(&o, &r, n, 2560, PLE_DTYPE_F32);
        ple_status st;
        while ((st = ple_dequant_fuse(f->h, (void *)s, seq, (void *)(uintptr_t)o.d, PLE_DTYPE_F32,
                                      2560, 0)) == PLE_E_STATE &&
               strstr(ple_last_error_message(), "never submitted"))
            usleep(200); /* the main thread has not submitted it yet */
        if (st != PLE_OK) {
            fprintf(stderr, "  thread %d: fuse %llu: %s (%s)\n", f->parity, (unsigned long long)seq,
                    ple_status_name(st), ple_last_error_message());
            f->bad++;
        }
        CU(cuStreamSynchronize(s));
        out_fetch(&o);
        if (st == PLE_OK &&
            compare_ref(o.host, o.init, o.bytes, f->t, f->rows[i], n, PLE_DTYPE_F32, 2560, 0, "thread") != 0)
            f->bad++;
        out_free(&o);
    }
    cuStreamDestroy(s);
    return NULL;
}

static void test_t(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    char note[96] = "";
    const int modes[2] = {PLE_WAIT_AUTO, PLE_WAIT_HOST};
    for (int m = 0; m < 2; m++) {
        ple_handle *h = NULL;
        if (PLE_OK_OR_FAIL(open_emu(t->dir, modes[m], 5000000, 4, &h)) != PLE_OK) continue;
        enum { K = 40 };
        batch_buf bb[K];
        uint8_t *rows[K];
        rng_t r = {91};
        for (int i = 0; i < K; i++) {
            make_batch(&bb[i], &r, 1 + (uint32_t)(rng_next(&r) % 60), 2, 67000 + (uint64_t)i * 10);
            rows[i] = ref_rows(h, t, &bb[i].b);
        }
        fuser_t f[2];
        pthread_t th[2];
        for (int i = 0; i < 2; i++) {
            f[i] = (fuser_t){h, t, i, K, 0, g_seq + 1, bb, rows};
            pthread_create(&th[i], NULL, fuser, &f[i]);
        }
        for (int i = 0; i < K; i++) {
            ple_status st;
            /* ring full (4 slots) until the fusers consume: retry */
            while ((st = ple_submit(h, &bb[i].b, g_seq + 1)) == PLE_E_TIMEOUT) usleep(200);
            CHECK(st == PLE_OK, "%s: submit %d: %s (%s)", wait_name(modes[m]), i, ple_status_name(st),
                  ple_last_error_message());
            g_seq++;
        }
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        CHECK(f[0].bad == 0 && f[1].bad == 0, "%s: %d + %d steps failed or differ", wait_name(modes[m]),
              f[0].bad, f[1].bad);
        PLE_OK_OR_FAIL(ple_check_device(h));
        for (int i = 0; i < K; i++) {
            free(rows[i]);
            free_batch(&bb[i]);
        }
        ple_close(h);
        size_t len = strlen(note);
        snprintf(note + len, sizeof note - len, "%s: %d steps; ", wait_name(modes[m]), K);
    }
    section_result("t_two_engine_threads", f0, p0, note);
}

/* (p) One ring slot, host wait. Step A's kernel is held on the engine's stream, so step B (the
 * same slot) is gathered only after it: a thread fuses B (blocking in its host wait), then the
 * main thread calls ple_graph_prepare (from then on the worker copies no rows to the device), then
 * the stream is released. B's kernel must read B's rows, not the slot's device rows (A's). */
typedef struct {
    ple_handle *h;
    uint64_t seq;
    CUdeviceptr out;
    ple_status st;
} host_fuse_t;

static void *host_fuser(void *arg) {
    host_fuse_t *x = arg;
    CU(cuCtxSetCurrent(g_ctx));
    x->st = fuse(x->h, x->seq, x->out, PLE_DTYPE_F32, 2560, 0);
    return NULL;
}

static void test_p(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    char note[160] = "";
    rng_t r = {38};
    ple_handle *h = NULL;
    if (PLE_OK_OR_FAIL(open_emu(t->dir, PLE_WAIT_HOST, 5000000, 1, &h)) == PLE_OK) {
        batch_buf bb[2];
        uint8_t *rows[2];
        outbuf o[2];
        for (int i = 0; i < 2; i++) {
            make_batch(&bb[i], &r, 20 + (uint32_t)i, 1, 64000 + (uint64_t)i * 10);
            rows[i] = ref_rows(h, t, &bb[i].b);
            out_alloc(&o[i], &r, 20 + (uint32_t)i, 2560, PLE_DTYPE_F32);
        }
        uint64_t a = ++g_seq, b = ++g_seq;
        PLE_OK_OR_FAIL(ple_submit(h, &bb[0].b, a));
        /* A complete (its copy done) before the stream is held: with one hardware queue
         * (CUDA_DEVICE_MAX_CONNECTIONS=1) a copy queued after the hold would wait for it */
        PLE_OK_OR_FAIL(ple_wait(h, a, 5000000));
        CU(cuLaunchHostFunc(g_s, hold_stream, (void *)(uintptr_t)600000));
        ple_status st = fuse(h, a, o[0].d, PLE_DTYPE_F32, 2560, 0);
        CHECK(st == PLE_OK, "fuse A: %s (%s)", ple_status_name(st), ple_last_error_message());
        PLE_OK_OR_FAIL(ple_submit(h, &bb[1].b, b));
        host_fuse_t x = {h, b, o[1].d, PLE_E_PANIC}; /* until the thread sets it */
        pthread_t th;
        pthread_create(&th, NULL, host_fuser, &x);
        usleep(150000); /* the thread is in B's host wait: A's kernel holds the slot */
        ple_status ws = ple_wait(h, b, 1000);
        CHECK(ws == PLE_E_TIMEOUT, "step B completed while A's kernel still held its slot (%s)",
              ple_status_name(ws));
        PLE_OK_OR_FAIL(ple_graph_prepare(h, (void *)g_s, b + 1));
        pthread_join(th, NULL);
        CHECK(x.st == PLE_OK, "fuse B across ple_graph_prepare: %s", ple_status_name(x.st));
        CU(cuStreamSynchronize(g_s));
        PLE_OK_OR_FAIL(ple_check_device(h));
        for (int i = 0; i < 2; i++) {
            out_fetch(&o[i]);
            char w[64];
            snprintf(w, sizeof w, "host fuse across prepare, step %c", 'A' + i);
            CHECK(compare_ref(o[i].host, o[i].init, o[i].bytes, t, rows[i], 20 + (uint32_t)i,
                              PLE_DTYPE_F32, 2560, 0, w) == 0, "%s", w);
            free(rows[i]);
            out_free(&o[i]);
            free_batch(&bb[i]);
        }
        snprintf(note, sizeof note, "B %s before the prepare", ws == PLE_E_TIMEOUT ? "pending" : "complete");
        ple_close(h);
    }
    section_result("p_host_fuse_across_graph_prepare", f0, p0, note);
}

/* (v) Two physical chunks mapped back to back (cuMemMap); the captured output straddles them, so
 * cuMemGetAddressRange reports one chunk only and the output check must probe for VMM during the
 * engine's global-mode capture. */
static void test_v(table_t *t) {
    int p0 = g_pass, f0 = g_fail;
    char note[160] = "";
    ple_handle *h = NULL;
    rng_t r = {39};
    if (PLE_OK_OR_FAIL(open_emu(t->dir, PLE_WAIT_SPIN_KERNEL, 0, 2, &h)) == PLE_OK) {
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
        const uint32_t cap = 64; /* 327680 B of bf16, from 128 KiB before the boundary */
        outbuf o;
        o.d = va + chunk - (128u << 10);
        o.bytes = (size_t)cap * EMBED * 2;
        o.init = malloc(o.bytes);
        o.host = malloc(o.bytes);
        PLE_OK_OR_FAIL(ple_graph_prepare(h, (void *)g_s, g_seq + 1));
        CUgraph g = NULL;
        CUgraphExec exec = NULL;
        CU(cuStreamBeginCapture(g_s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        ple_status st = ple_dequant_fuse_graph(h, (void *)g_s, cap, (void *)(uintptr_t)o.d,
                                               PLE_DTYPE_BF16, EMBED, 0);
        CUresult er = cuStreamEndCapture(g_s, &g);
        CHECK(st == PLE_OK, "capture into a VMM tensor over two chunks: %s (%s)",
              ple_status_name(st), ple_last_error_message());
        CHECK(er == CUDA_SUCCESS, "the engine's capture after ple_dequant_fuse_graph: %d", (int)er);
        int replays = 0;
        if (st == PLE_OK && er == CUDA_SUCCESS) {
            CU(cuGraphInstantiateWithFlags(&exec, g, 0));
            for (int k = 0; k < 3; k++) {
                uint32_t n = k == 0 ? cap : 1 + (uint32_t)(rng_next(&r) % cap);
                batch_buf bb;
                make_batch(&bb, &r, n, 2, 65000 + (uint64_t)k * 10);
                uint8_t *rows = ref_rows(h, t, &bb.b);
                rng_fill(&r, o.init, o.bytes);
                CU(cuMemcpyHtoD(o.d, o.init, o.bytes));
                PLE_OK_OR_FAIL(ple_submit(h, &bb.b, ++g_seq));
                CU(cuGraphLaunch(exec, g_s));
                CU(cuStreamSynchronize(g_s));
                out_fetch(&o);
                PLE_OK_OR_FAIL(ple_check_device(h));
                char w[64];
                snprintf(w, sizeof w, "VMM replay %d (%u tokens)", k, n);
                CHECK(compare_ref(o.host, o.init, o.bytes, t, rows, n, PLE_DTYPE_BF16, EMBED, 0, w) == 0,
                      "%s", w);
                replays++;
                free(rows);
                free_batch(&bb);
            }
            cuGraphExecDestroy(exec);
        }
        if (g) cuGraphDestroy(g);
        snprintf(note, sizeof note, "chunk %zu B, %d replays", chunk, replays);
        ple_close(h);
        free(o.init);
        free(o.host);
        cuMemUnmap(va, 2 * chunk);
        cuMemAddressFree(va, 2 * chunk);
        cuMemRelease(m0);
        cuMemRelease(m1);
    }
    section_result("v_vmm_capture", f0, p0, note);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: gpu_emu_test TABLE_ROOT OUTDIR [quick]\n");
        return 2;
    }
    g_quick = argc > 3 && !strcmp(argv[3], "quick");
    mkdir(argv[1], 0755);
    mkdir(argv[2], 0755);
    harness_init();
    char name[256] = "", p[4200];
    cuDeviceGetName(name, sizeof name, g_dev);
    fprintf(stderr, "device 0: %s, 64-bit stream mem ops %d, libple %s%s\n", name, g_stream_ops,
            ple_version_string(), g_quick ? " (quick)" : "");
    snprintf(p, sizeof p, "%s/gpu_emu_test.json", argv[2]);
    g_json = fopen(p, "w");
    if (!g_json) {
        perror(p);
        return 2;
    }
    fprintf(g_json, "{\n  \"device\": \"%s\",\n  \"stream_mem_ops\": %d,\n  \"sections\": {", name,
            g_stream_ops);
    table_t tabs[4];
    open_table(&tabs[0], argv[1], "nvfp4", 41);
    open_table(&tabs[1], argv[1], "fp8", 42);
    open_table(&tabs[2], argv[1], "bf16", 43);
    open_table(&tabs[3], argv[1], "f32", 44);
    test_m(tabs);
    test_w(&tabs[0]);
    test_f(&tabs[0]);
    test_l(&tabs[0]);
    test_r(&tabs[0]);
    test_g(&tabs[0]);
    test_c(&tabs[0]);
    test_x(&tabs[0]);
    test_q(&tabs[0]);
    test_y(&tabs[0]);
    test_t(&tabs[0]);
    test_p(&tabs[0]);
    test_v(&tabs[0]);
    fprintf(g_json, "\n  },\n  \"passed\": %d,\n  \"failed\": %d\n}\n", g_pass, g_fail);
    fclose(g_json);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

/* The step loop through the C API on a small generated NVFP4 table: a prefill chunk and decode
 * steps for several requests, each checked against rows read straight from the file and decoded
 * by a plain scalar rule; the staging layout is [tokens][16][row_bytes]; sequence numbers. */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "table_util.h"

#define PREFILL 300
#define REQS 4

static int check_step(ple_handle *h, const char *dir, uint64_t seq, const int64_t *ids, uint32_t n, float global) {
    int bad = 0;
    const uint8_t *rows = NULL;
    uint32_t ntok = 0;
    CHECK_STATUS(ple_wait(h, seq, 10 * 1000 * 1000), PLE_OK);
    /* timeout 0 polls: a complete step is PLE_OK at once, a seq never submitted a state error */
    CHECK_STATUS(ple_wait(h, seq, 0), PLE_OK);
    CHECK_STATUS(ple_wait(h, seq + 1000, 0), PLE_E_STATE);
    CHECK_STATUS(ple_packed_rows(h, seq, &rows, &ntok), PLE_OK);
    CHECK(ntok == n);
    if (rows == NULL || ntok != n) return 1;
    uint8_t want[90];
    for (uint32_t t = 0; t < n; t++)
        for (int k = 0; k < 16; k++) {
            if (read_row(dir, ids[t * 16 + k], 90, want) != 0 ||
                memcmp(rows + ((size_t)t * 16 + k) * 90, want, 90) != 0)
                bad++;
        }
    CHECK(bad == 0);
    /* dequantise and compare with the scalar decoder, bit for bit */
    size_t stride = 16 * 160 + 64; /* the test table: 16 heads of 160; padded rows */
    float *out = calloc((size_t)n * stride, sizeof(float));
    float ref[160];
    /* refused arguments leave the step in place: the retry below still finds it */
    CHECK_STATUS(ple_dequant_cpu(h, seq, out, PLE_DTYPE_F32, SIZE_MAX, 0), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_dequant_cpu(h, seq, out, (ple_dtype)99, stride, 0), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_dequant_cpu(h, seq, out, PLE_DTYPE_F32, stride, 0), PLE_OK);
    int mism = 0;
    for (uint32_t t = 0; t < n; t++)
        for (int k = 0; k < 16; k++) {
            read_row(dir, ids[t * 16 + k], 90, want);
            decode_nvfp4_row(want, global, ref);
            if (memcmp(out + t * stride + k * 160, ref, sizeof ref) != 0) mism++;
        }
    CHECK(mism == 0);
    /* the slot is consumed: its rows are gone */
    CHECK_STATUS(ple_packed_rows(h, seq, &rows, &ntok), PLE_E_STATE);
    free(out);
    return bad + mism;
}

int main(void) {
    char tmpl[] = "/tmp/ple-steps-XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (dir == NULL || make_table(dir, "--base 2000 --shards 8 --seed 11") != 0) {
        fprintf(stderr, "could not generate the table\n");
        return 1;
    }
    ple_options o;
    ple_options_default(&o);
    o.num_threads = 2;
    ple_handle *h = NULL;
    CHECK_STATUS(ple_open(dir, &o, &h), PLE_OK);
    if (h == NULL) return check_done("test_steps");
    ple_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK_STATUS(ple_table_info(h, &info), PLE_OK);

    /* step 1: a prefill chunk for request 1 (tracked mode) */
    int32_t toks[PREFILL], pos[PREFILL];
    for (int i = 0; i < PREFILL; i++) {
        toks[i] = (i % 50 == 0) ? info.eos_token_id : (int32_t)((i * 7919) % (int32_t)info.vocab_size);
        pos[i] = i;
    }
    uint64_t rid1 = 1;
    uint32_t qs1[2] = {0, PREFILL};
    ple_batch pre = {toks, pos, PREFILL, &rid1, qs1, 1, NULL};
    int64_t *ids = malloc(sizeof(int64_t) * 16 * PREFILL);
    CHECK_STATUS(ple_ngram_ids(h, &pre, ids), PLE_OK);
    CHECK_STATUS(ple_submit(h, &pre, 1), PLE_OK);
    CHECK_STATUS(ple_submit(h, &pre, 1), PLE_E_STATE); /* seq must increase */
    check_step(h, dir, 1, ids, PREFILL, info.global_scale);

    /* decode: request 1 continues; requests 2..4 start fresh at position 0 */
    uint64_t seq = 1;
    for (int step = 0; step < 5; step++) {
        int32_t dt[REQS], dp[REQS];
        uint64_t rids[REQS];
        uint32_t qs[REQS + 1];
        for (int r = 0; r < REQS; r++) {
            rids[r] = (uint64_t)r + 1;
            dt[r] = (int32_t)((step * 131 + r * 17 + 5) % (int32_t)info.vocab_size);
            dp[r] = r == 0 ? PREFILL + step : step;
            qs[r] = (uint32_t)r;
        }
        qs[REQS] = REQS;
        ple_batch d = {dt, dp, REQS, rids, qs, REQS, NULL};
        int64_t dids[16 * REQS];
        CHECK_STATUS(ple_ngram_ids(h, &d, dids), PLE_OK);
        seq++;
        CHECK_STATUS(ple_submit(h, &d, seq), PLE_OK);
        check_step(h, dir, seq, dids, REQS, info.global_scale);
    }

    ple_counters st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK_STATUS(ple_stats(h, &st), PLE_OK);
    CHECK(st.prefill_tokens + st.decode_tokens == PREFILL + 5 * REQS);
    CHECK(st.prefill_rows + st.decode_rows == 16ull * (PREFILL + 5 * REQS));
    /* ple_stats measures nothing (cheap every step); ple_stats_residency measures residency */
    CHECK(st.table_pages > 0 && st.resident_pages == 0 && st.mem_available_bytes == 0);
    ple_counters full;
    memset(&full, 0, sizeof full);
    full.struct_size = sizeof full;
    CHECK_STATUS(ple_stats_residency(h, &full), PLE_OK);
    CHECK(full.table_pages == st.table_pages && full.resident_pages > 0 && full.mem_available_bytes > 0);
    CHECK(full.prefill_rows + full.decode_rows == st.prefill_rows + st.decode_rows);
    /* queueing is part of each step's submit-to-done time */
    CHECK(st.queue_ns <= st.prefill_step_ns + st.decode_step_ns);

    ple_close(h);
    free(ids);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return check_done("test_steps");
}

/* Rows by the engine's own ids (ple_submit_ids, ple_prefetch_ahead_ids) from C: the ids
 * ple_ngram_ids gives for a batch, submitted as ids, give the batch's rows and output bit for
 * bit (whole table and a head shard); rows equal the row file's; an id outside its head's rows,
 * bad flags and 0 tokens are PLE_E_INVALID_ARGUMENT naming what is wrong, and take no slot. */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "table_util.h"

#define TOKENS 40

/* Submits `b` as seq `seq` and `ids` as seq `seq + 1` on `h`; counts the differences of their
 * packed rows and f32 outputs, and of the rows against the row file (heads `h0 + j * hs`). */
static int both_paths(ple_handle *h, const char *dir, const ple_batch *b, const int64_t *ids, uint64_t seq) {
    ple_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK_STATUS(ple_table_info(h, &info), PLE_OK);
    size_t heads = info.shard_heads, rb = info.row_bytes, bytes = TOKENS * heads * rb;
    CHECK_STATUS(ple_submit(h, b, seq), PLE_OK);
    CHECK_STATUS(ple_submit_ids(h, ids, TOKENS, 0, seq + 1), PLE_OK);
    uint8_t *rows[2];
    float *out[2];
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        const uint8_t *p = NULL;
        uint32_t n = 0;
        CHECK_STATUS(ple_packed_rows(h, seq + (uint64_t)k, &p, &n), PLE_OK);
        CHECK(n == TOKENS);
        rows[k] = malloc(bytes);
        memcpy(rows[k], p, bytes);
        out[k] = malloc(sizeof(float) * TOKENS * 2560);
        CHECK_STATUS(ple_dequant_cpu(h, seq + (uint64_t)k, out[k], PLE_DTYPE_F32, 2560, 0), PLE_OK);
    }
    bad += memcmp(rows[0], rows[1], bytes) != 0;
    bad += memcmp(out[0], out[1], sizeof(float) * TOKENS * 2560) != 0;
    uint8_t want[320];
    for (size_t t = 0; t < TOKENS; t++)
        for (size_t j = 0; j < heads; j++) {
            size_t hd = info.shard_first_head + j * info.shard_head_stride;
            read_row(dir, ids[t * 16 + hd], (uint32_t)rb, want);
            bad += memcmp(rows[1] + (t * heads + j) * rb, want, rb) != 0;
        }
    for (int k = 0; k < 2; k++) {
        free(rows[k]);
        free(out[k]);
    }
    CHECK(bad == 0);
    return bad;
}

int main(void) {
    char tmpl[] = "/tmp/ple-submit-ids-XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (dir == NULL || make_table(dir, "--base 2000 --shards 8 --seed 23") != 0) {
        fprintf(stderr, "could not generate the table\n");
        return 1;
    }
    ple_options o;
    ple_options_default(&o);
    o.num_threads = 2;
    o.max_tokens_per_step = 64;
    o.cache_bytes = 1 << 20;
    ple_handle *h = NULL, *s = NULL;
    CHECK_STATUS(ple_open(dir, &o, &h), PLE_OK);
    o.shard_count = 4;
    o.shard_index = 3;
    CHECK_STATUS(ple_open(dir, &o, &s), PLE_OK);
    if (h == NULL || s == NULL) return check_done("test_submit_ids");

    int32_t toks[TOKENS], pos[TOKENS], ctx[4] = {11, 2024, 7, 248044};
    for (int i = 0; i < TOKENS; i++) {
        toks[i] = (int32_t)((i * 7919 + 3) % 248320);
        pos[i] = 5 + i;
    }
    uint64_t rids[2] = {1, 2};
    uint32_t qs[3] = {0, 25, TOKENS};
    ple_batch b = {toks, pos, TOKENS, rids, qs, 2, ctx};
    int64_t ids[16 * TOKENS];
    CHECK_STATUS(ple_ngram_ids(h, &b, ids), PLE_OK);
    both_paths(h, dir, &b, ids, 1);
    both_paths(s, dir, &b, ids, 1);

    /* read ahead by ids, then the step's rows are cache hits */
    ple_counters c0, c1;
    memset(&c0, 0, sizeof c0);
    c0.struct_size = sizeof c0;
    c1 = c0;
    CHECK_STATUS(ple_prefetch_ahead_ids(h, ids, TOKENS), PLE_OK);
    CHECK_STATUS(ple_stats(h, &c0), PLE_OK);

    /* bad ids: a head's id one past its rows, a negative id; bad flags; no tokens; NULL */
    int64_t bad[16 * TOKENS];
    memcpy(bad, ids, sizeof bad);
    bad[3 * 16 + 9] = -5;
    CHECK_STATUS(ple_submit_ids(h, bad, TOKENS, 0, 3), PLE_E_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("ids[3][9] = -5 (token 3, head 9)");
    CHECK_STATUS(ple_prefetch_ahead_ids(h, bad, TOKENS), PLE_E_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("ids[3][9] = -5");
    CHECK_STATUS(ple_submit_ids(h, ids, TOKENS, 2, 3), PLE_E_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("PLE_IDS_PREFILL");
    CHECK_STATUS(ple_submit_ids(h, ids, 0, 0, 3), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_submit_ids(h, NULL, TOKENS, 0, 3), PLE_E_INVALID_ARGUMENT);
    int64_t *many = malloc(sizeof(int64_t) * 16 * 65); /* 65 tokens > max_tokens_per_step */
    for (int t = 0; t < 65; t++) memcpy(many + t * 16, ids, sizeof(int64_t) * 16);
    CHECK_STATUS(ple_submit_ids(h, many, 65, 0, 3), PLE_E_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("max_tokens_per_step");
    free(many);
    CHECK_STATUS(ple_submit_ids(NULL, ids, TOKENS, 0, 3), PLE_E_INVALID_ARGUMENT);
    /* none of them took seq 3 or read a row */
    CHECK_STATUS(ple_stats(h, &c1), PLE_OK);
    CHECK(c1.prefill_rows + c1.decode_rows == c0.prefill_rows + c0.decode_rows);
    CHECK_STATUS(ple_submit_ids(h, ids, TOKENS, PLE_IDS_PREFILL, 3), PLE_OK);
    CHECK_STATUS(ple_wait(h, 3, UINT64_MAX), PLE_OK);
    CHECK_STATUS(ple_release_step(h, 3), PLE_OK);
    CHECK_STATUS(ple_stats(h, &c1), PLE_OK);
    CHECK(c1.prefill_rows - c0.prefill_rows == 16 * TOKENS);

    ple_close(s);
    ple_close(h);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return check_done("test_submit_ids");
}

/* F32 rows through the C API: a `ple synth-table --format f32` table reports PLE_FORMAT_F32 and
 * 640-byte rows, a step's packed rows are the row file's rows at the ids, and ple_dequant_cpu
 * gives the stored values unchanged in f32 and rounded to nearest even in bf16 (a plain scalar
 * rounding here, independent of libple). */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "table_util.h"

#define N 40

/* f32 -> bf16 bits, round to nearest even (the generated values are finite). */
static uint16_t bf16_rne(uint32_t b) { return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16); }

static void submit(ple_handle *h, uint64_t seq, int32_t *toks, int32_t *pos, int64_t *ids) {
    uint64_t rid = seq; /* a fresh request each step: the same tokens hash to the same ids */
    uint32_t qs[2] = {0, N};
    ple_batch b = {toks, pos, N, &rid, qs, 1, NULL};
    CHECK_STATUS(ple_ngram_ids(h, &b, ids), PLE_OK);
    CHECK_STATUS(ple_submit(h, &b, seq), PLE_OK);
}

int main(void) {
    char tmpl[] = "/tmp/ple-f32-XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (dir == NULL || make_table(dir, "--format f32 --base 2000 --shards 4 --seed 21") != 0) {
        fprintf(stderr, "could not generate the table\n");
        return 1;
    }
    ple_options o;
    ple_options_default(&o);
    o.num_threads = 2;
    ple_handle *h = NULL;
    CHECK_STATUS(ple_open(dir, &o, &h), PLE_OK);
    if (h == NULL) return check_done("test_f32");
    ple_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK_STATUS(ple_table_info(h, &info), PLE_OK);
    CHECK(info.format == PLE_FORMAT_F32);
    CHECK(info.row_bytes == 640);
    CHECK(info.global_scale == 1.0f);
    CHECK(info.file_size == info.total_rows * 640ull);

    int32_t toks[N], pos[N];
    for (int i = 0; i < N; i++) {
        toks[i] = (i % 13 == 5) ? info.eos_token_id : (int32_t)((i * 7919 + 3) % (int32_t)info.vocab_size);
        pos[i] = i;
    }
    static int64_t ids[16 * N];
    static uint8_t want[N * 16 * 640];
    static uint32_t out32[N * 2560];
    static uint16_t out16[N * 2560];

    /* step 1: packed rows and f32 out */
    submit(h, 1, toks, pos, ids);
    for (int k = 0; k < 16 * N; k++) CHECK(read_row(dir, ids[k], 640, want + (size_t)k * 640) == 0);
    const uint8_t *rows = NULL;
    uint32_t n = 0;
    CHECK_STATUS(ple_packed_rows(h, 1, &rows, &n), PLE_OK);
    CHECK(n == N && rows != NULL && memcmp(rows, want, sizeof want) == 0);
    CHECK_STATUS(ple_dequant_cpu(h, 1, out32, PLE_DTYPE_F32, 2560, 0), PLE_OK);
    size_t bad = 0;
    for (size_t e = 0; e < (size_t)N * 2560; e++) {
        uint32_t v;
        memcpy(&v, want + e * 4, 4); /* little-endian host */
        bad += out32[e] != v;
    }
    CHECK(bad == 0);

    /* step 2: bf16 out, one round to nearest even of each stored value */
    submit(h, 2, toks, pos, ids);
    CHECK_STATUS(ple_dequant_cpu(h, 2, out16, PLE_DTYPE_BF16, 2560, 0), PLE_OK);
    size_t rounded = 0;
    bad = 0;
    for (size_t e = 0; e < (size_t)N * 2560; e++) {
        uint32_t v;
        memcpy(&v, want + e * 4, 4);
        bad += out16[e] != bf16_rne(v);
        rounded += (v & 0xFFFFu) != 0; /* the value was not a bf16 already */
    }
    CHECK(bad == 0);
    CHECK(rounded > (size_t)N * 2560 / 2);

    ple_close(h);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return check_done("test_f32");
}

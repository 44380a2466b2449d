/* Row ids through the C API on a table with the real model's shape and hash parameters (a sparse
 * row file): the hash test vector of docs/FORMAT.md, stateless and tracked modes, table facts, batch errors, and
 * closing a real handle twice. */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "table_util.h"

static const int64_t SPEC_VECTOR[16] = {16410909,  39682429,  55103279,  60931720,  87006904,  116506179,
                                        131512017, 152932897, 169641436, 182022480, 209277433, 237891023,
                                        256841529, 277007269, 290665954, 300984276};

int main(void) {
    char tmpl[] = "/tmp/ple-ids-XXXXXX";
    char *dir = mkdtemp(tmpl);
    CHECK(dir != NULL);
    if (dir == NULL || make_table(dir, "--full-sparse") != 0) {
        fprintf(stderr, "could not generate the table\n");
        return 1;
    }
    ple_handle *h = NULL;
    CHECK_STATUS(ple_open(dir, NULL, &h), PLE_OK);
    if (h == NULL) return check_done("test_ids");

    ple_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK_STATUS(ple_table_info(h, &info), PLE_OK);
    CHECK(info.format == PLE_FORMAT_NVFP4);
    CHECK(info.row_bytes == 90);
    CHECK(info.total_rows == 320001536ull);
    CHECK(info.addressed_rows == 320001446ull);
    CHECK(info.file_size == 28800138240ull);
    CHECK(info.num_heads == 16 && info.head_dim == 160 && info.ngram_size == 3);
    /* the model's vocabulary and EOS id, as its config states them */
    CHECK(info.vocab_size == 248320 && info.eos_token_id == 248044);
    const int32_t eos = info.eos_token_id;

    /* The first token of a sequence: stateless with context (EOS, EOS), and tracked at position 0. */
    int32_t tok = 9707, pos = 0, ctx[2] = {eos, eos};
    uint64_t rid = 42;
    uint32_t qs[2] = {0, 1};
    int64_t ids[16];
    ple_batch b = {&tok, &pos, 1, &rid, qs, 1, ctx};
    CHECK_STATUS(ple_ngram_ids(h, &b, ids), PLE_OK);
    CHECK(memcmp(ids, SPEC_VECTOR, sizeof ids) == 0);
    b.context = NULL;
    memset(ids, 0, sizeof ids);
    CHECK_STATUS(ple_ngram_ids(h, &b, ids), PLE_OK);
    CHECK(memcmp(ids, SPEC_VECTOR, sizeof ids) == 0);

    /* Errors, never guesses. */
    int32_t bad_tok = (int32_t)info.vocab_size;
    ple_batch e = {&bad_tok, &pos, 1, &rid, qs, 1, NULL};
    CHECK_STATUS(ple_ngram_ids(h, &e, ids), PLE_E_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("248320");
    int32_t late = 5;
    ple_batch m = {&tok, &late, 1, &rid, qs, 1, NULL};
    CHECK_STATUS(ple_ngram_ids(h, &m, ids), PLE_E_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("context");
    uint32_t bad_qs[2] = {0, 2};
    ple_batch t = {&tok, &pos, 1, &rid, bad_qs, 1, NULL};
    CHECK_STATUS(ple_ngram_ids(h, &t, ids), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_ngram_ids(h, NULL, ids), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_ngram_ids(h, &b, NULL), PLE_E_INVALID_ARGUMENT);

    /* A step never submitted. */
    CHECK_STATUS(ple_wait(h, 7, 1000), PLE_E_STATE);

    /* Closing twice is a no-op the second time; the closed handle is refused, not dereferenced. */
    ple_close(h);
    ple_close(h);
    CHECK_STATUS(ple_ngram_ids(h, &b, ids), PLE_E_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("not open");

    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return check_done("test_ids");
}

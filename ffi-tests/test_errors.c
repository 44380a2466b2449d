/* Every error path reachable without a table: NULL arguments, bad options sizes, missing or empty
 * table directories, closed handles, last-error text (thread-local, cleared by a successful call). */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static void *other_thread(void *arg) {
    (void)arg;
    /* A fresh thread has no error text, whatever the main thread did. */
    const char *m = ple_last_error_message();
    return (void *)(m != NULL && m[0] == '\0' ? (void *)1 : (void *)0);
}

static int log_calls = 0;
static void on_log(ple_log_level level, const char *msg, void *user) {
    (void)level;
    (void)msg;
    (*(int *)user)++;
}

int main(void) {
    ple_options opts;
    ple_handle *h = (ple_handle *)0x1;

    /* defaults */
    CHECK_STATUS(ple_options_default(NULL), PLE_E_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("options is NULL");
    CHECK_STATUS(ple_options_default(&opts), PLE_OK);
    CHECK(opts.struct_size == sizeof(ple_options));
    CHECK(opts.max_in_flight == 2);
    CHECK(opts.cuda_device == -1);
    CHECK(opts.wait_timeout_us == 300000000ull);
    CHECK(ple_last_error_message()[0] == '\0'); /* success clears the text */
    CHECK(opts.ahead_max_rows == 0); /* read-ahead queue: sized to the row cache */

    /* read-ahead: a NULL or stale handle is a status, never a crash */
    CHECK_STATUS(ple_prefetch_ahead(NULL, NULL), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_prefetch_ahead(h, NULL), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_prefetch_ahead_tokens(NULL, NULL), PLE_E_INVALID_ARGUMENT);

    /* ple_open argument checks */
    CHECK_STATUS(ple_open(NULL, &opts, &h), PLE_E_INVALID_ARGUMENT);
    CHECK(h == NULL); /* out-handle is cleared on failure */
    CHECK_ERROR_MENTIONS("table_dir is NULL");
    CHECK_STATUS(ple_open("/tmp", &opts, NULL), PLE_E_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("out_handle is NULL");
    CHECK_STATUS(ple_open("", &opts, &h), PLE_E_INVALID_ARGUMENT);

    /* bad options size */
    ple_options bad = opts;
    bad.struct_size = 3;
    CHECK_STATUS(ple_open("/tmp", &bad, &h), PLE_E_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("struct_size");
    bad.struct_size = sizeof(ple_options) + 64;
    CHECK_STATUS(ple_open("/tmp", &bad, &h), PLE_E_INVALID_ARGUMENT);
    bad = opts;
    bad.max_in_flight = 0;
    CHECK_STATUS(ple_open("/tmp", &bad, &h), PLE_E_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("max_in_flight");
    bad = opts;
    bad.prefetch_policy = 7;
    CHECK_STATUS(ple_open("/tmp", &bad, &h), PLE_E_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("prefetch_policy");

    /* missing directory: I/O error; directory without a table: format error */
    CHECK_STATUS(ple_open("/nonexistent/ple-table", NULL, &h), PLE_E_IO);
    CHECK_ERROR_MENTIONS("/nonexistent/ple-table");
    char tmpl[] = "/tmp/ple-ffi-XXXXXX";
    char *dir = mkdtemp(tmpl);
    CHECK(dir != NULL);
    CHECK_STATUS(ple_open(dir, &opts, &h), PLE_E_FORMAT);
    CHECK_ERROR_MENTIONS("no packed table");
    CHECK(h == NULL);
    rmdir(dir);

    /* the error text is per thread */
    pthread_t t;
    void *fresh = NULL;
    CHECK(pthread_create(&t, NULL, other_thread, NULL) == 0);
    CHECK(pthread_join(t, &fresh) == 0);
    CHECK(fresh == (void *)1);
    CHECK(ple_last_error_message()[0] != '\0'); /* ours is still there */

    /* NULL and unknown handles on every handle call */
    ple_handle *bogus = (ple_handle *)&opts;
    ple_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    ple_counters stats;
    memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    int32_t tok = 1, pos = 0;
    uint64_t rid = 1;
    uint32_t qs[2] = {0, 1};
    ple_batch b = {&tok, &pos, 1, &rid, qs, 1, NULL};
    int64_t ids[16];
    float out[2560]; /* refused before use: any size */
    const uint8_t *rows = NULL;
    uint32_t ntok = 0;
    CHECK_STATUS(ple_table_info(NULL, &info), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_table_info(bogus, &info), PLE_E_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("not open");
    CHECK_STATUS(ple_stats(NULL, &stats), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_submit(NULL, &b, 1), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_submit(bogus, &b, 1), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_wait(NULL, 1, 0), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_packed_rows(NULL, 1, &rows, &ntok), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_release_step(NULL, 1), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_dequant_cpu(NULL, 1, out, PLE_DTYPE_F32, 2560, 0), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_dequant_fuse(NULL, NULL, 1, out, PLE_DTYPE_F32, 2560, 0), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_ngram_ids(NULL, &b, ids), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_release_request(NULL, 1), PLE_E_INVALID_ARGUMENT);

    /* closing NULL or a pointer that is not an open handle is a no-op, twice */
    ple_close(NULL);
    ple_close(NULL);
    ple_close(bogus);
    ple_close(bogus);

    /* packing argument checks */
    ple_pack_options po;
    CHECK_STATUS(ple_pack_options_default(NULL), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_pack_options_default(&po), PLE_OK);
    CHECK(po.struct_size == sizeof po && po.force == 0);
    CHECK_STATUS(ple_pack(NULL, "/tmp/x", &po, NULL, NULL), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_pack("/tmp/x", NULL, &po, NULL, NULL), PLE_E_INVALID_ARGUMENT);
    po.struct_size = 1;
    CHECK_STATUS(ple_pack("/tmp/x", "/tmp/y", &po, NULL, NULL), PLE_E_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("struct_size");

    /* log callback: set, bad level, remove */
    CHECK_STATUS(ple_set_log_callback(on_log, 9, &log_calls), PLE_E_INVALID_ARGUMENT);
    CHECK_STATUS(ple_set_log_callback(on_log, 5, &log_calls), PLE_OK);
    ple_close(bogus); /* logs a message about the unknown handle, delivered on libple's log thread */
    CHECK_STATUS(ple_set_log_callback(NULL, 1, NULL), PLE_OK);
    /* removing the callback first delivered the messages logged before */
    CHECK(log_calls >= 1);
    int before = log_calls;
    ple_close(bogus);
    CHECK(log_calls == before);

    return check_done("test_errors");
}

/* I/O modes through the C API on a small generated NVFP4 table on the disk: MMAP, DIRECT with
 * the AUTO row cache, DIRECT without a cache and DIRECT forced onto the pread pool give the rows
 * of the file for the same steps; ple_info reports each handle's mode, backend and cache; the
 * counters add up; DIRECT on tmpfs is PLE_E_UNSUPPORTED (AUTO falls back to MMAP); and after the
 * row file is truncated under the open handles, a step on a lost row fails with PLE_E_IO while
 * steps on rows that still exist succeed, in every mode. */
#define _POSIX_C_SOURCE 200809L
#include <sys/stat.h>
#include "check.h"
#include "table_util.h"

#define STEPS 6
#define TOKS 24 /* single-token requests per step (stateless: each with its own context) */
enum { MMAP, DIRECT_CACHED, DIRECT_BARE, DIRECT_PREAD, NHANDLES };
static const char *NAMES[NHANDLES] = {"mmap", "direct+cache", "direct", "direct/pread"};

typedef struct {
    int32_t tok[TOKS], pos[TOKS], ctx[2 * TOKS];
    uint64_t rid[TOKS];
    uint32_t qs[TOKS + 1];
    ple_batch b;
} step_t;

/* `n` single-token requests; token i of draw `k` from a fixed sequence. */
static void make_step(step_t *s, uint32_t n, uint64_t k, int32_t vocab) {
    for (uint32_t i = 0; i < n; i++) {
        uint64_t x = (k * 1000003u + i * 7919u + 17u) * 2654435761u;
        s->tok[i] = (int32_t)(x % (uint64_t)vocab);
        s->ctx[2 * i] = (int32_t)((x >> 20) % (uint64_t)vocab);
        s->ctx[2 * i + 1] = (int32_t)((x >> 40) % (uint64_t)vocab);
        s->pos[i] = 2;
        s->rid[i] = i + 1;
        s->qs[i] = i;
    }
    s->qs[n] = n;
    ple_batch b = {s->tok, s->pos, n, s->rid, s->qs, n, s->ctx};
    s->b = b;
}

static ple_handle *open_mode(const char *dir, ple_io_mode mode, uint64_t cache, ple_status want) {
    ple_options o;
    ple_options_default(&o);
    o.num_threads = 2;
    o.io_mode = mode;
    if (cache != PLE_CACHE_AUTO) o.cache_bytes = cache;
    ple_handle *h = NULL;
    CHECK_STATUS(ple_open(dir, &o, &h), want);
    return h;
}

static ple_info info_of(ple_handle *h) {
    ple_info i;
    memset(&i, 0, sizeof i);
    i.struct_size = sizeof i;
    CHECK_STATUS(ple_table_info(h, &i), PLE_OK);
    return i;
}

/* Submits `s` as `seq` on `h`; returns the wait's status. On PLE_OK, `rows` gets a copy of the
 * packed rows; the step is released either way. */
static ple_status run_step(ple_handle *h, uint64_t seq, const step_t *s, uint8_t *rows) {
    CHECK_STATUS(ple_submit(h, &s->b, seq), PLE_OK);
    ple_status st = ple_wait(h, seq, 20 * 1000 * 1000);
    if (st == PLE_OK && rows != NULL) {
        const uint8_t *p = NULL;
        uint32_t n = 0;
        CHECK_STATUS(ple_packed_rows(h, seq, &p, &n), PLE_OK);
        CHECK(n == s->b.num_tokens);
        if (p != NULL) memcpy(rows, p, (size_t)n * 16 * 90);
    }
    ple_release_step(h, seq);
    return st;
}

/* Every row of `rows` (for the ids `ids`) equals the file's. */
static int rows_match_file(const char *dir, const int64_t *ids, uint32_t n, const uint8_t *rows) {
    uint8_t want[90];
    int bad = 0;
    for (uint32_t r = 0; r < n * 16; r++)
        if (read_row(dir, ids[r], 90, want) != 0 || memcmp(rows + (size_t)r * 90, want, 90) != 0)
            bad++;
    return bad;
}

/* A one-token step whose 16 rows all lie below `limit` (want_below) or one of which does not. */
static int find_token(ple_handle *h, int32_t vocab, uint64_t limit, int want_below, step_t *s) {
    int64_t ids[16];
    for (uint64_t k = 1; k < 200000; k++) {
        make_step(s, 1, k * 31, vocab);
        if (ple_ngram_ids(h, &s->b, ids) != PLE_OK) return -1;
        int below = 1;
        for (int i = 0; i < 16; i++) below &= (uint64_t)ids[i] < limit;
        if (below == want_below) return 0;
    }
    return -1;
}

static void tmpfs_checks(void) {
    struct stat sb;
    if (stat("/dev/shm", &sb) != 0) return;
    char tmpl[] = "/dev/shm/ple-io-XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (dir == NULL || make_table(dir, "--base 500 --shards 4 --seed 3") != 0) return;
    ple_handle *h = open_mode(dir, PLE_IO_DIRECT, PLE_CACHE_AUTO, PLE_E_UNSUPPORTED);
    CHECK(h == NULL);
    CHECK_ERROR_MENTIONS("direct I/O");
    h = open_mode(dir, PLE_IO_AUTO, PLE_CACHE_AUTO, PLE_OK);
    if (h != NULL) {
        ple_info i = info_of(h);
        CHECK(i.io_mode == PLE_IO_MMAP && i.io_backend == PLE_IO_BACKEND_MMAP);
        CHECK(i.cache_bytes == 0);
        ple_close(h);
    }
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

int main(void) {
    /* in the working directory (the build tree, on the disk): /tmp may be tmpfs */
    char tmpl[] = "ple-io-XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (dir == NULL || make_table(dir, "--base 2000 --shards 8 --seed 5") != 0) {
        fprintf(stderr, "could not generate the table\n");
        return 1;
    }
    ple_handle *h[NHANDLES] = {NULL};
    h[MMAP] = open_mode(dir, PLE_IO_MMAP, PLE_CACHE_AUTO, PLE_OK);
    ple_options probe;
    ple_options_default(&probe);
    CHECK(probe.cache_bytes == PLE_CACHE_AUTO && probe.io_mode == PLE_IO_AUTO);
    ple_handle *d = NULL;
    probe.io_mode = PLE_IO_DIRECT;
    if (ple_open(dir, &probe, &d) == PLE_E_UNSUPPORTED) {
        fprintf(stderr, "test_io: no direct I/O in the working directory (%s): MMAP only\n",
                ple_last_error_message());
    } else {
        h[DIRECT_CACHED] = d;
        h[DIRECT_BARE] = open_mode(dir, PLE_IO_DIRECT, 0, PLE_OK);
        setenv("PLE_IO_FORCE_PREAD", "1", 1);
        h[DIRECT_PREAD] = open_mode(dir, PLE_IO_DIRECT, 0, PLE_OK);
        unsetenv("PLE_IO_FORCE_PREAD");
    }
    if (h[MMAP] == NULL) return check_done("test_io");
    ple_info im = info_of(h[MMAP]);
    int32_t vocab = (int32_t)im.vocab_size;
    CHECK(im.io_mode == PLE_IO_MMAP && im.io_backend == PLE_IO_BACKEND_MMAP && im.cache_bytes == 0);
    if (h[DIRECT_CACHED] != NULL) {
        ple_info i = info_of(h[DIRECT_CACHED]);
        CHECK(i.io_mode == PLE_IO_DIRECT);
        CHECK(i.io_backend == PLE_IO_BACKEND_IO_URING || i.io_backend == PLE_IO_BACKEND_PREAD_POOL);
        CHECK(i.cache_bytes > 0 && i.cache_bytes <= 256ull << 20); /* AUTO: 256 MiB at most */
        i = info_of(h[DIRECT_BARE]);
        CHECK(i.io_mode == PLE_IO_DIRECT && i.cache_bytes == 0);
        i = info_of(h[DIRECT_PREAD]);
        CHECK(i.io_mode == PLE_IO_DIRECT && i.io_backend == PLE_IO_BACKEND_PREAD_POOL);
    }

    /* the same steps on every handle, twice (the second round comes from the row cache) */
    static step_t s;
    static int64_t ids[16 * TOKS];
    static uint8_t rows[NHANDLES][16 * TOKS * 90];
    uint64_t seq = 0;
    for (int round = 0; round < 2; round++)
        for (uint64_t k = 0; k < STEPS; k++) {
            uint32_t n = k == 0 ? 1 : (uint32_t)(k * 4);
            make_step(&s, n, k, vocab);
            CHECK_STATUS(ple_ngram_ids(h[MMAP], &s.b, ids), PLE_OK);
            seq++;
            for (int m = 0; m < NHANDLES; m++) {
                if (h[m] == NULL) continue;
                CHECK_STATUS(run_step(h[m], seq, &s, rows[m]), PLE_OK);
                int bad = rows_match_file(dir, ids, n, rows[m]);
                if (bad) fprintf(stderr, "%s: step %llu: %d rows differ from the file\n", NAMES[m],
                                 (unsigned long long)seq, bad);
                CHECK(bad == 0);
            }
        }
    if (h[DIRECT_CACHED] != NULL) {
        ple_counters c;
        memset(&c, 0, sizeof c);
        c.struct_size = sizeof c;
        CHECK_STATUS(ple_stats(h[DIRECT_CACHED], &c), PLE_OK);
        uint64_t rows_gathered = c.prefill_rows + c.decode_rows;
        CHECK(c.cache_hits + c.cache_misses == rows_gathered);
        CHECK(c.cache_hits * 2 >= rows_gathered); /* the second round */
        CHECK(c.cache_bytes_used > 0 && c.cache_bytes_used <= info_of(h[DIRECT_CACHED]).cache_bytes);
        CHECK(c.storage_reads > 0 && c.storage_reads <= c.cache_misses);
        memset(&c, 0, sizeof c);
        c.struct_size = sizeof c;
        CHECK_STATUS(ple_stats(h[DIRECT_BARE], &c), PLE_OK);
        CHECK(c.cache_hits == 0 && c.storage_reads > 0);
        /* each read is whole 512-byte (or larger) blocks; a row needs at most two */
        CHECK(c.storage_read_bytes % 512 == 0);
        CHECK(c.storage_read_bytes <= (c.prefill_rows + c.decode_rows) * 2 * 4096);
    }

    /* truncate the row file by its last 2.5% of rows under the open handles (the last head's
     * rows fill the last sixteenth: a token keeps all 16 rows about half the time) */
    uint64_t keep = im.total_rows - im.total_rows / 40;
    char path[4200];
    snprintf(path, sizeof path, "%s/table.rows", dir);
    step_t good, bad;
    CHECK(find_token(h[MMAP], vocab, keep, 1, &good) == 0);
    CHECK(find_token(h[MMAP], vocab, keep, 0, &bad) == 0);
    CHECK(truncate(path, (off_t)(keep * 90)) == 0);
    for (int m = 0; m < NHANDLES; m++) {
        if (h[m] == NULL || m == DIRECT_CACHED) continue; /* (cached rows may still be served) */
        seq++;
        ple_status st = run_step(h[m], seq, &bad, NULL);
        if (st != PLE_E_IO) fprintf(stderr, "%s: a lost row gave %s\n", NAMES[m], ple_status_name(st));
        CHECK(st == PLE_E_IO);
        seq++;
        uint8_t got[16 * 90];
        int64_t gids[16];
        CHECK_STATUS(ple_ngram_ids(h[m], &good.b, gids), PLE_OK);
        CHECK_STATUS(run_step(h[m], seq, &good, got), PLE_OK);
        CHECK(rows_match_file(dir, gids, 1, got) == 0);
    }
    for (int m = 0; m < NHANDLES; m++)
        if (h[m] != NULL) ple_close(h[m]);

    tmpfs_checks();
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return check_done("test_io");
}

/*
 * libple soak test (not in CI; run by scripts/soak.sh): random mixed steps from several threads for
 * a fixed time, with random closes/reopens, short timeouts, releases and bad inputs. Counts steps
 * and statuses by kind, checks every row it reads against the row file (no stale rows), and samples
 * RSS and open fds, which must stay flat.
 *
 *   soak TABLE_DIR SECONDS THREADS
 *
 * Each thread owns one handle (closed and reopened at random) and also drives a handle shared by
 * all threads (submits serialised by a mutex so seqs increase). Request ids are per thread, so the
 * tracked history one thread relies on is never touched by another.
 * Exit status: 0 when no row was wrong, no call returned PLE_E_PANIC, and RSS and fds stayed flat:
 * the last quarter's maxima within PLE_SOAK_MAX_RSS_GROWTH_MB (default 32) and one transient fd per
 * thread of the second quarter's, and every fd given back after the last close.
 */
#define _GNU_SOURCE
#include <ple.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#define MAX_TOK 64
#define NSTATUS 12

static const char *g_dir;
static int g_rows_fd = -1;
static uint32_t g_row_bytes;
static uint32_t g_vocab;
static atomic_int g_stop;
static atomic_ullong g_steps, g_rows_checked, g_bad_rows, g_closes, g_calls;
static atomic_ullong g_status[NSTATUS]; /* index -status: 0 = OK .. 10 = OUT_OF_MEMORY, 11 other */
static ple_handle *g_shared;
static pthread_mutex_t g_shared_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_shared_seq;

static void count(ple_status s) {
    int i = (s <= 0 && s >= -10) ? -s : 11;
    atomic_fetch_add(&g_status[i], 1);
    atomic_fetch_add(&g_calls, 1);
}

static uint64_t rnd(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static ple_handle *open_handle(void) {
    ple_options o;
    ple_options_default(&o);
    o.max_tokens_per_step = MAX_TOK;
    o.max_in_flight = 8;
    o.num_threads = 2;
    o.wait_timeout_us = 5000000; /* 5 s: no call may block longer */
    o.history_window = 16;
    ple_handle *h = NULL;
    ple_status s = ple_open(g_dir, &o, &h);
    count(s);
    if (s != PLE_OK) {
        fprintf(stderr, "soak: ple_open: %s\n", ple_last_error_message());
        return NULL;
    }
    return h;
}

/* One request of a thread: its id and the next position. */
typedef struct {
    uint64_t id;
    int32_t pos;
} req;

/* The rows of step `seq` must be the rows of `ids` in the row file. */
static void check_rows(const ple_handle *h, uint64_t seq, const int64_t *ids, uint32_t n) {
    const uint8_t *rows = NULL;
    uint32_t nt = 0;
    ple_status s = ple_packed_rows(h, seq, &rows, &nt);
    count(s);
    if (s != PLE_OK) return;
    if (nt != n) {
        atomic_fetch_add(&g_bad_rows, 1);
        return;
    }
    uint8_t buf[512];
    for (uint32_t i = 0; i < n * 16; i++) {
        ssize_t r = pread(g_rows_fd, buf, g_row_bytes, (off_t)ids[i] * g_row_bytes);
        if (r != (ssize_t)g_row_bytes || memcmp(buf, rows + (size_t)i * g_row_bytes, g_row_bytes) != 0)
            atomic_fetch_add(&g_bad_rows, 1);
    }
    atomic_fetch_add(&g_rows_checked, (unsigned long long)n * 16);
}

/* Builds a step for request `r` (n tokens, maybe one bad token), submits it on `h` as `seq`, and
 * consumes it one of several ways. `lock` serialises submits on a shared handle. */
static void step(ple_handle *h, req *r, uint64_t *seqp, pthread_mutex_t *lock, uint64_t *rs) {
    int32_t tok[MAX_TOK], posv[MAX_TOK];
    uint32_t qs[2];
    uint32_t n = 1 + (uint32_t)(rnd(rs) % (rnd(rs) % 4 == 0 ? MAX_TOK : 4));
    int bad = rnd(rs) % 50 == 0;
    for (uint32_t i = 0; i < n; i++) {
        tok[i] = (int32_t)(rnd(rs) % g_vocab);
        posv[i] = r->pos + (int32_t)i;
    }
    if (bad) tok[rnd(rs) % n] = (rnd(rs) % 2) ? -1 : (int32_t)g_vocab;
    qs[0] = 0;
    qs[1] = n;
    ple_batch b = {tok, posv, n, &r->id, qs, 1, NULL};
    int64_t ids[MAX_TOK * 16];
    if (lock) pthread_mutex_lock(lock);
    ple_status s = ple_ngram_ids(h, &b, ids);
    count(s);
    uint64_t seq = ++*seqp;
    ple_status sub = ple_submit(h, &b, seq);
    count(sub);
    if (lock) pthread_mutex_unlock(lock);
    if (sub != PLE_OK) {
        if (!bad && sub != PLE_E_TIMEOUT) fprintf(stderr, "soak: submit: %s\n", ple_last_error_message());
        return;
    }
    r->pos += (int32_t)n;
    atomic_fetch_add(&g_steps, 1);
    switch (rnd(rs) % 5) {
    case 0: /* a short wait that may time out, then the real one */
        count(ple_wait(h, seq, 1 + rnd(rs) % 50));
        /* fallthrough */
    case 1:
        count(ple_wait(h, seq, 5000000));
        if (s == PLE_OK) check_rows(h, seq, ids, n);
        count(ple_release_step(h, seq));
        break;
    case 2: { /* dequantise on the CPU */
        static _Thread_local uint16_t out[MAX_TOK * 2560];
        count(ple_dequant_cpu(h, seq, out, PLE_DTYPE_BF16, 2560, 0));
        break;
    }
    case 3: /* release without waiting; a second release is a state error */
        count(ple_release_step(h, seq));
        count(ple_release_step(h, seq));
        break;
    default: /* a wait for a seq never submitted, then consume */
        count(ple_wait(h, seq + 1000000, 1000));
        count(ple_dequant_cpu(h, seq, NULL, PLE_DTYPE_F32, 2560, 0)); /* NULL out: invalid */
        count(ple_release_step(h, seq));
    }
}

static void *worker(void *arg) {
    uint64_t rs = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)(uintptr_t)arg * 0xD1B54A32D192ED03ULL);
    uint64_t base = (uint64_t)(uintptr_t)arg << 32;
    req own[4], shared[4];
    for (int i = 0; i < 4; i++) {
        own[i] = (req){base + (uint64_t)i, 0};
        shared[i] = (req){base + 100 + (uint64_t)i, 0};
    }
    ple_handle *h = open_handle();
    uint64_t seq = 0;
    while (!atomic_load(&g_stop) && h != NULL) {
        uint64_t op = rnd(&rs) % 100;
        if (op < 55) {
            step(h, &own[rnd(&rs) % 4], &seq, NULL, &rs);
        } else if (op < 85) {
            step(g_shared, &shared[rnd(&rs) % 4], &g_shared_seq, &g_shared_mu, &rs);
        } else if (op < 92) { /* forget a request; it restarts at position 0 */
            req *r = &own[rnd(&rs) % 4];
            count(ple_release_request(h, r->id));
            r->pos = 0;
        } else if (op < 95) { /* a missing-context step: position > 0 of a forgotten request */
            int32_t t = 5, p = 7;
            uint32_t qs[2] = {0, 1};
            uint64_t id = base + 999;
            ple_batch b = {&t, &p, 1, &id, qs, 1, NULL};
            ple_status s = ple_submit(h, &b, ++seq);
            count(s);
            if (s == PLE_OK) fprintf(stderr, "soak: missing context accepted\n");
        } else if (op < 97) {
            ple_counters c;
            memset(&c, 0, sizeof c);
            c.struct_size = sizeof c;
            count(ple_stats(h, &c));
        } else { /* close and reopen: the tracked history goes with it */
            ple_close(h);
            ple_close(NULL);
            atomic_fetch_add(&g_closes, 1);
            h = open_handle();
            seq = 0;
            for (int i = 0; i < 4; i++) own[i].pos = 0;
        }
    }
    ple_close(h);
    return NULL;
}

static long rss_kib(void) {
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL) return -1;
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = -1;
    fclose(f);
    return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static int fd_count(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (d == NULL) return -1;
    while (readdir(d) != NULL) n++;
    closedir(d);
    return n - 3; /* ".", ".." and the DIR's own fd */
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: soak TABLE_DIR SECONDS THREADS\n");
        return 2;
    }
    g_dir = argv[1];
    double secs = atof(argv[2]);
    int nthreads = atoi(argv[3]);
    char path[4096];
    snprintf(path, sizeof path, "%s/table.rows", g_dir);
    g_rows_fd = open(path, O_RDONLY);
    int fd_base = fd_count();
    g_shared = open_handle();
    int per_handle = fd_count() - fd_base;
    if (g_rows_fd < 0 || g_shared == NULL || nthreads < 1 || nthreads > 64) return 2;
    ple_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (ple_table_info(g_shared, &info) != PLE_OK) return 2;
    g_row_bytes = info.row_bytes;
    g_vocab = info.vocab_size;

    pthread_t th[64];
    for (int i = 0; i < nthreads; i++) pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)(i + 1));
    double t0 = now_s();
    long rss_q[4] = {0, 0, 0, 0};
    int fd_q[4] = {0, 0, 0, 0};
    while (now_s() - t0 < secs) {
        usleep(200000);
        long r = rss_kib();
        int f = fd_count();
        int q = (int)((now_s() - t0) / secs * 4);
        if (q >= 0 && q < 4 && r > rss_q[q]) rss_q[q] = r;
        if (q >= 0 && q < 4 && f > fd_q[q]) fd_q[q] = f;
    }
    atomic_store(&g_stop, 1);
    for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
    long rss1 = rss_kib();
    ple_close(g_shared);
    int fd_closed = fd_count();

    static const char *names[NSTATUS] = {"OK", "INVALID_ARGUMENT", "IO", "FORMAT", "TIMEOUT", "STATE",
                                         "CUDA_UNAVAILABLE", "CUDA", "UNSUPPORTED", "PANIC",
                                         "OUT_OF_MEMORY", "other"};
    printf("soak: %.0f s, %d threads: %llu steps, %llu calls, %llu handle closes, %llu rows checked, %llu bad rows\n",
           now_s() - t0, nthreads, (unsigned long long)g_steps, (unsigned long long)g_calls,
           (unsigned long long)g_closes, (unsigned long long)g_rows_checked, (unsigned long long)g_bad_rows);
    printf("soak: statuses:");
    for (int i = 0; i < NSTATUS; i++)
        if (g_status[i]) printf(" %s=%llu", names[i], (unsigned long long)g_status[i]);
    printf("\n");
    printf("soak: RSS max per quarter of the run: %ld %ld %ld %ld KiB; %ld KiB with only the shared handle left\n",
           rss_q[0], rss_q[1], rss_q[2], rss_q[3], rss1);
    printf("soak: fds: %d before any handle, %d for one handle at open, max per quarter %d %d %d %d, %d after the "
           "last close\n",
           fd_base, per_handle, fd_q[0], fd_q[1], fd_q[2], fd_q[3], fd_closed);
    /* Flat: the last quarter's maxima are within a margin of the second quarter's (after warm-up:
     * every thread has opened, stepped and closed), and every fd is given back at the end. Each
     * thread may hold one transient fd (a file ple_open reads, a /proc file ple_stats reads). */
    const char *lim = getenv("PLE_SOAK_MAX_RSS_GROWTH_MB");
    long max_growth = (lim ? atol(lim) : 32) * 1024;
    long growth = rss_q[3] - rss_q[1];
    printf("soak: RSS growth, last quarter over second: %ld KiB (limit %ld KiB)\n", growth, max_growth);
    int ok = g_bad_rows == 0 && g_status[9] == 0 && g_status[11] == 0 && growth <= max_growth &&
             fd_q[3] <= fd_q[1] + nthreads && fd_closed == fd_base;
    printf("soak: %s\n", ok ? "PASS" : "FAIL");
    close(g_rows_fd);
    return ok ? 0 : 1;
}

/* Handle lifecycle contracts, from C (and so under ASan/UBSan and valgrind too): handle values are
 * never reused, so a stale second ple_close never closes a later handle; ple_close wakes a
 * ple_submit parked on a full ring (PLE_E_STATE) and returns only after it; ple_wait(.., 0) polls. */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "table_util.h"
#include <pthread.h>
#include <time.h>

#define CYCLES 300

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static ple_status info_status(ple_handle *h) {
    ple_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    return ple_table_info(h, &info);
}

static ple_status submit_one(ple_handle *h, uint64_t seq, uint64_t request) {
    int32_t tok = 7, pos = 0;
    uint32_t qs[2] = {0, 1};
    ple_batch b = {&tok, &pos, 1, &request, qs, 1, NULL};
    return ple_submit(h, &b, seq);
}

struct parked {
    ple_handle *h;
    ple_status status;
    double seconds;
};

static void *parked_submit(void *arg) {
    struct parked *p = arg;
    double t0 = now_s();
    p->status = submit_one(p->h, 2, 2);
    p->seconds = now_s() - t0;
    return NULL;
}

int main(void) {
    char tmpl[] = "/tmp/ple-lifecycle-XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (dir == NULL || make_table(dir, "--base 2000 --shards 8 --seed 11") != 0) {
        fprintf(stderr, "could not generate the table\n");
        return 1;
    }
    ple_options o;
    CHECK_STATUS(ple_options_default(&o), PLE_OK);
    o.max_tokens_per_step = 64;
    o.max_in_flight = 1;
    o.num_threads = 1;

    /* stale handles: every value new, a second close of the previous one harmless */
    static uintptr_t seen[CYCLES];
    ple_handle *prev = NULL;
    for (int i = 0; i < CYCLES; i++) {
        ple_handle *h = NULL;
        CHECK_STATUS(ple_open(dir, &o, &h), PLE_OK);
        if (h == NULL) break;
        for (int j = 0; j < i; j++) CHECK(seen[j] != (uintptr_t)h);
        seen[i] = (uintptr_t)h;
        if (prev != NULL) {
            ple_close(prev);
            CHECK_STATUS(info_status(h), PLE_OK);
            CHECK_STATUS(info_status(prev), PLE_E_INVALID_ARGUMENT);
        }
        ple_close(h);
        prev = h;
    }

    /* close wakes a submit parked on a full ring, whatever its timeout */
    o.wait_timeout_us = UINT64_MAX;
    ple_handle *h = NULL;
    CHECK_STATUS(ple_open(dir, &o, &h), PLE_OK);
    CHECK_STATUS(submit_one(h, 1, 1), PLE_OK);
    CHECK_STATUS(ple_wait(h, 1, 10 * 1000 * 1000), PLE_OK);
    /* timeout 0 polls: the step is done, so PLE_OK at once; an unknown seq is a state error */
    CHECK_STATUS(ple_wait(h, 1, 0), PLE_OK);
    CHECK_STATUS(ple_wait(h, 5, 0), PLE_E_STATE);
    struct parked p = {h, PLE_OK, 0.0};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, parked_submit, &p) == 0);
    struct timespec pause = {0, 500 * 1000 * 1000}; /* lets the submit reach its park */
    nanosleep(&pause, NULL);
    ple_close(h);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_STATUS(p.status, PLE_E_STATE);
    CHECK(p.seconds < 30.0);
    CHECK_STATUS(info_status(h), PLE_E_INVALID_ARGUMENT);

    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return check_done("test_lifecycle");
}

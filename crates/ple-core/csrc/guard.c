/* Row copies from the table's mapping that survive SIGBUS.
 *
 * A read of a mapped page the file no longer backs (the row file truncated under an open handle)
 * or whose read failed on the device raises SIGBUS in the reading thread. ple_guarded_gather
 * copies rows with a per-thread recovery point armed (sigsetjmp); the SIGBUS handler, installed
 * once, jumps back to it when the fault address lies inside the mapping that thread is copying
 * from, and otherwise hands the signal to the handler that was installed before it (or the
 * default action). The copy then reports the row that faulted instead of killing the process.
 *
 * Invariants:
 * - the recovery point (struct guard, on the copying thread's stack) is published through a
 *   thread-local pointer only while armed; the handler runs on the faulting thread, so it sees
 *   only its own thread's guard;
 * - the handler is installed with SA_NODEFER, so SIGBUS is not blocked when siglongjmp leaves
 *   it, and sigsetjmp need not save the signal mask (no system call per copy);
 * - the TLS variable uses the initial-exec model: reading it in a signal handler allocates
 *   nothing.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct guard {
    sigjmp_buf env;
    const char *lo;
    const char *hi;
    const char *volatile fault;
};

static __thread struct guard *volatile tls_guard __attribute__((tls_model("initial-exec")));
static struct sigaction prev_bus;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int install_rc = -1;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    struct guard *g = tls_guard;
    const char *a = (const char *)si->si_addr;
    if (g != NULL && a >= g->lo && a < g->hi) {
        g->fault = a;
        tls_guard = NULL;
        siglongjmp(g->env, 1);
    }
    /* not ours: the previous disposition */
    if (prev_bus.sa_flags & SA_SIGINFO) {
        if (prev_bus.sa_sigaction != NULL) {
            prev_bus.sa_sigaction(sig, si, uc);
            return;
        }
    } else if (prev_bus.sa_handler == SIG_IGN) {
        return;
    } else if (prev_bus.sa_handler != SIG_DFL && prev_bus.sa_handler != NULL) {
        prev_bus.sa_handler(sig);
        return;
    }
    /* default action: returning re-runs the faulting access, which faults again and ends the
     * process as it would have without this handler */
    signal(sig, SIG_DFL);
}

static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    install_rc = sigaction(SIGBUS, &sa, &prev_bus);
}

/* Installs the SIGBUS handler (once per process). Returns 0, or -1 if sigaction failed. */
int ple_guard_install(void) {
    pthread_once(&once, install);
    return install_rc;
}

#define COPY_LOOP(RB)                                                                      \
    for (; *done < n; (*done)++)                                                           \
        memcpy(out + *done * (RB), base + ids[*done] * (RB), (RB));

static void copy_rows(const uint8_t *base, size_t rb, const uint64_t *ids, size_t n, uint8_t *out,
                      volatile size_t *done) {
    switch (rb) {
    case 90: COPY_LOOP(90) break;
    case 160: COPY_LOOP(160) break;
    case 320: COPY_LOOP(320) break;
    default: COPY_LOOP(rb) break;
    }
}

/* Copies rows ids[0..n) of rb bytes from base (a mapping of map_len bytes) to out (row i at
 * out + i * rb). Returns n, or on SIGBUS the index of the row being copied, with the fault's
 * offset into the mapping in *fault_off. The caller checked every id against the mapping. */
size_t ple_guarded_gather(const uint8_t *base, size_t map_len, size_t rb, const uint64_t *ids,
                          size_t n, uint8_t *out, uint64_t *fault_off) {
    struct guard g;
    volatile size_t done = 0;
    g.lo = (const char *)base;
    g.hi = (const char *)base + map_len;
    g.fault = NULL;
    if (sigsetjmp(g.env, 0) != 0) {
        *fault_off = (uint64_t)(g.fault - g.lo);
        return done;
    }
    tls_guard = &g;
    copy_rows(base, rb, ids, n, out, &done);
    tls_guard = NULL;
    return n;
}

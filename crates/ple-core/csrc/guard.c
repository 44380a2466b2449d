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
 *   thread-local pointer only while armed (signal fences keep the compiler from moving the
 *   copy's loads outside the armed window); the handler runs on the faulting thread, so it sees
 *   only its own thread's guard;
 * - only a kernel-generated SIGBUS (si_code > 0) can be ours: a SIGBUS sent by kill, tgkill or
 *   sigqueue (si_code <= 0) has no fault address (its si_addr overlaps si_pid/si_uid) and is
 *   always passed on;
 * - the previous disposition is read (sigaction with a NULL new action) into one of two copies
 *   before the handler is installed, and published by an atomic index only once fully written;
 *   the handler reads the index, then that copy: a SIGBUS on another thread during installation
 *   never sees a half-written disposition (index -1: the default action);
 * - passing a signal on never uninstalls this handler for good: a previous default action is
 *   re-raised for this one delivery (the process ends as it would have); a previous handler is
 *   called with its sa_mask (and SIGBUS, unless it asked SA_NODEFER) blocked; SA_RESETHAND on
 *   it is honoured by giving every later passed-on SIGBUS the default action;
 * - the handler is installed with SA_NODEFER, so SIGBUS is not blocked when siglongjmp leaves
 *   it, and sigsetjmp need not save the signal mask (no system call per copy);
 * - the TLS variable uses the initial-exec model: reading it in a signal handler allocates
 *   nothing.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
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
static struct sigaction prev_copy[2];
static atomic_int prev_idx = -1;
static atomic_int prev_reset = 0;
static atomic_ullong passed_on = 0;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int install_rc = -1;

/* The default action for this one delivery: SIGBUS's default ends the process (with a core). */
static void default_action(int sig) {
    struct sigaction dfl, mine;
    sigset_t set;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, &mine);
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
    /* not reached for SIGBUS; should it be, libple's handler goes back in place */
    sigaction(sig, &mine, NULL);
}

static void pass_on(int sig, siginfo_t *si, void *uc) {
    atomic_fetch_add_explicit(&passed_on, 1, memory_order_relaxed);
    int idx = atomic_load_explicit(&prev_idx, memory_order_acquire);
    if (idx < 0 || atomic_load_explicit(&prev_reset, memory_order_relaxed)) {
        default_action(sig);
        return;
    }
    struct sigaction prev = prev_copy[idx];
    int has_info = (prev.sa_flags & SA_SIGINFO) != 0;
    if (has_info ? prev.sa_sigaction == NULL : prev.sa_handler == SIG_DFL) {
        default_action(sig);
        return;
    }
    if (!has_info && prev.sa_handler == SIG_IGN) {
        /* ignoring a fault would re-run the access forever: the kernel's default instead */
        if (si->si_code > 0)
            default_action(sig);
        return;
    }
    if (prev.sa_flags & SA_RESETHAND)
        atomic_store_explicit(&prev_reset, 1, memory_order_relaxed);
    sigset_t mask = prev.sa_mask, old;
    if (!(prev.sa_flags & SA_NODEFER))
        sigaddset(&mask, sig);
    pthread_sigmask(SIG_BLOCK, &mask, &old);
    if (has_info)
        prev.sa_sigaction(sig, si, uc);
    else
        prev.sa_handler(sig);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    struct guard *g = tls_guard;
    atomic_signal_fence(memory_order_seq_cst);
    if (g != NULL && si != NULL && si->si_code > 0) {
        const char *a = (const char *)si->si_addr;
        if (a >= g->lo && a < g->hi) {
            g->fault = a;
            tls_guard = NULL;
            atomic_signal_fence(memory_order_seq_cst);
            siglongjmp(g->env, 1);
        }
    }
    pass_on(sig, si, uc);
}

static void install(void) {
    struct sigaction sa, before, replaced;
    if (sigaction(SIGBUS, NULL, &before) != 0)
        return;
    prev_copy[0] = before;
    atomic_store_explicit(&prev_idx, 0, memory_order_release);
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    install_rc = sigaction(SIGBUS, &sa, &replaced);
    /* another thread installed a handler in between: chain to that one (copy 1, then publish) */
    if (install_rc == 0 && (replaced.sa_sigaction != before.sa_sigaction ||
                            replaced.sa_flags != before.sa_flags)) {
        prev_copy[1] = replaced;
        atomic_store_explicit(&prev_idx, 1, memory_order_release);
    }
}

/* Installs the SIGBUS handler (once per process). Returns 0, or -1 if sigaction failed. */
int ple_guard_install(void) {
    pthread_once(&once, install);
    return install_rc;
}

/* 1 while the process's SIGBUS disposition is libple's handler, 0 otherwise. */
int ple_guard_in_place(void) {
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) != 0)
        return 0;
    return (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus;
}

/* SIGBUS signals the handler passed on (not a fault inside an armed copy) since the start. */
uint64_t ple_guard_passed_on(void) {
    return atomic_load_explicit(&passed_on, memory_order_relaxed);
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
    atomic_signal_fence(memory_order_seq_cst);
    copy_rows(base, rb, ids, n, out, &done);
    atomic_signal_fence(memory_order_seq_cst);
    tls_guard = NULL;
    return n;
}

/* libple's SIGBUS handler and a host's, in both orders (each case in a child process of its own,
 * so each starts with the default disposition):
 * - host first: a host handler installed before ple_open still gets the SIGBUS of its own
 *   truncated mapping and a kill()-sent SIGBUS, while libple turns the SIGBUS of a step on a
 *   truncated table (MMAP) into PLE_E_IO;
 * - host after: a host handler installed after ple_open that chains to the previous one: the
 *   same three, libple's fault reaching libple through the host's chain;
 * - no host handler: a kill()-sent SIGBUS is not swallowed: the process ends by SIGBUS (the
 *   default action), and libple's handler was still in place before it;
 * - ple_options.sigbus_handler = 0: libple never touches the host's disposition: AUTO opens
 *   DIRECT, steps run (PLE_E_IO on the truncated table, no SIGBUS reaching the host) and the
 *   host's handler is still the process's; MMAP is refused with PLE_E_UNSUPPORTED, other values
 *   with PLE_E_INVALID_ARGUMENT. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "check.h"
#include "table_util.h"

static sigjmp_buf host_env;
static volatile sig_atomic_t host_armed, host_faults, host_sent, host_foreign;
static char *own_lo, *own_hi;
static struct sigaction host_prev;
static int host_chains;

static void host_handler(int sig, siginfo_t *si, void *uc) {
    if (si->si_code <= 0) { /* sent by kill/tgkill/sigqueue: the host's own */
        host_sent++;
        return;
    }
    char *a = (char *)si->si_addr;
    if (host_armed && a >= own_lo && a < own_hi) {
        host_faults++;
        host_armed = 0;
        siglongjmp(host_env, 1);
    }
    host_foreign++;
    if (host_chains && (host_prev.sa_flags & SA_SIGINFO) && host_prev.sa_sigaction != NULL) {
        host_prev.sa_sigaction(sig, si, uc);
        return;
    }
    abort(); /* a SIGBUS neither the host's nor chained: libple let one through */
}

static void install_host(int chain) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = host_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    host_chains = chain;
    CHECK(sigaction(SIGBUS, &sa, &host_prev) == 0);
}

/* The host's own file, mapped, then truncated: touching its second page raises SIGBUS. */
static int host_touches_its_truncated_map(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/own.bin", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && ftruncate(fd, 2 * 4096) == 0);
    char *p = mmap(NULL, 2 * 4096, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(p != MAP_FAILED);
    own_lo = p;
    own_hi = p + 2 * 4096;
    CHECK(ftruncate(fd, 100) == 0);
    int before = host_faults;
    if (sigsetjmp(host_env, 1) == 0) {
        host_armed = 1;
        volatile char c = p[4096 + 10];
        (void)c;
        host_armed = 0;
    }
    munmap(p, 2 * 4096);
    close(fd);
    return host_faults == before + 1;
}

/* A one-token MMAP step on the table in `dir`, whose row file is cut to half its length (every
 * token's rows of the last heads are gone): must fail with PLE_E_IO, not kill the process. */
static int libple_catches_its_own(ple_handle *h, const char *dir) {
    ple_info in;
    memset(&in, 0, sizeof in);
    in.struct_size = sizeof in;
    CHECK_STATUS(ple_table_info(h, &in), PLE_OK);
    char path[4200];
    snprintf(path, sizeof path, "%s/table.rows", dir);
    CHECK(truncate(path, (off_t)(in.total_rows / 2 * 90)) == 0);
    int32_t tok = 7, pos = 2, ctx[2] = {3, 5};
    uint64_t rid = 1;
    uint32_t qs[2] = {0, 1};
    ple_batch b = {&tok, &pos, 1, &rid, qs, 1, ctx};
    int ok = 1;
    for (uint64_t seq = 2; seq <= 5; seq++) {
        tok = (int32_t)(seq * 13 % in.vocab_size);
        CHECK_STATUS(ple_submit(h, &b, seq), PLE_OK);
        ple_status st = ple_wait(h, seq, 20 * 1000 * 1000);
        if (st != PLE_E_IO) {
            fprintf(stderr, "a step on the truncated table gave %s\n", ple_status_name(st));
            ok = 0;
        }
        ple_release_step(h, seq);
    }
    return ok;
}

/* An MMAP handle that never prefetches: every step copies its rows from the mapping (no cold
 * reads past it), and one step has run (libple installs its handler at the first copy). */
static ple_handle *open_mmap(const char *dir) {
    ple_options o;
    ple_options_default(&o);
    o.num_threads = 2;
    o.io_mode = PLE_IO_MMAP;
    o.prefetch_policy = PLE_PREFETCH_NEVER;
    ple_handle *h = NULL;
    CHECK_STATUS(ple_open(dir, &o, &h), PLE_OK);
    if (h == NULL) return NULL;
    int32_t tok = 1, pos = 2, ctx[2] = {3, 5};
    uint64_t rid = 1;
    uint32_t qs[2] = {0, 1};
    ple_batch b = {&tok, &pos, 1, &rid, qs, 1, ctx};
    CHECK_STATUS(ple_submit(h, &b, 1), PLE_OK);
    CHECK_STATUS(ple_wait(h, 1, 20 * 1000 * 1000), PLE_OK);
    ple_release_step(h, 1);
    return h;
}

static int child_host_first(const char *dir) {
    install_host(0);
    ple_handle *h = open_mmap(dir);
    if (h == NULL) return 2;
    CHECK(host_touches_its_truncated_map(dir));
    CHECK(libple_catches_its_own(h, dir));
    CHECK(host_touches_its_truncated_map(dir));
    CHECK(kill(getpid(), SIGBUS) == 0);
    CHECK(host_sent == 1);
    CHECK(host_foreign == 0); /* libple's faults never reached the host */
    ple_close(h);
    return check_failures ? 1 : 0;
}

static int child_host_after(const char *dir) {
    ple_handle *h = open_mmap(dir);
    if (h == NULL) return 2;
    install_host(1);
    CHECK(host_touches_its_truncated_map(dir));
    CHECK(libple_catches_its_own(h, dir));
    CHECK(host_foreign >= 1); /* libple's faults went through the host's chain */
    CHECK(host_touches_its_truncated_map(dir));
    CHECK(kill(getpid(), SIGBUS) == 0);
    CHECK(host_sent == 1);
    ple_close(h);
    return check_failures ? 1 : 0;
}

static int child_no_host(const char *dir) {
    ple_handle *h = open_mmap(dir);
    if (h == NULL) return 2;
    struct sigaction cur;
    CHECK(sigaction(SIGBUS, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO));
    kill(getpid(), SIGBUS); /* the default action: the process ends here */
    fprintf(stderr, "a kill()-sent SIGBUS was swallowed\n");
    return 3;
}

static int child_no_handler(const char *dir) {
    install_host(0); /* aborts on any SIGBUS that is not its own */
    ple_options o;
    ple_options_default(&o);
    CHECK(o.sigbus_handler == 1);
    o.sigbus_handler = 2;
    ple_handle *h = NULL;
    CHECK_STATUS(ple_open(dir, &o, &h), PLE_E_INVALID_ARGUMENT);
    o.sigbus_handler = 0;
    o.io_mode = PLE_IO_MMAP;
    CHECK_STATUS(ple_open(dir, &o, &h), PLE_E_UNSUPPORTED);
    CHECK(strstr(ple_last_error_message(), "sigbus_handler") != NULL);
    o.io_mode = PLE_IO_AUTO;
    o.num_threads = 2;
    CHECK_STATUS(ple_open(dir, &o, &h), PLE_OK);
    if (h == NULL) return 2;
    ple_info in;
    memset(&in, 0, sizeof in);
    in.struct_size = sizeof in;
    CHECK_STATUS(ple_table_info(h, &in), PLE_OK);
    CHECK(in.io_mode == PLE_IO_DIRECT);
    int32_t tok = 1, pos = 2, ctx[2] = {3, 5};
    uint64_t rid = 1;
    uint32_t qs[2] = {0, 1};
    ple_batch b = {&tok, &pos, 1, &rid, qs, 1, ctx};
    CHECK_STATUS(ple_submit(h, &b, 1), PLE_OK);
    CHECK_STATUS(ple_wait(h, 1, 20 * 1000 * 1000), PLE_OK);
    ple_release_step(h, 1);
    CHECK(libple_catches_its_own(h, dir));
    CHECK(host_touches_its_truncated_map(dir));
    CHECK(kill(getpid(), SIGBUS) == 0);
    CHECK(host_sent == 1 && host_foreign == 0);
    struct sigaction cur;
    CHECK(sigaction(SIGBUS, NULL, &cur) == 0 && cur.sa_sigaction == host_handler);
    ple_close(h);
    return check_failures ? 1 : 0;
}

/* Runs `f` in a child on a fresh copy of the table; returns the child's wait status. */
static int in_child(int (*f)(const char *), const char *src) {
    char tmpl[] = "ple-sigbus-XXXXXX";
    char *dir = mkdtemp(tmpl);
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "cp '%s'/* '%s'/", src, dir);
    CHECK(dir != NULL && system(cmd) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* the default disposition (a sanitizer may have installed its own handler) */
        signal(SIGBUS, SIG_DFL);
        _exit(f(dir));
    }
    int ws = 0;
    CHECK(waitpid(pid, &ws, 0) == pid);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return ws;
}

int main(void) {
    char tmpl[] = "ple-sigbus-src-XXXXXX";
    char *src = mkdtemp(tmpl);
    if (src == NULL || make_table(src, "--base 2000 --shards 8 --seed 5") != 0) {
        fprintf(stderr, "could not generate the table\n");
        return 1;
    }
    int ws = in_child(child_host_first, src);
    if (!(WIFEXITED(ws) && WEXITSTATUS(ws) == 0))
        fprintf(stderr, "host handler first: child status %#x\n", ws);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    ws = in_child(child_host_after, src);
    if (!(WIFEXITED(ws) && WEXITSTATUS(ws) == 0))
        fprintf(stderr, "host handler after: child status %#x\n", ws);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    ws = in_child(child_no_host, src);
    if (!(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGBUS))
        fprintf(stderr, "no host handler, kill(SIGBUS): child status %#x\n", ws);
    CHECK(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGBUS);
    ws = in_child(child_no_handler, src);
    if (!(WIFEXITED(ws) && WEXITSTATUS(ws) == 0))
        fprintf(stderr, "sigbus_handler = 0: child status %#x\n", ws);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", src);
    CHECK(system(cmd) == 0);
    return check_done("test_sigbus");
}

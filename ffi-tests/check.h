/* Minimal assertion helpers for libple's C tests. */
#ifndef PLE_FFI_CHECK_H
#define PLE_FFI_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ple.h"

static int check_failures = 0;

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);         \
            check_failures++;                                                                \
        }                                                                                    \
    } while (0)

/* A call must return `want`; on failure prints both statuses and the last error text. */
#define CHECK_STATUS(call, want)                                                             \
    do {                                                                                     \
        ple_status got_ = (call);                                                            \
        if (got_ != (want)) {                                                                \
            fprintf(stderr, "%s:%d: %s returned %s (%d), expected %s: %s\n", __FILE__,       \
                    __LINE__, #call, ple_status_name(got_), (int)got_, ple_status_name(want), \
                    ple_last_error_message());                                               \
            check_failures++;                                                                \
        }                                                                                    \
    } while (0)

/* The last error message must contain `needle`. */
#define CHECK_ERROR_MENTIONS(needle)                                                         \
    do {                                                                                     \
        const char *m_ = ple_last_error_message();                                           \
        if (m_ == NULL || strstr(m_, (needle)) == NULL) {                                    \
            fprintf(stderr, "%s:%d: last error \"%s\" does not mention \"%s\"\n", __FILE__,  \
                    __LINE__, m_ ? m_ : "(null)", (needle));                                 \
            check_failures++;                                                                \
        }                                                                                    \
    } while (0)

static int check_done(const char *name) {
    if (check_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, check_failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}
#endif

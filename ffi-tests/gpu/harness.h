/*
 * What the GPU test programs share: the engine's context and stream, test tables with their rows
 * mapped for the reference, device output buffers and their comparison with the reference.
 */
#ifndef PLE_GPU_HARNESS_H
#define PLE_GPU_HARNESS_H

#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>

#include "common.h"

#define MAX_TOKENS 8192

typedef struct {
    char dir[4096];
    int format, row_bytes;
    float gs;
    const uint8_t *rows; /* mmap of table.rows */
    size_t rows_len;
} table_t;

static CUdevice g_dev;
static CUcontext g_ctx;
static CUstream g_s;
static int g_stream_ops;
static inline void open_table(table_t *t, const char *root, const char *fmt, uint64_t seed) {
    snprintf(t->dir, sizeof t->dir, "%s/%s", root, fmt);
    table_desc td;
    if (write_table(t->dir, fmt, 2003, seed, 0.0123f, &td) != 0) {
        fprintf(stderr, "FATAL: write_table %s\n", t->dir);
        exit(2);
    }
    t->format = !strcmp(fmt, "nvfp4") ? PLE_FORMAT_NVFP4
                : !strcmp(fmt, "fp8")   ? PLE_FORMAT_FP8
                : !strcmp(fmt, "f32")   ? PLE_FORMAT_F32
                                        : PLE_FORMAT_BF16;
    t->row_bytes = td.row_bytes;
    t->gs = td.global_scale;
    char p[4200];
    snprintf(p, sizeof p, "%s/table.rows", t->dir);
    int fd = open(p, O_RDONLY);
    t->rows_len = td.total_rows * (size_t)td.row_bytes;
    t->rows = mmap(NULL, t->rows_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (t->rows == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
}

/* The step's packed rows as the reference sees them: ids from ple_ngram_ids (no side effects),
 * rows read from the table file directly. */
static uint8_t *ref_rows(ple_handle *h, const table_t *t, const ple_batch *b) {
    uint32_t n = b->num_tokens;
    int64_t *ids = calloc((size_t)n * HEADS, sizeof(int64_t));
    uint8_t *rows = calloc((size_t)n * HEADS, (size_t)t->row_bytes);
    PLE_OK_OR_FAIL(ple_ngram_ids(h, b, ids));
    for (size_t i = 0; i < (size_t)n * HEADS; i++) {
        size_t off = (size_t)ids[i] * (size_t)t->row_bytes;
        if (ids[i] < 0 || off + (size_t)t->row_bytes > t->rows_len) {
            CHECK(0, "ngram id %lld outside the table", (long long)ids[i]);
            continue;
        }
        memcpy(rows + i * (size_t)t->row_bytes, t->rows + off, (size_t)t->row_bytes);
    }
    free(ids);
    return rows;
}

/* Device buffer of `tokens` rows at `stride` elements of `dtype`, plus a 256-byte guard. */
typedef struct {
    CUdeviceptr d;
    uint8_t *init, *host;
    size_t bytes;
} outbuf;

static inline void out_alloc(outbuf *o, rng_t *r, uint32_t tokens, size_t stride, int dtype) {
    o->bytes = (size_t)tokens * stride * (size_t)dtype_size(dtype) + 256;
    CU(cuMemAlloc(&o->d, o->bytes));
    o->init = malloc(o->bytes);
    o->host = malloc(o->bytes);
    rng_fill(r, o->init, o->bytes);
    CU(cuMemcpyHtoD(o->d, o->init, o->bytes));
}

static inline void out_fill(outbuf *o, uint8_t byte) {
    memset(o->init, byte, o->bytes);
    CU(cuMemcpyHtoD(o->d, o->init, o->bytes));
}

static inline void out_fetch(outbuf *o) { CU(cuMemcpyDtoH(o->host, o->d, o->bytes)); }

static inline void out_free(outbuf *o) {
    cuMemFree(o->d);
    free(o->init);
    free(o->host);
}

/* Compares `got` with init + reference dequant of `rows`; returns the number of differing
 * elements (padding and guard included: they must be untouched). */
static inline size_t compare_ref(const uint8_t *got, const uint8_t *init, size_t bytes, const table_t *t,
                          const uint8_t *rows, uint32_t n, int dtype, size_t stride, int acc,
                          const char *what) {
    uint8_t *exp = malloc(bytes);
    memcpy(exp, init, bytes);
    if (rows) ref_dequant(t->format, t->gs, rows, n, exp, dtype, stride, acc);
    int es = dtype_size(dtype);
    size_t bad = 0, first = (size_t)-1;
    for (size_t i = 0; i < bytes; i += (size_t)es)
        if (memcmp(got + i, exp + i, (size_t)es) != 0) {
            if (first == (size_t)-1) first = i / (size_t)es;
            bad++;
        }
    if (bad) {
        size_t e = first;
        uint32_t g = 0, x = 0;
        memcpy(&g, got + e * (size_t)es, (size_t)es);
        memcpy(&x, exp + e * (size_t)es, (size_t)es);
        fprintf(stderr,
                "  %s: %zu elements differ; first: element %zu (token %zu, col %zu): got %#x, "
                "expected %#x\n",
                what, bad, e, e / stride, e % stride, g, x);
    }
    free(exp);
    return bad;
}

static inline ple_status fuse(ple_handle *h, uint64_t seq, CUdeviceptr out, int dtype, size_t stride,
                       uint32_t flags) {
    return ple_dequant_fuse(h, (void *)g_s, seq, (void *)(uintptr_t)out, dtype, stride, flags);
}

/* Whether the first `tokens` tokens of `got` (stride elements of dtype apart) are all the
 * canonical NaN of the dtype, and the stride padding and guard are untouched (equal to init). */
static inline int all_nan(const uint8_t *got, const uint8_t *init, size_t bytes, uint32_t tokens, int dtype,
                   size_t stride) {
    int es = dtype_size(dtype);
    uint32_t nan = dtype == PLE_DTYPE_F32 ? 0x7FC00000u : dtype == PLE_DTYPE_F16 ? 0x7E00u : 0x7FC0u;
    for (size_t i = 0; i < bytes / (size_t)es; i++) {
        uint32_t g = 0;
        memcpy(&g, got + i * (size_t)es, (size_t)es);
        int in_tok = i / stride < tokens && i % stride < EMBED;
        if (in_tok ? g != nan : memcmp(got + i * (size_t)es, init + i * (size_t)es, (size_t)es) != 0)
            return 0;
    }
    return 1;
}

/* Writes the JSON of one section, flushed (a program killed later keeps its finished sections),
 * and prints its summary. */
static FILE *g_json;
static int g_sections;
static inline void section_result(const char *name, int fail_before, int pass_before, const char *note) {
    fprintf(g_json, "%s\n    \"%s\": {\"passed\": %d, \"failed\": %d, \"note\": \"%s\"}",
            g_sections++ ? "," : "", name, g_pass - pass_before, g_fail - fail_before,
            note ? note : "");
    fprintf(stderr, "[%s] %d passed, %d failed %s\n", name, g_pass - pass_before,
            g_fail - fail_before, note ? note : "");
    fflush(g_json);
}

/* Device 0's primary context, current on this thread, and the engine's stream g_s. */
static inline void harness_init(void) {
    CU(cuInit(0));
    CU(cuDeviceGet(&g_dev, 0));
    CU(cuDevicePrimaryCtxRetain(&g_ctx, g_dev));
    CU(cuCtxSetCurrent(g_ctx));
    CU(cuStreamCreate(&g_s, CU_STREAM_NON_BLOCKING));
    CU(cuDeviceGetAttribute(&g_stream_ops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, g_dev));
}

#endif

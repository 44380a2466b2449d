/*
 * Shared helpers of the GPU checks (ffi-tests/gpu): a tiny packed-table generator, an independent
 * reference of the dequantisation rule (stated in kernels/ple_kernels.cu), stateless batches,
 * checks and timing. Plain C11, no Rust: the GPU machine has a C compiler and the driver only.
 */
#ifndef PLE_GPU_COMMON_H
#define PLE_GPU_COMMON_H

#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ple.h"

#define VOCAB 248320
#define EOS 248044
#define EMBED 2560
#define HEADS 16

/* ------------------------------------------------------------------------------------------ */
/* checks                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static int g_pass __attribute__((unused)), g_fail __attribute__((unused));

static inline void check_impl(int ok, const char *file, int line, const char *fmt, ...) {
    if (ok) {
        g_pass++;
        return;
    }
    g_fail++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}
#define CHECK(cond, ...) check_impl(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

/* A libple call that must succeed; evaluates to its status. */
#define PLE_OK_OR_FAIL(call)                                                                       \
    ({                                                                                             \
        ple_status s_ = (call);                                                                    \
        CHECK(s_ == PLE_OK, "%s -> %s: %s", #call, ple_status_name(s_), ple_last_error_message()); \
        s_;                                                                                        \
    })

#ifdef CUDA_VERSION
/* A driver call that must succeed; aborts the program otherwise (the harness cannot go on). */
#define CU(call)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            const char *n_ = "?";                                                                  \
            cuGetErrorName(r_, &n_);                                                               \
            fprintf(stderr, "FATAL %s:%d: %s -> %s\n", __FILE__, __LINE__, #call, n_);             \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)
#endif

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------------------------------ */
/* random numbers                                                                              */
/* ------------------------------------------------------------------------------------------ */

static inline uint64_t splitmix64(uint64_t v) {
    v += 0x9E3779B97F4A7C15ull;
    v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
    v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
    return v ^ (v >> 31);
}

typedef struct {
    uint64_t s;
} rng_t;

static inline uint64_t rng_next(rng_t *r) {
    r->s += 0x9E3779B97F4A7C15ull;
    uint64_t z = r->s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline void rng_fill(rng_t *r, void *p, size_t n) {
    uint8_t *b = (uint8_t *)p;
    while (n >= 8) {
        uint64_t v = rng_next(r);
        memcpy(b, &v, 8);
        b += 8;
        n -= 8;
    }
    if (n) {
        uint64_t v = rng_next(r);
        memcpy(b, &v, n);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* the packed-table generator                                                                  */
/* ------------------------------------------------------------------------------------------ */

static inline int is_prime_u64(uint64_t n) {
    if (n < 2) return 0;
    if (n % 2 == 0) return n == 2;
    for (uint64_t d = 3; d * d <= n; d += 2)
        if (n % d == 0) return 0;
    return 1;
}

/* Row bytes of a format name, or 0. */
static inline int row_bytes_of(const char *fmt) {
    if (!strcmp(fmt, "nvfp4")) return 90;
    if (!strcmp(fmt, "fp8")) return 160;
    if (!strcmp(fmt, "bf16")) return 320;
    if (!strcmp(fmt, "f32")) return 640;
    return 0;
}

typedef struct {
    uint64_t total_rows, addressed_rows;
    float global_scale;
    int row_bytes;
} table_desc;

/*
 * Writes a small packed table (the layout of crates/ple-core/src/format/table.rs) into directory `dir`: `table.rows` (random rows, row r at
 * r * row_bytes) and `table.json`. The hash parameters are the model's multipliers (derived here
 * from the model's hash rule and checked against the model's published values) with small head sizes (the 16 primes from
 * `head_base` up), so the table is small but every hashed id is a real row.
 *
 * The metadata follows crates/ple-core/src/format/table.rs (TableMeta); keep the two in step here,
 * and only here.
 */
static inline int write_table(const char *dir, const char *fmt, uint64_t head_base, uint64_t seed,
                       float global_scale, table_desc *out) {
    int rb = row_bytes_of(fmt);
    if (!rb) return -1;
    if (!strcmp(fmt, "bf16") || !strcmp(fmt, "f32")) global_scale = 1.0f;
    /* multipliers: the model's hash rule */
    uint64_t half = (((uint64_t)INT64_MAX) / VOCAB) / 2;
    if (half < 1) half = 1;
    uint64_t base = 1234 + 10007ull * 0;
    uint64_t m[3];
    for (int i = 0; i < 3; i++)
        m[i] = 2 * (splitmix64(base + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)) % half) + 1;
    if (m[0] != 23703573157769ull || m[1] != 20109073645365ull || m[2] != 8052911324071ull) {
        fprintf(stderr, "write_table: multipliers differ from the model's\n");
        return -1;
    }
    uint64_t sizes[HEADS], offsets[HEADS], acc = 0, p = head_base - 1;
    for (int h = 0; h < HEADS; h++) {
        do p++;
        while (!is_prime_u64(p));
        sizes[h] = p;
        offsets[h] = acc;
        acc += p;
    }
    uint64_t addressed = acc, total = (acc + 127) / 128 * 128;

    char path[4096];
    snprintf(path, sizeof path, "%s", dir); /* mkdir -p */
    for (char *q = path + 1;; q++) {
        if (*q == '/' || *q == 0) {
            char c = *q;
            *q = 0;
            if (mkdir(path, 0755) != 0 && errno != EEXIST) {
                perror(path);
                return -1;
            }
            *q = c;
            if (!c) break;
        }
    }
    snprintf(path, sizeof path, "%s/table.rows", dir);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return -1;
    }
    rng_t r = {seed};
    static uint8_t buf[1 << 20];
    uint64_t left = total * (uint64_t)rb;
    while (left) {
        size_t n = left < sizeof buf ? (size_t)left : sizeof buf;
        rng_fill(&r, buf, n);
        if (rb == 640) /* f32: every other value's exponent in 96..159 (2^-31 .. 2^32): values that
                          round, underflow and overflow in f16; the rest any pattern (NaN, inf) */
            for (size_t k = 4; k + 4 <= n; k += 8) {
                uint32_t x;
                memcpy(&x, buf + k, 4);
                x = (x & 0x807FFFFFu) | ((96u + ((x >> 23) & 63u)) << 23);
                memcpy(buf + k, &x, 4);
            }
        if (fwrite(buf, 1, n, f) != n) {
            perror(path);
            fclose(f);
            return -1;
        }
        left -= n;
    }
    if (fclose(f) != 0) return -1;

    snprintf(path, sizeof path, "%s/table.json", dir);
    f = fopen(path, "w");
    if (!f) {
        perror(path);
        return -1;
    }
    fprintf(f, "{\n  \"format_version\": 1,\n  \"row_format\": \"%s\",\n", fmt);
    fprintf(f, "  \"row_bytes\": %d,\n  \"code_bytes\": %d,\n  \"scale_bytes\": %d,\n", rb,
            !strcmp(fmt, "nvfp4") ? 80 : rb, !strcmp(fmt, "nvfp4") ? 10 : 0);
    fprintf(f, "  \"total_rows\": %llu,\n  \"rows_per_shard\": %llu,\n  \"num_shards\": 128,\n",
            (unsigned long long)total, (unsigned long long)(total / 128));
    fprintf(f, "  \"head_dim\": 160,\n  \"num_heads\": 16,\n  \"ngram_size\": 3,\n"
               "  \"heads_per_ngram\": 8,\n");
    /* %.17g of the float's exact double value: parses back to the same float */
    fprintf(f, "  \"global_scale\": %.17g,\n", (double)global_scale);
    fprintf(f, "  \"hash\": {\n    \"multipliers\": [%llu, %llu, %llu],\n", (unsigned long long)m[0],
            (unsigned long long)m[1], (unsigned long long)m[2]);
    fprintf(f, "    \"head_sizes\": [");
    for (int h = 0; h < HEADS; h++)
        fprintf(f, "%s%llu", h ? ", " : "", (unsigned long long)sizes[h]);
    fprintf(f, "],\n    \"offsets\": [");
    for (int h = 0; h < HEADS; h++)
        fprintf(f, "%s%llu", h ? ", " : "", (unsigned long long)offsets[h]);
    fprintf(f, "],\n    \"eos_token_id\": %d,\n    \"vocab_size\": %d,\n    \"ngram_size\": 3,\n"
               "    \"heads_per_ngram\": 8\n  },\n", EOS, VOCAB);
    fprintf(f, "  \"source\": {\"name\": \"ple-gpu-test-%s\", \"fingerprint\": \"gpu-test-%s-%llu\"},\n",
            fmt, fmt, (unsigned long long)seed);
    fprintf(f, "  \"rows_file\": \"table.rows\"\n}\n");
    if (fclose(f) != 0) return -1;
    if (out) {
        out->total_rows = total;
        out->addressed_rows = addressed;
        out->global_scale = global_scale;
        out->row_bytes = rb;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* reference dequantisation (independent of the library: written from the rule, not shared)     */
/* ------------------------------------------------------------------------------------------ */

static inline float ref_e4m3(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if ((b & 0x7F) == 0x7F) return NAN;
    float v = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return s ? -v : v;
}

static inline float ref_e2m1(uint8_t c) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[c & 7];
    return (c & 8) ? -v : v;
}

static inline uint32_t f32_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}

static inline float bits_f32(uint32_t x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* f32 -> f16, round to nearest even, NaN -> 0x7E00. */
static inline uint16_t ref_f16(float f) {
    uint32_t x = f32_bits(f), sign = (x >> 16) & 0x8000, ax = x & 0x7FFFFFFF;
    if (ax > 0x7F800000) return 0x7E00;
    if (ax >= 0x477FF000) return (uint16_t)(sign | 0x7C00); /* >= 65520: inf */
    if (ax < 0x33000000) return (uint16_t)sign;              /* < 2^-25: zero */
    int e = (int)(ax >> 23) - 127;
    uint32_t mant = (ax & 0x7FFFFF) | 0x800000, q, rem, half;
    if (e < -14) { /* subnormal result: units of 2^-24 */
        int shift = -e - 1;
        q = mant >> shift;
        rem = mant & ((1u << shift) - 1);
        half = 1u << (shift - 1);
    } else {
        q = ((uint32_t)(e + 15) << 10) | ((mant >> 13) & 0x3FF);
        rem = mant & 0x1FFF;
        half = 0x1000;
    }
    if (rem > half || (rem == half && (q & 1))) q++;
    return (uint16_t)(sign | q);
}

/* f32 -> bf16, round to nearest even, NaN -> 0x7FC0. */
static inline uint16_t ref_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7FFFFFFF) > 0x7F800000) return 0x7FC0;
    return (uint16_t)((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

static inline float ref_f16_to_f32(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 0x3FF;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                                        : ldexpf((float)(1024 + m), e - 25);
    return s ? -v : v;
}

static inline float ref_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

static inline int dtype_size(int dtype) { return dtype == PLE_DTYPE_F32 ? 4 : 2; }

/*
 * Dequantises `n` tokens of packed rows ([n][16][row_bytes]) into `out` (host memory laid out as
 * the engine's buffer: token t at out + t * stride elements), per the dequantisation rule, accumulating if asked.
 */
static inline void ref_dequant(int format, float gs, const uint8_t *rows, uint32_t n, void *out,
                        int dtype, size_t stride, int accumulate) {
    int rb = format == PLE_FORMAT_NVFP4 ? 90
             : format == PLE_FORMAT_FP8 ? 160
             : format == PLE_FORMAT_F32 ? 640
                                        : 320;
    for (uint32_t t = 0; t < n; t++) {
        for (int e = 0; e < EMBED; e++) {
            const uint8_t *row = rows + ((size_t)t * HEADS + (size_t)(e / 160)) * rb;
            int j = e % 160;
            volatile float v; /* volatile: every step rounds to float, nothing is fused */
            if (format == PLE_FORMAT_NVFP4) {
                uint8_t byte = row[j / 2];
                uint8_t code = (j & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 15);
                volatile float p = ref_e2m1(code) * ref_e4m3(row[80 + j / 16]);
                v = p * gs;
            } else if (format == PLE_FORMAT_FP8) {
                v = ref_e4m3(row[j]) * gs;
            } else if (format == PLE_FORMAT_F32) {
                v = bits_f32((uint32_t)row[4 * j] | ((uint32_t)row[4 * j + 1] << 8) |
                             ((uint32_t)row[4 * j + 2] << 16) | ((uint32_t)row[4 * j + 3] << 24));
            } else {
                v = ref_bf16_to_f32((uint16_t)(row[2 * j] | (row[2 * j + 1] << 8)));
            }
            size_t idx = (size_t)t * stride + (size_t)e;
            if (dtype == PLE_DTYPE_F32) {
                uint32_t *o = (uint32_t *)out;
                if (accumulate) v = bits_f32(o[idx]) + v;
                o[idx] = isnan(v) ? 0x7FC00000u : f32_bits(v);
            } else if (dtype == PLE_DTYPE_F16) {
                uint16_t *o = (uint16_t *)out;
                if (accumulate) v = ref_f16_to_f32(o[idx]) + v;
                o[idx] = ref_f16(v);
            } else {
                uint16_t *o = (uint16_t *)out;
                if (accumulate) v = ref_bf16_to_f32(o[idx]) + v;
                o[idx] = ref_bf16(v);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* batches (stateless mode: every request carries its two context tokens)                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    int32_t *tokens, *positions, *context;
    uint64_t *request_ids;
    uint32_t *query_start;
    ple_batch b;
} batch_buf;

/* n tokens split over `reqs` requests; every span starts at a random position with random
 * context (EOS when the span starts the sequence). */
static inline void make_batch(batch_buf *bb, rng_t *r, uint32_t n, uint32_t reqs, uint64_t id_base) {
    if (reqs > n) reqs = n;
    bb->tokens = calloc(n, sizeof(int32_t));
    bb->positions = calloc(n, sizeof(int32_t));
    bb->context = calloc((size_t)reqs * 2, sizeof(int32_t));
    bb->request_ids = calloc(reqs, sizeof(uint64_t));
    bb->query_start = calloc(reqs + 1, sizeof(uint32_t));
    for (uint32_t q = 0; q <= reqs; q++) bb->query_start[q] = (uint32_t)((uint64_t)n * q / reqs);
    for (uint32_t q = 0; q < reqs; q++) {
        bb->request_ids[q] = id_base + q;
        int32_t p0 = (int32_t)(rng_next(r) % 3 == 0 ? 0 : rng_next(r) % 100000);
        for (uint32_t i = bb->query_start[q]; i < bb->query_start[q + 1]; i++) {
            uint64_t x = rng_next(r);
            bb->tokens[i] = x % 50 == 0 ? EOS : (int32_t)(x % VOCAB);
            bb->positions[i] = p0 + (int32_t)(i - bb->query_start[q]);
        }
        bb->context[2 * q] = p0 >= 2 ? (int32_t)(rng_next(r) % VOCAB) : EOS;
        bb->context[2 * q + 1] = p0 >= 1 ? (int32_t)(rng_next(r) % VOCAB) : EOS;
    }
    bb->b.tokens = bb->tokens;
    bb->b.positions = bb->positions;
    bb->b.num_tokens = n;
    bb->b.request_ids = bb->request_ids;
    bb->b.query_start = bb->query_start;
    bb->b.num_requests = reqs;
    bb->b.context = bb->context;
}

static inline void free_batch(batch_buf *bb) {
    free(bb->tokens);
    free(bb->positions);
    free(bb->context);
    free(bb->request_ids);
    free(bb->query_start);
    memset(bb, 0, sizeof *bb);
}

/* The tests' wait timeout (ple_options.wait_timeout_us) where a test names none: a stuck wait
 * then costs 10 s of a program's 60-75 s limit in device-check.sh, where the handle's default
 * (300 s) would cost the whole program. */
#define TEST_WAIT_TIMEOUT_US 10000000ull

/* Opens `dir` on device 0 with the given wait mode and timeout (0: TEST_WAIT_TIMEOUT_US). */
static inline ple_status open_gpu(const char *dir, int wait_mode, uint64_t timeout_us, uint32_t in_flight,
                           ple_handle **h) {
    ple_options o;
    ple_options_default(&o);
    o.cuda_device = 0;
    o.wait_mode = wait_mode;
    o.max_tokens_per_step = 8192;
    o.max_in_flight = in_flight;
    o.wait_timeout_us = timeout_us ? timeout_us : TEST_WAIT_TIMEOUT_US;
    return ple_open(dir, &o, h);
}

static inline const char *wait_name(int m) {
    switch (m) {
    case PLE_WAIT_AUTO: return "auto";
    case PLE_WAIT_HOST: return "host";
    case PLE_WAIT_STREAM_OP: return "stream_op";
    case PLE_WAIT_SPIN_KERNEL: return "spin_kernel";
    default: return "?";
    }
}

static inline const char *dtype_name(int d) {
    return d == PLE_DTYPE_F32 ? "f32" : d == PLE_DTYPE_F16 ? "f16" : "bf16";
}

#endif

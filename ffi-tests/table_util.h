/* Helpers for C tests that need a table: generate one with the installed `ple` tool, read rows
 * straight from the row file, and decode them with a plain scalar rule (independent of libple). */
#ifndef PLE_TABLE_UTIL_H
#define PLE_TABLE_UTIL_H

#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Runs `$PLE_BIN synth-table <dir> <args>`; returns 0 on success. */
static inline int make_table(const char *dir, const char *args) {
    const char *bin = getenv("PLE_BIN");
    if (bin == NULL || bin[0] == '\0') {
        fprintf(stderr, "PLE_BIN is not set (path of the installed ple tool)\n");
        return -1;
    }
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' synth-table '%s' %s > /dev/null", bin, dir, args);
    return system(cmd);
}

/* Reads row `r` (row_bytes bytes) of the table in `dir` with pread. */
static inline int read_row(const char *dir, int64_t r, uint32_t row_bytes, uint8_t *out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/table.rows", dir);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    ssize_t n = pread(fd, out, row_bytes, (off_t)(r * (int64_t)row_bytes));
    close(fd);
    return n == (ssize_t)row_bytes ? 0 : -1;
}

static inline float e4m3_value(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) return NAN;
    v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
    return s ? -v : v;
}

static inline float e2m1_value(uint8_t code) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[code & 7];
    return (code & 8) ? -v : v;
}

/* Decodes one NVFP4 row (160 values) to f32: e2m1 x e4m3 block scale, then x global. */
static inline void decode_nvfp4_row(const uint8_t *row, float global, float *out) {
    for (int j = 0; j < 160; j++) {
        uint8_t byte = row[j / 2];
        uint8_t code = (j % 2 == 0) ? (byte & 15) : (byte >> 4);
        float v = e2m1_value(code) * e4m3_value(row[80 + j / 16]);
        out[j] = v * global;
    }
}
#endif

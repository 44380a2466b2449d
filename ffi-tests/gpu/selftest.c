/*
 * CPU-only self-test of common.h (no GPU, no libple calls): writes a table with write_table() and
 * prints the reference dequantisation's primitives and one dequantised token per format, dtype and
 * accumulate flag, for check-reference.py to compare with ml_dtypes/numpy (independent oracles).
 * Usage: selftest DIR > dump.txt
 */
#include "common.h"

static void dump_token(int format, float gs, rng_t *r) {
    int rb = format == PLE_FORMAT_NVFP4 ? 90
             : format == PLE_FORMAT_FP8 ? 160
             : format == PLE_FORMAT_F32 ? 640
                                        : 320;
    uint8_t rows[16 * 640];
    rng_fill(r, rows, sizeof rows);
    for (int dtype = 0; dtype < 3; dtype++) {
        for (int acc = 0; acc < 2; acc++) {
            uint32_t out[EMBED];
            rng_fill(r, out, sizeof out);
            int es = dtype_size(dtype);
            uint8_t init[EMBED * 4];
            memcpy(init, out, sizeof init);
            ref_dequant(format, gs, rows, 1, out, dtype, EMBED, acc);
            printf("token %d %d %d %08x ", format, dtype, acc, f32_bits(gs));
            for (int i = 0; i < 16 * rb; i++) printf("%02x", rows[i]);
            printf(" ");
            for (int i = 0; i < EMBED * es; i++) printf("%02x", init[i]);
            printf(" ");
            for (int i = 0; i < EMBED * es; i++) printf("%02x", ((uint8_t *)out)[i]);
            printf("\n");
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: selftest DIR\n");
        return 2;
    }
    char d[4096];
    const char *fmts[4] = {"nvfp4", "fp8", "bf16", "f32"};
    for (int i = 0; i < 4; i++) {
        table_desc td;
        snprintf(d, sizeof d, "%s/%s", argv[1], fmts[i]);
        if (write_table(d, fmts[i], 2003, 42 + i, 0.0123f, &td) != 0) {
            fprintf(stderr, "write_table %s failed\n", fmts[i]);
            return 1;
        }
        char p[4200];
        snprintf(p, sizeof p, "%s/table.rows", d);
        struct stat st;
        if (stat(p, &st) != 0 || (uint64_t)st.st_size != td.total_rows * (uint64_t)td.row_bytes ||
            td.total_rows % 128 != 0 || td.addressed_rows > td.total_rows) {
            fprintf(stderr, "table %s has the wrong size\n", fmts[i]);
            return 1;
        }
        printf("table %s %llu %llu %d\n", fmts[i], (unsigned long long)td.total_rows,
               (unsigned long long)td.addressed_rows, td.row_bytes);
    }
    for (int b = 0; b < 256; b++) printf("e4m3 %d %08x\n", b, f32_bits(ref_e4m3((uint8_t)b)));
    for (int c = 0; c < 16; c++) printf("e2m1 %d %08x\n", c, f32_bits(ref_e2m1((uint8_t)c)));
    for (int h = 0; h < 65536; h++)
        printf("f16to32 %d %08x\n", h, f32_bits(ref_f16_to_f32((uint16_t)h)));
    rng_t r = {7};
    static const uint32_t edges[] = {
        0x00000000, 0x80000000, 0x00000001, 0x33000000, 0x33000001, 0x337FFFFF, 0x33800000,
        0x387FC000, 0x387FE000, 0x38800000, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001,
        0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x3F808000,
        0x3F818000, 0x3F800001, 0x3F7FFFFF, 0xC0490FDB, 0x3DCCCCCD, 0x007FFFFF, 0x80000001};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0] + 200000; i++) {
        uint32_t x = i < sizeof edges / sizeof edges[0] ? edges[i] : (uint32_t)rng_next(&r);
        if (i >= sizeof edges / sizeof edges[0] && (i & 1)) /* half of them near f16 range */
            x = (x & 0x807FFFFF) | ((uint32_t)(100 + (rng_next(&r) % 45)) << 23);
        float f = bits_f32(x);
        printf("cvt %08x %04x %04x\n", x, ref_f16(f), ref_bf16(f));
    }
    dump_token(PLE_FORMAT_NVFP4, 0.0123f, &r);
    dump_token(PLE_FORMAT_FP8, 0.0123f, &r);
    dump_token(PLE_FORMAT_BF16, 1.0f, &r);
    dump_token(PLE_FORMAT_F32, 1.0f, &r);
    return 0;
}

/*
 * libple GPU kernels. Compiled to PTX by NVRTC (scripts/gen-ptx.py, target compute_80,
 * -fmad=false) and embedded in libple (crates/ple-core/src/dequant/gpu/layout.rs). No headers:
 * plain CUDA C++ with `extern "C"` entry points, so the host looks kernels up by name.
 *
 * ---------------------------------------------------------------------------------------------
 * THE DEQUANTISATION RULE: docs/FORMAT.md#row-formats-and-dequantisation (written once there).
 * Here: fp32 products with __fmul_rn, the accumulate with __fadd_rn, never contracted (the PTX is
 * compiled with -fmad=false); one round-to-nearest-even store; every NaN stored canonical.
 * Output element e of token t is at out + (t * out_stride + e) * sizeof(dtype).
 * ---------------------------------------------------------------------------------------------
 * THE HANDSHAKE (device side; the host side is crates/ple-core/src/dequant/gpu/, docs/GPU.md)
 * ---------------------------------------------------------------------------------------------
 * Host-mapped control block `ctrl` (pinned, DEVICEMAP), written by the library's worker thread:
 *   done        u64 at CTRL_DONE: the last published step (steps publish in increasing seq order;
 *               on close, a value >= every step a device wait was enqueued for);
 *   closing     u32 at CTRL_CLOSING: 1 once the handle is closing (device waits stop);
 *   err         DevError at CTRL_ERR: the first device error since the host last cleared it;
 *   epoch       u32 at CTRL_EPOCH: how many device errors the host has cleared;
 *   consumed    u64 at CTRL_CONSUMED: CUDA Graph mode, the last step a replay handled;
 *   entered     u64 at CTRL_ENTERED: CUDA Graph mode, the step of the last replay that started
 *               (entered > consumed: a replay is running; close waits for it);
 *   headers[s]  SlotHeader at CTRL_HEADERS, per ring slot s = seq % slots: {seq, num_tokens,
 *               failed}, written before done.
 * Device control block `dctrl`: dev_seq (u64 at DEV_SEQ, graph mode: the step the next replay
 * consumes), claim (u32 at DEV_CLAIM, the error epoch last claimed), gates[s] (Gate at DEV_GATES).
 * Rows of slot s at rows + s * slot_stride ([num_tokens][heads][row_bytes], heads = the table's
 * num_heads but for a head shard): the mapped pinned
 * staging itself in device-wait modes (zero-copy, read with ld.global.cv: fetched from host
 * memory on every read, never from a stale cached line), device memory after an H2D copy in host
 * wait mode.
 * A step is consumed only when done >= seq AND headers[seq % slots].seq == seq: rows of an older
 * or newer step in the same slot are never read. The error record is a report, never a gate:
 * every launch waits and writes on its own terms whatever an earlier launch raised.
 * Failure visibility: a launch that cannot dequantise its step (host failure, timeout, wrong
 * slot, over capacity, closing) raises a device error AND fills the tokens it would have written
 * with the canonical NaN of the output dtype (accumulate or not), so the engine never keeps the
 * previous step's values unknowingly.
 */

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

/* The table's geometry is DequantParams' (head_dim, row_bytes, items_per_token = num_heads *
 * head_dim / KERNEL_ITEM; head_dim a multiple of KERNEL_ITEM, checked on the host). The shipped
 * model's (16 heads of 160) gets its own instantiation with these as constants. */
#define KERNEL_ITEM 8 /* output elements per work item, all of one head */
#define SHIPPED_HEAD_DIM 160
#define SHIPPED_ITEMS_PER_TOKEN 320
#define DEQUANT_BLOCK 256

#define FMT_NVFP4 1
#define FMT_FP8 2
#define FMT_BF16 3
#define FMT_F32 4
#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2

/* DequantParams.flags */
#define FLAG_ACCUMULATE 1u /* add to the output (PLE_FUSE_ACCUMULATE) */
#define FLAG_GATED 2u      /* read the verdict from gates[slot]; else the host verified the step */
#define FLAG_GRAPH 4u      /* the step is *dev_seq (CUDA Graph mode); else `expected` */
#define FLAG_ZERO_COPY 8u  /* rows are mapped host memory: load with ld.global.cv */
#define FLAG_VEC 16u       /* out and out_stride allow 16-byte vector access */

/* Byte offsets in the control blocks; keep in sync with crates/ple-core/src/dequant/gpu/layout.rs. */
#define CTRL_DONE 0
#define CTRL_CLOSING 64
#define CTRL_ERR 128
#define CTRL_EPOCH 192
#define CTRL_CONSUMED 256
#define CTRL_ENTERED 320
#define CTRL_HEADERS 384
#define DEV_SEQ 0
#define DEV_CLAIM 128
#define DEV_GATES 256

/* Device error codes (err.code); keep in sync with crates/ple-core/src/dequant/gpu/layout.rs. */
#define ERR_WAIT_TIMEOUT 1u  /* the spin wait ran past its timeout (detail: done seen last) */
#define ERR_OVER_CAPACITY 2u /* the step has more tokens than the launch's capacity (detail: n) */
#define ERR_SEQ_MISMATCH 3u  /* the slot holds another step (detail: the slot's seq) */
#define ERR_TOKEN_COUNT 4u   /* the step's token count differs from the host's (detail: n) */
#define ERR_CLOSED 5u        /* the handle is being closed */
#define ERR_STEP_FAILED 6u   /* the step failed on the host (ple_wait reports why) */
#define ERR_GATE_MISMATCH 7u /* the dequant launch found another step's gate (detail: its seq) */

struct SlotHeader { /* host-mapped, one per slot, 16 bytes */
    u64 seq;
    u32 num_tokens; /* also for a failed step: the tokens its launch fills with NaN */
    u32 failed;
};

struct DevError { /* host-mapped, 32 bytes; code written last, by the launch that claimed it */
    u32 code;
    u32 slot;
    u64 seq;
    u64 detail;
    u64 reserved;
};

struct Gate { /* device memory, one per slot, 16 bytes */
    u64 seq;
    u32 num_tokens; /* ok: tokens to dequantise; not ok: tokens to fill with NaN */
    u32 ok;
};

/* Kernel parameter blocks, passed by value; mirrored by #[repr(C)] structs in layout.rs. */
struct WaitParams {
    u64 ctrl;       /* host-mapped control block (device address) */
    u64 dctrl;      /* device control block */
    u64 expected;   /* the step to wait for unless graph */
    u64 timeout_ns; /* %globaltimer budget */
    u32 slots;
    u32 capacity;   /* tokens the following dequant launch may write */
    u32 expect_n;   /* the host's num_tokens for the step, or 0 (graph mode: from the header) */
    u32 graph;      /* 1: the step is *dev_seq */
};

struct DequantParams {
    u64 rows;        /* slot 0's rows (device rows, or the mapped staging) */
    u64 slot_stride; /* bytes between slots */
    u64 ctrl;
    u64 dctrl;
    u64 expected;    /* the step unless FLAG_GRAPH */
    u64 out;         /* device output base */
    u64 out_stride;  /* elements between tokens, >= num_heads * head_dim */
    u32 slots;
    u32 capacity;    /* tokens `out` holds */
    u32 expect_n;    /* ungated: the verified token count */
    int fmt;
    int dtype;
    u32 flags;
    float scale; /* global scale (unused for bf16 and f32 rows) */
    u16 first_head;  /* the step's rows are heads first_head + j * head_stride, j < heads: */
    u16 heads;       /* heads rows per token; other heads' columns: -0 (accumulate: untouched) */
    u16 head_stride; /* >= 1 */
    u32 head_dim;        /* elements per row: a multiple of KERNEL_ITEM (nvfp4: of 16) */
    u32 row_bytes;       /* bytes per row */
    u32 items_per_token; /* num_heads * head_dim / KERNEL_ITEM (the whole table's heads) */
};

struct AdvanceParams {
    u64 ctrl;
    u64 dctrl;
};

struct SetParams {
    u64 ctrl;
    u64 dctrl;
    u64 value;
};

static_assert(sizeof(SlotHeader) == 16, "SlotHeader layout");
static_assert(sizeof(DevError) == 32, "DevError layout");
static_assert(sizeof(Gate) == 16, "Gate layout");
static_assert(sizeof(WaitParams) == 48, "WaitParams layout");
static_assert(sizeof(DequantParams) == 104, "DequantParams layout");
static_assert(sizeof(AdvanceParams) == 16, "AdvanceParams layout");
static_assert(sizeof(SetParams) == 24, "SetParams layout");

/* ------------------------------------------------------------------------------------------ */
/* small helpers                                                                               */
/* ------------------------------------------------------------------------------------------ */

/*
 * Every inline PTX instruction, one macro each. A host build of this file (the emulated driver's
 * kernels, ffi-tests/gpu/emu/host_kernels.cpp) defines PLE_HOST_SHIM and host equivalents of
 * these macros (ffi-tests/gpu/emu/kernel_shim.h); NVRTC compiles the PTX below.
 */
#ifndef PLE_HOST_SHIM
#define PTX_LD_ACQUIRE_SYS_U64(v, a) asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(a) : "memory")
#define PTX_GLOBALTIMER(t) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t))
#define PTX_NANOSLEEP(ns) asm volatile("nanosleep.u32 %0;" ::"r"(ns))
#define PTX_LD_CV_U8(v, p) asm volatile("ld.global.cv.u8 %0, [%1];" : "=r"(v) : "l"(p))
#define PTX_LD_CV_U16(v, p) asm volatile("ld.global.cv.u16 %0, [%1];" : "=r"(v) : "l"(p))
#define PTX_LD_CV_V2(v, p) asm volatile("ld.global.cv.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p))
#define PTX_LD_CV_V4(v, p)                                                                         \
    asm volatile("ld.global.cv.v4.u32 {%0, %1, %2, %3}, [%4];"                                     \
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)                                      \
                 : "l"(p))
#define PTX_CVT_RN_F16_F32(h, f) asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f))
#define PTX_CVT_RN_BF16_F32(h, f) asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f))
#define PTX_CVT_F32_F16(f, h) asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h))
#endif

static __device__ __forceinline__ u64 ld_acquire_sys(u64 addr) {
    u64 v;
    PTX_LD_ACQUIRE_SYS_U64(v, addr);
    return v;
}

static __device__ __forceinline__ u64 global_timer_ns() {
    u64 t;
    PTX_GLOBALTIMER(t);
    return t;
}

static __device__ __forceinline__ void sleep_ns(u32 ns) {
    PTX_NANOSLEEP(ns);
}

static __device__ __forceinline__ u32 closing(u64 ctrl) {
    return *(volatile u32 *)(ctrl + CTRL_CLOSING);
}

/*
 * Records a device error unless one is already pending. The launch that moves dctrl.claim from
 * the host's epoch to epoch + 1 (device-memory atomicCAS: no atomics on host memory over PCIe)
 * owns the record and writes it, code last; every other launch of that epoch leaves it alone, so
 * a record is never a mix of two errors. The host clears code, then bumps epoch.
 */
static __device__ void raise_error(u64 ctrl, u64 dctrl, u32 code, u32 slot, u64 seq, u64 detail) {
    u32 epoch = *(volatile u32 *)(ctrl + CTRL_EPOCH);
    if (atomicCAS((u32 *)(dctrl + DEV_CLAIM), epoch, epoch + 1u) != epoch) return;
    volatile DevError *e = (volatile DevError *)(ctrl + CTRL_ERR);
    e->slot = slot;
    e->seq = seq;
    e->detail = detail;
    __threadfence_system();
    e->code = code;
    __threadfence_system();
}

/*
 * The verdict on step `expected` once done >= expected: 1 with *n = its token count when its rows
 * may be read, else 0 with *n = the tokens to fill with NaN (an error is raised).
 */
static __device__ u32 check_step(const WaitParams &p, u64 expected, u32 *n) {
    u32 slot = (u32)(expected % p.slots);
    volatile SlotHeader *h = ((volatile SlotHeader *)(p.ctrl + CTRL_HEADERS)) + slot;
    u64 seq = h->seq;
    u32 hn = h->num_tokens;
    u32 failed = h->failed;
    u32 fill = p.expect_n ? p.expect_n : p.capacity;
    *n = fill;
    if (closing(p.ctrl)) {
        raise_error(p.ctrl, p.dctrl, ERR_CLOSED, slot, expected, 0);
        return 0;
    }
    if (seq != expected) {
        raise_error(p.ctrl, p.dctrl, ERR_SEQ_MISMATCH, slot, expected, seq);
        return 0;
    }
    if (failed) {
        raise_error(p.ctrl, p.dctrl, ERR_STEP_FAILED, slot, expected, 0);
        if (!p.expect_n) *n = hn < p.capacity ? hn : p.capacity;
        return 0;
    }
    if (hn > p.capacity) {
        raise_error(p.ctrl, p.dctrl, ERR_OVER_CAPACITY, slot, expected, hn);
        return 0;
    }
    if (p.expect_n != 0 && hn != p.expect_n) {
        raise_error(p.ctrl, p.dctrl, ERR_TOKEN_COUNT, slot, expected, hn);
        return 0;
    }
    *n = hn;
    return 1;
}

/* Row loads: plain from device memory, ld.global.cv from mapped host memory (zero-copy). */
static __device__ __forceinline__ u32 ld_u8(const u8 *p, bool zc) {
    if (!zc) return *p;
    u32 v;
    PTX_LD_CV_U8(v, p);
    return v;
}

static __device__ __forceinline__ u32 ld_u16(const u16 *p, bool zc) {
    if (!zc) return *p;
    u32 v;
    PTX_LD_CV_U16(v, p);
    return v;
}

static __device__ __forceinline__ uint2 ld_v2(const u8 *p, bool zc) {
    if (!zc) return *(const uint2 *)p;
    uint2 v;
    PTX_LD_CV_V2(v, p);
    return v;
}

static __device__ __forceinline__ uint4 ld_v4(const u8 *p, bool zc) {
    if (!zc) return *(const uint4 *)p;
    uint4 v;
    PTX_LD_CV_V4(v, p);
    return v;
}

/* e4m3 "fn" -> fp32 (exact). */
static __device__ __forceinline__ float e4m3_to_f32(u32 b) {
    u32 sign = (b & 0x80u) << 24;
    u32 em = b & 0x7Fu;
    if (em == 0x7Fu) return __int_as_float(0x7FC00000);
    u32 e = em >> 3, m = em & 7u;
    float mag;
    if (e == 0)
        mag = __fmul_rn((float)m, 0.001953125f); /* m * 2^-9, exact */
    else
        mag = __int_as_float((int)(((e + 120u) << 23) | (m << 20)));
    return __int_as_float(__float_as_int(mag) | (int)sign);
}

/* e2m1 code (4 bits) -> fp32 (exact). */
static __device__ __forceinline__ float e2m1_to_f32(u32 nib) {
    u32 c = nib & 7u;
    u32 bits = c < 2 ? (c ? 0x3F000000u : 0u) : ((((c >> 1) + 126u) << 23) | ((c & 1u) << 22));
    return __int_as_float((int)(bits | ((nib & 8u) << 28)));
}

static __device__ __forceinline__ bool is_nan(float v) {
    return ((u32)__float_as_int(v) & 0x7FFFFFFFu) > 0x7F800000u;
}

static __device__ __forceinline__ u32 to_f32_bits(float v) {
    return is_nan(v) ? 0x7FC00000u : (u32)__float_as_int(v);
}

static __device__ __forceinline__ u16 to_f16_bits(float v) {
    if (is_nan(v)) return 0x7E00;
    u16 h;
    PTX_CVT_RN_F16_F32(h, v);
    return h;
}

static __device__ __forceinline__ u16 to_bf16_bits(float v) {
    if (is_nan(v)) return 0x7FC0;
    u16 h;
    PTX_CVT_RN_BF16_F32(h, v);
    return h;
}

static __device__ __forceinline__ float f16_bits_to_f32(u32 h) {
    float f;
    u16 x = (u16)h;
    PTX_CVT_F32_F16(f, x);
    return f;
}

static __device__ __forceinline__ float bf16_bits_to_f32(u32 h) {
    return __int_as_float((int)((h & 0xFFFFu) << 16));
}

/* ------------------------------------------------------------------------------------------ */
/* decode: 8 consecutive elements e0..e0+7 of a token's packed rows (e0 % 8 == 0 and head_dim %  */
/* 8 == 0: one row, one nvfp4 scale block). ROW_BYTES: a row of the shipped head dim (160).    */
/* ------------------------------------------------------------------------------------------ */

template <int FMT> struct Fmt;

template <> struct Fmt<FMT_NVFP4> {
    enum : u32 { ROW_BYTES = 90 };
    static __device__ __forceinline__ void decode(const u8 *tok, u32 e0, u32 hd, u32 rb,
                                                  float scale, float v[8], bool zc) {
        u32 h = e0 / hd, j = e0 - h * hd;
        const u8 *row = tok + h * rb;
        const u8 *cb = row + (j >> 1); /* j % 8 == 0: 4 bytes of codes, j/2 even */
        u32 codes;
        if ((rb & 1u) == 0) { /* even rows (head_dim % 32 == 0): the codes are 2-byte aligned */
            const u16 *c = (const u16 *)cb;
            codes = ld_u16(c, zc) | (ld_u16(c + 1, zc) << 16);
        } else {
            codes = ld_u8(cb, zc) | (ld_u8(cb + 1, zc) << 8) | (ld_u8(cb + 2, zc) << 16) |
                    (ld_u8(cb + 3, zc) << 24);
        }
        float bs = e4m3_to_f32(ld_u8(row + (hd >> 1) + (j >> 4), zc));
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float p = __fmul_rn(e2m1_to_f32((codes >> (4 * k)) & 0xFu), bs);
            v[k] = __fmul_rn(p, scale);
        }
    }
};

template <> struct Fmt<FMT_FP8> {
    enum : u32 { ROW_BYTES = 160 };
    static __device__ __forceinline__ void decode(const u8 *tok, u32 e0, u32, u32, float scale,
                                                  float v[8], bool zc) {
        /* row h byte j == token byte e0 (row_bytes == head_dim); 8-byte aligned */
        uint2 b = ld_v2(tok + e0, zc);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[k] = __fmul_rn(e4m3_to_f32((b.x >> (8 * k)) & 0xFFu), scale);
            v[k + 4] = __fmul_rn(e4m3_to_f32((b.y >> (8 * k)) & 0xFFu), scale);
        }
    }
};

template <> struct Fmt<FMT_BF16> {
    enum : u32 { ROW_BYTES = 320 };
    static __device__ __forceinline__ void decode(const u8 *tok, u32 e0, u32, u32, float,
                                                  float v[8], bool zc) {
        uint4 b = ld_v4(tok + 2u * e0, zc); /* 16-byte aligned */
        u32 w[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[2 * k] = bf16_bits_to_f32(w[k] & 0xFFFFu);
            v[2 * k + 1] = bf16_bits_to_f32(w[k] >> 16);
        }
    }
};

template <> struct Fmt<FMT_F32> {
    enum : u32 { ROW_BYTES = 640 };
    static __device__ __forceinline__ void decode(const u8 *tok, u32 e0, u32, u32, float,
                                                  float v[8], bool zc) {
        /* little-endian f32 values, as is; 16-byte aligned (row_bytes 4 * head_dim, e0 % 8 == 0) */
        uint4 a = ld_v4(tok + 4u * e0, zc), b = ld_v4(tok + 4u * e0 + 16u, zc);
        v[0] = __int_as_float((int)a.x);
        v[1] = __int_as_float((int)a.y);
        v[2] = __int_as_float((int)a.z);
        v[3] = __int_as_float((int)a.w);
        v[4] = __int_as_float((int)b.x);
        v[5] = __int_as_float((int)b.y);
        v[6] = __int_as_float((int)b.z);
        v[7] = __int_as_float((int)b.w);
    }
};

/* ------------------------------------------------------------------------------------------ */
/* store: 8 elements at out_row + e0, optional accumulate, vector or scalar                    */
/* ------------------------------------------------------------------------------------------ */

template <int DT> struct Out;

template <> struct Out<DT_F32> {
    static __device__ __forceinline__ void store(u64 row, u32 e0, float v[8], bool acc, bool vec) {
        float *p = (float *)row + e0;
        if (vec) {
            float4 *q = (float4 *)p;
            if (acc) {
                float4 a = q[0], b = q[1];
                v[0] = __fadd_rn(a.x, v[0]);
                v[1] = __fadd_rn(a.y, v[1]);
                v[2] = __fadd_rn(a.z, v[2]);
                v[3] = __fadd_rn(a.w, v[3]);
                v[4] = __fadd_rn(b.x, v[4]);
                v[5] = __fadd_rn(b.y, v[5]);
                v[6] = __fadd_rn(b.z, v[6]);
                v[7] = __fadd_rn(b.w, v[7]);
            }
            uint4 a, b;
            a.x = to_f32_bits(v[0]);
            a.y = to_f32_bits(v[1]);
            a.z = to_f32_bits(v[2]);
            a.w = to_f32_bits(v[3]);
            b.x = to_f32_bits(v[4]);
            b.y = to_f32_bits(v[5]);
            b.z = to_f32_bits(v[6]);
            b.w = to_f32_bits(v[7]);
            ((uint4 *)p)[0] = a;
            ((uint4 *)p)[1] = b;
        } else {
            u32 *u = (u32 *)p;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float x = acc ? __fadd_rn(p[k], v[k]) : v[k];
                u[k] = to_f32_bits(x);
            }
        }
    }
};

template <int DT> static __device__ __forceinline__ float load16(u32 bits) {
    return DT == DT_F16 ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
}

template <int DT> static __device__ __forceinline__ u32 conv16(float v) {
    return DT == DT_F16 ? (u32)to_f16_bits(v) : (u32)to_bf16_bits(v);
}

template <int DT> struct Out16 {
    static __device__ __forceinline__ void store(u64 row, u32 e0, float v[8], bool acc, bool vec) {
        u16 *p = (u16 *)row + e0;
        if (vec) {
            uint4 *q = (uint4 *)p;
            if (acc) {
                uint4 a = q[0];
                u32 w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    v[2 * k] = __fadd_rn(load16<DT>(w[k] & 0xFFFFu), v[2 * k]);
                    v[2 * k + 1] = __fadd_rn(load16<DT>(w[k] >> 16), v[2 * k + 1]);
                }
            }
            uint4 r;
            r.x = conv16<DT>(v[0]) | (conv16<DT>(v[1]) << 16);
            r.y = conv16<DT>(v[2]) | (conv16<DT>(v[3]) << 16);
            r.z = conv16<DT>(v[4]) | (conv16<DT>(v[5]) << 16);
            r.w = conv16<DT>(v[6]) | (conv16<DT>(v[7]) << 16);
            q[0] = r;
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float x = acc ? __fadd_rn(load16<DT>(p[k]), v[k]) : v[k];
                p[k] = (u16)conv16<DT>(x);
            }
        }
    }
};

template <> struct Out<DT_F16> : Out16<DT_F16> {};
template <> struct Out<DT_BF16> : Out16<DT_BF16> {};

/* SHIPPED: the table is 16 heads of 160 (its geometry as constants); else p's. */
template <int FMT, int DT, bool SHIPPED>
static __device__ void dequant_body(const DequantParams &p, u64 expected, u32 n) {
    const u32 hd = SHIPPED ? (u32)SHIPPED_HEAD_DIM : p.head_dim;
    const u32 rb = SHIPPED ? (u32)Fmt<FMT>::ROW_BYTES : p.row_bytes;
    const u32 ipt = SHIPPED ? (u32)SHIPPED_ITEMS_PER_TOKEN : p.items_per_token;
    const u8 *rows = (const u8 *)(p.rows + (expected % p.slots) * p.slot_stride);
    bool acc = (p.flags & FLAG_ACCUMULATE) != 0;
    bool vec = (p.flags & FLAG_VEC) != 0;
    bool zc = (p.flags & FLAG_ZERO_COPY) != 0;
    u32 elem = DT == DT_F32 ? 4u : 2u;
    u32 first = p.first_head, step = p.head_stride;
    u64 tok_bytes = (u64)rb * p.heads; /* a head shard's rows */
    u64 total = (u64)n * ipt;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (u64)gridDim.x * blockDim.x) {
        u32 tok = (u32)(i / ipt);
        u32 e0 = (u32)(i - (u64)tok * ipt) * KERNEL_ITEM;
        float v[8];
        /* the 8 elements lie in one head (head_dim is a multiple of 8): its place j among
           the step's heads, or none */
        u32 h = e0 / hd, d = h - first, j = d / step;
        if (h < first || d % step != 0 || j >= p.heads) {
            /* another shard's heads: -0 (x + -0 == x), or nothing */
            if (acc) continue;
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = -0.0f;
        } else {
            u32 e = j * hd + (e0 - h * hd); /* in the token's packed rows */
            Fmt<FMT>::decode(rows + (u64)tok * tok_bytes, e, hd, rb, p.scale, v, zc);
        }
        Out<DT>::store(p.out + (u64)tok * p.out_stride * elem, e0, v, acc, vec);
    }
}

/* Fills n tokens of the output with the canonical NaN (a step that could not be dequantised). */
template <int DT> static __device__ void nan_fill(const DequantParams &p, u32 n) {
    bool vec = (p.flags & FLAG_VEC) != 0;
    u32 elem = DT == DT_F32 ? 4u : 2u;
    u32 ipt = p.items_per_token;
    u64 total = (u64)n * ipt;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (u64)gridDim.x * blockDim.x) {
        u32 tok = (u32)(i / ipt);
        u32 e0 = (u32)(i - (u64)tok * ipt) * KERNEL_ITEM;
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = __int_as_float(0x7FC00000);
        Out<DT>::store(p.out + (u64)tok * p.out_stride * elem, e0, v, false, vec);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* entry points                                                                                */
/* ------------------------------------------------------------------------------------------ */

/*
 * ple_wait_gate<<<1, 1>>>: waits until done >= expected (expected = *dev_seq in graph mode), the
 * handle closes, or timeout_ns of %globaltimer pass (then raises ERR_WAIT_TIMEOUT); then checks
 * the slot header once and writes the verdict to gates[slot] in device memory, which the
 * following gated ple_dequant reads. After a stream memory wait it finds done >= expected at once.
 */
extern "C" __global__ void ple_wait_gate(WaitParams p) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    u64 expected = p.graph ? *(volatile u64 *)(p.dctrl + DEV_SEQ) : p.expected;
    u32 slot = (u32)(expected % p.slots);
    u32 ok = 0, n = p.expect_n ? p.expect_n : p.capacity;
    if (p.graph) {
        *(volatile u64 *)(p.ctrl + CTRL_ENTERED) = expected;
        __threadfence_system();
    }
    u64 t0 = global_timer_ns();
    u32 nap = 32;
    for (;;) {
        u64 d = ld_acquire_sys(p.ctrl + CTRL_DONE);
        if (d >= expected) {
            ok = check_step(p, expected, &n);
            break;
        }
        if (closing(p.ctrl)) {
            raise_error(p.ctrl, p.dctrl, ERR_CLOSED, slot, expected, d);
            break;
        }
        if (global_timer_ns() - t0 > p.timeout_ns) {
            raise_error(p.ctrl, p.dctrl, ERR_WAIT_TIMEOUT, slot, expected, d);
            break;
        }
        sleep_ns(nap);
        if (nap < 1024) nap *= 2;
    }
    volatile Gate *g = ((volatile Gate *)(p.dctrl + DEV_GATES)) + slot;
    g->seq = expected;
    g->num_tokens = n;
    g->ok = ok;
}

template <int DT, bool SHIPPED>
static __device__ void body_for_shape(const DequantParams &p, u64 expected, u32 n) {
    switch (p.fmt) {
    case FMT_NVFP4: dequant_body<FMT_NVFP4, DT, SHIPPED>(p, expected, n); break;
    case FMT_FP8: dequant_body<FMT_FP8, DT, SHIPPED>(p, expected, n); break;
    case FMT_BF16: dequant_body<FMT_BF16, DT, SHIPPED>(p, expected, n); break;
    case FMT_F32: dequant_body<FMT_F32, DT, SHIPPED>(p, expected, n); break;
    default: break; /* validated on the host */
    }
}

template <int DT> static __device__ void body_for(const DequantParams &p, u64 expected, u32 n) {
    if (p.head_dim == SHIPPED_HEAD_DIM && p.items_per_token == SHIPPED_ITEMS_PER_TOKEN)
        body_for_shape<DT, true>(p, expected, n);
    else
        body_for_shape<DT, false>(p, expected, n);
}

/*
 * ple_dequant<<<grid, 256>>>: dequantises step `expected` (or *dev_seq) from its slot into out.
 * Ungated (after a host wait; the host checked the slot header): n = expect_n. Gated: thread 0 of
 * every block reads the verdict of ple_wait_gate from gates[slot] (device memory); a gate of
 * another step raises ERR_GATE_MISMATCH. Not ok: fills the tokens with NaN. Grid-stride over
 * n * items_per_token items of 8 elements.
 */
extern "C" __global__ void __launch_bounds__(DEQUANT_BLOCK) ple_dequant(DequantParams p) {
    __shared__ u64 s_expected;
    __shared__ u32 s_n, s_ok;
    if (threadIdx.x == 0) {
        u64 expected = (p.flags & FLAG_GRAPH) ? *(volatile u64 *)(p.dctrl + DEV_SEQ) : p.expected;
        u32 ok = 1, n = p.expect_n;
        if (p.flags & FLAG_GATED) {
            volatile Gate *g = ((volatile Gate *)(p.dctrl + DEV_GATES)) + (expected % p.slots);
            u64 gseq = g->seq;
            if (gseq == expected) {
                ok = g->ok;
                n = g->num_tokens;
            } else {
                ok = 0;
                n = p.expect_n ? p.expect_n : p.capacity;
                if (blockIdx.x == 0)
                    raise_error(p.ctrl, p.dctrl, ERR_GATE_MISMATCH, (u32)(expected % p.slots),
                                expected, gseq);
            }
        }
        if (n > p.capacity) n = p.capacity; /* never write past what the host checked */
        s_expected = expected;
        s_n = n;
        s_ok = ok;
    }
    __syncthreads();
    u64 expected = s_expected;
    u32 n = s_n;
    if (!s_ok) {
        switch (p.dtype) {
        case DT_F32: nan_fill<DT_F32>(p, n); break;
        case DT_F16: nan_fill<DT_F16>(p, n); break;
        case DT_BF16: nan_fill<DT_BF16>(p, n); break;
        default: break;
        }
        return;
    }
    switch (p.dtype) {
    case DT_F32: body_for<DT_F32>(p, expected, n); break;
    case DT_F16: body_for<DT_F16>(p, expected, n); break;
    case DT_BF16: body_for<DT_BF16>(p, expected, n); break;
    default: break; /* validated on the host */
    }
}

/*
 * ple_graph_advance<<<1, 1>>>: last node of a captured step. Reports the step just handled to the
 * host (consumed = *dev_seq, so the worker may reuse its slot) and moves to the next step.
 */
extern "C" __global__ void ple_graph_advance(AdvanceParams p) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    volatile u64 *s = (volatile u64 *)(p.dctrl + DEV_SEQ);
    u64 cur = *s;
    *(volatile u64 *)(p.ctrl + CTRL_CONSUMED) = cur;
    __threadfence_system();
    *s = cur + 1;
}

/*
 * ple_graph_set<<<1, 1>>>: ple_graph_prepare, in the engine's stream order: *dev_seq = value and
 * consumed = value - 1, after every earlier replay on the stream reported its step.
 */
extern "C" __global__ void ple_graph_set(SetParams p) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    *(volatile u64 *)(p.dctrl + DEV_SEQ) = p.value;
    *(volatile u64 *)(p.ctrl + CTRL_CONSUMED) = p.value - 1;
    __threadfence_system();
}

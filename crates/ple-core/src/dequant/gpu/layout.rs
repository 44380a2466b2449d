//! What the host and the kernels must agree on: the embedded PTX, the control-block offsets, the
//! `#[repr(C)]` mirrors of the kernels' parameter blocks, error codes, flags and launch geometry.
//! Every value here is checked against `kernels/ple_kernels.cu` by the tests below.

use crate::dequant::cpu::Dtype;
use crate::error::Error;
use crate::model::RowSpec;
use std::time::Duration;

/// The kernels as PTX (compute_80), generated from `kernels/ple_kernels.cu`.
pub const PTX: &str = include_str!("../../../../../kernels/ple_kernels.ptx");
/// PTX ISA version of [`PTX`] (its `.version` line): fixed by the pinned NVRTC (12.2).
pub const PTX_ISA: &str = "8.2";
/// Oldest driver API version that can JIT [`PTX`] (`cuDriverGetVersion`: 12020 = CUDA 12.2, r535).
pub const MIN_DRIVER_VERSION: i32 = 12020;
/// Oldest compute capability the PTX targets.
pub const MIN_COMPUTE_CAPABILITY: (i32, i32) = (8, 0);

/// Threads per block of `ple_dequant`.
pub const DEQUANT_BLOCK: u32 = 256;
/// Output elements per work item of `ple_dequant` (all of one head: `head_dim` must be a
/// multiple of it).
pub const KERNEL_ITEM: usize = 8;

/// Work items of `ple_dequant` per token of `embed_dim` elements (`DequantParams.items_per_token`).
pub fn items_per_token(embed_dim: usize) -> u32 {
    (embed_dim / KERNEL_ITEM) as u32
}

/// Device error codes (`DevError.code`, see the kernels).
pub const ERR_WAIT_TIMEOUT: u32 = 1;
pub const ERR_OVER_CAPACITY: u32 = 2;
pub const ERR_SEQ_MISMATCH: u32 = 3;
pub const ERR_TOKEN_COUNT: u32 = 4;
pub const ERR_CLOSED: u32 = 5;
pub const ERR_STEP_FAILED: u32 = 6;
pub const ERR_GATE_MISMATCH: u32 = 7;

/// `DequantParams.flags`.
pub const FLAG_ACCUMULATE: u32 = 1;
pub const FLAG_GATED: u32 = 2;
pub const FLAG_GRAPH: u32 = 4;
pub const FLAG_ZERO_COPY: u32 = 8;
pub const FLAG_VEC: u32 = 16;

/// Host-mapped control block (bytes): done; closing; the error record and the host's error
/// epoch; consumed and entered (graph replays); the slot headers (each group on its own 64-byte
/// half line or more).
pub const CTRL_DONE: usize = 0;
pub const CTRL_CLOSING: usize = 64;
pub const CTRL_ERR: usize = 128;
pub const CTRL_EPOCH: usize = 192;
pub const CTRL_CONSUMED: usize = 256;
pub const CTRL_ENTERED: usize = 320;
pub const CTRL_HEADERS: usize = 384;
/// Device control block (bytes): dev_seq, the error claim word, the gates.
pub const DEV_SEQ: usize = 0;
pub const DEV_CLAIM: usize = 128;
pub const DEV_GATES: usize = 256;
const _: () = assert!(CTRL_CLOSING >= CTRL_DONE + 8 && CTRL_ERR >= CTRL_CLOSING + 4);
const _: () = assert!(CTRL_EPOCH >= CTRL_ERR + size_of::<DevError>());
const _: () = assert!(CTRL_CONSUMED >= CTRL_EPOCH + 4);
const _: () = assert!(CTRL_ENTERED >= CTRL_CONSUMED + 8);
const _: () = assert!(CTRL_HEADERS >= CTRL_ENTERED + 8 && CTRL_HEADERS % 16 == 0);
const _: () = assert!(DEV_CLAIM >= DEV_SEQ + 8 && DEV_GATES >= DEV_CLAIM + 4);

/// Per-slot header in host-mapped memory (`SlotHeader` in the kernels).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SlotHeader {
    pub seq: u64,
    pub num_tokens: u32,
    pub failed: u32,
}

/// The first device-side error since the host last cleared it (`DevError`); `code` last.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DevError {
    pub code: u32,
    pub slot: u32,
    pub seq: u64,
    pub detail: u64,
    pub reserved: u64,
}

/// Verdict of the wait kernel for one slot (`Gate`, device memory).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Gate {
    pub seq: u64,
    pub num_tokens: u32,
    pub ok: u32,
}

/// Parameters of `ple_wait_gate` (the kernels' `WaitParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WaitParams {
    pub ctrl: u64,
    pub dctrl: u64,
    pub expected: u64,
    pub timeout_ns: u64,
    pub slots: u32,
    pub capacity: u32,
    pub expect_n: u32,
    pub graph: u32,
}

/// Parameters of `ple_dequant` (the kernels' `DequantParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DequantParams {
    pub rows: u64,
    pub slot_stride: u64,
    pub ctrl: u64,
    pub dctrl: u64,
    pub expected: u64,
    pub out: u64,
    pub out_stride: u64,
    pub slots: u32,
    pub capacity: u32,
    pub expect_n: u32,
    pub fmt: i32,
    pub dtype: i32,
    pub flags: u32,
    pub scale: f32,
    /// The heads the step's rows are: `first_head + j · head_stride` for `j < heads`, `heads`
    /// rows per token; the other heads' columns get -0.0 (with `FLAG_ACCUMULATE`: nothing).
    pub first_head: u16,
    pub heads: u16,
    pub head_stride: u16,
    /// The table's geometry: elements per row, bytes per row, work items per token
    /// (`num_heads * head_dim / 8`).
    pub head_dim: u32,
    pub row_bytes: u32,
    pub items_per_token: u32,
}

/// Parameters of `ple_graph_advance`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AdvanceParams {
    pub ctrl: u64,
    pub dctrl: u64,
}

/// Parameters of `ple_graph_set`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SetParams {
    pub ctrl: u64,
    pub dctrl: u64,
    pub value: u64,
}

/// Blocks of `ple_dequant` for `num_tokens` tokens: enough for one item per thread, but no more
/// than can be resident at once (`sm_count * blocks_per_sm`; the kernel is grid-stride). At least 1.
pub fn dequant_grid(
    num_tokens: u32,
    items_per_token: u32,
    sm_count: u32,
    blocks_per_sm: u32,
) -> u32 {
    let items = num_tokens as u64 * items_per_token as u64;
    let needed = items.div_ceil(DEQUANT_BLOCK as u64).max(1);
    let resident = (sm_count.max(1) as u64) * (blocks_per_sm.max(1) as u64);
    needed.min(resident) as u32
}

/// The kernels' `DT_*` value of `dtype`.
pub fn kernel_dtype(dtype: Dtype) -> i32 {
    match dtype {
        Dtype::F32 => 0,
        Dtype::F16 => 1,
        Dtype::Bf16 => 2,
    }
}

/// Whether the kernel may use 16-byte vector loads/stores: `out` and every token row start
/// (`out_stride * elem_size`) are 16-byte aligned.
pub fn vec_ok(out: u64, out_stride: usize, elem_size: usize) -> bool {
    out % 16 == 0 && (out_stride * elem_size) % 16 == 0
}

/// Bytes of one token's rows of `heads` heads (`spec.num_heads`: the whole table).
pub fn token_bytes(spec: &RowSpec, heads: usize) -> usize {
    heads * spec.row_bytes()
}

/// `x` rounded up to a multiple of `a`.
pub fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// Whether `cuStreamWaitValue64(addr, reference, CU_STREAM_WAIT_VALUE_GEQ)` is satisfied by
/// `value`: the driver compares cyclically, `(int64_t)(value - reference) >= 0`.
pub fn stream_wait_geq_satisfied(value: u64, reference: u64) -> bool {
    value.wrapping_sub(reference) as i64 >= 0
}

/// The `done` value that releases every pending device wait on close: the largest step any wait
/// was enqueued for (or published). Any larger value risks the cyclic compare, and `u64::MAX`
/// satisfies no GEQ wait of a step below 2^63.
pub fn release_value(published: u64, max_waited: u64) -> u64 {
    published.max(max_waited)
}

/// Turns a device error record into an [`Error`].
pub fn device_error_to_error(
    code: u32,
    slot: u32,
    seq: u64,
    detail: u64,
    timeout: Duration,
    capacity: u32,
) -> Error {
    let nan = "its output tokens were filled with NaN";
    match code {
        ERR_WAIT_TIMEOUT => Error::Timeout(format!(
            "the device wait for step {seq} timed out after {timeout:?} (done was {detail}); {nan}"
        )),
        ERR_OVER_CAPACITY => Error::State(format!(
            "step {seq} has {detail} tokens, more than the {capacity} the graph was captured \
             for; {nan}"
        )),
        ERR_SEQ_MISMATCH => Error::State(format!(
            "ring slot {slot} held step {detail} when step {seq} was to be consumed (steps \
             submitted out of order, or a replay without its step); {nan}"
        )),
        ERR_TOKEN_COUNT => Error::State(format!(
            "step {seq} was published with {detail} tokens, not the count it was submitted \
             with; {nan}"
        )),
        ERR_CLOSED => Error::State(format!(
            "the handle was closed while a device wait for step {seq} was pending; {nan}"
        )),
        ERR_STEP_FAILED => Error::State(format!(
            "step {seq} failed on the host (ple_wait({seq}) reports why); {nan}"
        )),
        ERR_GATE_MISMATCH => Error::State(format!(
            "the dequant launch of step {seq} found the wait verdict of step {detail} (two \
             launches for ring slot {slot} interleaved on different streams); {nan}"
        )),
        c => Error::Cuda(format!("unknown device error code {c} (step {seq})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RowFormat;
    use std::mem::{offset_of, size_of};

    const SRC: &str = include_str!("../../../../../kernels/ple_kernels.cu");

    fn cu_define(name: &str) -> u64 {
        let pat = format!("#define {name} ");
        let line = SRC
            .lines()
            .find(|l| l.starts_with(&pat))
            .unwrap_or_else(|| panic!("{name} not defined in ple_kernels.cu"));
        let v = line[pat.len()..].split_whitespace().next().unwrap();
        v.trim_end_matches('u').parse().unwrap()
    }

    fn cu_sizeof(name: &str) -> usize {
        let pat = format!("static_assert(sizeof({name}) == ");
        let line = SRC
            .lines()
            .find(|l| l.starts_with(&pat))
            .unwrap_or_else(|| panic!("no size assertion for {name}"));
        line[pat.len()..]
            .split(',')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn launch_geometry() {
        // The shipped model, one token: 320 items of 8 elements -> 2 blocks of 256.
        let ipt = items_per_token(2560);
        assert_eq!(ipt, 320);
        assert_eq!(dequant_grid(1, ipt, 132, 6), 2);
        assert_eq!(dequant_grid(4, ipt, 132, 6), 5); // 1280 items
        // Large steps are capped at what is resident (grid-stride covers the rest).
        assert_eq!(dequant_grid(8192, ipt, 132, 6), 792);
        assert_eq!(dequant_grid(8192, ipt, 0, 0), 1);
        // 16 heads of 64: 128 items per token, half a block
        assert_eq!(dequant_grid(1, items_per_token(1024), 132, 6), 1);
        assert_eq!(dequant_grid(3, items_per_token(1024), 132, 6), 2);
        for dim in [2560usize, 1536, 1024, 8] {
            for n in [1u32, 2, 3, 7, 100, 2048, 8192, 1 << 20] {
                let g = dequant_grid(n, items_per_token(dim), 132, 6) as u64;
                assert!(g >= 1);
                assert!(
                    g * DEQUANT_BLOCK as u64
                        <= (n as u64 * dim as u64 / 8).max(DEQUANT_BLOCK as u64) + 255
                );
            }
        }
    }

    #[test]
    fn vector_access_and_token_sizes() {
        assert!(vec_ok(0x1000, 2560, 4));
        assert!(vec_ok(0x1000, 2568, 2));
        assert!(!vec_ok(0x1000, 2561, 4)); // rows 4 B apart from alignment
        assert!(!vec_ok(0x1000, 2564, 2)); // 5128 B rows
        assert!(!vec_ok(0x1008, 2560, 4));
        let s = |f| RowSpec::shipped(f, 1.0);
        assert_eq!(token_bytes(&s(RowFormat::Nvfp4), 16), 1440);
        assert_eq!(token_bytes(&s(RowFormat::Fp8), 16), 2560);
        assert_eq!(token_bytes(&s(RowFormat::Bf16), 16), 5120);
        assert_eq!(token_bytes(&s(RowFormat::F32), 16), 10240);
        assert_eq!(token_bytes(&s(RowFormat::F32), 3), 1920);
        assert_eq!(token_bytes(&s(RowFormat::Nvfp4), 5), 450);
        let other = RowSpec {
            head_dim: 64,
            num_heads: 12,
            ..s(RowFormat::Nvfp4)
        };
        assert_eq!(token_bytes(&other, 12), 12 * 36);
    }

    #[test]
    fn the_close_sentinel_releases_every_pending_stream_wait() {
        // The cyclic GEQ compare: u64::MAX (the obvious "release everyone") satisfies no wait.
        assert!(!stream_wait_geq_satisfied(u64::MAX, 1));
        assert!(!stream_wait_geq_satisfied(u64::MAX, 12_345));
        assert!(stream_wait_geq_satisfied(7, 7) && !stream_wait_geq_satisfied(6, 7));
        for (published, waited) in [(0u64, 5u64), (10, 3), (1 << 40, (1 << 40) + 64), (9, 9)] {
            let v = release_value(published, waited);
            for seq in 1..=published.max(waited).min(200) {
                assert!(
                    stream_wait_geq_satisfied(v, seq),
                    "{published} {waited} {seq}"
                );
            }
            for seq in published.saturating_sub(100)..=published.max(waited) {
                if seq > 0 {
                    assert!(
                        stream_wait_geq_satisfied(v, seq),
                        "{published} {waited} {seq}"
                    );
                }
            }
            assert!(v >= published, "done never moves backwards");
        }
    }

    #[test]
    fn parameter_layouts_match_the_kernels() {
        assert_eq!(size_of::<SlotHeader>(), cu_sizeof("SlotHeader"));
        assert_eq!(size_of::<DevError>(), cu_sizeof("DevError"));
        assert_eq!(size_of::<Gate>(), cu_sizeof("Gate"));
        assert_eq!(size_of::<WaitParams>(), cu_sizeof("WaitParams"));
        assert_eq!(size_of::<DequantParams>(), cu_sizeof("DequantParams"));
        assert_eq!(size_of::<AdvanceParams>(), cu_sizeof("AdvanceParams"));
        assert_eq!(size_of::<SetParams>(), cu_sizeof("SetParams"));
        // Field order as in the .cu file.
        assert_eq!(offset_of!(WaitParams, timeout_ns), 24);
        assert_eq!(offset_of!(WaitParams, graph), 44);
        assert_eq!(offset_of!(DequantParams, out_stride), 48);
        assert_eq!(offset_of!(DequantParams, slots), 56);
        assert_eq!(offset_of!(DequantParams, fmt), 68);
        assert_eq!(offset_of!(DequantParams, flags), 76);
        assert_eq!(offset_of!(DequantParams, scale), 80);
        assert_eq!(offset_of!(DequantParams, first_head), 84);
        assert_eq!(offset_of!(DequantParams, heads), 86);
        assert_eq!(offset_of!(DequantParams, head_stride), 88);
        assert_eq!(offset_of!(DequantParams, head_dim), 92);
        assert_eq!(offset_of!(DequantParams, row_bytes), 96);
        assert_eq!(offset_of!(DequantParams, items_per_token), 100);
        assert_eq!(offset_of!(SetParams, value), 16);
        assert_eq!(offset_of!(SlotHeader, failed), 12);
        assert_eq!(offset_of!(DevError, detail), 16);
        assert_eq!(offset_of!(Gate, ok), 12);
    }

    #[test]
    fn constants_match_the_kernels() {
        let pairs: &[(&str, u64)] = &[
            ("ERR_WAIT_TIMEOUT", ERR_WAIT_TIMEOUT as u64),
            ("ERR_OVER_CAPACITY", ERR_OVER_CAPACITY as u64),
            ("ERR_SEQ_MISMATCH", ERR_SEQ_MISMATCH as u64),
            ("ERR_TOKEN_COUNT", ERR_TOKEN_COUNT as u64),
            ("ERR_CLOSED", ERR_CLOSED as u64),
            ("ERR_STEP_FAILED", ERR_STEP_FAILED as u64),
            ("ERR_GATE_MISMATCH", ERR_GATE_MISMATCH as u64),
            ("FLAG_ACCUMULATE", FLAG_ACCUMULATE as u64),
            ("FLAG_GATED", FLAG_GATED as u64),
            ("FLAG_GRAPH", FLAG_GRAPH as u64),
            ("FLAG_ZERO_COPY", FLAG_ZERO_COPY as u64),
            ("FLAG_VEC", FLAG_VEC as u64),
            ("CTRL_DONE", CTRL_DONE as u64),
            ("CTRL_CLOSING", CTRL_CLOSING as u64),
            ("CTRL_ERR", CTRL_ERR as u64),
            ("CTRL_EPOCH", CTRL_EPOCH as u64),
            ("CTRL_CONSUMED", CTRL_CONSUMED as u64),
            ("CTRL_ENTERED", CTRL_ENTERED as u64),
            ("CTRL_HEADERS", CTRL_HEADERS as u64),
            ("DEV_SEQ", DEV_SEQ as u64),
            ("DEV_CLAIM", DEV_CLAIM as u64),
            ("DEV_GATES", DEV_GATES as u64),
            ("DEQUANT_BLOCK", DEQUANT_BLOCK as u64),
            ("KERNEL_ITEM", KERNEL_ITEM as u64),
            ("FMT_NVFP4", RowFormat::Nvfp4.kernel_code() as u64),
            ("FMT_FP8", RowFormat::Fp8.kernel_code() as u64),
            ("FMT_BF16", RowFormat::Bf16.kernel_code() as u64),
            ("FMT_F32", RowFormat::F32.kernel_code() as u64),
            ("DT_F32", kernel_dtype(Dtype::F32) as u64),
            ("DT_F16", kernel_dtype(Dtype::F16) as u64),
            ("DT_BF16", kernel_dtype(Dtype::Bf16) as u64),
        ];
        for &(name, v) in pairs {
            assert_eq!(cu_define(name), v, "{name}");
        }
        // The V2 attribute (pairs with cuStreamWaitValue64_v2).
        assert_eq!(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS
                as i32,
            122
        );
    }

    #[test]
    fn embedded_ptx_is_the_kernels() {
        assert!(PTX.contains(&format!("\n.version {PTX_ISA}\n")), "ISA line");
        assert!(PTX.contains("\n.target sm_80\n"));
        assert!(PTX.contains("Cuda compilation tools, release 12.2"));
        for k in [
            "ple_wait_gate",
            "ple_dequant",
            "ple_graph_advance",
            "ple_graph_set",
        ] {
            assert!(
                PTX.contains(&format!(".visible .entry {k}(")),
                "kernel {k} missing from the PTX"
            );
        }
        assert!(!PTX.contains('\0'));
        // No FMA in the dequant path: -fmad=false plus explicit _rn intrinsics.
        assert!(
            !PTX.contains("fma.rn.f32"),
            "PTX contains a fused multiply-add"
        );
        // Zero-copy rows are read with ld.global.cv (never a stale cached line of a reused slot).
        assert!(PTX.contains("ld.global.cv.v4.u32") && PTX.contains("ld.global.cv.u8"));
        // The error record is claimed with an atomic on device memory.
        assert!(PTX.contains("atom.cas.b32") || PTX.contains("atom.global.cas.b32"));
    }

    #[test]
    fn device_errors_become_errors() {
        let t = Duration::from_millis(5);
        let e = device_error_to_error(ERR_WAIT_TIMEOUT, 1, 7, 6, t, 0);
        assert_eq!(e.kind(), crate::ErrorKind::Timeout);
        assert!(
            e.to_string().contains("step 7") && e.to_string().contains("NaN"),
            "{e}"
        );
        let e = device_error_to_error(ERR_OVER_CAPACITY, 0, 9, 300, t, 256);
        assert_eq!(e.kind(), crate::ErrorKind::State);
        assert!(
            e.to_string().contains("300") && e.to_string().contains("256"),
            "{e}"
        );
        let e = device_error_to_error(ERR_STEP_FAILED, 1, 9, 0, t, 0);
        assert_eq!(e.kind(), crate::ErrorKind::State);
        assert!(e.to_string().contains("ple_wait(9)"), "{e}");
        let e = device_error_to_error(ERR_GATE_MISMATCH, 1, 9, 7, t, 0);
        assert!(e.to_string().contains("step 7"), "{e}");
        assert_eq!(
            device_error_to_error(99, 0, 0, 0, t, 0).kind(),
            crate::ErrorKind::Cuda
        );
    }
}

//! The GPU side: the CUDA driver ([`driver`]), the device's primary context, the ring's pinned
//! staging mapped into the device, the CPU → GPU handshake and the dequant kernels. The pipeline
//! owns one [`GpuSide`] per handle opened with `cuda_device >= 0` (`crate::step::pipeline`).
//! `docs/GPU.md` describes the design and how to run the device checks.
//!
//! # Files
//! - [`driver`]: loading libcuda (`libcuda.so.1` first) and every entry point, error texts,
//!   context and capture-mode guards, kernel launch.
//! - [`layout`]: what host and kernels share (offsets, parameter blocks, codes, geometry).
//! - `side.rs`: [`GpuSide`] itself: open, accessors, close.
//! - `handshake.rs`: the worker's side (slot reuse, upload, publish) and the device error record.
//! - `launch.rs`: the engine's side (`fuse`, CUDA Graph mode, argument checks).
//! - [`engine_stream`]: a stand-in for an engine's CUDA side (demo, tools).
//!
//! # Driver and context
//! The kernels are PTX for `compute_80` embedded in the library ([`layout::PTX`], generated from
//! `kernels/ple_kernels.cu` by `scripts/gen-ptx.py` with NVRTC 12.2): the driver JIT-compiles
//! them for the device (sm_80 … sm_121). PTX ISA 8.2 needs a driver of CUDA 12.2 or newer (Linux
//! r535+); an older driver fails in [`GpuSide::new`] with [`Error::Unsupported`]. libple never
//! creates or destroys a CUDA context and never touches the engine's streams beyond enqueueing on
//! them: it retains the device's **primary** context (the CUDA runtime's), pushes it around its
//! own driver calls and releases it on drop. The engine's stream must belong to that context.
//!
//! # The dequantisation rule (CPU and GPU must match bit for bit)
//! Element `e` (0..2560) of a token is element `j = e % 160` of its row `h = e / 160`; in fp32:
//! - nvfp4: `v = mul_rn(mul_rn(e2m1(code j), e4m3(scale[j / 16])), global_scale)`; code j is the
//!   low nibble of byte j/2 when j is even, the high nibble when odd; the first product is exact.
//! - fp8: `v = mul_rn(e4m3(byte j), global_scale)`.
//! - bf16: `v = bf16 j widened exactly`; no multiply (the global scale of a bf16 table is 1.0).
//! - f32: `v = f32 j` (bytes `4j..4j+3`, little-endian) as is; no multiply (global scale 1.0).
//! - e4m3 is "fn": bias 7, no infinities, 0x7F/0xFF NaN, exponent 0 subnormal `m · 2^-9`.
//! - `PLE_FUSE_ACCUMULATE`: `v = add_rn(old, v)` with `old` the existing output element widened
//!   exactly to fp32; one add, never fused with the multiply (no FMA).
//! - Store: one round-to-nearest-even conversion to the output dtype (f32: none); subnormals are
//!   kept (no flush to zero); overflow rounds to ±inf; **every NaN is written as the canonical
//!   positive quiet NaN** (f32 `0x7FC00000`, f16 `0x7E00`, bf16 `0x7FC0`).
//! - Token `t` is written at `out + t * out_stride` elements; the stride padding is never touched.
//!
//! # Handshake
//! Ring slot of step `seq` is `seq % slots` ([`GpuSide::slot_of`]); the pipeline must use it.
//! Before gathering step `seq`, the worker calls [`GpuSide::begin_step`]: it waits until no
//! kernel may still read the slot (the events of earlier direct `fuse` launches; in graph mode
//! the `consumed` word), so the gather never overwrites rows a kernel is reading. The worker
//! gathers into [`GpuSide::staging`] (pinned, mapped into the device), then [`GpuSide::upload`]
//! writes the slot header `{seq, num_tokens, failed = 0}` and publishes `done = seq` (Release) in
//! the host-mapped control block. In device-wait modes the kernel reads the rows straight from the
//! mapped staging (zero-copy): libple's own stream plays no part in a step, so nothing the engine
//! queues can delay `done` (no hidden cross-stream dependency). In host-wait mode `upload` first
//! copies the rows host → device on libple's own stream and polls its event (with the handle's
//! timeout); the engine's kernel is enqueued only after the host saw `done`, so the engine's stream
//! never depends on that copy either. A failed step is published with [`GpuSide::publish_failed`]
//! (header `failed = 1`, never blocks) so device waiters are released. A kernel consumes step
//! `seq` only if `done >= seq` and the slot header says `seq` (never "flag set": stale rows are
//! impossible). A launch that cannot consume its step raises a device error
//! ([`GpuSide::device_error`], `ple_check_device`) and fills its output tokens with NaN.
//!
//! Waits ([`WaitKind`]): `Host` (the caller's host wait, the host checks the header, then the
//! kernel), `StreamOp` (`cuStreamWaitValue64(done >= seq)` on the engine's stream, then the
//! one-thread gate kernel that checks the header once), `SpinKernel` (the gate kernel polls `done`
//! with a `%globaltimer` timeout). On close, `done` is set to the largest step any wait was
//! enqueued for (the driver's GEQ compare is cyclic: `u64::MAX` would release nobody) and the
//! `closing` word stops spin waits.
//!
//! # CUDA Graphs
//! `ple_dequant_fuse` bakes `seq` into what it enqueues, so it refuses to be captured; so does
//! [`GpuSide::graph_prepare`] (a captured prepare would reset the counter on every replay).
//! 1. `graph_prepare(stream, base)` (not under capture, no replay in flight) enqueues
//!    `dev_seq = base, consumed = base - 1` on the engine's stream.
//! 2. Capture [`GpuSide::fuse_graph`]`(stream, capacity, ...)` once: gate (spin wait for
//!    `done >= *dev_seq` whatever the wait mode), `ple_dequant` of step `*dev_seq` (token count
//!    from the header; more than `capacity` raises `ERR_OVER_CAPACITY`), `ple_graph_advance`
//!    (`consumed = *dev_seq`, then `*dev_seq += 1`).
//! 3. Submit steps `base, base+1, …` in order and replay once per step: replay k consumes step
//!    `base + k`. The worker reuses a slot only after a replay consumed its previous step. After a
//!    device error, call `graph_prepare` again with the next step: the pipeline first frees the
//!    ready steps replays already consumed.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod driver;
pub mod engine_stream;
mod handshake;
mod launch;
pub mod layout;
mod poll;
mod side;

pub use driver::probe_driver;
pub use engine_stream::EngineStream;
pub use layout::{MIN_COMPUTE_CAPABILITY, MIN_DRIVER_VERSION, PTX, PTX_ISA};
pub use side::GpuSide;

use crate::error::{Error, Result};
use crate::model::RowSpec;

/// How a handle with a GPU orders the dequant kernel after the step's rows (`ple_options.wait_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WaitMode {
    /// A device wait where the GPU supports one (stream memory operations, else the spin kernel).
    #[default]
    Auto,
    /// The host waits (`ple_wait`) before enqueueing the kernel.
    Host,
    /// `cuStreamWaitValue64(done >= seq)` on the engine's stream; refused where unsupported.
    StreamOp,
    /// A one-thread kernel polling the mapped `done` word, with a timeout.
    SpinKernel,
}

/// How `fuse` orders the kernel after the step's rows (resolved from [`WaitMode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitKind {
    /// The caller's host wait (`ple_wait`), then the kernel.
    Host,
    /// `cuStreamWaitValue64(done >= seq)` on the engine's stream, then the gate kernel.
    StreamOp,
    /// A one-thread spin kernel on the engine's stream, with a timeout.
    SpinKernel,
}

impl WaitKind {
    /// Whether the kernel reads the rows from the mapped staging (every device wait): the
    /// step then involves no stream of libple's.
    pub fn zero_copy(self) -> bool {
        self != WaitKind::Host
    }
}

/// Resolves a [`WaitMode`] for a device that does (`stream_ops`) or does not support 64-bit
/// stream memory operations. Auto: stream op where supported, else the spin kernel. Asking for
/// StreamOp on a device without support is an error: such a wait may "succeed" and never
/// synchronise (GB10; `docs/GPU.md`).
pub fn select_wait(mode: WaitMode, stream_ops: bool) -> Result<WaitKind> {
    match mode {
        WaitMode::Auto if stream_ops => Ok(WaitKind::StreamOp),
        WaitMode::Auto => Ok(WaitKind::SpinKernel),
        WaitMode::Host => Ok(WaitKind::Host),
        WaitMode::StreamOp if stream_ops => Ok(WaitKind::StreamOp),
        WaitMode::StreamOp => Err(Error::Unsupported(
            "wait_mode PLE_WAIT_STREAM_OP, but the device reports no 64-bit stream memory \
             operations (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS = 0); use \
             PLE_WAIT_AUTO or PLE_WAIT_SPIN_KERNEL"
                .into(),
        )),
        WaitMode::SpinKernel => Ok(WaitKind::SpinKernel),
    }
}

/// The GPU entry points that take the engine's stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamCall {
    /// `ple_dequant_fuse`: bakes its step into what it enqueues.
    Fuse,
    /// `ple_graph_prepare`: resets the graph's step counter.
    GraphPrepare,
    /// `ple_dequant_fuse_graph`: made to be captured.
    FuseGraph,
}

impl StreamCall {
    pub fn name(self) -> &'static str {
        match self {
            StreamCall::Fuse => "ple_dequant_fuse",
            StreamCall::GraphPrepare => "ple_graph_prepare",
            StreamCall::FuseGraph => "ple_dequant_fuse_graph",
        }
    }
}

/// Whether `call` may be enqueued on a stream that is (`capturing`) or is not being captured
/// into a CUDA graph: a captured `fuse` would replay its one step forever, a captured prepare
/// would reset the step counter on every replay; `fuse_graph` is meant to be captured.
pub fn capture_allowed(call: StreamCall, capturing: bool) -> Result<()> {
    if !capturing {
        return Ok(());
    }
    match call {
        StreamCall::FuseGraph => Ok(()),
        StreamCall::Fuse => crate::invalid!(
            "ple_dequant_fuse cannot be captured into a CUDA graph (a replay would reuse its \
             step); capture ple_dequant_fuse_graph after ple_graph_prepare instead"
        ),
        StreamCall::GraphPrepare => crate::invalid!(
            "ple_graph_prepare cannot be captured into a CUDA graph (every replay would reset \
             the graph's step counter); call it on the stream, outside capture, before the first \
             replay"
        ),
    }
}

/// Where the driver says `out` lives, as far as the output checks need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutPlacement {
    /// Device (or managed) memory of this device.
    pub device_memory: bool,
    /// Memory mapped through the virtual memory management API (`cuMemMap`: PyTorch's
    /// expandable segments, vLLM): `cuMemGetAddressRange` then reports only the one physical
    /// chunk that holds `out`, not the engine's tensor. Probed only where
    /// [`vmm_probe_needed`]; false where not probed.
    pub vmm: bool,
    /// `cuMemGetAddressRange` of `out`: (base, size), where the driver reports one.
    pub range: Option<(u64, u64)>,
    /// Whether the last byte the step writes is device memory of this device too.
    pub last_byte_mapped: bool,
}

/// Whether the output check needs to know if `out` is VMM memory: only where the driver's range
/// of `out` does not cover all `extent` bytes from it. Where it does, [`check_out`]'s verdict is
/// the same either way (a `cuMemAlloc` allocation holds the extent; a VMM chunk holding it is
/// mapped memory of the same device up to its last byte), so the probe, a call a driver may
/// count as unsafe during an engine's global-mode capture, is skipped.
pub fn vmm_probe_needed(out: u64, extent: u64, range: Option<(u64, u64)>) -> bool {
    match (range, out.checked_add(extent)) {
        (Some((base, size)), Some(end)) => out < base || end > base.saturating_add(size),
        _ => true,
    }
}

/// Checks that `out` can take `extent` bytes of `dtype` elements: non-NULL, aligned for the
/// dtype, device memory, and inside its allocation. A `cuMemAlloc` allocation's range is exact,
/// so the extent must fit in it; a VMM mapping's range is one chunk of a larger tensor, so there
/// only the last byte's mapping is checked (what the driver can tell soundly).
pub fn check_out(out: u64, extent: u64, elem: usize, at: &OutPlacement) -> Result<()> {
    if out == 0 {
        return crate::invalid!("out is NULL");
    }
    if out % elem as u64 != 0 {
        return crate::invalid!(
            "out ({out:#x}) is not aligned to its {elem}-byte elements (a misaligned store \
             faults the engine's context)"
        );
    }
    if !at.device_memory {
        return crate::invalid!("out ({out:#x}) is not device memory of the handle's device");
    }
    let Some(end) = out.checked_add(extent) else {
        return crate::invalid!("out ({out:#x}) + {extent} B overflows");
    };
    match at.range {
        Some((base, size)) if !at.vmm => {
            let alloc_end = base.saturating_add(size);
            if out < base || end > alloc_end {
                return crate::invalid!(
                    "out buffer too small: the step needs {extent} B from {out:#x}, its \
                     allocation ends {} B after it",
                    alloc_end.saturating_sub(out)
                );
            }
        }
        _ if extent > 0 && !at.last_byte_mapped => {
            return crate::invalid!(
                "out buffer too small: the step needs {extent} B from {out:#x}, but byte {} \
                 after it is not mapped device memory",
                extent - 1
            );
        }
        _ => {}
    }
    Ok(())
}

/// What [`GpuSide::new`] needs.
#[derive(Clone, Debug)]
pub struct GpuConfig {
    /// CUDA device ordinal (`ple_options.cuda_device`).
    pub device: i32,
    /// How the kernel waits for a step.
    pub wait_mode: WaitMode,
    /// Ring slots (`max_in_flight`).
    pub slots: usize,
    /// Largest step (`max_tokens_per_step`).
    pub max_tokens: usize,
    /// The heads whose rows a step holds (`[tokens][heads.len()][row_bytes]`; all the table's
    /// heads unless the handle is a head shard). The kernel writes -0.0 in the other heads' columns.
    pub heads: crate::shard::Heads,
    /// The table's row format, global scale and geometry.
    pub spec: RowSpec,
    /// Timeout of device spin waits and of waiting for a slot to be free (`wait_timeout_us`).
    pub timeout_us: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_mode_selection() {
        use WaitKind::*;
        assert_eq!(select_wait(WaitMode::Auto, true).unwrap(), StreamOp);
        assert_eq!(select_wait(WaitMode::Auto, false).unwrap(), SpinKernel);
        assert_eq!(select_wait(WaitMode::Host, true).unwrap(), Host);
        assert_eq!(select_wait(WaitMode::Host, false).unwrap(), Host);
        assert_eq!(select_wait(WaitMode::StreamOp, true).unwrap(), StreamOp);
        assert!(matches!(
            select_wait(WaitMode::StreamOp, false),
            Err(Error::Unsupported(_))
        ));
        assert_eq!(select_wait(WaitMode::SpinKernel, true).unwrap(), SpinKernel);
        assert!(!Host.zero_copy() && StreamOp.zero_copy() && SpinKernel.zero_copy());
    }

    #[test]
    fn prepare_and_fuse_are_refused_under_capture_fuse_graph_is_not() {
        for call in [
            StreamCall::Fuse,
            StreamCall::GraphPrepare,
            StreamCall::FuseGraph,
        ] {
            assert!(capture_allowed(call, false).is_ok(), "{call:?}");
        }
        let e = capture_allowed(StreamCall::GraphPrepare, true).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("ple_graph_prepare"), "{e}");
        let e = capture_allowed(StreamCall::Fuse, true).unwrap_err();
        assert!(e.to_string().contains("ple_dequant_fuse_graph"), "{e}");
        assert!(capture_allowed(StreamCall::FuseGraph, true).is_ok());
        assert_eq!(StreamCall::GraphPrepare.name(), "ple_graph_prepare");
    }

    fn legacy(base: u64, size: u64) -> OutPlacement {
        OutPlacement {
            device_memory: true,
            vmm: false,
            range: Some((base, size)),
            last_byte_mapped: true,
        }
    }

    #[test]
    fn vmm_is_probed_only_where_the_range_does_not_cover_the_extent() {
        let (base, size) = (0x1000_0000u64, 4096u64);
        assert!(!vmm_probe_needed(base, size, Some((base, size))));
        assert!(!vmm_probe_needed(base + 96, 4000, Some((base, size))));
        assert!(vmm_probe_needed(base + 96, 4001, Some((base, size))));
        assert!(vmm_probe_needed(base - 4, 8, Some((base, size))));
        assert!(vmm_probe_needed(base, 16, None));
        assert!(vmm_probe_needed(u64::MAX - 3, 16, Some((0, u64::MAX))));
        // Where the probe is skipped, check_out's verdict does not depend on what it would say.
        for (out, extent) in [(base, size), (base + 96, 4000), (base + 4092, 4)] {
            assert!(!vmm_probe_needed(out, extent, Some((base, size))));
            for vmm in [false, true] {
                let at = OutPlacement {
                    vmm,
                    ..legacy(base, size)
                };
                assert!(
                    check_out(out, extent, 4, &at).is_ok(),
                    "{out:#x}+{extent} vmm {vmm}"
                );
            }
        }
    }

    #[test]
    fn output_checks_accept_vmm_sub_allocations_and_refuse_what_is_unsound() {
        let mb = 1u64 << 20;
        // A cuMemAlloc buffer: exact range.
        assert!(check_out(0x1000_0000, 4096, 4, &legacy(0x1000_0000, 4096)).is_ok());
        let e = check_out(0x1000_0000, 4097, 4, &legacy(0x1000_0000, 4096)).unwrap_err();
        assert!(e.to_string().contains("too small"), "{e}");
        // A tensor inside a VMM segment spanning two 2 MiB chunks: the range is one chunk.
        let vmm = OutPlacement {
            device_memory: true,
            vmm: true,
            range: Some((0x2000_0000, 2 * mb)),
            last_byte_mapped: true,
        };
        assert!(check_out(0x2000_0000 + mb, 2 * mb, 2, &vmm).is_ok());
        let unmapped = OutPlacement {
            last_byte_mapped: false,
            ..vmm
        };
        assert!(check_out(0x2000_0000 + mb, 2 * mb, 2, &unmapped).is_err());
        // Alignment for the dtype (f32: 4, f16/bf16: 2), NULL, host memory, overflow.
        let e = check_out(0x1000_0002, 16, 4, &legacy(0x1000_0000, 4096)).unwrap_err();
        assert!(e.to_string().contains("aligned"), "{e}");
        assert!(check_out(0x1000_0002, 16, 2, &legacy(0x1000_0000, 4096)).is_ok());
        assert!(check_out(0x1000_0001, 16, 2, &legacy(0x1000_0000, 4096)).is_err());
        assert!(check_out(0, 16, 2, &legacy(0, 4096)).is_err());
        let host = OutPlacement {
            device_memory: false,
            ..legacy(0x1000_0000, 4096)
        };
        assert!(check_out(0x1000_0000, 16, 4, &host).is_err());
        assert!(check_out(u64::MAX - 3, 16, 4, &legacy(0, u64::MAX)).is_err());
    }
}

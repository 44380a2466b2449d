//! The GPU entry points: fused dequant on the engine's stream, CUDA Graph mode, device errors.

use crate::boundary::nonnull;
use crate::handle::{handle_ref, ple_handle};
use crate::status::ple_status;
use crate::types::{out_args, ple_dtype, ple_fuse_flags};
use std::ffi::c_void;

/// Dequantises step `seq`'s rows into the engine's device buffer `out` (a `CUdeviceptr`) with one
/// kernel enqueued on the engine's `cuda_stream` (a `CUstream`/`cudaStream_t`; libple only
/// enqueues on it). The step is ordered before the kernel by the handle's wait mode. Layout, dtype,
/// stride and flags as in `ple_dequant_cpu`. Needs a handle opened with `cuda_device >= 0`.
/// `out` must be device memory of the handle's device, aligned to its dtype, holding the step's
/// tokens: a `cuMemAlloc` allocation must contain them; memory mapped with the VMM API
/// (`cuMemMap`: PyTorch expandable segments, vLLM) is accepted when the last byte the step writes
/// is mapped device memory. In device-wait modes no stream of libple's takes part, so work the
/// engine queues after this call cannot delay the step (where the kernel reads the rows from:
/// docs/GPU.md, "Zero-copy vs copy"). A step that cannot be consumed (it failed on
/// the host, its wait timed out, the handle closed) is never silent: its kernel fills the output
/// tokens with NaN and raises a device error (`ple_check_device`); `ple_wait(seq)` returns a
/// host failure. Refused while `cuda_stream` is being captured (use `ple_dequant_fuse_graph`).
///
/// # Safety
/// `cuda_stream` is a live `CUstream` of the handle's device's context (or NULL for the legacy
/// default stream), and `out` a device allocation of that context holding the step's output;
/// libple only enqueues work on them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_dequant_fuse(
    handle: *mut ple_handle,
    cuda_stream: *mut c_void,
    seq: u64,
    out: *mut c_void,
    out_dtype: ple_dtype,
    out_stride: usize,
    flags: ple_fuse_flags,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        nonnull(out, "out")?;
        let args = out_args(out_dtype, out_stride, flags)?;
        h.dequant_fuse(cuda_stream, seq, out as u64, args)
    })
}

/// CUDA Graph mode, step 1. Enqueues on `cuda_stream` (the engine's `CUstream`) "the next graph
/// replay consumes step `base_seq`". Then capture `ple_dequant_fuse_graph` once and replay it
/// once per step: replay k consumes step `base_seq + k`, so submit steps `base_seq`,
/// `base_seq + 1`, ... in order, and consume every one of them by exactly one replay (a ring
/// slot is reused only after a replay consumed its step). Call it on the stream
/// outside capture (while `cuda_stream` is capturing it returns `PLE_E_INVALID_ARGUMENT`: a
/// captured prepare would reset the step counter on every replay), when no replay is in flight,
/// and again with the next step after a device error: ready steps replays already consumed are
/// then released first, and `base_seq` must come after the last step a replay consumed.
/// Needs `cuda_device >= 0`.
///
/// # Safety
/// `cuda_stream` is a live `CUstream` of the handle's device's context (or NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_graph_prepare(
    handle: *mut ple_handle,
    cuda_stream: *mut c_void,
    base_seq: u64,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        h.graph_prepare(cuda_stream, base_seq)
    })
}

/// CUDA Graph mode, step 2: enqueues on `cuda_stream` a device wait for the current graph step
/// (a spin kernel with the handle's timeout, whatever `wait_mode` is), its dequantisation into
/// `out` (a `CUdeviceptr` holding `capacity_tokens` tokens at `out_stride` elements of `out_dtype`)
/// and the advance to the next step, with no step number baked in: capture this call into a CUDA
/// graph once, after `ple_graph_prepare`. A step with more than `capacity_tokens` tokens is not
/// written: its tokens up to the capacity are filled with NaN and a device error is raised
/// (`ple_check_device`). `flags` as in `ple_dequant_fuse`. The graph holds libple's addresses:
/// stop replaying, synchronise the stream and destroy the graph before `ple_close` (close waits
/// for a replay that has started, not for one still queued).
///
/// # Safety
/// `cuda_stream` is a live `CUstream` of the handle's device's context (or NULL), and `out` a
/// device allocation of that context holding `capacity_tokens` tokens of output for as long as
/// the captured graph is replayed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_dequant_fuse_graph(
    handle: *mut ple_handle,
    cuda_stream: *mut c_void,
    capacity_tokens: u32,
    out: *mut c_void,
    out_dtype: ple_dtype,
    out_stride: usize,
    flags: ple_fuse_flags,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        nonnull(out, "out")?;
        let args = out_args(out_dtype, out_stride, flags)?;
        h.dequant_fuse_graph(cuda_stream, capacity_tokens, out as u64, args)
    })
}

/// Reports (and clears) the first error the handle's kernels raised on the device since the last
/// call: a device wait that timed out (`PLE_E_TIMEOUT`), a step that failed on the host, a graph
/// step larger than the captured capacity, a ring slot holding another step, a wait cut short by
/// `ple_close` (`PLE_E_STATE`). The affected kernels filled their output tokens with NaN (the
/// canonical quiet NaN of the dtype). `PLE_OK` when there was none. Synchronise the stream first
/// to see a kernel's error. Later errors while one is pending are not recorded (each launch still
/// fills NaN). `ple_dequant_fuse*` also return a pending device error instead of enqueueing.
///
/// # Safety
/// Safe for any argument values (the handle is looked up, never dereferenced).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_check_device(handle: *mut ple_handle) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        h.check_device()
    })
}

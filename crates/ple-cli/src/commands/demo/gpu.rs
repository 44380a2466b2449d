//! The demo's GPU pass (when a CUDA device can be opened).

use super::script::script;
use super::{Handle, check};
use ple::*;
use ple_core::error::{Error, Result};
use std::path::Path;
use std::time::Instant;

/// Elements of one token's output row.
use super::DIM;

/// With a GPU: the engine's script (prefill, prompts, 16 decode steps) through `ple_dequant_fuse`
/// on an engine stream, each step compared bit for bit with `ple_dequant_cpu` of the same step on
/// a CPU handle. `None` when no CUDA device can be opened.
pub(super) fn gpu_pass(
    table_dir: &Path,
    _meta: &ple_core::format::table::TableMeta,
) -> Result<Option<String>> {
    let gpu = match Handle::open(table_dir, PLE_PREFETCH_AUTO, 0) {
        Err(_) => return Ok(None),
        Ok(h) => h,
    };
    let cpu = Handle::open(table_dir, PLE_PREFETCH_AUTO, -1)?;
    let steps = script(16, 500);
    let max_tokens = steps.iter().map(|s| s.tokens.len()).max().unwrap_or(1);
    let engine = ple_core::dequant::gpu::EngineStream::new(0, max_tokens * DIM * 4)?;
    let mut info = ple_table_info {
        struct_size: std::mem::size_of::<ple_table_info>(),
        // SAFETY: ple_info is plain data (integers and char arrays): all-zero is a valid value.
        ..unsafe { std::mem::zeroed() }
    };
    check(
        // SAFETY: the handle is open; `info` is a writable ple_info with its struct_size set.
        unsafe { ple_table_info(gpu.0, &mut info) },
        "ple_table_info",
    )?;
    let (mut mismatched, mut total_ms) = (0u64, 0.0f64);
    let mut want = vec![0f32; max_tokens * DIM];
    let mut got = vec![0u8; max_tokens * DIM * 4];
    for (i, s) in steps.iter().enumerate() {
        let seq = i as u64 + 1;
        let b = s.batch();
        let n = s.tokens.len();
        let t0 = Instant::now();
        check(
            // SAFETY: the handle is open; the batch points into `s`, which outlives the call.
            unsafe { ple_submit(gpu.0, &b, seq) },
            "ple_submit (GPU handle)",
        )?;
        check(
            // SAFETY: the handle is open; `engine.buffer()` is a device allocation of `max_tokens` rows of f32 on `engine.stream()`.
            unsafe {
                ple_dequant_fuse(
                    gpu.0,
                    engine.stream(),
                    seq,
                    engine.buffer() as *mut _,
                    PLE_DTYPE_F32,
                    DIM,
                    0,
                )
            },
            "ple_dequant_fuse",
        )?;
        engine.download(&mut got[..n * DIM * 4])?;
        total_ms += t0.elapsed().as_secs_f64() * 1e3;
        check(
            // SAFETY: the handle is open; the batch points into `s`, which outlives the call.
            unsafe { ple_submit(cpu.0, &b, seq) },
            "ple_submit (CPU handle)",
        )?;
        check(
            // SAFETY: the handle is open; `want` holds `max_tokens` rows of f32 (>= the step's tokens).
            unsafe {
                ple_dequant_cpu(
                    cpu.0,
                    seq,
                    want.as_mut_ptr() as *mut _,
                    PLE_DTYPE_F32,
                    DIM,
                    0,
                )
            },
            "ple_dequant_cpu",
        )?;
        let want_bytes =
            // SAFETY: `want` holds at least `n * DIM` f32, viewed as their bytes (u8 has no alignment or validity needs).
            unsafe { std::slice::from_raw_parts(want.as_ptr() as *const u8, n * DIM * 4) };
        if want_bytes != &got[..n * DIM * 4] {
            mismatched += 1;
        }
    }
    // SAFETY: the handle is open.
    check(unsafe { ple_check_device(gpu.0) }, "ple_check_device")?;
    if mismatched > 0 {
        return Err(Error::State(format!(
            "GPU: {mismatched} of {} steps differ from ple_dequant_cpu",
            steps.len()
        )));
    }
    Ok(Some(format!(
        "{} steps through ple_dequant_fuse (device wait {}), bit-identical to ple_dequant_cpu; {:.2} ms per step incl. download",
        steps.len(),
        if info.device_wait_supported != 0 {
            "supported"
        } else {
            "unsupported: host wait"
        },
        total_ms / steps.len() as f64
    )))
}

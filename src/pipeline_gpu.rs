//! TEMPORARY SEAM between the C API's GPU exports (`ffi.rs`, section "GPU") and the pipeline.
//!
//! The GPU side itself lives in [`crate::cuda::GpuSide`]; the pipeline (owned by another issue)
//! must hold one per handle opened with `cuda_device >= 0` and implement these methods by
//! delegating to it. Until then they return `Unsupported` so the crate builds and the exports
//! exist. The integrator replaces this whole file. Wiring:
//! - `graph_prepare(stream, base)`        → `gpu.graph_prepare(stream, base)`
//! - `dequant_fuse_graph(stream, cap, …)` → `gpu.fuse_graph(stream, cap, out, dtype, stride, flags)`
//! - `check_device()`                     → `gpu.device_error().map_or(Ok(()), Err)`

use crate::error::{Error, Result};
use std::ffi::c_void;

const SEAM: &str = "GPU path not wired to the pipeline yet";

impl crate::pipeline::Pipeline {
    /// `ple_graph_prepare`: CUDA Graph mode from step `base_seq` on.
    pub fn graph_prepare(&self, _stream: *mut c_void, _base_seq: u64) -> Result<()> {
        Err(Error::Unsupported(SEAM.into()))
    }

    /// `ple_dequant_fuse_graph`: enqueue wait + dequant + advance for graph capture.
    pub fn dequant_fuse_graph(
        &self,
        _stream: *mut c_void,
        _capacity_tokens: u32,
        _out: u64,
        _dtype: i32,
        _stride: usize,
        _flags: u32,
    ) -> Result<()> {
        Err(Error::Unsupported(SEAM.into()))
    }

    /// `ple_check_device`: the first device-side error since the last check, if any (cleared).
    pub fn check_device(&self) -> Result<()> {
        Err(Error::Unsupported(SEAM.into()))
    }
}

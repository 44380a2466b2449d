//! The pipeline's CUDA Graph and device-error entry points (`ple_graph_*`, `ple_check_device` in C), delegating
//! to the handle's [`crate::dequant::gpu::GpuSide`]. A handle opened with `cuda_device = -1` has none and
//! these return `Error::CudaUnavailable`.

use crate::error::Result;
use std::ffi::c_void;

impl crate::step::pipeline::Pipeline {
    /// `ple_graph_prepare`: CUDA Graph mode from step `base_seq` on. From then on a Ready step
    /// `s >= base_seq` counts as consumed (its ring slot free) once a replay consumed it
    /// (`GpuSide::consumed_seq() >= s`). Ready steps replays consumed under an earlier base are
    /// freed first; a refused prepare (capturing stream, a base already consumed) changes
    /// nothing.
    pub fn graph_prepare(&self, stream: *mut c_void, base_seq: u64) -> Result<()> {
        let g = self.gpu()?;
        self.rebase_graph(base_seq, || g.graph_prepare(stream, base_seq))
    }

    /// `ple_dequant_fuse_graph`: enqueue wait + dequant + advance for graph capture.
    pub fn dequant_fuse_graph(
        &self,
        stream: *mut c_void,
        capacity_tokens: u32,
        out: u64,
        args: crate::dequant::cpu::OutArgs,
    ) -> Result<()> {
        self.gpu()?.fuse_graph(stream, capacity_tokens, out, args)
    }

    /// `ple_check_device`: the first device-side error since the last check, if any (cleared).
    pub fn check_device(&self) -> Result<()> {
        self.gpu()?.device_error().map_or(Ok(()), Err)
    }
}

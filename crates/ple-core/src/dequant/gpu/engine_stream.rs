//! A stand-in for an engine's CUDA side, for the demo and tools.

use super::driver::{Api, CtxGuard, api, ck};
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::c_void;

/// The device's primary context (retained), a stream of its own and one device buffer. libple's
/// handle only borrows the stream.
pub struct EngineStream {
    d: &'static Api,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    buf: sys::CUdeviceptr,
    bytes: usize,
}

impl EngineStream {
    /// Retains `device`'s primary context and creates a stream and a zeroed `bytes`-byte buffer.
    pub fn new(device: i32, bytes: usize) -> Result<EngineStream> {
        let d = api()?;
        // SAFETY: every entry point was resolved; cuInit has no other precondition.
        ck(unsafe { (d.cuInit)(0) }, "cuInit")?;
        let mut dev: sys::CUdevice = 0;
        // SAFETY: a query into a valid local; an invalid ordinal is an error, not UB.
        ck(unsafe { (d.cuDeviceGet)(&mut dev, device) }, "cuDeviceGet")?;
        let mut e = EngineStream {
            d,
            dev,
            ctx: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            buf: 0,
            bytes,
        };
        ck(
            // SAFETY: `dev` is valid; Drop releases the context once `ctx` is non-NULL.
            unsafe { (d.cuDevicePrimaryCtxRetain)(&mut e.ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let _g = CtxGuard::push(e.ctx)?;
        let nb = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        ck(
            // SAFETY: creation into a valid out-parameter in the current context; destroyed in Drop.
            unsafe { (d.cuStreamCreate)(&mut e.stream, nb) },
            "cuStreamCreate",
        )?;
        ck(
            // SAFETY: allocation into a valid out-parameter; freed in Drop.
            unsafe { (d.cuMemAlloc_v2)(&mut e.buf, bytes) },
            "cuMemAlloc",
        )?;
        // SAFETY: the buffer just allocated holds `bytes` bytes.
        ck(unsafe { (d.cuMemsetD8_v2)(e.buf, 0, bytes) }, "cuMemsetD8")?;
        Ok(e)
    }

    /// The stream, as `ple_dequant_fuse` takes it.
    pub fn stream(&self) -> *mut c_void {
        self.stream as *mut c_void
    }

    /// The device buffer's address.
    pub fn buffer(&self) -> u64 {
        self.buf
    }

    /// Waits for the stream, then copies the first `out.len()` bytes of the buffer to `out`.
    pub fn download(&self, out: &mut [u8]) -> Result<()> {
        if out.len() > self.bytes {
            return crate::invalid!(
                "download of {} bytes from a {}-byte buffer",
                out.len(),
                self.bytes
            );
        }
        let _g = CtxGuard::push(self.ctx)?;
        ck(
            // SAFETY: our own stream (the engine stand-in's), which the demo waits for by design.
            unsafe { (self.d.cuStreamSynchronize)(self.stream) },
            "cuStreamSynchronize",
        )?;
        // SAFETY: `out` holds out.len() <= bytes writable bytes; the buffer holds `bytes`.
        let r = unsafe {
            (self.d.cuMemcpyDtoH_v2)(out.as_mut_ptr() as *mut c_void, self.buf, out.len())
        };
        ck(r, "cuMemcpyDtoH")
    }
}

impl Drop for EngineStream {
    fn drop(&mut self) {
        let d = self.d;
        if let Ok(_g) = CtxGuard::push(self.ctx) {
            // SAFETY: created in new() and freed once; the stream is synchronised first, so no
            // work of it still uses the buffer.
            unsafe {
                if !self.stream.is_null() {
                    let _ = (d.cuStreamSynchronize)(self.stream);
                    let _ = (d.cuStreamDestroy_v2)(self.stream);
                }
                if self.buf != 0 {
                    let _ = (d.cuMemFree_v2)(self.buf);
                }
            }
        }
        if !self.ctx.is_null() {
            // SAFETY: balances the retain in new().
            let _ = unsafe { (d.cuDevicePrimaryCtxRelease_v2)(self.dev) };
        }
    }
}

//! The CUDA driver, loaded at run time: libple opens `libcuda.so.1` (the driver's SONAME, installed
//! by the NVIDIA driver) and only then `libcuda.so` (on most systems a toolkit link stub, whose
//! every call fails with `CUDA_ERROR_STUB_LIBRARY`), resolves every entry point it calls into one
//! table ([`Api`]) before the first call, and never links against libcuda. A machine without a
//! driver builds, tests and runs CPU-only; [`api`] returns [`Error::CudaUnavailable`] there.
//! cudarc provides the driver's types and constants (`sys`); its own loader (which tries
//! `libcuda.so` first and panics on a missing symbol) is not used.

use crate::error::{Error, Result};
use cudarc::driver::sys::{
    self, CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUevent, CUfunction, CUjit_option,
    CUmemGenericAllocationHandle, CUmodule, CUpointer_attribute, CUresult, CUstream,
    CUstreamCaptureMode, CUstreamCaptureStatus,
};
use std::ffi::{CStr, c_char, c_int, c_uchar, c_uint, c_void};
use std::sync::OnceLock;

/// Library names tried in order: the driver's SONAME first, the unversioned name last.
pub const LIBRARY_CANDIDATES: &[&str] = &["libcuda.so.1", "libcuda.so"];

macro_rules! driver_api {
    ($( $name:ident ( $($arg:ty),* ); )*) => {
        /// Entry points of the CUDA driver that libple calls, resolved from one library.
        #[allow(non_snake_case, reason = "the fields are the driver's symbol names")]
        pub struct Api {
            $( pub $name: unsafe extern "C" fn($($arg),*) -> CUresult, )*
        }

        /// Names of every entry point in [`Api`] (all are resolved before any is called).
        pub const REQUIRED_SYMBOLS: &[&str] = &[$(stringify!($name)),*];

        impl Api {
            /// Resolves every entry point from `lib`; the first missing one is the error.
            fn resolve(lib: &'static libloading::Library) -> std::result::Result<Api, String> {
                Ok(Api {
                    $( $name: {
                        // SAFETY: the symbol is the driver function of that name, whose C
                        // signature is the one declared here (copied from cuda.h via cudarc's
                        // bindings); the library is never unloaded ('static), so the pointer
                        // stays valid.
                        let s = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) -> CUresult>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                        };
                        *s.map_err(|_| stringify!($name).to_string())?
                    }, )*
                })
            }
        }
    };
}

driver_api! {
    cuInit(c_uint);
    cuDriverGetVersion(*mut c_int);
    cuDeviceGetCount(*mut c_int);
    cuDeviceGet(*mut CUdevice, c_int);
    cuDeviceGetAttribute(*mut c_int, CUdevice_attribute, CUdevice);
    cuDevicePrimaryCtxRetain(*mut CUcontext, CUdevice);
    cuDevicePrimaryCtxRelease_v2(CUdevice);
    cuCtxPushCurrent_v2(CUcontext);
    cuCtxPopCurrent_v2(*mut CUcontext);
    cuModuleLoadDataEx(*mut CUmodule, *const c_void, c_uint, *mut CUjit_option, *mut *mut c_void);
    cuModuleGetFunction(*mut CUfunction, CUmodule, *const c_char);
    cuModuleUnload(CUmodule);
    cuOccupancyMaxActiveBlocksPerMultiprocessor(*mut c_int, CUfunction, c_int, usize);
    cuStreamCreate(*mut CUstream, c_uint);
    cuStreamDestroy_v2(CUstream);
    cuStreamSynchronize(CUstream);
    cuStreamGetCtx(CUstream, *mut CUcontext);
    cuStreamIsCapturing(CUstream, *mut CUstreamCaptureStatus);
    cuStreamWaitValue64_v2(CUstream, CUdeviceptr, u64, c_uint);
    cuThreadExchangeStreamCaptureMode(*mut CUstreamCaptureMode);
    cuEventCreate(*mut CUevent, c_uint);
    cuEventDestroy_v2(CUevent);
    cuEventRecord(CUevent, CUstream);
    cuEventQuery(CUevent);
    cuMemAlloc_v2(*mut CUdeviceptr, usize);
    cuMemFree_v2(CUdeviceptr);
    cuMemsetD8_v2(CUdeviceptr, c_uchar, usize);
    cuMemHostAlloc(*mut *mut c_void, usize, c_uint);
    cuMemHostGetDevicePointer_v2(*mut CUdeviceptr, *mut c_void, c_uint);
    cuMemFreeHost(*mut c_void);
    cuMemcpyHtoDAsync_v2(CUdeviceptr, *const c_void, usize, CUstream);
    cuMemcpyDtoH_v2(*mut c_void, CUdeviceptr, usize);
    cuMemGetAddressRange_v2(*mut CUdeviceptr, *mut usize, CUdeviceptr);
    cuMemRetainAllocationHandle(*mut CUmemGenericAllocationHandle, *mut c_void);
    cuMemRelease(CUmemGenericAllocationHandle);
    cuPointerGetAttribute(*mut c_void, CUpointer_attribute, CUdeviceptr);
    cuLaunchKernel(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void);
    cuGetErrorName(CUresult, *mut *const c_char);
    cuGetErrorString(CUresult, *mut *const c_char);
}

/// Opens the first of `candidates` that loads, and resolves the table from it.
fn load(candidates: &[&str]) -> std::result::Result<Api, String> {
    let mut tried = Vec::new();
    for name in candidates {
        // SAFETY: loading libcuda runs its initialisers, which have no preconditions; the
        // library is leaked below and never unloaded, so resolved pointers stay valid.
        match unsafe { libloading::Library::new(*name) } {
            Ok(lib) => {
                let lib: &'static libloading::Library = Box::leak(Box::new(lib));
                return Api::resolve(lib).map_err(|sym| {
                    format!(
                        "the CUDA driver library {name} lacks {sym}: a driver of CUDA 12.2 or \
                         newer is needed"
                    )
                });
            }
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(format!(
        "no CUDA driver library could be loaded ({}); install the NVIDIA driver, or open the \
         table with cuda_device = -1 for the CPU path",
        tried.join("; ")
    ))
}

/// The driver's entry points (loaded once per process); [`Error::CudaUnavailable`] without a
/// driver or with one that lacks an entry point libple calls.
pub fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| load(LIBRARY_CANDIDATES))
        .as_ref()
        .map_err(|m| Error::CudaUnavailable(m.clone()))
}

/// Checks that libcuda can be loaded and has every entry point libple calls.
pub fn probe_driver() -> Result<()> {
    api().map(|_| ())
}

/// The driver's name and description of `r`.
pub fn cu_error_text(r: CUresult) -> String {
    let Ok(d) = api() else {
        return format!("CUresult {}", r as i32);
    };
    let mut name: *const c_char = std::ptr::null();
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: both calls only store a pointer to a static string (or leave NULL) in the
    // out-parameters, which are valid locals.
    unsafe {
        let _ = (d.cuGetErrorName)(r, &mut name);
        let _ = (d.cuGetErrorString)(r, &mut text);
    }
    let s = |p: *const c_char| {
        // SAFETY: a non-NULL pointer from cuGetError* is a static NUL-terminated string.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    match (s(name), s(text)) {
        (Some(n), Some(t)) => format!("{n} ({t})"),
        (Some(n), None) => n,
        _ => format!("CUresult {}", r as i32),
    }
}

/// Converts a driver result to an [`Error`] naming the call.
pub fn ck(r: CUresult, what: &str) -> Result<()> {
    use sys::CUresult::*;
    match r {
        CUDA_SUCCESS => Ok(()),
        CUDA_ERROR_OUT_OF_MEMORY => {
            Err(Error::OutOfMemory(format!("{what}: {}", cu_error_text(r))))
        }
        CUDA_ERROR_NO_DEVICE | CUDA_ERROR_STUB_LIBRARY | CUDA_ERROR_SYSTEM_DRIVER_MISMATCH => Err(
            Error::CudaUnavailable(format!("{what}: {}", cu_error_text(r))),
        ),
        _ => Err(Error::Cuda(format!("{what}: {}", cu_error_text(r)))),
    }
}

/// Pushes a context on the calling thread for the guard's lifetime.
pub(super) struct CtxGuard(&'static Api);

impl CtxGuard {
    /// Pushes `ctx` (a retained context) as the calling thread's current context.
    pub(super) fn push(ctx: CUcontext) -> Result<CtxGuard> {
        let d = api()?;
        // SAFETY: ctx is a primary context retained by the caller for at least the guard's life.
        ck(unsafe { (d.cuCtxPushCurrent_v2)(ctx) }, "cuCtxPushCurrent")?;
        Ok(CtxGuard(d))
    }
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        let mut old: CUcontext = std::ptr::null_mut();
        // SAFETY: pops exactly the context `push` pushed on this thread (guards are not Send).
        let _ = unsafe { (self.0.cuCtxPopCurrent_v2)(&mut old) };
    }
}

/// Sets the calling thread's stream capture mode to RELAXED for the guard's lifetime, so
/// libple's own calls (copies, event queries) are never refused because an engine thread is
/// capturing a graph in global mode.
pub struct RelaxedCapture(&'static Api, CUstreamCaptureMode);

impl RelaxedCapture {
    pub fn enter() -> Result<RelaxedCapture> {
        let d = api()?;
        let mut m = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: exchanges the calling thread's capture mode through a valid local.
        let _ = unsafe { (d.cuThreadExchangeStreamCaptureMode)(&mut m) };
        Ok(RelaxedCapture(d, m))
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        let mut m = self.1;
        // SAFETY: restores the mode `enter` replaced, on the same thread.
        let _ = unsafe { (self.0.cuThreadExchangeStreamCaptureMode)(&mut m) };
    }
}

/// One attribute of device `dev`.
pub fn device_attr(dev: CUdevice, a: CUdevice_attribute) -> Result<i32> {
    let d = api()?;
    let mut v = 0i32;
    ck(
        // SAFETY: a plain query into a valid local; `dev` came from cuDeviceGet.
        unsafe { (d.cuDeviceGetAttribute)(&mut v, a, dev) },
        "cuDeviceGetAttribute",
    )?;
    Ok(v)
}

/// Launches kernel `f` with one by-value parameter block `params` on `stream`.
///
/// # Safety
/// `f` must be a kernel of the current context whose only parameter has the layout of `P`
/// (the `#[repr(C)]` mirrors in `layout.rs`, checked against the `.cu` by tests), and every
/// device address inside `params` must stay valid until the kernel has run.
pub unsafe fn launch<P>(
    f: CUfunction,
    grid: u32,
    block: u32,
    stream: CUstream,
    params: &mut P,
    what: &str,
) -> Result<()> {
    let d = api()?;
    let mut args = [params as *mut P as *mut c_void];
    // SAFETY: the caller guarantees the kernel's signature and the addresses; the driver copies
    // the parameter block before returning, so `args` may die afterwards.
    let r = unsafe {
        (d.cuLaunchKernel)(
            f,
            grid,
            1,
            1,
            block,
            1,
            1,
            0,
            stream,
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    ck(r, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_soname_is_tried_before_the_unversioned_stub_name() {
        assert_eq!(LIBRARY_CANDIDATES, ["libcuda.so.1", "libcuda.so"]);
        let e = load(&["libple-no-such-driver.so.1", "libple-no-such-driver.so"])
            .err()
            .expect("no such library");
        let a = e
            .find("libple-no-such-driver.so.1")
            .expect("first name reported");
        let b = e
            .find("libple-no-such-driver.so:")
            .expect("second name reported");
        assert!(a < b, "{e}");
        assert!(e.contains("cuda_device = -1"), "{e}");
    }

    #[test]
    fn a_library_without_the_entry_points_is_refused_by_name() {
        // libc loads everywhere and has none of the driver's symbols: the first is named.
        let e = load(&["libc.so.6"]).err().expect("libc is no driver");
        assert!(e.contains("lacks cuInit"), "{e}");
    }

    #[test]
    fn without_a_driver_every_call_is_cuda_unavailable() {
        if api().is_ok() {
            return; // a machine with a driver: covered by the GPU checks
        }
        assert_eq!(
            probe_driver().unwrap_err().kind(),
            crate::ErrorKind::CudaUnavailable
        );
        assert!(CtxGuard::push(std::ptr::null_mut()).is_err());
        assert!(RelaxedCapture::enter().is_err());
        assert_eq!(
            cu_error_text(CUresult::CUDA_ERROR_INVALID_VALUE),
            format!("CUresult {}", CUresult::CUDA_ERROR_INVALID_VALUE as i32)
        );
    }
}

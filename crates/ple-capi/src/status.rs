//! Status codes (`ple_status`) and the one mapping from the core's error kinds to them.

use ple_core::{Error, ErrorKind};
use std::ffi::{CStr, c_char};

/// The values a `ple_status` takes (a C enum, so negative codes need no parentheses).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ple_status_code {
    /// Success.
    PLE_OK = 0,
    /// A bad argument: NULL pointer, wrong struct size, out-of-range value, malformed batch.
    PLE_E_INVALID_ARGUMENT = -1,
    /// An I/O call failed (open, read, write, mmap, fsync, rename).
    PLE_E_IO = -2,
    /// A file is malformed or does not match its metadata / source checkpoint.
    PLE_E_FORMAT = -3,
    /// A wait ran past its timeout.
    PLE_E_TIMEOUT = -4,
    /// The call does not fit the handle's state (sequence number never submitted, reused or consumed).
    PLE_E_STATE = -5,
    /// CUDA was requested but no CUDA driver could be loaded.
    PLE_E_CUDA_UNAVAILABLE = -6,
    /// A CUDA driver call failed.
    PLE_E_CUDA = -7,
    /// Valid request that this build, table or device does not support.
    PLE_E_UNSUPPORTED = -8,
    /// An internal panic was caught at the boundary (a bug in libple; please report it).
    PLE_E_PANIC = -9,
    /// An allocation failed.
    PLE_E_OUT_OF_MEMORY = -10,
}

/// Status code returned by every fallible libple call: `PLE_OK` (0) or a negative `PLE_E_*`
/// (a `ple_status_code`).
pub type ple_status = i32;

/// The codes as `ple_status` values, for Rust callers (C sees the enum).
pub mod codes {
    use super::{ple_status, ple_status_code as C};
    /// Success.
    pub const PLE_OK: ple_status = C::PLE_OK as ple_status;
    /// A bad argument: NULL pointer, wrong struct size, out-of-range value, malformed batch.
    pub const PLE_E_INVALID_ARGUMENT: ple_status = C::PLE_E_INVALID_ARGUMENT as ple_status;
    /// An I/O call failed (open, read, write, mmap, fsync, rename).
    pub const PLE_E_IO: ple_status = C::PLE_E_IO as ple_status;
    /// A file is malformed or does not match its metadata / source checkpoint.
    pub const PLE_E_FORMAT: ple_status = C::PLE_E_FORMAT as ple_status;
    /// A wait ran past its timeout.
    pub const PLE_E_TIMEOUT: ple_status = C::PLE_E_TIMEOUT as ple_status;
    /// The call does not fit the handle's state (sequence number never submitted, reused or consumed).
    pub const PLE_E_STATE: ple_status = C::PLE_E_STATE as ple_status;
    /// CUDA was requested but no CUDA driver could be loaded.
    pub const PLE_E_CUDA_UNAVAILABLE: ple_status = C::PLE_E_CUDA_UNAVAILABLE as ple_status;
    /// A CUDA driver call failed.
    pub const PLE_E_CUDA: ple_status = C::PLE_E_CUDA as ple_status;
    /// Valid request that this build, table or device does not support.
    pub const PLE_E_UNSUPPORTED: ple_status = C::PLE_E_UNSUPPORTED as ple_status;
    /// An internal panic was caught at the boundary (a bug in libple; please report it).
    pub const PLE_E_PANIC: ple_status = C::PLE_E_PANIC as ple_status;
    /// An allocation failed.
    pub const PLE_E_OUT_OF_MEMORY: ple_status = C::PLE_E_OUT_OF_MEMORY as ple_status;
}
pub use codes::*;

/// The status of an error: one code per [`ErrorKind`].
pub(crate) fn status_of(e: &Error) -> ple_status {
    match e.kind() {
        ErrorKind::InvalidArgument => PLE_E_INVALID_ARGUMENT,
        ErrorKind::Io => PLE_E_IO,
        ErrorKind::Format => PLE_E_FORMAT,
        ErrorKind::Timeout => PLE_E_TIMEOUT,
        ErrorKind::State => PLE_E_STATE,
        ErrorKind::CudaUnavailable => PLE_E_CUDA_UNAVAILABLE,
        ErrorKind::Cuda => PLE_E_CUDA,
        ErrorKind::Unsupported => PLE_E_UNSUPPORTED,
        ErrorKind::Panic => PLE_E_PANIC,
        ErrorKind::OutOfMemory => PLE_E_OUT_OF_MEMORY,
    }
}

/// A static name for a status code ("PLE_OK", "PLE_E_IO", ...; "unknown status" otherwise).
#[unsafe(no_mangle)]
pub extern "C" fn ple_status_name(status: ple_status) -> *const c_char {
    let s: &CStr = match status {
        PLE_OK => c"PLE_OK",
        PLE_E_INVALID_ARGUMENT => c"PLE_E_INVALID_ARGUMENT",
        PLE_E_IO => c"PLE_E_IO",
        PLE_E_FORMAT => c"PLE_E_FORMAT",
        PLE_E_TIMEOUT => c"PLE_E_TIMEOUT",
        PLE_E_STATE => c"PLE_E_STATE",
        PLE_E_CUDA_UNAVAILABLE => c"PLE_E_CUDA_UNAVAILABLE",
        PLE_E_CUDA => c"PLE_E_CUDA",
        PLE_E_UNSUPPORTED => c"PLE_E_UNSUPPORTED",
        PLE_E_PANIC => c"PLE_E_PANIC",
        PLE_E_OUT_OF_MEMORY => c"PLE_E_OUT_OF_MEMORY",
        _ => c"unknown status",
    };
    s.as_ptr()
}

//! Status codes (`ple_status`) and the one mapping from the core's error kinds to them.

use crate::c_enum::c_enum;
use ple_core::{Error, ErrorKind};
use std::ffi::c_char;

/// Status code returned by every fallible libple call: `PLE_OK` (0) or a negative `PLE_E_*`
/// (a `ple_status_code`).
pub type ple_status = i32;

c_enum! {
    /// The values a `ple_status` takes (a C enum, so negative codes need no parentheses).
    enum ple_status_code: ple_status, ErrorKind {
        /// Success.
        PLE_OK = 0,
        /// A bad argument: NULL pointer, wrong struct size, out-of-range value, malformed batch.
        PLE_E_INVALID_ARGUMENT = -1 => (ErrorKind::InvalidArgument),
        /// An I/O call failed (open, read, write, mmap, fsync, rename).
        PLE_E_IO = -2 => (ErrorKind::Io),
        /// A file is malformed or does not match its metadata / source checkpoint.
        PLE_E_FORMAT = -3 => (ErrorKind::Format),
        /// A wait ran past its timeout.
        PLE_E_TIMEOUT = -4 => (ErrorKind::Timeout),
        /// The call does not fit the handle's state (sequence number never submitted, reused or consumed).
        PLE_E_STATE = -5 => (ErrorKind::State),
        /// CUDA was requested but no CUDA driver could be loaded.
        PLE_E_CUDA_UNAVAILABLE = -6 => (ErrorKind::CudaUnavailable),
        /// A CUDA driver call failed.
        PLE_E_CUDA = -7 => (ErrorKind::Cuda),
        /// Valid request that this build, table or device does not support.
        PLE_E_UNSUPPORTED = -8 => (ErrorKind::Unsupported),
        /// An internal panic was caught at the boundary (a bug in libple; please report it).
        PLE_E_PANIC = -9 => (ErrorKind::Panic),
        /// An allocation failed.
        PLE_E_OUT_OF_MEMORY = -10 => (ErrorKind::OutOfMemory),
    }
}

/// The status of an error: one code per [`ErrorKind`].
pub(crate) fn status_of(e: &Error) -> ple_status {
    ple_status_code::to_c(e.kind())
}

/// A static name for a status code ("PLE_OK", "PLE_E_IO", ...; "unknown status" otherwise).
#[unsafe(no_mangle)]
pub extern "C" fn ple_status_name(status: ple_status) -> *const c_char {
    ple_status_code::name(status)
        .unwrap_or(c"unknown status")
        .as_ptr()
}

//! The error model shared by the safe core and the C boundary.
//!
//! Every fallible core function returns [`Result<T>`]; the FFI layer turns an [`Error`] into an
//! integer status (see `ffi::status`) and stores its text for `ple_last_error_message()`.

/// A libple error. Each variant maps to one C status code (see [`Error::status`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A caller passed a bad argument (NULL pointer, bad size, out-of-range token, bad batch shape).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An operating-system I/O call failed.
    #[error("I/O error: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A file is not what it claims to be (bad table, bad checkpoint, metadata mismatch).
    #[error("format error: {0}")]
    Format(String),
    /// A wait ran past its timeout.
    #[error("timeout: {0}")]
    Timeout(String),
    /// The call is not valid in the handle's current state (unknown sequence number, closed handle).
    #[error("state error: {0}")]
    State(String),
    /// CUDA was asked for but no driver can be loaded.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),
    /// A CUDA driver call failed.
    #[error("CUDA error: {0}")]
    Cuda(String),
    /// The request is well-formed but not supported by this build or table.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A panic was caught at the C boundary.
    #[error("internal panic: {0}")]
    Panic(String),
    /// An allocation failed.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Builds an [`Error::Io`] naming what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// An I/O error about a path.
    pub fn io_path(what: &str, path: &std::path::Path, source: std::io::Error) -> Self {
        Error::Io {
            context: format!("{what} {}", path.display()),
            source,
        }
    }

    /// The C status code of this error (always negative).
    pub fn status(&self) -> i32 {
        use crate::ffi::status::*;
        match self {
            Error::InvalidArgument(_) => PLE_E_INVALID_ARGUMENT,
            Error::Io { .. } => PLE_E_IO,
            Error::Format(_) => PLE_E_FORMAT,
            Error::Timeout(_) => PLE_E_TIMEOUT,
            Error::State(_) => PLE_E_STATE,
            Error::CudaUnavailable(_) => PLE_E_CUDA_UNAVAILABLE,
            Error::Cuda(_) => PLE_E_CUDA,
            Error::Unsupported(_) => PLE_E_UNSUPPORTED,
            Error::Panic(_) => PLE_E_PANIC,
            Error::OutOfMemory(_) => PLE_E_OUT_OF_MEMORY,
        }
    }
}

/// Shorthand for `Err(Error::InvalidArgument(format!(...)))`.
#[macro_export]
macro_rules! invalid {
    ($($arg:tt)*) => { Err($crate::error::Error::InvalidArgument(format!($($arg)*))) };
}

/// Shorthand for `Err(Error::Format(format!(...)))`.
#[macro_export]
macro_rules! format_err {
    ($($arg:tt)*) => { Err($crate::error::Error::Format(format!($($arg)*))) };
}

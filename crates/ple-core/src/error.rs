//! The error model shared by the safe core and the C boundary.
//!
//! Every fallible core function returns [`Result<T>`]. The C API maps each [`ErrorKind`] to one
//! status code and keeps the error's text for `ple_last_error_message()`; this crate knows no codes.

/// A libple error: one variant per [`ErrorKind`], with the cause in words.
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
    /// A panic was caught (at the C boundary, in the worker or in a consuming call).
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

    /// Which kind of failure this is (the C API maps each kind to one status code).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::Io { .. } => ErrorKind::Io,
            Error::Format(_) => ErrorKind::Format,
            Error::Timeout(_) => ErrorKind::Timeout,
            Error::State(_) => ErrorKind::State,
            Error::CudaUnavailable(_) => ErrorKind::CudaUnavailable,
            Error::Cuda(_) => ErrorKind::Cuda,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::Panic(_) => ErrorKind::Panic,
            Error::OutOfMemory(_) => ErrorKind::OutOfMemory,
        }
    }
}

/// The kind of an [`Error`], without its text: one per variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// See [`Error::InvalidArgument`].
    InvalidArgument,
    /// See [`Error::Io`].
    Io,
    /// See [`Error::Format`].
    Format,
    /// See [`Error::Timeout`].
    Timeout,
    /// See [`Error::State`].
    State,
    /// See [`Error::CudaUnavailable`].
    CudaUnavailable,
    /// See [`Error::Cuda`].
    Cuda,
    /// See [`Error::Unsupported`].
    Unsupported,
    /// See [`Error::Panic`].
    Panic,
    /// See [`Error::OutOfMemory`].
    OutOfMemory,
}

/// Shorthand for `Err(Error::InvalidArgument(format!(...)))`.
#[macro_export]
macro_rules! invalid {
    ($($arg:tt)*) => { Err($crate::error::Error::InvalidArgument(format!($($arg)*))) };
}

/// The message of a caught panic's payload (`&str` or `String`; anything else is named as such).
pub fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

//! One error type for the whole library, mapped onto `ncclResult_t` at the C boundary.
//!
//! Every failure carries the text that `ncclGetLastError` returns and that the WARN line prints,
//! so the message must say what failed and, where it can, what to do about it.

use crate::types::ncclResult_t;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A bad argument from the caller (NULL pointer, out-of-range value, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// A misuse of the API (wrong call order, unsupported feature, destroyed communicator).
    #[error("{0}")]
    InvalidUsage(String),
    /// The operating system or network failed us (sockets, timeouts, missing driver).
    #[error("{0}")]
    System(String),
    /// A bug or broken invariant inside ferronickel.
    #[error("{0}")]
    Internal(String),
    /// A CUDA driver call failed.
    #[error("{0}")]
    Cuda(String),
    /// A peer rank failed or disappeared.
    #[error("{0}")]
    Remote(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn code(&self) -> ncclResult_t {
        match self {
            Error::InvalidArgument(_) => ncclResult_t::ncclInvalidArgument,
            Error::InvalidUsage(_) => ncclResult_t::ncclInvalidUsage,
            Error::System(_) => ncclResult_t::ncclSystemError,
            Error::Internal(_) => ncclResult_t::ncclInternalError,
            Error::Cuda(_) => ncclResult_t::ncclUnhandledCudaError,
            Error::Remote(_) => ncclResult_t::ncclRemoteError,
        }
    }

    /// Prefixes the message with where it happened, keeping the kind: the call chain on failure.
    pub fn context(self, what: &str) -> Error {
        let wrap = |m: String| format!("{what}: {m}");
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(wrap(m)),
            Error::InvalidUsage(m) => Error::InvalidUsage(wrap(m)),
            Error::System(m) => Error::System(wrap(m)),
            Error::Internal(m) => Error::Internal(wrap(m)),
            Error::Cuda(m) => Error::Cuda(wrap(m)),
            Error::Remote(m) => Error::Remote(wrap(m)),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::System(e.to_string())
    }
}

/// `return Err(Error::InvalidArgument(format!(...)))` in one line.
#[macro_export]
macro_rules! bail_arg {
    ($($t:tt)*) => { return Err($crate::error::Error::InvalidArgument(format!($($t)*))) };
}

/// `return Err(Error::InvalidUsage(format!(...)))` in one line.
#[macro_export]
macro_rules! bail_usage {
    ($($t:tt)*) => { return Err($crate::error::Error::InvalidUsage(format!($($t)*))) };
}

//! F3's error: what failed, where, and what to do, as one message with a
//! kind that the HTTP services map to a status and the file system to an
//! errno.

/// The kind of an F3 failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request or its input is malformed or out of bounds.
    Invalid,
    /// The named file, directory or node does not exist.
    NotFound,
    /// The name exists already, or the file is in a state that forbids
    /// the operation (open writers, a non-empty directory).
    Conflict,
    /// A peer (the metadata service, another node, the store) failed or
    /// could not be reached.
    Unavailable,
    /// A local I/O error.
    Io,
}

/// An F3 error: a kind and a message that says what, where and what to do.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct F3Error {
    /// What kind of failure it is.
    pub kind: ErrorKind,
    /// The full message.
    pub message: String,
}

/// F3's result.
pub type Result<T> = std::result::Result<T, F3Error>;

impl F3Error {
    /// A malformed or out-of-bounds request.
    pub fn invalid(message: impl Into<String>) -> F3Error {
        F3Error::new(ErrorKind::Invalid, message)
    }

    /// Something named that does not exist.
    pub fn not_found(message: impl Into<String>) -> F3Error {
        F3Error::new(ErrorKind::NotFound, message)
    }

    /// A name that exists, or a state that forbids the operation.
    pub fn conflict(message: impl Into<String>) -> F3Error {
        F3Error::new(ErrorKind::Conflict, message)
    }

    /// A peer that failed or could not be reached.
    pub fn unavailable(message: impl Into<String>) -> F3Error {
        F3Error::new(ErrorKind::Unavailable, message)
    }

    /// A local I/O error, with what was being done.
    pub fn io(context: impl std::fmt::Display, error: std::io::Error) -> F3Error {
        F3Error::new(ErrorKind::Io, format!("{context}: {error}"))
    }

    /// An error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> F3Error {
        F3Error {
            kind,
            message: message.into(),
        }
    }

    /// The errno a file system call answers for this error.
    pub fn errno(&self) -> i32 {
        match self.kind {
            ErrorKind::Invalid => libc::EINVAL,
            ErrorKind::NotFound => libc::ENOENT,
            ErrorKind::Conflict => libc::EEXIST,
            ErrorKind::Unavailable | ErrorKind::Io => libc::EIO,
        }
    }
}

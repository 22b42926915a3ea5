//! The store's errors: the codes answers carry, and the error type of
//! every store call.

use crate::codec::WireError;

/// Error codes carried by [`crate::wire::Body::Error`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Code {
    /// The object does not exist (and the node knows nothing newer).
    NotFound = 1,
    /// The object was deleted at this node (authoritative: do not fall through).
    Deleted = 2,
    /// Another Post or Delete of the same name is in progress.
    Conflict = 3,
    /// The message was addressed to a node that does not own that address.
    WrongAddress = 4,
    /// The request was malformed.
    BadRequest = 5,
    /// The node could not do it now (no storage node, store failure...).
    Unavailable = 6,
    /// The object already exists (rename target).
    Exists = 7,
    /// The address's metadata group is being handed over to another
    /// metadata node: nothing was done; refresh the table and retry (a
    /// Get falls through, and its "not found" is then not authoritative).
    Moving = 8,
    /// The request needs the cluster key's seal and has none, or a wrong
    /// or stale one ([`crate::auth`]): nothing was done.
    Unauthenticated = 9,
    /// A tenant's request names an object (or List prefix) outside the
    /// tenant's scope ([`crate::scope::check_scope`]): nothing was done.
    Forbidden = 10,
}

impl Code {
    /// The code numbered `v` ([`Code::Unavailable`] for numbers it does not
    /// know, so that a newer peer's code still reads as a failure).
    pub fn from_u16(v: u16) -> Code {
        match v {
            1 => Code::NotFound,
            2 => Code::Deleted,
            3 => Code::Conflict,
            4 => Code::WrongAddress,
            5 => Code::BadRequest,
            7 => Code::Exists,
            8 => Code::Moving,
            9 => Code::Unauthenticated,
            10 => Code::Forbidden,
            _ => Code::Unavailable,
        }
    }
}

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The metadata or orchestrator database failed.
    #[error("database error: {0}")]
    Db(String),
    /// A file or socket operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A peer answered with an error.
    #[error("{message}")]
    Remote {
        /// The error code.
        code: Code,
        /// The peer's explanation.
        message: String,
    },
    /// A peer did not answer.
    #[error("{0}")]
    Timeout(String),
    /// A message could not be decoded.
    #[error("malformed message: {0}")]
    Wire(#[from] WireError),
    /// Stored or received data failed its checksum or size check.
    #[error("{0}")]
    Corrupt(String),
    /// The request itself is invalid.
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// An I/O error with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// The remote error code, if this is a remote error.
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Remote { code, .. } => Some(*code),
            _ => None,
        }
    }
}

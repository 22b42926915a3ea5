//! The store's errors: the codes answers carry, and the error type of
//! every store call.
//!
//! An [`Error`] is a kind, its context (what was being done, and where)
//! and its source: the error it came from, kept as
//! [`std::error::Error::source`]. A message never repeats its source's
//! text, so that a printer walking the chain (the CLI's, or
//! [`Error::report`] for a reply or a log line) says each cause once.

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

/// Any error, boxed: the source of a kind whose causes come from crates
/// this one does not depend on (redb's errors, tokio's join errors).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The metadata or orchestrator database failed: opening it, a
    /// transaction, a table, a read or a commit.
    #[error("{context}")]
    Database {
        /// What was being done, in which database.
        context: String,
        /// The database's error (one of redb's error types).
        #[source]
        source: BoxError,
    },
    /// A file or socket operation failed.
    #[error("{context}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Bytes (a message, a stored row or table) could not be decoded, or
    /// a message could not be encoded.
    #[error("{context}")]
    Malformed {
        /// What was being decoded, and where it came from.
        context: String,
        /// What the codec found.
        #[source]
        source: WireError,
    },
    /// Stored or received data failed a check (a checksum, a size, a row
    /// under another name's key).
    #[error("{0}")]
    Corrupt(String),
    /// A setting (a cluster's parameters, a bucket's, a bench run's, the
    /// host's routes) does not allow what was asked.
    #[error("{context}")]
    Config {
        /// What is wrong, and what to do.
        context: String,
        /// The error that showed it, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The cluster key or its files are unusable.
    #[error("{context}")]
    Key {
        /// What is wrong, where, and what to do.
        context: String,
        /// The error that showed it, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// A tenant credential (its id, its file) is unusable or missing.
    #[error("{context}")]
    Credential {
        /// What is wrong, where, and what to do.
        context: String,
        /// The error that showed it, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The prefix table lacks what the call needs (a node for an
    /// address).
    #[error("{0}")]
    Table(String),
    /// A node's stored state (its identity file, the orchestrator's
    /// stored epochs) is unusable, or an object's stored state (a rename
    /// left half done) must be finished before what was asked.
    #[error("{context}")]
    State {
        /// What is wrong, where, and what to do.
        context: String,
        /// The error that showed it, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// A thread or task of a server failed or has ended.
    #[error("{context}")]
    Task {
        /// What the thread or task was doing.
        context: String,
        /// Why it failed, if known.
        #[source]
        source: Option<BoxError>,
    },
    /// A peer broke off or answered out of turn (not an error it sent:
    /// that is [`Error::Remote`]).
    #[error("{0}")]
    Peer(String),
    /// A metadata node's change lost a race with another (a repair
    /// overtaken by a write): nothing was stored.
    #[error("{0}")]
    Superseded(String),
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
}

/// The kind of an [`Error`], for callers that decide by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// [`Error::Database`].
    Database,
    /// [`Error::Io`].
    Io,
    /// [`Error::Malformed`].
    Malformed,
    /// [`Error::Corrupt`].
    Corrupt,
    /// [`Error::Config`].
    Config,
    /// [`Error::Key`].
    Key,
    /// [`Error::Credential`].
    Credential,
    /// [`Error::Table`].
    Table,
    /// [`Error::State`].
    State,
    /// [`Error::Task`].
    Task,
    /// [`Error::Peer`].
    Peer,
    /// [`Error::Superseded`].
    Superseded,
    /// [`Error::Remote`].
    Remote,
    /// [`Error::Timeout`].
    Timeout,
}

impl Error {
    /// An I/O error with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// A database error with context; `source` is the database's own.
    pub fn database(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error::Database {
            context: context.into(),
            source: Box::new(source),
        }
    }

    /// A decode (or encode) error with context.
    pub fn malformed(context: impl Into<String>, source: WireError) -> Error {
        Error::Malformed {
            context: context.into(),
            source,
        }
    }

    /// A setting that does not allow what was asked.
    pub fn config(context: impl Into<String>) -> Error {
        Error::Config {
            context: context.into(),
            source: None,
        }
    }

    /// An unusable cluster key.
    pub fn key(context: impl Into<String>) -> Error {
        Error::Key {
            context: context.into(),
            source: None,
        }
    }

    /// An unusable or missing tenant credential.
    pub fn credential(context: impl Into<String>) -> Error {
        Error::Credential {
            context: context.into(),
            source: None,
        }
    }

    /// Unusable stored state, or state that must be finished first.
    pub fn state(context: impl Into<String>) -> Error {
        Error::State {
            context: context.into(),
            source: None,
        }
    }

    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Database { .. } => ErrorKind::Database,
            Error::Io { .. } => ErrorKind::Io,
            Error::Malformed { .. } => ErrorKind::Malformed,
            Error::Corrupt(_) => ErrorKind::Corrupt,
            Error::Config { .. } => ErrorKind::Config,
            Error::Key { .. } => ErrorKind::Key,
            Error::Credential { .. } => ErrorKind::Credential,
            Error::Table(_) => ErrorKind::Table,
            Error::State { .. } => ErrorKind::State,
            Error::Task { .. } => ErrorKind::Task,
            Error::Peer(_) => ErrorKind::Peer,
            Error::Superseded(_) => ErrorKind::Superseded,
            Error::Remote { .. } => ErrorKind::Remote,
            Error::Timeout(_) => ErrorKind::Timeout,
        }
    }

    /// The remote error code, if this is a remote error.
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Remote { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// This error and its causes on one line, each said once: for a
    /// reply's message or a log line, where no printer walks the chain.
    pub fn report(&self) -> Report<'_> {
        Report(self)
    }
}

/// Turns a database call's error (any of redb's error types, in the
/// servers) into [`Error::Database`], with its context built only on
/// failure and the database's own error kept as the source.
pub trait DatabaseResult<T> {
    /// This result, its error given the context `what` says.
    fn database(self, what: impl FnOnce() -> String) -> Result<T, Error>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> DatabaseResult<T> for Result<T, E> {
    fn database(self, what: impl FnOnce() -> String) -> Result<T, Error> {
        self.map_err(|source| Error::database(what(), source))
    }
}

/// An error and its causes on one line, separated by `: `, each said
/// once (a cause whose text the line holds already is skipped, as the
/// CLI does: many errors, such as a wrapped `std::io::Error`, include
/// their source in their own message).
pub struct Report<'a>(&'a Error);

impl std::fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut line = String::new();
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self.0);
        while let Some(error) = cause {
            let text = error.to_string();
            if !text.is_empty() && !line.contains(&text) {
                if !line.is_empty() {
                    line.push_str(": ");
                }
                line.push_str(&text);
            }
            cause = error.source();
        }
        f.write_str(&line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_malformed_error_keeps_the_codec_error_as_its_source_and_says_it_once() {
        let error = Error::malformed(
            "the stored prefix table in on.redb",
            WireError::Truncated(9),
        );
        assert_eq!(error.kind(), ErrorKind::Malformed);
        let source = error.source().and_then(|s| s.downcast_ref::<WireError>());
        assert_eq!(source, Some(&WireError::Truncated(9)));
        assert_eq!(error.to_string(), "the stored prefix table in on.redb");
        assert_eq!(
            error.report().to_string(),
            "the stored prefix table in on.redb: message truncated at byte 9"
        );
    }

    #[test]
    fn an_io_error_is_reported_with_its_os_error_once() {
        let os = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let error = Error::io("reading /x/cluster.key", os);
        assert_eq!(error.to_string(), "reading /x/cluster.key");
        assert_eq!(
            error.report().to_string(),
            "reading /x/cluster.key: no such file"
        );
        assert!(error
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some());
    }

    #[test]
    fn a_kind_without_a_source_reports_its_message_alone() {
        let error = Error::key("the cluster key k is mode 0644; run `chmod 600 k`");
        assert_eq!(error.kind(), ErrorKind::Key);
        assert!(error.source().is_none());
        assert_eq!(error.report().to_string(), error.to_string());
    }
}

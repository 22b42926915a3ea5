//! Strata's object store, following the 6Stor design.
//!
//! - [`addr`]: the IPv6 layout: metadata groups, quadrant-based metadata
//!   addresses derived from an object's name, storage-node prefixes.
//! - [`wire`]: pure encode/decode of UDP metadata messages; [`data`]: the
//!   TCP data frames.
//! - [`table`]: the prefix table the orchestrator publishes.
//! - [`metadb`] and [`mn`]: the metadata node's redb database and its
//!   protocol state machine (deterministic, no I/O).
//! - [`client`]: the client's metadata calls as state machines, and the
//!   async client that runs them over UDP and streams data over TCP.
//! - [`sn`]: the storage node (replica files with CRC-32C, fsync before
//!   acknowledging, chain forwarding).
//! - [`on`]: the orchestrator (admission, prefix assignment, heartbeats).
//! - [`auth`]: the cluster key and the seals of internal messages.
//! - [`node`]: runtimes that put the roles on sockets; [`cluster`] starts
//!   a whole cluster in one process (`strata store up`).
//!
//! The library never prints and never exits.

pub mod addr;
pub mod auth;
pub mod bench;
pub mod client;
pub mod cluster;
pub mod data;
pub mod metadb;
pub mod mmsg;
pub mod mn;
pub mod node;
pub mod on;
pub mod routes;
pub mod sn;
pub mod table;
pub mod tenant;
pub mod wire;

pub use wire::Code;

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
    Wire(#[from] wire::WireError),
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

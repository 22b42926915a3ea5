//! Strata's NBD server: serves disks of the engine over the Network Block
//! Device protocol (fixed newstyle, structured replies, `base:allocation`,
//! TLS).
//!
//! Layers, innermost first:
//!
//! - [`proto`]: the wire format, pure encode/decode, no I/O;
//! - [`command`]: checks a request against the export and session, pure;
//! - [`export`]: runs checked requests against a
//!   [`strata_block::BlockDevice`] (blocking) and encodes the replies;
//! - [`exports`]: the set of exports, which may change while serving;
//! - the handshake and transmission loops, and [`server`]: sockets,
//!   connection limits and shutdown, on tokio;
//! - [`tls`]: credentials for `NBD_OPT_STARTTLS` (rustls).
//!
//! The library never prints and never exits; it logs with `tracing`.

mod budget;
pub mod command;
pub mod export;
pub mod exports;
mod handshake;
pub mod proto;
mod relay;
mod reply;
pub mod server;
pub mod tls;
mod transmission;

pub use budget::DEFAULT_BUFFER_BUDGET;
pub use export::Export;
pub use exports::ExportSet;
pub use server::{raise_open_file_limit, Server, ServerConfig, ShutdownHandle};
pub use tls::{TlsCredentials, TlsError};

/// Why a server could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration cannot work.
    #[error("{0}")]
    Config(String),
    /// A listener could not be created.
    #[error("cannot listen on {0}: {1}")]
    Bind(String, #[source] std::io::Error),
    /// An export could not be flushed at shutdown.
    #[error("flushing export '{0}' failed: {1}")]
    Flush(String, String),
}

/// Why one connection ended early (logged, never fatal to the server).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    /// The socket failed or the client went away.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The client broke the protocol.
    #[error("{0}")]
    Proto(#[from] proto::ProtoError),
    /// The client asked for something that ends the session.
    #[error("{0}")]
    Refused(String),
}

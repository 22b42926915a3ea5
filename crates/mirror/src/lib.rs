//! Collective image distribution: a per-host *mirror* of a remote base
//! image that fetches chunks on first reference, exchanges them with
//! peer mirrors and prefetches adaptively (after Nicolae et al., JPDC 2016).
//!
//! Layers, innermost first:
//!
//! - [`chunk`]: the per-chunk state machine (REMOTE / PREFETCH / LOCAL /
//!   READ / WRITTEN), the adaptive prefetch policy and the trace cursor;
//!   pure, no I/O;
//! - [`digest`]: the image's manifest of per-chunk SHA-256 digests, which
//!   every chunk is checked against, wherever it came from;
//! - [`repo`]: where the image lives (a [`repo::Repository`]: a file path
//!   or an HTTP server with range reads), and [`repo_server`], a small
//!   HTTP range server with a token-bucket bandwidth cap for tests and
//!   benchmarks;
//! - [`wire`]: the peer protocol's frames, pure encode and decode;
//! - [`peer`]: TCP links between mirrors (advertisements, requests,
//!   replies, on-demand before prefetch);
//! - [`state`]: the chunk-state map on disk, recovered after a restart;
//! - [`topology`]: which peers a mirror connects to;
//! - [`mirror`]: [`Mirror`], which ties it all together and implements
//!   [`strata_disk::BlockDevice`] so the NBD server can export it.
//!
//! The library never prints and never exits; it logs with `tracing`.

pub mod chunk;
pub mod digest;
pub mod mirror;
pub mod peer;
pub mod rate;
pub mod repo;
pub mod repo_server;
pub mod state;
pub mod topology;
pub mod wire;

pub use mirror::{Mirror, MirrorConfig, MirrorStats};

/// An error of the mirror service. Messages say what, where, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// A file or socket operation failed.
    #[error("{what}: {error}")]
    Io {
        /// What was being done, and on what.
        what: String,
        /// The OS error.
        error: std::io::Error,
    },
    /// The repository could not serve what was asked.
    #[error("repository {repo}: {detail}")]
    Repo {
        /// The repository (URL or path).
        repo: String,
        /// What went wrong.
        detail: String,
    },
    /// A manifest, state map, trace or peer message is malformed.
    #[error("{0}")]
    Invalid(String),
    /// A configuration value cannot work.
    #[error("{0}")]
    Config(String),
}

/// Result alias for this crate.
pub type Result<T, E = MirrorError> = std::result::Result<T, E>;

/// Wraps an I/O error with what was being done.
pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> MirrorError {
    let what = what.into();
    move |error| MirrorError::Io { what, error }
}

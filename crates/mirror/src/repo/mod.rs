//! Repositories: where the image and its side files (the chunk manifest,
//! the access trace, the rendezvous list) live.
//!
//! Three kinds, one module each: a file path, local or on a network file
//! system ([`file`]); an HTTP server with range reads (`strata mirror
//! repo-serve`, or any server that answers `Range:` with 206; [`http`]);
//! and an image kept as parts in Strata's object store ([`store`]).
//! [`open`] picks one from how the user named the repository.

pub mod file;
pub mod http;
pub mod store;

use crate::{MirrorError, Result};
pub use file::FileRepo;
pub use http::HttpRepo;

/// Side file suffixes a repository may hold next to the image.
pub const SIDECARS: [&str; 3] = [crate::digest::SUFFIX, TRACE_SUFFIX, PEERS_SUFFIX];
/// Suffix of the recorded first-read trace.
pub const TRACE_SUFFIX: &str = ".trace";
/// Suffix of the rendezvous list.
pub const PEERS_SUFFIX: &str = ".peers";
/// Longest peer address accepted at rendezvous.
pub const MAX_ADDR_LEN: usize = 128;
/// Most peers a rendezvous list returns.
pub const MAX_PEERS: usize = 4096;

/// Where an image lives. Reads are blocking: they run on the NBD server's
/// worker threads and the mirror's prefetch threads.
pub trait Repository: Send + Sync + std::fmt::Debug {
    /// The repository as the user named it, for messages.
    fn describe(&self) -> String;

    /// Fills `buf` with image bytes from `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// The side file `IMAGE{suffix}`, if it exists; longer than `max`
    /// bytes is an error.
    fn get_sidecar(&self, suffix: &str, max: u64) -> Result<Option<Vec<u8>>>;

    /// Stores the side file `IMAGE{suffix}` (replacing it).
    fn put_sidecar(&self, suffix: &str, data: &[u8]) -> Result<()>;

    /// Rendezvous: records `me` (a peer address) as a mirror of this image
    /// and returns every address recorded so far, `me` included.
    fn rendezvous(&self, me: &str) -> Result<Vec<String>>;
}

/// Opens `spec`: an `http://` URL, a `store://HOST:PORT/NAME` image in
/// the object store, or a file path.
pub fn open(spec: &str) -> Result<Box<dyn Repository>> {
    if spec.starts_with("http://") {
        Ok(Box::new(HttpRepo::new(spec)))
    } else if spec.starts_with(store::SCHEME) {
        Ok(Box::new(store::StoreRepo::open(spec)?))
    } else if spec.contains("://") {
        Err(MirrorError::Config(format!(
            "repository '{spec}': only http://, store:// URLs and file paths are supported"
        )))
    } else {
        Ok(Box::new(FileRepo::open(spec)?))
    }
}

/// Parses a rendezvous list: one address per line, bounded.
pub fn parse_peer_list(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && l.len() <= MAX_ADDR_LEN)
        .take(MAX_PEERS)
        .map(String::from)
        .collect()
}

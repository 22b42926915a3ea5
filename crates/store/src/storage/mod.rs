//! The storage node. Its decisions live in a deterministic core without
//! I/O ([`core`]: admission and counters; [`put`]: one Put's machine;
//! [`collect`]: garbage collection; [`file`]: the replica file's layout
//! and what a read may serve). The I/O shell executes them on real files
//! and sockets ([`replicas`], with Gets served by [`reader`] and ranged
//! reads by [`range`], and the
//! directory syncs of concurrent Puts shared by [`group_sync`]), [`scrub`]
//! re-reads the replicas in the background and reports damaged ones, and
//! [`server`] runs the node on its TCP listener. See
//! docs/design/storage-node.md.

pub mod collect;
pub mod core;
pub mod file;
pub mod group_sync;
pub mod limits;
pub mod local;
pub mod object_cache;
pub mod put;
pub mod range;
mod reader;
pub mod replicas;
pub mod schedule;
pub mod schedule_file;
pub mod scheduled;
pub mod scrub;
/// Zero-copy sends, shared with the S3 gateway (which links only the client).
pub use strata_store_client::sendfile;
pub mod server;
mod whole;

//! The client of Strata's object store: what a tenant, the mirror or the
//! operator's commands link, without the servers or their database.
//!
//! - [`transport`]: UDP calls (resent, sealed when the caller holds the
//!   cluster key) and the prefix table fetched from the orchestrator.
//! - [`stream`]: the TCP data frames read and written on async streams.
//! - [`erasure`]: erasure coding: stripes encoded and decoded, and an
//!   object's fragments read from any k of them.
//! - [`range_body`]: a ranged read's answer, checked chunk by chunk.
//! - [`client`]: the metadata calls as state machines, and the async
//!   client that runs them over UDP and streams data over TCP.
//! - [`admin`]: the operator's requests to the orchestrator.
//! - [`sendfile`]: a file's bytes sent on a socket from the page cache
//!   (the storage node's replicas, and the S3 gateway's local ones).
//! - [`nowait`]: a file opened and read only when that costs no wait on
//!   the disk (so an async worker may do it itself).
//!
//! The protocol itself (addresses, messages, table, keys) is
//! [`strata_store_protocol`], re-exported as [`protocol`]. The library
//! never prints and never exits.

pub mod admin;
pub mod client;
pub mod erasure;
pub mod nowait;
pub mod range_body;
pub mod read_plan;
pub mod sendfile;
pub mod stream;
pub mod transport;

pub use strata_store_protocol as protocol;
pub use strata_store_protocol::{Code, Error};

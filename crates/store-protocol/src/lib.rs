//! The protocol of Strata's object store (6Stor design): what clients,
//! servers and fuzzers share, with no async runtime and no database.
//!
//! Modules, each using only the ones listed before it:
//! - [`addr`]: the IPv6 layout: metadata groups, quadrant-based metadata
//!   addresses derived from an object's name, storage-node prefixes.
//! - [`codec`]: the binary writer and bounds-checked reader, and
//!   [`codec::WireError`].
//! - [`error`]: the codes answers carry and the store's [`Error`].
//! - [`key`]: the cluster keyring and the secrets derived from it.
//! - [`tenant`]: tenants' ids and credentials.
//! - [`class`]: storage classes (replicas or erasure-coded fragments)
//!   and the stripe layout of an erasure-coded object.
//! - [`wire`]: pure encode/decode of UDP metadata messages.
//! - [`scope`]: the names a tenant's request may touch.
//! - [`table`]: the prefix table the orchestrator publishes.
//! - [`ticket`]: tickets for the data path and link proofs for renames.
//! - [`auth`]: the gate every datagram passes, the seals' checks (and,
//!   for the paths callers know, the key and ticket items again).
//! - [`range`]: the byte ranges a ranged read may ask, and the
//!   checksummed chunks that cover one.
//! - [`data`]: the TCP data frames' encoding and their credentials'
//!   check.
//!
//! The library never prints and never exits.

pub mod addr;
pub mod auth;
pub mod class;
pub mod codec;
pub mod data;
pub mod error;
pub mod key;
pub mod range;
pub mod scope;
pub mod table;
pub mod tenant;
pub mod ticket;
pub mod wire;

pub use error::{Code, Error, ErrorKind};

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

pub mod bench;
pub mod cluster;
pub mod metadata;
pub mod mmsg;
pub mod orchestrator;
pub mod routes;
pub mod runtime;
pub mod storage;

// The protocol and the client live in their own crates
// (`strata-store-protocol`, `strata-store-client`). These re-exports keep
// their old paths under `strata_store` for the CLI; they go once the CLI
// uses the client crate.
pub use strata_store_client::client;
pub use strata_store_protocol::{addr, auth, table, tenant, wire, Code, Error};

// The servers' old module names, for the CLI until it moves to the new
// paths.
pub use metadata::database as metadb;
pub use metadata::state as mn;
pub use orchestrator::state as on;
pub use storage::replicas as sn;

/// The runtimes under their old path: what every role shares
/// ([`runtime`]), each role's server, the client's transport and
/// [`strata_store_protocol::wire::malformed`].
pub mod node {
    pub use crate::metadata::server::*;
    pub use crate::orchestrator::server::*;
    pub use crate::runtime::*;
    pub use crate::storage::server::*;
    pub use strata_store_client::transport::{
        fetch_table, ok_body, request_id, udp_call, udp_call_padded,
    };
    pub use strata_store_protocol::wire::malformed;
}

/// The TCP data frames: their encoding ([`strata_store_protocol::data`])
/// and their reading and writing on streams
/// ([`strata_store_client::stream`]), under their old path.
pub mod data {
    pub use strata_store_client::stream::{read_request, read_status, write_error};
    pub use strata_store_protocol::data::*;
}

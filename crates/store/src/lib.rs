//! Strata's object store servers, following the 6Stor design. The
//! protocol (addresses, wire format, data frames, prefix table,
//! authentication) is `strata-store-protocol`; the client is
//! `strata-store-client`.
//!
//! - [`metadata`]: the metadata node: its redb database, its protocol
//!   state machine (deterministic, no I/O) and its server.
//! - [`orchestrator`]: admission, prefix assignment, heartbeats, drains
//!   and handovers: its state machine and its server.
//! - [`storage`]: the storage node (replica files with CRC-32C, fsync
//!   before acknowledging, chain forwarding).
//! - [`runtime`]: what every role's server shares; [`cluster`] starts a
//!   whole cluster in one process (`strata store up`); [`bench`] is the
//!   load generator; [`routes`] installs routed mode's host routes;
//!   [`metrics`] serves the storage nodes' `/metrics`.
//!
//! The library never prints and never exits.

pub mod bench;
pub mod cluster;
pub mod metadata;
pub mod metrics;
pub mod mmsg;
pub mod orchestrator;
pub mod routes;
pub mod runtime;
pub mod storage;

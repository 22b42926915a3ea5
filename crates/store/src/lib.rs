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

/// What several modules' tests check alike.
#[cfg(test)]
pub(crate) mod test_support {
    use strata_store_protocol::Error;

    /// Asserts that `err` is a database error whose source is redb's
    /// "already open", and returns that source.
    pub(crate) fn assert_already_open(err: &Error) -> &redb::DatabaseError {
        use std::error::Error as _;
        assert_eq!(err.kind(), strata_store_protocol::ErrorKind::Database);
        let redb = err
            .source()
            .and_then(|s| s.downcast_ref::<redb::DatabaseError>());
        assert!(
            matches!(redb, Some(redb::DatabaseError::DatabaseAlreadyOpen)),
            "{err:?}"
        );
        redb.expect("checked above")
    }
}

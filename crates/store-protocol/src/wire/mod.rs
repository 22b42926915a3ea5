//! Pure encoding and decoding of the store's messages: UDP metadata
//! messages (one per datagram) and the headers of TCP data frames.
//!
//! Every length read from the wire is checked against a fixed bound before
//! anything is allocated, and every decoder returns an error, never panics.
//!
//! By concern, each module using only those listed before it:
//! - `frame`: the datagram's header and its seals, read without
//!   decoding the body.
//! - `body`: the messages ([`Msg`], [`Body`]) and what they carry, with
//!   their bounds.
//! - `kinds`: the one table of message kinds with their classes, which
//!   encoding, decoding and the gate read.
//! - `records`: the parts several bodies share (records, rows, cursors,
//!   tickets), each written and read in one place.
//! - `encode` and `decode`: a [`Msg`] to a datagram and back.
//!
//! Everything public is re-exported here: callers name `wire::Msg`,
//! `wire::peek` and so on, not the module that holds them.

mod body;
mod decode;
mod encode;
mod frame;
mod kinds;
mod records;

pub use self::body::{
    Body, GatherCursor, ListEntry, Msg, Record, RenameLink, Role, Row, SyncEntry, SyncSum,
    MAX_DATA_REPLICAS, MAX_GATHER_GROUPS, MAX_OBJECT, MAX_PULL_ROWS, MAX_REFERENCED,
    MAX_SYNC_ENTRIES, MAX_SYNC_SUMS, MAX_TICKET,
};
pub use self::decode::malformed;
pub use self::frame::{
    peek, seal_parts, tenant_parts, Header, TenantSeal, HEADER_LEN, SEAL_LEN, TENANT_SEAL_FIXED,
};
pub use self::kinds::{is_answer, is_client_request, is_control, Class, Kind, KIND_GET_TABLE};
pub use self::records::{decode_record, encode_record};
pub use crate::codec::{check_name, Reader, WireError, Writer, MAX_DATAGRAM, MAX_NAME};
pub use crate::error::Code;
pub use crate::key::Fingerprints;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

// For the tests: the seal flags of the kind byte.
#[cfg(test)]
use self::frame::{SEALED, TENANT};

/// An unspecified socket address, for messages that carry none.
pub fn no_endpoint() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
}

#[cfg(test)]
mod tests;

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
    Body, Fragments, GatherCursor, ListEntry, Msg, Record, RenameLink, RepairCounts, Role, Row,
    SyncEntry, SyncSum, MAX_ATTRIBUTES, MAX_DAMAGED, MAX_DATA_REPLICAS, MAX_GATHER_GROUPS,
    MAX_INLINE, MAX_OBJECT, MAX_PULL_ROWS, MAX_REFERENCED, MAX_SYNC_ENTRIES, MAX_SYNC_SUMS,
    MAX_TICKET,
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

/// An unspecified socket address, for messages that carry none.
pub fn no_endpoint() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
}

#[cfg(test)]
mod tests {
    // Every kind round-trips, every bound holds, and damaged or hostile
    // datagrams are refused without a panic.
    use super::frame::{SEALED, TENANT};
    use super::*;
    use proptest::prelude::*;

    fn record(name: &str) -> Record {
        Record {
            name: name.into(),
            size: 306_000,
            crc: 0xdead_beef,
            version: 7,
            meta: vec![1, 2, 3],
            replicas: vec![u128::MAX, 5],
            rename: None,
            attributes: b"{\"etag\":\"x\"}".to_vec(),
            fragments: None,
            inline: None,
        }
    }

    /// A record holding its object's bytes.
    fn inline_record(name: &str, data: &[u8]) -> Record {
        Record {
            size: data.len() as u64,
            crc: crc32c::crc32c(data),
            replicas: Vec::new(),
            inline: Some(data.to_vec()),
            ..record(name)
        }
    }

    fn post_inline(data: &[u8]) -> Body {
        Body::PostInline {
            name: "x".into(),
            class: None,
            crc: crc32c::crc32c(data),
            data: data.to_vec(),
            attributes: vec![1, 2, 3],
        }
    }

    /// An erasure-coded record: ec(2,1).
    fn coded_record(name: &str) -> Record {
        let mut record = record(name);
        record.replicas = vec![7, 8, 9];
        record.fragments = Some(Fragments {
            data: 2,
            crcs: vec![1, 2, 3],
        });
        record
    }

    fn samples() -> Vec<Body> {
        vec![
            Body::PostBegin {
                name: "a/b".into(),
                size: 9,
                class: None,
            },
            Body::PostBegin {
                name: "a/c".into(),
                size: 9,
                class: Some(crate::class::StorageClass::ErasureCoded { data: 4, parity: 2 }),
            },
            Body::PostBegin {
                name: "a/d".into(),
                size: 9,
                class: Some(crate::class::StorageClass::Replicated { copies: 2 }),
            },
            Body::PostPlan {
                version: 3,
                size: 12,
                replicas: vec![1, 2],
                ticket: vec![7; 40],
                data_fragments: 0,
            },
            Body::PostPlan {
                version: 3,
                size: 12,
                replicas: vec![1, 2, 3],
                ticket: vec![7; 40],
                data_fragments: 2,
            },
            Body::PostCommit {
                name: "y".into(),
                version: 1,
                crc: 2,
                attributes: Vec::new(),
                fragment_crcs: vec![5, 6, 7],
            },
            Body::PostCommit {
                name: "x".into(),
                version: 1,
                crc: 2,
                attributes: vec![9; MAX_ATTRIBUTES],
                fragment_crcs: Vec::new(),
            },
            post_inline(&[]),
            post_inline(&[0x5a; MAX_INLINE]),
            Body::PostInline {
                name: "a/e".into(),
                class: Some(crate::class::StorageClass::ErasureCoded { data: 4, parity: 2 }),
                crc: crc32c::crc32c(b"small"),
                data: b"small".to_vec(),
                attributes: Vec::new(),
            },
            Body::Found {
                record: inline_record("i", &[7; MAX_INLINE]),
                ticket: vec![],
            },
            Body::Replicate {
                record: inline_record("i", b"inline"),
            },
            Body::MgRows {
                rows: vec![Row::Record(inline_record("i", b"row"))],
                more: false,
            },
            Body::PostAbort {
                name: "x".into(),
                version: 1,
            },
            Body::Update {
                record: Record {
                    rename: Some(RenameLink::To("elsewhere".into())),
                    ..record("u")
                },
                if_version: 9,
            },
            Body::Found {
                record: Record {
                    rename: Some(RenameLink::From("before".into())),
                    ..record("r")
                },
                ticket: vec![],
            },
            Body::Link {
                record: record("l"),
                proof: vec![],
            },
            Body::Link {
                record: record("l"),
                proof: vec![9; 60],
            },
            Body::GetLinkProof { name: "p".into() },
            Body::LinkProof {
                record: record("p"),
                proof: vec![8; 70],
            },
            Body::Found {
                record: coded_record("e"),
                ticket: vec![1; 30],
            },
            Body::Get { name: "g".into() },
            Body::Refresh {
                name: "s".into(),
                version: 6,
                copy: u128::MAX,
            },
            Body::SyncCheck { entries: vec![] },
            Body::SyncCheck {
                entries: vec![
                    SyncEntry {
                        name: "a/b".into(),
                        copy: u128::MAX,
                        version: 3,
                        deleted: false,
                    },
                    SyncEntry {
                        name: "c".into(),
                        copy: 1,
                        version: u64::MAX,
                        deleted: true,
                    },
                ],
            },
            Body::SyncDigest {
                sums: vec![SyncSum {
                    group: u32::MAX,
                    index: 2,
                    sum: 0x1234_5678_9abc_def0,
                }],
            },
            Body::SyncDiff {
                pairs: vec![(0, 1), (u32::MAX, 255)],
            },
            Body::Found {
                record: record("f"),
                ticket: vec![1; MAX_TICKET],
            },
            Body::Delete {
                name: "d".into(),
                if_version: 4,
                keep_data: true,
            },
            Body::List {
                prefix: "".into(),
                after: "k".into(),
                limit: 100,
            },
            Body::ListPage {
                entries: vec![ListEntry {
                    name: "n".into(),
                    size: 1,
                    version: 2,
                    crc: 0xfeed_f00d,
                    attributes: vec![4; 10],
                }],
                more: true,
            },
            Body::Replicate {
                record: record("r"),
            },
            Body::Unreplicate {
                name: "u".into(),
                version: 9,
            },
            Body::Done { version: 5 },
            Body::Error {
                code: Code::Conflict,
                message: "busy".into(),
            },
            Body::GetTable,
            Body::Table {
                bytes: vec![1, 2, 3],
            },
            Body::Register {
                role: Role::Sn,
                uuid: 42,
                endpoint: "127.0.0.1:9000".parse().unwrap(),
                capacity: 10,
                free: 5,
                device: 1,
                keys: Some(Fingerprints {
                    active: 1,
                    other: Some(u64::MAX),
                }),
            },
            Body::Register {
                role: Role::Mn,
                uuid: 42,
                endpoint: "[::1]:9000".parse().unwrap(),
                capacity: 0,
                free: 0,
                device: 0,
                keys: None,
            },
            Body::Registered { index: 3 },
            Body::Heartbeat {
                uuid: 1,
                free: 2,
                objects: 3,
                keys: None,
            },
            Body::Heartbeat {
                uuid: 1,
                free: 2,
                objects: 3,
                keys: Some(Fingerprints {
                    active: 9,
                    other: None,
                }),
            },
            Body::Retire { uuid: 8 },
            Body::CancelRetire { uuid: u64::MAX },
            Body::RevokeTenant {
                tenant: "acme".into(),
                below: 3,
            },
            Body::Referenced {
                addrs: vec![1, u128::MAX],
            },
            Body::ReferencedBy { addrs: vec![] },
            Body::MgPull {
                group: 7,
                epoch: 0,
                tombs: false,
                after: "".into(),
            },
            Body::MgPull {
                group: u32::MAX,
                epoch: 99,
                tombs: true,
                after: "p/q".into(),
            },
            Body::MgRows {
                rows: vec![
                    Row::Record(record("a")),
                    Row::Tomb {
                        name: "b".into(),
                        version: 4,
                    },
                ],
                more: true,
            },
            Body::MgRows {
                rows: vec![],
                more: false,
            },
            Body::MoveReport {
                group: 3,
                to: 2,
                ready: true,
                epoch: 12,
            },
            Body::DrainReport {
                slot: 1,
                epoch: 40,
                drain: 38,
                index: 3,
                left: 7,
                copies: 2,
                unplaceable: 7,
            },
            Body::Error {
                code: Code::Moving,
                message: "moving".into(),
            },
            Body::MgGather {
                groups: vec![9],
                slot: 1,
                from: GatherCursor::default(),
            },
            Body::MgGather {
                groups: vec![0, 7, u32::MAX],
                slot: u16::MAX,
                from: GatherCursor {
                    tombs: true,
                    group: 200,
                    after: "a/b".into(),
                },
            },
            Body::MgGathered {
                rows: vec![
                    Row::Record(record("c")),
                    Row::Tomb {
                        name: "d".into(),
                        version: 7,
                    },
                ],
                next: Some(GatherCursor {
                    tombs: false,
                    group: 3,
                    after: "d".into(),
                }),
            },
            Body::MgGathered {
                rows: vec![],
                next: None,
            },
            Body::PutAbandoned { replica: 1 << 90 },
            Body::PadTo { size: 1200 },
            Body::DamagedReplicas {
                addrs: vec![1 << 70, u128::MAX],
            },
            Body::DamagedReplicas { addrs: vec![] },
            Body::BadReplica {
                name: "acme/x".into(),
                replica: 1 << 90 | 5,
            },
            Body::GetRepairCounts,
            Body::RepairCounts(RepairCounts {
                copies_started: 1,
                rebuilds_started: 2,
                committed: 3,
                failed: 4,
                in_flight: 5,
                damaged_waiting: u64::MAX,
            }),
        ]
    }

    #[test]
    fn every_kind_has_its_class_and_round_trips() {
        let samples = samples();
        for kind in Kind::all() {
            assert_eq!(Kind::from_number(kind as u8), Some(kind));
            let body = samples
                .iter()
                .find(|b| b.kind() == kind)
                .unwrap_or_else(|| panic!("samples() has no {kind:?}"));
            let bytes = Msg::new(3, 4, body.clone()).encode().unwrap();
            assert_eq!(peek(&bytes).unwrap().kind, kind as u8);
            assert_eq!(Msg::decode(&bytes).unwrap().body.kind(), kind);
            let class = kind.class();
            assert_eq!(is_client_request(kind as u8), class == Class::TenantRequest);
            assert_eq!(is_answer(kind as u8), class == Class::Answer);
            assert_eq!(is_control(kind as u8), class == Class::Control);
        }
        assert_eq!(Kind::all().count(), 44);
        for unknown in [0, 45, 63, 255] {
            assert_eq!(Kind::from_number(unknown), None);
            assert!(!is_client_request(unknown) && !is_answer(unknown) && !is_control(unknown));
        }
        // The classes as the gate's number lists had them before the
        // table: a kind moving class is a change of what the gate admits.
        let numbers = |class: Class| -> Vec<u8> {
            Kind::all()
                .filter(|k| k.class() == class)
                .map(|k| k as u8)
                .collect()
        };
        assert_eq!(
            numbers(Class::TenantRequest),
            [1, 3, 4, 5, 6, 8, 9, 21, 35, 41, 42]
        );
        assert_eq!(
            numbers(Class::Answer),
            [2, 7, 10, 13, 14, 16, 18, 23, 25, 28, 34, 36, 39, 44]
        );
        assert_eq!(numbers(Class::Control), [20, 30]);
        assert_eq!(KIND_GET_TABLE, 15);
        assert_eq!(Kind::GetTable.class(), Class::Internal);
    }

    #[test]
    fn every_message_round_trips() {
        for body in samples() {
            let m = Msg::new(77, 0xabc, body);
            let bytes = m.encode().unwrap();
            assert_eq!(Msg::decode(&bytes).unwrap(), m);
            // Every strict prefix is rejected, never accepted or panicking
            // (a table's bytes are opaque here: the table decoder checks them).
            let header_only = matches!(m.body, Body::Table { .. });
            // Except a cut before an optional trailing field, which
            // decodes as the message without it (as an older node sent it).
            let mut older = m.clone();
            if let Body::Register { keys, .. } | Body::Heartbeat { keys, .. } = &mut older.body {
                *keys = None;
            }
            for cut in 0..if header_only { 28 } else { bytes.len() } {
                match Msg::decode(&bytes[..cut]) {
                    Ok(d) if older != m && d == older => {}
                    r => assert!(r.is_err(), "{m:?} cut at {cut}"),
                }
            }
        }
    }

    #[test]
    fn names_are_bounded() {
        assert!(check_name("").is_err());
        assert!(check_name(&"n".repeat(MAX_NAME)).is_ok());
        let long = "n".repeat(10_000);
        assert!(check_name(&long).unwrap_err().contains("10000 bytes"));
        // A 10,000-byte name on the wire is refused with the reason.
        let bytes = Msg::new(1, 0, Body::Get { name: long }).encode().unwrap();
        let err = Msg::decode(&bytes).unwrap_err();
        assert!(err.to_string().contains("limit is 4096"), "{err}");
        let bytes = Msg::new(1, 0, Body::Get { name: "".into() })
            .encode()
            .unwrap();
        assert!(Msg::decode(&bytes)
            .unwrap_err()
            .to_string()
            .contains("empty"));
    }

    #[test]
    fn damaged_replica_reports_are_bounded() {
        // A full report fits a sealed datagram and round-trips.
        let full: Vec<u128> = (0..MAX_DAMAGED as u128).map(|i| i << 64 | 7).collect();
        let m = Msg::new(1, 0, Body::DamagedReplicas { addrs: full });
        let key = crate::key::ClusterKey::from_bytes(&[3; crate::key::KEY_LEN]);
        let sealed = m.seal(&key, 1).unwrap();
        assert!(sealed.len() <= MAX_DATAGRAM);
        assert_eq!(Msg::decode(&m.encode().unwrap()).unwrap(), m);
        // More than the bound are never encoded...
        let over: Vec<u128> = (0..MAX_DAMAGED as u128 + 5).collect();
        let bytes = Msg::new(1, 0, Body::DamagedReplicas { addrs: over })
            .encode()
            .unwrap();
        match Msg::decode(&bytes).unwrap().body {
            Body::DamagedReplicas { addrs } => assert_eq!(addrs.len(), MAX_DAMAGED),
            other => panic!("{other:?}"),
        }
        // ...and a count above it is refused before anything is read.
        let mut bytes = Msg::new(1, 0, Body::DamagedReplicas { addrs: vec![] })
            .encode()
            .unwrap();
        let at = bytes.len() - 2;
        bytes[at..].copy_from_slice(&(MAX_DAMAGED as u16 + 1).to_be_bytes());
        let err = Msg::decode(&bytes).unwrap_err().to_string();
        assert!(
            err.contains("257 damaged replicas in one report; the limit is 256"),
            "{err}"
        );
        // A tenant's report names its object with a valid name.
        let bytes = Msg::new(
            1,
            0,
            Body::BadReplica {
                name: String::new(),
                replica: 1,
            },
        )
        .encode()
        .unwrap();
        assert!(Msg::decode(&bytes).is_err());
    }

    #[test]
    fn a_post_inline_over_the_limit_or_with_a_wrong_checksum_is_refused() {
        // One byte over the limit is refused, with what to do instead.
        let bytes = Msg::new(1, 0, post_inline(&[0; MAX_INLINE + 1]))
            .encode()
            .unwrap();
        let error = Msg::decode(&bytes).unwrap_err().to_string();
        assert!(
            error.contains("4097 bytes inline") && error.contains("PostBegin"),
            "{error}"
        );
        // Bytes that do not match the CRC-32C sent with them.
        let mut body = post_inline(b"twelve bytes");
        if let Body::PostInline { crc, .. } = &mut body {
            *crc ^= 1;
        }
        let bytes = Msg::new(1, 0, body).encode().unwrap();
        let error = Msg::decode(&bytes).unwrap_err().to_string();
        assert!(
            error.contains("CRC-32C") && error.contains("damaged"),
            "{error}"
        );
        // A declared length past the datagram's end is a truncation.
        let mut bytes = Msg::new(1, 0, post_inline(b"abc")).encode().unwrap();
        let length_at = bytes.len() - 2 - 3 - 3 - 2;
        bytes[length_at..length_at + 2].copy_from_slice(&100u16.to_be_bytes());
        assert!(Msg::decode(&bytes).is_err());
        // A record in a Found whose inline bytes were damaged on the way.
        let found = Body::Found {
            record: inline_record("f", b"inline data"),
            ticket: vec![],
        };
        let mut bytes = Msg::new(1, 0, found).encode().unwrap();
        let at = bytes.len() - 3;
        bytes[at] ^= 0x40;
        let error = Msg::decode(&bytes).unwrap_err().to_string();
        assert!(error.contains("damaged"), "{error}");
    }

    #[test]
    fn oversized_datagram_is_refused() {
        let big = vec![0u8; MAX_DATAGRAM + 1];
        assert_eq!(
            Msg::decode(&big),
            Err(WireError::TooLarge(MAX_DATAGRAM + 1))
        );
    }

    /// The decoding error of an empty page of `body` whose row count
    /// (just before its one-byte trailer) is made `count`.
    fn with_row_count(body: Body, count: u16) -> String {
        let mut bytes = Msg::new(1, 0, body).encode().unwrap();
        let at = bytes.len() - 3;
        bytes[at..at + 2].copy_from_slice(&count.to_be_bytes());
        Msg::decode(&bytes).unwrap_err().to_string()
    }

    #[test]
    fn handover_pages_are_bounded() {
        // A count above the limit is refused before anything is allocated.
        let body = Body::MgRows {
            rows: vec![],
            more: false,
        };
        let err = with_row_count(body, u16::MAX);
        assert!(err.contains("limit is 2048"), "{err}");
        // A flag other than 0 or 1, and an unknown row kind, are refused.
        let mut bytes = Msg::new(
            1,
            0,
            Body::MgRows {
                rows: vec![Row::Tomb {
                    name: "n".into(),
                    version: 1,
                }],
                more: false,
            },
        )
        .encode()
        .unwrap();
        let last = bytes.len() - 1;
        bytes[last] = 2;
        assert!(Msg::decode(&bytes)
            .unwrap_err()
            .to_string()
            .contains("more flag"));
        bytes[last] = 0;
        bytes[30] = 5;
        assert!(Msg::decode(&bytes)
            .unwrap_err()
            .to_string()
            .contains("row kind 5"));
        // A full page of the largest rows still fits one datagram only if the
        // sender trims it: encoding refuses an oversized one instead.
        let big = Record {
            name: "n".repeat(MAX_NAME),
            ..record("x")
        };
        let rows = vec![Row::Record(big); 20];
        assert!(matches!(
            Msg::new(1, 0, Body::MgRows { rows, more: true }).encode(),
            Err(WireError::TooLarge(_))
        ));
    }

    #[test]
    fn gather_pages_and_cursors_are_bounded() {
        // A row count above the limit is refused before any allocation.
        let body = Body::MgGathered {
            rows: vec![],
            next: None,
        };
        let err = with_row_count(body, u16::MAX);
        assert!(err.contains("limit is 2048"), "{err}");
        // A next-page flag or a tombstone flag other than 0 or 1.
        let mut bytes = Msg::new(
            1,
            0,
            Body::MgGathered {
                rows: vec![],
                next: None,
            },
        )
        .encode()
        .unwrap();
        let last = bytes.len() - 1;
        bytes[last] = 7;
        let err = Msg::decode(&bytes).unwrap_err().to_string();
        assert!(err.contains("next-page flag"), "{err}");
        let gather = |after: String| {
            Msg::new(
                1,
                0,
                Body::MgGather {
                    groups: vec![1],
                    slot: 0,
                    from: GatherCursor {
                        tombs: false,
                        group: 1,
                        after,
                    },
                },
            )
            .encode()
            .unwrap()
        };
        let mut bytes = gather("x".into());
        let at = bytes.len() - 1 - 2 - 4 - 1;
        bytes[at] = 3;
        let err = Msg::decode(&bytes).unwrap_err().to_string();
        assert!(err.contains("gather tombstone flag"), "{err}");
        // A cursor name longer than any object name is refused.
        let err = Msg::decode(&gather("n".repeat(MAX_NAME + 1)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("gather cursor"), "{err}");
        // A group count above the limit is refused before any allocation.
        let mut bytes = gather("x".into());
        bytes[28..30].copy_from_slice(&u16::MAX.to_be_bytes());
        let err = Msg::decode(&bytes).unwrap_err().to_string();
        assert!(err.contains("limit is 4096"), "{err}");
    }

    fn key(byte: u8) -> crate::key::ClusterKey {
        crate::key::ClusterKey::from_bytes(&[byte; crate::auth::KEY_LEN])
    }

    const NOW: u64 = 1_700_000_000_000;

    #[test]
    fn sealed_messages_round_trip_and_check() {
        use crate::auth::{check_seal, AuthError};
        let k = key(1);
        for body in samples() {
            let m = Msg::new(77, 0xabc, body);
            let bytes = m.seal(&k, NOW).unwrap();
            assert_eq!(bytes.len(), m.encode().unwrap().len() + SEAL_LEN);
            assert_eq!(Msg::decode(&bytes).unwrap(), m, "a tenant reads it too");
            assert!(check_seal(&bytes, &k, NOW + 5).is_ok(), "{m:?}");
            assert!(peek(&bytes).unwrap().sealed);
            let plain = m.encode().unwrap();
            assert!(!peek(&plain).unwrap().sealed);
            assert_eq!(check_seal(&plain, &k, NOW), Err(AuthError::Unsealed));
        }
    }

    #[test]
    fn a_flipped_bit_a_wrong_key_a_stale_or_missing_tag_is_refused() {
        use crate::auth::{check_seal, AuthError, WINDOW_MS};
        let k = key(1);
        let m = Msg::new(
            9,
            3,
            Body::DrainReport {
                slot: 1,
                epoch: 40,
                drain: 38,
                index: 3,
                left: 0,
                copies: 0,
                unplaceable: 0,
            },
        );
        let good = m.seal(&k, NOW).unwrap();
        // Every bit, header and clock included, is covered by the tag.
        for i in 0..good.len() * 8 {
            let mut b = good.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(check_seal(&b, &k, NOW).is_err(), "bit {i} flipped");
        }
        assert_eq!(check_seal(&good, &key(2), NOW), Err(AuthError::BadTag));
        let late = NOW + WINDOW_MS + 1;
        assert_eq!(
            check_seal(&good, &k, late),
            Err(AuthError::Stale(WINDOW_MS + 1))
        );
        assert!(check_seal(&good, &k, NOW - WINDOW_MS).is_ok());
        // A tag cut short, or dropped with the flag left set.
        for cut in 1..=SEAL_LEN {
            let b = &good[..good.len() - cut];
            assert!(check_seal(b, &k, NOW).is_err(), "cut by {cut}");
        }
        // The flag cleared and the seal stripped: an unsealed message.
        let mut stripped = good[..good.len() - SEAL_LEN].to_vec();
        stripped[3] &= !SEALED;
        assert_eq!(check_seal(&stripped, &k, NOW), Err(AuthError::Unsealed));
        // A sealed flag on a message too short for a seal is refused.
        let mut short = Msg::new(1, 0, Body::GetTable).encode().unwrap();
        short[3] |= SEALED;
        assert!(Msg::decode(&short).is_err());
        assert_eq!(check_seal(&short, &k, NOW), Err(AuthError::Unsealed));
    }

    #[test]
    fn sync_lists_above_their_limits_are_refused() {
        let over = |kind: u8, max: usize| {
            let mut b = b"S6\x04".to_vec();
            b.push(kind);
            b.extend_from_slice(&[0; 24]);
            b.extend_from_slice(&((max + 1) as u16).to_be_bytes());
            b.extend_from_slice(&[0; 64]);
            Msg::decode(&b)
        };
        assert!(over(32, MAX_SYNC_ENTRIES).is_err());
        assert!(over(33, MAX_SYNC_SUMS).is_err());
        assert!(over(34, MAX_SYNC_SUMS).is_err());
        // A deleted flag other than 0 or 1 is refused.
        let m = Msg::new(
            1,
            2,
            Body::SyncCheck {
                entries: vec![SyncEntry {
                    name: "n".into(),
                    copy: 3,
                    version: 4,
                    deleted: true,
                }],
            },
        );
        let mut b = m.encode().unwrap();
        let last = b.len() - 1;
        b[last] = 2;
        assert!(Msg::decode(&b).is_err());
    }

    proptest! {
        #[test]
        fn sealed_messages_never_panic_or_pass_when_damaged(at in 0usize..400, byte in any::<u8>(), which in 0usize..40) {
            let all = samples();
            let m = Msg::new(5, 9, all[which % all.len()].clone());
            let k = key(7);
            let mut b = m.seal(&k, NOW).unwrap();
            let i = at % b.len();
            let changed = b[i] != byte;
            b[i] = byte;
            let _ = Msg::decode(&b);
            let checked = crate::auth::check_seal(&b, &k, NOW);
            prop_assert!(!changed || checked.is_err());
            for receiver in [crate::auth::Receiver::Mn, crate::auth::Receiver::On] {
                let mut gate = crate::auth::Gate::new(k.clone(), receiver);
                let _ = gate.admit(&b, NOW);
            }
        }

        #[test]
        fn a_gate_never_panics_nor_takes_unsealed_internal_kinds(bytes in proptest::collection::vec(any::<u8>(), 0..300), kind in 0u8..=255) {
            let mut b = b"S6\x04".to_vec();
            b.push(kind);
            b.extend_from_slice(&bytes);
            for receiver in [crate::auth::Receiver::Mn, crate::auth::Receiver::On] {
                let mut gate = crate::auth::Gate::new(key(3), receiver);
                for buf in [&b[..], &bytes[..]] {
                    if let crate::auth::Verdict::Accept { msg, sealed, .. } = gate.admit(buf, NOW) {
                        prop_assert!(!sealed, "a random datagram passed as sealed");
                        // Only the orchestrator's table request is taken
                        // without any seal; a metadata node takes nothing.
                        let k = msg.kind();
                        let open = receiver == crate::auth::Receiver::On && k == KIND_GET_TABLE;
                        prop_assert!(open, "unsealed kind {k} taken");
                    }
                }
            }
        }

        #[test]
        fn random_tenant_sealed_bytes_never_panic_nor_pass(
            kind in prop_oneof![Just(1u8), Just(3), Just(4), Just(5), Just(6), Just(8), Just(9), Just(21), 0u8..64],
            body in proptest::collection::vec(any::<u8>(), 0..200),
            id in "[a-z*]{0,8}",
            at_offset in 0u64..120_000,
            tag in proptest::collection::vec(any::<u8>(), 0..20),
        ) {
            // A well-formed header and trailer around random bytes, with
            // the tenant flag: a metadata node never takes it, whatever
            // the tenant it names.
            let mut b = b"S6\x04".to_vec();
            b.push(kind | TENANT);
            b.extend_from_slice(&[0; 24]);
            b.extend_from_slice(&body);
            b.extend_from_slice(id.as_bytes());
            b.push(id.len() as u8);
            b.extend_from_slice(&(NOW - 60_000 + at_offset).to_be_bytes());
            b.extend_from_slice(&tag);
            let _ = Msg::decode(&b);
            let _ = tenant_parts(&b);
            for receiver in [crate::auth::Receiver::Mn, crate::auth::Receiver::On] {
                let mut gate = crate::auth::Gate::new(key(3), receiver);
                let verdict = gate.admit(&b, NOW);
                let taken = matches!(verdict, crate::auth::Verdict::Accept { .. });
                prop_assert!(!taken, "random bytes passed a tenant's seal");
            }
        }

        #[test]
        fn tenant_sealed_requests_never_pass_when_damaged(at in 0usize..200, byte in any::<u8>(), which in 0usize..40) {
            let cred = crate::tenant::TenantCredential::issue(&key(7), crate::tenant::ADMIN).unwrap();
            // A tenant's Link is taken only with a genuine link proof.
            let proved = Body::Link {
                record: record("l"),
                proof: crate::auth::LinkProof::of(&record("l"), NOW + 1)
                    .seal(&key(7), crate::tenant::ADMIN),
            };
            let all: Vec<Body> = samples()
                .into_iter()
                .filter(|b| is_client_request(Msg::new(0, 0, b.clone()).kind()))
                .filter(|b| !matches!(b, Body::Link { .. }))
                .chain([proved])
                .collect();
            let m = Msg::new(5, 9, all[which % all.len()].clone());
            let mut b = m.seal_tenant(&cred, NOW).unwrap();
            let i = at % b.len();
            let changed = b[i] != byte;
            b[i] = byte;
            let _ = Msg::decode(&b);
            let mut gate = crate::auth::Gate::new(key(7), crate::auth::Receiver::Mn);
            let taken = matches!(gate.admit(&b, NOW), crate::auth::Verdict::Accept { .. });
            prop_assert!(!changed || !taken, "a damaged tenant request passed");
            prop_assert!(changed || taken, "an intact tenant request was refused");
        }

        #[test]
        fn gather_messages_never_panic_when_damaged(at in 0usize..200, byte in any::<u8>()) {
            let msg = Msg::new(
                5,
                9,
                Body::MgGathered {
                    rows: vec![Row::Record(record("c")), Row::Tomb { name: "d".into(), version: 7 }],
                    next: Some(GatherCursor { tombs: true, group: 3, after: "d".into() }),
                },
            );
            let mut b = msg.encode().unwrap();
            let i = at % b.len();
            b[i] = byte;
            let _ = Msg::decode(&b);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Msg::decode(&bytes);
        }

        #[test]
        fn decode_never_panics_after_a_valid_header(kind in 0u8..40, rest in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut bytes = b"S6\x04".to_vec();
            bytes.push(kind);
            bytes.extend_from_slice(&[0; 24]);
            bytes.extend_from_slice(&rest);
            let _ = Msg::decode(&bytes);
        }
    }
}

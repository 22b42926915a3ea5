//! What the store targets (and the seed writer) share: a fixed cluster
//! key and clock, sample messages and a sample table built with the
//! protocol crate's own types, and the mutation an input applies to a
//! sealed message.

#![allow(dead_code)]

use strata_store_protocol::addr::{Layout, DEFAULT_CLUSTER_PREFIX};
use strata_store_protocol::key::{ClusterKey, KEY_LEN};
use strata_store_protocol::table::{Device, MnEntry, Params, SnEntry, State, Table};
use strata_store_protocol::wire::{Body, Code, Msg, Record, RenameLink, Role};

/// The receiver's clock (ms since the Unix epoch).
pub const NOW: u64 = 1_700_000_000_000;

/// The cluster key every gate and seal of the targets uses.
pub fn key() -> ClusterKey {
    ClusterKey::from_bytes(&[0x5a; KEY_LEN])
}

/// The tenant the targets seal requests for (names under `acme/`).
pub const TENANT: &str = "acme";

fn record(name: &str) -> Record {
    Record {
        name: name.into(),
        size: 4096,
        crc: 0xdead_beef,
        version: 7,
        meta: vec![DEFAULT_CLUSTER_PREFIX | 1, DEFAULT_CLUSTER_PREFIX | 2],
        replicas: vec![
            DEFAULT_CLUSTER_PREFIX | 0x100,
            DEFAULT_CLUSTER_PREFIX | 0x200,
        ],
        rename: None,
        attributes: b"\x01{}".to_vec(),
    }
}

/// A few messages of the kinds a gate treats differently: tenants'
/// requests, node requests, control requests, answers, the table request.
pub fn sample_messages() -> Vec<Msg> {
    let target = DEFAULT_CLUSTER_PREFIX | 0x42;
    let bodies = vec![
        Body::Get {
            name: "acme/a".into(),
        },
        Body::PostBegin {
            name: "acme/b".into(),
            size: 1 << 20,
        },
        Body::List {
            prefix: "acme/".into(),
            after: String::new(),
            limit: 100,
        },
        Body::Delete {
            name: "acme/c".into(),
            if_version: 3,
            keep_data: false,
        },
        Body::Link {
            record: Record {
                rename: Some(RenameLink::From("acme/old".into())),
                ..record("acme/new")
            },
            proof: vec![],
        },
        Body::Replicate {
            record: record("x/y"),
        },
        Body::Retire { uuid: 30 },
        Body::Found {
            record: record("acme/a"),
            ticket: vec![1; 40],
        },
        Body::Error {
            code: Code::NotFound,
            message: "no such object".into(),
        },
        Body::GetTable,
        Body::Register {
            role: Role::Sn,
            uuid: 99,
            endpoint: "[::1]:10890".parse().expect("a socket address"),
            capacity: 1 << 30,
            free: 1 << 29,
            device: 0,
            keys: None,
        },
    ];
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| Msg::new(i as u64 + 1, target, body))
        .collect()
}

/// A table with two metadata nodes, one storage node and a revocation.
pub fn sample_table() -> Table {
    let layout = Layout::new(DEFAULT_CLUSTER_PREFIX, 4);
    let mut t = Table::new(
        layout,
        Params {
            n_m: 2,
            w_m: 1,
            n_d: 2,
            w_d: 1,
        },
    );
    t.epoch = 5;
    t.buckets.push((
        "big".into(),
        Params {
            n_m: 3,
            w_m: 2,
            n_d: 3,
            w_d: 2,
        },
    ));
    for slot in 0..2u16 {
        t.mns.push(MnEntry {
            uuid: 10 + u64::from(slot),
            slot,
            endpoint: format!("127.0.0.1:{}", 20000 + slot)
                .parse()
                .expect("a socket address"),
            state: State::Up,
        });
    }
    t.mg_owner = (0..16).map(|g| g % 2).collect();
    t.sns.push(SnEntry {
        uuid: 30,
        index: 1,
        endpoint: "[::1]:21000".parse().expect("a socket address"),
        capacity: 1 << 40,
        free: 1 << 39,
        objects: 12,
        device: Device::Ssd,
        state: State::Up,
    });
    t.revoked
        .push((strata_store_protocol::tenant::tenant_id_hash(TENANT), 2));
    t
}

/// Applies an input's edits to `bytes`: each 3-byte group of `edits` is
/// a position (u16, modulo the length) and a byte XORed there; a final
/// odd byte, if any, cuts the message short (high bit clear) or appends
/// that many zero bytes (high bit set).
pub fn mutate(bytes: &mut Vec<u8>, edits: &[u8]) {
    let mut groups = edits.chunks_exact(3);
    for g in &mut groups {
        if bytes.is_empty() {
            break;
        }
        let at = usize::from(u16::from_be_bytes([g[0], g[1]])) % bytes.len();
        bytes[at] ^= g[2];
    }
    match groups.remainder() {
        [] => {}
        [n, ..] if n & 0x80 != 0 => bytes.resize(bytes.len() + usize::from(n & 0x7f), 0),
        [n, ..] => bytes.truncate(bytes.len().saturating_sub(usize::from(*n))),
    }
}

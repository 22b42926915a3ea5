//! No amplification at the protocol core: every datagram a node does not
//! authenticate (unsealed, sealed with another key, with a tenant's seal
//! that fails, or not a message at all) gets an answer no longer than
//! itself, or none, at the orchestrator ([`on_receive`]) and at a
//! metadata node ([`mn_receive`]); and a table request padded to the
//! table's length still gets the table. (A real node is asked the same
//! over UDP in `crates/cli/tests/store.rs`.)

use strata_store::metadata::database::MetaDb;
use strata_store::metadata::server::mn_receive;
use strata_store::metadata::state::{MnCore, Out};
use strata_store::orchestrator::server::on_receive;
use strata_store::orchestrator::state::OnCore;
use strata_store_protocol::addr::{Layout, DEFAULT_CLUSTER_PREFIX};
use strata_store_protocol::auth::{unix_ms, ClusterKey, Gate, Receiver, KEY_LEN};
use strata_store_protocol::table::{Device, MnEntry, Params, SnEntry, State, Table};
use strata_store_protocol::tenant::TenantCredential;
use strata_store_protocol::wire::{Body, Msg, HEADER_LEN};

fn cluster_key() -> ClusterKey {
    ClusterKey::from_bytes(&[0x5a; KEY_LEN])
}

/// A table of a few nodes: its encoding is some hundreds of bytes, far
/// more than a bare table request.
fn table() -> Table {
    let layout = Layout::new(DEFAULT_CLUSTER_PREFIX, 4);
    Table {
        epoch: 1,
        layout,
        routed: false,
        params: Params::default(),
        buckets: vec![],
        mns: (0..3)
            .map(|slot| MnEntry {
                uuid: 1 + u64::from(slot),
                slot,
                endpoint: "127.0.0.1:9".parse().unwrap(),
                state: State::Up,
            })
            .collect(),
        mg_owner: (0..layout.mg_count()).map(|g| (g % 3) as u16).collect(),
        sns: (1..=4)
            .map(|index| SnEntry {
                uuid: 100 + u64::from(index),
                index,
                endpoint: "127.0.0.1:9".parse().unwrap(),
                capacity: 1 << 40,
                free: 1 << 40,
                objects: 0,
                device: Device::Ssd,
                state: State::Up,
            })
            .collect(),
        moves: vec![],
        stand_ins: vec![],
        drains: vec![],
        keys: Vec::new(),
        on_keys: None,
        revoked: Vec::new(),
    }
}

/// One datagram of each unauthenticated form for every kind byte: a bare
/// header, a header and zero bytes of several lengths, each unsealed,
/// flagged as sealed by a node and flagged as a tenant's; real requests
/// unsealed, sealed with another key and sealed by a tenant whose secret
/// is not the cluster's; and datagrams that are no message at all.
fn unauthenticated_datagrams() -> Vec<Vec<u8>> {
    let mut all = Vec::new();
    let sample = Msg::new(7, 0, Body::GetTable).encode().unwrap();
    let header = &sample[..HEADER_LEN];
    for kind in 0u8..64 {
        for flag in [0u8, 0x80, 0x40] {
            for body in [0usize, 4, 8, 20, 40, 100, 300] {
                let mut b = header.to_vec();
                b[3] = kind | flag;
                b.resize(HEADER_LEN + body, 0);
                all.push(b);
            }
        }
    }
    let stranger = ClusterKey::from_bytes(&[0x11; KEY_LEN]);
    let forged = TenantCredential::issue(&stranger, "acme").unwrap();
    let name = "acme/a".to_string();
    let requests = [
        Body::GetTable,
        Body::Get { name: name.clone() },
        Body::PostBegin {
            name: name.clone(),
            size: 10,
            class: None,
        },
        Body::List {
            prefix: "acme/".into(),
            after: String::new(),
            limit: 1000,
        },
        Body::Delete {
            name,
            if_version: 0,
            keep_data: false,
        },
        Body::Retire { uuid: 5 },
        Body::PutAbandoned { replica: 9 },
    ];
    for body in requests {
        let msg = Msg::new(8, 0, body);
        all.push(msg.encode().unwrap());
        all.push(msg.seal(&stranger, unix_ms()).unwrap());
        all.push(msg.seal_tenant(&forged, unix_ms()).unwrap());
    }
    for len in 0..HEADER_LEN + 8 {
        all.push(vec![0xee; len]);
        all.push(header[..len.min(HEADER_LEN)].to_vec());
    }
    all
}

#[test]
fn the_orchestrator_answers_no_unauthenticated_datagram_with_more_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut on = OnCore::open(&dir.path().join("on.redb"), table(), 3, 0).unwrap();
    let mut gate = Gate::new(cluster_key(), Receiver::On);
    let mut answered = 0;
    for bytes in unauthenticated_datagrams() {
        if let Some(answer) = on_receive(&mut on, &mut gate, unix_ms(), 0, &bytes) {
            answered += 1;
            assert!(
                answer.len() <= bytes.len(),
                "{} bytes answered {} bytes: {:?}",
                bytes.len(),
                answer.len(),
                Msg::decode(&answer)
            );
        }
    }
    assert!(answered > 100, "only {answered} answers: too few to check");
    // A bare table request (28 bytes) gets nothing; a padded one gets a
    // request for more padding, then the table.
    let ask = Msg::new(9, 0, Body::GetTable);
    let bare = ask.encode().unwrap();
    assert_eq!(on_receive(&mut on, &mut gate, unix_ms(), 0, &bare), None);
    let small = ask.encode_padded(200).unwrap();
    let answer = on_receive(&mut on, &mut gate, unix_ms(), 0, &small).expect("an answer");
    assert_eq!(answer.len(), 32, "a PadTo is 32 bytes");
    let Body::PadTo { size } = Msg::decode(&answer).unwrap().body else {
        panic!("not a PadTo: {:?}", Msg::decode(&answer));
    };
    assert!(size > 200, "{size}");
    let padded = ask.encode_padded(size as usize).unwrap();
    let answer = on_receive(&mut on, &mut gate, unix_ms(), 0, &padded).expect("the table");
    assert_eq!(answer.len(), size as usize);
    let Body::Table { bytes } = Msg::decode(&answer).unwrap().body else {
        panic!("not a table");
    };
    assert_eq!(Table::decode(&bytes).unwrap().sns.len(), 4);
    // A node's sealed request is answered in full, unpadded.
    let sealed = ask.seal(&cluster_key(), unix_ms()).unwrap();
    let answer = on_receive(&mut on, &mut gate, unix_ms(), 0, &sealed).expect("the table");
    assert!(answer.len() > 4 * sealed.len(), "{}", answer.len());
}

#[test]
fn a_metadata_node_answers_no_unauthenticated_datagram_with_more_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let db = MetaDb::open(&dir.path().join("m.redb")).unwrap();
    let mut core = MnCore::new(db, table(), 0, 42);
    let mut gate = Gate::new(cluster_key(), Receiver::Mn);
    let mut answered = 0;
    for bytes in unauthenticated_datagrams() {
        let outs = mn_receive(&mut core, &mut gate, unix_ms(), 0, 7u32, None, &bytes);
        let mut sent = 0;
        for (out, _seal) in &outs {
            let Out::Reply(_, msg) = out else {
                panic!("an unauthenticated datagram made work: {out:?}");
            };
            sent += msg.encode().unwrap().len();
        }
        answered += usize::from(!outs.is_empty());
        assert!(
            sent <= bytes.len(),
            "{} bytes answered {sent} bytes: {outs:?}",
            bytes.len()
        );
    }
    assert!(answered > 100, "only {answered} answers: too few to check");
    // A refusal asks for padding, and a padded request then gets the whole
    // explanation.
    let get = Msg::new(
        10,
        0,
        Body::Get {
            name: "acme/a".into(),
        },
    );
    let plain = get.encode().unwrap();
    let outs = mn_receive(&mut core, &mut gate, unix_ms(), 0, 7u32, None, &plain);
    let [(Out::Reply(_, pad), false)] = &outs[..] else {
        panic!("{outs:?}");
    };
    let Body::PadTo { size } = pad.body else {
        panic!("{pad:?}");
    };
    let padded = get.encode_padded(size as usize).unwrap();
    let outs = mn_receive(&mut core, &mut gate, unix_ms(), 0, 7u32, None, &padded);
    let [(Out::Reply(_, refusal), false)] = &outs[..] else {
        panic!("{outs:?}");
    };
    let Body::Error { message, .. } = &refusal.body else {
        panic!("{refusal:?}");
    };
    assert!(message.contains("credential"), "{message}");
    assert!(refusal.encode().unwrap().len() <= padded.len());
}

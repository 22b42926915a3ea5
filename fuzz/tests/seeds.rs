//! Writes the seed inputs under `seeds/<target>/` from the crates' own
//! encoders, and checks that each one decodes, so a seed never drifts from
//! the format it stands for. Run after a format change:
//! `cargo test --test seeds` (plain stable cargo; no libFuzzer involved).

#[path = "../fuzz_targets/common/store.rs"]
mod store;

use std::path::PathBuf;
use strata_nbd::proto::*;
use strata_store_protocol::data::{Credential, Request as DataRequest};
use strata_store_protocol::table::Table;
use strata_store_protocol::tenant::TenantCredential;
use strata_store_protocol::wire::{self, Msg};

/// Replaces `seeds/<target>/` with `seeds`, each a (name, bytes) pair.
fn write(target: &str, seeds: &[(&str, Vec<u8>)]) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("remove the old seeds");
    }
    std::fs::create_dir_all(&dir).expect("create the seed directory");
    for (name, bytes) in seeds {
        std::fs::write(dir.join(format!("{name}.bin")), bytes).expect("write a seed");
    }
}

/// `selector` followed by `body`: the input layout of the targets that
/// start with a selector byte.
fn nbd(selector: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![selector];
    v.extend_from_slice(body);
    v
}

#[test]
fn nbd_protocol_seeds() {
    let go = encode_info_request("disk", &[INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION]);
    let meta = encode_meta_context_request("disk", &[BASE_ALLOCATION, "qemu:dirty-bitmap:b"]);
    let mut handshake = Vec::new();
    handshake.extend(encode_option(OPT_STRUCTURED_REPLY, &[]));
    handshake.extend(encode_option(OPT_SET_META_CONTEXT, &meta));
    handshake.extend(encode_option(OPT_LIST, &[]));
    handshake.extend(encode_option(OPT_INFO, &go));
    handshake.extend(encode_option(OPT_GO, &go));
    let export_name = encode_option(OPT_EXPORT_NAME, b"disk");

    // Export of 1 MiB, structured replies and base:allocation; then one
    // request of each command, some in range and some not.
    let mut requests = (1u64 << 20).to_be_bytes().to_vec();
    requests.push(2 | 4);
    let commands = [
        (CMD_READ, CMD_FLAG_DF, 0, 4096),
        (CMD_WRITE, CMD_FLAG_FUA, 4096, 512),
        (CMD_FLUSH, 0, 0, 0),
        (CMD_TRIM, 0, (1 << 20) - 512, 1024),
        (CMD_CACHE, 0, 0, 1 << 16),
        (
            CMD_WRITE_ZEROES,
            CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            0,
            8192,
        ),
        (CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 1 << 20),
        (CMD_DISC, 0, 0, 0),
    ];
    for (i, (command, flags, offset, length)) in commands.into_iter().enumerate() {
        requests.extend(encode_request(&Request {
            flags,
            command,
            handle: i as u64,
            offset,
            length,
        }));
    }

    let mut chunks = Vec::new();
    chunks.extend(encode_offset_data_header(0, 1, 0, 0).expect("an empty data chunk fits"));
    chunks.extend(encode_offset_hole(0, 1, 0, 512));
    let extents = [
        Extent {
            length: 4096,
            flags: 0,
        },
        Extent {
            length: 512,
            flags: STATE_HOLE | STATE_ZERO,
        },
    ];
    encode_block_status(&mut chunks, 0, 2, 1, &extents).expect("two extents fit");
    encode_error_chunk(&mut chunks, 3, EINVAL, "offset beyond the end");
    chunks.extend(encode_none_chunk(4));

    let mut option_reply = Vec::new();
    encode_info_export(
        &mut option_reply,
        OPT_GO,
        1 << 20,
        FLAG_HAS_FLAGS | FLAG_SEND_FLUSH,
    );
    let mut error = Vec::new();
    encode_error_chunk(&mut error, 3, EIO, "read failed");
    let mut status = Vec::new();
    encode_block_status(&mut status, 0, 2, 1, &extents).expect("two extents fit");

    let seeds = [
        ("client-flags", nbd(0, &3u32.to_be_bytes())),
        (
            "greeting",
            nbd(1, &encode_greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES)),
        ),
        ("handshake", nbd(2, &handshake)),
        ("export-name", nbd(2, &export_name)),
        ("info-request", nbd(3, &go)),
        ("meta-context-request", nbd(3, &meta)),
        ("requests", nbd(4, &requests)),
        ("simple-reply", nbd(5, &encode_simple_reply(EIO, 7))),
        ("chunks", nbd(6, &chunks)),
        ("option-reply", nbd(7, &option_reply)),
        ("error-payload", nbd(8, &error[CHUNK_HEADER_LEN..])),
        ("block-status", nbd(9, &status[CHUNK_HEADER_LEN..])),
    ];

    // Each seed reaches past its first decoder.
    assert_eq!(parse_info_request(&go).map(|r| r.name), Ok("disk"));
    assert_eq!(
        parse_meta_context_request(&meta).map(|r| r.queries.len()),
        Ok(2)
    );
    let first: &[u8; REQUEST_LEN] = requests[9..9 + REQUEST_LEN].try_into().expect("28 bytes");
    assert_eq!(parse_request(first).map(|r| r.command), Ok(CMD_READ));
    assert_eq!(
        parse_error_payload(&error[CHUNK_HEADER_LEN..]),
        Ok((EIO, "read failed"))
    );
    assert_eq!(
        parse_block_status(&status[CHUNK_HEADER_LEN..]).map(|(c, _)| c),
        Ok(1)
    );
    write("nbd_protocol", &seeds);
}

#[test]
fn store_seeds() {
    let key = store::key();
    let acme = TenantCredential::issue(&key, store::TENANT).expect("a valid tenant id");
    let messages = store::sample_messages();
    let table = store::sample_table();

    // store_wire: datagrams (plain, sealed, tenant-sealed, padded), a
    // record, data requests with each credential, and sealed requests to
    // edit.
    let mut wire_seeds = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let plain = m.encode().expect("a sample encodes");
        assert_eq!(Msg::decode(&plain).as_ref(), Ok(m));
        wire_seeds.push((format!("msg-{i}"), nbd(0, &plain)));
        let sealed = m.seal(&key, store::NOW).expect("a sample seals");
        wire_seeds.push((format!("msg-{i}-sealed"), nbd(0, &sealed)));
    }
    let get = &messages[0];
    let tenant = get
        .seal_tenant_padded(&acme, store::NOW, 200)
        .expect("seals");
    wire_seeds.push(("msg-tenant-padded".into(), nbd(0, &tenant)));
    let table_msg = Msg::new(
        5,
        0,
        wire::Body::Table {
            bytes: table.encode(),
        },
    );
    wire_seeds.push((
        "msg-table".into(),
        nbd(0, &table_msg.encode().expect("encodes")),
    ));
    let wire::Body::Found { record, .. } = &messages[7].body else {
        panic!("sample 7 is a Found");
    };
    let rec = wire::encode_record(record);
    assert_eq!(wire::decode_record(&rec).as_ref(), Ok(record));
    wire_seeds.push(("record".into(), nbd(1, &rec)));
    let put = DataRequest::Put {
        addr: 0xfd53_0001 << 64 | 9,
        size: 4096,
        chain: vec![7, 8],
    };
    let ticket = vec![3u8; 80];
    for (name, cred) in [
        ("none", Credential::None),
        ("sealed", Credential::Seal(&key)),
        ("ticket", Credential::Ticket(&ticket)),
    ] {
        wire_seeds.push((
            format!("data-put-{name}"),
            nbd(2, &put.encode_at(cred, store::NOW)),
        ));
    }
    let free = DataRequest::Free { addr: 12 }.encode_at(Credential::Seal(&key), store::NOW);
    wire_seeds.push(("data-free-sealed".into(), nbd(2, &free)));
    // sealed_data_request: 20 bytes of fields, no edit (then one edit).
    let mut fields = vec![0u8; 20];
    fields[..8].copy_from_slice(&99u64.to_be_bytes());
    fields[8..12].copy_from_slice(&4096u32.to_be_bytes());
    fields[12] = 2;
    wire_seeds.push(("data-sealed-intact".into(), nbd(3, &fields)));
    fields[16] = 1;
    let mut edited = fields.clone();
    edited.extend_from_slice(&[0, 30, 0x01]);
    wire_seeds.push(("data-ticket-edited".into(), nbd(3, &edited)));
    let named: Vec<(&str, Vec<u8>)> = wire_seeds
        .iter()
        .map(|(n, b)| (n.as_str(), b.clone()))
        .collect();
    write("store_wire", &named);

    // store_gate: the same datagrams as they arrive, and sealed-then-edited
    // inputs over each sample (no edit, one flipped bit, a cut).
    let mut gate_seeds = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let sealed = m.seal(&key, store::NOW).expect("a sample seals");
        gate_seeds.push((format!("datagram-{i}-sealed"), nbd(0, &sealed)));
        gate_seeds.push((
            format!("datagram-{i}"),
            nbd(0, &m.encode().expect("encodes")),
        ));
        for (how, edits) in [(1u8, &[][..]), (3, &[0, 9, 0x04][..]), (5, &[3][..])] {
            // params: edit length, sample index, clock skew (2), pad, generation.
            let mut input = vec![how, edits.len() as u8, i as u8, 0, 10, 0, 1];
            input.extend_from_slice(edits);
            gate_seeds.push((format!("sealed-{i}-how{how}"), input));
        }
    }
    gate_seeds.push(("datagram-tenant".into(), nbd(0, &tenant)));
    let named: Vec<(&str, Vec<u8>)> = gate_seeds
        .iter()
        .map(|(n, b)| (n.as_str(), b.clone()))
        .collect();
    write("store_gate", &named);

    // prefix_table: the sample table, and a new cluster's.
    let bytes = table.encode();
    assert_eq!(Table::decode(&bytes).as_ref(), Ok(&table));
    let mut empty = Table::new(table.layout, table.params);
    empty.mg_owner = vec![0; 16];
    write(
        "prefix_table",
        &[("sample", bytes), ("new-cluster", empty.encode())],
    );
}

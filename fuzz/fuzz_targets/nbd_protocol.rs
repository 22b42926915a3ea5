//! Arbitrary bytes through the NBD protocol core of `strata-nbd`: the pure
//! decoders of `proto` and the request check of `command`. No I/O.
//!
//! The first byte picks what the rest is (so the fuzzer can aim at one
//! decoder with aligned fields); whatever decodes must survive an
//! encode → decode round trip unchanged, and whatever `command::check`
//! accepts must lie inside the export.

#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_nbd::command::{self, Op, Session, MAX_PAYLOAD};
use strata_nbd::proto::*;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    match selector % 10 {
        0 => client_flags(rest),
        1 => greeting(rest),
        2 => option_stream(rest),
        3 => option_payloads(rest),
        4 => requests(rest),
        5 => simple_reply(rest),
        6 => chunks(rest),
        7 => option_reply(rest),
        8 => error_payload(rest),
        _ => block_status(rest),
    }
});

/// The first `N` bytes as an array, if there are that many.
fn array<const N: usize>(data: &[u8]) -> Option<&[u8; N]> {
    data.get(..N)?.try_into().ok()
}

fn be32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(*array(data.get(at..)?)?))
}

fn be64_at(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(*array(data.get(at..)?)?))
}

/// The client's flags word: accepted only with known bits, which decode
/// to exactly the bits set.
fn client_flags(data: &[u8]) {
    let Some(raw) = be32_at(data, 0) else { return };
    if let Ok(f) = parse_client_flags(raw) {
        let mut again = 0;
        if f.fixed_newstyle {
            again |= FLAG_C_FIXED_NEWSTYLE;
        }
        if f.no_zeroes {
            again |= FLAG_C_NO_ZEROES;
        }
        assert_eq!(again, raw);
    }
}

fn greeting(data: &[u8]) {
    let Some(b) = array::<GREETING_LEN>(data) else {
        return;
    };
    if let Ok(flags) = parse_greeting(b) {
        assert_eq!(&encode_greeting(flags), b);
    }
}

/// The input as the client's side of a handshake after the flags word:
/// option headers, each followed by its data, decoded as the server would.
fn option_stream(mut data: &[u8]) {
    while let Some(b) = array::<OPTION_HEADER_LEN>(data) {
        let Ok(h) = parse_option_header(b) else {
            return;
        };
        let Some(payload) = data.get(OPTION_HEADER_LEN..OPTION_HEADER_LEN + h.length as usize)
        else {
            return;
        };
        assert_eq!(
            encode_option(h.option, payload),
            &data[..OPTION_HEADER_LEN + payload.len()]
        );
        option_payload(h.option, payload);
        data = &data[OPTION_HEADER_LEN + payload.len()..];
    }
}

/// One option's data through the decoder the server uses for it.
fn option_payload(option: u32, payload: &[u8]) {
    match option {
        OPT_EXPORT_NAME => export_name(payload),
        OPT_INFO | OPT_GO => info_request(payload),
        OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => meta_context_request(payload),
        _ => {}
    }
}

/// The same bytes through every option-data decoder.
fn option_payloads(data: &[u8]) {
    export_name(data);
    info_request(data);
    meta_context_request(data);
}

fn export_name(data: &[u8]) {
    if let Ok(name) = parse_export_name(data) {
        valid_string(name);
        assert_eq!(name.as_bytes(), data);
    }
}

fn info_request(data: &[u8]) {
    if let Ok(r) = parse_info_request(data) {
        valid_string(r.name);
        // The decoder takes exactly a name, a count and the list.
        assert_eq!(encode_info_request(r.name, &r.requests), data);
    }
}

fn meta_context_request(data: &[u8]) {
    if let Ok(r) = parse_meta_context_request(data) {
        valid_string(r.export);
        r.queries.iter().for_each(|q| valid_string(q));
        assert_eq!(encode_meta_context_request(r.export, &r.queries), data);
    }
}

/// What `parse_string` promises of every string it lets through.
fn valid_string(s: &str) {
    assert!(s.len() <= MAX_STRING);
    assert!(!s.contains('\0'));
    let cut = truncate(s, s.len() / 2);
    assert!(cut.len() <= s.len() / 2 && s.starts_with(cut));
}

/// The input as a fake export's size and flags, then request headers
/// decoded and checked against it.
fn requests(data: &[u8]) {
    let Some(size) = be64_at(data, 0) else { return };
    let Some(&bits) = data.get(8) else { return };
    let session = Session {
        // Mostly small exports, so offsets land both in and out of range.
        size: if bits & 8 != 0 {
            size
        } else {
            size % (1 << 24)
        },
        read_only: bits & 1 != 0,
        structured: bits & 2 != 0,
        block_status: bits & 4 != 0,
    };
    for b in data[9..].chunks_exact(REQUEST_LEN) {
        let b: &[u8; REQUEST_LEN] = b.try_into().expect("chunks_exact gives REQUEST_LEN");
        let Ok(r) = parse_request(b) else { continue };
        assert_eq!(&encode_request(&r), b);
        check(&r, &session);
    }
}

/// Whatever `command::check` accepts is allowed and inside the export; a
/// refusal always carries an NBD error and a message.
fn check(r: &Request, s: &Session) {
    let op = match command::check(r, s) {
        Ok(op) => op,
        Err(refusal) => {
            assert_ne!(refusal.error, 0);
            assert!(!refusal.message.is_empty());
            return;
        }
    };
    assert!(
        !(s.read_only && op.writes()),
        "{op:?} on a read-only export"
    );
    let in_export = |offset: u64, len: u32| {
        assert!(
            offset
                .checked_add(u64::from(len))
                .is_some_and(|end| end <= s.size),
            "{op:?} beyond {} bytes",
            s.size
        )
    };
    match op {
        Op::Read { offset, len, df } => {
            assert!(len <= MAX_PAYLOAD);
            assert!(s.structured || !df);
            in_export(offset, len);
        }
        Op::Write { offset, len, .. } | Op::Cache { offset, len } => {
            assert!(len <= MAX_PAYLOAD);
            in_export(offset, len);
        }
        Op::Trim { offset, len, .. } | Op::WriteZeroes { offset, len, .. } => {
            in_export(offset, len)
        }
        Op::BlockStatus { offset, len, .. } => {
            assert!(s.block_status && len > 0);
            in_export(offset, len);
        }
        Op::Flush => assert_eq!(r.command, CMD_FLUSH),
        Op::Disc => assert_eq!(r.command, CMD_DISC),
    }
}

fn simple_reply(data: &[u8]) {
    let Some(b) = array::<SIMPLE_REPLY_LEN>(data) else {
        return;
    };
    if let Ok((error, handle)) = parse_simple_reply(b) {
        assert_eq!(&encode_simple_reply(error, handle), b);
    }
}

/// The input as a stream of structured reply chunks, each payload decoded
/// by its type.
fn chunks(mut data: &[u8]) {
    while let Some(b) = array::<CHUNK_HEADER_LEN>(data) {
        let Ok(h) = parse_chunk_header(b) else { return };
        assert_eq!(&encode_chunk_header(&h), b);
        let Some(payload) = data.get(CHUNK_HEADER_LEN..CHUNK_HEADER_LEN + h.length as usize) else {
            return;
        };
        match h.kind {
            REPLY_TYPE_ERROR | REPLY_TYPE_ERROR_OFFSET => error_payload(payload),
            REPLY_TYPE_BLOCK_STATUS => block_status(payload),
            _ => {}
        }
        data = &data[CHUNK_HEADER_LEN + payload.len()..];
    }
}

fn option_reply(data: &[u8]) {
    let Some(b) = array::<OPTION_REPLY_HEADER_LEN>(data) else {
        return;
    };
    let Ok(h) = parse_option_reply_header(b) else {
        return;
    };
    let Some(payload) =
        data.get(OPTION_REPLY_HEADER_LEN..OPTION_REPLY_HEADER_LEN + h.length as usize)
    else {
        return;
    };
    let mut out = Vec::new();
    encode_option_reply(&mut out, h.option, h.reply, payload);
    assert_eq!(out, &data[..out.len()]);
}

/// An error chunk's payload: what decodes encodes to a chunk that decodes
/// to the same error and message.
fn error_payload(p: &[u8]) {
    let Ok((error, message)) = parse_error_payload(p) else {
        return;
    };
    valid_string(message);
    let mut out = Vec::new();
    encode_error_chunk(&mut out, 7, error, message);
    let header = array::<CHUNK_HEADER_LEN>(&out).expect("a chunk header was written");
    let h = parse_chunk_header(header).expect("an encoded chunk header decodes");
    assert_eq!((h.kind, h.handle), (REPLY_TYPE_ERROR, 7));
    assert_eq!(h.length as usize, out.len() - CHUNK_HEADER_LEN);
    assert_eq!(
        parse_error_payload(&out[CHUNK_HEADER_LEN..]),
        Ok((error, message))
    );
}

/// A block status payload: extents of non-zero length re-encode to the
/// same bytes.
fn block_status(p: &[u8]) {
    let Ok((context, extents)) = parse_block_status(p) else {
        return;
    };
    assert!(!extents.is_empty());
    assert_eq!(4 + 8 * extents.len(), p.len());
    let mut out = Vec::new();
    let encoded = encode_block_status(&mut out, 0, 9, context, &extents);
    if extents.iter().any(|e| e.length == 0) {
        assert!(encoded.is_none() && out.is_empty());
        return;
    }
    assert!(encoded.is_some());
    assert_eq!(&out[CHUNK_HEADER_LEN..], p);
}

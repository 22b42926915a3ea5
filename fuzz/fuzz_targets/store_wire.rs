//! Arbitrary bytes through the object store's message decoders
//! (`strata-store-protocol`): a UDP datagram through `Msg::decode` and the
//! header readers, a metadata record through `decode_record`, and a TCP
//! data request through `data::Request::decode_prefix` and the stream
//! reader of `strata-store-client` that completes it, then its credentials'
//! check. Nothing may panic; whatever decodes must decode again, equal,
//! from its own encoding; a data request is authorised only with a seal
//! made with the key or a ticket that opens.
//!
//! The first byte picks what the rest is.

#![no_main]

#[path = "common/store.rs"]
mod store;

use libfuzzer_sys::fuzz_target;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use store::{key, mutate, NOW};
use strata_store_client::stream::read_request;
use strata_store_protocol::data::{Authority, Credential, Incoming, Proof, Request, HEADER};
use strata_store_protocol::key::{ClusterKey, WINDOW_MS};
use strata_store_protocol::ticket::Ticket;
use strata_store_protocol::wire::{self, Msg, MAX_DATAGRAM};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    match selector % 4 {
        0 => datagram(rest),
        1 => record(rest),
        2 => data_request(rest),
        _ => sealed_data_request(rest),
    }
});

/// A datagram: the header readers, then the whole message.
fn datagram(buf: &[u8]) {
    let head = wire::peek(buf);
    let _ = wire::tenant_parts(buf);
    if let Some((signed, _, _)) = wire::seal_parts(buf) {
        assert!(head.as_ref().is_ok_and(|h| h.sealed));
        assert_eq!(
            signed.len() + strata_store_protocol::key::TAG_LEN,
            buf.len()
        );
    }
    let msg = match Msg::decode(buf) {
        Ok(msg) => msg,
        Err(e) => {
            // What a node answers to it, which must itself encode.
            let answer = wire::malformed(buf, &e);
            assert!(answer.encode().is_ok());
            return;
        }
    };
    let head = head.expect("a message that decodes has a header");
    assert_eq!((head.req, head.target), (msg.req, msg.target));
    let plain = msg.encode().expect("a decoded message encodes");
    assert!(plain.len() <= MAX_DATAGRAM);
    assert_eq!(
        Msg::decode(&plain).as_ref(),
        Ok(&msg),
        "unsealed round trip"
    );
    // Sealed again with the cluster key: the same message.
    let key = key();
    if let Ok(sealed) = msg.seal(&key, NOW) {
        assert_eq!(Msg::decode(&sealed).as_ref(), Ok(&msg), "sealed round trip");
        assert!(strata_store_protocol::auth::check_seal(&sealed, &key, NOW).is_ok());
    }
}

/// A record as the metadata database stores it.
fn record(buf: &[u8]) {
    if let Ok(rec) = wire::decode_record(buf) {
        let again = wire::encode_record(&rec);
        assert_eq!(wire::decode_record(&again), Ok(rec));
        // Every field is read as written: the encoding is the input.
        assert_eq!(again, buf);
    }
}

/// Polls a future that never waits: reading from a byte slice is always
/// ready, so the stream reader completes in one poll.
fn now<F: Future>(future: F) -> F::Output {
    let mut context = Context::from_waker(Waker::noop());
    match pin!(future).poll(&mut context) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("reading from a byte slice waited"),
    }
}

/// A data request as a storage node reads it from a connection.
fn data_request(buf: &[u8]) {
    if let Some(prefix) = buf.get(..HEADER) {
        let prefix: &[u8; HEADER] = prefix.try_into().expect("HEADER bytes");
        if let Ok((kind, addr)) = Request::decode_prefix(prefix) {
            assert!((1..=3).contains(&kind));
            let again = match kind {
                1 => Request::Put {
                    addr,
                    size: 0,
                    chain: vec![],
                },
                2 => Request::Get { addr },
                _ => Request::Free { addr },
            };
            assert_eq!(&again.encode_at(Credential::None, 0)[..HEADER], prefix);
        }
    }
    let mut reader = buf;
    let Ok(Some(incoming)) = now(read_request(&mut reader)) else {
        return;
    };
    let used = &buf[..buf.len() - reader.len()];
    assert_eq!(
        encode(&incoming),
        used,
        "the request re-encodes to its bytes"
    );
    authorize(&incoming, used);
}

/// The bytes `incoming` was read from, from its decoded fields.
fn encode(incoming: &Incoming) -> Vec<u8> {
    match &incoming.proof {
        Proof::None => incoming.req.encode_at(Credential::None, 0),
        Proof::Ticket(t) => incoming.req.encode_at(Credential::Ticket(t), 0),
        Proof::Sealed { at, tag } => {
            // The plain request and mode byte, then the clock and the tag.
            let mut out = incoming.req.encode_at(Credential::None, 0);
            *out.last_mut().expect("a mode byte") = strata_store_protocol::data::MODE_SEALED;
            out.extend_from_slice(&at.to_be_bytes());
            out.extend_from_slice(tag);
            out
        }
    }
}

/// The credentials' check: with no key nothing passes; a node's authority
/// needs the very bytes a seal with the key makes, at a clock within the
/// window; a tenant's needs a ticket that opens with the key.
fn authorize(incoming: &Incoming, bytes: &[u8]) {
    let key = key();
    assert!(incoming.authorize(None, NOW).is_err());
    match incoming.authorize(Some(&key), NOW) {
        Err(why) => assert!(why.contains("nothing done"), "{why}"),
        Ok(Authority::Node) => {
            let Proof::Sealed { at, .. } = incoming.proof else {
                panic!("node authority without a seal: {incoming:?}");
            };
            assert!(at.abs_diff(NOW) <= WINDOW_MS);
            assert_eq!(incoming.req.encode_at(Credential::Seal(&key), at), bytes);
        }
        Ok(Authority::Tenant { coordinator }) => {
            let Proof::Ticket(t) = &incoming.proof else {
                panic!("tenant authority without a ticket: {incoming:?}");
            };
            let ticket = Ticket::open(t, &key, NOW).expect("an accepted ticket opens");
            assert_eq!(ticket.coordinator, coordinator);
        }
    }
}

/// A data request sealed with the key (or carrying a ticket the key
/// sealed), then edited by the input: authorised only while unchanged.
fn sealed_data_request(buf: &[u8]) {
    if buf.len() < 20 {
        return;
    }
    let (fields, edits) = buf.split_at(20);
    let addr = u128::from(u64::from_be_bytes(
        fields[0..8].try_into().expect("8 bytes"),
    ));
    let size = u64::from(u32::from_be_bytes(
        fields[8..12].try_into().expect("4 bytes"),
    ));
    let chain: Vec<u128> = (0..fields[12] % 4)
        .map(|i| addr + 1 + u128::from(i))
        .collect();
    // A clock up to about a minute either side of the receiver's.
    let skew = i64::from(i16::from_be_bytes([fields[13], fields[14]])) * 2;
    let at = NOW.wrapping_add_signed(skew);
    let req = match fields[15] % 3 {
        0 => Request::Put {
            addr,
            size,
            chain: chain.clone(),
        },
        1 => Request::Get { addr },
        _ => Request::Free { addr },
    };
    let key = key();
    let ticket = ticket_for(&req, &key, fields[16]);
    let original = match &ticket {
        Some(t) => req.encode_at(Credential::Ticket(t), at),
        None => req.encode_at(Credential::Seal(&key), at),
    };
    let mut bytes = original.clone();
    mutate(&mut bytes, edits);
    let mut reader = &bytes[..];
    let Ok(Some(incoming)) = now(read_request(&mut reader)) else {
        assert_ne!(bytes, original, "an intact request must decode");
        return;
    };
    let used = &bytes[..bytes.len() - reader.len()];
    let verdict = incoming.authorize(Some(&key), NOW);
    if used == original {
        let expected = match &ticket {
            // A ticket allows the Put or Get it was issued for, no Free.
            Some(_) => !matches!(req, Request::Free { .. }),
            None => at.abs_diff(NOW) <= WINDOW_MS,
        };
        assert_eq!(verdict.is_ok(), expected, "{verdict:?} for {incoming:?}");
    } else if ticket.is_none() {
        assert!(
            verdict.is_err(),
            "an edited sealed request was authorised: {incoming:?}"
        );
    } else if let Ok(Authority::Tenant { .. }) = verdict {
        // An edited request may still be what the unedited ticket allows
        // (a Get of another of its replicas); an edited ticket never opens.
        let Proof::Ticket(t) = &incoming.proof else {
            panic!("tenant authority without a ticket")
        };
        assert_eq!(Some(t), ticket.as_ref(), "an edited ticket was accepted");
    }
}

/// With `choice` odd, a ticket for `req` (Put or Get) sealed with `key`.
fn ticket_for(req: &Request, key: &ClusterKey, choice: u8) -> Option<Vec<u8>> {
    if choice & 1 == 0 {
        return None;
    }
    let (op, size, replicas) = match req {
        Request::Put { addr, size, chain } => {
            let mut all = vec![*addr];
            all.extend(chain);
            (strata_store_protocol::ticket::TicketOp::Put, *size, all)
        }
        Request::Get { addr } | Request::Free { addr } => (
            strata_store_protocol::ticket::TicketOp::Get,
            0,
            vec![*addr, addr + 7],
        ),
    };
    let ticket = Ticket {
        op,
        expires: NOW + 60_000,
        size,
        replicas,
        coordinator: 0x1234,
    };
    Some(ticket.seal(key))
}

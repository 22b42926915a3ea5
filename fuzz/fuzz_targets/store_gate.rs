//! The object store's authentication gate (`strata_store_protocol::auth::
//! Gate`) with a fixed cluster key, at a metadata node and at the
//! orchestrator.
//!
//! First byte even: the rest is an arbitrary datagram. The gate must never
//! panic; it may accept it only as what it is (an unsealed table request at
//! the orchestrator, or a message whose seal checks), and an unauthenticated
//! sender never gets an answer longer than its datagram.
//!
//! First byte odd: a message (decoded from the input, or one of the
//! samples) is sealed with the cluster key or a tenant's credential, then
//! edited by the input. Unchanged, a node's seal within the clock window is
//! accepted; changed, the message is never accepted as authenticated.

#![no_main]

#[path = "common/store.rs"]
mod store;

use libfuzzer_sys::fuzz_target;
use store::{key, mutate, sample_messages, NOW, TENANT};
use strata_store_protocol::auth::{
    check_seal, check_tenant_seal, within, DerivedKeys, Gate, Receiver, Verdict,
};
use strata_store_protocol::key::WINDOW_MS;
use strata_store_protocol::tenant::{tenant_id_hash, TenantCredential};
use strata_store_protocol::wire::{self, Msg};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    if selector & 1 == 0 {
        arbitrary(rest);
    } else {
        sealed_then_edited(selector >> 1, rest);
    }
});

/// An arbitrary datagram at both receivers, twice (the second time as a
/// replay).
fn arbitrary(buf: &[u8]) {
    for receiver in [Receiver::Mn, Receiver::On] {
        let mut gate = Gate::new(key(), receiver);
        for _ in 0..2 {
            let verdict = gate.admit(buf, NOW);
            check_verdict(&verdict, buf, receiver);
        }
    }
}

/// What any verdict on `buf` must satisfy.
fn check_verdict(verdict: &Verdict, buf: &[u8], receiver: Receiver) {
    let head = wire::peek(buf);
    match verdict {
        Verdict::Accept {
            msg,
            sealed,
            tenant,
        } => {
            let head = head.as_ref().expect("an accepted datagram has a header");
            assert_eq!(Msg::decode(buf).as_ref(), Ok(msg));
            assert_eq!(*sealed, head.sealed);
            if *sealed {
                assert!(check_seal(buf, &key(), NOW).is_ok(), "accepted a bad seal");
            } else if let Some(t) = tenant {
                assert_eq!(receiver, Receiver::Mn);
                let mut cache = DerivedKeys::default();
                let checked = check_tenant_seal(buf, &key(), &mut cache, &[], NOW);
                assert_eq!(checked, Ok(t.as_str()), "accepted a bad tenant seal");
            } else {
                assert_eq!(
                    receiver,
                    Receiver::On,
                    "a metadata node took an unsealed datagram"
                );
                assert_eq!(head.kind, wire::KIND_GET_TABLE);
            }
        }
        Verdict::Refuse(answer) => {
            // The node sends it through `within`: never more bytes than came in.
            if let Some(sent) = within(answer.clone(), buf.len()) {
                let len = sent.encode().expect("a refusal encodes").len();
                assert!(len <= buf.len(), "{len}-byte answer to {} bytes", buf.len());
            }
        }
        Verdict::Deny(answer) => {
            assert!(answer.encode().is_ok());
            let head = head.as_ref().expect("a denied datagram has a header");
            assert!(head.sealed || head.tenant, "denied without authentication");
        }
        Verdict::Drop => {
            let head = head.as_ref().expect("a dropped datagram has a header");
            assert!(wire::is_answer(head.kind));
        }
    }
}

/// Seals a message, edits it with the input and asks the gate.
fn sealed_then_edited(how: u8, rest: &[u8]) {
    if rest.len() < 6 {
        return;
    }
    let (params, rest) = rest.split_at(6);
    let edit_len = usize::from(params[0]);
    let (edits, body) = rest.split_at(edit_len.min(rest.len()));
    let msg = Msg::decode(body).unwrap_or_else(|_| {
        let samples = sample_messages();
        samples[usize::from(params[1]) % samples.len()].clone()
    });
    // A clock up to about a minute either side of the receiver's.
    let skew = i64::from(i16::from_be_bytes([params[2], params[3]])) * 2;
    let at = NOW.wrapping_add_signed(skew);
    let pad = usize::from(params[4]);
    let key = key();
    let by_tenant = how & 1 != 0;
    // Generations below 2 of the tenant are revoked when `how` says so.
    let generation = u32::from(params[5] % 4);
    let revoke = how & 2 != 0;
    let original = if by_tenant {
        let credential = TenantCredential::issue_generation(&key, TENANT, generation)
            .expect("a valid tenant id");
        msg.seal_tenant_padded(&credential, at, pad)
    } else {
        msg.seal_padded(&key, at, pad)
    };
    let Ok(original) = original else { return };
    let mut bytes = original.clone();
    mutate(&mut bytes, edits);
    for receiver in [Receiver::Mn, Receiver::On] {
        let mut gate = Gate::new(key.clone(), receiver);
        if revoke {
            gate.follow_revocations(&[(tenant_id_hash(TENANT), 2)]);
        }
        let verdict = gate.admit(&bytes, NOW);
        check_verdict(&verdict, &bytes, receiver);
        let authenticated = matches!(
            verdict,
            Verdict::Accept { sealed: true, .. }
                | Verdict::Accept {
                    tenant: Some(_),
                    ..
                }
        );
        if bytes != original {
            assert!(
                !authenticated,
                "an edited message was accepted: {verdict:?}"
            );
        } else if !by_tenant {
            let fresh = at.abs_diff(NOW) <= WINDOW_MS;
            assert_eq!(authenticated, fresh, "{verdict:?} at {skew} ms");
        } else if revoke && generation < 2 {
            assert!(
                !authenticated,
                "a revoked generation was accepted: {verdict:?}"
            );
        }
    }
}

//! The seals that authenticate internal and control messages with the
//! cluster key ([`crate::key`]), and the [`Gate`] every datagram passes.
//! (The key's and tickets' items are re-exported here, where callers
//! have always found them.)
//!
//! A cluster has a 32-byte random key, in the file `cluster.key` of the
//! directory of `strata store up` (mode 0600). Every node and every
//! operator command that changes the cluster holds it. A message they
//! send between themselves is *sealed*: the kind byte carries a flag, and
//! the message ends with the sender's clock (ms since the Unix epoch) and
//! an HMAC-SHA256 tag over everything before it, truncated to 16 bytes.
//!
//! Tenants do not hold the key: they seal their requests to metadata
//! nodes (Post, Get, Delete, List...) with a credential derived from it
//! ([`crate::tenant`]; [`check_tenant_seal`]), and a metadata node takes
//! them only for names in the tenant's scope; answers to them stay
//! unsealed. The orchestrator takes the table request unsealed. Every
//! other kind is refused unsealed ([`Gate`]), and a node that sent a
//! sealed request takes only a sealed answer ([`open_answer`]).
//!
//! On the TCP data path ([`crate::data`]) a node's request to a storage
//! node is sealed the same way, and a tenant's carries a [`Ticket`]: a
//! capability for one Put or Get of given replicas, until an expiry, that
//! the metadata node answering the tenant's `PostBegin` or `Get` issued
//! with the key ([`issue_ticket`]) and the storage node checks with it.
//!
//! A rename's `Link` binds existing replicas under a new name; a tenant's
//! `Link` must carry a [`LinkProof`] for exactly those replicas, issued
//! to that tenant by a metadata node that answered its `GetLinkProof` of
//! the old name ([`issue_link_proof`]), and the [`Gate`] checks it
//! before the node sees the `Link`.
//!
//! Rotation ([`ClusterKey`] is a keyring): a node seals and issues
//! tickets with the *active* key, in the key file, and also accepts the
//! key in `cluster.key.next` or `cluster.key.prev` next to it, if there is
//! one; [`ClusterKey::reload`] (on SIGHUP) re-reads the files, so the key
//! is changed in three reloads without stopping a node (`docs/store.md`, "The cluster key").
//!
//! Replays: a seal older or newer than [`WINDOW_MS`] is refused, so a
//! captured message is only good for a minute; within it, the operator's
//! control requests (retire, cancel) are refused when their tag was seen
//! already, and every other internal request is idempotent or ordered by
//! version (see `docs/design/store-protocol.md`, "Replays").

pub use crate::key::*;
pub use crate::ticket::*;
use crate::wire::{self, Body, Code, Msg, WireError};
use std::collections::HashMap;

/// Most control tags a gate remembers (each is kept for the window).
const MAX_SEEN: usize = 65_536;

/// Why a datagram was not taken as authentic.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// The datagram is not sealed.
    #[error("it carries no cluster-key tag")]
    Unsealed,
    /// The tag does not match (another cluster's key, or damage).
    #[error(
        "its tag does not match this cluster's key (nor the other key accepted during a rotation)"
    )]
    BadTag,
    /// The sender's clock is too far from the receiver's.
    #[error("it was sealed {0} ms away from this node's clock (limit {WINDOW_MS} ms): clocks apart, or a replay")]
    Stale(u64),
    /// A control request whose tag was seen already.
    #[error("it is a replay of a request already handled")]
    Replayed,
    /// A tenant's request with no seal at all.
    #[error("it carries no tenant credential")]
    NoCredential,
    /// A tenant's seal whose tag does not match the tenant's key.
    #[error(
        "its tag does not match tenant {0:?}'s key under this cluster's key (a forged or \
         damaged request, or a credential of another cluster or from before a key rotation: \
         issue it again with `strata store tenant add`)"
    )]
    BadTenantTag(String),
    /// A tenant's seal that is cut short or names no valid tenant.
    #[error("its tenant seal is malformed")]
    BadTenantSeal,
    /// A tenant's credential of a generation the orchestrator revoked.
    #[error(
        "tenant '{tenant}' credential generation {generation} was revoked (generations below \
         {min} are refused); ask the operator for a new one (`strata store tenant add \
         --cluster ADDR --tenant {tenant}`)"
    )]
    Revoked {
        /// The tenant id.
        tenant: String,
        /// The generation the request's credential carries.
        generation: u32,
        /// The tenant's minimum generation, as published.
        min: u32,
    },
    /// A tenant's seal on a kind that is not a tenant's request.
    #[error("a tenant's credential does not authorise kind {0} (only Post, Link, Update, Get, GetLinkProof, Delete and List)")]
    TenantKind(u8),
}

/// Checks the seal of `buf` with `key` at wall-clock time `now_ms`;
/// returns its tag. Nothing after the header is decoded before this.
pub fn check_seal(buf: &[u8], key: &ClusterKey, now_ms: u64) -> Result<[u8; TAG_LEN], AuthError> {
    let Some((signed, at, tag)) = wire::seal_parts(buf) else {
        return Err(AuthError::Unsealed);
    };
    if !key.verify(signed, &tag) {
        return Err(AuthError::BadTag);
    }
    let apart = now_ms.abs_diff(at);
    if apart > WINDOW_MS {
        return Err(AuthError::Stale(apart));
    }
    Ok(tag)
}

/// Checks the tenant's seal of `buf` with the tenant key `key` derives for
/// the tenant id and generation it names (kept in `cache`), at wall-clock
/// time `now_ms`; returns the tenant id. A generation below the tenant's
/// minimum in `revoked` (a table's [`crate::table::Table::revoked`]) is
/// refused first, without an HMAC. Nothing but the seal's trailer is read
/// before the tag is checked.
pub fn check_tenant_seal<'a>(
    buf: &'a [u8],
    key: &ClusterKey,
    cache: &mut DerivedKeys,
    revoked: &[(u64, u32)],
    now_ms: u64,
) -> Result<&'a str, AuthError> {
    let head = wire::peek(buf).map_err(|_| AuthError::BadTenantSeal)?;
    if !head.tenant {
        return Err(AuthError::NoCredential);
    }
    let Some(parts) = wire::tenant_parts(buf) else {
        return Err(AuthError::BadTenantSeal);
    };
    if crate::tenant::check_tenant_id(parts.tenant).is_err() {
        return Err(AuthError::BadTenantSeal);
    }
    let min = min_generation(revoked, parts.tenant);
    if parts.generation < min {
        return Err(AuthError::Revoked {
            tenant: parts.tenant.to_string(),
            generation: parts.generation,
            min,
        });
    }
    if !crate::tenant::verify_cached(
        key,
        cache,
        parts.tenant,
        parts.generation,
        parts.signed,
        parts.tag,
    ) {
        return Err(AuthError::BadTenantTag(parts.tenant.to_string()));
    }
    let apart = now_ms.abs_diff(parts.at);
    if apart > WINDOW_MS {
        return Err(AuthError::Stale(apart));
    }
    Ok(parts.tenant)
}

/// Tenant `tenant`'s minimum generation in a table's revocation list.
fn min_generation(revoked: &[(u64, u32)], tenant: &str) -> u32 {
    let hash = crate::tenant::tenant_id_hash(tenant);
    revoked
        .binary_search_by_key(&hash, |(h, _)| *h)
        .map_or(0, |i| revoked[i].1)
}

/// Decodes an answer to a request sealed with `key` (or, with no key, to
/// an unsealed one). A sealed request takes only a sealed answer, except
/// an unsealed refusal as unauthenticated: that can only make the call
/// fail, and it tells an operator with the wrong key why.
pub fn open_answer(buf: &[u8], key: Option<&ClusterKey>, now_ms: u64) -> Option<Msg> {
    let msg = Msg::decode(buf).ok()?;
    let Some(key) = key else { return Some(msg) };
    match check_seal(buf, key, now_ms) {
        Ok(_) => Some(msg),
        Err(_) if is_refusal(&msg) => Some(msg),
        Err(_) => None,
    }
}

/// An unsealed answer a sealed request may take: a refusal as
/// unauthenticated, or a request to pad it ([`Body::PadTo`]), which the
/// node sends instead of a refusal longer than the request.
fn is_refusal(msg: &Msg) -> bool {
    matches!(
        msg.body,
        Body::Error {
            code: Code::Unauthenticated,
            ..
        } | Body::PadTo { .. }
    )
}

/// Which role a [`Gate`] guards: it decides the kinds let in unsealed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Receiver {
    /// A metadata node: tenants' requests are let in with a tenant's seal
    /// ([`crate::tenant`]) and only for names in the tenant's scope.
    Mn,
    /// The orchestrator: only the table request is let in unsealed.
    On,
}

/// What a [`Gate`] makes of one datagram.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Hand it to the node; `sealed` says whether it was authenticated.
    Accept {
        /// The message.
        msg: Msg,
        /// Authenticated with the cluster key.
        sealed: bool,
        /// The tenant whose credential sealed it, if a tenant's did.
        tenant: Option<String>,
    },
    /// Do not handle it; send this (unsealed) answer back instead. The
    /// sender was not authenticated: the node sends no answer longer than
    /// the datagram ([`within`]).
    Refuse(Msg),
    /// Do not handle it; send this (unsealed) answer back instead. The
    /// sender was authenticated (by a node's or a tenant's seal), but the
    /// body does not decode or is out of the tenant's scope.
    Deny(Msg),
    /// Do not handle it and do not answer (an answer to an answer could
    /// bounce between two nodes forever).
    Drop,
}

/// The check every datagram to a metadata node or the orchestrator goes
/// through before the node acts on it.
pub struct Gate {
    key: ClusterKey,
    receiver: Receiver,
    /// Tags of control requests taken, with their seal's clock.
    seen: HashMap<[u8; TAG_LEN], u64>,
    /// Tenants' secrets derived from the key, so each is derived once.
    derived: DerivedKeys,
    /// The revocation list of the table the node last gave the gate
    /// ([`Gate::follow_table`]), and that table's epoch.
    revoked: Vec<(u64, u32)>,
    revoked_epoch: Option<u64>,
}

impl Gate {
    /// A gate for `receiver` holding the cluster's `key`.
    pub fn new(key: ClusterKey, receiver: Receiver) -> Gate {
        Gate {
            key,
            receiver,
            seen: HashMap::new(),
            derived: DerivedKeys::default(),
            revoked: Vec::new(),
            revoked_epoch: None,
        }
    }

    /// Takes the revocation list of the node's table (a metadata node's
    /// runtime calls this before every datagram, so a table fetched since
    /// is followed at once; the same epoch costs one comparison): from
    /// then on, a tenant's credential of a generation below its minimum
    /// is refused, and the secrets cached for those generations are
    /// dropped.
    pub fn follow_table(&mut self, table: &crate::table::Table) {
        if self.revoked_epoch == Some(table.epoch) {
            return;
        }
        self.revoked_epoch = Some(table.epoch);
        self.follow_revocations(&table.revoked);
    }

    /// [`Gate::follow_table`] for a revocation list alone.
    pub fn follow_revocations(&mut self, revoked: &[(u64, u32)]) {
        if self.revoked == revoked {
            return;
        }
        self.revoked = revoked.to_vec();
        let list = &self.revoked;
        self.derived.retain_names(|name| {
            crate::tenant::cache_name_parts(name)
                .is_some_and(|(id, generation)| generation >= min_generation(list, id))
        });
    }

    /// The cluster key (answers to sealed requests are sealed with it).
    pub fn key(&self) -> &ClusterKey {
        &self.key
    }

    /// How many tenants' secrets the gate has cached.
    pub fn derived_cached(&self) -> usize {
        self.derived.len()
    }

    /// Checks `buf`, received at wall-clock time `now_ms`: a node's seal
    /// (any kind), or at a metadata node a tenant's seal (a tenant's
    /// request kind, names in its scope, and for a `Link` a proof for its
    /// replicas: [`check_link_proof`]), or at the orchestrator nothing
    /// for the table request. Every check that needs no decoding (the
    /// tags) comes before the body is decoded.
    pub fn admit(&mut self, buf: &[u8], now_ms: u64) -> Verdict {
        let head = match wire::peek(buf) {
            Ok(h) => h,
            Err(e) => return Verdict::Refuse(wire::malformed(buf, &e)),
        };
        let checked = if head.sealed {
            self.check(buf, head.kind, now_ms).map(|()| None)
        } else if head.tenant {
            self.check_tenant(buf, head.kind, now_ms).map(Some)
        } else if self.receiver == Receiver::On && head.kind == wire::KIND_GET_TABLE {
            Ok(None)
        } else if self.receiver == Receiver::Mn && wire::is_client_request(head.kind) {
            Err(AuthError::NoCredential)
        } else {
            Err(AuthError::Unsealed)
        };
        let tenant = match checked {
            Ok(t) => t,
            Err(why) => return refuse(&head, &why, self.receiver),
        };
        let msg = match Msg::decode(buf) {
            Ok(msg) => msg,
            // An unsealed table request is not authenticated.
            Err(e) if head.sealed || tenant.is_some() => {
                return Verdict::Deny(wire::malformed(buf, &e))
            }
            Err(e) => return Verdict::Refuse(wire::malformed(buf, &e)),
        };
        if let Some(tenant) = tenant {
            let allowed =
                crate::scope::check_scope(tenant, &msg.body).and_then(|()| match &msg.body {
                    Body::Link { record, proof } => {
                        check_link_proof(record, proof, &self.key, tenant, now_ms)
                    }
                    _ => Ok(()),
                });
            if let Err(why) = allowed {
                return Verdict::Deny(Msg::new(
                    head.req,
                    head.target,
                    Body::Error {
                        code: Code::Forbidden,
                        message: format!("{why}; nothing done"),
                    },
                ));
            }
        }
        Verdict::Accept {
            msg,
            sealed: head.sealed,
            tenant: tenant.map(str::to_string),
        }
    }

    /// Checks a tenant's seal: only tenants' request kinds, and only at a
    /// metadata node (the orchestrator takes none); returns the tenant.
    fn check_tenant<'a>(
        &mut self,
        buf: &'a [u8],
        kind: u8,
        now_ms: u64,
    ) -> Result<&'a str, AuthError> {
        if self.receiver != Receiver::Mn || !wire::is_client_request(kind) {
            return Err(AuthError::TenantKind(kind));
        }
        check_tenant_seal(buf, &self.key, &mut self.derived, &self.revoked, now_ms)
    }

    fn check(&mut self, buf: &[u8], kind: u8, now_ms: u64) -> Result<(), AuthError> {
        let tag = check_seal(buf, &self.key, now_ms)?;
        if wire::is_control(kind) {
            self.first_sight(tag, now_ms)?;
        }
        Ok(())
    }

    /// Remembers a control request's tag for the window; refuses one seen
    /// already. A resend after a lost answer is sealed again (another
    /// clock, another tag), so only a copy of the same datagram is refused.
    fn first_sight(&mut self, tag: [u8; TAG_LEN], now_ms: u64) -> Result<(), AuthError> {
        self.seen
            .retain(|_, at| now_ms.saturating_sub(*at) <= 2 * WINDOW_MS);
        if self.seen.contains_key(&tag) {
            return Err(AuthError::Replayed);
        }
        if self.seen.len() >= MAX_SEEN {
            // Only authentic requests get here: a flood means a key holder
            // misbehaves; refusing is safer than forgetting.
            return Err(AuthError::Replayed);
        }
        self.seen.insert(tag, now_ms);
        Ok(())
    }
}

/// Slack a sender adds to the size a [`Body::PadTo`] asks for, so that an
/// answer a few bytes longer the next time (a clock in a message) still
/// fits.
pub const PAD_SLACK: usize = 64;

/// What a node sends back to an unauthenticated datagram of
/// `request_len` bytes (unsealed, or with a seal that failed, or a
/// tenant's request refused before its seal passed): `answer` if its
/// encoding is no longer than the datagram; else a [`Body::PadTo`] asking
/// for the request again padded to the answer's length, if that fits;
/// else nothing. A node never sends an unauthenticated source more bytes
/// than it received from it, so a spoofed source address gains an
/// attacker nothing (no reflection amplification), as in QUIC.
pub fn within(answer: Msg, request_len: usize) -> Option<Msg> {
    let len = answer.encode().map_or(usize::MAX, |b| b.len());
    if len <= request_len {
        return Some(answer);
    }
    let size = u32::try_from(len).ok()?;
    let pad = Msg::new(answer.req, answer.target, Body::PadTo { size });
    let fits = pad.encode().is_ok_and(|b| b.len() <= request_len);
    fits.then_some(pad)
}

/// The verdict on an unauthentic datagram: an answer is dropped, a
/// request refused with a short error.
fn refuse(head: &wire::Header, why: &AuthError, receiver: Receiver) -> Verdict {
    if wire::is_answer(head.kind) {
        tracing::debug!(
            "dropped an unauthenticated answer of kind {}: {why}",
            head.kind
        );
        return Verdict::Drop;
    }
    let advice = if receiver == Receiver::Mn && wire::is_client_request(head.kind) {
        "a tenant seals its requests with its credential (`strata store tenant add` \
         makes one; `strata obj --credential FILE` uses it)"
    } else {
        "it needs the cluster key (--key)"
    };
    Verdict::Refuse(Msg::new(
        head.req,
        head.target,
        Body::Error {
            code: Code::Unauthenticated,
            message: format!(
                "unauthenticated request of kind {}: {why}; nothing done; {advice}",
                head.kind
            ),
        },
    ))
}

/// Encodes `msg`, sealed with `key` at `now_ms` when there is one.
pub fn encode(msg: &Msg, key: Option<&ClusterKey>, now_ms: u64) -> Result<Vec<u8>, WireError> {
    match key {
        Some(k) => msg.seal(k, now_ms),
        None => msg.encode(),
    }
}

/// [`encode`], padded with zeros to at least `pad_to` bytes
/// ([`Msg::encode_padded`]).
pub fn encode_padded(
    msg: &Msg,
    key: Option<&ClusterKey>,
    now_ms: u64,
    pad_to: usize,
) -> Result<Vec<u8>, WireError> {
    match key {
        Some(k) => msg.seal_padded(k, now_ms, pad_to),
        None => msg.encode_padded(pad_to),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::TenantCredential;
    use crate::ticket::{LINK_PROOF_FIXED, TICKET_FIXED};
    use crate::wire::Record;
    use sha2::Sha256;

    const NOW: u64 = 1_700_000_000_000;

    fn key(b: u8) -> ClusterKey {
        ClusterKey::from_bytes(&[b; KEY_LEN])
    }

    #[test]
    fn a_fingerprint_is_stable_differs_per_key_and_is_not_the_key() {
        let (a, b) = ([7u8; KEY_LEN], [8u8; KEY_LEN]);
        assert_eq!(fingerprint(&a), fingerprint(&a));
        assert_ne!(fingerprint(&a), fingerprint(&b));
        // Pinned: a node and the CLI of another build must agree.
        assert_eq!(fmt_fingerprint(fingerprint(&[0u8; KEY_LEN])).len(), 16);
        assert_eq!(
            fmt_fingerprint(fingerprint(&a)),
            fmt_fingerprint(fingerprint(&[7u8; KEY_LEN]))
        );
        // Not the key's bytes, nor a bare hash of them.
        let fp = fingerprint(&a).to_be_bytes();
        assert_ne!(fp[..], a[..8]);
        use sha2::Digest;
        assert_ne!(fp[..], Sha256::digest(a)[..8]);
        // The ring's: active, then the other accepted key.
        let ring = ClusterKey::from_ring(&a, Some(&b));
        let prints = ring.fingerprints();
        assert_eq!(prints.active, fingerprint(&a));
        assert_eq!(prints.other, Some(fingerprint(&b)));
        assert_eq!(
            prints.to_string(),
            format!(
                "{}+{}",
                fmt_fingerprint(fingerprint(&a)),
                fmt_fingerprint(fingerprint(&b))
            )
        );
        assert_eq!(key(7).fingerprints().other, None);
        assert_eq!(
            ClusterKey::from_ring(&a, Some(&a)).fingerprints().other,
            None
        );
    }

    fn forbidden(v: Verdict) -> String {
        match v {
            Verdict::Deny(Msg {
                body:
                    Body::Error {
                        code: Code::Forbidden,
                        message,
                    },
                ..
            }) => message,
            other => panic!("expected a refusal for scope, got {other:?}"),
        }
    }

    #[test]
    fn a_gate_refuses_revoked_generations_and_drops_their_cached_secrets() {
        let k = key(1);
        let mut mn = Gate::new(k.clone(), Receiver::Mn);
        let get = |n: &str| Msg::new(4, 9, Body::Get { name: n.into() });
        let old = TenantCredential::issue(&k, "acme").unwrap();
        let new = TenantCredential::issue_generation(&k, "acme", 1).unwrap();
        let bee = TenantCredential::issue(&k, "bee").unwrap();
        let accepted = |mn: &mut Gate, c: &TenantCredential, n: &str| {
            let bytes = get(n).seal_tenant(c, NOW).unwrap();
            matches!(mn.admit(&bytes, NOW), Verdict::Accept { .. })
        };
        // Before the revocation, every generation's own secret works.
        assert!(accepted(&mut mn, &old, "acme/x"));
        assert!(accepted(&mut mn, &new, "acme/x"));
        assert!(accepted(&mut mn, &bee, "bee/x"));
        assert_eq!(mn.derived_cached(), 3);
        let mut table = crate::table::Table::decode(&sample_table().encode()).unwrap();
        table.epoch += 1;
        table.raise_min_generation("acme", 1).unwrap();
        mn.follow_table(&table);
        // Generation 0's secret is dropped; the others stay.
        assert_eq!(mn.derived_cached(), 2);
        let bytes = get("acme/x").seal_tenant(&old, NOW).unwrap();
        let why = refused(mn.admit(&bytes, NOW));
        assert!(
            why.contains("tenant 'acme' credential generation 0 was revoked")
                && why.contains("ask the operator for a new one")
                && why.contains("nothing done"),
            "{why}"
        );
        assert!(accepted(&mut mn, &new, "acme/x"));
        assert!(accepted(&mut mn, &bee, "bee/x"));
        // A forged seal claiming a high generation still needs its tag.
        let forged = TenantCredential::with_generation("acme", 9, [7; KEY_LEN]).unwrap();
        assert!(!accepted(&mut mn, &forged, "acme/x"));
        // A request carrying another generation than its secret's fails
        // the tag: the generation is covered by it.
        let mut lying = get("acme/x").seal_tenant(&old, NOW).unwrap();
        let at = lying.len() - TAG_LEN - 8 - 1 - 4;
        lying[at..at + 4].copy_from_slice(&1u32.to_be_bytes());
        assert!(refused(mn.admit(&lying, NOW)).contains("does not match"));
    }

    fn sample_table() -> crate::table::Table {
        crate::table::Table {
            epoch: 1,
            layout: crate::addr::Layout::new(0, 4),
            routed: false,
            params: crate::table::Params::default(),
            buckets: vec![],
            mns: vec![],
            mg_owner: vec![0; 16],
            sns: vec![],
            moves: vec![],
            stand_ins: vec![],
            drains: vec![],
            keys: vec![],
            on_keys: None,
            revoked: Vec::new(),
        }
    }

    #[test]
    fn a_gate_checks_a_tenants_seal_clock_kind_and_scope() {
        let ring = ClusterKey::from_ring(&[1; KEY_LEN], Some(&[2; KEY_LEN]));
        let mut mn = Gate::new(ring, Receiver::Mn);
        let acme = TenantCredential::issue(&key(1), "acme").unwrap();
        let get = |n: &str| Msg::new(4, 9, Body::Get { name: n.into() });
        let mine = get("acme/x").seal_tenant(&acme, NOW).unwrap();
        assert_eq!(
            mn.admit(&mine, NOW),
            Verdict::Accept {
                msg: get("acme/x"),
                sealed: false,
                tenant: Some("acme".into()),
            }
        );
        // Issued under the other key of the ring (a rotation): accepted.
        let rotated = TenantCredential::issue(&key(2), "acme").unwrap();
        let by_other = get("acme/x").seal_tenant(&rotated, NOW).unwrap();
        assert!(matches!(mn.admit(&by_other, NOW), Verdict::Accept { .. }));
        // Out of scope: refused with the rule said.
        let theirs = get("other/x").seal_tenant(&acme, NOW).unwrap();
        let why = forbidden(mn.admit(&theirs, NOW));
        assert!(
            why.contains("tenant 'acme' may only use names under 'acme/'; 'other/x' refused"),
            "{why}"
        );
        // A key of another cluster; a secret claimed for another tenant.
        let foreign = TenantCredential::issue(&key(3), "acme").unwrap();
        let why = refused(mn.admit(&get("acme/x").seal_tenant(&foreign, NOW).unwrap(), NOW));
        assert!(why.contains("tenant \"acme\"'s key"), "{why}");
        let impostor = TenantCredential::new("other", acme.secret_bytes()).unwrap();
        let why = refused(mn.admit(&get("other/x").seal_tenant(&impostor, NOW).unwrap(), NOW));
        assert!(why.contains("does not match"), "{why}");
        // Out of the window either way.
        for at in [NOW - WINDOW_MS - 1, NOW + WINDOW_MS + 1] {
            let stale = get("acme/x").seal_tenant(&acme, at).unwrap();
            assert!(refused(mn.admit(&stale, NOW)).contains("clocks apart"));
        }
        // A tenant's seal on an internal kind is refused before anything.
        let rep = replicate().seal_tenant(&acme, NOW).unwrap();
        assert!(refused(mn.admit(&rep, NOW)).contains("does not authorise kind 11"));
        // Every flipped bit and every cut is refused.
        for i in 0..mine.len() * 8 {
            let mut b = mine.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(
                !matches!(mn.admit(&b, NOW), Verdict::Accept { .. }),
                "bit {i}"
            );
        }
        for cut in 0..mine.len() {
            assert!(
                !matches!(mn.admit(&mine[..cut], NOW), Verdict::Accept { .. }),
                "cut {cut}"
            );
        }
        // The body swapped under a valid trailer: the tag covers it.
        let other_body = get("acme/y").seal_tenant(&acme, NOW).unwrap();
        let mut spliced = other_body[..wire::HEADER_LEN + 8].to_vec();
        spliced.extend_from_slice(&mine[wire::HEADER_LEN + 8..]);
        assert!(!matches!(mn.admit(&spliced, NOW), Verdict::Accept { .. }));
    }

    fn replicate() -> Msg {
        let record = Record {
            name: "bucket/some/object-name".into(),
            size: 0,
            crc: 0,
            version: 12,
            meta: vec![1, 2, 3],
            replicas: vec![4, 5, 6],
            rename: None,
            attributes: Vec::new(),
            fragments: None,
            inline: None,
        };
        Msg::new(42, 1, Body::Replicate { record })
    }

    fn refused(v: Verdict) -> String {
        match v {
            Verdict::Refuse(Msg {
                body:
                    Body::Error {
                        code: Code::Unauthenticated,
                        message,
                    },
                ..
            }) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn internal_kinds_need_the_seal_and_tenant_kinds_a_tenants_seal() {
        let mut mn = Gate::new(key(1), Receiver::Mn);
        let plain = replicate().encode().unwrap();
        assert!(refused(mn.admit(&plain, NOW)).contains("no cluster-key tag"));
        let forged = replicate().seal(&key(2), NOW).unwrap();
        assert!(refused(mn.admit(&forged, NOW)).contains("does not match"));
        let stale = replicate().seal(&key(1), NOW - WINDOW_MS - 1).unwrap();
        assert!(refused(mn.admit(&stale, NOW)).contains("clocks apart"));
        let good = replicate().seal(&key(1), NOW).unwrap();
        assert_eq!(
            mn.admit(&good, NOW),
            Verdict::Accept {
                msg: replicate(),
                sealed: true,
                tenant: None,
            }
        );
        // A tenant's Get goes in with its tenant's seal, not unsealed;
        // the orchestrator takes only the table request unsealed.
        let get = Msg::new(1, 2, Body::Get { name: "x".into() });
        let admin = TenantCredential::issue(&key(1), crate::tenant::ADMIN).unwrap();
        let verdict = mn.admit(&get.seal_tenant(&admin, NOW).unwrap(), NOW);
        assert!(matches!(verdict, Verdict::Accept { sealed: false, .. }));
        let why = refused(mn.admit(&get.encode().unwrap(), NOW));
        assert!(why.contains("no tenant credential"), "{why}");
        let mut on = Gate::new(key(1), Receiver::On);
        refused(on.admit(&get.encode().unwrap(), NOW));
        refused(on.admit(&get.seal_tenant(&admin, NOW).unwrap(), NOW));
        let table = Msg::new(1, 0, Body::GetTable).encode().unwrap();
        assert!(matches!(on.admit(&table, NOW), Verdict::Accept { .. }));
        let retire = Msg::new(1, 0, Body::Retire { uuid: 5 }).encode().unwrap();
        refused(on.admit(&retire, NOW));
        // An unsealed answer is dropped, never answered.
        for body in [
            Body::Done { version: 1 },
            Body::MgRows {
                rows: vec![],
                more: false,
            },
        ] {
            let b = Msg::new(1, 0, body).encode().unwrap();
            assert_eq!(mn.admit(&b, NOW), Verdict::Drop);
        }
    }

    #[test]
    fn a_replayed_control_request_is_refused_but_a_resealed_resend_is_not() {
        let mut on = Gate::new(key(1), Receiver::On);
        let retire = Msg::new(8, 0, Body::Retire { uuid: 5 });
        let first = retire.seal(&key(1), NOW).unwrap();
        assert!(matches!(
            on.admit(&first, NOW),
            Verdict::Accept { sealed: true, .. }
        ));
        assert!(refused(on.admit(&first, NOW + 10)).contains("replay"));
        let resent = retire.seal(&key(1), NOW + 300).unwrap();
        assert!(matches!(
            on.admit(&resent, NOW + 300),
            Verdict::Accept { .. }
        ));
        // Other internal kinds are idempotent: a copy is let through.
        let hb = Msg::new(
            9,
            0,
            Body::Heartbeat {
                uuid: 1,
                free: 2,
                objects: 3,
                keys: None,
            },
        );
        let hb = hb.seal(&key(1), NOW).unwrap();
        for _ in 0..2 {
            assert!(matches!(on.admit(&hb, NOW), Verdict::Accept { .. }));
        }
    }

    #[test]
    fn an_answer_to_a_sealed_request_must_be_sealed() {
        let k = key(1);
        let done = Msg::new(3, 0, Body::Done { version: 1 });
        assert_eq!(open_answer(&done.encode().unwrap(), Some(&k), NOW), None);
        let sealed = done.seal(&k, NOW).unwrap();
        assert_eq!(open_answer(&sealed, Some(&k), NOW), Some(done.clone()));
        assert_eq!(open_answer(&sealed, Some(&key(2)), NOW), None);
        assert_eq!(open_answer(&sealed, None, NOW), Some(done));
        // A refusal is let through unsealed: it can only fail the call.
        let no = Msg::new(
            3,
            0,
            Body::Error {
                code: Code::Unauthenticated,
                message: "no".into(),
            },
        );
        assert!(open_answer(&no.encode().unwrap(), Some(&k), NOW).is_some());
    }

    #[test]
    fn key_files_are_made_private_and_checked() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        let made = ClusterKey::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read(&path).unwrap().len(), KEY_LEN);
        // Loaded again, it is the same key.
        let again = ClusterKey::load_or_create(&path).unwrap();
        assert_eq!(made.tag(b"x"), again.tag(b"x"));
        assert_eq!(ClusterKey::load(&path).unwrap().tag(b"x"), made.tag(b"x"));
        std::fs::write(&path, [0u8; 31]).unwrap();
        let err = ClusterKey::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("31 bytes") && err.contains(&path.display().to_string()),
            "{err}"
        );
        // Readable by others: refused, with the fix named.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = ClusterKey::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("mode 0644") && err.contains("chmod 600"),
            "{err}"
        );
        let missing = dir.path().join("nope.key");
        let err = ClusterKey::load(&missing).unwrap_err().to_string();
        assert!(err.contains("nope.key") && err.contains("--key"), "{err}");
    }

    #[test]
    fn a_ring_accepts_its_two_keys_and_seals_with_the_active_one() {
        let (a, b) = ([1u8; KEY_LEN], [2u8; KEY_LEN]);
        let only_a = ClusterKey::from_bytes(&a);
        let only_b = ClusterKey::from_bytes(&b);
        let a_then_b = ClusterKey::from_ring(&a, Some(&b));
        let b_then_a = ClusterKey::from_ring(&b, Some(&a));
        assert_eq!((only_a.accepted(), a_then_b.accepted()), (1, 2));
        // The same key twice is one key.
        assert_eq!(ClusterKey::from_ring(&a, Some(&a)).accepted(), 1);
        let m = replicate();
        let by_a = m.seal(&only_a, NOW).unwrap();
        let by_b = m.seal(&only_b, NOW).unwrap();
        // A ring seals with its active key only.
        assert_eq!(m.seal(&a_then_b, NOW).unwrap(), by_a);
        assert_eq!(m.seal(&b_then_a, NOW).unwrap(), by_b);
        for ring in [&a_then_b, &b_then_a] {
            assert!(check_seal(&by_a, ring, NOW).is_ok());
            assert!(check_seal(&by_b, ring, NOW).is_ok());
        }
        assert_eq!(check_seal(&by_a, &only_b, NOW), Err(AuthError::BadTag));
        assert_eq!(check_seal(&by_b, &only_a, NOW), Err(AuthError::BadTag));
        let c = ClusterKey::from_ring(&[3; KEY_LEN], Some(&[4; KEY_LEN]));
        assert_eq!(check_seal(&by_a, &c, NOW), Err(AuthError::BadTag));
        // A gate takes both; its answers are sealed with the active key.
        let mut gate = Gate::new(b_then_a.clone(), Receiver::Mn);
        for bytes in [&by_a, &by_b] {
            assert!(matches!(
                gate.admit(bytes, NOW),
                Verdict::Accept { sealed: true, .. }
            ));
        }
        let done = Msg::new(3, 0, Body::Done { version: 1 });
        let answer = done.seal(gate.key(), NOW).unwrap();
        assert_eq!(open_answer(&answer, Some(&only_b), NOW), Some(done.clone()));
        assert_eq!(open_answer(&answer, Some(&only_a), NOW), None);
        // Tickets likewise.
        let t = get_ticket();
        let t_a = t.seal(&only_a);
        let t_b = t.seal(&only_b);
        assert_eq!(t.seal(&a_then_b), t_a);
        for ring in [&a_then_b, &b_then_a] {
            assert_eq!(Ticket::open(&t_a, ring, NOW), Ok(t.clone()));
            assert_eq!(Ticket::open(&t_b, ring, NOW), Ok(t.clone()));
        }
        assert_eq!(Ticket::open(&t_a, &only_b, NOW), Err(TicketError::BadTag));
        assert_eq!(Ticket::open(&t_b, &only_a, NOW), Err(TicketError::BadTag));
        assert_eq!(Ticket::open(&t_a, &c, NOW), Err(TicketError::BadTag));
    }

    #[test]
    fn a_ring_is_reloaded_from_its_files_through_a_rotation() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        let next = sibling(&path, NEXT_SUFFIX);
        let prev = sibling(&path, PREV_SUFFIX);
        assert!(next.ends_with("cluster.key.next"), "{}", next.display());
        let ring = ClusterKey::load_or_create(&path).unwrap();
        let node = ring.clone(); // as another node of the process holds it
        let old = std::fs::read(&path).unwrap();
        let old: [u8; KEY_LEN] = old.as_slice().try_into().unwrap();
        let old = ClusterKey::from_bytes(&old);
        assert_eq!(ring.reload().unwrap(), 1);
        // 1: the next key is accepted, not used.
        ClusterKey::create(&next).unwrap();
        assert_eq!(ring.reload().unwrap(), 2);
        let new = ClusterKey::load(&next).unwrap();
        assert_eq!(new.accepted(), 1);
        assert_eq!(node.tag(b"x"), old.tag(b"x"));
        assert!(node.verify(b"x", &new.tag(b"x")));
        // 2: swapped (the copy step of `strata store key swap` included,
        // when .next and .prev both exist).
        std::fs::copy(&path, &prev).unwrap();
        assert_eq!(ring.reload().unwrap(), 2);
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(ring.reload().unwrap(), 2);
        assert_eq!(node.tag(b"x"), new.tag(b"x"));
        assert!(node.verify(b"x", &old.tag(b"x")));
        // 3: the old key is gone.
        std::fs::remove_file(&prev).unwrap();
        assert_eq!(ring.reload().unwrap(), 1);
        assert!(!node.verify(b"x", &old.tag(b"x")));
        assert!(node.verify(b"x", &new.tag(b"x")));
        // A bad file fails the reload, names the file, and the ring stays.
        std::fs::write(&next, [9u8; 5]).unwrap();
        std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = ring.reload().unwrap_err().to_string();
        assert!(
            err.contains("cluster.key.next") && err.contains("5 bytes"),
            "{err}"
        );
        std::fs::write(&next, [9u8; KEY_LEN]).unwrap();
        std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = ring.reload().unwrap_err().to_string();
        assert!(
            err.contains("cluster.key.next") && err.contains("chmod 600"),
            "{err}"
        );
        assert_eq!(node.accepted(), 1);
        assert!(node.verify(b"x", &new.tag(b"x")));
        // Three different keys: refused, both extra files named.
        std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&prev, [8u8; KEY_LEN]).unwrap();
        std::fs::set_permissions(&prev, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = ClusterKey::load(&path).unwrap_err().to_string();
        assert!(err.contains(".next") && err.contains(".prev"), "{err}");
        // A missing key file with a rotation's file next to it is not
        // replaced by a new key.
        std::fs::remove_file(&path).unwrap();
        let err = ClusterKey::load_or_create(&path).unwrap_err().to_string();
        assert!(err.contains("half done"), "{err}");
        assert!(!path.exists());
    }

    fn get_ticket() -> Ticket {
        Ticket {
            op: TicketOp::Get,
            expires: NOW + 5_000,
            size: 1 << 20,
            replicas: vec![u128::MAX - 1, 1 << 80, 77],
            coordinator: 0,
            tenant: "acme".into(),
        }
    }

    #[test]
    fn tickets_round_trip_and_refuse_any_change() {
        let k = key(1);
        let t = get_ticket();
        let bytes = t.seal(&k);
        assert_eq!(bytes.len(), TICKET_FIXED + 3 * 16 + t.tenant.len());
        assert_eq!(Ticket::open(&bytes, &k, NOW), Ok(t.clone()));
        assert_eq!(Ticket::open(&bytes, &k, t.expires), Ok(t.clone()));
        assert_eq!(
            Ticket::open(&bytes, &k, t.expires + 7),
            Err(TicketError::Expired(7))
        );
        assert_eq!(Ticket::open(&bytes, &key(2), NOW), Err(TicketError::BadTag));
        // Every flipped bit, every cut and every extra byte is refused.
        for i in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(Ticket::open(&b, &k, NOW).is_err(), "bit {i}");
        }
        for cut in 0..bytes.len() {
            assert!(Ticket::open(&bytes[..cut], &k, NOW).is_err(), "cut {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Ticket::open(&longer, &k, NOW).is_err());
        // A well-tagged ticket that says nothing sensible is refused too.
        let none = Ticket {
            replicas: vec![],
            ..t.clone()
        };
        let mut w = wire::Writer::default();
        w.buf
            .extend_from_slice(&none.seal(&k)[..TICKET_FIXED - TAG_LEN]);
        w.buf.extend_from_slice(&[0u8; 16]);
        let tag = k.tag(&w.buf);
        w.buf.extend_from_slice(&tag);
        assert!(Ticket::open(&w.buf, &k, NOW).is_err());
    }

    #[test]
    fn answers_get_tickets_except_an_empty_objects() {
        let k = key(1);
        let mut plan = Body::PostPlan {
            version: 3,
            size: 40 << 20,
            replicas: vec![5, 6],
            ticket: vec![],
            data_fragments: 0,
        };
        issue_ticket(&mut plan, 0, "acme", &k, NOW);
        let Body::PostPlan { ticket, .. } = &plan else {
            unreachable!()
        };
        let t = Ticket::open(ticket, &k, NOW).unwrap();
        assert_eq!(t.op, TicketOp::Put);
        assert_eq!((t.size, t.replicas), (40 << 20, vec![5, 6]));
        assert_eq!(t.expires, NOW + 62_000);
        let mut record = replicate_record();
        record.size = 3;
        let mut found = Body::Found {
            record: record.clone(),
            ticket: vec![],
        };
        issue_ticket(&mut found, 0, "acme", &k, NOW);
        let Body::Found { ticket, .. } = &found else {
            unreachable!()
        };
        let t = Ticket::open(ticket, &k, NOW).unwrap();
        assert_eq!((t.op, t.expires), (TicketOp::Get, NOW + 60_000));
        assert!(t.allows(TicketOp::Get, 5, &[], 0).is_ok());
        // An empty object is read from its record: no ticket, no HMAC.
        record.size = 0;
        record.crc = crc32c::crc32c(&[]);
        let mut empty = Body::Found {
            record,
            ticket: vec![],
        };
        issue_ticket(&mut empty, 0, "acme", &k, NOW);
        assert!(matches!(empty, Body::Found { ticket, .. } if ticket.is_empty()));
        let mut other = Body::Done { version: 1 };
        issue_ticket(&mut other, 0, "acme", &k, NOW);
        assert_eq!(other, Body::Done { version: 1 });
    }

    fn replicate_record() -> Record {
        match replicate().body {
            Body::Replicate { record } => record,
            _ => unreachable!(),
        }
    }

    fn linked(name: &str) -> Record {
        Record {
            name: name.into(),
            size: 300,
            crc: 0xdead_beef,
            version: 0,
            meta: vec![],
            replicas: vec![1 << 70, 5, u128::MAX - 3],
            rename: Some(wire::RenameLink::From("acme/old".into())),
            attributes: Vec::new(),
            fragments: None,
            inline: None,
        }
    }

    #[test]
    fn a_link_proof_binds_the_tenant_the_replicas_the_size_and_an_expiry() {
        let ring = ClusterKey::from_ring(&[1; KEY_LEN], Some(&[2; KEY_LEN]));
        let record = linked("acme/new");
        let proof = LinkProof::of(&record, NOW + 10).seal(&key(1), "acme");
        assert_eq!(proof.len(), LINK_PROOF_FIXED + 3 * 16);
        assert_eq!(
            check_link_proof(&record, &proof, &ring, "acme", NOW),
            Ok(())
        );
        // Issued with the other key of a ring (a rotation): accepted.
        let rotated = LinkProof::of(&record, NOW + 10).seal(&key(2), "acme");
        assert_eq!(
            check_link_proof(&record, &rotated, &ring, "acme", NOW),
            Ok(())
        );
        // The same replicas in another order bind nothing more.
        let mut reordered = record.clone();
        reordered.replicas.reverse();
        assert_eq!(
            check_link_proof(&reordered, &proof, &ring, "acme", NOW),
            Ok(())
        );
        let refused = |record: &Record, proof: &[u8], tenant: &str, now: u64| {
            check_link_proof(record, proof, &ring, tenant, now).unwrap_err()
        };
        let why = refused(&record, &[], "acme", NOW);
        assert!(why.contains("carries no link proof"), "{why}");
        assert!(
            why.contains("acme/new") && why.contains("strata obj mv"),
            "{why}"
        );
        // Another tenant's genuine proof: its tag covers the tenant id.
        let why = refused(&record, &proof, "evil", NOW);
        assert!(why.contains("issued to another tenant"), "{why}");
        let why = refused(&record, &proof, crate::tenant::ADMIN, NOW);
        assert!(why.contains("does not match"), "{why}");
        // A key the ring does not hold.
        let foreign = LinkProof::of(&record, NOW + 10).seal(&key(3), "acme");
        assert!(refused(&record, &foreign, "acme", NOW).contains("does not match"));
        let why = refused(&record, &proof, "acme", NOW + 17);
        assert!(why.contains("expired 7 ms ago"), "{why}");
        // A genuine proof for other replicas, size or checksum.
        let mut other = record.clone();
        other.replicas[1] = 6;
        let why = refused(&other, &proof, "acme", NOW);
        assert!(
            why.contains("covers replicas") && why.contains("but the Link binds"),
            "{why}"
        );
        let mut fewer = record.clone();
        fewer.replicas.pop();
        assert!(refused(&fewer, &proof, "acme", NOW).contains("but the Link binds"));
        let mut more = record.clone();
        more.replicas.push(9);
        assert!(refused(&more, &proof, "acme", NOW).contains("but the Link binds"));
        let bigger = Record {
            size: 301,
            ..record.clone()
        };
        assert!(refused(&bigger, &proof, "acme", NOW).contains("but the Link binds"));
        let other_crc = Record {
            crc: 1,
            ..record.clone()
        };
        assert!(refused(&other_crc, &proof, "acme", NOW).contains("but the Link binds"));
        // A ticket (same key, same replicas) is not a link proof.
        let ticket = Ticket {
            op: TicketOp::Get,
            expires: NOW + 10,
            size: 300,
            replicas: record.replicas.clone(),
            coordinator: 0,
            tenant: "acme".into(),
        }
        .seal(&key(1));
        assert!(refused(&record, &ticket, "acme", NOW).contains("link proof"));
        // Every flipped bit, every cut and every extra byte is refused.
        for i in 0..proof.len() * 8 {
            let mut b = proof.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(
                check_link_proof(&record, &b, &ring, "acme", NOW).is_err(),
                "bit {i}"
            );
        }
        for cut in 0..proof.len() {
            let cut = &proof[..cut];
            assert!(
                check_link_proof(&record, cut, &ring, "acme", NOW).is_err(),
                "cut"
            );
        }
        let mut longer = proof.clone();
        longer.push(0);
        assert!(check_link_proof(&record, &longer, &ring, "acme", NOW).is_err());
        // A record with no replicas binds no data: nothing to prove.
        let bare = Record {
            replicas: vec![],
            ..record.clone()
        };
        assert_eq!(check_link_proof(&bare, &[], &ring, "acme", NOW), Ok(()));
    }

    #[test]
    fn link_proofs_are_issued_in_link_proof_answers_with_replicas_only() {
        let k = key(1);
        let record = linked("acme/old");
        let mut answer = Body::LinkProof {
            record: record.clone(),
            proof: vec![],
        };
        issue_link_proof(&mut answer, &k, "acme", NOW);
        let Body::LinkProof { proof, .. } = &answer else {
            unreachable!()
        };
        let p = LinkProof::open(proof, &k, "acme", NOW).unwrap();
        assert_eq!(p, LinkProof::of(&record, NOW + LINK_PROOF_MS));
        // A zero-byte object with replicas gets one too (a Link of them
        // must be proved like any other); one with none needs none.
        let empty = Record {
            size: 0,
            crc: crc32c::crc32c(&[]),
            ..record.clone()
        };
        let mut answer = Body::LinkProof {
            record: empty,
            proof: vec![],
        };
        issue_link_proof(&mut answer, &k, "acme", NOW);
        assert!(matches!(&answer, Body::LinkProof { proof, .. } if !proof.is_empty()));
        let bare = Record {
            replicas: vec![],
            ..record.clone()
        };
        let mut answer = Body::LinkProof {
            record: bare,
            proof: vec![],
        };
        issue_link_proof(&mut answer, &k, "acme", NOW);
        assert!(matches!(&answer, Body::LinkProof { proof, .. } if proof.is_empty()));
        // A Get's Found gets its ticket, never a link proof.
        let mut found = Body::Found {
            record,
            ticket: vec![],
        };
        issue_link_proof(&mut found, &k, "acme", NOW);
        assert!(matches!(&found, Body::Found { ticket, .. } if ticket.is_empty()));
    }

    #[test]
    fn a_gate_lets_a_tenants_link_in_only_with_a_proof_for_its_replicas() {
        let k = key(1);
        let mut mn = Gate::new(k.clone(), Receiver::Mn);
        let acme = TenantCredential::issue(&k, "acme").unwrap();
        let evil = TenantCredential::issue(&k, "evil").unwrap();
        let link = |record: Record, proof: Vec<u8>| Msg::new(3, 9, Body::Link { record, proof });
        let record = linked("acme/new");
        let proof = LinkProof::of(&record, NOW + 10).seal(&k, "acme");
        let good = link(record.clone(), proof.clone());
        let verdict = mn.admit(&good.seal_tenant(&acme, NOW).unwrap(), NOW);
        assert!(matches!(verdict, Verdict::Accept { ref msg, .. } if *msg == good));
        let bare = link(record.clone(), vec![]);
        let why = forbidden(mn.admit(&bare.seal_tenant(&acme, NOW).unwrap(), NOW));
        assert!(
            why.contains("carries no link proof") && why.ends_with("nothing done"),
            "{why}"
        );
        // Tenant evil, with acme's genuine proof, under a name of its own.
        let mut theirs = record.clone();
        theirs.name = "evil/new".into();
        theirs.rename = Some(wire::RenameLink::From("evil/old".into()));
        let stolen = link(theirs.clone(), proof);
        let why = forbidden(mn.admit(&stolen.seal_tenant(&evil, NOW).unwrap(), NOW));
        assert!(why.contains("issued to another tenant"), "{why}");
        // Out of scope is said first, proof or not.
        let why = forbidden(mn.admit(&good.seal_tenant(&evil, NOW).unwrap(), NOW));
        assert!(why.contains("may only use names under 'evil/'"), "{why}");
        // A node's Link (cluster key) needs no proof: nodes hold the key.
        let verdict = mn.admit(&bare.seal(&k, NOW).unwrap(), NOW);
        assert!(matches!(verdict, Verdict::Accept { sealed: true, .. }));
    }

    #[test]
    fn tenants_secrets_are_cached_bounded_verified_only_and_per_key() {
        let k = key(1);
        let mut mn = Gate::new(k.clone(), Receiver::Mn);
        let get = |n: String| Msg::new(4, 9, Body::Get { name: n });
        for i in 0..DERIVED_CACHE + 50 {
            let id = format!("t{i}");
            let cred = TenantCredential::issue(&k, &id).unwrap();
            let bytes = get(format!("{id}/x")).seal_tenant(&cred, NOW).unwrap();
            assert!(
                matches!(mn.admit(&bytes, NOW), Verdict::Accept { .. }),
                "{id}"
            );
            // Again, from the cache: still accepted.
            assert!(
                matches!(mn.admit(&bytes, NOW), Verdict::Accept { .. }),
                "{id}"
            );
            assert!(mn.derived_cached() <= DERIVED_CACHE);
        }
        assert_eq!(mn.derived_cached(), DERIVED_CACHE);
        // Forged seals of made-up tenants are not kept.
        let mut fresh = Gate::new(k.clone(), Receiver::Mn);
        for i in 0..100 {
            let id = format!("f{i}");
            let forged = TenantCredential::new(&id, [7; KEY_LEN]).unwrap();
            let bytes = get(format!("{id}/x")).seal_tenant(&forged, NOW).unwrap();
            assert!(!matches!(fresh.admit(&bytes, NOW), Verdict::Accept { .. }));
        }
        assert_eq!(fresh.derived_cached(), 0);
        // A cached secret is only good for the key that derived it: a
        // cache used with another ring forgets the old key's secrets, and
        // a credential of the old key is refused.
        let mut cache = DerivedKeys::default();
        let cred = TenantCredential::issue(&k, "acme").unwrap();
        let data = b"some request";
        let tag = cred.tag(data);
        let label = || crate::tenant::tenant_label("acme", 0);
        assert!(k.verify_derived_cached(&mut cache, "acme", &label, data, &tag));
        assert_eq!(cache.len(), 1);
        let rotated = ClusterKey::from_bytes(&[2; KEY_LEN]);
        assert!(!rotated.verify_derived_cached(&mut cache, "acme", &label, data, &tag));
        assert_eq!(cache.len(), 0);
        let both = ClusterKey::from_ring(&[2; KEY_LEN], Some(&[1; KEY_LEN]));
        assert!(both.verify_derived_cached(&mut cache, "acme", &label, data, &tag));
        assert!(both.verify_derived_cached(&mut cache, "acme", &label, data, &tag));
        assert!(!both.verify_derived_cached(&mut cache, "acme", &label, b"other", &tag));
        // Both keys' secrets of the genuine tenant: neither is derived again.
        assert_eq!(cache.len(), 2);
    }

    /// The cost a ticket adds to a Get: issuing it at the metadata node
    /// (an HMAC and a larger answer) and checking it at the storage node.
    /// Run with `--ignored --nocapture` in release.
    #[test]
    #[ignore]
    fn ticket_cost() {
        let k = key(1);
        let mut record = replicate_record();
        record.size = 4096;
        let n = 200_000;
        let plain = Msg::new(
            1,
            2,
            Body::Found {
                record: record.clone(),
                ticket: vec![],
            },
        );
        // The answer is cloned in both loops (as the issuing one must).
        let start = std::time::Instant::now();
        for _ in 0..n {
            let m = std::hint::black_box(plain.clone());
            std::hint::black_box(m.encode().unwrap());
        }
        let encode = start.elapsed();
        let start = std::time::Instant::now();
        let mut last = Vec::new();
        for i in 0..n {
            let mut m = plain.clone();
            issue_ticket(&mut m.body, 0, "acme", &k, NOW + i as u64);
            last = std::hint::black_box(m.encode().unwrap());
        }
        let issue = start.elapsed();
        let Ok(Msg {
            body: Body::Found { ticket, .. },
            ..
        }) = Msg::decode(&last)
        else {
            unreachable!()
        };
        let start = std::time::Instant::now();
        for _ in 0..n {
            let t = Ticket::open(&ticket, &k, NOW).unwrap();
            std::hint::black_box(t.allows(TicketOp::Get, 5, &[], 0)).unwrap();
        }
        let check = start.elapsed();
        let ring = ClusterKey::from_ring(&[2; KEY_LEN], Some(&[1; KEY_LEN]));
        let start = std::time::Instant::now();
        for _ in 0..n {
            let t = Ticket::open(&ticket, &ring, NOW).unwrap();
            std::hint::black_box(t.allows(TicketOp::Get, 5, &[], 0)).unwrap();
        }
        let second = start.elapsed();
        let per = |d: std::time::Duration| d.as_nanos() as f64 / n as f64;
        println!(
            "Found of {} bytes with a {}-byte ticket: encode {:.0} ns, \
             issue+encode {:.0} ns, ticket check {:.0} ns, by the other key of a ring {:.0} ns",
            last.len(),
            ticket.len(),
            per(encode),
            per(issue),
            per(check),
            per(second)
        );
    }

    /// The cost a tenant's seal adds to a zero-byte Get: sealing it at
    /// the client, and the gate's check at the metadata node (derive the
    /// tenant's secret, check the tag, decode, check the scope), against
    /// a plain encode and decode. Run with `--ignored --nocapture` in
    /// release.
    #[test]
    #[ignore]
    fn tenant_seal_cost() {
        let k = key(1);
        let cred = TenantCredential::issue(&k, "acme").unwrap();
        let get = Msg::new(
            1,
            2,
            Body::Get {
                name: "acme/0/3/1234".into(),
            },
        );
        let n = 200_000;
        let per = |d: std::time::Duration| d.as_nanos() as f64 / n as f64;
        let start = std::time::Instant::now();
        let mut plain = Vec::new();
        for _ in 0..n {
            plain = std::hint::black_box(get.encode().unwrap());
        }
        let encode = start.elapsed();
        let start = std::time::Instant::now();
        for _ in 0..n {
            std::hint::black_box(Msg::decode(&plain).unwrap());
        }
        let decode = start.elapsed();
        let start = std::time::Instant::now();
        let mut sealed = Vec::new();
        for i in 0..n {
            sealed = std::hint::black_box(get.seal_tenant(&cred, NOW + i as u64).unwrap());
        }
        let seal = start.elapsed();
        let mut gate = Gate::new(k.clone(), Receiver::Mn);
        let start = std::time::Instant::now();
        for _ in 0..n {
            let v = gate.admit(&sealed, NOW + n as u64);
            assert!(matches!(std::hint::black_box(v), Verdict::Accept { .. }));
        }
        let admit = start.elapsed();
        let ring = ClusterKey::from_ring(&[2; KEY_LEN], Some(&[1; KEY_LEN]));
        let mut gate = Gate::new(ring, Receiver::Mn);
        let start = std::time::Instant::now();
        for _ in 0..n {
            let v = gate.admit(&sealed, NOW + n as u64);
            assert!(matches!(std::hint::black_box(v), Verdict::Accept { .. }));
        }
        let second = start.elapsed();
        // The seal check alone, with the tenant's secret cached (as a
        // gate keeps it) and derived anew each time (an empty cache).
        let mut cache = DerivedKeys::default();
        let start = std::time::Instant::now();
        for _ in 0..n {
            let t = check_tenant_seal(&sealed, &k, &mut cache, &[], NOW + n as u64);
            assert_eq!(std::hint::black_box(t), Ok("acme"));
        }
        let cached = start.elapsed();
        let start = std::time::Instant::now();
        for _ in 0..n {
            let mut cache = DerivedKeys::default();
            let t = check_tenant_seal(&sealed, &k, &mut cache, &[], NOW + n as u64);
            assert_eq!(std::hint::black_box(t), Ok("acme"));
        }
        let derived = start.elapsed();
        println!(
            "zero-byte Get, {} bytes plain, {} sealed by a tenant: encode {:.0} ns, \
             encode+tenant seal {:.0} ns, decode {:.0} ns, gate check+decode+scope {:.0} ns, \
             by the other key of a ring {:.0} ns; seal check alone: secret cached {:.0} ns, \
             derived each time {:.0} ns",
            plain.len(),
            sealed.len(),
            per(encode),
            per(seal),
            per(decode),
            per(admit),
            per(second),
            per(cached),
            per(derived)
        );
    }

    /// The cost of a seal and of its check on a Replicate (the commonest
    /// internal message). Run with `--ignored --nocapture` in release.
    #[test]
    #[ignore]
    fn seal_cost() {
        let k = key(1);
        let m = replicate();
        let n = 200_000;
        let plain = std::time::Instant::now();
        for _ in 0..n {
            std::hint::black_box(m.encode().unwrap());
        }
        let plain = plain.elapsed();
        let start = std::time::Instant::now();
        let mut last = Vec::new();
        for i in 0..n {
            last = std::hint::black_box(m.seal(&k, NOW + i as u64).unwrap());
        }
        let seal = start.elapsed();
        let start = std::time::Instant::now();
        for _ in 0..n {
            std::hint::black_box(check_seal(&last, &k, NOW + n as u64).unwrap());
        }
        let check = start.elapsed();
        // During a rotation, a seal made with the other key: two HMACs.
        let ring = ClusterKey::from_ring(&[2; KEY_LEN], Some(&[1; KEY_LEN]));
        let start = std::time::Instant::now();
        for _ in 0..n {
            std::hint::black_box(check_seal(&last, &ring, NOW + n as u64).unwrap());
        }
        let second = start.elapsed();
        let start = std::time::Instant::now();
        for _ in 0..n {
            let bad = check_seal(&last, &key(3), NOW + n as u64);
            assert_eq!(std::hint::black_box(bad), Err(AuthError::BadTag));
        }
        let refused = start.elapsed();
        let per = |d: std::time::Duration| d.as_nanos() as f64 / n as f64;
        println!(
            "{} bytes sealed: encode {:.0} ns, encode+seal {:.0} ns, check {:.0} ns, \
             check by the other key of a ring {:.0} ns, refused by one key {:.0} ns",
            last.len(),
            per(plain),
            per(seal),
            per(check),
            per(second),
            per(refused)
        );
    }
}

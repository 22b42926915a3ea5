//! Capabilities that metadata nodes issue with the cluster key: tickets
//! for one Put or Get at storage nodes, and link proofs for a rename.

use crate::addr::Addr;
use crate::key::{ClusterKey, TAG_LEN};
use crate::wire::{self, Body, Record, WireError};

/// What a [`Ticket`] lets its holder do at a storage node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TicketOp {
    /// Store the replicas of one Post (the first one, which forwards to
    /// the others).
    Put = 1,
    /// Read any of the replicas of one record.
    Get = 2,
    /// Store any one of the fragments of one erasure-coded Post, alone
    /// (no forward chain): each fragment's bytes differ, so the client
    /// sends each to its own node.
    PutFragment = 3,
}

impl TicketOp {
    fn name(self) -> &'static str {
        match self {
            TicketOp::Put => "Put",
            TicketOp::Get => "Get",
            TicketOp::PutFragment => "Put of a fragment",
        }
    }
}

/// A capability for a tenant's request to a storage node, issued by the
/// metadata node that authorised it (in its `PostPlan` or `Found`
/// answer) and checked by the storage node with the cluster key. Tenants
/// carry it without being able to read its tag's key or make one.
///
/// Encoding: `S6T3`, op (u8), expiry (u64, ms since the Unix epoch, the
/// issuer's clock), size (u64), the coordinator's metadata address (16
/// bytes), replica count (u8, 1 to 16) and addresses, the tenant id (u16
/// length, at most [`crate::tenant::MAX_TENANT_ID`] bytes), then an
/// HMAC-SHA256 tag truncated to [`TAG_LEN`] bytes over everything before
/// it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// What it allows.
    pub op: TicketOp,
    /// When it stops being valid (ms since the Unix epoch).
    pub expires: u64,
    /// The object's size: a Put must send exactly this many bytes (a
    /// fragment's Put: the fragment's size).
    pub size: u64,
    /// The replicas it covers: a Put must write exactly these, in this
    /// order; a Get may read any of them.
    pub replicas: Vec<Addr>,
    /// The metadata address of the Post's coordinator, which the storage
    /// node tells when the tenant's connection closes before the data is
    /// whole ([`Body::PutAbandoned`]); 0 in a Get ticket.
    pub coordinator: Addr,
    /// The tenant the metadata node issued it to (empty when it answered
    /// a node): a storage node's scheduler classes reads by it.
    pub tenant: String,
}

/// Version 2 carries the coordinator's address, version 3 the tenant.
const TICKET_MAGIC: [u8; 4] = *b"S6T3";
/// Bytes of a ticket without its replicas and with an empty tenant id.
pub(crate) const TICKET_FIXED: usize = 4 + 1 + 8 + 8 + 16 + 1 + 2 + TAG_LEN;

/// How long a Put ticket lasts: a minute, and a second more per 16 MiB
/// (the storage node checks it when the Put starts; the Post's own data
/// deadline scales the same way).
pub fn put_ticket_ms(size: u64) -> u64 {
    60_000u64.saturating_add(size / (16 << 20) * 1000)
}

/// How long a Get ticket lasts: a minute, and a second more per MiB, so a
/// client that reads a large replica whole before finding it damaged can
/// still read the next one with the same ticket.
pub fn get_ticket_ms(size: u64) -> u64 {
    60_000u64.saturating_add(size / (1 << 20) * 1000)
}

/// Why a ticket was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TicketError {
    /// The ticket is too short, too long or badly formed.
    #[error("the ticket is malformed ({0})")]
    Malformed(String),
    /// The tag does not match the cluster key (forged or damaged).
    #[error("the ticket's tag does not match this cluster's key (forged or damaged)")]
    BadTag,
    /// The ticket's expiry has passed.
    #[error("the ticket expired {0} ms ago; ask the metadata node again")]
    Expired(u64),
}

impl Ticket {
    /// Encodes the ticket with its tag under `key`.
    pub fn seal(&self, key: &ClusterKey) -> Vec<u8> {
        let mut w = wire::Writer::default();
        w.buf.extend_from_slice(&TICKET_MAGIC);
        w.u8(self.op as u8);
        w.u64(self.expires);
        w.u64(self.size);
        w.addr(self.coordinator);
        w.addrs(&self.replicas[..self.replicas.len().min(wire::MAX_DATA_REPLICAS)]);
        w.str(&self.tenant);
        let tag = key.tag(&w.buf);
        w.buf.extend_from_slice(&tag);
        w.buf
    }

    /// Checks a ticket's tag with `key` (in constant time, before reading
    /// anything else) and its expiry at `now_ms`, and decodes it.
    pub fn open(bytes: &[u8], key: &ClusterKey, now_ms: u64) -> Result<Ticket, TicketError> {
        let most = TICKET_FIXED + 16 * wire::MAX_DATA_REPLICAS + crate::tenant::MAX_TENANT_ID;
        if bytes.len() < TICKET_FIXED + 16 || bytes.len() > most {
            return Err(TicketError::Malformed(format!(
                "{} bytes; a ticket has {} to {most}",
                bytes.len(),
                TICKET_FIXED + 16
            )));
        }
        let (signed, tag) = bytes.split_at(bytes.len() - TAG_LEN);
        if !key.verify(signed, tag) {
            return Err(TicketError::BadTag);
        }
        let bad = |e: WireError| TicketError::Malformed(e.to_string());
        let mut r = wire::Reader::new(signed);
        if r.take(4).map_err(bad)? != TICKET_MAGIC {
            return Err(TicketError::Malformed("not a ticket".into()));
        }
        let op = match r.u8().map_err(bad)? {
            1 => TicketOp::Put,
            2 => TicketOp::Get,
            3 => TicketOp::PutFragment,
            k => return Err(TicketError::Malformed(format!("operation {k}"))),
        };
        let expires = r.u64().map_err(bad)?;
        let size = r.u64().map_err(bad)?;
        let coordinator = r.addr().map_err(bad)?;
        let replicas = r.addrs(wire::MAX_DATA_REPLICAS, "replicas").map_err(bad)?;
        let tenant = r
            .str(crate::tenant::MAX_TENANT_ID, "tenant id")
            .map_err(bad)?;
        r.finish().map_err(bad)?;
        if replicas.is_empty() {
            return Err(TicketError::Malformed("no replica".into()));
        }
        if now_ms > expires {
            return Err(TicketError::Expired(now_ms - expires));
        }
        Ok(Ticket {
            op,
            expires,
            size,
            replicas,
            coordinator,
            tenant,
        })
    }

    /// Whether the ticket covers a request `op` on `addr` followed by
    /// `chain` (a Put's forward chain; empty for a Get) of `size` bytes
    /// (a Put's; ignored for a Get). The error says what does not match.
    pub fn allows(
        &self,
        op: TicketOp,
        addr: Addr,
        chain: &[Addr],
        size: u64,
    ) -> Result<(), String> {
        if self.op != op {
            return Err(format!(
                "the ticket is for a {}, not a {}",
                self.op.name(),
                op.name()
            ));
        }
        match op {
            TicketOp::Get if !self.replicas.contains(&addr) => Err(format!(
                "the ticket does not cover replica {}",
                crate::addr::fmt_addr(addr)
            )),
            TicketOp::Get => Ok(()),
            TicketOp::PutFragment => {
                if !chain.is_empty() || !self.replicas.contains(&addr) {
                    return Err(format!(
                        "the ticket covers the Put of one of the fragments {} alone, \
                         but this one writes {}",
                        fmt_list(&self.replicas),
                        fmt_list(&[&[addr][..], chain].concat())
                    ));
                }
                check_size(self.size, size)
            }
            TicketOp::Put => {
                let written = std::iter::once(&addr).chain(chain);
                if !written.eq(self.replicas.iter()) {
                    return Err(format!(
                        "the ticket covers a Put of replicas {} but this one writes {}",
                        fmt_list(&self.replicas),
                        fmt_list(&[&[addr][..], chain].concat())
                    ));
                }
                check_size(self.size, size)
            }
        }
    }
}

/// A Put must send exactly the bytes its ticket covers.
fn check_size(covered: u64, size: u64) -> Result<(), String> {
    if size != covered {
        return Err(format!(
            "the ticket covers a Put of {covered} bytes but this one sends {size}"
        ));
    }
    Ok(())
}

fn fmt_list(addrs: &[Addr]) -> String {
    let v: Vec<String> = addrs.iter().map(|&a| crate::addr::fmt_addr(a)).collect();
    v.join(",")
}

/// Puts a ticket in a metadata node's answer that needs one, issued with
/// `key` at `now_ms`: a `PostPlan` gets a Put ticket for its replicas,
/// a `Found` a Get ticket for the record's replicas, except for an empty
/// object, which a client reads from the record alone (so a zero-byte Get
/// pays for no HMAC). Other answers are left as they are. `coordinator`
/// is the metadata address the request was sent to (a Put ticket names
/// it: [`Ticket::coordinator`]); `tenant` is who asked (empty for a node).
pub fn issue_ticket(
    body: &mut Body,
    coordinator: Addr,
    tenant: &str,
    key: &ClusterKey,
    now_ms: u64,
) {
    match body {
        Body::PostPlan {
            size,
            replicas,
            ticket,
            data_fragments,
            ..
        } if ticket.is_empty() && !replicas.is_empty() => {
            // An erasure-coded Post writes each fragment on its own.
            let (op, size) = match *data_fragments {
                0 => (TicketOp::Put, *size),
                data => {
                    let parity = (replicas.len() as u8).saturating_sub(data);
                    let layout = crate::class::StripeLayout::new(*size, data, parity);
                    (TicketOp::PutFragment, layout.fragment_len())
                }
            };
            *ticket = Ticket {
                op,
                expires: now_ms.saturating_add(put_ticket_ms(size)),
                size,
                replicas: replicas.clone(),
                coordinator,
                tenant: tenant.to_string(),
            }
            .seal(key);
        }
        Body::Found { record, ticket }
            if ticket.is_empty()
                && !record.replicas.is_empty()
                && !(record.size == 0 && record.crc == crc32c::crc32c(&[])) =>
        {
            *ticket = Ticket {
                op: TicketOp::Get,
                expires: now_ms.saturating_add(get_ticket_ms(record.size)),
                size: record.size,
                replicas: record.replicas.clone(),
                coordinator: 0,
                tenant: tenant.to_string(),
            }
            .seal(key);
        }
        _ => {}
    }
}

/// How long a link proof lasts: two minutes, enough for a rename's first
/// two steps (each a call retried for up to 20 s while the table moves)
/// and the Link's resends, which must carry the same proof.
pub const LINK_PROOF_MS: u64 = 120_000;

const LINK_PROOF_MAGIC: [u8; 4] = *b"S6L1";
/// Bytes of a link proof without its replicas.
pub(crate) const LINK_PROOF_FIXED: usize = 4 + 8 + 8 + 4 + 1 + TAG_LEN;

/// A tenant's proof, for the `Link` of a rename, that it may bind a
/// record's replicas under a new name: a metadata node issues it, with
/// the cluster key, in its `LinkProof` answer to the tenant's
/// `GetLinkProof` of the old name, which passed that tenant's scope
/// check ([`issue_link_proof`]). So the tenant could read those replicas
/// under a name of its own when it was issued, and a `Link` with it gives
/// the tenant nothing it did not have.
///
/// Encoding: `S6L1`, expiry (u64, ms since the Unix epoch, the issuer's
/// clock), size (u64), CRC-32C (u32), replica count (u8, 1 to 16) and
/// addresses, then an HMAC-SHA256 tag truncated to [`TAG_LEN`] bytes. The
/// tag covers the magic, the tenant id (its length, a u8, then its
/// bytes) and everything after the magic: the tenant id is not sent, the
/// checker takes it from the `Link`'s seal, so a proof issued to one
/// tenant does not match in another's `Link`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkProof {
    /// When it stops being valid (ms since the Unix epoch).
    pub expires: u64,
    /// The record's size.
    pub size: u64,
    /// The record's CRC-32C.
    pub crc: u32,
    /// The record's replicas.
    pub replicas: Vec<Addr>,
}

/// Why a link proof was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LinkProofError {
    /// The `Link` binds replicas but carries no proof.
    #[error("it carries no link proof for its replicas")]
    Missing,
    /// Too short, too long or badly formed.
    #[error("its link proof is malformed ({0})")]
    Malformed(String),
    /// The tag does not match: forged, damaged, or issued to another tenant.
    #[error(
        "its link proof does not match this cluster's key for tenant {0:?} (forged, damaged, \
         or issued to another tenant)"
    )]
    BadTag(String),
    /// The proof's expiry has passed.
    #[error("its link proof expired {0} ms ago")]
    Expired(u64),
    /// The proof is for another record.
    #[error("its link proof covers {proven}, but the Link binds {bound}")]
    Mismatch {
        /// What the proof covers.
        proven: String,
        /// What the Link binds.
        bound: String,
    },
}

impl LinkProof {
    /// The proof for `record`'s replicas, valid until `expires`.
    pub fn of(record: &Record, expires: u64) -> LinkProof {
        LinkProof {
            expires,
            size: record.size,
            crc: record.crc,
            replicas: record.replicas.clone(),
        }
    }

    /// What the tag covers: the magic, the tenant id and `sent` without
    /// its magic.
    fn signed(tenant: &str, sent: &[u8]) -> Vec<u8> {
        let id = &tenant.as_bytes()[..tenant.len().min(u8::MAX as usize)];
        let mut signed = Vec::with_capacity(sent.len() + 1 + id.len());
        signed.extend_from_slice(&LINK_PROOF_MAGIC);
        signed.push(id.len() as u8);
        signed.extend_from_slice(id);
        signed.extend_from_slice(sent.get(LINK_PROOF_MAGIC.len()..).unwrap_or(&[]));
        signed
    }

    /// Encodes the proof for `tenant` with its tag under `key`.
    pub fn seal(&self, key: &ClusterKey, tenant: &str) -> Vec<u8> {
        let mut w = wire::Writer::default();
        w.buf.extend_from_slice(&LINK_PROOF_MAGIC);
        w.u64(self.expires);
        w.u64(self.size);
        w.u32(self.crc);
        w.addrs(&self.replicas[..self.replicas.len().min(wire::MAX_DATA_REPLICAS)]);
        let tag = key.tag(&LinkProof::signed(tenant, &w.buf));
        w.buf.extend_from_slice(&tag);
        w.buf
    }

    /// Checks a proof's tag for `tenant` with `key` (in constant time,
    /// before reading anything else) and its expiry at `now_ms`, and
    /// decodes it.
    pub fn open(
        bytes: &[u8],
        key: &ClusterKey,
        tenant: &str,
        now_ms: u64,
    ) -> Result<LinkProof, LinkProofError> {
        let most = LINK_PROOF_FIXED + 16 * wire::MAX_DATA_REPLICAS;
        if bytes.is_empty() {
            return Err(LinkProofError::Missing);
        }
        if bytes.len() < LINK_PROOF_FIXED + 16 || bytes.len() > most {
            return Err(LinkProofError::Malformed(format!(
                "{} bytes; a link proof has {} to {most}",
                bytes.len(),
                LINK_PROOF_FIXED + 16
            )));
        }
        let (sent, tag) = bytes.split_at(bytes.len() - TAG_LEN);
        if !key.verify(&LinkProof::signed(tenant, sent), tag) {
            return Err(LinkProofError::BadTag(tenant.to_string()));
        }
        let bad = |e: WireError| LinkProofError::Malformed(e.to_string());
        let mut r = wire::Reader::new(sent);
        if r.take(4).map_err(bad)? != LINK_PROOF_MAGIC {
            return Err(LinkProofError::Malformed("not a link proof".into()));
        }
        let expires = r.u64().map_err(bad)?;
        let size = r.u64().map_err(bad)?;
        let crc = r.u32().map_err(bad)?;
        let replicas = r.addrs(wire::MAX_DATA_REPLICAS, "replicas").map_err(bad)?;
        r.finish().map_err(bad)?;
        if now_ms > expires {
            return Err(LinkProofError::Expired(now_ms - expires));
        }
        Ok(LinkProof {
            expires,
            size,
            crc,
            replicas,
        })
    }

    /// Whether the proof covers `record`: the same size and CRC-32C, and
    /// the same set of replicas (their order does not matter).
    pub fn covers(&self, record: &Record) -> Result<(), LinkProofError> {
        let sorted = |v: &[Addr]| {
            let mut v = v.to_vec();
            v.sort_unstable();
            v
        };
        let same = self.size == record.size
            && self.crc == record.crc
            && sorted(&self.replicas) == sorted(&record.replicas);
        if same {
            return Ok(());
        }
        let show = |size: u64, crc: u32, replicas: &[Addr]| {
            format!(
                "replicas {} of {size} bytes (CRC-32C {crc:08x})",
                fmt_list(replicas)
            )
        };
        Err(LinkProofError::Mismatch {
            proven: show(self.size, self.crc, &self.replicas),
            bound: show(record.size, record.crc, &record.replicas),
        })
    }
}

/// Checks the proof of a tenant's `Link` of `record` (see [`LinkProof`]):
/// a record with no replicas needs none (it binds no data); otherwise the
/// proof must have been issued to `tenant` with an accepted key of `key`,
/// not have expired at `now_ms`, and cover exactly the record's size,
/// CRC-32C and replicas. The error says what was wrong and what to do.
pub fn check_link_proof(
    record: &Record,
    proof: &[u8],
    key: &ClusterKey,
    tenant: &str,
    now_ms: u64,
) -> Result<(), String> {
    if record.replicas.is_empty() {
        return Ok(());
    }
    LinkProof::open(proof, key, tenant, now_ms)
        .and_then(|p| p.covers(record))
        .map_err(|why| {
            format!(
                "Link of {:?} refused: {why}; a rename binds only the replicas of a name the \
                 tenant may use, proved by looking that name up (`strata obj mv` does; run \
                 it again)",
                record.name
            )
        })
}

/// Puts a link proof for `tenant`, issued with `key` at `now_ms`, in a
/// `LinkProof` answer that has none yet and whose record has replicas.
/// Other answers are left as they are.
pub fn issue_link_proof(body: &mut Body, key: &ClusterKey, tenant: &str, now_ms: u64) {
    if let Body::LinkProof { record, proof } = body {
        if proof.is_empty() && !record.replicas.is_empty() {
            *proof = LinkProof::of(record, now_ms.saturating_add(LINK_PROOF_MS)).seal(key, tenant);
        }
    }
}

//! The frame of a metadata datagram: its header (magic, version, kind
//! with its seal flags, request id, target) and the seals that may end
//! it, read without decoding the body.

use crate::addr::Addr;
use crate::codec::{Reader, WireError, MAX_DATAGRAM};

/// The first bytes of every metadata datagram.
pub(super) const MAGIC: [u8; 2] = *b"S6";
/// Version 9: small objects inline. A record may hold its object's bytes
/// ([`Record::inline`](super::Record::inline)), and `PostEmpty` (kind 42)
/// became `PostInline`, which carries the bytes, their CRC-32C and an
/// optional storage class.
/// (Version 8: erasure coding. Records carry their fragments' coding and
/// checksums ([`Record::fragments`](super::Record::fragments)), a
/// `PostBegin` may name a storage class, a `PostPlan` says how many of
/// its replicas are data fragments and a `PostCommit` carries the
/// fragments' checksums. Version 7: records, `PostCommit`, `PostEmpty` and list entries carry
/// a record's attributes ([`Record::attributes`](super::Record::attributes)),
/// and list entries the object's CRC-32C. Version 6: a request may end in zero padding
/// ([`Msg::encode_padded`](super::Msg::encode_padded)), an
/// unauthenticated request gets no answer longer than itself (a
/// [`Body::PadTo`](super::Body::PadTo) instead), and a storage node
/// reports a tenant's Put whose connection closed early
/// ([`Body::PutAbandoned`](super::Body::PutAbandoned)). Version 5: a
/// tenant's seal carries its credential's generation (flag `TENANT`), and the
/// operator's `RevokeTenant` (kind 37) is new. Version 4 added link proofs ([`crate::auth::LinkProof`]) in a
/// tenant's `Link`, `GetLinkProof` and `LinkProof`; version 3 tenants' seals
/// ([`Msg::seal_tenant`](super::Msg::seal_tenant)), version 2 the data-path tickets of `PostPlan`
/// and `Found`.) Other versions are refused as "bad magic or version".
pub(super) const VERSION: u8 = 9;

/// Bytes of a message's header: magic, version, kind, request id, target.
pub const HEADER_LEN: usize = 28;

/// Set in the kind byte of a sealed message: its body is followed by the
/// sender's clock (u64, ms since the Unix epoch) and a tag over all the
/// bytes before the tag ([`crate::auth`]).
pub(super) const SEALED: u8 = 0x80;

/// Bytes a seal adds to a message.
pub const SEAL_LEN: usize = 8 + crate::key::TAG_LEN;

/// Set in the kind byte of a tenant's request sealed with its credential
/// ([`crate::tenant`]): its body is followed by the tenant id (1 to
/// [`crate::tenant::MAX_TENANT_ID`] bytes), the credential's generation
/// (u32), the id's length (u8), the client's clock (u64, ms since the Unix
/// epoch) and a tag under the tenant's secret over all the bytes before
/// the tag. Read from the end, so the generation and the tag are checked
/// before the body is decoded.
pub(super) const TENANT: u8 = 0x40;

/// Bytes a tenant's seal adds to a message, besides the tenant id.
pub const TENANT_SEAL_FIXED: usize = 4 + 1 + 8 + crate::key::TAG_LEN;

/// A message's header, read without decoding its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The message kind (without the seal flag).
    pub kind: u8,
    /// The request id.
    pub req: u64,
    /// The target address.
    pub target: Addr,
    /// Whether the message is sealed with the cluster key.
    pub sealed: bool,
    /// Whether the message is sealed with a tenant's credential.
    pub tenant: bool,
}

/// Reads the header of `buf`.
pub fn peek(buf: &[u8]) -> Result<Header, WireError> {
    if buf.len() > MAX_DATAGRAM {
        return Err(WireError::TooLarge(buf.len()));
    }
    let mut r = Reader::new(buf);
    if r.take(2)? != MAGIC || r.u8()? != VERSION {
        return Err(WireError::BadMagic);
    }
    let kind = r.u8()?;
    if kind & SEALED != 0 && kind & TENANT != 0 {
        return Err(WireError::Invalid(
            "a message is sealed by a node or by a tenant, not both".into(),
        ));
    }
    Ok(Header {
        kind: kind & !(SEALED | TENANT),
        req: r.u64()?,
        target: r.addr()?,
        sealed: kind & SEALED != 0,
        tenant: kind & TENANT != 0,
    })
}

/// The parts of a tenant's sealed request (flag `TENANT`).
#[derive(Debug, PartialEq, Eq)]
pub struct TenantSeal<'a> {
    /// The bytes the tag covers (header, body, tenant id, its length and
    /// the clock).
    pub signed: &'a [u8],
    /// Where the body ends (and the tenant id starts) in the message.
    pub body_end: usize,
    /// The tenant id, as sent (checked by [`crate::tenant::verify`]).
    pub tenant: &'a str,
    /// The credential's generation, as sent (the tag covers it).
    pub generation: u32,
    /// The client's clock (ms since the Unix epoch).
    pub at: u64,
    /// The tag.
    pub tag: &'a [u8],
}

/// The parts of a tenant's sealed request, read from its end; `None` if
/// `buf` is not one or its seal is cut short or not UTF-8.
pub fn tenant_parts(buf: &[u8]) -> Option<TenantSeal<'_>> {
    if !peek(buf).ok()?.tenant {
        return None;
    }
    let (signed, tag) = buf.split_at(buf.len().checked_sub(crate::key::TAG_LEN)?);
    let clock_at = signed.len().checked_sub(8)?;
    let at = u64::from_be_bytes(signed.get(clock_at..)?.try_into().ok()?);
    let len_at = clock_at.checked_sub(1)?;
    let id_len = usize::from(*signed.get(len_at)?);
    let generation_at = len_at.checked_sub(4)?;
    let generation = u32::from_be_bytes(signed.get(generation_at..len_at)?.try_into().ok()?);
    let body_end = generation_at.checked_sub(id_len)?;
    if body_end < HEADER_LEN {
        return None;
    }
    let tenant = std::str::from_utf8(signed.get(body_end..generation_at)?).ok()?;
    Some(TenantSeal {
        signed,
        body_end,
        tenant,
        generation,
        at,
        tag,
    })
}

/// The parts of a sealed message: the bytes its tag covers, the sender's
/// clock, and the tag. `None` if `buf` is not a sealed message.
pub fn seal_parts(buf: &[u8]) -> Option<(&[u8], u64, [u8; crate::key::TAG_LEN])> {
    if !peek(buf).ok()?.sealed || buf.len() < HEADER_LEN + SEAL_LEN {
        return None;
    }
    let (signed, tag) = buf.split_at(buf.len() - crate::key::TAG_LEN);
    let at = signed.get(signed.len() - 8..)?.try_into().ok()?;
    Some((signed, u64::from_be_bytes(at), tag.try_into().ok()?))
}

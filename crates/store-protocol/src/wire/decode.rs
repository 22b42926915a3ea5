//! Decoding one datagram into a [`Msg`], and the answer to one that
//! does not decode.

use super::body::{
    Body, ListEntry, Msg, RepairCounts, Role, SyncEntry, SyncSum, MAX_DAMAGED, MAX_DATA_REPLICAS,
    MAX_GATHER_GROUPS, MAX_INLINE, MAX_OBJECT, MAX_SYNC_ENTRIES, MAX_SYNC_SUMS,
};
use super::frame::{peek, tenant_parts, HEADER_LEN, SEAL_LEN};
use super::kinds::Kind;
use super::records::{
    check_inline_crc, flag, get_addr_list, get_attributes, get_bounded_addrs, get_cursor,
    get_record, get_rows, get_ticket, sync_count,
};
use crate::class::StorageClass;
use crate::codec::{Reader, WireError, MAX_DATAGRAM, MAX_NAME};
use crate::error::Code;

impl Msg {
    /// Decodes one datagram, sealed (by a node or a tenant) or not. The
    /// seal is not checked here (tenants hold no key to check a node's
    /// with): a node checks it first ([`crate::auth::Gate`]).
    pub fn decode(buf: &[u8]) -> Result<Msg, WireError> {
        let head = peek(buf)?;
        let end = if head.sealed {
            buf.len()
                .checked_sub(SEAL_LEN)
                .filter(|&end| end >= HEADER_LEN)
                .ok_or(WireError::Truncated(buf.len()))?
        } else if head.tenant {
            tenant_parts(buf)
                .ok_or(WireError::Truncated(buf.len()))?
                .body_end
        } else {
            buf.len()
        };
        let mut r = Reader::new(&buf[..end]);
        r.take(HEADER_LEN)?;
        let body = decode_body(head.kind, &mut r)?;
        // A table's bytes run to the end: only requests are padded.
        if head.kind != 16 {
            r.skip_padding();
        }
        r.finish()?;
        Ok(Msg {
            req: head.req,
            target: head.target,
            body,
        })
    }
}

fn decode_body(kind: u8, r: &mut Reader) -> Result<Body, WireError> {
    let Some(kind) = Kind::from_number(kind) else {
        return Err(WireError::UnknownKind(kind));
    };
    Ok(match kind {
        Kind::PostBegin => Body::PostBegin {
            name: r.name()?,
            size: r.u64()?,
            class: get_class(r)?,
        },
        Kind::PostPlan => {
            let version = r.u64()?;
            let size = r.u64()?;
            if size > MAX_OBJECT {
                return Err(WireError::Invalid(format!(
                    "object size {size} exceeds the {MAX_OBJECT}-byte limit"
                )));
            }
            Body::PostPlan {
                version,
                size,
                replicas: r.addrs(MAX_DATA_REPLICAS, "replicas")?,
                ticket: get_ticket(r)?,
                data_fragments: r.u8()?,
            }
        }
        Kind::PostInline => get_post_inline(r)?,
        Kind::PostCommit => Body::PostCommit {
            name: r.name()?,
            version: r.u64()?,
            crc: r.u32()?,
            attributes: get_attributes(r)?,
            fragment_crcs: {
                let n = r.u8()? as usize;
                if n > MAX_DATA_REPLICAS {
                    return Err(WireError::Invalid(format!(
                        "{n} fragment checksums; the limit is {MAX_DATA_REPLICAS}"
                    )));
                }
                (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?
            },
        },
        Kind::PostAbort => Body::PostAbort {
            name: r.name()?,
            version: r.u64()?,
        },
        Kind::Link => Body::Link {
            record: get_record(r)?,
            proof: get_ticket(r)?,
        },
        Kind::GetLinkProof => Body::GetLinkProof { name: r.name()? },
        Kind::LinkProof => Body::LinkProof {
            record: get_record(r)?,
            proof: get_ticket(r)?,
        },
        Kind::Get => Body::Get { name: r.name()? },
        Kind::Update => Body::Update {
            record: get_record(r)?,
            if_version: r.u64()?,
        },
        Kind::Found => Body::Found {
            record: get_record(r)?,
            ticket: get_ticket(r)?,
        },
        Kind::Delete => Body::Delete {
            name: r.name()?,
            if_version: r.u64()?,
            keep_data: r.u8()? != 0,
        },
        Kind::List => Body::List {
            prefix: r.str(MAX_NAME, "list prefix")?,
            after: r.str(MAX_NAME, "list cursor")?,
            limit: r.u32()?,
        },
        Kind::ListPage => {
            let n = r.u32()? as usize;
            // Each entry takes at least 24 bytes: bound the count by the
            // datagram before allocating.
            if n > MAX_DATAGRAM / 24 {
                return Err(WireError::Invalid(format!("{n} list entries")));
            }
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                entries.push(ListEntry {
                    name: r.name()?,
                    size: r.u64()?,
                    version: r.u64()?,
                    crc: r.u32()?,
                    attributes: get_attributes(r)?,
                });
            }
            Body::ListPage {
                entries,
                more: r.u8()? != 0,
            }
        }
        Kind::Replicate => Body::Replicate {
            record: get_record(r)?,
        },
        Kind::Unreplicate => Body::Unreplicate {
            name: r.name()?,
            version: r.u64()?,
        },
        Kind::Done => Body::Done { version: r.u64()? },
        Kind::PutAbandoned => Body::PutAbandoned { replica: r.addr()? },
        Kind::PadTo => Body::PadTo { size: r.u32()? },
        Kind::DamagedReplicas => Body::DamagedReplicas {
            addrs: get_bounded_addrs(r, MAX_DAMAGED, "damaged replicas in one report")?,
        },
        Kind::GetRepairCounts => Body::GetRepairCounts,
        Kind::RepairCounts => Body::RepairCounts(RepairCounts {
            copies_started: r.u64()?,
            rebuilds_started: r.u64()?,
            committed: r.u64()?,
            failed: r.u64()?,
            in_flight: r.u64()?,
            damaged_waiting: r.u64()?,
        }),
        Kind::BadReplica => Body::BadReplica {
            name: r.name()?,
            replica: r.addr()?,
        },
        Kind::Error => Body::Error {
            code: Code::from_u16(r.u16()?),
            message: r.str(MAX_DATAGRAM, "error message")?,
        },
        Kind::GetTable => Body::GetTable,
        Kind::Table => {
            let rest = r.take(r.buf.len() - r.pos)?;
            Body::Table {
                bytes: rest.to_vec(),
            }
        }
        Kind::Register => Body::Register {
            role: match r.u8()? {
                1 => Role::Mn,
                2 => Role::Sn,
                x => return Err(WireError::Invalid(format!("role {x}"))),
            },
            uuid: r.u64()?,
            endpoint: r.sockaddr()?,
            capacity: r.u64()?,
            free: r.u64()?,
            device: r.u8()?,
            keys: r.opt_prints()?,
        },
        Kind::Registered => Body::Registered { index: r.u16()? },
        Kind::Heartbeat => Body::Heartbeat {
            uuid: r.u64()?,
            free: r.u64()?,
            objects: r.u64()?,
            keys: r.opt_prints()?,
        },
        Kind::Retire => Body::Retire { uuid: r.u64()? },
        Kind::CancelRetire => Body::CancelRetire { uuid: r.u64()? },
        Kind::RevokeTenant => Body::RevokeTenant {
            tenant: r.str(crate::tenant::MAX_TENANT_ID, "tenant id")?,
            below: r.u32()?,
        },
        Kind::Referenced => Body::Referenced {
            addrs: get_addr_list(r)?,
        },
        Kind::ReferencedBy => Body::ReferencedBy {
            addrs: get_addr_list(r)?,
        },
        Kind::MgPull => Body::MgPull {
            group: r.u32()?,
            epoch: r.u64()?,
            tombs: flag(r, "tombstone flag")?,
            after: r.str(MAX_NAME, "pull cursor")?,
        },
        Kind::MgRows => Body::MgRows {
            rows: get_rows(r)?,
            more: flag(r, "more flag")?,
        },
        Kind::MgGather => Body::MgGather {
            groups: {
                let n = r.u16()? as usize;
                if n > MAX_GATHER_GROUPS {
                    return Err(WireError::Invalid(format!(
                        "{n} groups in one gather; the limit is {MAX_GATHER_GROUPS}"
                    )));
                }
                (0..n).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?
            },
            slot: r.u16()?,
            from: get_cursor(r)?,
        },
        Kind::MgGathered => Body::MgGathered {
            rows: get_rows(r)?,
            next: if flag(r, "next-page flag")? {
                Some(get_cursor(r)?)
            } else {
                None
            },
        },
        Kind::MoveReport => Body::MoveReport {
            group: r.u32()?,
            to: r.u16()?,
            ready: flag(r, "ready flag")?,
            epoch: r.u64()?,
        },
        Kind::DrainReport => {
            let (slot, epoch, drain, index) = (r.u16()?, r.u64()?, r.u64()?, r.u16()?);
            let (left, copies, unplaceable) = (r.u64()?, r.u64()?, r.u64()?);
            if unplaceable > left {
                return Err(WireError::Invalid(format!(
                    "drain report: {unplaceable} unplaceable of {left} records left"
                )));
            }
            Body::DrainReport {
                slot,
                epoch,
                drain,
                index,
                left,
                copies,
                unplaceable,
            }
        }
        Kind::Refresh => Body::Refresh {
            name: r.name()?,
            version: r.u64()?,
            copy: r.addr()?,
        },
        Kind::SyncCheck => {
            let n = sync_count(r, MAX_SYNC_ENTRIES, "entries")?;
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                entries.push(SyncEntry {
                    name: r.name()?,
                    copy: r.addr()?,
                    version: r.u64()?,
                    deleted: flag(r, "sync deleted flag")?,
                });
            }
            Body::SyncCheck { entries }
        }
        Kind::SyncDigest => {
            let n = sync_count(r, MAX_SYNC_SUMS, "sums")?;
            let mut sums = Vec::with_capacity(n);
            for _ in 0..n {
                sums.push(SyncSum {
                    group: r.u32()?,
                    index: r.u8()?,
                    sum: r.u64()?,
                });
            }
            Body::SyncDigest { sums }
        }
        Kind::SyncDiff => {
            let n = sync_count(r, MAX_SYNC_SUMS, "pairs")?;
            let mut pairs = Vec::with_capacity(n);
            for _ in 0..n {
                pairs.push((r.u32()?, r.u8()?));
            }
            Body::SyncDiff { pairs }
        }
    })
}

/// The error reply to an undecodable datagram (with its request id when
/// the header got that far).
pub fn malformed(bytes: &[u8], e: &WireError) -> Msg {
    let req = bytes
        .get(4..12)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0);
    Msg::new(
        req,
        0,
        Body::Error {
            code: Code::BadRequest,
            message: format!("malformed message: {e}"),
        },
    )
}

/// A `PostInline`: its bytes at most [`MAX_INLINE`] (refused before
/// anything is allocated) and matching the CRC-32C sent with them.
fn get_post_inline(r: &mut Reader) -> Result<Body, WireError> {
    let name = r.name()?;
    let class = get_class(r)?;
    let crc = r.u32()?;
    let data = r.bytes16()?;
    if data.len() > MAX_INLINE {
        return Err(WireError::Invalid(format!(
            "a Post of {} bytes inline for {name:?}; the limit is {MAX_INLINE}: \
             post a larger object with PostBegin",
            data.len()
        )));
    }
    check_inline_crc(&name, data, crc)?;
    Ok(Body::PostInline {
        data: data.to_vec(),
        attributes: get_attributes(r)?,
        name,
        class,
        crc,
    })
}

/// What `put_class` wrote, checked against the class bounds.
fn get_class(r: &mut Reader) -> Result<Option<StorageClass>, WireError> {
    let class = match r.u8()? {
        0 => return Ok(None),
        1 => StorageClass::Replicated { copies: r.u8()? },
        2 => StorageClass::ErasureCoded {
            data: r.u8()?,
            parity: r.u8()?,
        },
        k => return Err(WireError::Invalid(format!("storage class kind {k}"))),
    };
    class.validate().map_err(WireError::Invalid)?;
    Ok(Some(class))
}

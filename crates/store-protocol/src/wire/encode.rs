//! Encoding a [`Msg`] into one datagram: unsealed, sealed with the
//! cluster key, or sealed with a tenant's credential, each optionally
//! padded.

use super::body::{
    Body, Msg, MAX_DAMAGED, MAX_DATA_REPLICAS, MAX_GATHER_GROUPS, MAX_REFERENCED, MAX_SYNC_ENTRIES,
    MAX_SYNC_SUMS,
};
use super::frame::{MAGIC, SEALED, SEAL_LEN, TENANT, TENANT_SEAL_FIXED, VERSION};
use super::records::{put_cursor, put_record, put_rows};
use crate::class::StorageClass;
use crate::codec::{WireError, Writer, MAX_DATAGRAM};

impl Msg {
    /// Encodes the message into one datagram, unsealed.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        self.encode_padded(0)
    }

    /// Encodes the message into one datagram, unsealed, followed by zero
    /// bytes up to `pad_to` bytes in all (none if it is that long
    /// already): a request padded so that a node may answer it although
    /// it is not authenticated ([`Body::PadTo`]). Decoders skip the zeros.
    pub fn encode_padded(&self, pad_to: usize) -> Result<Vec<u8>, WireError> {
        let mut w = self.encode_with(self.kind());
        pad(&mut w, pad_to, 0);
        if w.buf.len() > MAX_DATAGRAM {
            return Err(WireError::TooLarge(w.buf.len()));
        }
        Ok(w.buf)
    }

    /// Encodes the message into one datagram sealed with `key` at the
    /// sender's clock `now_ms` (ms since the Unix epoch).
    pub fn seal(&self, key: &crate::key::ClusterKey, now_ms: u64) -> Result<Vec<u8>, WireError> {
        self.seal_padded(key, now_ms, 0)
    }

    /// [`Msg::seal`], padded with zeros (under the seal) to at least
    /// `pad_to` bytes in all.
    pub fn seal_padded(
        &self,
        key: &crate::key::ClusterKey,
        now_ms: u64,
        pad_to: usize,
    ) -> Result<Vec<u8>, WireError> {
        let mut w = self.encode_with(self.kind() | SEALED);
        pad(&mut w, pad_to, SEAL_LEN);
        w.u64(now_ms);
        let tag = key.tag(&w.buf);
        w.buf.extend_from_slice(&tag);
        if w.buf.len() > MAX_DATAGRAM {
            return Err(WireError::TooLarge(w.buf.len()));
        }
        Ok(w.buf)
    }

    /// Encodes a tenant's request into one datagram sealed with its
    /// `credential` at the client's clock `now_ms` (flag `TENANT`).
    pub fn seal_tenant(
        &self,
        credential: &crate::tenant::TenantCredential,
        now_ms: u64,
    ) -> Result<Vec<u8>, WireError> {
        self.seal_tenant_padded(credential, now_ms, 0)
    }

    /// [`Msg::seal_tenant`], padded with zeros (under the seal) to at
    /// least `pad_to` bytes in all.
    pub fn seal_tenant_padded(
        &self,
        credential: &crate::tenant::TenantCredential,
        now_ms: u64,
        pad_to: usize,
    ) -> Result<Vec<u8>, WireError> {
        let id = credential.tenant();
        let id_len = u8::try_from(id.len())
            .map_err(|_| WireError::Invalid(format!("tenant id of {} bytes", id.len())))?;
        let mut w = self.encode_with(self.kind() | TENANT);
        pad(&mut w, pad_to, id.len() + TENANT_SEAL_FIXED);
        w.buf.extend_from_slice(id.as_bytes());
        w.u32(credential.generation());
        w.u8(id_len);
        w.u64(now_ms);
        let tag = credential.tag(&w.buf);
        w.buf.extend_from_slice(&tag);
        if w.buf.len() > MAX_DATAGRAM {
            return Err(WireError::TooLarge(w.buf.len()));
        }
        Ok(w.buf)
    }

    fn encode_with(&self, kind: u8) -> Writer {
        let mut w = Writer::default();
        w.buf.extend_from_slice(&MAGIC);
        w.u8(VERSION);
        w.u8(kind);
        w.u64(self.req);
        w.addr(self.target);
        self.encode_body(&mut w);
        w
    }

    /// The kind byte, without the seal flags.
    pub(super) fn kind(&self) -> u8 {
        self.body.kind() as u8
    }

    fn encode_body(&self, w: &mut Writer) {
        match &self.body {
            Body::PostBegin { name, size, class } => {
                w.str(name);
                w.u64(*size);
                put_class(w, *class);
            }
            Body::PostPlan {
                version,
                size,
                replicas,
                ticket,
                data_fragments,
            } => {
                w.u64(*version);
                w.u64(*size);
                w.addrs(replicas);
                w.bytes16(ticket);
                w.u8(*data_fragments);
            }
            Body::PostInline {
                name,
                class,
                crc,
                data,
                attributes,
            } => {
                w.str(name);
                put_class(w, *class);
                w.u32(*crc);
                w.bytes16(data);
                w.bytes16(attributes);
            }
            Body::PostCommit {
                name,
                version,
                crc,
                attributes,
                fragment_crcs,
            } => {
                w.str(name);
                w.u64(*version);
                w.u32(*crc);
                w.bytes16(attributes);
                let n = fragment_crcs.len().min(MAX_DATA_REPLICAS);
                w.u8(n as u8);
                for &crc in &fragment_crcs[..n] {
                    w.u32(crc);
                }
            }
            Body::PostAbort { name, version } | Body::Unreplicate { name, version } => {
                w.str(name);
                w.u64(*version);
            }
            Body::Replicate { record } => put_record(w, record),
            Body::Link { record, proof } | Body::LinkProof { record, proof } => {
                put_record(w, record);
                w.bytes16(proof);
            }
            Body::Found { record, ticket } => {
                put_record(w, record);
                w.bytes16(ticket);
            }
            Body::Update { record, if_version } => {
                put_record(w, record);
                w.u64(*if_version);
            }
            Body::Get { name } | Body::GetLinkProof { name } => w.str(name),
            Body::Refresh {
                name,
                version,
                copy,
            } => {
                w.str(name);
                w.u64(*version);
                w.addr(*copy);
            }
            Body::SyncCheck { entries } => {
                let n = entries.len().min(MAX_SYNC_ENTRIES);
                w.u16(n as u16);
                for e in &entries[..n] {
                    w.str(&e.name);
                    w.addr(e.copy);
                    w.u64(e.version);
                    w.u8(e.deleted as u8);
                }
            }
            Body::SyncDigest { sums } => {
                let n = sums.len().min(MAX_SYNC_SUMS);
                w.u16(n as u16);
                for s in &sums[..n] {
                    w.u32(s.group);
                    w.u8(s.index);
                    w.u64(s.sum);
                }
            }
            Body::SyncDiff { pairs } => {
                let n = pairs.len().min(MAX_SYNC_SUMS);
                w.u16(n as u16);
                for &(g, i) in &pairs[..n] {
                    w.u32(g);
                    w.u8(i);
                }
            }
            Body::Delete {
                name,
                if_version,
                keep_data,
            } => {
                w.str(name);
                w.u64(*if_version);
                w.u8(*keep_data as u8);
            }
            Body::List {
                prefix,
                after,
                limit,
            } => {
                w.str(prefix);
                w.str(after);
                w.u32(*limit);
            }
            Body::ListPage { entries, more } => {
                w.u32(entries.len() as u32);
                for e in entries {
                    w.str(&e.name);
                    w.u64(e.size);
                    w.u64(e.version);
                    w.u32(e.crc);
                    w.bytes16(&e.attributes);
                }
                w.u8(*more as u8);
            }
            Body::Done { version } => w.u64(*version),
            Body::PutAbandoned { replica } => w.addr(*replica),
            Body::PadTo { size } => w.u32(*size),
            Body::DamagedReplicas { addrs } => {
                // The sender batches at most MAX_DAMAGED; never more on
                // the wire, where the decoder would refuse them.
                let n = addrs.len().min(MAX_DAMAGED);
                w.u16(n as u16);
                for &a in &addrs[..n] {
                    w.addr(a);
                }
            }
            Body::GetRepairCounts => {}
            Body::RepairCounts(counts) => {
                for count in [
                    counts.copies_started,
                    counts.rebuilds_started,
                    counts.committed,
                    counts.failed,
                    counts.in_flight,
                    counts.damaged_waiting,
                ] {
                    w.u64(count);
                }
            }
            Body::BadReplica { name, replica } => {
                w.str(name);
                w.addr(*replica);
            }
            Body::Error { code, message } => {
                w.u16(*code as u16);
                w.str(message);
            }
            Body::GetTable => {}
            Body::Table { bytes } => w.buf.extend_from_slice(bytes),
            Body::Register {
                role,
                uuid,
                endpoint,
                capacity,
                free,
                device,
                keys,
            } => {
                w.u8(*role as u8);
                w.u64(*uuid);
                w.sockaddr(*endpoint);
                w.u64(*capacity);
                w.u64(*free);
                w.u8(*device);
                if let Some(k) = keys {
                    w.prints(k);
                }
            }
            Body::Registered { index } => w.u16(*index),
            Body::Heartbeat {
                uuid,
                free,
                objects,
                keys,
            } => {
                w.u64(*uuid);
                w.u64(*free);
                w.u64(*objects);
                if let Some(k) = keys {
                    w.prints(k);
                }
            }
            Body::Retire { uuid } | Body::CancelRetire { uuid } => w.u64(*uuid),
            Body::RevokeTenant { tenant, below } => {
                w.str(tenant);
                w.u32(*below);
            }
            Body::Referenced { addrs } | Body::ReferencedBy { addrs } => {
                let n = addrs.len().min(MAX_REFERENCED);
                w.u16(n as u16);
                for &a in &addrs[..n] {
                    w.addr(a);
                }
            }
            Body::MgPull {
                group,
                epoch,
                tombs,
                after,
            } => {
                w.u32(*group);
                w.u64(*epoch);
                w.u8(*tombs as u8);
                w.str(after);
            }
            Body::MgRows { rows, more } => {
                put_rows(w, rows);
                w.u8(*more as u8);
            }
            Body::MgGather { groups, slot, from } => {
                let n = groups.len().min(MAX_GATHER_GROUPS);
                w.u16(n as u16);
                for &g in &groups[..n] {
                    w.u32(g);
                }
                w.u16(*slot);
                put_cursor(w, from);
            }
            Body::MgGathered { rows, next } => {
                put_rows(w, rows);
                match next {
                    None => w.u8(0),
                    Some(c) => {
                        w.u8(1);
                        put_cursor(w, c);
                    }
                }
            }
            Body::MoveReport {
                group,
                to,
                ready,
                epoch,
            } => {
                w.u32(*group);
                w.u16(*to);
                w.u8(*ready as u8);
                w.u64(*epoch);
            }
            Body::DrainReport {
                slot,
                epoch,
                drain,
                index,
                left,
                copies,
                unplaceable,
            } => {
                w.u16(*slot);
                w.u64(*epoch);
                w.u64(*drain);
                w.u16(*index);
                w.u64(*left);
                w.u64(*copies);
                w.u64(*unplaceable);
            }
        }
    }
}

/// Appends zeros to `w` so that, with `suffix` more bytes (a seal), the
/// datagram is at least `pad_to` bytes long.
fn pad(w: &mut Writer, pad_to: usize, suffix: usize) {
    let len = w.buf.len() + suffix;
    if pad_to > len {
        w.buf.resize(w.buf.len() + (pad_to - len), 0);
    }
}

/// A `PostBegin`'s storage class: 0 for the bucket's, 1 and a count for
/// replicas, 2, k and m for erasure coding.
fn put_class(w: &mut Writer, class: Option<StorageClass>) {
    match class {
        None => w.u8(0),
        Some(StorageClass::Replicated { copies }) => {
            w.u8(1);
            w.u8(copies);
        }
        Some(StorageClass::ErasureCoded { data, parity }) => {
            w.u8(2);
            w.u8(data);
            w.u8(parity);
        }
    }
}

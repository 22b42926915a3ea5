//! Replicas reported damaged: by a storage node's scrub
//! ([`Body::DamagedReplicas`], to every metadata node) or by a tenant
//! whose Get found a replica failing its CRC ([`Body::BadReplica`], to the
//! name's coordinator).
//!
//! A reported address is kept in a bounded set. The repair scan
//! ([`MnCore::repair_step`]) runs while the set is not empty, and a record
//! this node coordinates that names a reported replica is repaired like
//! one with a replica on a dead node: a new copy from a replica that
//! verifies (the copy checks the record's CRC-32C, see
//! `strata_store_client::client::copy_replica`), then the record drops the
//! reported address under a new version, then the reported replica is
//! freed. The reported replica is never a copy source before the others,
//! and is dropped only once a verified copy is committed, so a wrong or
//! hostile report costs a copy and loses nothing.
//!
//! An address no record names during a whole repair pass is forgotten, so
//! a report for an address no record names is ignored; a scrub reports a
//! replica again on each of its passes until it is freed.

use super::*;

/// Most reported addresses a metadata node keeps: reports beyond it are
/// dropped (a scrub reports again next pass), so a flood of reports
/// cannot grow memory.
pub(super) const MAX_DAMAGED_KEPT: usize = 4096;

impl<P: Clone + Eq + Hash> MnCore<P> {
    /// Takes a storage node's report of damaged replicas: keeps each
    /// address (while there is room) for the repair scan. Returns how many
    /// are kept now.
    pub(super) fn damaged_reported(&mut self, addrs: &[Addr]) -> u64 {
        let kept = addrs.iter().filter(|&&a| self.note_damaged(a)).count();
        if kept < addrs.len() {
            tracing::warn!(
                "{} of {} damaged-replica reports dropped: {MAX_DAMAGED_KEPT} are waiting \
                 for repair already",
                addrs.len() - kept,
                addrs.len()
            );
        }
        kept as u64
    }

    /// Serves a tenant's report that `replica` of `name` (coordinated in
    /// group `mg`, checked) failed its CRC: ignored unless the record
    /// names it; else kept for the scan and, if a copy slot is free, the
    /// record's repair starts now. Answers `Done` with the record's
    /// version (0 when ignored).
    pub(super) fn bad_replica(
        &mut self,
        now: u64,
        mg: u32,
        name: &str,
        replica: Addr,
        out: &mut Vec<Out<P>>,
    ) -> Result<Body, Error> {
        let ignored = Ok(Body::Done { version: 0 });
        let Some(record) = self.db.get(mg, name)? else {
            return ignored;
        };
        if !record.replicas.contains(&replica) || !self.note_damaged(replica) {
            return ignored;
        }
        let version = record.version;
        tracing::info!(
            "a client reported replica {} of {name:?} damaged: repairing it from a replica that verifies",
            strata_store_protocol::addr::fmt_addr(replica)
        );
        if self.repairs.len() < MAX_REPAIRS {
            self.repair_record(now, mg, record, out);
        }
        Ok(Body::Done { version })
    }

    /// Keeps `addr` as reported damaged, seen by the current repair pass;
    /// `false` when the set is full and does not hold it yet.
    fn note_damaged(&mut self, addr: Addr) -> bool {
        if !self.damaged.contains_key(&addr) && self.damaged.len() >= MAX_DAMAGED_KEPT {
            return false;
        }
        self.damaged.insert(addr, self.repair_pass);
        true
    }

    /// The replicas of `record` reported damaged; when `coordinated` (the
    /// coordinator's row, which this node repairs), they are marked seen
    /// by the current pass, so they are kept until the record drops them.
    pub(super) fn damaged_of(&mut self, record: &Record, coordinated: bool) -> Vec<Addr> {
        let named: Vec<Addr> = record
            .replicas
            .iter()
            .copied()
            .filter(|a| self.damaged.contains_key(a))
            .collect();
        if coordinated {
            for a in &named {
                self.damaged.insert(*a, self.repair_pass);
            }
        }
        named
    }

    /// A repair pass over every group starts.
    pub(super) fn repair_pass_started(&mut self) {
        self.repair_pass += 1;
    }

    /// A repair pass ended: forgets the addresses it never saw named by a
    /// record this node coordinates (reported before it started, so it
    /// looked at every record since).
    pub(super) fn repair_pass_ended(&mut self) {
        let pass = self.repair_pass;
        self.damaged.retain(|_, seen| *seen >= pass);
    }

    /// Replica addresses reported damaged and waiting for repair (or to
    /// be forgotten).
    pub fn damaged_count(&self) -> usize {
        self.damaged.len()
    }
}

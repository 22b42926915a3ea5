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
//! replica again on each of its passes until it is freed. A tenant's
//! report is taken only for a replica its record names, and at most
//! [`MAX_TENANT_REPORTS_PER_SECOND`] a second. The damaged replica is not
//! freed while the record is in a rename (another name may share it): the
//! storage node's collection round frees it once no record names it.

use super::*;

/// Most reported addresses a metadata node keeps: reports beyond it are
/// dropped (a scrub reports again next pass), so a flood of reports
/// cannot grow memory.
pub(super) const MAX_DAMAGED_KEPT: usize = 4096;

/// Most tenants' reports a metadata node takes per second; more are
/// answered but ignored. A report costs a copy of the whole object, so a
/// tenant must not make the cluster copy its objects without end (a
/// storage node's scrub finds real damage all the same).
pub(super) const MAX_TENANT_REPORTS_PER_SECOND: u32 = 16;

/// What a metadata node holds of the damaged-replica reports.
#[derive(Debug, Default)]
pub(super) struct DamagedReports {
    /// The reported addresses, each with the repair pass that last saw
    /// it (at most [`MAX_DAMAGED_KEPT`]).
    pub(super) addrs: BTreeMap<Addr, u64>,
    /// Repair passes started so far: an address no record named during a
    /// whole pass is forgotten.
    pub(super) pass: u64,
    /// The second (ms since the core's epoch, divided by 1000) of the
    /// tenants' reports counted in `taken`.
    second: u64,
    /// Tenants' reports taken in that second.
    taken: u32,
}

impl DamagedReports {
    /// Counts a tenant's report at `now` (ms); `false` past
    /// [`MAX_TENANT_REPORTS_PER_SECOND`] in this second.
    fn take_tenant_report(&mut self, now: u64) -> bool {
        let second = now / 1000;
        if second != self.second {
            (self.second, self.taken) = (second, 0);
        }
        if self.taken >= MAX_TENANT_REPORTS_PER_SECOND {
            return false;
        }
        self.taken += 1;
        true
    }
}

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
        if !record.replicas.contains(&replica) {
            return ignored;
        }
        let known = self.damaged.addrs.contains_key(&replica);
        if !known && !self.damaged.take_tenant_report(now) {
            tracing::info!(
                "ignored a client's report of replica {} of {name:?}: more than \
                 {MAX_TENANT_REPORTS_PER_SECOND} reports this second",
                strata_store_protocol::addr::fmt_addr(replica)
            );
            return ignored;
        }
        if !self.note_damaged(replica) {
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
        let d = &mut self.damaged;
        if !d.addrs.contains_key(&addr) && d.addrs.len() >= MAX_DAMAGED_KEPT {
            return false;
        }
        d.addrs.insert(addr, d.pass);
        true
    }

    /// The replicas of `record` (a row this node coordinates, and so
    /// repairs) reported damaged, marked seen by the current pass: they
    /// are kept until the record drops them.
    pub(super) fn damaged_of(&mut self, record: &Record) -> Vec<Addr> {
        let d = &mut self.damaged;
        let named: Vec<Addr> = record
            .replicas
            .iter()
            .copied()
            .filter(|a| d.addrs.contains_key(a))
            .collect();
        for a in &named {
            d.addrs.insert(*a, d.pass);
        }
        named
    }

    /// A repair pass over every group starts.
    pub(super) fn repair_pass_started(&mut self) {
        self.damaged.pass += 1;
    }

    /// A repair pass ended: forgets the addresses it never saw named by a
    /// record this node coordinates (reported before it started, so it
    /// looked at every record since).
    pub(super) fn repair_pass_ended(&mut self) {
        let pass = self.damaged.pass;
        self.damaged.addrs.retain(|_, seen| *seen >= pass);
    }

    /// Replica addresses reported damaged and waiting for repair (or to
    /// be forgotten).
    pub fn damaged_count(&self) -> usize {
        self.damaged.addrs.len()
    }
}

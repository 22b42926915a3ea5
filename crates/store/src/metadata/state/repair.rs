//! Repair: records whose replicas sit on failed or drained storage
//! nodes get new copies ([`MnCore::copy_done`]), and drain passes report
//! what they still reference.

use super::*;

/// A metadata node's repair since it started (for `/metrics` and
/// `strata store status`).
pub type RepairStats = strata_store_protocol::wire::RepairCounts;

impl<P: Clone + Eq + Hash> MnCore<P> {
    /// One step of repair: expires stuck copies and, while some storage
    /// node is dead or being drained, looks at the next batch of records
    /// this node coordinates and starts a copy for each that has fewer
    /// than N_d replicas on live nodes that are not being drained.
    ///
    /// While nodes are drained, each full pass over the groups this node
    /// owns also counts the rows naming each drained node, and ends with
    /// a [`Body::DrainReport`] to the orchestrator per node: sent every
    /// pass, so a lost report is replaced by the next one.
    pub(super) fn repair_step(&mut self, now: u64, out: &mut Vec<Out<P>>) {
        let expired: Vec<String> = self
            .repairs
            .iter()
            .filter(|(_, r)| now >= r.deadline)
            .map(|(n, _)| n.clone())
            .collect();
        for name in expired {
            if let Some(r) = self.repairs.remove(&name) {
                out.extend(r.targets.into_iter().map(Out::Free));
            }
        }
        let any_dead = self.table.sns.iter().any(|s| s.state == State::Dead);
        let draining = !self.table.drains.is_empty();
        if !draining {
            self.drain_pass = None;
        }
        let damaged = !self.damaged.addrs.is_empty();
        if !(any_dead || draining || damaged)
            || now < self.next_repair
            || self.repairs.len() >= MAX_REPAIRS
        {
            return;
        }
        let groups = self.owned_groups();
        let Some(&first_group) = groups.first() else {
            self.drain_pass = None;
            // No record here can name a reported replica.
            self.damaged.addrs.clear();
            return;
        };
        let resumed = self
            .repair_cursor
            .take()
            .filter(|(g, _)| groups.contains(g));
        // A drain count is only worth reporting for a pass over the same
        // groups from its first record on.
        let pass_holds = self.drain_pass.as_ref().is_some_and(|p| p.groups == groups);
        let (mut mg, mut after) = match resumed {
            Some(cursor) if !draining || pass_holds => cursor,
            _ => {
                if draining {
                    self.drain_pass = Some(self.start_drain_pass(groups.clone()));
                }
                self.repair_pass_started();
                (first_group, None)
            }
        };
        let mut examined = 0;
        loop {
            let Ok(records) = self
                .db
                .records_after(mg, after.as_deref(), REPAIR_BATCH - examined)
            else {
                self.next_repair = now + REPAIR_PASS_MS;
                self.drain_pass = None;
                return;
            };
            for record in records {
                if self.repairs.len() >= MAX_REPAIRS {
                    // Resume at this record once copies have finished.
                    self.repair_cursor = Some((mg, after));
                    return;
                }
                examined += 1;
                after = Some(record.name.clone());
                let coordinator_row = record
                    .meta
                    .first()
                    .and_then(|&a| self.table.layout.mg_of(a))
                    == Some(mg);
                let drained: Vec<u16> = match &self.drain_pass {
                    Some(p) => record
                        .replicas
                        .iter()
                        .filter_map(|&a| self.table.layout.sn_of(a))
                        .filter(|i| p.counts.contains_key(i))
                        .collect(),
                    None => Vec::new(),
                };
                // A metadata copy naming a drained or dead node may have
                // missed the coordinator's rewrite for good.
                let names_dead = || {
                    record
                        .replicas
                        .iter()
                        .any(|&a| self.table.sn_for(a).is_some_and(|s| s.state == State::Dead))
                };
                if !coordinator_row && (!drained.is_empty() || names_dead()) {
                    self.ask_refresh(mg, &record, out);
                }
                let unplaceable = self.repair_record(now, mg, record, out);
                if let Some(p) = self.drain_pass.as_mut() {
                    for i in drained {
                        let c = p.counts.entry(i).or_default();
                        if coordinator_row {
                            c.0 += 1;
                            c.2 += u64::from(unplaceable);
                        } else {
                            c.1 += 1;
                        }
                    }
                }
            }
            if examined >= REPAIR_BATCH {
                self.repair_cursor = Some((mg, after));
                return;
            }
            // This group is done: on to the next, or the pass is over.
            match groups.iter().find(|&&g| g > mg) {
                Some(&next) => (mg, after) = (next, None),
                None => {
                    self.next_repair = now + REPAIR_PASS_MS;
                    self.report_drains(out);
                    self.repair_pass_ended();
                    return;
                }
            }
        }
    }

    /// A new drain pass over `groups`. Posts waiting for their data and
    /// repair copies under way that place a replica on a drained node
    /// count as records left: they may commit after the scan has passed
    /// their group. (No new one can start: this node's table shows the
    /// drains, so placement leaves those nodes out.)
    pub(super) fn start_drain_pass(&self, groups: Vec<u32>) -> DrainPass {
        let mut counts: BTreeMap<u16, (u64, u64, u64)> = self
            .table
            .drains
            .iter()
            .map(|d| (d.index, (0, 0, 0)))
            .collect();
        for a in self.pending_replicas() {
            if let Some(c) = self.table.layout.sn_of(a).and_then(|i| counts.get_mut(&i)) {
                c.0 += 1;
            }
        }
        DrainPass {
            epoch: self.table.epoch,
            groups,
            counts,
            drains: self
                .table
                .drains
                .iter()
                .map(|d| (d.index, d.since))
                .collect(),
        }
    }

    /// Ends a drain pass: one report per drained node to the orchestrator.
    /// Replication messages still being resent that carry a record naming
    /// a drained node count as records left (see
    /// [`MnCore::inflight_naming`]).
    pub(super) fn report_drains(&mut self, out: &mut Vec<Out<P>>) {
        let Some(mut pass) = self.drain_pass.take() else {
            return;
        };
        for (index, n) in self.inflight_naming(&pass.counts) {
            if let Some(c) = pass.counts.get_mut(&index) {
                c.0 = c.0.saturating_add(n);
            }
        }
        for (index, (left, copies, unplaceable)) in pass.counts {
            // Cancelled (or cancelled and started again) since the scan
            // began: nothing to report for the drain it counted.
            let Some(&drain) = pass.drains.get(&index) else {
                continue;
            };
            if self.table.drain_of(index).map(|d| d.since) != Some(drain) {
                continue;
            }
            self.next_req = self.next_req.wrapping_add(1) | 1 << 63;
            out.push(Out::ToOn(Msg::new(
                self.next_req,
                0,
                Body::DrainReport {
                    slot: self.slot,
                    epoch: pass.epoch,
                    drain,
                    index,
                    left,
                    copies,
                    unplaceable: unplaceable.min(left),
                },
            )));
        }
    }

    /// Per drained node index (a key of `drained`), the replication
    /// messages this node is still resending whose record names it. The
    /// scan sees rows, not these: one landing at a metadata copy after
    /// that copy's scan passed its group writes a row naming the node
    /// there, while this node's own row may have moved on to a version
    /// that does not (the copy applies an older version it lacks). Only
    /// once none is left can every copy's next scan be trusted to show
    /// every such row.
    pub(super) fn inflight_naming<V>(&self, drained: &BTreeMap<u16, V>) -> BTreeMap<u16, u64> {
        let mut counts = BTreeMap::new();
        for inf in self.inflight.values() {
            let Body::Replicate { record } = &inf.msg.body else {
                continue;
            };
            let mut named: Vec<u16> = record
                .replicas
                .iter()
                .filter_map(|&a| self.table.layout.sn_of(a))
                .filter(|i| drained.contains_key(i))
                .collect();
            // One count per message, however many replicas it names there.
            named.sort_unstable();
            named.dedup();
            for i in named {
                *counts.entry(i).or_insert(0u64) += 1;
            }
        }
        counts
    }

    /// Asks the coordinator of `record` (a metadata copy kept here that
    /// names a drained or dead storage node) for anything newer. A copy
    /// that missed a rewrite for good (its coordinator crashed before the
    /// replication reached it, losing the resends, or they gave up) would
    /// otherwise keep naming the node forever, and hold its drain: the
    /// coordinator's own row is current, so its scan never rewrites the
    /// object again.
    pub(super) fn ask_refresh(&mut self, mg: u32, record: &Record, out: &mut Vec<Out<P>>) {
        let (Some(&coordinator), Some(copy)) = (
            record.meta.first(),
            record
                .meta
                .iter()
                .copied()
                .find(|&a| self.table.layout.mg_of(a) == Some(mg)),
        ) else {
            return;
        };
        self.next_req = self.next_req.wrapping_add(1) | 1 << 63;
        let body = Body::Refresh {
            name: record.name.clone(),
            version: record.version,
            copy,
        };
        out.push(Out::ToMeta(Msg::new(self.next_req, coordinator, body)));
    }

    /// Serves a [`Body::Refresh`] sent to coordinator address `target`:
    /// pushes this node's row of `name` to the copy at `copy` if it is
    /// newer than the copy's `version`, or its tombstone if that is at
    /// least as new. Sent once, not
    /// tracked: the copy asks again on its next scan if it is lost, and
    /// the copy applies it only if it is still newer (version rules).
    pub(super) fn refresh(
        &mut self,
        target: Addr,
        name: &str,
        version: u64,
        copy: Addr,
        out: &mut Vec<Out<P>>,
    ) -> Result<(), Error> {
        let mg = self.coordinator_check(target, name)?;
        if copy == target || !self.table.meta_addrs(name).contains(&copy) {
            return Err(remote(
                Code::BadRequest,
                format!(
                    "refresh of {name:?}: {} is not one of its metadata copies",
                    strata_store_protocol::addr::fmt_addr(copy)
                ),
            ));
        }
        // Rows still arriving (restore) or maybe newer at the next owner
        // (handover): answer nothing, the copy asks again.
        self.not_sealed(mg)?;
        if self.table.restoring(mg) {
            return Err(restoring(mg));
        }
        let tomb = self.db.tombstone(mg, name)?;
        let body = match self.db.get(mg, name)? {
            Some(record) if record.version > tomb => {
                if record.version <= version {
                    return Ok(());
                }
                Body::Replicate { record }
            }
            // A Delete's tombstone carries the version it deleted: one at
            // the copy's version supersedes it too.
            _ if tomb >= version && tomb > 0 => Body::Unreplicate {
                name: name.to_string(),
                version: tomb,
            },
            _ => return Ok(()),
        };
        self.next_req = self.next_req.wrapping_add(1) | 1 << 63;
        out.push(Out::ToMeta(Msg::new(self.next_req, copy, body)));
        Ok(())
    }

    /// Starts a copy for `record` (read from group `mg`) if this node
    /// coordinates it and it lacks replicas on live storage nodes that are
    /// not being drained. A replica on a drained node does not count
    /// toward N_d but may still be read from; the record committed after
    /// the copy no longer names it. Returns whether the record needs a new
    /// replica that no storage node can take (no room, or too few nodes).
    pub(super) fn repair_record(
        &mut self,
        now: u64,
        mg: u32,
        record: Record,
        out: &mut Vec<Out<P>>,
    ) -> bool {
        // Each name is stored under all its metadata addresses; only the
        // coordinator's row starts a repair, so it is done once.
        let coordinator_row = record
            .meta
            .first()
            .and_then(|&a| self.table.layout.mg_of(a))
            == Some(mg);
        // Replicas reported damaged count as lost: read from last, and
        // dropped once a verified copy is committed. Seen here, they are
        // kept while a copy runs or waits.
        let damaged = match coordinator_row {
            true => self.damaged_of(&record),
            false => Vec::new(),
        };
        // An empty or inline object has no replica to copy: its record,
        // on every metadata copy, holds all of it.
        let dataless = record.holds_its_data();
        if !coordinator_row
            || dataless
            || self.is_frozen(mg)
            || self.pending.contains_key(&record.name)
            || self.repairs.contains_key(&record.name)
        {
            return false;
        }
        if record.fragments.is_some() {
            return self.repair_fragments(now, record, damaged, out);
        }
        let t = &self.table;
        // (liveness, being drained) of a replica's node.
        let state_of = |a: Addr| t.sn_for(a).map(|s| (s.state, t.retiring(s.index)));
        let live: Vec<Addr> = record
            .replicas
            .iter()
            .copied()
            .filter(|&a| matches!(state_of(a), Some((State::Up | State::Down, false))))
            .filter(|a| !damaged.contains(a))
            .collect();
        let n_d = t.params_for(&record.name).n_d as usize;
        // Copy sources: the up replicas on nodes that stay first, then
        // those on drained nodes. Every drain copy would otherwise read
        // from the one drained disk; reading from the others spreads the
        // load, and the drained node remains the fallback (the only one
        // left when the others are down).
        let mut sources: Vec<Addr> = live
            .iter()
            .copied()
            .filter(|&a| state_of(a) == Some((State::Up, false)))
            .collect();
        sources.extend(
            record
                .replicas
                .iter()
                .copied()
                .filter(|&a| state_of(a) == Some((State::Up, true)) && !damaged.contains(&a)),
        );
        // A replica reported damaged is the last resort: the copy checks
        // the record's CRC, so it is used only if it verifies (a wrong
        // report), never taken as good.
        sources.extend(
            damaged
                .iter()
                .copied()
                .filter(|&a| matches!(state_of(a), Some((State::Up, _)))),
        );
        let names_drained = record
            .replicas
            .iter()
            .any(|&a| state_of(a).is_some_and(|(_, drained)| drained));
        if live.len() >= n_d && damaged.is_empty() {
            if names_drained {
                // Enough replicas elsewhere already (more than N_d were
                // written): the record just stops naming the drained one,
                // through the same commit as a copy's.
                let repair = Repair {
                    version: record.version,
                    keep: live,
                    targets: Vec::new(),
                    dropped: Vec::new(),
                    deadline: now,
                    slots: Vec::new(),
                };
                let _ = self.commit_repair(now, &record.name, repair, 0, out);
            }
            return false;
        }
        // Nothing left to copy from (data lost, or its holders only
        // briefly down: wait for them).
        if sources.is_empty() {
            return false;
        }
        // A damaged replica is dropped only for a verified copy, even when
        // enough others remain: they may be damaged too, unseen so far.
        let count = n_d.saturating_sub(live.len()).max(1);
        let Some(targets) = self.place_repair(&record, &damaged, count) else {
            return true;
        };
        self.repairs.insert(
            record.name.clone(),
            Repair {
                version: record.version,
                keep: live,
                targets: targets.clone(),
                dropped: damaged,
                deadline: now + DATA_BASE_MS + record.size / (16 << 20) * 1000,
                slots: Vec::new(),
            },
        );
        self.repair_counts.copies_started += 1;
        out.push(Out::Copy {
            name: record.name,
            version: record.version,
            sources,
            targets,
            size: record.size,
            crc: record.crc,
        });
        false
    }

    /// The runtime's report on an [`Out::Copy`]: `Ok(copies)` replicas were
    /// written to the first `targets`, or the copy failed. On success the
    /// record gets its new replica list under a new version, stored at
    /// every metadata address (restoring those too); otherwise, or if the
    /// object changed meanwhile, the new replicas are freed.
    pub fn copy_done(
        &mut self,
        now: u64,
        name: &str,
        version: u64,
        targets: Vec<Addr>,
        result: Result<u8, String>,
    ) -> Vec<Out<P>> {
        let mut out = Vec::new();
        let ours = self
            .repairs
            .get(name)
            .is_some_and(|r| r.version == version && r.targets == targets);
        let repair = if ours {
            self.repairs.remove(name)
        } else {
            None
        };
        let committed = match (repair, result) {
            (Some(repair), Ok(copies)) if copies > 0 => {
                self.commit_repair(now, name, repair, usize::from(copies), &mut out)
            }
            _ => Err(Error::Superseded(format!(
                "the repair copy of {name:?} failed or was superseded"
            ))),
        };
        match committed {
            Ok(()) => self.repair_counts.committed += 1,
            Err(_) => {
                self.repair_counts.failed += 1;
                out.extend(targets.into_iter().map(Out::Free));
            }
        }
        out
    }

    /// What repair has done since the node started, and what is under
    /// way now.
    pub fn repair_stats(&self) -> RepairStats {
        RepairStats {
            in_flight: self.repairs.len() as u64,
            damaged_waiting: self.damaged_count() as u64,
            ..self.repair_counts
        }
    }

    pub(super) fn commit_repair(
        &mut self,
        now: u64,
        name: &str,
        repair: Repair,
        copies: usize,
        out: &mut Vec<Out<P>>,
    ) -> Result<(), Error> {
        if self.pending.contains_key(name) {
            return Err(Error::Superseded(format!("{name:?} is being changed")));
        }
        let meta = self.table.meta_addrs(name);
        let mg0 = self.owned(meta[0])?;
        // A frozen group takes no new version: its handover waits for
        // this copy, and the next pass repairs it at the new owner.
        self.not_frozen(mg0)?;
        let current = self
            .db
            .get(mg0, name)?
            .filter(|r| r.version == repair.version)
            .ok_or_else(|| Error::Superseded(format!("{name:?} changed during repair")))?;
        let written = copies.min(repair.targets.len());
        let mut record = current;
        if repair.slots.is_empty() {
            record.replicas = repair.keep;
            record
                .replicas
                .extend_from_slice(&repair.targets[..written]);
        } else {
            // A rebuild writes every fragment it was given or fails.
            if written < repair.targets.len() {
                return Err(Error::Superseded(format!(
                    "the rebuild of {name:?} wrote {written} of its {} fragments",
                    repair.targets.len()
                )));
            }
            for (&slot, &target) in repair.slots.iter().zip(&repair.targets) {
                if let Some(replica) = record.replicas.get_mut(slot) {
                    *replica = target;
                }
            }
        }
        // A new version: metadata replicas ignore a record whose version
        // they already hold.
        record.version = self.db.latest_version(mg0, name)? + 1;
        record.meta = meta.clone();
        self.next_op += 1;
        let op = self.next_op;
        for (i, &a) in meta.iter().enumerate() {
            if let Some(mg) = self.owns_writable(a) {
                self.db.apply_record(mg, &record)?;
            } else {
                let msg = Msg::new(
                    0,
                    a,
                    Body::Replicate {
                        record: record.clone(),
                    },
                );
                self.send_replication(now, name, op, i, msg, out);
            }
        }
        out.extend(repair.targets[written..].iter().map(|&a| Out::Free(a)));
        // The record no longer names them: free the damaged replicas,
        // unless a rename may share them with another name (its
        // collection round frees them once no record names them).
        if record.rename.is_none() {
            out.extend(repair.dropped.iter().map(|&a| Out::Free(a)));
        }
        Ok(())
    }

    /// New addresses for `count` repair copies of `record`, on storage
    /// nodes holding none of its replicas; failing that (a small cluster),
    /// on the nodes of its `damaged` replicas too (a new file there, never
    /// the damaged one). `None` when no node can take them.
    fn place_repair(
        &mut self,
        record: &Record,
        damaged: &[Addr],
        count: usize,
    ) -> Option<Vec<Addr>> {
        let nodes = |keep: &dyn Fn(&Addr) -> bool| -> Vec<u16> {
            record
                .replicas
                .iter()
                .filter(|a| keep(a))
                .filter_map(|&a| self.table.layout.sn_of(a))
                .collect()
        };
        let every = nodes(&|_| true);
        let others = nodes(&|a| !damaged.contains(a));
        let version = record.version + 1;
        let (name, size) = (&record.name, record.size);
        self.place_n(name, version, size, count, 1, &every)
            .ok()
            .or_else(|| {
                let relaxed = !damaged.is_empty();
                relaxed
                    .then(|| self.place_n(name, version, size, count, 1, &others).ok())
                    .flatten()
            })
    }

    /// [`MnCore::repair_record`] for an erasure-coded record: the
    /// fragments on dead or drained nodes, or reported `damaged`, are
    /// rebuilt from any k others onto nodes that hold none of the
    /// object's fragments ([`Out::Rebuild`]); with fewer than k readable,
    /// it waits (a node only briefly down comes back). Returns whether
    /// no node can take a rebuilt fragment.
    fn repair_fragments(
        &mut self,
        now: u64,
        record: Record,
        damaged: Vec<Addr>,
        out: &mut Vec<Out<P>>,
    ) -> bool {
        let Some((data, parity)) = record.fragments.as_ref().map(|f| (f.data, f.parity())) else {
            return false;
        };
        let t = &self.table;
        let state_of = |a: Addr| t.sn_for(a).map(|s| (s.state, t.retiring(s.index)));
        let lost: Vec<usize> = record
            .replicas
            .iter()
            .enumerate()
            .filter(|(_, a)| {
                damaged.contains(a)
                    || !matches!(state_of(**a), Some((State::Up | State::Down, false)))
            })
            .map(|(slot, _)| slot)
            .collect();
        if lost.is_empty() {
            return false;
        }
        let readable = record
            .replicas
            .iter()
            .filter(|a| !damaged.contains(a) && matches!(state_of(**a), Some((State::Up, _))))
            .count();
        if readable < usize::from(data) {
            return false;
        }
        // The damaged fragments are freed once it commits, as damaged
        // replicas are; one on a drained node stays until the node
        // retires (a metadata copy may still name it meanwhile).
        let dropped: Vec<Addr> = lost
            .iter()
            .map(|&slot| record.replicas[slot])
            .filter(|a| damaged.contains(a))
            .collect();
        let layout = StripeLayout::new(record.size, data, parity);
        let nodes_of = |keep: &dyn Fn(usize) -> bool| -> Vec<u16> {
            record
                .replicas
                .iter()
                .enumerate()
                .filter(|(slot, _)| keep(*slot))
                .filter_map(|(_, &a)| self.table.layout.sn_of(a))
                .collect()
        };
        let every = nodes_of(&|_| true);
        // Failing that (a small cluster), a lost fragment's own node, if
        // up (a damaged one), takes its rebuilt fragment as a new file:
        // still one fragment per node.
        let kept = nodes_of(&|slot| !lost.contains(&slot));
        let count = lost.len();
        let (name, version) = (record.name.clone(), record.version + 1);
        let len = layout.fragment_len();
        let placed = self
            .place_n(&name, version, len, count, count, &every)
            .or_else(|_| self.place_n(&name, version, len, count, count, &kept));
        let Ok(targets) = placed else {
            return true;
        };
        self.repairs.insert(
            name,
            Repair {
                version: record.version,
                keep: Vec::new(),
                targets: targets.clone(),
                dropped,
                deadline: now + DATA_BASE_MS + record.size / (16 << 20) * 1000,
                slots: lost.clone(),
            },
        );
        self.repair_counts.rebuilds_started += 1;
        out.push(Out::Rebuild {
            record: Box::new(record),
            slots: lost,
            targets,
        });
        false
    }
}

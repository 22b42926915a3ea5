//! Retiring storage nodes: drains started and cancelled, the metadata
//! nodes' reports of what still references a node, and the retirement
//! once every owner reports it drained.

use super::*;

impl OnCore {
    /// Starts retiring a storage node: it is drained (see [`Drain`]) and
    /// marked retired once no record names it. Idempotent: asking again
    /// for a node being drained or retired changes nothing (an operator's
    /// resent request, or a retry after a lost answer, must not fail).
    /// Refused for a node that would leave fewer than N_d storage nodes
    /// to hold replicas.
    pub(super) fn retire(&mut self, uuid: u64) -> Result<Body, Error> {
        if self.table.mns.iter().any(|m| m.uuid == uuid) {
            return Err(Error::Remote {
                code: Code::BadRequest,
                message:
                    "retiring a metadata node would move its groups, which this version does not do"
                        .into(),
            });
        }
        let Some(s) = self.table.sns.iter().find(|s| s.uuid == uuid) else {
            return Err(Error::Remote {
                code: Code::NotFound,
                message: format!("no node {uuid:016x}; see `strata store status`"),
            });
        };
        let index = s.index;
        if s.state == State::Retired || self.table.retiring(index) {
            return Ok(Body::Done { version: 0 });
        }
        // Nodes that keep holding replicas: neither retired, retiring nor
        // dead (a down one may come back, a dead one's replicas are gone).
        let remaining = self
            .table
            .sns
            .iter()
            .filter(|o| {
                o.uuid != uuid
                    && matches!(o.state, State::Up | State::Down)
                    && !self.table.retiring(o.index)
            })
            .count();
        let n_d = self.table.max_n_d() as usize;
        if remaining < n_d {
            return Err(Error::Remote {
                code: Code::Conflict,
                message: format!(
                    "retiring storage node {uuid:016x} would leave {remaining} storage nodes to hold replicas, and N_d={n_d} are needed: add a storage node first"
                ),
            });
        }
        let left = s.objects;
        self.table.drains.push(Drain {
            index,
            since: self.table.epoch + 1,
            left,
            copies: 0,
            unplaceable: 0,
            unreported: self.slots_owning_groups().len() as u16,
        });
        self.table.drains.sort_by_key(|d| d.index);
        self.changed()?;
        Ok(Body::Done { version: 0 })
    }

    pub(super) fn cancel_retire(&mut self, uuid: u64) -> Result<Body, Error> {
        if self.table.mns.iter().any(|m| m.uuid == uuid) {
            return Err(Error::Remote {
                code: Code::BadRequest,
                message: format!(
                    "node {uuid:016x} is a metadata node: only storage nodes are drained"
                ),
            });
        }
        let Some(s) = self.table.sns.iter().find(|s| s.uuid == uuid) else {
            return Err(Error::Remote {
                code: Code::NotFound,
                message: format!("no node {uuid:016x}; see `strata store status`"),
            });
        };
        if s.state == State::Retired {
            return Err(Error::Remote {
                code: Code::Conflict,
                message: format!(
                    "storage node {uuid:016x} is retired already and its replicas were freed: \
                     a retirement cannot be cancelled; add it again as a new node \
                     (`strata store node add` with an empty directory)"
                ),
            });
        }
        let index = s.index;
        let Some(pos) = self.table.drains.iter().position(|d| d.index == index) else {
            return Ok(Body::Done { version: 0 });
        };
        self.table.drains.remove(pos);
        self.forget_drain(index);
        // Persisted: the epoch the drain ended at must survive a restart,
        // so that a later drain of the node gets a later `since`.
        self.changed()?;
        Ok(Body::Done { version: 0 })
    }

    /// Slots that own at least one metadata group.
    pub(super) fn slots_owning_groups(&self) -> Vec<u16> {
        let mut slots = self.table.mg_owner.clone();
        slots.sort_unstable();
        slots.dedup();
        slots
    }

    /// A metadata node's report on a drain: records it, publishes the
    /// progress, and retires the node once it is drained.
    pub(super) fn drain_report(
        &mut self,
        slot: u16,
        index: u16,
        count: DrainCount,
    ) -> Result<Body, Error> {
        let Some(drain) = self.table.drain_of(index).copied() else {
            // Retired already (or never drained): nothing to count.
            return Ok(Body::Done { version: 0 });
        };
        if !self.table.mns.iter().any(|m| m.slot == slot) {
            return Err(Error::Remote {
                code: Code::BadRequest,
                message: format!("no metadata node holds slot {slot}"),
            });
        }
        // A scan that started before the drain or before the owners last
        // changed proves nothing about the groups the node owns now; one
        // that counted for another drain of the node (cancelled, then
        // started again) proves nothing about this one. Epochs only go up,
        // across restarts too, so a scan under an earlier drain has an
        // epoch below this one's start; the drain it names is checked as
        // well, since it costs nothing and the metadata nodes send it.
        if count.drain == drain.since && count.epoch >= drain.since.max(self.owners_epoch) {
            self.drain_reports.insert((index, slot), count);
        }
        self.update_drain(index)?;
        Ok(Body::Done { version: 0 })
    }

    /// Sums the valid reports of the drain of `index` into the table and
    /// retires the node once it is drained: no group is being restored (a
    /// restoring node's rows are incomplete until it has gathered them)
    /// and every slot owning groups reports no row naming it, in two
    /// rounds. Reports come from scans made at different times, so a
    /// replication message landing at a metadata copy after that copy's
    /// scan passed (while its coordinator's row moved on) escapes the
    /// first round. When the first round is clean, the epoch is bumped
    /// and only scans started at that epoch or later count: coordinators
    /// count their replication messages still being resent (see
    /// `MnCore::report_drains`), so a clean first round means none naming
    /// the node was left, and anything they wrote before is in place for
    /// the second round to see.
    pub(super) fn update_drain(&mut self, index: u16) -> Result<(), Error> {
        let Some(pos) = self.table.drains.iter().position(|d| d.index == index) else {
            return Ok(());
        };
        let drain = self.table.drains[pos];
        let base = drain.since.max(self.owners_epoch);
        // A confirmation asked for before owners last changed is void:
        // the first round starts over under the new owners.
        let confirm = self
            .drain_confirm
            .get(&index)
            .copied()
            .filter(|&e| e > base);
        let mut sum = self.sum_drain_reports(index, drain.since, confirm.unwrap_or(base));
        let restoring = self
            .table
            .moves
            .iter()
            .any(|m| m.phase == MovePhase::Restoring);
        let clean = sum.unreported == 0 && sum.left == 0 && sum.copies == 0 && !restoring;
        if clean && confirm.is_some() {
            self.table.drains.remove(pos);
            self.forget_drain(index);
            if let Some(s) = self.table.sns.iter_mut().find(|s| s.index == index) {
                s.state = State::Retired;
            }
            return self.changed();
        }
        if clean {
            // Published without an fsync of its own (the limit takes one
            // per `EPOCH_RESERVE`; a restart forgets the round anyway) so
            // that the metadata nodes' next scans carry it.
            self.next_epoch()?;
            self.drain_confirm.insert(index, self.table.epoch);
            sum = self.sum_drain_reports(index, drain.since, self.table.epoch);
        }
        let d = self.table.drains[pos];
        // Before every slot has reported, the heartbeat's replica count
        // is the better estimate of what is left.
        if sum.unreported > 0 {
            sum.left = sum.left.max(d.left);
        }
        let next = Drain {
            left: sum.left,
            copies: sum.copies,
            unplaceable: sum.unplaceable.min(sum.left),
            unreported: sum.unreported,
            ..d
        };
        if next != d {
            // Progress is published but not worth an fsync (only one per
            // `EPOCH_RESERVE` for the limit).
            self.next_epoch()?;
            self.table.drains[pos] = next;
        }
        Ok(())
    }

    /// Sums the latest reports on drain `since` of `index` from scans
    /// started at epoch `from` or later; slots without one are unreported.
    pub(super) fn sum_drain_reports(&self, index: u16, since: u64, from: u64) -> DrainSum {
        let mut sum = DrainSum::default();
        for slot in self.slots_owning_groups() {
            match self.drain_reports.get(&(index, slot)) {
                Some(c) if c.epoch >= from && c.drain == since => {
                    sum.left = sum.left.saturating_add(c.left);
                    sum.copies = sum.copies.saturating_add(c.copies);
                    sum.unplaceable = sum.unplaceable.saturating_add(c.unplaceable);
                }
                _ => sum.unreported = sum.unreported.saturating_add(1),
            }
        }
        sum
    }

    /// Drops what was gathered on the drain of `index` (ended).
    pub(super) fn forget_drain(&mut self, index: u16) {
        self.drain_reports.retain(|&(i, _), _| i != index);
        self.drain_confirm.remove(&index);
    }
}

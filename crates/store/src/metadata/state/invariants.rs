//! What a metadata node's state holds after every `handle` and `tick`,
//! checked (the simulation and debug builds of the server run this).

use super::*;
use strata_store_protocol::table::{ensure, InvariantError};

impl<P: Clone + Eq + Hash> MnCore<P> {
    /// Checks the metadata node's invariants:
    /// - its table's own ([`Table::check_invariants`]);
    /// - `reply-cache`: the remembered replies and their eviction order
    ///   hold the same entries, at most `REPLY_CACHE` of them;
    /// - `replication`: a change being replicated waits for W_m
    ///   acknowledgements out of at least W_m addresses, and has fewer
    ///   (it is answered, and forgotten, as the W_m-th comes); a resend's
    ///   delay stays between its first and its longest;
    /// - `repairs`: at most `MAX_REPAIRS` repair copies run at once;
    /// - `damaged`: at most `MAX_DAMAGED_KEPT` replicas reported damaged
    ///   are kept, none seen by a pass not started yet, and a repair never
    ///   keeps or writes a replica it drops;
    /// - `seals`: a group sealed here for its final copy is owned here and
    ///   frozen by the table at the seal's epoch (a seal outliving its
    ///   freeze would refuse the group's changes for good), unless
    ///   unsealing failed on a database error (kept until the next table
    ///   retries);
    /// - `pulls`: every group being copied here is handed over to this
    ///   node by the table;
    /// - `restores`: every group being gathered, or reported gathered, is
    ///   restored to this node by the table at that restore's epoch; a
    ///   group is gathered or reported, never both; a gather holds at
    ///   most `MAX_GATHER_GROUPS` groups, and at least one.
    ///
    /// Table epochs never going down from one call to the next is
    /// checked by the caller with [`Table::check_successor`].
    pub fn check_invariants(&self) -> Result<(), InvariantError> {
        self.table.check_invariants()?;
        ensure(
            self.replies.len() == self.reply_order.len() && self.replies.len() <= REPLY_CACHE,
            "reply-cache",
            || {
                format!(
                    "{} replies, {} in the eviction order, at most {REPLY_CACHE}",
                    self.replies.len(),
                    self.reply_order.len()
                )
            },
        )?;
        self.check_replication()?;
        ensure(self.repairs.len() <= MAX_REPAIRS, "repairs", || {
            format!("{} repairs, at most {MAX_REPAIRS}", self.repairs.len())
        })?;
        self.check_damaged()?;
        self.check_handovers()?;
        self.check_restores()
    }

    fn check_replication(&self) -> Result<(), InvariantError> {
        for (name, p) in &self.pending {
            if let Phase::Replicating { acked, needed, .. } = &p.phase {
                let have = acked.iter().filter(|&&a| a).count();
                ensure(
                    *needed >= 1 && *needed <= acked.len() && have < *needed,
                    "replication",
                    || {
                        format!(
                            "{name:?} version {}: {have} of {} addresses acknowledged, \
                             {needed} needed, still waiting",
                            p.version,
                            acked.len()
                        )
                    },
                )?;
            }
        }
        let bad = self
            .inflight
            .iter()
            .find(|(_, i)| !(RESEND_MS..=RESEND_MAX_MS).contains(&i.delay));
        ensure(bad.is_none(), "replication", || {
            let (req, i) = bad.unwrap();
            format!("resend {req} of {:?} every {} ms", i.name, i.delay)
        })
    }

    fn check_damaged(&self) -> Result<(), InvariantError> {
        use super::damaged::MAX_DAMAGED_KEPT;
        let d = &self.damaged;
        ensure(d.addrs.len() <= MAX_DAMAGED_KEPT, "damaged", || {
            format!(
                "{} replicas reported damaged kept, at most {MAX_DAMAGED_KEPT}",
                d.addrs.len()
            )
        })?;
        let late = d.addrs.values().find(|&&seen| seen > d.pass);
        ensure(late.is_none(), "damaged", || {
            format!(
                "a damaged replica seen by repair pass {late:?}, after the current {}",
                d.pass
            )
        })?;
        // A repair drops only replicas it does not keep or write.
        let bad = self.repairs.iter().find(|(_, r)| {
            r.dropped
                .iter()
                .any(|a| r.keep.contains(a) || r.targets.contains(a))
        });
        ensure(bad.is_none(), "damaged", || {
            format!(
                "the repair of {:?} keeps a replica it drops",
                bad.map(|b| b.0)
            )
        })
    }

    fn check_handovers(&self) -> Result<(), InvariantError> {
        let t = &self.table;
        let seals = if self.stale_seals {
            None
        } else {
            Some(&self.sealed)
        };
        for (&g, &epoch) in seals.into_iter().flatten() {
            let frozen = t
                .move_of(g)
                .is_some_and(|m| m.phase == MovePhase::Frozen && m.frozen_epoch == epoch);
            let owner = t.mg_owner.get(g as usize).copied();
            ensure(frozen && owner == Some(self.slot), "seals", || {
                format!(
                    "group {g} sealed at epoch {epoch} on slot {}: owner {owner:?}, handover {:?}",
                    self.slot,
                    t.move_of(g)
                )
            })?;
        }
        for &g in self.pulls.keys() {
            ensure(
                t.move_of(g).is_some_and(|m| m.to == self.slot),
                "pulls",
                || {
                    format!(
                        "group {g} copied to slot {} under handover {:?}",
                        self.slot,
                        t.move_of(g)
                    )
                },
            )?;
        }
        Ok(())
    }

    fn check_restores(&self) -> Result<(), InvariantError> {
        let t = &self.table;
        let restored_here = |g: u32, epoch: u64| {
            t.move_of(g).is_some_and(|m| {
                m.to == self.slot && m.phase == MovePhase::Restoring && m.frozen_epoch == epoch
            })
        };
        let gathering = self.restore.as_ref().map(|r| &r.groups);
        let groups = gathering.into_iter().flatten();
        for (&g, &epoch) in groups.chain(self.restored.iter().map(|(g, r)| (g, &r.epoch))) {
            ensure(restored_here(g, epoch), "restores", || {
                format!(
                    "group {g} restored on slot {} since epoch {epoch} under handover {:?}",
                    self.slot,
                    t.move_of(g)
                )
            })?;
        }
        if let Some(r) = gathering {
            let both = r.keys().find(|g| self.restored.contains_key(g));
            let size = r.len();
            ensure(
                both.is_none()
                    && (1..=strata_store_protocol::wire::MAX_GATHER_GROUPS).contains(&size),
                "restores",
                || format!("{size} groups gathered; group {both:?} also reported"),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_store_protocol::addr::{Layout, DEFAULT_CLUSTER_PREFIX};
    use strata_store_protocol::table::{MnEntry, Params};

    /// Slot 0 of three, owning a third of 16 groups.
    fn core(dir: &std::path::Path) -> MnCore<u32> {
        let layout = Layout::new(DEFAULT_CLUSTER_PREFIX, 4);
        let mut t = Table::new(layout, Params::default());
        t.mns = (0..3)
            .map(|slot| MnEntry {
                uuid: slot as u64 + 1,
                slot,
                endpoint: strata_store_protocol::wire::no_endpoint(),
                state: State::Up,
            })
            .collect();
        t.mg_owner = (0..16).map(|g| g / 6).collect();
        let db = MetaDb::open(&dir.join("meta.redb")).unwrap();
        let core = MnCore::new(db, t, 0, 1);
        core.check_invariants().expect("a sound metadata node");
        core
    }

    fn broken(core: &MnCore<u32>) -> &'static str {
        core.check_invariants()
            .expect_err("a broken state")
            .invariant
    }

    #[test]
    fn each_broken_metadata_node_invariant_is_reported_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = core(dir.path());
        c.reply_order.push_back((1, 5));
        assert_eq!(broken(&c), "reply-cache");
        drop(c);

        let mut c = core(dir.path());
        c.pending.insert(
            "a/b".into(),
            Pending {
                op: 1,
                version: 4,
                client: 9,
                client_req: 2,
                deadline: 100,
                phase: Phase::Replicating {
                    acked: vec![true, true, false],
                    needed: 2,
                    free_after: Vec::new(),
                    answer: None,
                },
            },
        );
        assert_eq!(broken(&c), "replication", "W_m acknowledged, not answered");
        drop(c);

        let mut c = core(dir.path());
        for i in 0..=MAX_REPAIRS {
            let repair = Repair {
                version: 1,
                keep: Vec::new(),
                targets: Vec::new(),
                dropped: Vec::new(),
                deadline: 0,
                slots: Vec::new(),
            };
            c.repairs.insert(format!("n{i}"), repair);
        }
        assert_eq!(broken(&c), "repairs");
        drop(c);

        // Group 1 is slot 0's; the table moves nothing.
        let mut c = core(dir.path());
        c.sealed.insert(1, 5);
        assert_eq!(broken(&c), "seals", "sealed without a freeze");
        drop(c);

        let mut c = core(dir.path());
        let msg = Msg::new(1, 0, Body::GetTable);
        let pull = Pull {
            epoch: 0,
            tombs: false,
            after: String::new(),
            stage: PullStage::Pulling,
            msg,
            next_send: 0,
        };
        c.pulls.insert(9, pull);
        assert_eq!(broken(&c), "pulls", "copied without a handover");
        drop(c);

        let mut c = core(dir.path());
        let report = RestoreReport {
            epoch: 3,
            msg: None,
            next_send: 0,
        };
        c.restored.insert(9, report);
        assert_eq!(broken(&c), "restores", "reported without a restore");
        drop(c);

        let mut c = core(dir.path());
        c.table.moves.push(strata_store_protocol::table::Move {
            group: 1,
            to: 2,
            phase: MovePhase::Frozen,
            frozen_epoch: c.table.epoch + 1,
        });
        assert_eq!(broken(&c), "moves", "the table's own");
    }
}

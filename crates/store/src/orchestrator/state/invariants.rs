//! What the orchestrator's state holds after every `handle` and `tick`,
//! checked (the simulation and debug builds of the server run this).

use super::*;
use strata_store_protocol::table::{ensure, InvariantError};

impl OnCore {
    /// Checks the orchestrator's invariants:
    /// - the table's own ([`Table::check_invariants`]);
    /// - `one-owner`: every metadata group has an owner, a slot below the
    ///   slots expected (as does every handover's target);
    /// - `epoch-limit`: the table's epoch is at or below the stored epoch
    ///   limit (a restart starts above every epoch published), and the
    ///   epoch owners last changed at is no later than the table's;
    /// - `freeze-batch`: at most [`FREEZE_BATCH`] groups are frozen;
    /// - `stand-in-homes`: a group standing in has a home that is not
    ///   dead (a dead node's stand-ins are kept for good), and when that
    ///   home is up the group is on its way: a handover or restore of it
    ///   is under way;
    /// - `last-seen`: every node in the table has a last-seen time (one
    ///   without would be declared dead at the next tick).
    ///
    /// Table epochs rising from one call to the next is checked by the
    /// caller with [`Table::check_successor`].
    pub fn check_invariants(&self) -> Result<(), InvariantError> {
        let t = &self.table;
        t.check_invariants()?;
        let groups = t.layout.mg_count();
        let stray = t
            .mg_owner
            .iter()
            .copied()
            .chain(t.moves.iter().map(|m| m.to))
            .find(|&s| s >= self.expected_mns);
        ensure(
            t.mg_owner.len() == groups && stray.is_none(),
            "one-owner",
            || {
                format!(
                    "{} owners for {groups} groups; slot {stray:?} of {} expected",
                    t.mg_owner.len(),
                    self.expected_mns
                )
            },
        )?;
        ensure(
            t.epoch <= self.epoch_limit && self.owners_epoch <= t.epoch,
            "epoch-limit",
            || {
                format!(
                    "epoch {} with limit {}, owners changed at {}",
                    t.epoch, self.epoch_limit, self.owners_epoch
                )
            },
        )?;
        let frozen = t
            .moves
            .iter()
            .filter(|m| m.phase == MovePhase::Frozen)
            .count();
        ensure(frozen <= FREEZE_BATCH, "freeze-batch", || {
            format!("{frozen} groups frozen, at most {FREEZE_BATCH}")
        })?;
        self.check_stand_in_homes()?;
        let unseen = t
            .mns
            .iter()
            .map(|m| m.uuid)
            .chain(t.sns.iter().map(|s| s.uuid))
            .find(|u| !self.last_seen.contains_key(u));
        ensure(unseen.is_none(), "last-seen", || {
            format!("node {:016x} has no last-seen time", unseen.unwrap_or(0))
        })
    }

    fn check_stand_in_homes(&self) -> Result<(), InvariantError> {
        let t = &self.table;
        for s in &t.stand_ins {
            let home = t.mns.iter().find(|m| m.slot == s.home).map(|m| m.state);
            let ok = match home {
                Some(State::Up) => t.move_of(s.group).is_some(),
                Some(State::Down) => true,
                _ => false,
            };
            ensure(ok, "stand-in-homes", || {
                format!(
                    "group {} stands in for slot {} ({home:?}) with handover {:?}",
                    s.group,
                    s.home,
                    t.move_of(s.group)
                )
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_store_protocol::addr::{Layout, DEFAULT_CLUSTER_PREFIX};
    use strata_store_protocol::table::Params;
    use strata_store_protocol::wire::Role;

    /// An orchestrator of 64 groups with its 3 metadata nodes registered,
    /// in its own directory.
    fn orchestrator() -> (tempfile::TempDir, OnCore) {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(DEFAULT_CLUSTER_PREFIX, 6);
        let initial = Table::new(layout, Params::default());
        let mut on = OnCore::open(&dir.path().join("on.redb"), initial, 3, 0).unwrap();
        for uuid in 1..=3 {
            let register = Body::Register {
                role: Role::Mn,
                uuid,
                endpoint: strata_store_protocol::wire::no_endpoint(),
                capacity: 0,
                free: 0,
                device: 0,
                keys: None,
            };
            on.handle(0, &Msg::new(uuid, 0, register));
        }
        assert_eq!(on.table.mns.len(), 3);
        on.check_invariants().expect("a sound orchestrator");
        (dir, on)
    }

    fn broken(on: &OnCore) -> &'static str {
        on.check_invariants().expect_err("a broken state").invariant
    }

    /// Groups slot 1 does not own.
    fn not_of_slot_1(on: &OnCore) -> Vec<u32> {
        (0..64u32)
            .filter(|&g| on.table.mg_owner[g as usize] != 1)
            .collect()
    }

    #[test]
    fn each_broken_orchestrator_invariant_is_reported_by_name() {
        let (_dir, mut on) = orchestrator();
        on.table.mg_owner[3] = 9;
        assert_eq!(broken(&on), "one-owner", "an owner beyond the slots");

        let (_dir, mut on) = orchestrator();
        on.table.epoch = on.epoch_limit + 1;
        assert_eq!(broken(&on), "epoch-limit");

        let (_dir, mut on) = orchestrator();
        let epoch = on.table.epoch;
        for g in not_of_slot_1(&on).into_iter().take(FREEZE_BATCH + 1) {
            on.table.moves.push(Move {
                group: g,
                to: 1,
                phase: MovePhase::Frozen,
                frozen_epoch: epoch,
            });
        }
        assert_eq!(broken(&on), "freeze-batch");

        let (_dir, mut on) = orchestrator();
        let group = not_of_slot_1(&on)[0];
        on.table.stand_ins.push(StandIn { group, home: 1 });
        assert_eq!(broken(&on), "stand-in-homes", "home up, nothing moving");

        let (_dir, mut on) = orchestrator();
        on.last_seen.remove(&2);
        assert_eq!(broken(&on), "last-seen");

        let (_dir, mut on) = orchestrator();
        on.table.mns[2].slot = 0;
        assert_eq!(broken(&on), "unique-nodes", "the table's own");
    }
}

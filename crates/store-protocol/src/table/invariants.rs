//! What every prefix table holds, checked: [`Table::check_invariants`] on
//! one table, [`Table::check_successor`] across two tables of one
//! publisher. The orchestrator's and the metadata nodes' own checks build
//! on these; the simulation runs them after every step.

use super::{MovePhase, State, Table};
use crate::addr::MAX_MG_BITS;
use crate::table::MAX_REVOKED_TENANTS;

/// A broken invariant: which one, and the groups, slots or nodes
/// involved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvariantError {
    /// The invariant's short name, as its doc comment lists it.
    pub invariant: &'static str,
    /// What was found, naming the ids involved.
    pub detail: String,
}

impl std::fmt::Display for InvariantError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invariant '{}' broken: {}", self.invariant, self.detail)
    }
}

impl std::error::Error for InvariantError {}

/// `Err` naming `invariant` unless `holds`, with the detail built only
/// when it broke (the checks run after every simulated step).
pub fn ensure(
    holds: bool,
    invariant: &'static str,
    detail: impl FnOnce() -> String,
) -> Result<(), InvariantError> {
    if holds {
        Ok(())
    } else {
        Err(InvariantError {
            invariant,
            detail: detail(),
        })
    }
}

/// A key that two of `items` share, if any (sorted, so a table of many
/// groups costs n log n per check).
fn first_repeat<T, K: Ord + Copy>(items: &[T], key: impl Fn(&T) -> K) -> Option<K> {
    let mut keys: Vec<K> = items.iter().map(key).collect();
    keys.sort_unstable();
    keys.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

impl Table {
    /// Checks what every table holds, as the orchestrator builds it and
    /// as [`Table::decode`] accepts it:
    /// - `params`: the cluster's and every bucket's replication are valid
    ///   (1 ≤ W ≤ N ≤ 16);
    /// - `one-owner`: every metadata group has exactly one owner slot:
    ///   `mg_owner` holds one entry per group (or none, before the
    ///   cluster has metadata nodes);
    /// - `unique-nodes`: no two metadata nodes share a slot or identity,
    ///   no two storage nodes an index or identity;
    /// - `moves`: at most one handover per group, of a group in range, to
    ///   a slot some metadata node holds; a restore's target already owns
    ///   the group, any other handover's target does not; a frozen group
    ///   and a restore carry a nonzero epoch no later than the table's,
    ///   a group being copied carries none;
    /// - `no-freeze-during-restore`: no group is frozen while one is
    ///   being restored (a restore reads every node once, and a group
    ///   changing owner meanwhile could be read at neither);
    /// - `stand-ins`: at most one per group, of a group in range, whose
    ///   home is a slot some metadata node holds and not the owner;
    /// - `drains`: at most one per storage node, of a node the table holds
    ///   and that is not retired, started no later than the table's
    ///   epoch, with no more unplaceable records than records left;
    /// - `sorted-lists`: fingerprints sorted by identity and revocations
    ///   by tenant hash, without repeats; at most
    ///   [`MAX_REVOKED_TENANTS`] revocations, none of generation 0.
    pub fn check_invariants(&self) -> Result<(), InvariantError> {
        self.check_shape()?;
        self.check_moves()?;
        self.check_stand_ins()?;
        self.check_drains()?;
        self.check_lists()
    }

    fn check_shape(&self) -> Result<(), InvariantError> {
        let bad = std::iter::once(("cluster", &self.params))
            .chain(self.buckets.iter().map(|(b, p)| (b.as_str(), p)))
            .find_map(|(who, p)| p.validate().err().map(|e| format!("{who}: {e}")));
        ensure(bad.is_none(), "params", || bad.unwrap_or_default())?;
        let groups = self.layout.mg_count();
        ensure(
            self.layout.mg_bits <= MAX_MG_BITS
                && (self.mg_owner.is_empty() || self.mg_owner.len() == groups),
            "one-owner",
            || format!("{} owners for {groups} groups", self.mg_owner.len()),
        )?;
        let repeat = first_repeat(&self.mns, |m| m.slot)
            .map(|s| format!("slot {s} held by two metadata nodes"))
            .or_else(|| {
                first_repeat(&self.mns, |m| m.uuid)
                    .map(|u| format!("metadata node {u:016x} listed twice"))
            })
            .or_else(|| {
                first_repeat(&self.sns, |s| s.index)
                    .map(|i| format!("storage index {i} held by two nodes"))
            })
            .or_else(|| {
                first_repeat(&self.sns, |s| s.uuid)
                    .map(|u| format!("storage node {u:016x} listed twice"))
            });
        ensure(repeat.is_none(), "unique-nodes", || {
            repeat.unwrap_or_default()
        })
    }

    fn has_slot(&self, slot: u16) -> bool {
        self.mns.iter().any(|m| m.slot == slot)
    }

    fn check_moves(&self) -> Result<(), InvariantError> {
        let groups = self.mg_owner.len();
        if let Some(g) = first_repeat(&self.moves, |m| m.group) {
            return ensure(false, "moves", || format!("group {g} handed over twice"));
        }
        for m in &self.moves {
            let g = m.group;
            let owner = self.mg_owner.get(g as usize).copied();
            ensure((g as usize) < groups, "moves", || {
                format!("handover of group {g}, of {groups} groups")
            })?;
            ensure(self.has_slot(m.to), "moves", || {
                format!("group {g} handed over to slot {}, held by no node", m.to)
            })?;
            let restoring = m.phase == MovePhase::Restoring;
            ensure(restoring == (owner == Some(m.to)), "moves", || {
                format!(
                    "group {g} ({:?}) to slot {} while slot {owner:?} owns it",
                    m.phase, m.to
                )
            })?;
            let epoch_ok = match m.phase {
                MovePhase::Copying | MovePhase::Copied => m.frozen_epoch == 0,
                MovePhase::Frozen | MovePhase::Restoring => {
                    m.frozen_epoch > 0 && m.frozen_epoch <= self.epoch
                }
            };
            ensure(epoch_ok, "moves", || {
                format!(
                    "group {g} ({:?}) at epoch {} in a table of epoch {}",
                    m.phase, m.frozen_epoch, self.epoch
                )
            })?;
        }
        let frozen = self.moves.iter().find(|m| m.phase == MovePhase::Frozen);
        let restored = self.moves.iter().find(|m| m.phase == MovePhase::Restoring);
        if let (Some(f), Some(r)) = (frozen, restored) {
            return ensure(false, "no-freeze-during-restore", || {
                format!(
                    "group {} frozen while group {} is restored",
                    f.group, r.group
                )
            });
        }
        Ok(())
    }

    fn check_stand_ins(&self) -> Result<(), InvariantError> {
        if let Some(g) = first_repeat(&self.stand_ins, |s| s.group) {
            return ensure(false, "stand-ins", || format!("group {g} stands in twice"));
        }
        for s in &self.stand_ins {
            let owner = self.mg_owner.get(s.group as usize).copied();
            ensure(
                owner.is_some() && owner != Some(s.home) && self.has_slot(s.home),
                "stand-ins",
                || {
                    format!(
                        "group {} stands in for slot {} (owner {owner:?})",
                        s.group, s.home
                    )
                },
            )?;
        }
        Ok(())
    }

    fn check_drains(&self) -> Result<(), InvariantError> {
        if let Some(i) = first_repeat(&self.drains, |d| d.index) {
            return ensure(false, "drains", || {
                format!("storage node {i} drained twice")
            });
        }
        for d in &self.drains {
            let node = self.sns.iter().find(|s| s.index == d.index);
            ensure(
                node.is_some_and(|s| s.state != State::Retired)
                    && d.since <= self.epoch
                    && d.unplaceable <= d.left,
                "drains",
                || {
                    format!(
                        "drain of storage node {} (state {:?}) since epoch {} in a table of \
                         epoch {}, {} unplaceable of {} left",
                        d.index,
                        node.map(|s| s.state),
                        d.since,
                        self.epoch,
                        d.unplaceable,
                        d.left
                    )
                },
            )?;
        }
        Ok(())
    }

    fn check_lists(&self) -> Result<(), InvariantError> {
        let keys = self.keys.windows(2).find(|w| w[0].0 >= w[1].0);
        ensure(keys.is_none(), "sorted-lists", || {
            format!(
                "fingerprints of node {:016x} out of order",
                keys.unwrap()[1].0
            )
        })?;
        let revoked = self.revoked.windows(2).find(|w| w[0].0 >= w[1].0);
        let zero = self.revoked.iter().find(|r| r.1 == 0);
        ensure(
            revoked.is_none() && zero.is_none() && self.revoked.len() <= MAX_REVOKED_TENANTS,
            "sorted-lists",
            || {
                format!(
                    "{} revocations; out of order {revoked:?}, of generation 0 {zero:?}",
                    self.revoked.len()
                )
            },
        )
    }

    /// Checks that `self` may follow `previous` from the same publisher
    /// (the orchestrator, or what one metadata node holds):
    /// - `epochs-rise`: the epoch never goes down;
    /// - `freezes-rise`: a group frozen in both tables is frozen at the
    ///   same or a later epoch, and a restore to the same slot started at
    ///   the same or a later epoch;
    /// - `drains-rise`: a node drained in both tables was drained since
    ///   the same or a later epoch (a drain cancelled and started again
    ///   starts later).
    pub fn check_successor(&self, previous: &Table) -> Result<(), InvariantError> {
        ensure(self.epoch >= previous.epoch, "epochs-rise", || {
            format!("epoch {} after epoch {}", self.epoch, previous.epoch)
        })?;
        for m in &self.moves {
            let Some(p) = previous.move_of(m.group) else {
                continue;
            };
            let same = p.phase == m.phase
                && p.to == m.to
                && matches!(m.phase, MovePhase::Frozen | MovePhase::Restoring);
            ensure(
                !same || m.frozen_epoch >= p.frozen_epoch,
                "freezes-rise",
                || {
                    format!(
                        "group {} ({:?}) at epoch {} after epoch {}",
                        m.group, m.phase, m.frozen_epoch, p.frozen_epoch
                    )
                },
            )?;
        }
        for d in &self.drains {
            let Some(p) = previous.drain_of(d.index) else {
                continue;
            };
            ensure(d.since >= p.since, "drains-rise", || {
                format!(
                    "drain of storage node {} since epoch {} after {}",
                    d.index, d.since, p.since
                )
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{Layout, DEFAULT_CLUSTER_PREFIX};
    use crate::table::{Device, Drain, MnEntry, Move, Params, SnEntry, StandIn};

    /// A sound table: 3 metadata nodes owning 16 groups, 2 storage nodes.
    fn sound() -> Table {
        let layout = Layout::new(DEFAULT_CLUSTER_PREFIX, 4);
        let mut t = Table::new(layout, Params::default());
        t.epoch = 10;
        t.mns = (0..3)
            .map(|slot| MnEntry {
                uuid: slot as u64 + 1,
                slot,
                endpoint: crate::wire::no_endpoint(),
                state: State::Up,
            })
            .collect();
        t.mg_owner = (0..16).map(|g| (g % 3) as u16).collect();
        t.sns = (1..=2)
            .map(|index| SnEntry {
                uuid: 100 + index as u64,
                index,
                endpoint: crate::wire::no_endpoint(),
                capacity: 1 << 30,
                free: 1 << 30,
                objects: 0,
                device: Device::Ssd,
                state: State::Up,
            })
            .collect();
        t.check_invariants().expect("the sound table holds");
        t
    }

    fn broken(t: &Table) -> &'static str {
        t.check_invariants().expect_err("a broken table").invariant
    }

    fn moving(group: u32, to: u16, phase: MovePhase, frozen_epoch: u64) -> Move {
        Move {
            group,
            to,
            phase,
            frozen_epoch,
        }
    }

    #[test]
    fn each_broken_table_invariant_is_reported_by_name() {
        let mut t = sound();
        t.params.w_m = 2;
        assert_eq!(broken(&t), "params");
        let mut t = sound();
        t.mg_owner.pop();
        assert_eq!(broken(&t), "one-owner");
        let mut t = sound();
        t.mns[1].slot = 0;
        assert_eq!(broken(&t), "unique-nodes");
        let mut t = sound();
        t.sns[1].uuid = t.sns[0].uuid;
        assert_eq!(broken(&t), "unique-nodes");
        // Group 1 is owned by slot 1.
        let mut t = sound();
        t.moves.push(moving(1, 1, MovePhase::Copying, 0));
        assert_eq!(broken(&t), "moves", "a handover to the owner");
        let mut t = sound();
        t.moves.push(moving(1, 2, MovePhase::Restoring, 5));
        assert_eq!(
            broken(&t),
            "moves",
            "a restore to another node than the owner"
        );
        let mut t = sound();
        t.moves.push(moving(1, 2, MovePhase::Frozen, 11));
        assert_eq!(broken(&t), "moves", "frozen after the table's epoch");
        let mut t = sound();
        t.moves.push(moving(1, 7, MovePhase::Copying, 0));
        assert_eq!(broken(&t), "moves", "to a slot no node holds");
        let mut t = sound();
        t.moves.push(moving(1, 2, MovePhase::Copying, 0));
        t.moves.push(moving(1, 0, MovePhase::Copying, 0));
        assert_eq!(broken(&t), "moves", "two handovers of one group");
        let mut t = sound();
        t.moves.push(moving(1, 2, MovePhase::Frozen, 9));
        t.moves.push(moving(2, 2, MovePhase::Restoring, 9));
        assert_eq!(broken(&t), "no-freeze-during-restore");
        let mut t = sound();
        t.stand_ins.push(StandIn { group: 1, home: 1 });
        assert_eq!(broken(&t), "stand-ins", "standing in for its owner");
        let mut t = sound();
        t.drains.push(Drain {
            index: 1,
            since: 11,
            left: 3,
            copies: 0,
            unplaceable: 0,
            unreported: 0,
        });
        assert_eq!(broken(&t), "drains", "started after the table");
        let mut t = sound();
        t.revoked = vec![(5, 1), (3, 1)];
        assert_eq!(broken(&t), "sorted-lists");
    }

    #[test]
    fn a_table_going_back_is_reported() {
        let before = sound();
        let mut after = before.clone();
        after.epoch = 9;
        let e = after.check_successor(&before).expect_err("an older epoch");
        assert_eq!(e.invariant, "epochs-rise");
        assert!(e.to_string().contains("epoch 9 after epoch 10"), "{e}");
        let mut before = sound();
        before.moves.push(moving(1, 2, MovePhase::Frozen, 8));
        let mut after = before.clone();
        after.epoch = 12;
        after.moves[0].frozen_epoch = 7;
        let e = after.check_successor(&before).expect_err("an older freeze");
        assert_eq!(e.invariant, "freezes-rise");
        after.moves[0].frozen_epoch = 11;
        after.check_successor(&before).expect("a later freeze");
    }
}

//! Failed metadata nodes: stand-ins while one is down, restores once it
//! is declared dead, and the groups handed back when it returns.

use super::*;

impl OnCore {
    /// Declares the metadata node in `slot` dead, if another one is up to
    /// take its groups: handovers to it are called off, and each group it
    /// owned (or was restoring) goes to the up node owning fewest, as a
    /// restore (the new node gathers the group's rows from every live node
    /// before it serves the group). Freezes are called off: no handover
    /// ends during a restore (see `freeze_some`). Groups standing in for
    /// it stay where they are. Returns whether it did.
    pub(super) fn declare_dead(&mut self, slot: u16) -> bool {
        self.reassign(slot, true)
    }

    /// Marks the metadata node in `slot` down and, if another one is up,
    /// gives its groups to stand-ins the way [`OnCore::declare_dead`] does,
    /// remembering each group's home so it goes back when the node is up
    /// again. Returns whether anything changed.
    pub(super) fn stand_in(&mut self, slot: u16) -> bool {
        self.reassign(slot, false)
    }

    /// Gives the groups of `slot` (dead, or down with `dead` false) to the
    /// up nodes as restores.
    pub(super) fn reassign(&mut self, slot: u16, dead: bool) -> bool {
        let mut counts: Vec<(u16, usize)> = self
            .table
            .mns
            .iter()
            .filter(|m| m.slot != slot && m.state == State::Up)
            .map(|m| (m.slot, self.table.groups_of(m.slot)))
            .collect();
        if counts.is_empty() {
            // Nobody to take the groups: stay down, and wait.
            if let Some(m) = self.table.mns.iter_mut().find(|m| m.slot == slot) {
                if m.state == State::Up {
                    m.state = State::Down;
                    return true;
                }
            }
            return false;
        }
        if !dead && !self.may_stand_in(slot) {
            if let Some(m) = self.table.mns.iter_mut().find(|m| m.slot == slot) {
                if m.state == State::Up {
                    m.state = State::Down;
                    return true;
                }
            }
            return false;
        }
        if let Some(m) = self.table.mns.iter_mut().find(|m| m.slot == slot) {
            m.state = if dead { State::Dead } else { State::Down };
        }
        if dead {
            // Groups standing in for it stay with their stand-ins.
            self.table.stand_ins.retain(|s| s.home != slot);
        }
        let epoch = self.table.epoch + 1;
        self.table.moves.retain(|m| m.to != slot);
        for g in 0..self.table.mg_owner.len() {
            if self.table.mg_owner[g] != slot {
                continue;
            }
            // A handover from it cannot finish (nothing to copy from): the
            // group is restored instead, on the node that was taking it
            // over if it is up (it holds part of the rows already, and
            // would otherwise keep rows of a group it does not own).
            let target = self.table.move_of(g as u32).map(|m| m.to);
            self.table.moves.retain(|m| m.group != g as u32);
            let pick = match target.filter(|t| counts.iter().any(|(s, _)| s == t)) {
                Some(t) => Some(t),
                None => self.safest_owner(g, slot, &counts),
            };
            let Some(chosen) = pick.and_then(|p| counts.iter_mut().find(|(s, _)| *s == p)) else {
                break;
            };
            chosen.1 += 1;
            self.table.mg_owner[g] = chosen.0;
            // A group the node was giving away has no home to go back to;
            // one already standing in keeps its first home.
            let g32 = g as u32;
            if !dead && target.is_none() && self.table.home_of(g32).is_none() {
                self.table.stand_ins.push(StandIn {
                    group: g32,
                    home: slot,
                });
            }
            self.table
                .stand_ins
                .retain(|s| !(s.group == g32 && s.home == chosen.0));
            self.table.moves.push(Move {
                group: g as u32,
                to: chosen.0,
                phase: MovePhase::Restoring,
                frozen_epoch: epoch,
            });
        }
        for m in &mut self.table.moves {
            if m.phase == MovePhase::Frozen {
                m.phase = MovePhase::Copied;
                m.frozen_epoch = 0;
                self.frozen_since.remove(&m.group);
            }
        }
        self.table.moves.sort_by_key(|m| m.group);
        self.table.stand_ins.sort_by_key(|s| s.group);
        true
    }

    /// Whether the groups of the down node in `slot` may stand in now: no
    /// group is being restored, and no other down node still owns groups.
    /// A stand-in hands out versions above the rows it gathered, so it must
    /// gather every copy a live node holds: a restore under way may still
    /// need rows from a node that is down, and a down node that owns
    /// groups holds rows no one else may have (two nodes down at once;
    /// its stand-ins come once the first restores are done, gathering the
    /// first node's rows from its stand-ins). Otherwise the groups wait
    /// for the node as before.
    ///
    /// Nor may a node that holds groups standing in for another: it may
    /// hold every copy of a name (the stand-in's own groups and those it
    /// stands in for), so they wait for it too.
    pub(super) fn may_stand_in(&self, slot: u16) -> bool {
        let t = &self.table;
        let standing_in_here = t
            .stand_ins
            .iter()
            .any(|s| t.mg_owner.get(s.group as usize) == Some(&slot));
        !standing_in_here
            && !t.moves.iter().any(|m| m.phase == MovePhase::Restoring)
            && !t
                .mns
                .iter()
                .any(|m| m.slot != slot && m.state == State::Down && t.groups_of(m.slot) > 0)
    }

    /// Starts handing each group standing in for an up node back to it
    /// (a regular handover from the stand-in, once the group is not being
    /// restored or handed over any more), and forgets the stand-ins whose
    /// group is home. Returns whether the table changed.
    pub(super) fn hand_back(&mut self) -> bool {
        let t = &self.table;
        let up = |slot: u16| t.mns.iter().any(|m| m.slot == slot && m.state == State::Up);
        let mut new = Vec::new();
        let mut home = Vec::new();
        for s in &t.stand_ins {
            if t.mg_owner.get(s.group as usize) == Some(&s.home) {
                home.push(s.group);
            } else if up(s.home) && t.move_of(s.group).is_none() {
                new.push(Move {
                    group: s.group,
                    to: s.home,
                    phase: MovePhase::Copying,
                    frozen_epoch: 0,
                });
            }
        }
        let changed = !new.is_empty() || !home.is_empty();
        self.table.stand_ins.retain(|s| !home.contains(&s.group));
        self.table.moves.extend(new);
        self.table.moves.sort_by_key(|m| m.group);
        changed
    }
}

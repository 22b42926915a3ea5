//! Handover of metadata groups to a node that joined: the moves planned
//! so that a name's copies stay apart, their reports and the freezes.

use super::*;

impl OnCore {
    /// The live node to give group `g` of node `from` to: among the nodes
    /// (`counts`: slot and groups owned) still under an even share, the one
    /// that leaves fewest names with every metadata copy on one node
    /// ([`lone_copy_share`]), then the one owning fewest.
    pub(super) fn safest_owner(&self, g: usize, from: u16, counts: &[(u16, usize)]) -> Option<u16> {
        let t = &self.table;
        let even = t.mg_owner.len().div_ceil(counts.len().max(1));
        let under: Vec<(u16, usize)> = counts.iter().copied().filter(|&(_, n)| n < even).collect();
        let pool = if under.is_empty() {
            counts.to_vec()
        } else {
            under
        };
        let mut owner = t.mg_owner.clone();
        let risk = |slot: u16, owner: &mut Vec<u16>| {
            owner[g] = slot;
            lone_copy_risk(t, owner, Some(from))
        };
        pool.iter()
            .map(|&(slot, n)| (risk(slot, &mut owner), n, slot))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)))
            .map(|(_, _, slot)| slot)
    }

    /// Chooses the groups slot `to` takes over (a new node, or one back
    /// after it was declared dead): about groups / live metadata nodes,
    /// each taken from the node that owns most (counting handovers under
    /// way as done), the one leaving fewest names with every metadata copy
    /// on one node ([`lone_copy_share`]); and starts copying them.
    pub(super) fn plan_moves(&mut self, to: u16) {
        let t = &self.table;
        let mut owner: Vec<u16> = t.mg_owner.clone();
        for m in &t.moves {
            if let Some(o) = owner.get_mut(m.group as usize) {
                *o = m.to;
            }
        }
        let live = t.mns.iter().filter(|m| m.state != State::Dead).count();
        let want = owner.len() / live.max(1);
        let mut new = Vec::new();
        while owner.iter().filter(|&&o| o == to).count() < want {
            let mut counts: HashMap<u16, usize> = HashMap::new();
            for (g, &o) in owner.iter().enumerate() {
                // Groups already moving stay where they go; groups standing
                // in for a down node go back to it.
                if o != to && t.move_of(g as u32).is_none() && t.home_of(g as u32).is_none() {
                    *counts.entry(o).or_default() += 1;
                }
            }
            let Some((&from, _)) = counts.iter().max_by_key(|(&slot, &n)| (n, slot)) else {
                break;
            };
            // Of its groups, the one whose move leaves fewest names with
            // every metadata copy on one node.
            let mut trial = owner.clone();
            let Some(g) = (0..owner.len())
                .rev()
                .filter(|&g| {
                    owner[g] == from
                        && t.move_of(g as u32).is_none()
                        && t.home_of(g as u32).is_none()
                })
                .map(|g| {
                    trial[g] = to;
                    let risk = lone_copy_risk(t, &trial, None);
                    trial[g] = from;
                    (risk, g)
                })
                .min_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)))
                .map(|(_, g)| g)
            else {
                break;
            };
            owner[g] = to;
            new.push(Move {
                group: g as u32,
                to,
                phase: MovePhase::Copying,
                frozen_epoch: 0,
            });
        }
        new.sort_by_key(|m| m.group);
        self.table.moves.extend(new);
    }

    /// A new owner's report on a handover: the first copy is done (the
    /// group may be frozen), or the final copy under the freeze of `epoch`
    /// is (the group changes owner; the answer is the new table).
    pub(super) fn move_report(
        &mut self,
        now: u64,
        group: u32,
        to: u16,
        ready: bool,
        epoch: u64,
    ) -> Result<Body, Error> {
        let Some(i) = self.table.moves.iter().position(|m| m.group == group) else {
            if ready && self.table.mg_owner.get(group as usize) == Some(&to) {
                // A resent report of a handover that is done.
                return Ok(Body::Table {
                    bytes: self.table.encode(),
                });
            }
            return Err(Error::Remote {
                code: Code::Conflict,
                message: format!("group {group} is not being handed over"),
            });
        };
        let m = self.table.moves[i];
        if m.to != to {
            return Err(Error::Remote {
                code: Code::Conflict,
                message: format!("group {group} is handed over to slot {}, not {to}", m.to),
            });
        }
        if m.phase == MovePhase::Restoring {
            if !ready || m.frozen_epoch != epoch {
                return Err(Error::Remote {
                    code: Code::Conflict,
                    message: format!(
                        "group {group} is being restored since epoch {}, not {epoch}; gather it again",
                        m.frozen_epoch
                    ),
                });
            }
            // The node owns it already (see `declare_dead`); now it serves it.
            self.table.moves.remove(i);
            self.hand_back();
            self.freeze_some(now);
            self.changed()?;
            return Ok(Body::Table {
                bytes: self.table.encode(),
            });
        }
        if !ready {
            if m.phase == MovePhase::Copying {
                self.table.moves[i].phase = MovePhase::Copied;
                self.freeze_some(now);
                self.changed()?;
            }
            return Ok(Body::Done { version: 0 });
        }
        if m.phase != MovePhase::Frozen || m.frozen_epoch != epoch {
            return Err(Error::Remote {
                code: Code::Moving,
                message: format!("group {group} is not frozen at epoch {epoch}; copy it again"),
            });
        }
        self.table.moves.remove(i);
        self.frozen_since.remove(&group);
        if let Some(o) = self.table.mg_owner.get_mut(group as usize) {
            *o = to;
        }
        // A group that stood in for `to` is home again.
        self.table
            .stand_ins
            .retain(|s| !(s.group == group && s.home == to));
        self.freeze_some(now);
        self.changed()?;
        Ok(Body::Table {
            bytes: self.table.encode(),
        })
    }

    /// Freezes copied groups while fewer than [`FREEZE_BATCH`] are frozen.
    /// Returns whether any was. The freeze epoch is the one the table gets
    /// at the next change.
    pub(super) fn freeze_some(&mut self, now: u64) -> bool {
        // No handover ends while a group is being restored: the restore
        // reads every live node's rows once, and a group changing owner
        // meanwhile could be read at neither.
        if self
            .table
            .moves
            .iter()
            .any(|m| m.phase == MovePhase::Restoring)
        {
            return false;
        }
        let mut frozen = self
            .table
            .moves
            .iter()
            .filter(|m| m.phase == MovePhase::Frozen)
            .count();
        let epoch = self.table.epoch + 1;
        let mut any = false;
        for m in &mut self.table.moves {
            if frozen >= FREEZE_BATCH {
                break;
            }
            if m.phase == MovePhase::Copied {
                m.phase = MovePhase::Frozen;
                m.frozen_epoch = epoch;
                self.frozen_since.insert(m.group, now);
                frozen += 1;
                any = true;
            }
        }
        any
    }
}

//! Handover of a metadata group to a new owner: the pages the old owner
//! serves and the new owner pulls until the group is whole.

use super::*;

impl<P: Clone + Eq + Hash> MnCore<P> {
    /// Serves one page of group `group` to the node taking it over. For
    /// the final copy (`epoch` > 0) the group must be frozen at that epoch
    /// in this node's table and nothing of it in flight here; the group is
    /// then sealed: no change of it is accepted until the table moves on.
    pub(super) fn serve_pull(
        &mut self,
        target: Addr,
        group: u32,
        epoch: u64,
        tombs: bool,
        after: &str,
    ) -> Result<Body, Error> {
        if self.table.layout.mg_of(target) != Some(group) {
            return Err(remote(
                Code::BadRequest,
                format!(
                    "a copy of group {group} must be addressed to that group, not to {}",
                    strata_store_protocol::addr::fmt_addr(target)
                ),
            ));
        }
        self.owned(target)?;
        let Some(m) = self.table.move_of(group).copied() else {
            return Err(remote(
                Code::BadRequest,
                format!("group {group} is not being handed over in this node's table"),
            ));
        };
        if epoch > 0 && self.sealed.get(&group) != Some(&epoch) {
            if m.phase != MovePhase::Frozen || m.frozen_epoch != epoch {
                return Err(remote(
                    Code::Moving,
                    format!("group {group} is not frozen at epoch {epoch} here yet; ask again"),
                ));
            }
            let in_flight = self
                .pending
                .keys()
                .chain(self.repairs.keys())
                .filter(|n| self.coordinator_group(n) == Some(group))
                .count();
            if in_flight > 0 {
                return Err(remote(
                    Code::Moving,
                    format!("{in_flight} changes of group {group} are still in flight; ask again"),
                ));
            }
            // Durable before the first page leaves.
            self.db.set_sealed(group, Some(epoch))?;
            self.sealed.insert(group, epoch);
        }
        let (rows, more) = self.db.group_rows(
            group,
            tombs,
            after,
            strata_store_protocol::wire::MAX_PULL_ROWS,
            PULL_PAGE_BYTES,
        )?;
        Ok(Body::MgRows { rows, more })
    }

    /// The group whose handover awaits the answer `req`, if any.
    pub(super) fn pull_awaiting(&self, req: u64) -> Option<u32> {
        self.pulls
            .iter()
            .find(|(_, p)| p.stage != PullStage::Reported && p.msg.req == req)
            .map(|(&g, _)| g)
    }

    /// Starts, resumes or resends the copies of the groups the table hands
    /// over to this node: a first copy while the group is being copied, a
    /// final one (under the freeze epoch) once it is frozen.
    pub(super) fn handover_step(&mut self, now: u64, out: &mut Vec<Out<P>>) {
        let moves: Vec<_> = self
            .table
            .moves
            .iter()
            .filter(|m| m.to == self.slot)
            .copied()
            .collect();
        for m in moves {
            let epoch = match m.phase {
                MovePhase::Copying => 0,
                MovePhase::Frozen => m.frozen_epoch,
                // The first copy is reported; wait for the freeze. (After a
                // restart here the rows are in the database already.)
                MovePhase::Copied => continue,
                // Gathered from every node instead (`restore_step`).
                MovePhase::Restoring => continue,
            };
            let restart = self.pulls.get(&m.group).is_none_or(|p| p.epoch != epoch);
            if restart && epoch == 0 {
                self.forget_stale_rows(m.group);
            }
            if restart {
                let msg = self.pull_msg(m.group, epoch, false, String::new());
                self.pulls.insert(
                    m.group,
                    Pull {
                        epoch,
                        tombs: false,
                        after: String::new(),
                        stage: PullStage::Pulling,
                        msg: msg.clone(),
                        next_send: now + PULL_RESEND_MS,
                    },
                );
                out.push(Out::ToMeta(msg));
                continue;
            }
            if let Some(p) = self.pulls.get_mut(&m.group) {
                if p.stage != PullStage::Reported && now >= p.next_send {
                    p.next_send = now + PULL_RESEND_MS;
                    out.push(match p.stage {
                        PullStage::Reporting => Out::ToOn(p.msg.clone()),
                        _ => Out::ToMeta(p.msg.clone()),
                    });
                }
            }
        }
    }

    /// Before the first copy of a group taken over, drops what this node
    /// still holds of it from an earlier time it owned it (a node declared
    /// dead and back: its groups were restored elsewhere, and a row only
    /// it kept may name replicas since collected). Not for a group handed
    /// back after a stand-in: the home node's rows are newest where the
    /// stand-in missed a write, and the copy's version rules merge them.
    pub(super) fn forget_stale_rows(&mut self, group: u32) {
        if self.table.home_of(group) == Some(self.slot)
            || !self.db.group_has_rows(group).unwrap_or(false)
        {
            return;
        }
        if let Err(e) = self.db.drop_group(group) {
            tracing::warn!(
                "dropping stale rows of group {group} before taking it over: {}",
                e.report()
            );
        }
    }

    pub(super) fn pull_msg(&mut self, group: u32, epoch: u64, tombs: bool, after: String) -> Msg {
        self.next_req = self.next_req.wrapping_add(1) | 1 << 63;
        let (prefix, _) = self.table.layout.mg_prefix(group);
        Msg::new(
            self.next_req,
            prefix,
            Body::MgPull {
                group,
                epoch,
                tombs,
                after,
            },
        )
    }

    /// An answer to a handover page request or report.
    pub(super) fn on_pull_reply(&mut self, now: u64, group: u32, msg: Msg, out: &mut Vec<Out<P>>) {
        let Some(stage) = self.pulls.get(&group).map(|p| p.stage) else {
            return;
        };
        match (stage, msg.body) {
            (PullStage::Pulling, Body::MgRows { rows, more }) => {
                for row in &rows {
                    if let Err(e) = self.db.apply_row(group, row) {
                        // The resend asks for the same page again.
                        tracing::warn!(
                            "storing a row of group {group} being taken over: {}",
                            e.report()
                        );
                        return;
                    }
                }
                let Some(p) = self.pulls.get(&group) else {
                    return;
                };
                let (epoch, mut tombs) = (p.epoch, p.tombs);
                let mut after = match rows.last() {
                    Some(Row::Record(r)) => r.name.clone(),
                    Some(Row::Tomb { name, .. }) => name.clone(),
                    None => p.after.clone(),
                };
                let next = if more {
                    Some(self.pull_msg(group, epoch, tombs, after.clone()))
                } else if !tombs {
                    tombs = true;
                    after.clear();
                    Some(self.pull_msg(group, epoch, true, String::new()))
                } else {
                    None
                };
                let (msg, stage) = match next {
                    Some(m) => (m, PullStage::Pulling),
                    None => {
                        self.next_req = self.next_req.wrapping_add(1) | 1 << 63;
                        let report = Msg::new(
                            self.next_req,
                            0,
                            Body::MoveReport {
                                group,
                                to: self.slot,
                                ready: epoch > 0,
                                epoch,
                            },
                        );
                        (report, PullStage::Reporting)
                    }
                };
                if let Some(p) = self.pulls.get_mut(&group) {
                    p.tombs = tombs;
                    p.after = after;
                    p.stage = stage;
                    p.msg = msg.clone();
                    p.next_send = now + PULL_RESEND_MS;
                }
                out.push(if stage == PullStage::Reporting {
                    Out::ToOn(msg)
                } else {
                    Out::ToMeta(msg)
                });
            }
            (PullStage::Pulling, _) => {
                // Not ready for the final copy yet, or the owner's table
                // differs from ours: ask again shortly.
                if let Some(p) = self.pulls.get_mut(&group) {
                    p.next_send = now + PULL_RETRY_MS;
                }
            }
            (PullStage::Reporting, Body::Table { bytes }) => {
                // The orchestrator handed the group over: serve it at once
                // rather than at the next table refresh.
                if let Ok(t) = Table::decode(&bytes) {
                    if t.epoch > self.table.epoch {
                        self.set_table(t);
                    }
                }
                if let Some(p) = self.pulls.get_mut(&group) {
                    p.stage = PullStage::Reported;
                }
            }
            (PullStage::Reporting, Body::Done { .. }) => {
                if let Some(p) = self.pulls.get_mut(&group) {
                    p.stage = PullStage::Reported;
                }
            }
            (PullStage::Reporting, _) => {
                // Refused (the handover moved on meanwhile): start over as
                // the table says.
                self.pulls.remove(&group);
            }
            (PullStage::Reported, _) => {}
        }
    }
}

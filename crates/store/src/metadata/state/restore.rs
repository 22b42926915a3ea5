//! Restore of a metadata group whose owner died: rows gathered from the
//! nodes that hold copies of its names.

use super::*;

impl<P: Clone + Eq + Hash> MnCore<P> {
    /// Answers one page of a gather for `groups` (being restored by the
    /// sender): rows from any group here whose name has a metadata address
    /// in one of them.
    pub(super) fn serve_gather(
        &self,
        groups: &[u32],
        slot: u16,
        from: &GatherCursor,
    ) -> Result<Body, Error> {
        if slot != self.slot {
            return Err(remote(
                Code::WrongAddress,
                format!(
                    "this metadata node is slot {}, not {slot}; refresh the table and ask again",
                    self.slot
                ),
            ));
        }
        let wanted: std::collections::BTreeSet<u32> = groups.iter().copied().collect();
        let t = &self.table;
        let (rows, next) = self.db.gather(
            from,
            |name| {
                t.meta_addrs(name)
                    .iter()
                    .any(|&a| t.layout.mg_of(a).is_some_and(|g| wanted.contains(&g)))
            },
            strata_store_protocol::wire::MAX_PULL_ROWS,
            PULL_PAGE_BYTES,
            GATHER_SCAN,
        )?;
        Ok(Body::MgGathered { rows, next })
    }

    /// The group whose ready report awaits the answer `req`, if any.
    pub(super) fn report_awaiting(&self, req: u64) -> Option<u32> {
        self.restored
            .iter()
            .find(|(_, r)| r.msg.as_ref().is_some_and(|m| m.req == req))
            .map(|(&g, _)| g)
    }

    /// The page request for slot `source` at `from`, addressed to a group
    /// that slot owns (`None`: it owns none, so it holds no row a restore
    /// needs: see `restore_sources`).
    pub(super) fn gather_msg(
        &mut self,
        groups: Vec<u32>,
        source: u16,
        from: GatherCursor,
    ) -> Option<Msg> {
        let owned = self.table.mg_owner.iter().position(|&s| s == source)? as u32;
        let (target, _) = self.table.layout.mg_prefix(owned);
        self.next_req = self.next_req.wrapping_add(1) | 1 << 63;
        Some(Msg::new(
            self.next_req,
            target,
            Body::MgGather {
                groups,
                slot: source,
                from,
            },
        ))
    }

    /// The nodes a restore gathers from: this one first, then every other
    /// node not dead that owns a group. A node owning none holds only rows
    /// of groups it is taking over, which their live owner holds too (or,
    /// if that owner died, which a restore would be taking over).
    pub(super) fn restore_sources(&self) -> VecDeque<u16> {
        let mut sources = VecDeque::from([self.slot]);
        sources.extend(
            self.table
                .mns
                .iter()
                .filter(|m| m.slot != self.slot && m.state != State::Dead)
                .filter(|m| self.table.groups_of(m.slot) > 0)
                .map(|m| m.slot),
        );
        sources
    }

    /// Starts, advances or resends the restores the table gives this node,
    /// and their ready reports.
    pub(super) fn restore_step(&mut self, now: u64, out: &mut Vec<Out<P>>) {
        for r in self.restored.values_mut() {
            if let Some(msg) = r.msg.as_ref().filter(|_| now >= r.next_send) {
                r.next_send = now + PULL_RESEND_MS;
                out.push(Out::ToOn(msg.clone()));
            }
        }
        if self.restore.is_none() {
            // Groups given since the last gather began wait for the next.
            let groups: BTreeMap<u32, u64> = self
                .table
                .moves
                .iter()
                .filter(|m| m.to == self.slot && m.phase == MovePhase::Restoring)
                .filter(|m| !self.restored.contains_key(&m.group))
                .take(strata_store_protocol::wire::MAX_GATHER_GROUPS)
                .map(|m| (m.group, m.frozen_epoch))
                .collect();
            if groups.is_empty() {
                return;
            }
            self.restore = Some(Restore {
                groups,
                sources: self.restore_sources(),
                cursor: GatherCursor::default(),
                msg: None,
                next_send: 0,
            });
        }
        let Some(r) = self.restore.as_ref() else {
            return;
        };
        let source = r.sources.front().copied();
        let dead = source.is_some_and(|s| {
            self.table
                .mns
                .iter()
                .any(|n| n.slot == s && n.state == State::Dead)
        });
        if dead {
            // Died meanwhile: its rows are gone, and its own groups are
            // being restored too.
            self.next_source(now, out);
        } else if source == Some(self.slot) {
            // This node's own rows: read here, a page per tick.
            let groups: Vec<u32> = r.groups.keys().copied().collect();
            let from = r.cursor.clone();
            match self.serve_gather(&groups, self.slot, &from) {
                Ok(body) => self.on_gathered(now, body, out),
                Err(e) => {
                    tracing::warn!("gathering restored groups from this node: {}", e.report())
                }
            }
        } else if now >= r.next_send {
            match r.msg.clone() {
                Some(msg) => {
                    if let Some(r) = self.restore.as_mut() {
                        r.next_send = now + PULL_RESEND_MS;
                    }
                    out.push(Out::ToMeta(msg));
                }
                // Not asked yet (just started, or refused): ask, or move on
                // if that source owns nothing now.
                None => self.ask_source(now, out),
            }
        }
    }

    /// Asks the first source for the page at the cursor, skipping sources
    /// that own no group; reports every group when none is left.
    pub(super) fn ask_source(&mut self, now: u64, out: &mut Vec<Out<P>>) {
        loop {
            let Some(r) = self.restore.as_ref() else {
                return;
            };
            let Some(source) = r.sources.front().copied() else {
                self.report_restored(now, out);
                return;
            };
            if source == self.slot {
                // Read locally at the next tick.
                return;
            }
            let (groups, cursor) = (r.groups.keys().copied().collect(), r.cursor.clone());
            if let Some(msg) = self.gather_msg(groups, source, cursor) {
                if let Some(r) = self.restore.as_mut() {
                    r.msg = Some(msg.clone());
                    r.next_send = now + PULL_RESEND_MS;
                }
                out.push(Out::ToMeta(msg));
                return;
            }
            if let Some(r) = self.restore.as_mut() {
                r.sources.pop_front();
                r.cursor = GatherCursor::default();
            }
        }
    }

    /// The first source is done: on to the next.
    pub(super) fn next_source(&mut self, now: u64, out: &mut Vec<Out<P>>) {
        if let Some(r) = self.restore.as_mut() {
            r.sources.pop_front();
            r.cursor = GatherCursor::default();
            r.msg = None;
        }
        self.ask_source(now, out);
    }

    /// Every source is gathered: tell the orchestrator, for each group,
    /// under its restore's epoch; its answer (the table naming this node
    /// the plain owner) comes back to [`MnCore::handle`].
    pub(super) fn report_restored(&mut self, now: u64, out: &mut Vec<Out<P>>) {
        let Some(r) = self.restore.take() else {
            return;
        };
        for (g, epoch) in r.groups {
            self.next_req = self.next_req.wrapping_add(1) | 1 << 63;
            let msg = Msg::new(
                self.next_req,
                0,
                Body::MoveReport {
                    group: g,
                    to: self.slot,
                    ready: true,
                    epoch,
                },
            );
            out.push(Out::ToOn(msg.clone()));
            self.restored.insert(
                g,
                RestoreReport {
                    epoch,
                    msg: Some(msg),
                    next_send: now + PULL_RESEND_MS,
                },
            );
        }
    }

    /// A page of the gather (from another node, or read here): each row is
    /// stored in every group being restored that its name has an address in.
    pub(super) fn on_gathered(&mut self, now: u64, body: Body, out: &mut Vec<Out<P>>) {
        let Some(r) = self.restore.as_ref() else {
            return;
        };
        let Body::MgGathered { rows, next } = body else {
            // Refused (that node's table differs from ours, or it failed):
            // ask again shortly, as the table then says.
            if let Some(r) = self.restore.as_mut() {
                r.next_send = now + PULL_RETRY_MS;
                r.msg = None;
            }
            return;
        };
        for row in &rows {
            let name = match row {
                Row::Record(rec) => &rec.name,
                Row::Tomb { name, .. } => name,
            };
            for a in self.table.meta_addrs(name) {
                let Some(g) = self.table.layout.mg_of(a) else {
                    continue;
                };
                if !r.groups.contains_key(&g) {
                    continue;
                }
                if let Err(e) = self.db.apply_row(g, row) {
                    // The resend asks for the same page again.
                    tracing::warn!("storing a row of group {g} being restored: {}", e.report());
                    return;
                }
            }
        }
        match next {
            Some(cursor) => {
                if let Some(r) = self.restore.as_mut() {
                    r.cursor = cursor;
                    r.msg = None;
                }
                self.ask_source(now, out);
            }
            None => self.next_source(now, out),
        }
    }

    /// The orchestrator's answer to the ready report of group `g`.
    pub(super) fn on_report_reply(&mut self, g: u32, body: Body) {
        match body {
            Body::Table { bytes } => {
                // The group is this node's now: serve it at once.
                if let Ok(t) = Table::decode(&bytes) {
                    if t.epoch > self.table.epoch {
                        self.set_table(t);
                    }
                }
                if let Some(r) = self.restored.get_mut(&g) {
                    r.msg = None;
                }
            }
            _ => {
                // Refused (reassigned or restarted meanwhile): start over
                // as the table says.
                self.restored.remove(&g);
            }
        }
    }
}

//! Anti-entropy: the coordinator's digests of each group's rows against
//! the other copies, and the walk that sends the rows that differ.

use super::*;

impl<P: Clone + Eq + Hash> MnCore<P> {
    /// Whether this node may check the copies of the names group `mg`
    /// coordinates: it owns the group, which is not being handed over,
    /// sealed or restored (its rows may not be complete or current).
    pub(super) fn syncable(&self, mg: u32) -> bool {
        self.table.mg_owner.get(mg as usize) == Some(&self.slot)
            && !self.is_frozen(mg)
            && !self.is_sealed(mg)
            && self.table.move_of(mg).is_none()
    }

    /// Starts an anti-entropy pass when one is due and the last one's
    /// walks are done, then advances the walks by one page.
    pub(super) fn sync_step(&mut self, now: u64, out: &mut Vec<Out<P>>) {
        if self.sync_ms == 0 {
            return;
        }
        let next = *self.next_sync.get_or_insert(now + self.sync_ms);
        if now >= next && self.sync_walks.is_empty() {
            self.next_sync = Some(now + self.sync_ms);
            self.start_sync_pass(out);
        }
        self.sync_walk_step(out);
    }

    /// Compares the digests of every copy of the names this node
    /// coordinates: its own copies here, the others' through one
    /// [`Body::SyncDigest`] per metadata node (or more, above
    /// [`strata_store_protocol::wire::MAX_SYNC_SUMS`] sums). A (group, copy index) whose
    /// digest differs is walked name by name ([`MnCore::sync_walk_step`]).
    pub(super) fn start_sync_pass(&mut self, out: &mut Vec<Out<P>>) {
        self.sync_asks.clear();
        let groups: std::collections::BTreeSet<u32> = self
            .owned_groups()
            .into_iter()
            .filter(|&g| self.syncable(g))
            .collect();
        let t = &self.table;
        let owner = |h: u32| t.mg_owner.get(h as usize).copied();
        // Per slot holding copies: (coordinator group, copy index) -> sum.
        let mut theirs: BTreeMap<u16, BTreeMap<(u32, u8), u64>> = BTreeMap::new();
        // This node's own copies: (group, index) -> (coordinator's, copies').
        let mut local: BTreeMap<(u32, u8), (u64, u64)> = BTreeMap::new();
        let summed = self.db.with_sync_sums(|sums| {
            for (&(g, i, h, coordinator), &sum) in sums {
                let Some(s) = owner(h) else {
                    continue;
                };
                if coordinator && groups.contains(&g) {
                    if s == self.slot {
                        local.entry((g, i)).or_default().0 ^= sum;
                    } else {
                        *theirs.entry(s).or_default().entry((g, i)).or_insert(0) ^= sum;
                    }
                } else if !coordinator && s == self.slot && groups.contains(&g) {
                    local.entry((g, i)).or_default().1 ^= sum;
                }
            }
        });
        if summed.is_none() {
            // No digests: check every copy name by name.
            for g in groups {
                self.sync_walks.insert(
                    g,
                    SyncWalk {
                        only: None,
                        tombs: false,
                        after: String::new(),
                    },
                );
            }
            return;
        }
        for ((g, i), (ours, copies)) in local {
            if ours != copies {
                self.walk_copies(g, i, self.slot);
            }
        }
        for (s, sums) in theirs {
            // Addressed to a group the slot owns (it checks that).
            let Some(owned) = self.table.mg_owner.iter().position(|&o| o == s) else {
                continue;
            };
            let (target, _) = self.table.layout.mg_prefix(owned as u32);
            let sums: Vec<SyncSum> = sums
                .into_iter()
                .filter(|&(_, sum)| sum != 0)
                .map(|((group, index), sum)| SyncSum { group, index, sum })
                .collect();
            for chunk in sums.chunks(strata_store_protocol::wire::MAX_SYNC_SUMS) {
                self.next_req = self.next_req.wrapping_add(1) | 1 << 63;
                self.sync_asks.insert(self.next_req, s);
                let body = Body::SyncDigest {
                    sums: chunk.to_vec(),
                };
                out.push(Out::ToMeta(Msg::new(self.next_req, target, body)));
            }
        }
    }

    /// Schedules a name-by-name check of the copies with index `index`,
    /// held at slot `slot`, of the names group `g` coordinates. A walk of
    /// the group under way starts over to cover them from its first name.
    pub(super) fn walk_copies(&mut self, g: u32, index: u8, slot: u16) {
        if !self.syncable(g) {
            return;
        }
        let w = self.sync_walks.entry(g).or_insert(SyncWalk {
            only: Some(Default::default()),
            tombs: false,
            after: String::new(),
        });
        if let Some(only) = w.only.as_mut() {
            if only.insert((index, slot)) {
                w.tombs = false;
                w.after.clear();
            }
        }
    }

    /// The answer to one of this pass's digests, from `slot`: the pairs
    /// whose copies differ there.
    pub(super) fn on_sync_diff(&mut self, slot: u16, pairs: &[(u32, u8)]) {
        for &(g, i) in pairs {
            self.walk_copies(g, i, slot);
        }
    }

    /// Serves a [`Body::SyncDigest`]: the pairs whose digest over the
    /// copies held here (in groups this node owns) differs.
    pub(super) fn sync_diff(&self, sums: &[SyncSum]) -> Body {
        let t = &self.table;
        let wanted: std::collections::BTreeSet<(u32, u8)> =
            sums.iter().map(|s| (s.group, s.index)).collect();
        let mut mine: BTreeMap<(u32, u8), u64> = BTreeMap::new();
        self.db.with_sync_sums(|all| {
            for (&(g, i, h, coordinator), &sum) in all {
                if !coordinator
                    && t.mg_owner.get(h as usize) == Some(&self.slot)
                    && wanted.contains(&(g, i))
                {
                    *mine.entry((g, i)).or_insert(0) ^= sum;
                }
            }
        });
        let pairs = sums
            .iter()
            .filter(|s| mine.get(&(s.group, s.index)).copied().unwrap_or(0) != s.sum)
            .map(|s| (s.group, s.index))
            .collect();
        Body::SyncDiff { pairs }
    }

    /// One page of the first anti-entropy walk: for each coordinator row
    /// of its group (records, then tombstones of names with no newer
    /// record), the copies it checks are compared here (copies this node
    /// holds: brought up to date at once) or sent in a
    /// [`Body::SyncCheck`] per slot holding them.
    pub(super) fn sync_walk_step(&mut self, out: &mut Vec<Out<P>>) {
        let Some((&g, w)) = self.sync_walks.iter().next() else {
            return;
        };
        if !self.syncable(g) {
            self.sync_walks.remove(&g);
            return;
        }
        let (tombs, after, only) = (w.tombs, w.after.clone(), w.only.clone());
        let (rows, more) =
            match self
                .db
                .group_rows(g, tombs, &after, SYNC_PAGE_ROWS, PULL_PAGE_BYTES)
            {
                Ok(page) => page,
                Err(e) => {
                    // The next pass tries again.
                    tracing::warn!("anti-entropy walk of group {g}: {}", e.report());
                    self.sync_walks.remove(&g);
                    return;
                }
            };
        let mut batches: BTreeMap<u16, Vec<SyncEntry>> = BTreeMap::new();
        let mut last = None;
        for row in &rows {
            let (name, version, deleted) = match row {
                Row::Record(r) => (&r.name, r.version, false),
                Row::Tomb { name, version } => (name, *version, true),
            };
            last = Some(name.clone());
            if deleted
                && self
                    .db
                    .get(g, name)
                    .ok()
                    .flatten()
                    .is_some_and(|r| r.version > version)
            {
                continue; // posted again since: the record counts
            }
            let addrs = self.table.meta_addrs(name);
            if addrs.first().and_then(|&a| self.table.layout.mg_of(a)) != Some(g) {
                continue; // a copy kept here for another coordinator
            }
            for (i, &copy) in addrs.iter().enumerate().skip(1) {
                let Some(h) = self.table.layout.mg_of(copy) else {
                    continue;
                };
                let Some(&slot) = self.table.mg_owner.get(h as usize) else {
                    continue;
                };
                if only.as_ref().is_some_and(|o| !o.contains(&(i as u8, slot))) {
                    continue;
                }
                if slot == self.slot {
                    self.sync_local(g, h, name, version, deleted);
                } else {
                    batches.entry(slot).or_default().push(SyncEntry {
                        name: name.clone(),
                        copy,
                        version,
                        deleted,
                    });
                }
            }
        }
        if let Some(w) = self.sync_walks.get_mut(&g) {
            if more {
                w.after = last.unwrap_or_default();
            } else if !w.tombs {
                w.tombs = true;
                w.after.clear();
            } else {
                self.sync_walks.remove(&g);
            }
        }
        for entries in batches.into_values() {
            let mut page = Vec::new();
            let mut bytes = 0;
            for e in entries {
                let size = e.name.len() + 2 + 16 + 8 + 1;
                if !page.is_empty()
                    && (page.len() >= strata_store_protocol::wire::MAX_SYNC_ENTRIES
                        || bytes + size > SYNC_CHECK_BYTES)
                {
                    self.send_sync_check(std::mem::take(&mut page), out);
                    bytes = 0;
                }
                bytes += size;
                page.push(e);
            }
            if !page.is_empty() {
                self.send_sync_check(page, out);
            }
        }
    }

    pub(super) fn send_sync_check(&mut self, entries: Vec<SyncEntry>, out: &mut Vec<Out<P>>) {
        let Some(target) = entries.first().map(|e| e.copy) else {
            return;
        };
        self.next_req = self.next_req.wrapping_add(1) | 1 << 63;
        out.push(Out::ToMeta(Msg::new(
            self.next_req,
            target,
            Body::SyncCheck { entries },
        )));
    }

    /// Brings this node's own copy of `name` in group `h` up to the
    /// coordinator row in group `g` (both here), if it is behind.
    pub(super) fn sync_local(&self, g: u32, h: u32, name: &str, version: u64, deleted: bool) {
        if self.is_sealed(h)
            || !matches!(self.db.newest(h, name), Ok(c) if behind(c, version, deleted))
        {
            return;
        }
        let done = if deleted {
            self.db.apply_delete(h, name, version).map(|_| ())
        } else {
            match self.db.get(g, name) {
                Ok(Some(rec)) => self.db.apply_record(h, &rec).map(|_| ()),
                other => other.map(|_| ()),
            }
        };
        if let Err(e) = done {
            tracing::warn!(
                "anti-entropy: updating the copy of {name:?} in group {h}: {}",
                e.report()
            );
        }
    }

    /// Serves a [`Body::SyncCheck`]: for each entry naming a copy this
    /// node holds that is behind the coordinator's state, asks the
    /// coordinator for it with a [`Body::Refresh`] (answered by the
    /// usual `Replicate` or `Unreplicate`, applied by the version rules).
    /// Entries for copies elsewhere (the sender's table differs) or in a
    /// group sealed for a handover are skipped: the next pass sees them.
    pub(super) fn sync_check(&mut self, entries: &[SyncEntry], out: &mut Vec<Out<P>>) {
        for e in entries {
            let addrs = self.table.meta_addrs(&e.name);
            let Some(&coordinator) = addrs.first() else {
                continue;
            };
            if !addrs.iter().skip(1).any(|&a| a == e.copy) {
                continue;
            }
            let Some(mg) = self.owns(e.copy).filter(|&mg| !self.is_sealed(mg)) else {
                continue;
            };
            let Ok(copy) = self.db.newest(mg, &e.name) else {
                continue;
            };
            if !behind(copy, e.version, e.deleted) {
                continue;
            }
            self.next_req = self.next_req.wrapping_add(1) | 1 << 63;
            let body = Body::Refresh {
                name: e.name.clone(),
                version: copy.map_or(0, |(v, _)| v),
                copy: e.copy,
            };
            out.push(Out::ToMeta(Msg::new(self.next_req, coordinator, body)));
        }
    }
}

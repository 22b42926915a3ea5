//! Garbage collection's decisions, without I/O: whether a round may run
//! at all, which replicas are old enough to be looked up, and which of
//! those may be removed once the metadata nodes have answered.
//!
//! A round lists the aged replicas, asks every metadata node which of
//! them its records name, and removes the rest. Asking takes time, so the
//! round remembers its candidates, and any Put of one of their addresses
//! that starts meanwhile strikes it off ("touched"): a replica freed and
//! written again during the round is new, and only the metadata nodes'
//! next answer can say whether it is garbage.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use strata_store_protocol::addr::Addr;
use strata_store_protocol::table::{MnEntry, State, Table};

/// The metadata nodes a round must ask, or `None` when no round may run:
/// one of them is not up (a replica only it names would look
/// unreferenced), or there are none. A dead metadata node that owns
/// nothing any more is not asked: its groups were restored on the
/// others, and waiting for it would block every round for good.
pub fn asked(table: &Table) -> Option<Vec<MnEntry>> {
    let asked: Vec<MnEntry> = table.gc_mns().cloned().collect();
    if asked.is_empty() || asked.iter().any(|m| m.state != State::Up) {
        return None;
    }
    Some(asked)
}

/// A collection round's number, from [`Rounds::begin`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RoundId(u64);

/// The rounds under way on one node (usually one at most).
#[derive(Debug, Default)]
pub struct Rounds {
    next: u64,
    open: BTreeMap<RoundId, BTreeSet<Addr>>,
}

impl Rounds {
    /// Starts a round over `files` (address, age in ms): the replicas at
    /// least `grace_ms` old, less those being written (`in_flight`), are
    /// its candidates, returned in address order.
    pub fn begin(
        &mut self,
        files: impl IntoIterator<Item = (Addr, u64)>,
        grace_ms: u64,
        in_flight: &BTreeSet<Addr>,
    ) -> (RoundId, Vec<Addr>) {
        let candidates: BTreeSet<Addr> = files
            .into_iter()
            .filter(|&(addr, age_ms)| age_ms >= grace_ms && !in_flight.contains(&addr))
            .map(|(addr, _)| addr)
            .collect();
        let id = RoundId(self.next);
        self.next += 1;
        let list = candidates.iter().copied().collect();
        self.open.insert(id, candidates);
        (id, list)
    }

    /// A Put of `addr` started: no open round may remove it.
    pub fn touch(&mut self, addr: Addr) {
        for candidates in self.open.values_mut() {
            candidates.remove(&addr);
        }
    }

    /// Ends round `id` now that the metadata nodes named `referenced`:
    /// the candidates none named, never touched since and not being
    /// written now, may be removed. An unknown round removes nothing.
    pub fn finish(
        &mut self,
        id: RoundId,
        referenced: &HashSet<Addr>,
        in_flight: &BTreeSet<Addr>,
    ) -> Vec<Addr> {
        let Some(candidates) = self.open.remove(&id) else {
            return Vec::new();
        };
        candidates
            .into_iter()
            .filter(|a| !referenced.contains(a) && !in_flight.contains(a))
            .collect()
    }

    /// Drops round `id` without removing anything (a metadata node did
    /// not answer).
    pub fn cancel(&mut self, id: RoundId) {
        self.open.remove(&id);
    }

    /// Rounds under way.
    pub fn open(&self) -> usize {
        self.open.len()
    }
}

//! The storage node's decisions, as a deterministic core without I/O.
//!
//! [`StorageCore`] never touches a file, a socket or a clock: it is told
//! what arrived and what the disk holds, and answers what to do. It
//! decides whether a request for an address is taken (the address in this
//! node's prefix, the node not retired, the replica not already there or
//! being written, room for it), keeps the node's counters, runs each Put
//! through its [`PutMachine`] (store, forward down the chain, sync,
//! install, acknowledge), and decides which replicas a collection round
//! may remove ([`crate::storage::collect`]). The I/O shell
//! ([`crate::storage::replicas`]) executes its actions on real files and
//! sockets; the simulation (`tests/storage_sim.rs`) on simulated disks and
//! links.

use crate::storage::collect::{RoundId, Rounds};
use crate::storage::file::{table_len, FILE_HEADER};
use crate::storage::put::{PutAction, PutMachine};
use std::collections::{BTreeSet, HashSet};
use strata_store_protocol::addr::{fmt_addr, Addr, Layout};
use strata_store_protocol::data::Request;

/// What the connection does after a refusal is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterRefusal {
    /// Go on with the next request.
    Continue,
    /// Read and drop this many bytes (the refused Put's data and
    /// checksum), then go on: the stream stays in step.
    Drain(u64),
    /// Close the connection: a refused Put's data would follow and is
    /// not worth reading.
    Close,
}

/// A request refused, the reason sent back, and what follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The reason, for the peer.
    pub message: String,
    /// What the connection does next.
    pub after: AfterRefusal,
}

/// A storage node's state (see the module documentation).
#[derive(Debug)]
pub struct StorageCore {
    index: u16,
    capacity: u64,
    used: u64,
    objects: u64,
    retired: bool,
    /// Replicas whose Put is under way: never a second Put, never
    /// collected.
    in_flight: BTreeSet<Addr>,
    rounds: Rounds,
}

impl StorageCore {
    /// The core of storage node `index`, declaring `capacity` bytes, whose
    /// disk holds `objects` replica files of `used` bytes in all.
    pub fn new(index: u16, capacity: u64, used: u64, objects: u64) -> StorageCore {
        StorageCore {
            index,
            capacity,
            used,
            objects,
            retired: false,
            in_flight: BTreeSet::new(),
            rounds: Rounds::default(),
        }
    }

    /// The node's prefix index.
    pub fn index(&self) -> u16 {
        self.index
    }

    /// Replicas held.
    pub fn objects(&self) -> u64 {
        self.objects
    }

    /// Bytes of replica files held.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Configured capacity.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes still free: the capacity less what is stored, and never more
    /// than the file system has (`disk_free`).
    pub fn free(&self, disk_free: u64) -> u64 {
        self.capacity.saturating_sub(self.used).min(disk_free)
    }

    /// Whether the orchestrator has retired the node.
    pub fn is_retired(&self) -> bool {
        self.retired
    }

    /// Replicas whose Put is under way.
    pub fn in_flight(&self) -> &BTreeSet<Addr> {
        &self.in_flight
    }

    /// Whether `addr` lies in this node's prefix (and is not the prefix
    /// itself).
    pub fn owns(&self, layout: &Layout, addr: Addr) -> bool {
        layout.sn_of(addr) == Some(self.index) && addr as u64 != 0
    }

    /// Whether a request may be looked at further: its address must be
    /// this node's, and the very address the connection was made to
    /// (`addressed`, routed mode) when there is one; a retired node takes
    /// no Put. Gets and Frees of a retired node are still answered (a
    /// client holding an old record is told the replica is gone).
    pub fn check_request(
        &self,
        layout: &Layout,
        req: &Request,
        addressed: Option<Addr>,
    ) -> Result<(), Refusal> {
        let addr = req.addr();
        let is_put = matches!(req, Request::Put { .. });
        let after = if is_put {
            AfterRefusal::Close
        } else {
            AfterRefusal::Continue
        };
        if !self.owns(layout, addr) {
            let message = format!(
                "replica address {} is not in this storage node's prefix {}/64",
                fmt_addr(addr),
                fmt_addr(layout.sn_prefix(self.index))
            );
            return Err(Refusal { message, after });
        }
        if let Some(a) = addressed.filter(|&a| a != addr) {
            let message = format!(
                "connection made to replica address {} but the request names {}",
                fmt_addr(a),
                fmt_addr(addr)
            );
            return Err(Refusal { message, after });
        }
        if is_put && self.retired {
            let message = "this storage node is retired: it takes no replica".to_string();
            return Err(Refusal { message, after });
        }
        Ok(())
    }

    /// Admits a Put of `size` bytes at `addr` (checked by
    /// [`StorageCore::check_request`]), to be forwarded along `chain`;
    /// `coordinator` is the tenant's, told if the Put is abandoned.
    /// `exists` says whether the replica file is there already and
    /// `disk_free` what the file system has. Returns the Put's machine and
    /// its first actions; the Put is in flight until
    /// [`StorageCore::end_put`].
    pub fn admit_put(
        &mut self,
        addr: Addr,
        size: u64,
        chain: Vec<Addr>,
        coordinator: Option<Addr>,
        exists: bool,
        disk_free: u64,
    ) -> Result<(PutMachine, Vec<PutAction>), Refusal> {
        let drain = AfterRefusal::Drain(size.saturating_add(4));
        let refuse = |message: String| {
            Err(Refusal {
                message,
                after: drain,
            })
        };
        if exists {
            return refuse(format!("replica {} already exists", fmt_addr(addr)));
        }
        if self.in_flight.contains(&addr) {
            return refuse(format!(
                "replica {} is being written by another Put",
                fmt_addr(addr)
            ));
        }
        let free = self.free(disk_free);
        if size > free {
            return refuse(format!("no room for {size} bytes ({free} free)"));
        }
        self.in_flight.insert(addr);
        self.rounds.touch(addr);
        Ok(PutMachine::start(addr, size, chain, coordinator))
    }

    /// The Put's file is in place (its [`PutAction::Install`] is done):
    /// counts it, and returns what the Put does next.
    pub fn installed(&mut self, put: &mut PutMachine) -> Vec<PutAction> {
        let actions = put.installed();
        if !actions.is_empty() {
            // The file's whole length: header, data and chunk table.
            let table = table_len(put.size()).unwrap_or(0);
            let file = (put.size() + FILE_HEADER as u64).saturating_add(table);
            self.used = self.used.saturating_add(file);
            self.objects += 1;
        }
        actions
    }

    /// The Put of `put` is over (replied, refused or broken): it is no
    /// longer in flight.
    pub fn end_put(&mut self, put: &PutMachine) {
        self.in_flight.remove(&put.addr());
    }

    /// A replica file of `file_bytes` was removed (Free, collection or
    /// retirement).
    pub fn removed(&mut self, file_bytes: u64) {
        self.used = self.used.saturating_sub(file_bytes);
        self.objects = self.objects.saturating_sub(1);
    }

    /// The orchestrator retired the node after its drain, so no record
    /// names any replica it holds: Puts are refused from now on, and the
    /// shell frees every replica.
    pub fn retire(&mut self) {
        self.retired = true;
    }

    /// Starts a collection round over the replica `files` (address, age
    /// in ms): returns its number and the candidates to look up, those at
    /// least `grace_ms` old and not being written.
    pub fn begin_collection(
        &mut self,
        files: impl IntoIterator<Item = (Addr, u64)>,
        grace_ms: u64,
    ) -> (RoundId, Vec<Addr>) {
        self.rounds.begin(files, grace_ms, &self.in_flight)
    }

    /// Ends round `id` with the addresses the metadata nodes named: the
    /// replicas to remove (never one named, written again since the
    /// round began, or being written).
    pub fn finish_collection(&mut self, id: RoundId, referenced: &HashSet<Addr>) -> Vec<Addr> {
        self.rounds.finish(id, referenced, &self.in_flight)
    }

    /// Drops round `id`, removing nothing.
    pub fn cancel_collection(&mut self, id: RoundId) {
        self.rounds.cancel(id);
    }
}

#[cfg(test)]
mod tests;

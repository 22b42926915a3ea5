//! Deterministic simulation of the metadata protocol.
//!
//! The real metadata-node state machine ([`MnCore`], over real redb files)
//! and the real client calls ([`Call`]) run on a simulated network driven
//! by a seeded generator: messages are lost, duplicated and reordered, and
//! metadata nodes crash (losing everything not in their database) and
//! restart. Each client works on its own names sequentially, so an oracle
//! knows, for every name, the set of states the store may be in (an
//! unacknowledged operation may or may not have happened). Checks:
//! - every Get returns one of those states, whole (the record's size,
//!   replicas and metadata addresses are those of the Post that made it);
//!   with W_m = N_m, a Get after an acknowledged Delete never finds the
//!   object (no stale read);
//! - after healing, every name holds exactly its last acknowledged state:
//!   no acknowledged write is lost;
//! - no replica of a live acknowledged object was ever freed.
//!
//! A variant also declares a storage node dead midway: the metadata nodes
//! start repair copies (which the simulation completes or fails at
//! random), and the checks become: a record holds the Post's replicas
//! less those on the dead node plus repair copies, and after healing every
//! acknowledged object has N_d replicas, none on the dead node.
//!
//! Another adds a fourth metadata node midway through the real
//! orchestrator ([`OnCore`]): it takes over groups by copying them while
//! messages are lost and nodes crash; each node sees the orchestrator's
//! table after its own random delay. The same checks hold, and after
//! healing the new node owns its share of the groups.
//!
//! Drains of a storage node (the one most live objects have a replica on)
//! run through the orchestrator too: alone, cancelled and started again,
//! or with a metadata node going down meanwhile; the node is retired only
//! once no row names it, and after healing no row names it.
//!
//! After every step, every running node's, the orchestrator's and their
//! tables' invariants are checked (`check_invariants`), and no table goes
//! back (`Table::check_successor`). In runs of odd seeds the metadata
//! nodes' databases live on simulated disks ([`Disk`]): a crash loses the
//! writes not synced, may let one land torn or corrupted, and may strike
//! in the middle of a commit; the same checks hold.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::rc::Rc;
use strata_store::metadata::database::MetaDb;
use strata_store::metadata::faulty_storage::{Disk, Fault};
use strata_store::metadata::state::{MnCore, Out};
use strata_store::orchestrator::state::OnCore;
use strata_store_client::client::{Call, Step};
use strata_store_protocol::addr::{Layout, DEFAULT_CLUSTER_PREFIX};
use strata_store_protocol::class::StorageClass;
use strata_store_protocol::table::{Device, MnEntry, Params, SnEntry, State, Table};
use strata_store_protocol::wire::{Body, Code, Fragments, Msg, Record, MAX_INLINE};

const MNS: u16 = 3;
const CLIENTS: u32 = 4;
const NAMES_PER_CLIENT: u32 = 3;
const MN_BASE: u32 = 1000;
/// The orchestrator's network identity.
const ON_ID: u32 = 3000;
/// Metadata slots including the one a handover adds.
const ALL_MNS: usize = 4;

/// xorshift64*: small, seeded, reproducible.
struct Rng(u64);
impl Rng {
    /// A generator whose run differs for every seed. The seed goes
    /// through splitmix64 (a bijection, so distinct seeds stay distinct
    /// and neighbours get unrelated states) rather than being forced odd,
    /// which made seeds 2k and 2k+1 the same run; xorshift needs a
    /// non-zero state, and only one seed maps to zero.
    fn new(seed: u64) -> Rng {
        Rng(strata_store_protocol::addr::splitmix64(seed).max(1))
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Replication where a metadata write waits for every copy (W_m = N_m =
/// 3) and data for one of two replicas: the setting of the handover,
/// restore and stand-in scenarios.
fn every_metadata_copy_acks() -> Params {
    Params {
        n_m: 3,
        w_m: 3,
        n_d: 2,
        w_d: 1,
        data_fragments: 0,
    }
}

fn table(params: Params) -> Table {
    let layout = Layout::new(DEFAULT_CLUSTER_PREFIX, 4);
    Table {
        epoch: 1,
        layout,
        routed: false,
        params,
        buckets: vec![],
        mns: (0..MNS)
            .map(|slot| MnEntry {
                uuid: slot as u64 + 1,
                slot,
                endpoint: strata_store_protocol::wire::no_endpoint(),
                state: State::Up,
            })
            .collect(),
        mg_owner: strata_store::orchestrator::state::initial_owners(layout.mg_count(), MNS),
        sns: (1..=4)
            .map(|index| SnEntry {
                uuid: 100 + index as u64,
                index,
                endpoint: strata_store_protocol::wire::no_endpoint(),
                capacity: 1 << 40,
                free: 1 << 40,
                objects: 0,
                device: Device::Ssd,
                state: State::Up,
            })
            .collect(),
        moves: vec![],
        stand_ins: vec![],
        drains: vec![],
        keys: Vec::new(),
        on_keys: None,
        revoked: Vec::new(),
    }
}

/// A possible state of a name: absent, or the Post with this token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Obj {
    Absent,
    Posted(u32),
    /// Posted empty (`PostInline` without bytes): a record of size 0 and
    /// no replica.
    Empty,
    /// Posted inline (`PostInline`) with the bytes [`inline_data_of`]
    /// this token: a record holding them, with no replica.
    Inline(u32),
}

/// The bytes of the inline Post `token`: 1 to [`MAX_INLINE`] of them,
/// their length varying with it.
fn inline_data_of(token: u32) -> Vec<u8> {
    let length = token as usize * 977 % MAX_INLINE + 1;
    (0..length)
        .map(|i| ((i as u32 * 31) ^ token) as u8)
        .collect()
}

/// The attributes of the inline Post `token`, which name it (its record's
/// CRC-32C is its bytes').
fn inline_attributes_of(token: u32) -> Vec<u8> {
    format!("inline {token}").into_bytes()
}

/// Every fourth inline Post asks for `replicated(4)`, which three metadata
/// copies cannot hold without losing redundancy: the coordinator refuses
/// it, and nothing changes. The others take the bucket's class (N_d of 2
/// or 3 replicas, which three copies can hold) and are kept inline.
fn inline_class_of(token: u32) -> Option<StorageClass> {
    token
        .is_multiple_of(4)
        .then_some(StorageClass::Replicated { copies: 4 })
}

fn size_of(token: u32) -> u64 {
    token as u64 * 7 + 1
}

/// Every third Post is erasure-coded, in `ec(2,1)`: its plan places three
/// fragments, its commit gives their checksums, and repair rebuilds them
/// in place ([`Out::Rebuild`]).
fn coded(token: u32) -> bool {
    token.is_multiple_of(3)
}

/// The fragment checksums an erasure-coded Post `token` commits.
fn fragment_crcs_of(token: u32) -> Vec<u32> {
    (1..=3).map(|i| token.rotate_left(i) ^ i).collect()
}

/// The attributes every empty object of the simulation is posted with.
const EMPTY_ATTRIBUTES: &[u8] = b"empty";

/// The attributes of the Post `token`: their length varies with it, up
/// to the largest a record holds, so handovers, repairs and gathers
/// carry records of every size.
fn attributes_of(token: u32) -> Vec<u8> {
    let length = token as usize * 131 % (strata_store_protocol::wire::MAX_ATTRIBUTES + 1);
    (0..length).map(|i| (i as u32 ^ token) as u8).collect()
}

enum Op {
    Idle,
    PostBegin { name: String, token: u32 },
    PostCommit { name: String, token: u32 },
    PostInline { name: String, token: Option<u32> },
    Delete { name: String },
    Get { name: String },
}

struct Client {
    op: Op,
    call: Option<Call>,
    deadline: Option<u64>,
}

struct Event {
    at: u64,
    seq: u64,
    to: u32,
    from: u32,
    msg: Msg,
}
impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

struct Sim {
    seed: u64,
    rng: Rng,
    /// Draws the storage faults, apart from `rng`, so that a run with
    /// them stays close to the run of the same seed without.
    fault_rng: Rng,
    now: u64,
    seq: u64,
    table: Table,
    dir: tempfile::TempDir,
    mns: Vec<Option<MnCore<u32>>>,
    down_until: Vec<u64>,
    net: BinaryHeap<Reverse<Event>>,
    loss: u64,
    dup: u64,
    clients: Vec<Client>,
    possible: BTreeMap<String, BTreeSet<Obj>>,
    last_acked: BTreeMap<String, Obj>,
    plans: BTreeMap<u32, Vec<u128>>,
    freed: BTreeSet<u128>,
    next_token: u32,
    strict_reads: bool,
    acked_ops: u64,
    checked_gets: u64,
    /// Inline Posts acknowledged, and refused for their class.
    inline_acked: u64,
    inline_refused: u64,
    crashes: u64,
    /// When (ms) the target storage node is declared dead, if ever.
    kill_sn_at: Option<u64>,
    /// When the target storage node is removed through the orchestrator
    /// (drained, then retired), if it is.
    drain_sn_at: Option<u64>,
    /// When the target's drain is cancelled (after an orchestrator
    /// restart), if it is.
    cancel_drain_at: Option<u64>,
    /// When the target is removed again after the cancel, if it is.
    redrain_sn_at: Option<u64>,
    /// The storage node declared dead or removed: the one naming the most
    /// live objects when that first happens (a fixed node could hold no
    /// replica by then, and the run would test nothing).
    target: u16,
    /// Live objects with a replica on the target when it was chosen.
    target_held: usize,
    /// Whether the target's drain is cancelled and not started again yet.
    cancelled: bool,
    /// Posts planned with a replica on the target while its drain was
    /// cancelled.
    placed_while_cancelled: u64,
    /// Repair copies under way: (done at, MN slot, name, version, targets).
    copies: Vec<(u64, u16, String, u64, Vec<u128>)>,
    /// Addresses written by copies reported successful.
    copied: BTreeSet<u128>,
    repairs_done: u64,
    /// The orchestrator, in runs with a handover.
    on: Option<OnCore>,
    /// When (ms) a fourth metadata node joins, if ever.
    add_mn_at: Option<u64>,
    /// Metadata nodes in the cluster (3, then 4).
    slots: u16,
    /// When (ms) a metadata node crashes for good, and which, if ever: the
    /// orchestrator then runs its clock (heartbeats from every running
    /// node) and declares it dead.
    kill_mn_at: Option<(u64, u16)>,
    /// The slot that crashed for good.
    gone: Option<u16>,
    /// When (ms) the slot that crashed starts again (same database), if
    /// ever: it was down, not dead.
    revive_mn_at: Option<u64>,
    /// Orchestrator ticks that saw a group being restored.
    restoring_ticks: u64,
    /// Replication messages naming the drained target sent to the slot
    /// that crashed for good while it was down.
    lost_to_gone: u64,
    /// A slot to crash for good (as `kill_mn_at` does) on the first
    /// replication message naming the drained target sent to it.
    crash_on_resend: Option<u16>,
    /// The anti-entropy pause of every metadata node, if not the default.
    sync_ms: Option<u64>,
    /// Refresh requests sent (stale metadata copies asking their
    /// coordinator).
    refreshes: u64,
    /// Each metadata slot's simulated disk, in runs with storage faults
    /// (odd seeds); empty when the nodes use files.
    disks: Vec<Disk>,
    /// Storage faults seen: crashes that struck mid-write, torn writes,
    /// corrupted writes, opens redb repaired.
    faults: StorageFaults,
    /// The table each slot held at the last check (kept across its
    /// restarts), and the orchestrator's: epochs only go up.
    seen_tables: Vec<Option<Table>>,
    seen_on_table: Option<Table>,
}

/// Storage faults a run injected, and what redb did about them.
#[derive(Clone, Copy, Debug, Default)]
struct StorageFaults {
    /// Crashes that struck in the middle of a write or sync.
    mid_write: u64,
    /// Crashes that let part of an unsynced write reach the disk.
    torn: u64,
    /// Crashes that let an unsynced write reach the disk damaged.
    corrupted: u64,
    /// Opens after a crash where redb repaired the file.
    repaired_opens: u64,
    /// Unsynced writes lost at crashes.
    lost_writes: u64,
}

impl Sim {
    /// An orchestrator for this run's table, in its directory.
    fn orchestrator(&self) -> OnCore {
        OnCore::open(&self.dir.path().join("on.redb"), self.table.clone(), MNS, 0).unwrap()
    }

    /// A slot that does not hold every metadata address of any name: a
    /// name living on it alone would have no copy left when it is lost.
    fn slot_no_name_lives_on_alone(&self) -> u16 {
        let t = &self.table;
        (0..MNS)
            .find(|&slot| {
                self.possible.keys().all(|name| {
                    t.meta_addrs(name)
                        .iter()
                        .any(|&a| t.mn_for(a).map(|m| m.slot) != Some(slot))
                })
            })
            .expect("a slot no name lives on alone")
    }

    fn new(seed: u64, params: Params) -> Sim {
        let base = std::path::Path::new("/dev/shm");
        let dir = if base.is_dir() {
            tempfile::tempdir_in(base).unwrap()
        } else {
            tempfile::tempdir().unwrap()
        };
        let table = table(params);
        let disks = if seed % 2 == 1 {
            (0..ALL_MNS).map(|_| Disk::new()).collect()
        } else {
            Vec::new()
        };
        let mut sim = Sim {
            seed,
            disks,
            faults: StorageFaults::default(),
            seen_tables: vec![None; ALL_MNS],
            seen_on_table: None,
            rng: Rng::new(seed),
            fault_rng: Rng::new(!seed),
            now: 0,
            seq: 0,
            table,
            dir,
            mns: (0..ALL_MNS).map(|_| None).collect(),
            down_until: vec![0; ALL_MNS],
            net: BinaryHeap::new(),
            loss: 10,
            dup: 5,
            clients: (0..CLIENTS)
                .map(|_| Client {
                    op: Op::Idle,
                    call: None,
                    deadline: None,
                })
                .collect(),
            possible: BTreeMap::new(),
            last_acked: BTreeMap::new(),
            plans: BTreeMap::new(),
            freed: BTreeSet::new(),
            next_token: 1,
            strict_reads: params.w_m == params.n_m,
            on: None,
            add_mn_at: None,
            slots: MNS,
            kill_mn_at: None,
            gone: None,
            revive_mn_at: None,
            restoring_ticks: 0,
            lost_to_gone: 0,
            crash_on_resend: None,
            sync_ms: None,
            refreshes: 0,
            acked_ops: 0,
            checked_gets: 0,
            inline_acked: 0,
            inline_refused: 0,
            crashes: 0,
            kill_sn_at: None,
            drain_sn_at: None,
            cancel_drain_at: None,
            redrain_sn_at: None,
            target: 4,
            target_held: 0,
            cancelled: false,
            placed_while_cancelled: 0,
            copies: Vec::new(),
            copied: BTreeSet::new(),
            repairs_done: 0,
        };
        for c in 0..CLIENTS {
            for k in 0..NAMES_PER_CLIENT {
                let name = format!("c{c}/n{k}");
                sim.possible.insert(name.clone(), [Obj::Absent].into());
                sim.last_acked.insert(name, Obj::Absent);
            }
        }
        for s in 0..MNS {
            sim.start_mn(s);
        }
        sim
    }

    fn start_mn(&mut self, slot: u16) {
        let db = match self.disks.get(slot as usize) {
            None => MetaDb::open(&self.dir.path().join(format!("mn{slot}.redb"))).unwrap(),
            Some(disk) => {
                let repaired = Rc::new(Cell::new(false));
                let flag = repaired.clone();
                // redb's promise: every commit made with `Durability::
                // Immediate` survives a crash, whatever happened to the
                // writes not synced yet; so the database opens.
                let db = MetaDb::open_with_backend(disk.backend(), move |_| flag.set(true))
                    .unwrap_or_else(|e| {
                        panic!("seed {}: slot {slot} after a crash: {e}", self.seed)
                    });
                self.faults.repaired_opens += u64::from(repaired.get());
                db
            }
        };
        let nonce = self.rng.next();
        let mut core = MnCore::new(db, self.table.clone(), slot, nonce);
        if let Some(ms) = self.sync_ms {
            core.set_sync_interval(ms);
        }
        self.mns[slot as usize] = Some(core);
        self.check_node(slot, "a restart");
    }

    /// Crashes the metadata node in `slot`: it loses everything not in its
    /// database, and on a simulated disk the writes not synced yet, some
    /// torn or corrupted.
    fn crash_mn(&mut self, slot: u16) {
        if let Some(disk) = self.disks.get(slot as usize).cloned() {
            let fault = match self.fault_rng.below(3) {
                0 => Fault::Lose,
                1 => Fault::Tear(self.fault_rng.next()),
                _ => Fault::Corrupt(self.fault_rng.next()),
            };
            // The disk first: whatever the dropped node writes is lost.
            let report = disk.crash(fault);
            self.faults.lost_writes += report.lost_writes as u64;
            self.faults.torn += u64::from(report.torn_bytes > 0);
            self.faults.corrupted += u64::from(report.corrupted_at.is_some());
        }
        self.mns[slot as usize] = None;
        self.check_all("a crash");
    }

    /// Hands the outputs of a step of the node in `slot` to the network,
    /// unless its disk failed during the step: then the node died there,
    /// and nothing it decided leaves.
    fn core_outs(&mut self, slot: u16, outs: Vec<Out<u32>>, what: &str) {
        if self.reap_failed(slot) {
            return;
        }
        self.outs(slot, outs);
        self.check_node(slot, what);
    }

    /// Crashes the node in `slot` if an armed crash struck its disk (its
    /// downtime was drawn when it was armed); returns whether it did.
    fn reap_failed(&mut self, slot: u16) -> bool {
        let failed = self
            .disks
            .get(slot as usize)
            .is_some_and(|d| d.has_failed());
        if !failed || self.mns[slot as usize].is_none() {
            return false;
        }
        self.faults.mid_write += 1;
        self.crashes += 1;
        self.down_until[slot as usize] += self.now;
        self.crash_mn(slot);
        true
    }

    /// Fails the run, naming the seed, the time and the step, unless the
    /// node in `slot` (if running) holds its invariants and its table is
    /// no older than the one it held before.
    fn check_node(&mut self, slot: u16, what: &str) {
        let Some(core) = self.mns[slot as usize].as_ref() else {
            return;
        };
        let seen = &mut self.seen_tables[slot as usize];
        let result = core.check_invariants().and_then(|()| {
            seen.as_ref()
                .map_or(Ok(()), |t| core.table().check_successor(t))
        });
        if let Err(e) = result {
            panic!(
                "seed {}, {} ms, after {what}: metadata slot {slot}: {e}",
                self.seed, self.now
            );
        }
        if seen.as_ref().is_none_or(|t| t.epoch != core.table().epoch) {
            *seen = Some(core.table().clone());
        }
    }

    /// As [`Sim::check_node`], for the orchestrator.
    fn check_on(&mut self, what: &str) {
        let Some(on) = self.on.as_ref() else {
            return;
        };
        let result = on.check_invariants().and_then(|()| {
            self.seen_on_table
                .as_ref()
                .map_or(Ok(()), |t| on.table().check_successor(t))
        });
        if let Err(e) = result {
            panic!(
                "seed {}, {} ms, after {what}: orchestrator: {e}",
                self.seed, self.now
            );
        }
        if self
            .seen_on_table
            .as_ref()
            .is_none_or(|t| t.epoch != on.table().epoch)
        {
            self.seen_on_table = Some(on.table().clone());
        }
    }

    /// Checks every running node and the orchestrator, once the nodes
    /// whose disk failed (an armed crash struck outside a step that
    /// answers, as in a table change) are crashed.
    fn check_all(&mut self, what: &str) {
        for slot in 0..ALL_MNS as u16 {
            self.reap_failed(slot);
        }
        for slot in 0..ALL_MNS as u16 {
            self.check_node(slot, what);
        }
        self.check_on(what);
    }

    /// Sets every metadata node's anti-entropy pause, now and after
    /// restarts.
    fn set_sync_interval(&mut self, ms: u64) {
        self.sync_ms = Some(ms);
        for core in self.mns.iter_mut().flatten() {
            core.set_sync_interval(ms);
        }
    }

    /// Every metadata copy of every name, on the node that owns its
    /// address, holds what the name's coordinator holds: the same record,
    /// or no record at all where the coordinator has none (deleted, or
    /// never posted). Returns how many copies were compared.
    fn check_copies_match_coordinators(&self, seed: u64) -> usize {
        let t = &self.table;
        let row = |addr: u128, name: &str| {
            let slot = t.mn_for(addr).unwrap().slot as usize;
            let mg = t.layout.mg_of(addr).unwrap();
            let db = self.mns[slot].as_ref().expect("every node runs").db();
            (db.get(mg, name).unwrap(), db.tombstone(mg, name).unwrap())
        };
        let mut compared = 0;
        for name in self.possible.keys() {
            let addrs = t.meta_addrs(name);
            let (coord, coord_tomb) = row(addrs[0], name);
            for &a in &addrs[1..] {
                let (copy, tomb) = row(a, name);
                match &coord {
                    Some(r) => assert_eq!(
                        copy.as_ref(),
                        Some(r),
                        "seed {seed}: {name}: the copy at {a:x} differs from its coordinator's"
                    ),
                    None => {
                        assert_eq!(
                            copy, None,
                            "seed {seed}: {name}: deleted, but a copy remains at {a:x}"
                        );
                        assert!(
                            tomb >= coord_tomb,
                            "seed {seed}: {name}: tombstone {tomb} < {coord_tomb}"
                        );
                    }
                }
                compared += 1;
            }
        }
        compared
    }

    fn send(&mut self, from: u32, to: u32, msg: Msg) {
        if self.rng.chance(self.loss) {
            return;
        }
        let copies = if self.rng.chance(self.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let at = self.now + 1 + self.rng.below(50);
            self.seq += 1;
            self.net.push(Reverse(Event {
                at,
                seq: self.seq,
                to,
                from,
                msg: msg.clone(),
            }));
        }
    }

    fn mn_of(&self, target: u128) -> Option<u32> {
        self.table.mn_for(target).map(|m| MN_BASE + m.slot as u32)
    }

    fn outs(&mut self, slot: u16, outs: Vec<Out<u32>>) {
        for o in outs {
            match o {
                Out::Reply(to, msg) => self.send(MN_BASE + slot as u32, to, msg),
                Out::ToMeta(msg) => {
                    if matches!(msg.body, Body::Refresh { .. }) {
                        self.refreshes += 1;
                    }
                    if let Some(to) = self.mn_of(msg.target) {
                        self.count_lost_naming_target(to, &msg);
                        self.send(MN_BASE + slot as u32, to, msg);
                    }
                }
                Out::Free(addr) => {
                    self.freed.insert(addr);
                }
                Out::ToOn(msg) => self.send(MN_BASE + slot as u32, ON_ID, msg),
                Out::Copy {
                    name,
                    version,
                    targets,
                    ..
                } => {
                    assert!(
                        self.kill_sn_at.is_some() || self.drain_sn_at.is_some(),
                        "repair without a dead or drained node"
                    );
                    let at = self.now + 5 + self.rng.below(200);
                    self.copies.push((at, slot, name, version, targets));
                }
                Out::Rebuild {
                    record, targets, ..
                } => {
                    assert!(
                        self.kill_sn_at.is_some() || self.drain_sn_at.is_some(),
                        "rebuild without a dead or drained node"
                    );
                    let at = self.now + 5 + self.rng.below(200);
                    self.copies
                        .push((at, slot, record.name, record.version, targets));
                }
            }
        }
    }

    fn deliver(&mut self, ev: Event) {
        if ev.to == ON_ID {
            let Some(on) = self.on.as_mut() else {
                return;
            };
            let reply = on.handle(self.now, &ev.msg);
            self.check_on("a message to the orchestrator");
            let on = self.on.as_ref().expect("checked above");
            // The network (and the clients) route by the newest table.
            let was_retiring = self.table.retiring(self.target);
            self.table = on.table().clone();
            if was_retiring && !self.table.retiring(self.target) {
                self.check_none_names(self.target);
            }
            self.send(ON_ID, ev.from, reply);
        } else if ev.to >= MN_BASE {
            let slot = (ev.to - MN_BASE) as u16;
            let now = self.now;
            let Some(core) = self.mns[slot as usize].as_mut() else {
                return; // crashed: the datagram is lost
            };
            let outs = core.handle(now, ev.from, ev.msg);
            self.core_outs(slot, outs, "a message");
        } else {
            self.client_reply(ev.to, ev.msg);
        }
    }

    fn client_send(&mut self, c: u32, step: Step) {
        match step {
            Step::Send(msg, deadline) => {
                self.clients[c as usize].deadline = Some(deadline);
                if let Some(to) = self.mn_of(msg.target) {
                    self.send(c, to, msg);
                }
            }
            Step::Done(result) => {
                self.clients[c as usize].call = None;
                self.clients[c as usize].deadline = None;
                self.finish(c, result);
            }
        }
    }

    fn client_reply(&mut self, c: u32, msg: Msg) {
        let now = self.now;
        let Some(call) = self.clients[c as usize].call.as_mut() else {
            return;
        };
        if let Some(step) = call.on_reply(now, msg) {
            self.client_send(c, step);
        }
    }

    fn start_call(&mut self, c: u32, targets: Vec<u128>, body: Body, attempts: u32, fall: bool) {
        let mut call = Call::new(self.rng.next() >> 1, targets, body, attempts, 400);
        if fall {
            call = call.falling_through();
        }
        let step = call.start(self.now);
        self.clients[c as usize].call = Some(call);
        self.client_send(c, step);
    }

    fn begin_op(&mut self, c: u32) {
        let name = format!("c{c}/n{}", self.rng.below(NAMES_PER_CLIENT as u64));
        let addrs = self.table.meta_addrs(&name);
        let roll = self.rng.below(100);
        if roll < 15 {
            // A third of them empty, the others with bytes.
            let token = (roll >= 5).then(|| {
                self.next_token += 1;
                self.next_token - 1
            });
            let data = token.map(inline_data_of).unwrap_or_default();
            let body = Body::PostInline {
                name: name.clone(),
                class: token.and_then(inline_class_of),
                crc: crc32c::crc32c(&data),
                data,
                attributes: token.map_or(EMPTY_ATTRIBUTES.to_vec(), inline_attributes_of),
            };
            self.clients[c as usize].op = Op::PostInline { name, token };
            self.start_call(c, vec![addrs[0]], body, 20, false);
        } else if roll < 50 {
            let token = self.next_token;
            self.next_token += 1;
            let class = coded(token).then_some(StorageClass::ErasureCoded { data: 2, parity: 1 });
            let body = Body::PostBegin {
                name: name.clone(),
                size: size_of(token),
                class,
            };
            self.clients[c as usize].op = Op::PostBegin { name, token };
            self.start_call(c, vec![addrs[0]], body, 5, false);
        } else if roll < 70 {
            let body = Body::Delete {
                name: name.clone(),
                if_version: 0,
                keep_data: false,
            };
            self.clients[c as usize].op = Op::Delete { name };
            self.start_call(c, vec![addrs[0]], body, 20, false);
        } else {
            let body = Body::Get { name: name.clone() };
            self.clients[c as usize].op = Op::Get { name };
            self.start_call(c, addrs, body, 5, true);
        }
    }

    fn settle(&mut self, name: &str, state: Obj) {
        self.inline_acked += u64::from(matches!(state, Obj::Inline(_)));
        self.possible.insert(name.to_string(), [state].into());
        self.last_acked.insert(name.to_string(), state);
        self.acked_ops += 1;
    }

    fn maybe(&mut self, name: &str, state: Obj) {
        self.possible.get_mut(name).unwrap().insert(state);
    }

    fn finish(&mut self, c: u32, result: Result<Body, strata_store_protocol::Error>) {
        let op = std::mem::replace(&mut self.clients[c as usize].op, Op::Idle);
        match op {
            Op::Idle => {}
            Op::PostBegin { name, token } => match result {
                Ok(Body::PostPlan {
                    version,
                    replicas,
                    data_fragments,
                    ..
                }) => {
                    assert_eq!(
                        (data_fragments, replicas.len()),
                        if coded(token) {
                            (2, 3)
                        } else {
                            (0, replicas.len())
                        },
                        "{name}: the plan of Post {token}"
                    );
                    if self.cancelled
                        && replicas
                            .iter()
                            .any(|&a| self.table.layout.sn_of(a) == Some(self.target))
                    {
                        self.placed_while_cancelled += 1;
                    }
                    self.plans.insert(token, replicas);
                    let body = Body::PostCommit {
                        name: name.clone(),
                        version,
                        crc: token,
                        attributes: attributes_of(token),
                        fragment_crcs: match coded(token) {
                            true => fragment_crcs_of(token),
                            false => Vec::new(),
                        },
                    };
                    let coord = self.table.meta_addrs(&name)[0];
                    self.clients[c as usize].op = Op::PostCommit { name, token };
                    self.start_call(c, vec![coord], body, 20, false);
                }
                Ok(other) => panic!("PostBegin answered {other:?}"),
                Err(_) => {} // no Post started
            },
            Op::PostCommit { name, token, .. } => match result {
                Ok(Body::Done { .. }) => self.settle(&name, Obj::Posted(token)),
                Ok(other) => panic!("PostCommit answered {other:?}"),
                Err(_) => self.maybe(&name, Obj::Posted(token)),
            },
            Op::PostInline { name, token } => {
                let state = token.map_or(Obj::Empty, Obj::Inline);
                let refused = token.and_then(inline_class_of).is_some();
                match result {
                    Ok(Body::Done { .. }) if !refused => self.settle(&name, state),
                    Ok(other) => panic!("{name}: PostInline {token:?} answered {other:?}"),
                    Err(e) if e.code() == Some(Code::Conflict) => {}
                    // Refused at once, so nothing changed.
                    Err(e) if refused && e.code() == Some(Code::BadRequest) => {
                        self.inline_refused += 1
                    }
                    Err(e) if e.code() == Some(Code::BadRequest) => {
                        panic!("{name}: PostInline {token:?} refused: {e}")
                    }
                    Err(_) if refused => {}
                    Err(_) => self.maybe(&name, state),
                }
            }
            Op::Delete { name } => match result {
                Ok(Body::Done { .. }) => self.settle(&name, Obj::Absent),
                // Absent at the coordinator (perhaps through this very
                // Delete, answered again after a restart lost the reply).
                Err(e) if matches!(e.code(), Some(Code::NotFound | Code::Deleted)) => {
                    self.settle(&name, Obj::Absent)
                }
                Err(e) if e.code() == Some(Code::Conflict) => {}
                Ok(other) => panic!("Delete answered {other:?}"),
                Err(_) => self.maybe(&name, Obj::Absent),
            },
            Op::Get { name } => self.check_get(&name, result, false),
        }
    }

    fn check_record(&self, name: &str, record: &Record) -> Obj {
        if let Some(data) = &record.inline {
            let token = std::str::from_utf8(&record.attributes)
                .ok()
                .and_then(|a| a.strip_prefix("inline "))
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("{name}: inline record of no inline Post: {record:?}"));
            assert_eq!(
                data,
                &inline_data_of(token),
                "{name}: inline bytes of {token}"
            );
            assert_eq!(record.size, data.len() as u64, "{name}: {record:?}");
            assert_eq!(record.crc, crc32c::crc32c(data), "{name}: {record:?}");
            assert!(record.replicas.is_empty(), "{name}: {record:?}");
            assert_eq!(record.fragments, None, "{name}: {record:?}");
            assert_eq!(record.meta, self.table.meta_addrs(name));
            return Obj::Inline(token);
        }
        if record.size == 0 {
            assert_eq!(record.crc, crc32c::crc32c(&[]), "{name}: {record:?}");
            assert_eq!(record.attributes, EMPTY_ATTRIBUTES, "{name}: {record:?}");
            assert!(record.replicas.is_empty(), "{name}: {record:?}");
            assert_eq!(record.meta, self.table.meta_addrs(name));
            return Obj::Empty;
        }
        let token = record.crc;
        assert_eq!(record.name, name);
        assert_eq!(
            record.attributes,
            attributes_of(token),
            "{name}: attributes are not those of the Post that made the record"
        );
        assert_eq!(
            record.size,
            size_of(token),
            "{name}: torn record {record:?}"
        );
        let expected = coded(token).then(|| Fragments {
            data: 2,
            crcs: fragment_crcs_of(token),
        });
        assert_eq!(record.fragments, expected, "{name}: {record:?}");
        let plan = self.plans.get(&token);
        if let (Some(plan), true) = (plan, coded(token)) {
            // A rebuilt fragment takes its slot: the others keep theirs.
            assert_eq!(record.replicas.len(), plan.len(), "{name}: {record:?}");
            for (slot, r) in record.replicas.iter().enumerate() {
                assert!(
                    *r == plan[slot] || self.copied.contains(r),
                    "{name}: fragment {slot} at {r:x} is neither the Post's nor a rebuild's"
                );
            }
        }
        if self.kill_sn_at.is_none() && self.drain_sn_at.is_none() {
            assert_eq!(
                Some(&record.replicas),
                plan,
                "{name}: replicas are not those of the Post that made the record"
            );
        } else {
            // Repair may have dropped the dead node's replicas and added
            // copies; every replica is the Post's or a successful copy's.
            let plan = plan.expect("a record from a known Post");
            for r in &record.replicas {
                assert!(
                    plan.contains(r) || self.copied.contains(r),
                    "{name}: replica {r:x} comes from neither the Post nor a repair"
                );
            }
        }
        assert_eq!(record.meta, self.table.meta_addrs(name));
        Obj::Posted(token)
    }

    fn check_get(
        &mut self,
        name: &str,
        result: Result<Body, strata_store_protocol::Error>,
        final_read: bool,
    ) {
        let seen = match result {
            Ok(Body::Found { record, .. }) => self.check_record(name, &record),
            Err(e) if matches!(e.code(), Some(Code::NotFound | Code::Deleted)) => Obj::Absent,
            Ok(other) => panic!("Get answered {other:?}"),
            Err(e) => {
                assert!(!final_read, "{name}: final read failed: {e}");
                return;
            }
        };
        if final_read {
            let acked = self.last_acked[name];
            let possible = &self.possible[name];
            assert!(
                possible.contains(&seen),
                "{name}: after healing the store holds {seen:?}; possible {possible:?}"
            );
            if possible.len() == 1 {
                assert_eq!(seen, acked, "{name}: acknowledged state lost");
            }
        } else if self.strict_reads {
            let possible = &self.possible[name];
            assert!(
                possible.contains(&seen),
                "{name}: Get returned {seen:?}; possible {possible:?} (stale or lost)"
            );
        }
        self.checked_gets += 1;
    }

    fn step_crashes(&mut self, crash_rate: u64) {
        for s in 0..self.slots as usize {
            if self.gone == Some(s as u16) {
                continue;
            }
            if self.mns[s].is_none() && self.now >= self.down_until[s] {
                self.start_mn(s as u16);
            } else if self.mns[s].is_some() && crash_rate > 0 && self.rng.below(crash_rate) == 0 {
                let downtime = 300 + self.rng.below(1500);
                if let Some(disk) = self.disks.get(s).filter(|_| self.fault_rng.chance(50)) {
                    // Strikes in the middle of one of the next writes or
                    // syncs (see `core_outs`), then down this long.
                    disk.arm(self.fault_rng.below(8) as u32);
                    self.down_until[s] = downtime;
                    continue;
                }
                self.crashes += 1;
                self.down_until[s] = self.now + downtime;
                self.crash_mn(s as u16);
            }
        }
    }

    /// Advances to `until`, ms by ms: network, timers, ticks, crashes.
    fn run(&mut self, until: u64, new_ops: bool, crash_rate: u64) {
        while self.now < until {
            self.now += 1;
            while let Some(Reverse(ev)) = self.net.peek() {
                if ev.at > self.now {
                    break;
                }
                let Reverse(ev) = self.net.pop().unwrap();
                self.deliver(ev);
            }
            for c in 0..CLIENTS {
                let cl = &self.clients[c as usize];
                if cl.call.is_none() {
                    if new_ops && self.rng.chance(5) {
                        self.begin_op(c);
                    }
                } else if cl.deadline.is_some_and(|d| self.now >= d) {
                    let now = self.now;
                    let step = self.clients[c as usize]
                        .call
                        .as_mut()
                        .unwrap()
                        .on_timeout(now);
                    self.client_send(c, step);
                }
            }
            if self.kill_sn_at == Some(self.now) {
                self.choose_target();
                self.declare_dead(self.target);
            }
            if self.drain_sn_at == Some(self.now) {
                self.choose_target();
            }
            if self.drain_sn_at == Some(self.now) || self.redrain_sn_at == Some(self.now) {
                self.remove_sn(self.target);
                self.cancelled = false;
            }
            if self.cancel_drain_at == Some(self.now) {
                self.cancel_drain(self.target);
                self.cancelled = true;
            }
            if self.add_mn_at == Some(self.now) {
                self.add_mn();
            }
            if let Some((at, slot)) = self.kill_mn_at {
                if at == self.now {
                    self.gone = Some(slot);
                    self.crash_mn(slot);
                }
                if self.now.is_multiple_of(20) {
                    self.orchestrator_clock();
                }
            }
            if self.revive_mn_at == Some(self.now) {
                // Started again by `step_crashes`, with its database.
                self.gone = None;
            }
            self.finish_copies();
            if self.now.is_multiple_of(20) {
                self.spread_table();
                for s in 0..self.slots {
                    let now = self.now;
                    if let Some(core) = self.mns[s as usize].as_mut() {
                        let outs = core.tick(now);
                        self.core_outs(s, outs, "a tick");
                    }
                }
                self.step_crashes(crash_rate);
            }
        }
    }

    /// With W_m = N_m, every metadata address of `name` holds its
    /// acknowledged state, asked of the node that owns it now (a handover
    /// that lost a row, or let the new owner hand out an old version, shows).
    fn check_every_copy(&mut self, name: &str) {
        let acked = self.last_acked[name];
        for addr in self.table.meta_addrs(name) {
            let to = self.mn_of(addr).unwrap();
            let slot = (to - MN_BASE) as usize;
            let now = self.now;
            let outs = self.mns[slot].as_mut().unwrap().handle(
                now,
                0,
                Msg::new(self.rng.next() >> 1, addr, Body::Get { name: name.into() }),
            );
            self.check_node(slot as u16, "a Get of every copy");
            let seen = outs
                .into_iter()
                .find_map(|o| match o {
                    Out::Reply(0, m) => Some(m.body),
                    _ => None,
                })
                .expect("a reply");
            let seen = match seen {
                Body::Found { record, .. } => self.check_record(name, &record),
                Body::Error {
                    code: Code::NotFound | Code::Deleted,
                    ..
                } => Obj::Absent,
                other => panic!("{name} at slot {slot}: {other:?}"),
            };
            assert_eq!(seen, acked, "{name}: the copy at slot {slot} differs");
        }
    }

    /// A fourth metadata node registers with the orchestrator, which plans
    /// the handover of a share of the groups to it.
    fn add_mn(&mut self) {
        let on = self
            .on
            .as_mut()
            .expect("a run with a handover has an orchestrator");
        let reply = on.handle(
            self.now,
            &Msg::new(
                1,
                0,
                Body::Register {
                    role: strata_store_protocol::wire::Role::Mn,
                    uuid: 4,
                    endpoint: strata_store_protocol::wire::no_endpoint(),
                    capacity: 0,
                    free: 0,
                    device: 0,
                    keys: None,
                },
            ),
        );
        assert_eq!(reply.body, Body::Registered { index: MNS });
        self.table = on.table().clone();
        assert!(!self.table.moves.is_empty());
        self.slots = MNS + 1;
        self.start_mn(MNS);
        self.check_all("a metadata node added");
    }

    /// The orchestrator's clock: every running node (and every storage
    /// node) heartbeats, and its timers run; the network and the clients
    /// route by its newest table.
    fn orchestrator_clock(&mut self) {
        let Some(on) = self.on.as_mut() else {
            return;
        };
        let running = (0..self.slots).filter(|&s| self.mns[s as usize].is_some());
        let uuids: Vec<u64> = running.map(|s| s as u64 + 1).chain(101..=104).collect();
        for uuid in uuids {
            let beat = Body::Heartbeat {
                uuid,
                free: 1 << 40,
                objects: 0,
                keys: None,
            };
            on.handle(self.now, &Msg::new(1, 0, beat));
        }
        on.tick(self.now).unwrap();
        self.table = on.table().clone();
        self.check_all("the orchestrator's clock");
        if self
            .table
            .moves
            .iter()
            .any(|m| self.table.restoring(m.group))
        {
            self.restoring_ticks += 1;
        }
    }

    /// Each running metadata node sees the orchestrator's table after its
    /// own random delay (nodes refresh it periodically).
    fn spread_table(&mut self) {
        let Some(on) = self.on.as_ref() else {
            return;
        };
        for s in 0..self.slots as usize {
            if self.rng.chance(15) {
                if let Some(core) = self.mns[s].as_mut() {
                    // As the runtime does, only a newer table replaces
                    // a node's: epochs only go up, across orchestrator
                    // restarts too.
                    assert!(
                        core.table().epoch <= on.table().epoch,
                        "slot {s} holds epoch {}, the orchestrator publishes {}",
                        core.table().epoch,
                        on.table().epoch
                    );
                    if on.table().epoch > core.table().epoch {
                        core.set_table(on.table().clone());
                    }
                }
            }
        }
        self.check_all("a table publish");
    }

    /// Chooses the storage node the run declares dead or removes: the one
    /// holding replicas of the most live objects, in the newest row of
    /// each name found on a running metadata node (the highest index on a
    /// tie).
    fn choose_target(&mut self) {
        let mut newest: BTreeMap<String, Record> = BTreeMap::new();
        for core in self.mns.iter().flatten() {
            for g in core.owned_groups() {
                for r in core.db().records_after(g, None, usize::MAX).unwrap() {
                    if newest.get(&r.name).is_none_or(|n| n.version < r.version) {
                        newest.insert(r.name.clone(), r);
                    }
                }
            }
        }
        let held = |index: u16| {
            newest
                .values()
                .filter(|r| {
                    r.replicas
                        .iter()
                        .any(|&a| self.table.layout.sn_of(a) == Some(index))
                })
                .count()
        };
        let (held, index) = self
            .table
            .sns
            .iter()
            .map(|s| (held(s.index), s.index))
            .max()
            .expect("storage nodes");
        self.target = index;
        self.target_held = held;
    }

    /// Marks storage node `index` dead in every metadata node's table.
    fn declare_dead(&mut self, index: u16) {
        for sn in &mut self.table.sns {
            if sn.index == index {
                sn.state = State::Dead;
            }
        }
        for core in self.mns.iter_mut().flatten() {
            core.set_table(self.table.clone());
        }
        self.check_all("a storage node declared dead");
    }

    /// Asks the orchestrator to remove storage node `index`: it is drained
    /// (the nodes see the table after their own delays), then retired.
    fn remove_sn(&mut self, index: u16) {
        let uuid = self
            .table
            .sns
            .iter()
            .find(|s| s.index == index)
            .unwrap()
            .uuid;
        let on = self.on.as_mut().expect("a drain has an orchestrator");
        let reply = on.handle(self.now, &Msg::new(1, 0, Body::Retire { uuid }));
        assert_eq!(reply.body, Body::Done { version: 0 });
        self.table = on.table().clone();
        assert!(self.table.retiring(index));
        self.check_on("a drain started");
    }

    /// Counts the replication messages naming the target sent, while it
    /// is drained, to the metadata node crashed for good (lost); with
    /// `crash_on_resend`, crashes that node for good on the first such
    /// message sent to it.
    fn count_lost_naming_target(&mut self, to: u32, msg: &Msg) {
        let Body::Replicate { record } = &msg.body else {
            return;
        };
        if !(self.table.retiring(self.target)
            && record
                .replicas
                .iter()
                .any(|&a| self.table.layout.sn_of(a) == Some(self.target)))
        {
            return;
        }
        if let Some(slot) = self.crash_on_resend {
            if self.gone.is_none() && MN_BASE + slot as u32 == to {
                self.gone = Some(slot);
                self.crash_mn(slot);
            }
        }
        if self.gone.is_some_and(|g| MN_BASE + g as u32 == to) {
            self.lost_to_gone += 1;
        }
    }

    /// Restarts the orchestrator (from its database: progress published
    /// since the last stored change is lost, but the epoch goes on above
    /// every one published), then cancels the drain of storage node
    /// `index`. Reports of scans under the cancelled drain may still be in
    /// flight.
    fn cancel_drain(&mut self, index: u16) {
        let uuid = self
            .table
            .sns
            .iter()
            .find(|s| s.index == index)
            .unwrap()
            .uuid;
        let before = self.on.take().map_or(0, |on| on.table().epoch);
        let mut on = self.orchestrator();
        assert!(
            on.table().epoch > before,
            "epoch {} after a restart, {before} before",
            on.table().epoch
        );
        let reply = on.handle(self.now, &Msg::new(1, 0, Body::CancelRetire { uuid }));
        assert_eq!(reply.body, Body::Done { version: 0 });
        self.table = on.table().clone();
        assert!(!self.table.retiring(index));
        self.on = Some(on);
        self.check_on("an orchestrator restart and a cancelled drain");
    }

    /// At retirement (and after healing, or after the repair of a dead
    /// node): no row of a running metadata node, coordinator row or
    /// metadata copy, names storage node `index` any more.
    fn check_none_names(&self, index: u16) {
        for core in self.mns.iter().flatten() {
            for g in core.owned_groups() {
                for r in core.db().records_after(g, None, usize::MAX).unwrap() {
                    assert!(
                        r.replicas
                            .iter()
                            .all(|&a| self.table.layout.sn_of(a) != Some(index)),
                        "{r:?} still names node {index}"
                    );
                }
            }
        }
    }

    /// Reports the repair copies due now, succeeding 4 times out of 5.
    fn finish_copies(&mut self) {
        let now = self.now;
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.copies)
            .into_iter()
            .partition(|c| c.0 <= now);
        self.copies = later;
        for (_, slot, name, version, targets) in due {
            let result = if self.rng.chance(80) {
                self.copied.extend(targets.iter().copied());
                Ok(targets.len() as u8)
            } else {
                Err("simulated copy failure".to_string())
            };
            // A node that crashed since lost the copy's state; the report
            // then reaches its new incarnation, which frees the targets.
            let Some(core) = self.mns[slot as usize].as_mut() else {
                continue;
            };
            let outs = core.copy_done(now, &name, version, targets, result);
            self.repairs_done += 1;
            self.core_outs(slot, outs, "a repair copy's report");
        }
    }

    /// After healing, every acknowledged object has N_d replicas and none
    /// on a dead or retired storage node (repair or drain finished).
    fn check_repaired(&mut self, n_d: usize) {
        let dead: Vec<u16> = self
            .table
            .sns
            .iter()
            .filter(|s| matches!(s.state, State::Dead | State::Retired))
            .map(|s| s.index)
            .collect();
        for (name, state) in self.last_acked.clone() {
            if !matches!(state, Obj::Posted(_) | Obj::Inline(_)) || self.possible[&name].len() != 1
            {
                continue;
            }
            let coord = self.table.meta_addrs(&name)[0];
            let slot = (self.mn_of(coord).unwrap() - MN_BASE) as usize;
            let core = self.mns[slot].as_ref().unwrap();
            let mg = self.table.layout.mg_of(coord).unwrap();
            let record = core
                .db()
                .get(mg, &name)
                .unwrap()
                .expect("acknowledged object");
            let on_dead = record
                .replicas
                .iter()
                .filter(|&&r| dead.contains(&self.table.layout.sn_of(r).unwrap()))
                .count();
            assert_eq!(on_dead, 0, "{name}: still on the dead node: {record:?}");
            // An inline object never gets a replica (repair skips it); an
            // erasure-coded one keeps its k + m fragments.
            let want = match (state, &record.fragments) {
                (Obj::Inline(_), _) => 0,
                (_, Some(_)) => 3,
                (_, None) => n_d,
            };
            assert_eq!(record.replicas.len(), want, "{name}: {record:?}");
        }
    }

    /// Stops faults, restarts every node, lets retries drain, then reads
    /// every name from its coordinator and checks it against the oracle.
    fn heal_and_check(&mut self) {
        self.run(self.now + 10_000, false, 0); // clients finish their calls
        self.loss = 0;
        self.dup = 0;
        for disk in &self.disks {
            disk.disarm();
        }
        for s in 0..self.slots as usize {
            self.down_until[s] = 0;
        }
        self.run(self.now + 70_000, false, 0);
        if let Some(on) = &self.on {
            for core in self.mns.iter_mut().flatten() {
                core.set_table(on.table().clone());
            }
        }
        self.check_all("healing");
        let names: Vec<String> = self.possible.keys().cloned().collect();
        for name in names {
            let addrs = self.table.meta_addrs(&name);
            self.clients[0].op = Op::Idle;
            let mut call = Call::new(
                self.rng.next() >> 1,
                addrs,
                Body::Get { name: name.clone() },
                5,
                400,
            );
            call = call.falling_through();
            let step = call.start(self.now);
            self.clients[0].call = Some(call);
            // Route the answer to `result` instead of the op machinery.
            let Step::Send(msg, _) = step else { panic!() };
            let to = self.mn_of(msg.target).unwrap();
            let slot = (to - MN_BASE) as u16;
            let now = self.now;
            let outs = self.mns[slot as usize]
                .as_mut()
                .unwrap()
                .handle(now, 0, msg);
            self.check_node(slot, "a Get after healing");
            let reply = outs
                .into_iter()
                .find_map(|o| match o {
                    Out::Reply(0, m) => Some(m),
                    _ => None,
                })
                .expect("a reply");
            self.clients[0].call = None;
            let result = match reply.body {
                Body::Error { code, message } => {
                    Err(strata_store_protocol::Error::Remote { code, message })
                }
                b => Ok(b),
            };
            self.check_get(&name, result, true);
            if self.on.is_some() && self.strict_reads && self.possible[&name].len() == 1 {
                self.check_every_copy(&name);
            }
        }
        // No replica of a live, acknowledged object was freed.
        for (name, state) in &self.last_acked {
            if let (Obj::Posted(t), 1) = (state, self.possible[name].len()) {
                for r in &self.plans[t] {
                    assert!(!self.freed.contains(r), "{name}: a live replica was freed");
                }
            }
        }
    }
}

fn simulate(seed: u64, params: Params) -> (u64, u64, u64) {
    let mut sim = Sim::new(seed, params);
    sim.run(60_000, true, 150);
    sim.heal_and_check();
    if std::env::var_os("SIM_VERBOSE").is_some() {
        eprintln!("seed {seed}: storage faults {:?}", sim.faults);
    }
    // A run on simulated disks must have crashed some node mid-write and
    // let some torn or corrupted write land.
    let f = sim.faults;
    assert!(
        sim.disks.is_empty() || (f.mid_write > 0 && f.torn + f.corrupted > 0),
        "seed {seed}: storage faults {f:?}"
    );
    for s in 0..MNS as usize {
        assert_eq!(
            sim.mns[s].as_ref().unwrap().pending_count(),
            0,
            "a name stayed locked"
        );
    }
    // Both sides of the inline rule ran: objects kept inline, and Posts
    // refused for a class the metadata copies cannot hold.
    assert!(
        sim.inline_acked > 0 && sim.inline_refused > 0,
        "seed {seed}: {} inline Posts acknowledged, {} refused",
        sim.inline_acked,
        sim.inline_refused
    );
    (sim.acked_ops, sim.checked_gets, sim.crashes)
}

/// A run counts only if it crashed nodes and, when the target held a
/// replica of some live object as it was chosen, made repair copies: a
/// seed that exercised neither would pass without testing anything. (The
/// node chosen holds replicas of the most live objects, with N_d = 3 of 4
/// storage nodes at least three in four; it holds none only when no object
/// was live on a running metadata node then, and the run checks that the
/// node is dropped all the same.)
fn assert_repairs_ran_under_crashes(sim: &Sim, seed: u64) {
    assert!(
        (sim.target_held == 0 || sim.repairs_done > 0) && sim.crashes > 5,
        "seed {seed}: node {} held {} live objects; {} repair copies, {} crashes",
        sim.target,
        sim.target_held,
        sim.repairs_done,
        sim.crashes
    );
}

/// After a drain of the target storage node and healing: the orchestrator
/// retired it, no row on any metadata node (all running again) names it,
/// every acknowledged object has N_d replicas, and repairs ran under
/// crashes.
fn assert_drained_node_retired(sim: &mut Sim, seed: u64, p: Params) {
    let t = sim.on.as_ref().unwrap().table();
    let state = t.sns.iter().find(|s| s.index == sim.target).unwrap().state;
    assert_eq!(
        state,
        State::Retired,
        "seed {seed}: not retired: {:?}",
        t.drains
    );
    sim.check_none_names(sim.target);
    sim.check_repaired(p.n_d as usize);
    assert_repairs_ran_under_crashes(sim, seed);
}

/// Three seeds by default; `SIM_SEEDS=N` explores N of them, and
/// `SIM_SKIP=K` starts K seeds later: `SIM_SKIP=70 SIM_SEEDS=1` replays
/// the 71st seed of every scenario alone.
fn seeds(base: u64) -> std::ops::Range<u64> {
    let var = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let first = base + var("SIM_SKIP", 0);
    first..first + var("SIM_SEEDS", 3)
}

/// Three copies of metadata and data, two to acknowledge: the scenarios'
/// usual parameters.
const MAJORITY: Params = Params {
    n_m: 3,
    w_m: 2,
    n_d: 3,
    w_d: 2,
    data_fragments: 0,
};

#[test]
fn metadata_protocol_with_w_equal_n_has_no_lost_or_stale_reads() {
    let p = Params {
        n_m: 3,
        w_m: 3,
        n_d: 3,
        w_d: 2,
        data_fragments: 0,
    };
    for seed in seeds(1) {
        let (acked, gets, crashes) = simulate(seed, p);
        // The run must have done real work under real faults.
        assert!(
            acked > 50 && gets > 20 && crashes > 5,
            "seed {seed}: {acked} acked, {gets} gets, {crashes} crashes"
        );
    }
}

#[test]
fn metadata_protocol_with_majority_writes_loses_no_acknowledged_write() {
    let p = Params {
        n_m: 3,
        w_m: 2,
        n_d: 2,
        w_d: 1,
        data_fragments: 0,
    };
    for seed in seeds(1_000) {
        let (acked, gets, crashes) = simulate(seed, p);
        assert!(
            acked > 50 && gets > 20 && crashes > 5,
            "seed {seed}: {acked} acked, {gets} gets, {crashes} crashes"
        );
    }
}

/// Anti-entropy under faults: with W_m < N_m, lost replication messages
/// and coordinators crashing (losing their resends) leave metadata copies
/// behind, some for good. Passes run every 5 s throughout (under loss and
/// crashes too); after healing, every metadata copy of every name holds
/// exactly its coordinator's record, and a deleted (or never posted) name
/// has no record at any address.
#[test]
fn anti_entropy_brings_every_metadata_copy_to_its_coordinator_s_state() {
    let p = Params {
        n_m: 3,
        w_m: 2,
        n_d: 2,
        w_d: 1,
        data_fragments: 0,
    };
    let mut refreshes = 0;
    for seed in seeds(9_000) {
        let mut sim = Sim::new(seed, p);
        sim.set_sync_interval(5_000);
        sim.run(60_000, true, 150);
        sim.heal_and_check();
        // Past any pass the last restart postponed.
        sim.run(sim.now + 11_000, false, 0);
        let compared = sim.check_copies_match_coordinators(seed);
        assert!(
            sim.acked_ops > 50 && sim.crashes > 5 && compared > 0,
            "seed {seed}: {} acked, {} crashes",
            sim.acked_ops,
            sim.crashes
        );
        if std::env::var_os("SIM_VERBOSE").is_some() {
            eprintln!("seed {seed}: {} refreshes", sim.refreshes);
        }
        refreshes += sim.refreshes;
    }
    // The passes found stale copies to bring up to date.
    assert!(refreshes > 0);
}

#[test]
fn repair_of_a_dead_storage_node_under_faults_loses_nothing() {
    let p = MAJORITY;
    for seed in seeds(2_000) {
        check_dead_sn_repair(seed, p, &[(60_000, true)]);
    }
}

/// Kills a storage node at 20 s, runs each phase (until when, with Posts
/// or not), heals, and checks the repair: N_d replicas of every
/// acknowledged object, no row naming the dead node, repairs ran.
fn check_dead_sn_repair(seed: u64, p: Params, phases: &[(u64, bool)]) {
    let mut sim = Sim::new(seed, p);
    sim.kill_sn_at = Some(20_000);
    for &(until, posts) in phases {
        sim.run(until, posts, 150);
    }
    sim.heal_and_check();
    sim.check_repaired(p.n_d as usize);
    sim.check_none_names(sim.target);
    assert_repairs_ran_under_crashes(&sim, seed);
}

/// A storage node declared dead midway, with Posts stopping soon after
/// (they would otherwise rewrite every metadata copy): under crashes, some
/// copies miss the rewrite of a repair for good (the coordinator crashed,
/// losing its resends, while the copy's node was down). The scan has them
/// ask their coordinator for the newer record, so after healing no row on
/// any metadata node, coordinator row or metadata copy, names the dead
/// node, and every acknowledged object has N_d replicas.
#[test]
fn repair_of_a_dead_storage_node_refreshes_every_metadata_copy() {
    let p = MAJORITY;
    for seed in seeds(2_500) {
        check_dead_sn_repair(seed, p, &[(25_000, true), (60_000, false)]);
    }
}

/// A storage node removed midway through the real orchestrator, under
/// loss, duplication, reordering and metadata-node crashes: it is retired
/// only once no record names it, and after healing every acknowledged
/// object has N_d replicas, none on it.
#[test]
fn draining_a_storage_node_under_faults_retires_it_with_nothing_lost() {
    let p = MAJORITY;
    for seed in seeds(5_000) {
        let mut sim = Sim::new(seed, p);
        sim.on = Some(sim.orchestrator());
        sim.drain_sn_at = Some(20_000);
        // Posts go on for a while (some placed on the node by metadata
        // nodes that have not seen the drain yet), then stop: the records
        // left must be drained, not overwritten.
        sim.run(25_000, true, 150);
        sim.run(60_000, false, 150);
        sim.heal_and_check();
        assert_drained_node_retired(&mut sim, seed, p);
    }
}

/// A drain cancelled midway (right after an orchestrator restart) and
/// started again later, under the same faults: while cancelled the node
/// takes Posts again; reports of scans under the first drain never count
/// for the second, so the node is retired only once no record names it
/// (checked at the retirement), it is retired in every run once faults
/// stop (metadata copies that missed a rewrite for good are refreshed from
/// their coordinator), and after healing every acknowledged object has
/// N_d replicas, none on it.
#[test]
fn a_drain_cancelled_then_started_again_under_faults_retires_with_nothing_lost() {
    let p = MAJORITY;
    for seed in seeds(5_500) {
        let mut sim = Sim::new(seed, p);
        sim.on = Some(sim.orchestrator());
        sim.drain_sn_at = Some(20_000);
        // Before any drain could end: retiring takes two rounds of clean
        // passes, and a node's next pass starts a second after its last.
        // (With one round, a first pass finding nothing let some seeds
        // retire the node before this cancel.)
        sim.cancel_drain_at = Some(20_700);
        sim.redrain_sn_at = Some(25_000);
        sim.run(27_000, true, 150);
        sim.run(65_000, false, 150);
        sim.heal_and_check();
        assert_drained_node_retired(&mut sim, seed, p);
        assert!(
            sim.placed_while_cancelled > 0,
            "seed {seed}: no Post placed on the node while its drain was cancelled"
        );
    }
}

/// A simulation whose orchestrator gives a metadata node down for over a
/// second a stand-in and never declares one dead, and the slot of a node
/// whose loss leaves every name a copy elsewhere.
fn sim_with_stand_ins(seed: u64, p: Params) -> (Sim, u16) {
    let mut sim = Sim::new(seed, p);
    let gone = sim.slot_no_name_lives_on_alone();
    let mut on = sim.orchestrator();
    on.set_short_failure(1_000);
    on.set_definitive_failure(600_000);
    sim.on = Some(on);
    (sim, gone)
}

/// A storage node drained while a metadata node goes down (just after the
/// drain starts, back about 50 s later): coordinators resend records naming the
/// drained node to the down node's addresses (lost), until their tables
/// give its groups to stand-ins, which take the resends. The drain ends
/// while the node is still down, before the resends would have given up
/// (60 s after the first), and is sound: at retirement no row names the drained node,
/// nor after the down node returns with its old rows and healing. The down
/// node crashes on the first record naming the drained node sent to it
/// after the drain started, if one is before 22 s: in at least one run in
/// five (over 10 runs or more) some were lost there. (With the stand-ins
/// refusing those resends, the third default seed already fails.)
#[test]
fn a_drain_does_not_wait_for_resends_to_a_metadata_node_that_is_down() {
    let p = every_metadata_copy_acks();
    let (mut runs, mut lost_runs) = (0, 0);
    for seed in seeds(6_000) {
        let (mut sim, gone) = sim_with_stand_ins(seed, p);
        sim.drain_sn_at = Some(20_000);
        // Down once a record naming the drained node is on its way to it
        // (or at 22 s): it is then resent to a node that is down.
        sim.crash_on_resend = Some(gone);
        sim.kill_mn_at = Some((22_000, gone));
        // No random crashes: a node down while it holds groups standing
        // in for another gets no stand-in, and its groups hold the drain
        // until it is back (it cannot report).
        // Checked at 70 s: a Post begun just before 25 s whose commit
        // was lost holds its name, and the repair of the record there, for
        // 30 s; the first resends lost at the down node give up after 80 s.
        sim.run(25_000, true, 0);
        sim.run(70_000, false, 0);
        let t = sim.on.as_ref().unwrap().table();
        let state = t.sns.iter().find(|s| s.index == sim.target).unwrap().state;
        assert_eq!(
            state,
            State::Retired,
            "seed {seed}: not retired 50 s into the drain with slot {gone} down \
             ({} resends naming it lost there): {:?}",
            sim.lost_to_gone,
            t.drains
        );
        assert!(sim.mns[gone as usize].is_none());
        runs += 1;
        lost_runs += u32::from(sim.lost_to_gone > 0);
        sim.revive_mn_at = Some(70_001);
        sim.run(90_000, false, 0);
        sim.heal_and_check();
        sim.check_none_names(sim.target);
        sim.check_repaired(p.n_d as usize);
        assert!(sim.target_held == 0 || sim.repairs_done > 0, "seed {seed}");
    }
    assert!(
        runs < 10 || lost_runs * 5 >= runs,
        "resends to the down node in only {lost_runs} runs of {runs}"
    );
}

#[test]
fn a_group_handover_under_faults_loses_nothing() {
    let p = every_metadata_copy_acks();
    for seed in seeds(3_000) {
        let mut sim = Sim::new(seed, p);
        let on = sim.orchestrator();
        assert_eq!(on.table().mg_owner, sim.table.mg_owner);
        sim.on = Some(on);
        sim.add_mn_at = Some(50_000);
        sim.run(60_000, true, 150);
        sim.heal_and_check();
        let t = sim.on.as_ref().unwrap().table();
        assert!(
            t.moves.is_empty(),
            "seed {seed}: handover unfinished: {:?}",
            t.moves
        );
        assert_eq!(t.groups_of(MNS), 4, "seed {seed}");
        let new = sim.mns[MNS as usize].as_ref().unwrap();
        assert_eq!(new.owned_groups().len(), 4);
        for s in 0..ALL_MNS {
            assert_eq!(sim.mns[s].as_ref().unwrap().pending_count(), 0);
            assert!(sim.mns[s].as_ref().unwrap().sealed_groups().is_empty());
        }
        assert!(
            sim.acked_ops > 50 && sim.checked_gets > 20 && sim.crashes > 5,
            "seed {seed}: {} acked, {} gets, {} crashes",
            sim.acked_ops,
            sim.checked_gets,
            sim.crashes
        );
    }
}

#[test]
fn a_metadata_node_lost_for_good_is_restored_under_faults() {
    let p = every_metadata_copy_acks();
    for seed in seeds(4_000) {
        let mut sim = Sim::new(seed, p);
        // A slot that does not hold every metadata address of some name:
        // such a name has no copy left when that node is lost.
        let gone = sim.slot_no_name_lives_on_alone();
        let mut on = sim.orchestrator();
        on.set_definitive_failure(5_000);
        sim.on = Some(on);
        sim.kill_mn_at = Some((20_000, gone));
        sim.run(60_000, true, 150);
        let t = sim.on.as_ref().unwrap().table();
        assert_eq!(t.mns[gone as usize].state, State::Dead, "seed {seed}");
        assert_eq!(t.groups_of(gone), 0, "seed {seed}");
        assert!(
            t.moves.is_empty(),
            "seed {seed}: restore unfinished: {:?}",
            t.moves
        );
        // The restore took a while (faults), but it ended.
        assert!(sim.restoring_ticks > 0, "seed {seed}: no restore seen");
        // The node comes back with its old database: it takes a share of
        // the groups again by handovers, under the same faults.
        sim.revive_mn_at = Some(60_001);
        sim.run(110_000, true, 150);
        sim.heal_and_check();
        let t = sim.on.as_ref().unwrap().table();
        assert_eq!(t.mns[gone as usize].state, State::Up, "seed {seed}");
        assert!(t.moves.is_empty(), "seed {seed}: {:?}", t.moves);
        let share = t.layout.mg_count() / MNS as usize;
        assert_eq!(
            t.groups_of(gone),
            share,
            "seed {seed}: the returned node owns {} groups, want {share}",
            t.groups_of(gone)
        );
        eprintln!(
            "seed {seed}: restored over {} ms; {} acked, {} gets, {} crashes",
            sim.restoring_ticks * 20,
            sim.acked_ops,
            sim.checked_gets,
            sim.crashes
        );
        for s in 0..MNS {
            let core = sim.mns[s as usize].as_ref().unwrap();
            assert_eq!(core.pending_count(), 0, "seed {seed}: a name stayed locked");
            assert_eq!(core.restore_progress(), (0, 0, 0), "seed {seed}");
        }
        assert!(
            sim.acked_ops > 50 && sim.checked_gets > 20 && sim.crashes > 5,
            "seed {seed}: {} acked, {} gets, {} crashes",
            sim.acked_ops,
            sim.checked_gets,
            sim.crashes
        );
    }
}

#[test]
fn a_metadata_node_down_for_a_while_stands_in_then_comes_back_under_faults() {
    let p = every_metadata_copy_acks();
    let mut stand_in_runs = 0;
    let all = seeds(5_000);
    let runs = all.end - all.start;
    for seed in all {
        // Random crashes (0.3 to 1.8 s) stand in too.
        let (mut sim, gone) = sim_with_stand_ins(seed, p);
        let owners = sim.table.mg_owner.clone();
        sim.kill_mn_at = Some((20_000, gone));
        let (mut stood_in, mut held) = (false, false);
        let mut at = 20_000;
        while at < 35_000 {
            at += 500;
            sim.run(at, true, 150);
            let t = sim.on.as_ref().unwrap().table();
            stood_in |= t.stand_ins.iter().any(|s| s.home == gone) && t.groups_of(gone) == 0;
            // A node holding groups that stand in for another gets no
            // stand-in itself (it may hold every copy of a name).
            held |= t
                .stand_ins
                .iter()
                .any(|s| t.mg_owner[s.group as usize] == gone);
        }
        assert!(stood_in || held, "seed {seed}: no stand-in for slot {gone}");
        stand_in_runs += u32::from(stood_in);
        sim.revive_mn_at = Some(35_001);
        sim.run(60_000, true, 150);
        sim.heal_and_check();
        let t = sim.on.as_ref().unwrap().table();
        assert_eq!(t.mns[gone as usize].state, State::Up, "seed {seed}");
        assert!(t.stand_ins.is_empty(), "seed {seed}: {:?}", t.stand_ins);
        assert!(t.moves.is_empty(), "seed {seed}: {:?}", t.moves);
        assert_eq!(t.mg_owner, owners, "seed {seed}: not every group home");
        eprintln!(
            "seed {seed}: {} acked, {} gets, {} crashes, restoring over {} ms",
            sim.acked_ops,
            sim.checked_gets,
            sim.crashes,
            sim.restoring_ticks * 20
        );
        for s in 0..MNS {
            let core = sim.mns[s as usize].as_ref().unwrap();
            assert_eq!(core.pending_count(), 0, "seed {seed}: a name stayed locked");
        }
        assert!(
            sim.acked_ops > 50 && sim.checked_gets > 20,
            "seed {seed}: {} acked, {} gets",
            sim.acked_ops,
            sim.checked_gets
        );
    }
    // A share of runs: replaying one seed alone (`SIM_SEEDS=1`) checks
    // that run, not the share.
    assert!(
        runs < 3 || stand_in_runs * 2 >= runs as u32,
        "stand-ins in only {stand_in_runs} runs of {runs}"
    );
}

#[test]
fn the_simulation_is_deterministic() {
    let p = Params {
        n_m: 3,
        w_m: 2,
        n_d: 2,
        w_d: 1,
        data_fragments: 0,
    };
    let run = |seed| {
        let mut sim = Sim::new(seed, p);
        sim.run(15_000, true, 150);
        (
            sim.acked_ops,
            sim.checked_gets,
            sim.crashes,
            sim.freed.len(),
            sim.next_token,
        )
    };
    assert_eq!(run(5), run(5));
    // Neighbouring seeds explore different runs.
    assert_ne!(run(4), run(5));
}

/// A node taking a group over starts from nothing (a node declared dead
/// and back may hold rows of its old groups that no other node kept, and
/// whose replicas were collected since), except when the group is handed
/// back to it after a stand-in: then its rows are merged by version.
#[test]
fn a_group_taken_over_is_copied_into_an_empty_group_unless_it_comes_home() {
    use strata_store_protocol::table::{Move, MovePhase, StandIn};
    let p = every_metadata_copy_acks();
    for home in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let db = MetaDb::open(&dir.path().join("meta.redb")).unwrap();
        let mut t = table(p);
        let group = t.mg_owner.iter().position(|&o| o == 1).unwrap() as u32;
        let stale = Record {
            name: "stale".into(),
            size: 1,
            crc: 0,
            version: 3,
            meta: vec![],
            replicas: vec![],
            rename: None,
            attributes: Vec::new(),
            fragments: None,
            inline: None,
        };
        db.apply_record(group, &stale).unwrap();
        t.moves.push(Move {
            group,
            to: 0,
            phase: MovePhase::Copying,
            frozen_epoch: 0,
        });
        if home {
            t.stand_ins.push(StandIn { group, home: 0 });
        }
        let mut core: MnCore<u32> = MnCore::new(db, t, 0, 7);
        let outs = core.tick(1_000);
        assert!(
            outs.iter().any(|o| matches!(o, Out::ToMeta(m) if matches!(m.body, Body::MgPull { group: g, .. } if g == group))),
            "no copy of group {group} started"
        );
        let kept = core.db().get(group, "stale").unwrap().is_some();
        assert_eq!(kept, home, "home {home}: stale row kept {kept}");
    }
}

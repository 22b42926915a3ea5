//! The metadata node's protocol logic, as a deterministic state machine.
//!
//! [`MnCore`] never touches a socket or a clock: it takes a message (or a
//! tick) with the current time and returns what to send. The UDP runtime
//! ([`crate::metadata::server`]) and the seeded simulation drive the same code.
//!
//! Post: the coordinator (the MN owning the name's first metadata address)
//! locks the name, places the replicas and answers a plan; the client
//! streams the data; on `PostCommit` the coordinator stores the record,
//! replicates it to the other metadata addresses, and acknowledges once
//! W_m addresses hold it. A second Post of a locked name fails at once.
//! Delete follows the same path with tombstones; SN space is freed after.
//!
//! [`MnCore::handle`] and [`MnCore::tick`] (here) decide what runs; one
//! module per concern holds the rest of the `impl`: `writes` (Post,
//! Update, Link, Get, Delete), `listing`, `replication`, `repair` (and drain
//! reports), `damaged` (replicas reported damaged by a scrub or a
//! client), `sync` (anti-entropy), `handover` and `restore` of metadata
//! groups.

mod damaged;
mod handover;
mod invariants;
mod listing;
mod repair;
mod replication;
mod restore;
mod sync;
mod writes;

pub use self::repair::RepairStats;

use crate::metadata::database::{Classify, MetaDb};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::Hash;
use strata_store_protocol::addr::{splitmix64, Addr};
use strata_store_protocol::class::{StorageClass, StripeLayout};
use strata_store_protocol::table::{Device, MovePhase, Params, State, Table};
use strata_store_protocol::wire::{
    Body, Code, Fragments, GatherCursor, Msg, Record, Row, SyncEntry, SyncSum,
};
use strata_store_protocol::Error;

/// Objects below this size prefer SSD storage nodes; larger ones HDD.
pub const SMALL_OBJECT: u64 = 1 << 20;

/// First resend delay of a replication message, in milliseconds.
const RESEND_MS: u64 = 100;
/// Longest resend delay.
const RESEND_MAX_MS: u64 = 2_000;
/// A replication message is given up after this long (repair would then
/// restore the missing copy).
const REPLICATE_GIVE_UP_MS: u64 = 60_000;
/// How long a client has to acknowledge W_m (coordinator side).
const COMMIT_TIMEOUT_MS: u64 = 5_000;
/// Time allowed for the data phase: a base plus 1 s per 16 MiB.
const DATA_BASE_MS: u64 = 30_000;
/// Replies remembered for duplicate requests.
const REPLY_CACHE: usize = 8_192;
/// Records looked at per repair step (one step per tick while a storage
/// node is dead).
const REPAIR_BATCH: usize = 32;
/// Copies under way at once; the scan waits while this many run.
const MAX_REPAIRS: usize = 32;
/// Pause between two passes over every record while a node is dead.
const REPAIR_PASS_MS: u64 = 1_000;
/// Resend delay of a handover page request or report.
const PULL_RESEND_MS: u64 = 300;
/// Delay before asking again when the group's owner is not ready for the
/// final copy (it has not seen the freeze, or changes are still in flight).
const PULL_RETRY_MS: u64 = 100;
/// Bytes of rows in one handover page, below the datagram limit.
const PULL_PAGE_BYTES: usize = strata_store_protocol::wire::MAX_DATAGRAM - 2048;
/// Rows a node looks at to answer one gather page (a restore scans every
/// node's whole database): bounds the time one request holds the node.
const GATHER_SCAN: usize = 8_192;
/// Default pause between two anti-entropy passes over the metadata copies
/// (see [`MnCore::set_sync_interval`]).
pub const DEFAULT_SYNC_MS: u64 = 30_000;
/// Rows of a group an anti-entropy walk looks at per tick.
const SYNC_PAGE_ROWS: usize = 256;
/// Bytes of entries in one [`Body::SyncCheck`], below the datagram limit.
const SYNC_CHECK_BYTES: usize = strata_store_protocol::wire::MAX_DATAGRAM - 2048;

/// What the core asks its runtime to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Out<P> {
    /// Send `msg` back to the peer `P`.
    Reply(P, Msg),
    /// Send `msg` to whichever MN owns metadata address `msg.target`.
    ToMeta(Msg),
    /// Free the replica at this address on its storage node.
    Free(Addr),
    /// Send `msg` to the orchestrator (handover reports); its reply comes
    /// back to [`MnCore::handle`] like any other message.
    ToOn(Msg),
    /// Repair: copy the object from one of `sources` (tried in order) to
    /// `targets` (the first forwards to the others), then report with
    /// [`MnCore::copy_done`].
    Copy {
        /// Object name.
        name: String,
        /// The record version being repaired.
        version: u64,
        /// Live replicas to read from.
        sources: Vec<Addr>,
        /// New replica addresses to write.
        targets: Vec<Addr>,
        /// Object size.
        size: u64,
        /// Object CRC-32C, checked on the copy.
        crc: u32,
    },
    /// Repair of an erasure-coded object: read any k of its fragments
    /// (leaving out `slots`), rebuild the fragments of `slots` and write
    /// fragment `slots[i]` to `targets[i]`, then report with
    /// [`MnCore::copy_done`].
    Rebuild {
        /// The record being repaired (its fragments' addresses and CRCs).
        record: Box<Record>,
        /// The fragment indices to rebuild.
        slots: Vec<usize>,
        /// New addresses for them.
        targets: Vec<Addr>,
    },
}

/// One full scan of the groups this node owns while storage nodes are
/// being drained, counting the rows that still name each of them (see
/// [`Body::DrainReport`]).
struct DrainPass {
    /// The table epoch when the scan started.
    epoch: u64,
    /// The groups owned then: the scan starts over if they change.
    groups: Vec<u32>,
    /// Per drained node index: (records left, metadata copies, unplaceable).
    counts: BTreeMap<u16, (u64, u64, u64)>,
    /// Per drained node index, the drain counted for ([`strata_store_protocol::table::Drain::since`]
    /// when the scan started): a drain cancelled and started again
    /// meanwhile is another drain, which this scan says nothing about.
    drains: BTreeMap<u16, u64>,
}

/// A repair copy under way.
struct Repair {
    /// Version of the record when the copy started.
    version: u64,
    /// Replicas on live nodes, kept.
    keep: Vec<Addr>,
    /// New replica addresses being written.
    targets: Vec<Addr>,
    /// Replicas reported damaged that the record drops once the copy is
    /// committed, then freed.
    dropped: Vec<Addr>,
    deadline: u64,
    /// For an erasure-coded record, the fragment index each target
    /// rebuilds (empty for replicas: targets are appended).
    slots: Vec<usize>,
}

enum Phase {
    /// Waiting for the client's data and `PostCommit`.
    Data {
        size: u64,
        replicas: Vec<Addr>,
        /// Data fragments of an erasure-coded Post (0: replicas).
        data_fragments: u8,
    },
    /// Stored locally; replicating until W_m addresses acknowledge.
    Replicating {
        acked: Vec<bool>,
        needed: usize,
        free_after: Vec<Addr>,
        /// The answer once W_m hold it (`None`: Done with the version).
        answer: Option<Box<Body>>,
    },
}

struct Pending<P> {
    /// Unique per operation: acknowledgements of an older operation on the
    /// same name and version (a Post and the Delete of that version) must
    /// not count for this one.
    op: u64,
    version: u64,
    client: P,
    client_req: u64,
    deadline: u64,
    phase: Phase,
}

/// A copy of a metadata group this node is taking over.
struct Pull {
    /// 0 for the first copy; the freeze epoch for the final one.
    epoch: u64,
    /// Copying tombstones (records come first).
    tombs: bool,
    /// The last name copied.
    after: String,
    /// Where the copy stands.
    stage: PullStage,
    /// The message awaiting an answer (resent until one comes).
    msg: Msg,
    next_send: u64,
}

/// Groups this node is restoring (their previous owner is dead), gathered
/// together: one scan of each live metadata node's database (this one's
/// included) serves them all.
struct Restore {
    /// The groups, with their restores' start epochs
    /// ([`strata_store_protocol::table::Move::frozen_epoch`]).
    groups: BTreeMap<u32, u64>,
    /// Slots still to gather from; the first is being gathered.
    sources: VecDeque<u16>,
    /// Where the scan of the first source resumes.
    cursor: GatherCursor,
    /// The page request awaiting an answer (resent until one comes);
    /// `None` until the current source is asked (or after a refusal).
    msg: Option<Msg>,
    next_send: u64,
}

/// A restored group's ready report to the orchestrator.
struct RestoreReport {
    /// The restore's start epoch.
    epoch: u64,
    /// The report, resent until answered; `None` once answered (then the
    /// table moves on).
    msg: Option<Msg>,
    next_send: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum PullStage {
    /// Asking the owner for pages.
    Pulling,
    /// Telling the orchestrator the copy is done.
    Reporting,
    /// The orchestrator knows; wait for the table to move on.
    Reported,
}

/// An anti-entropy walk over the coordinator rows of one group, checking
/// their copies name by name.
struct SyncWalk {
    /// The (copy index, slot owning the copy) pairs to check; `None`:
    /// every copy.
    only: Option<std::collections::BTreeSet<(u8, u16)>>,
    /// Walking tombstones (records are done).
    tombs: bool,
    /// The last name looked at ("" from the start).
    after: String,
}

/// A replication message waiting for its acknowledgement.
struct Inflight {
    name: String,
    op: u64,
    index: usize,
    msg: Msg,
    next_send: u64,
    delay: u64,
    give_up: u64,
}

/// A metadata node's state machine.
pub struct MnCore<P> {
    db: MetaDb,
    table: Table,
    slot: u16,
    // Ordered maps: `tick` walks them, and the simulation needs the same
    // order on every run.
    pending: BTreeMap<String, Pending<P>>,
    inflight: BTreeMap<u64, Inflight>,
    replies: HashMap<(P, u64), Msg>,
    reply_order: VecDeque<(P, u64)>,
    next_req: u64,
    next_op: u64,
    nonce: u64,
    /// Repair copies under way, by name.
    repairs: BTreeMap<String, Repair>,
    /// What repair has done since the node started ([`RepairStats`]).
    repair_counts: RepairStats,
    /// Where the repair scan resumes: a group and the last name looked at.
    repair_cursor: Option<(u32, Option<String>)>,
    /// No repair step before this time.
    next_repair: u64,
    /// The repair scan's drain counts, while storage nodes are drained.
    drain_pass: Option<DrainPass>,
    /// Replica addresses reported damaged (by a storage node's scrub or a
    /// tenant's Get), waiting for repair (see `damaged`).
    damaged: damaged::DamagedReports,
    /// Groups this node owns and is handing over, sealed for the final
    /// copy under the freeze of this epoch: no change of them is accepted
    /// (and no Get answered, since the new owner may be answering already).
    sealed: BTreeMap<u32, u64>,
    /// Whether the last unsealing failed on a database error: seals the
    /// table no longer freezes are kept (refusing changes is safe) until
    /// the next table retries.
    stale_seals: bool,
    /// Groups this node is taking over, being copied.
    pulls: BTreeMap<u32, Pull>,
    /// Groups this node is gathering after their owner died.
    restore: Option<Restore>,
    /// Restored groups reported (or being reported) to the orchestrator.
    restored: BTreeMap<u32, RestoreReport>,
    /// Pause between anti-entropy passes (0: none).
    sync_ms: u64,
    /// When the next anti-entropy pass starts (set at the first tick).
    next_sync: Option<u64>,
    /// Digests sent this pass, awaiting their answer: the slot asked.
    sync_asks: BTreeMap<u64, u16>,
    /// Groups whose copies are being checked name by name.
    sync_walks: BTreeMap<u32, SyncWalk>,
}

/// The anti-entropy digest keys of a row of `name` in group `mg` (see
/// [`crate::metadata::database::SyncKey`]), under the address layout and replication
/// of `t` (fixed when the cluster is created).
fn classifier(t: &Table) -> Classify {
    let t = Table {
        epoch: t.epoch,
        routed: t.routed,
        buckets: t.buckets.clone(),
        ..Table::new(t.layout, t.params)
    };
    Box::new(move |mg, name| {
        let groups: Vec<u32> = t
            .meta_addrs(name)
            .iter()
            .filter_map(|&a| t.layout.mg_of(a))
            .collect();
        let Some(&coord) = groups.first() else {
            return Vec::new();
        };
        if coord == mg {
            groups
                .iter()
                .enumerate()
                .skip(1)
                .map(|(i, &h)| (coord, i as u8, h, true))
                .collect()
        } else {
            groups
                .iter()
                .position(|&h| h == mg)
                .map(|i| vec![(coord, i as u8, mg, false)])
                .unwrap_or_default()
        }
    })
}

/// Whether a copy whose newest state is `copy` is behind the
/// coordinator's (`version`, `deleted`): older, missing, or a record
/// where the coordinator deleted that very version.
fn behind(copy: Option<(u64, bool)>, version: u64, deleted: bool) -> bool {
    match copy {
        None => true,
        Some((v, d)) => v < version || (v == version && deleted && !d),
    }
}

impl<P: Clone + Eq + Hash> MnCore<P> {
    /// A core over `db`, serving slot `slot` of `table`. `nonce` seeds
    /// request ids and replica ids (make it differ across restarts).
    pub fn new(db: MetaDb, table: Table, slot: u16, nonce: u64) -> Self {
        // Seals survive a restart (see `MetaDb::sealed`); an unreadable
        // list is treated as none, as before this node sealed anything.
        let sealed = db.sealed().unwrap_or_default().into_iter().collect();
        let mut core = MnCore {
            db,
            table,
            slot,
            pending: BTreeMap::new(),
            inflight: BTreeMap::new(),
            replies: HashMap::new(),
            reply_order: VecDeque::new(),
            next_req: splitmix64(nonce) | 1 << 63,
            next_op: 0,
            nonce,
            repairs: BTreeMap::new(),
            repair_counts: RepairStats::default(),
            repair_cursor: None,
            next_repair: 0,
            drain_pass: None,
            damaged: damaged::DamagedReports::default(),
            sealed,
            stale_seals: false,
            pulls: BTreeMap::new(),
            restore: None,
            restored: BTreeMap::new(),
            sync_ms: DEFAULT_SYNC_MS,
            next_sync: None,
            sync_asks: BTreeMap::new(),
            sync_walks: BTreeMap::new(),
        };
        // Without digests (a database error), every pass walks every
        // group name by name instead.
        if let Err(e) = core.db.index_sync(classifier(&core.table)) {
            tracing::warn!("indexing the anti-entropy digests: {}", e.report());
        }
        core.prune_sealed();
        core.drop_foreign_groups();
        core
    }

    /// Drops the rows of groups this node neither owns nor is taking over:
    /// left by a handover that ended while this node was down (its table
    /// then never showed the change of owner).
    fn drop_foreign_groups(&mut self) {
        for g in 0..self.table.mg_owner.len() as u32 {
            let ours = self.table.mg_owner.get(g as usize) == Some(&self.slot);
            let coming = self.table.move_of(g).is_some_and(|m| m.to == self.slot);
            if ours || coming || !self.db.group_has_rows(g).unwrap_or(false) {
                continue;
            }
            if let Err(e) = self.db.drop_group(g) {
                tracing::warn!(
                    "dropping group {g}, handed over to another node: {}",
                    e.report()
                );
            }
        }
    }

    /// Unseals the groups the table no longer freezes at their seal's epoch
    /// (handed over, or the freeze called off).
    fn prune_sealed(&mut self) {
        let t = &self.table;
        let gone: Vec<u32> = self
            .sealed
            .iter()
            .filter(|&(&g, &e)| {
                !t.move_of(g)
                    .is_some_and(|m| m.phase == MovePhase::Frozen && m.frozen_epoch == e)
            })
            .map(|(&g, _)| g)
            .collect();
        self.stale_seals = false;
        for g in gone {
            if let Err(e) = self.db.set_sealed(g, None) {
                // Kept sealed: refusing changes is safe, the next table retries.
                tracing::warn!("unsealing group {g}: {}", e.report());
                self.stale_seals = true;
                continue;
            }
            self.sealed.remove(&g);
        }
    }

    /// Replaces the prefix table (new storage nodes, states, capacities,
    /// group owners and handovers). A group handed over to another node is
    /// dropped from the database: the new owner holds all of it, and stale
    /// rows here would keep unreferenced replicas from being collected.
    pub fn set_table(&mut self, table: Table) {
        let old = std::mem::replace(&mut self.table, table);
        self.prune_sealed();
        let t = &self.table;
        let slot = self.slot;
        self.pulls
            .retain(|&g, _| t.move_of(g).is_some_and(|m| m.to == slot));
        // A restore reassigned or restarted (another epoch) starts over.
        let still = |g: u32, epoch: u64| {
            t.move_of(g).is_some_and(|m| {
                m.to == slot && m.phase == MovePhase::Restoring && m.frozen_epoch == epoch
            })
        };
        self.restored.retain(|&g, r| still(g, r.epoch));
        if let Some(r) = self.restore.as_mut() {
            r.groups.retain(|&g, &mut e| still(g, e));
            if r.groups.is_empty() {
                self.restore = None;
            }
        }
        for (g, &was) in old.mg_owner.iter().enumerate() {
            let g = g as u32;
            let now = t.mg_owner.get(g as usize).copied();
            // Not when the group is (again) coming to this node: a table
            // fetched before the handover ended can arrive after the one
            // that ended it.
            let coming = t.move_of(g).is_some_and(|m| m.to == slot);
            if was == slot && now.is_some_and(|o| o != slot) && !coming {
                if let Err(e) = self.db.drop_group(g) {
                    tracing::warn!("dropping handed-over group {g}: {}", e.report());
                }
            }
        }
    }

    /// Sets the pause between two anti-entropy passes, in milliseconds
    /// (0: no pass). Each pass sends every metadata node holding copies of
    /// the names this node coordinates one digest per (group, copy index),
    /// then checks name by name the copies whose digest differs. The
    /// first pass starts one pause after the first tick.
    pub fn set_sync_interval(&mut self, ms: u64) {
        self.sync_ms = ms;
        self.next_sync = None;
    }

    /// The table in use.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// The metadata database.
    pub fn db(&self) -> &MetaDb {
        &self.db
    }

    /// Metadata groups this node owns.
    pub fn owned_groups(&self) -> Vec<u32> {
        (0..self.table.mg_owner.len() as u32)
            .filter(|&mg| self.table.mg_owner[mg as usize] == self.slot)
            .collect()
    }

    fn owns(&self, addr: Addr) -> Option<u32> {
        let mg = self.table.layout.mg_of(addr)?;
        (self.table.mg_owner.get(mg as usize) == Some(&self.slot)).then_some(mg)
    }

    /// Like `owns`, for writing: not a group sealed for its final copy
    /// (such a row goes out as a replication message instead, refused
    /// and resent until the new owner holds the group).
    fn owns_writable(&self, addr: Addr) -> Option<u32> {
        self.owns(addr).filter(|&mg| !self.is_sealed(mg))
    }

    /// Whether group `mg` is frozen by the table, or being restored: no
    /// new change may start (a restored group's versions are not known
    /// until its rows are gathered).
    fn is_frozen(&self, mg: u32) -> bool {
        self.table
            .move_of(mg)
            .is_some_and(|m| matches!(m.phase, MovePhase::Frozen | MovePhase::Restoring))
    }

    /// Whether group `mg` is sealed here for its final copy.
    fn is_sealed(&self, mg: u32) -> bool {
        self.sealed.contains_key(&mg)
    }

    /// Refuses a new change of a name coordinated in a frozen group or
    /// one being restored.
    fn not_frozen(&self, mg: u32) -> Result<(), Error> {
        if self.table.restoring(mg) {
            return Err(restoring(mg));
        }
        if self.is_frozen(mg) {
            return Err(moving(mg));
        }
        Ok(())
    }

    /// Refuses any change (and Get) in a group sealed for its final copy.
    fn not_sealed(&self, mg: u32) -> Result<(), Error> {
        if self.is_sealed(mg) {
            return Err(moving(mg));
        }
        Ok(())
    }

    /// The group coordinating `name` (its first metadata address's).
    fn coordinator_group(&self, name: &str) -> Option<u32> {
        let first = *self.table.meta_addrs(name).first()?;
        self.table.layout.mg_of(first)
    }

    /// Handles one incoming message from `from` at time `now` (ms).
    pub fn handle(&mut self, now: u64, from: P, msg: Msg) -> Vec<Out<P>> {
        let mut out = Vec::new();
        if let Some(g) = self.pull_awaiting(msg.req) {
            self.on_pull_reply(now, g, msg, &mut out);
            return out;
        }
        if self
            .restore
            .as_ref()
            .and_then(|r| r.msg.as_ref())
            .is_some_and(|m| m.req == msg.req)
        {
            self.on_gathered(now, msg.body, &mut out);
            return out;
        }
        if let Some(g) = self.report_awaiting(msg.req) {
            self.on_report_reply(g, msg.body);
            return out;
        }
        if let Body::SyncDiff { pairs } = &msg.body {
            if let Some(slot) = self.sync_asks.remove(&msg.req) {
                self.on_sync_diff(slot, pairs);
            }
            return out;
        }
        match &msg.body {
            Body::Done { .. } | Body::Error { .. } => self.on_ack(now, &msg, &mut out),
            _ => {
                let key = (from.clone(), msg.req);
                if is_mutation(&msg.body) {
                    if let Some(cached) = self.replies.get(&key) {
                        out.push(Out::Reply(from, cached.clone()));
                        return out;
                    }
                }
                let reply = match self.request(now, &from, &msg, &mut out) {
                    Ok(Some(body)) => Some(msg.reply(body)),
                    Ok(None) => None,
                    Err(Error::Remote { code, message }) => Some(msg.error(code, message)),
                    Err(e) => Some(msg.error(Code::Unavailable, e.report().to_string())),
                };
                if let Some(reply) = reply {
                    self.reply(from, reply, &mut out);
                }
            }
        }
        out
    }

    fn reply(&mut self, to: P, msg: Msg, out: &mut Vec<Out<P>>) {
        if is_final(&msg.body) {
            let key = (to.clone(), msg.req);
            if self.replies.insert(key.clone(), msg.clone()).is_none() {
                self.reply_order.push_back(key);
            }
            while self.reply_order.len() > REPLY_CACHE {
                if let Some(old) = self.reply_order.pop_front() {
                    self.replies.remove(&old);
                }
            }
        }
        out.push(Out::Reply(to, msg));
    }

    /// Handles a request; `Ok(None)` means the reply comes later.
    fn request(
        &mut self,
        now: u64,
        from: &P,
        msg: &Msg,
        out: &mut Vec<Out<P>>,
    ) -> Result<Option<Body>, Error> {
        match &msg.body {
            Body::PostBegin { name, size, class } => {
                let mg = self.coordinator_check(msg.target, name)?;
                self.not_frozen(mg)?;
                self.post_begin(now, from, msg.req, name, *size, *class)
                    .map(Some)
            }
            Body::PostInline {
                name,
                class,
                crc,
                data,
                attributes,
            } => {
                let mg = self.coordinator_check(msg.target, name)?;
                self.not_frozen(mg)?;
                let post = writes::Inline {
                    class: *class,
                    crc: *crc,
                    data,
                    attributes,
                };
                self.post_inline(now, from, msg.req, name, post, out)
            }
            Body::PostCommit {
                name,
                version,
                crc,
                attributes,
                fragment_crcs,
            } => {
                self.coordinator_check(msg.target, name)?;
                let commit = writes::Commit {
                    version: *version,
                    crc: *crc,
                    attributes,
                    fragment_crcs,
                    inline: None,
                };
                self.post_commit(now, from, msg.req, name, commit, out)
            }
            Body::PostAbort { name, version } => {
                self.coordinator_check(msg.target, name)?;
                if let Some(p) = self.pending.get(name) {
                    if p.version == *version {
                        if let Phase::Data { replicas, .. } = &p.phase {
                            out.extend(replicas.iter().map(|&a| Out::Free(a)));
                            self.pending.remove(name);
                        }
                    }
                }
                Ok(Some(Body::Done { version: *version }))
            }
            Body::DamagedReplicas { addrs } => Ok(Some(Body::Done {
                version: self.damaged_reported(addrs),
            })),
            Body::BadReplica { name, replica } => {
                let mg = self.coordinator_check(msg.target, name)?;
                self.bad_replica(now, mg, name, *replica, out).map(Some)
            }
            Body::PutAbandoned { replica } => {
                self.owned(msg.target)?;
                let version = self.abandon(*replica, out);
                Ok(Some(Body::Done { version }))
            }
            // A tenant's Link reaches the core only with a proof for its
            // replicas, checked by the gate (`auth::check_link_proof`).
            Body::Link { record, .. } => {
                let mg = self.coordinator_check(msg.target, &record.name)?;
                if !self.in_progress(&record.name, from, msg.req) {
                    self.not_frozen(mg)?;
                }
                self.link(now, from, msg.req, record, out)
            }
            Body::Update { record, if_version } => {
                let mg = self.coordinator_check(msg.target, &record.name)?;
                if !self.in_progress(&record.name, from, msg.req) {
                    self.not_frozen(mg)?;
                }
                self.update(now, from, msg.req, record, *if_version, out)
            }
            Body::Get { name } => self.get(msg.target, name).map(Some),
            // The runtime adds the proof, for the tenant the gate admitted.
            Body::GetLinkProof { name } => match self.get(msg.target, name)? {
                Body::Found { record, .. } => Ok(Some(Body::LinkProof {
                    record,
                    proof: Vec::new(),
                })),
                other => Ok(Some(other)),
            },
            Body::MgPull {
                group,
                epoch,
                tombs,
                after,
            } => self
                .serve_pull(msg.target, *group, *epoch, *tombs, after)
                .map(Some),
            Body::MgGather { groups, slot, from } => {
                self.serve_gather(groups, *slot, from).map(Some)
            }
            Body::GetRepairCounts => Ok(Some(Body::RepairCounts(self.repair_stats()))),
            Body::Referenced { addrs } => {
                let query: std::collections::HashSet<Addr> = addrs.iter().copied().collect();
                let mut found: std::collections::HashSet<Addr> =
                    self.db.referenced(&query)?.into_iter().collect();
                // Posts not committed yet and repair copies name theirs too.
                found.extend(self.pending_replicas().filter(|a| query.contains(a)));
                Ok(Some(Body::ReferencedBy {
                    addrs: found.into_iter().collect(),
                }))
            }
            Body::Delete {
                name,
                if_version,
                keep_data,
            } => {
                let mg = self.coordinator_check(msg.target, name)?;
                if !self.in_progress(name, from, msg.req) {
                    self.not_frozen(mg)?;
                }
                self.delete(now, from, msg.req, name, *if_version, *keep_data, out)
            }
            Body::List {
                prefix,
                after,
                limit,
            } => self.list(prefix, after, *limit).map(Some),
            Body::Replicate { record } => {
                let mg = self.replica_check(msg.target, &record.name)?;
                self.not_sealed(mg)?;
                self.db.apply_record(mg, record)?;
                Ok(Some(Body::Done {
                    version: record.version,
                }))
            }
            Body::Unreplicate { name, version } => {
                let mg = self.replica_check(msg.target, name)?;
                self.not_sealed(mg)?;
                self.db.apply_delete(mg, name, *version)?;
                Ok(Some(Body::Done { version: *version }))
            }
            Body::Refresh {
                name,
                version,
                copy,
            } => {
                self.refresh(msg.target, name, *version, *copy, out)?;
                // Answered by the replication message, if any.
                Ok(None)
            }
            Body::SyncDigest { sums } => {
                self.owned(msg.target)?;
                Ok(Some(self.sync_diff(sums)))
            }
            Body::SyncCheck { entries } => {
                self.sync_check(entries, out);
                // Answered by refresh requests to the coordinators, if any.
                Ok(None)
            }
            _ => Err(remote(
                Code::BadRequest,
                "this message is not a request a metadata node serves",
            )),
        }
    }

    /// Checks that `target` is `name`'s first metadata address and ours.
    fn coordinator_check(&self, target: Addr, name: &str) -> Result<u32, Error> {
        let addrs = self.table.meta_addrs(name);
        if addrs.first() != Some(&target) {
            return Err(remote(
                Code::WrongAddress,
                format!(
                    "address {} is not the coordinator address of {name:?}",
                    strata_store_protocol::addr::fmt_addr(target)
                ),
            ));
        }
        self.owned(target)
    }

    /// Checks that `target` is one of `name`'s metadata addresses and ours.
    fn replica_check(&self, target: Addr, name: &str) -> Result<u32, Error> {
        if !self.table.meta_addrs(name).contains(&target) {
            return Err(remote(
                Code::WrongAddress,
                format!(
                    "address {} is not a metadata address of {name:?}",
                    strata_store_protocol::addr::fmt_addr(target)
                ),
            ));
        }
        self.owned(target)
    }

    fn owned(&self, target: Addr) -> Result<u32, Error> {
        self.owns(target).ok_or_else(|| {
            remote(
                Code::WrongAddress,
                format!(
                    "metadata address {} belongs to a group this node does not own",
                    strata_store_protocol::addr::fmt_addr(target)
                ),
            )
        })
    }

    /// Resends unacknowledged replication messages and expires Posts whose
    /// client went away or whose metadata peers did not answer in time.
    pub fn tick(&mut self, now: u64) -> Vec<Out<P>> {
        let mut out = Vec::new();
        let mut dropped = Vec::new();
        for (&req, inf) in self.inflight.iter_mut() {
            if now >= inf.give_up {
                dropped.push(req);
            } else if now >= inf.next_send {
                out.push(Out::ToMeta(inf.msg.clone()));
                inf.delay = (inf.delay * 2).min(RESEND_MAX_MS);
                inf.next_send = now + inf.delay;
            }
        }
        for req in dropped {
            self.inflight.remove(&req);
        }
        self.repair_step(now, &mut out);
        self.handover_step(now, &mut out);
        self.restore_step(now, &mut out);
        self.sync_step(now, &mut out);
        let expired: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| now >= p.deadline)
            .map(|(n, _)| n.clone())
            .collect();
        for name in expired {
            let Some(p) = self.pending.remove(&name) else {
                continue;
            };
            match p.phase {
                Phase::Data { replicas, .. } => out.extend(replicas.into_iter().map(Out::Free)),
                Phase::Replicating { acked, needed, .. } => {
                    let have = acked.iter().filter(|&&a| a).count();
                    let reply = Msg::new(
                        p.client_req,
                        0,
                        Body::Error {
                            code: Code::Unavailable,
                            message: format!(
                                "only {have} of the W_m={needed} metadata replicas of {name:?} answered in time"
                            ),
                        },
                    );
                    self.reply(p.client, reply, &mut out);
                }
            }
        }
        out
    }

    /// Restores under way: (groups being gathered, sources left, ready
    /// reports not answered yet).
    pub fn restore_progress(&self) -> (usize, usize, usize) {
        let (groups, sources) = self
            .restore
            .as_ref()
            .map_or((0, 0), |r| (r.groups.len(), r.sources.len()));
        let reports = self.restored.values().filter(|r| r.msg.is_some()).count();
        (groups, sources, reports)
    }

    /// Groups this node is taking over: (group, final copy, copy done).
    pub fn pulls(&self) -> Vec<(u32, bool, bool)> {
        self.pulls
            .iter()
            .map(|(&g, p)| (g, p.epoch > 0, p.stage != PullStage::Pulling))
            .collect()
    }

    /// Groups sealed here for their final copy.
    pub fn sealed_groups(&self) -> Vec<u32> {
        self.sealed.keys().copied().collect()
    }

    /// Repair copies under way.
    pub fn repair_count(&self) -> usize {
        self.repairs.len()
    }

    /// Number of names locked by a Post or Delete in progress.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }
}

fn is_mutation(body: &Body) -> bool {
    matches!(
        body,
        Body::PostBegin { .. }
            | Body::PostInline { .. }
            | Body::PostCommit { .. }
            | Body::Link { .. }
            | Body::Update { .. }
            | Body::Delete { .. }
    )
}

fn is_final(body: &Body) -> bool {
    // A "moving" refusal is not: the same request may succeed later.
    !matches!(
        body,
        Body::Found { .. }
            | Body::LinkProof { .. }
            | Body::ListPage { .. }
            | Body::MgRows { .. }
            | Body::SyncDiff { .. }
            | Body::Error {
                code: Code::Moving,
                ..
            }
    )
}

/// The refusal of a change (or Get) in a group being restored.
fn restoring(mg: u32) -> Error {
    remote(
        Code::Moving,
        format!(
            "metadata group {mg} is being restored after its metadata node failed; retry shortly"
        ),
    )
}

/// The refusal of a change (or Get) in a group being handed over.
fn moving(mg: u32) -> Error {
    remote(
        Code::Moving,
        format!("metadata group {mg} is being handed over to another metadata node; retry shortly"),
    )
}

fn remote(code: Code, message: impl Into<String>) -> Error {
    Error::Remote {
        code,
        message: message.into(),
    }
}

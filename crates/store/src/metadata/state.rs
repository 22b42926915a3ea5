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

use crate::metadata::database::{Classify, MetaDb};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::Hash;
use strata_store_protocol::addr::{splitmix64, Addr};
use strata_store_protocol::table::{Device, MovePhase, State, Table};
use strata_store_protocol::wire::{Body, Code, GatherCursor, Msg, Record, Row, SyncEntry, SyncSum};
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
    deadline: u64,
}

enum Phase {
    /// Waiting for the client's data and `PostCommit`.
    Data { size: u64, replicas: Vec<Addr> },
    /// Stored locally; replicating until W_m addresses acknowledge.
    Replicating {
        acked: Vec<bool>,
        needed: usize,
        free_after: Vec<Addr>,
        /// The answer once W_m hold it (`None`: Done with the version).
        answer: Option<Body>,
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
    /// Where the repair scan resumes: a group and the last name looked at.
    repair_cursor: Option<(u32, Option<String>)>,
    /// No repair step before this time.
    next_repair: u64,
    /// The repair scan's drain counts, while storage nodes are drained.
    drain_pass: Option<DrainPass>,
    /// Groups this node owns and is handing over, sealed for the final
    /// copy under the freeze of this epoch: no change of them is accepted
    /// (and no Get answered, since the new owner may be answering already).
    sealed: BTreeMap<u32, u64>,
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
            repair_cursor: None,
            next_repair: 0,
            drain_pass: None,
            sealed,
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
            tracing::warn!("indexing the anti-entropy digests: {e}");
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
                tracing::warn!("dropping group {g}, handed over to another node: {e}");
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
        for g in gone {
            if let Err(e) = self.db.set_sealed(g, None) {
                // Kept sealed: refusing changes is safe, the next table retries.
                tracing::warn!("unsealing group {g}: {e}");
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
                    tracing::warn!("dropping handed-over group {g}: {e}");
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
                    Err(e) => Some(msg.error(Code::Unavailable, e.to_string())),
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
            Body::PostBegin { name, size } => {
                let mg = self.coordinator_check(msg.target, name)?;
                self.not_frozen(mg)?;
                self.post_begin(now, from, msg.req, name, *size).map(Some)
            }
            Body::PostCommit { name, version, crc } => {
                self.coordinator_check(msg.target, name)?;
                self.post_commit(now, from, msg.req, name, *version, *crc, out)
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
            } => {
                let limit = (*limit).clamp(1, 1000) as usize;
                let (entries, more) = self.db.list(&self.owned_groups(), prefix, after, limit)?;
                Ok(Some(fit_page(entries, more)))
            }
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

    /// Drops the Post in its data phase whose first replica is `replica`:
    /// a storage node saw its client's connection close before the data
    /// was whole ([`Body::PutAbandoned`]), so the client is gone and its
    /// name is unlocked now rather than at the data deadline. Its replicas
    /// are freed. Returns the version dropped (0: none matched, as for a
    /// Post already committed or aborted).
    fn abandon(&mut self, replica: Addr, out: &mut Vec<Out<P>>) -> u64 {
        let found = self.pending.iter().find_map(|(name, p)| match &p.phase {
            Phase::Data { replicas, .. } if replicas.first() == Some(&replica) => {
                Some(name.clone())
            }
            _ => None,
        });
        let Some(p) = found.and_then(|name| self.pending.remove(&name)) else {
            return 0;
        };
        if let Phase::Data { replicas, .. } = p.phase {
            out.extend(replicas.into_iter().map(Out::Free));
        }
        p.version
    }

    /// Whether this request is a resend of the one `name` is locked for:
    /// it will be answered when that one finishes (answering Conflict would
    /// tell the client its own operation did not happen).
    fn in_progress(&self, name: &str, from: &P, req: u64) -> bool {
        self.pending
            .get(name)
            .is_some_and(|p| &p.client == from && p.client_req == req)
    }

    fn post_begin(
        &mut self,
        now: u64,
        from: &P,
        req: u64,
        name: &str,
        size: u64,
    ) -> Result<Body, Error> {
        if size > strata_store_protocol::wire::MAX_OBJECT {
            return Err(remote(
                Code::BadRequest,
                format!("object size {size} exceeds the 1 TiB limit"),
            ));
        }
        if let Some(p) = self.pending.get(name) {
            return Err(remote(
                Code::Conflict,
                format!(
                    "another Post or Delete of {name:?} (version {}) is in progress",
                    p.version
                ),
            ));
        }
        let mg0 = self.owned(self.table.meta_addrs(name)[0])?;
        let version = self.db.latest_version(mg0, name)? + 1;
        let replicas = self.place(name, version, size)?;
        self.next_op += 1;
        self.pending.insert(
            name.to_string(),
            Pending {
                op: self.next_op,
                version,
                client: from.clone(),
                client_req: req,
                deadline: now + DATA_BASE_MS + size / (16 << 20) * 1000,
                phase: Phase::Data {
                    size,
                    replicas: replicas.clone(),
                },
            },
        );
        // The runtime puts the ticket in (it holds the key).
        Ok(Body::PostPlan {
            version,
            size,
            replicas,
            ticket: Vec::new(),
        })
    }

    /// Chooses storage nodes: up, with room, the preferred device type
    /// first (SSD for small objects, HDD for large), then most free space,
    /// with a per-object hash so equal nodes share the load.
    fn place(&mut self, name: &str, version: u64, size: u64) -> Result<Vec<Addr>, Error> {
        let params = self.table.params_for(name);
        self.place_n(
            name,
            version,
            size,
            params.n_d as usize,
            params.w_d as usize,
            &[],
        )
    }

    /// Chooses up to `count` storage nodes (at least `min`) as [`place`]
    /// does, leaving out the prefixes in `exclude`.
    ///
    /// [`place`]: MnCore::place
    fn place_n(
        &mut self,
        name: &str,
        version: u64,
        size: u64,
        count: usize,
        min: usize,
        exclude: &[u16],
    ) -> Result<Vec<Addr>, Error> {
        let want = if size < SMALL_OBJECT {
            Device::Ssd
        } else {
            Device::Hdd
        };
        let seed = strata_store_protocol::addr::hash(name.as_bytes(), version);
        let mut candidates: Vec<_> = self
            .table
            .sns
            .iter()
            .filter(|s| {
                s.state == State::Up
                    && s.free >= size
                    && !exclude.contains(&s.index)
                    // A node being drained takes no new replica.
                    && !self.table.retiring(s.index)
            })
            .map(|s| {
                let jitter = splitmix64(seed ^ s.uuid) % 1024 + 1;
                let score = (s.free >> 20).saturating_add(1).saturating_mul(jitter);
                ((s.device == want) as u8, score, s.index)
            })
            .collect();
        if candidates.len() < min {
            return Err(remote(
                Code::Unavailable,
                format!(
                    "{} storage nodes are up (and not being retired) with {size} bytes free \
                     and {min} are needed: add storage nodes or free space",
                    candidates.len(),
                ),
            ));
        }
        candidates.sort_by_key(|c| std::cmp::Reverse((c.0, c.1)));
        candidates.truncate(count);
        Ok(candidates
            .iter()
            .map(|&(_, _, index)| {
                self.nonce = splitmix64(self.nonce);
                self.table.layout.replica_addr(index, self.nonce)
            })
            .collect())
    }

    #[allow(clippy::too_many_arguments)]
    fn post_commit(
        &mut self,
        now: u64,
        from: &P,
        req: u64,
        name: &str,
        version: u64,
        crc: u32,
        out: &mut Vec<Out<P>>,
    ) -> Result<Option<Body>, Error> {
        let Some(p) = self.pending.get(name) else {
            let mg0 = self.owned(self.table.meta_addrs(name)[0])?;
            self.not_frozen(mg0)?;
            if let Some(r) = self.db.get(mg0, name)? {
                // Committed here before a restart lost the replication
                // state: replicate again before acknowledging. The version
                // alone does not tell: the plan was lost with the restart,
                // so a repair may have taken the same version since (for
                // the old data); the checksum must be this Post's too.
                if r.version == version && r.crc == crc && r.rename.is_none() {
                    return self.commit_record(now, from.clone(), req, r, Vec::new(), out);
                }
            }
            return Err(remote(
                Code::Conflict,
                format!("no Post of {name:?} version {version} is in progress (it expired or the node restarted); post again"),
            ));
        };
        let Phase::Data { size, replicas } = &p.phase else {
            return Ok(None);
        };
        if p.version != version {
            return Err(remote(
                Code::Conflict,
                format!(
                    "Post of {name:?} is at version {}, not {version}",
                    p.version
                ),
            ));
        }
        let record = Record {
            name: name.to_string(),
            size: *size,
            crc,
            version,
            meta: self.table.meta_addrs(name),
            replicas: replicas.clone(),
            rename: None,
        };
        // A Post over an existing object frees the old replicas once the new
        // record is acknowledged, unless an interrupted rename may share
        // them with another name (a leak then, never a loss).
        let mg0 = self.owned(record.meta[0])?;
        let old = self
            .db
            .get(mg0, name)?
            .filter(|r| r.rename.is_none())
            .map(|r| r.replicas)
            .unwrap_or_default();
        // Answer the commit request itself (its own request id and socket).
        self.commit_record(now, from.clone(), req, record, old, out)
    }

    /// Whether a change of `name` may start: `Ok(false)` for a resend of
    /// the request already in progress (its answer will come), an error
    /// while another Post or Delete of the name runs.
    fn admit(&self, name: &str, from: &P, req: u64) -> Result<bool, Error> {
        if self.in_progress(name, from, req) {
            return Ok(false);
        }
        if self.pending.contains_key(name) {
            return Err(remote(
                Code::Conflict,
                format!("a Post or Delete of {name:?} is in progress"),
            ));
        }
        Ok(true)
    }

    /// Replaces a record's rename link (nothing else may change) under a
    /// new version, if the stored record is at `if_version`.
    fn update(
        &mut self,
        now: u64,
        from: &P,
        req: u64,
        record: &Record,
        if_version: u64,
        out: &mut Vec<Out<P>>,
    ) -> Result<Option<Body>, Error> {
        let name = &record.name;
        if !self.admit(name, from, req)? {
            return Ok(None);
        }
        let mg0 = self.owned(self.table.meta_addrs(name)[0])?;
        let Some(stored) = self.db.get(mg0, name)? else {
            return Err(remote(Code::NotFound, format!("no object named {name:?}")));
        };
        if stored.version != if_version {
            return Err(remote(
                Code::Conflict,
                format!(
                    "{name:?} is at version {}, not {if_version}",
                    stored.version
                ),
            ));
        }
        if (stored.size, stored.crc, &stored.replicas)
            != (record.size, record.crc, &record.replicas)
        {
            return Err(remote(
                Code::BadRequest,
                "an update may change only the rename link; Post to change the data",
            ));
        }
        let mut rec = stored;
        rec.rename = record.rename.clone();
        rec.version = self.db.latest_version(mg0, name)? + 1;
        rec.meta = self.table.meta_addrs(name);
        self.commit_record(now, from.clone(), req, rec, Vec::new(), out)
    }

    fn link(
        &mut self,
        now: u64,
        from: &P,
        req: u64,
        record: &Record,
        out: &mut Vec<Out<P>>,
    ) -> Result<Option<Body>, Error> {
        let name = &record.name;
        if !self.admit(name, from, req)? {
            return Ok(None);
        }
        let mg0 = self.owned(self.table.meta_addrs(name)[0])?;
        if self.db.get(mg0, name)?.is_some() {
            return Err(remote(
                Code::Exists,
                format!("{name:?} already exists; delete it first"),
            ));
        }
        if record
            .replicas
            .iter()
            .any(|&a| self.table.layout.sn_of(a).is_none())
        {
            return Err(remote(
                Code::BadRequest,
                "a replica address is outside the storage space",
            ));
        }
        let mut rec = record.clone();
        rec.version = self.db.latest_version(mg0, name)? + 1;
        rec.meta = self.table.meta_addrs(name);
        self.commit_record(now, from.clone(), req, rec, Vec::new(), out)
    }

    /// Stores `record` at our own addresses, sends it to the others, and
    /// registers the Post as replicating; replies when W_m hold it.
    fn commit_record(
        &mut self,
        now: u64,
        client: P,
        req: u64,
        record: Record,
        free_after: Vec<Addr>,
        out: &mut Vec<Out<P>>,
    ) -> Result<Option<Body>, Error> {
        let addrs = record.meta.clone();
        let mut acked = vec![false; addrs.len()];
        self.next_op += 1;
        let op = self.next_op;
        for (i, &a) in addrs.iter().enumerate() {
            if let Some(mg) = self.owns_writable(a) {
                acked[i] = self.db.apply_record(mg, &record)?;
            } else {
                let msg = Msg::new(
                    0,
                    a,
                    Body::Replicate {
                        record: record.clone(),
                    },
                );
                self.send_replication(now, &record.name, op, i, msg, out);
            }
        }
        self.start_replicating(
            now,
            client,
            req,
            &record.name,
            op,
            record.version,
            acked,
            free_after,
            None,
            out,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn start_replicating(
        &mut self,
        now: u64,
        client: P,
        req: u64,
        name: &str,
        op: u64,
        version: u64,
        acked: Vec<bool>,
        free_after: Vec<Addr>,
        answer: Option<Body>,
        out: &mut Vec<Out<P>>,
    ) -> Result<Option<Body>, Error> {
        let needed = self.table.params_for(name).w_m as usize;
        self.pending.insert(
            name.to_string(),
            Pending {
                op,
                version,
                client,
                client_req: req,
                deadline: now + COMMIT_TIMEOUT_MS,
                phase: Phase::Replicating {
                    acked,
                    needed,
                    free_after,
                    answer,
                },
            },
        );
        self.maybe_finish(name, out);
        Ok(None)
    }

    fn send_replication(
        &mut self,
        now: u64,
        name: &str,
        op: u64,
        index: usize,
        mut msg: Msg,
        out: &mut Vec<Out<P>>,
    ) {
        self.next_req = self.next_req.wrapping_add(1) | 1 << 63;
        msg.req = self.next_req;
        out.push(Out::ToMeta(msg.clone()));
        self.inflight.insert(
            msg.req,
            Inflight {
                name: name.to_string(),
                op,
                index,
                msg,
                next_send: now + RESEND_MS,
                delay: RESEND_MS,
                give_up: now + REPLICATE_GIVE_UP_MS,
            },
        );
    }

    /// An acknowledgement (or refusal) of one of our replication messages.
    fn on_ack(&mut self, _now: u64, msg: &Msg, out: &mut Vec<Out<P>>) {
        if !self.inflight.contains_key(&msg.req) {
            return;
        }
        if matches!(msg.body, Body::Error { .. }) {
            // A transient failure there, or a group handed over (refused
            // while sealed; a node whose table is older or newer than
            // ours): keep resending, each resend routed by the table then.
            return;
        }
        let Some(inf) = self.inflight.remove(&msg.req) else {
            return;
        };
        if let Some(p) = self.pending.get_mut(&inf.name) {
            if let (true, Phase::Replicating { acked, .. }) = (p.op == inf.op, &mut p.phase) {
                if let Some(a) = acked.get_mut(inf.index) {
                    *a = true;
                }
            }
        }
        self.maybe_finish(&inf.name, out);
    }

    /// Acknowledges the client once W_m addresses hold the update.
    fn maybe_finish(&mut self, name: &str, out: &mut Vec<Out<P>>) {
        let done = match self.pending.get(name) {
            Some(Pending {
                phase: Phase::Replicating { acked, needed, .. },
                ..
            }) => acked.iter().filter(|&&a| a).count() >= *needed,
            _ => false,
        };
        if !done {
            return;
        }
        let Some(p) = self.pending.remove(name) else {
            return;
        };
        let mut body = Body::Done { version: p.version };
        if let Phase::Replicating {
            free_after, answer, ..
        } = p.phase
        {
            out.extend(free_after.into_iter().map(Out::Free));
            body = answer.unwrap_or(body);
        }
        let reply = Msg::new(p.client_req, 0, body);
        // The reply's target is irrelevant to the client; keep the request id.
        self.reply(p.client, reply, out);
    }

    /// Replica addresses this node has handed out but not committed yet:
    /// Posts waiting for their data and repair copies in flight.
    fn pending_replicas(&self) -> impl Iterator<Item = Addr> + '_ {
        let posts = self.pending.values().flat_map(|p| match &p.phase {
            Phase::Data { replicas, .. } => replicas.as_slice(),
            Phase::Replicating { .. } => &[],
        });
        let repairs = self.repairs.values().flat_map(|r| r.targets.iter());
        posts.chain(repairs).copied()
    }

    fn get(&self, target: Addr, name: &str) -> Result<Body, Error> {
        let mg = self.replica_check(target, name)?;
        self.not_sealed(mg)?;
        // Rows still being gathered: a "not found" here could be wrong, so
        // the client falls through to the name's other addresses.
        if self.table.restoring(mg) {
            return Err(restoring(mg));
        }
        if let Some(record) = self.db.get(mg, name)? {
            return Ok(Body::Found {
                record,
                ticket: Vec::new(),
            });
        }
        if self.db.tombstone(mg, name)? > 0 {
            return Err(remote(Code::Deleted, format!("{name:?} was deleted")));
        }
        Err(remote(Code::NotFound, format!("no object named {name:?}")))
    }

    #[allow(clippy::too_many_arguments)]
    fn delete(
        &mut self,
        now: u64,
        from: &P,
        req: u64,
        name: &str,
        if_version: u64,
        keep_data: bool,
        out: &mut Vec<Out<P>>,
    ) -> Result<Option<Body>, Error> {
        if !self.admit(name, from, req)? {
            return Ok(None);
        }
        let addrs = self.table.meta_addrs(name);
        let mg0 = self.owned(addrs[0])?;
        let (version, replicas, answer) = match self.db.get(mg0, name)? {
            Some(rec) => {
                if if_version != 0 && rec.version != if_version {
                    return Err(remote(
                        Code::Conflict,
                        format!("{name:?} is at version {}, not {if_version}", rec.version),
                    ));
                }
                (rec.version, rec.replicas, None)
            }
            None => {
                let tomb = self.db.tombstone(mg0, name)?;
                if tomb == 0 {
                    return Err(remote(Code::NotFound, format!("no object named {name:?}")));
                }
                // Deleted here, perhaps by this very request before a restart
                // lost its replication: replicate the tombstone again, and
                // answer "deleted" once W_m hold it.
                let answer = Body::Error {
                    code: Code::Deleted,
                    message: format!("no object named {name:?} (deleted)"),
                };
                (tomb, Vec::new(), Some(answer))
            }
        };
        let mut acked = vec![false; addrs.len()];
        self.next_op += 1;
        let op = self.next_op;
        for (i, &a) in addrs.iter().enumerate() {
            if let Some(mg) = self.owns_writable(a) {
                self.db.apply_delete(mg, name, version)?;
                acked[i] = true;
            } else {
                let msg = Msg::new(
                    0,
                    a,
                    Body::Unreplicate {
                        name: name.to_string(),
                        version,
                    },
                );
                self.send_replication(now, name, op, i, msg, out);
            }
        }
        let free_after = if keep_data { Vec::new() } else { replicas };
        self.start_replicating(
            now,
            from.clone(),
            req,
            name,
            op,
            version,
            acked,
            free_after,
            answer,
            out,
        )
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

    /// One step of repair: expires stuck copies and, while some storage
    /// node is dead or being drained, looks at the next batch of records
    /// this node coordinates and starts a copy for each that has fewer
    /// than N_d replicas on live nodes that are not being drained.
    ///
    /// While nodes are drained, each full pass over the groups this node
    /// owns also counts the rows naming each drained node, and ends with
    /// a [`Body::DrainReport`] to the orchestrator per node: sent every
    /// pass, so a lost report is replaced by the next one.
    fn repair_step(&mut self, now: u64, out: &mut Vec<Out<P>>) {
        let expired: Vec<String> = self
            .repairs
            .iter()
            .filter(|(_, r)| now >= r.deadline)
            .map(|(n, _)| n.clone())
            .collect();
        for name in expired {
            if let Some(r) = self.repairs.remove(&name) {
                out.extend(r.targets.into_iter().map(Out::Free));
            }
        }
        let any_dead = self.table.sns.iter().any(|s| s.state == State::Dead);
        let draining = !self.table.drains.is_empty();
        if !draining {
            self.drain_pass = None;
        }
        if !(any_dead || draining) || now < self.next_repair || self.repairs.len() >= MAX_REPAIRS {
            return;
        }
        let groups = self.owned_groups();
        let Some(&first_group) = groups.first() else {
            self.drain_pass = None;
            return;
        };
        let resumed = self
            .repair_cursor
            .take()
            .filter(|(g, _)| groups.contains(g));
        // A drain count is only worth reporting for a pass over the same
        // groups from its first record on.
        let pass_holds = self.drain_pass.as_ref().is_some_and(|p| p.groups == groups);
        let (mut mg, mut after) = match resumed {
            Some(cursor) if !draining || pass_holds => cursor,
            _ => {
                if draining {
                    self.drain_pass = Some(self.start_drain_pass(groups.clone()));
                }
                (first_group, None)
            }
        };
        let mut examined = 0;
        loop {
            let Ok(records) = self
                .db
                .records_after(mg, after.as_deref(), REPAIR_BATCH - examined)
            else {
                self.next_repair = now + REPAIR_PASS_MS;
                self.drain_pass = None;
                return;
            };
            for record in records {
                if self.repairs.len() >= MAX_REPAIRS {
                    // Resume at this record once copies have finished.
                    self.repair_cursor = Some((mg, after));
                    return;
                }
                examined += 1;
                after = Some(record.name.clone());
                let coordinator_row = record
                    .meta
                    .first()
                    .and_then(|&a| self.table.layout.mg_of(a))
                    == Some(mg);
                let drained: Vec<u16> = match &self.drain_pass {
                    Some(p) => record
                        .replicas
                        .iter()
                        .filter_map(|&a| self.table.layout.sn_of(a))
                        .filter(|i| p.counts.contains_key(i))
                        .collect(),
                    None => Vec::new(),
                };
                // A metadata copy naming a drained or dead node may have
                // missed the coordinator's rewrite for good.
                let names_dead = || {
                    record
                        .replicas
                        .iter()
                        .any(|&a| self.table.sn_for(a).is_some_and(|s| s.state == State::Dead))
                };
                if !coordinator_row && (!drained.is_empty() || names_dead()) {
                    self.ask_refresh(mg, &record, out);
                }
                let unplaceable = self.repair_record(now, mg, record, out);
                if let Some(p) = self.drain_pass.as_mut() {
                    for i in drained {
                        let c = p.counts.entry(i).or_default();
                        if coordinator_row {
                            c.0 += 1;
                            c.2 += u64::from(unplaceable);
                        } else {
                            c.1 += 1;
                        }
                    }
                }
            }
            if examined >= REPAIR_BATCH {
                self.repair_cursor = Some((mg, after));
                return;
            }
            // This group is done: on to the next, or the pass is over.
            match groups.iter().find(|&&g| g > mg) {
                Some(&next) => (mg, after) = (next, None),
                None => {
                    self.next_repair = now + REPAIR_PASS_MS;
                    self.report_drains(out);
                    return;
                }
            }
        }
    }

    /// A new drain pass over `groups`. Posts waiting for their data and
    /// repair copies under way that place a replica on a drained node
    /// count as records left: they may commit after the scan has passed
    /// their group. (No new one can start: this node's table shows the
    /// drains, so placement leaves those nodes out.)
    fn start_drain_pass(&self, groups: Vec<u32>) -> DrainPass {
        let mut counts: BTreeMap<u16, (u64, u64, u64)> = self
            .table
            .drains
            .iter()
            .map(|d| (d.index, (0, 0, 0)))
            .collect();
        for a in self.pending_replicas() {
            if let Some(c) = self.table.layout.sn_of(a).and_then(|i| counts.get_mut(&i)) {
                c.0 += 1;
            }
        }
        DrainPass {
            epoch: self.table.epoch,
            groups,
            counts,
            drains: self
                .table
                .drains
                .iter()
                .map(|d| (d.index, d.since))
                .collect(),
        }
    }

    /// Ends a drain pass: one report per drained node to the orchestrator.
    /// Replication messages still being resent that carry a record naming
    /// a drained node count as records left (see
    /// [`MnCore::inflight_naming`]).
    fn report_drains(&mut self, out: &mut Vec<Out<P>>) {
        let Some(mut pass) = self.drain_pass.take() else {
            return;
        };
        for (index, n) in self.inflight_naming(&pass.counts) {
            if let Some(c) = pass.counts.get_mut(&index) {
                c.0 = c.0.saturating_add(n);
            }
        }
        for (index, (left, copies, unplaceable)) in pass.counts {
            // Cancelled (or cancelled and started again) since the scan
            // began: nothing to report for the drain it counted.
            let Some(&drain) = pass.drains.get(&index) else {
                continue;
            };
            if self.table.drain_of(index).map(|d| d.since) != Some(drain) {
                continue;
            }
            self.next_req = self.next_req.wrapping_add(1) | 1 << 63;
            out.push(Out::ToOn(Msg::new(
                self.next_req,
                0,
                Body::DrainReport {
                    slot: self.slot,
                    epoch: pass.epoch,
                    drain,
                    index,
                    left,
                    copies,
                    unplaceable: unplaceable.min(left),
                },
            )));
        }
    }

    /// Per drained node index (a key of `drained`), the replication
    /// messages this node is still resending whose record names it. The
    /// scan sees rows, not these: one landing at a metadata copy after
    /// that copy's scan passed its group writes a row naming the node
    /// there, while this node's own row may have moved on to a version
    /// that does not (the copy applies an older version it lacks). Only
    /// once none is left can every copy's next scan be trusted to show
    /// every such row.
    fn inflight_naming<V>(&self, drained: &BTreeMap<u16, V>) -> BTreeMap<u16, u64> {
        let mut counts = BTreeMap::new();
        for inf in self.inflight.values() {
            let Body::Replicate { record } = &inf.msg.body else {
                continue;
            };
            let mut named: Vec<u16> = record
                .replicas
                .iter()
                .filter_map(|&a| self.table.layout.sn_of(a))
                .filter(|i| drained.contains_key(i))
                .collect();
            // One count per message, however many replicas it names there.
            named.sort_unstable();
            named.dedup();
            for i in named {
                *counts.entry(i).or_insert(0u64) += 1;
            }
        }
        counts
    }

    /// Asks the coordinator of `record` (a metadata copy kept here that
    /// names a drained or dead storage node) for anything newer. A copy
    /// that missed a rewrite for good (its coordinator crashed before the
    /// replication reached it, losing the resends, or they gave up) would
    /// otherwise keep naming the node forever, and hold its drain: the
    /// coordinator's own row is current, so its scan never rewrites the
    /// object again.
    fn ask_refresh(&mut self, mg: u32, record: &Record, out: &mut Vec<Out<P>>) {
        let (Some(&coordinator), Some(copy)) = (
            record.meta.first(),
            record
                .meta
                .iter()
                .copied()
                .find(|&a| self.table.layout.mg_of(a) == Some(mg)),
        ) else {
            return;
        };
        self.next_req = self.next_req.wrapping_add(1) | 1 << 63;
        let body = Body::Refresh {
            name: record.name.clone(),
            version: record.version,
            copy,
        };
        out.push(Out::ToMeta(Msg::new(self.next_req, coordinator, body)));
    }

    /// Serves a [`Body::Refresh`] sent to coordinator address `target`:
    /// pushes this node's row of `name` to the copy at `copy` if it is
    /// newer than the copy's `version`, or its tombstone if that is at
    /// least as new. Sent once, not
    /// tracked: the copy asks again on its next scan if it is lost, and
    /// the copy applies it only if it is still newer (version rules).
    fn refresh(
        &mut self,
        target: Addr,
        name: &str,
        version: u64,
        copy: Addr,
        out: &mut Vec<Out<P>>,
    ) -> Result<(), Error> {
        let mg = self.coordinator_check(target, name)?;
        if copy == target || !self.table.meta_addrs(name).contains(&copy) {
            return Err(remote(
                Code::BadRequest,
                format!(
                    "refresh of {name:?}: {} is not one of its metadata copies",
                    strata_store_protocol::addr::fmt_addr(copy)
                ),
            ));
        }
        // Rows still arriving (restore) or maybe newer at the next owner
        // (handover): answer nothing, the copy asks again.
        self.not_sealed(mg)?;
        if self.table.restoring(mg) {
            return Err(restoring(mg));
        }
        let tomb = self.db.tombstone(mg, name)?;
        let body = match self.db.get(mg, name)? {
            Some(record) if record.version > tomb => {
                if record.version <= version {
                    return Ok(());
                }
                Body::Replicate { record }
            }
            // A Delete's tombstone carries the version it deleted: one at
            // the copy's version supersedes it too.
            _ if tomb >= version && tomb > 0 => Body::Unreplicate {
                name: name.to_string(),
                version: tomb,
            },
            _ => return Ok(()),
        };
        self.next_req = self.next_req.wrapping_add(1) | 1 << 63;
        out.push(Out::ToMeta(Msg::new(self.next_req, copy, body)));
        Ok(())
    }

    /// Whether this node may check the copies of the names group `mg`
    /// coordinates: it owns the group, which is not being handed over,
    /// sealed or restored (its rows may not be complete or current).
    fn syncable(&self, mg: u32) -> bool {
        self.table.mg_owner.get(mg as usize) == Some(&self.slot)
            && !self.is_frozen(mg)
            && !self.is_sealed(mg)
            && self.table.move_of(mg).is_none()
    }

    /// Starts an anti-entropy pass when one is due and the last one's
    /// walks are done, then advances the walks by one page.
    fn sync_step(&mut self, now: u64, out: &mut Vec<Out<P>>) {
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
    fn start_sync_pass(&mut self, out: &mut Vec<Out<P>>) {
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
    fn walk_copies(&mut self, g: u32, index: u8, slot: u16) {
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
    fn on_sync_diff(&mut self, slot: u16, pairs: &[(u32, u8)]) {
        for &(g, i) in pairs {
            self.walk_copies(g, i, slot);
        }
    }

    /// Serves a [`Body::SyncDigest`]: the pairs whose digest over the
    /// copies held here (in groups this node owns) differs.
    fn sync_diff(&self, sums: &[SyncSum]) -> Body {
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
    fn sync_walk_step(&mut self, out: &mut Vec<Out<P>>) {
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
                    tracing::warn!("anti-entropy walk of group {g}: {e}");
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

    fn send_sync_check(&mut self, entries: Vec<SyncEntry>, out: &mut Vec<Out<P>>) {
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
    fn sync_local(&self, g: u32, h: u32, name: &str, version: u64, deleted: bool) {
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
            tracing::warn!("anti-entropy: updating the copy of {name:?} in group {h}: {e}");
        }
    }

    /// Serves a [`Body::SyncCheck`]: for each entry naming a copy this
    /// node holds that is behind the coordinator's state, asks the
    /// coordinator for it with a [`Body::Refresh`] (answered by the
    /// usual `Replicate` or `Unreplicate`, applied by the version rules).
    /// Entries for copies elsewhere (the sender's table differs) or in a
    /// group sealed for a handover are skipped: the next pass sees them.
    fn sync_check(&mut self, entries: &[SyncEntry], out: &mut Vec<Out<P>>) {
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

    /// Starts a copy for `record` (read from group `mg`) if this node
    /// coordinates it and it lacks replicas on live storage nodes that are
    /// not being drained. A replica on a drained node does not count
    /// toward N_d but may still be read from; the record committed after
    /// the copy no longer names it. Returns whether the record needs a new
    /// replica that no storage node can take (no room, or too few nodes).
    fn repair_record(&mut self, now: u64, mg: u32, record: Record, out: &mut Vec<Out<P>>) -> bool {
        // Each name is stored under all its metadata addresses; only the
        // coordinator's row starts a repair, so it is done once.
        let coordinator_row = record
            .meta
            .first()
            .and_then(|&a| self.table.layout.mg_of(a))
            == Some(mg);
        if !coordinator_row
            || self.is_frozen(mg)
            || self.pending.contains_key(&record.name)
            || self.repairs.contains_key(&record.name)
        {
            return false;
        }
        let t = &self.table;
        // (liveness, being drained) of a replica's node.
        let state_of = |a: Addr| t.sn_for(a).map(|s| (s.state, t.retiring(s.index)));
        let live: Vec<Addr> = record
            .replicas
            .iter()
            .copied()
            .filter(|&a| matches!(state_of(a), Some((State::Up | State::Down, false))))
            .collect();
        let n_d = t.params_for(&record.name).n_d as usize;
        // Copy sources: the up replicas on nodes that stay first, then
        // those on drained nodes. Every drain copy would otherwise read
        // from the one drained disk; reading from the others spreads the
        // load, and the drained node remains the fallback (the only one
        // left when the others are down).
        let mut sources: Vec<Addr> = live
            .iter()
            .copied()
            .filter(|&a| state_of(a) == Some((State::Up, false)))
            .collect();
        sources.extend(
            record
                .replicas
                .iter()
                .copied()
                .filter(|&a| state_of(a) == Some((State::Up, true))),
        );
        let names_drained = record
            .replicas
            .iter()
            .any(|&a| state_of(a).is_some_and(|(_, drained)| drained));
        if live.len() >= n_d {
            if names_drained {
                // Enough replicas elsewhere already (more than N_d were
                // written): the record just stops naming the drained one,
                // through the same commit as a copy's.
                let repair = Repair {
                    version: record.version,
                    keep: live,
                    targets: Vec::new(),
                    deadline: now,
                };
                let _ = self.commit_repair(now, &record.name, repair, 0, out);
            }
            return false;
        }
        // Nothing left to copy from (data lost, or its holders only
        // briefly down: wait for them).
        if sources.is_empty() {
            return false;
        }
        let exclude: Vec<u16> = record
            .replicas
            .iter()
            .filter_map(|&a| self.table.layout.sn_of(a))
            .collect();
        let count = n_d - live.len();
        let Ok(targets) = self.place_n(
            &record.name,
            record.version + 1,
            record.size,
            count,
            1,
            &exclude,
        ) else {
            return true;
        };
        self.repairs.insert(
            record.name.clone(),
            Repair {
                version: record.version,
                keep: live,
                targets: targets.clone(),
                deadline: now + DATA_BASE_MS + record.size / (16 << 20) * 1000,
            },
        );
        out.push(Out::Copy {
            name: record.name,
            version: record.version,
            sources,
            targets,
            size: record.size,
            crc: record.crc,
        });
        false
    }

    /// The runtime's report on an [`Out::Copy`]: `Ok(copies)` replicas were
    /// written to the first `targets`, or the copy failed. On success the
    /// record gets its new replica list under a new version, stored at
    /// every metadata address (restoring those too); otherwise, or if the
    /// object changed meanwhile, the new replicas are freed.
    pub fn copy_done(
        &mut self,
        now: u64,
        name: &str,
        version: u64,
        targets: Vec<Addr>,
        result: Result<u8, String>,
    ) -> Vec<Out<P>> {
        let mut out = Vec::new();
        let ours = self
            .repairs
            .get(name)
            .is_some_and(|r| r.version == version && r.targets == targets);
        let repair = if ours {
            self.repairs.remove(name)
        } else {
            None
        };
        let committed = match (repair, result) {
            (Some(repair), Ok(copies)) if copies > 0 => {
                self.commit_repair(now, name, repair, usize::from(copies), &mut out)
            }
            _ => Err(Error::Invalid("repair copy failed or superseded".into())),
        };
        if committed.is_err() {
            out.extend(targets.into_iter().map(Out::Free));
        }
        out
    }

    fn commit_repair(
        &mut self,
        now: u64,
        name: &str,
        repair: Repair,
        copies: usize,
        out: &mut Vec<Out<P>>,
    ) -> Result<(), Error> {
        if self.pending.contains_key(name) {
            return Err(Error::Invalid(format!("{name:?} is being changed")));
        }
        let meta = self.table.meta_addrs(name);
        let mg0 = self.owned(meta[0])?;
        // A frozen group takes no new version: its handover waits for
        // this copy, and the next pass repairs it at the new owner.
        self.not_frozen(mg0)?;
        let current = self
            .db
            .get(mg0, name)?
            .filter(|r| r.version == repair.version)
            .ok_or_else(|| Error::Invalid(format!("{name:?} changed during repair")))?;
        let written = copies.min(repair.targets.len());
        let mut record = current;
        record.replicas = repair.keep;
        record
            .replicas
            .extend_from_slice(&repair.targets[..written]);
        // A new version: metadata replicas ignore a record whose version
        // they already hold.
        record.version = self.db.latest_version(mg0, name)? + 1;
        record.meta = meta.clone();
        self.next_op += 1;
        let op = self.next_op;
        for (i, &a) in meta.iter().enumerate() {
            if let Some(mg) = self.owns_writable(a) {
                self.db.apply_record(mg, &record)?;
            } else {
                let msg = Msg::new(
                    0,
                    a,
                    Body::Replicate {
                        record: record.clone(),
                    },
                );
                self.send_replication(now, name, op, i, msg, out);
            }
        }
        out.extend(repair.targets[written..].iter().map(|&a| Out::Free(a)));
        Ok(())
    }

    /// Serves one page of group `group` to the node taking it over. For
    /// the final copy (`epoch` > 0) the group must be frozen at that epoch
    /// in this node's table and nothing of it in flight here; the group is
    /// then sealed: no change of it is accepted until the table moves on.
    fn serve_pull(
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
    fn pull_awaiting(&self, req: u64) -> Option<u32> {
        self.pulls
            .iter()
            .find(|(_, p)| p.stage != PullStage::Reported && p.msg.req == req)
            .map(|(&g, _)| g)
    }

    /// Starts, resumes or resends the copies of the groups the table hands
    /// over to this node: a first copy while the group is being copied, a
    /// final one (under the freeze epoch) once it is frozen.
    fn handover_step(&mut self, now: u64, out: &mut Vec<Out<P>>) {
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
    fn forget_stale_rows(&mut self, group: u32) {
        if self.table.home_of(group) == Some(self.slot)
            || !self.db.group_has_rows(group).unwrap_or(false)
        {
            return;
        }
        if let Err(e) = self.db.drop_group(group) {
            tracing::warn!("dropping stale rows of group {group} before taking it over: {e}");
        }
    }

    fn pull_msg(&mut self, group: u32, epoch: u64, tombs: bool, after: String) -> Msg {
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
    fn on_pull_reply(&mut self, now: u64, group: u32, msg: Msg, out: &mut Vec<Out<P>>) {
        let Some(stage) = self.pulls.get(&group).map(|p| p.stage) else {
            return;
        };
        match (stage, msg.body) {
            (PullStage::Pulling, Body::MgRows { rows, more }) => {
                for row in &rows {
                    if let Err(e) = self.db.apply_row(group, row) {
                        // The resend asks for the same page again.
                        tracing::warn!("storing a row of group {group} being taken over: {e}");
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

    /// Answers one page of a gather for `groups` (being restored by the
    /// sender): rows from any group here whose name has a metadata address
    /// in one of them.
    fn serve_gather(&self, groups: &[u32], slot: u16, from: &GatherCursor) -> Result<Body, Error> {
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
    fn report_awaiting(&self, req: u64) -> Option<u32> {
        self.restored
            .iter()
            .find(|(_, r)| r.msg.as_ref().is_some_and(|m| m.req == req))
            .map(|(&g, _)| g)
    }

    /// The page request for slot `source` at `from`, addressed to a group
    /// that slot owns (`None`: it owns none, so it holds no row a restore
    /// needs: see `restore_sources`).
    fn gather_msg(&mut self, groups: Vec<u32>, source: u16, from: GatherCursor) -> Option<Msg> {
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
    fn restore_sources(&self) -> VecDeque<u16> {
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
    fn restore_step(&mut self, now: u64, out: &mut Vec<Out<P>>) {
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
                Err(e) => tracing::warn!("gathering restored groups from this node: {e}"),
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
    fn ask_source(&mut self, now: u64, out: &mut Vec<Out<P>>) {
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
    fn next_source(&mut self, now: u64, out: &mut Vec<Out<P>>) {
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
    fn report_restored(&mut self, now: u64, out: &mut Vec<Out<P>>) {
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
    fn on_gathered(&mut self, now: u64, body: Body, out: &mut Vec<Out<P>>) {
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
                    tracing::warn!("storing a row of group {g} being restored: {e}");
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
    fn on_report_reply(&mut self, g: u32, body: Body) {
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

/// Trims a list page so it fits in one datagram.
fn fit_page(mut entries: Vec<strata_store_protocol::wire::ListEntry>, mut more: bool) -> Body {
    let mut bytes = 64;
    let mut keep = 0;
    for e in &entries {
        bytes += e.name.len() + 18;
        if bytes > strata_store_protocol::wire::MAX_DATAGRAM - 1024 {
            break;
        }
        keep += 1;
    }
    if keep < entries.len() {
        entries.truncate(keep);
        more = true;
    }
    Body::ListPage { entries, more }
}

fn is_mutation(body: &Body) -> bool {
    matches!(
        body,
        Body::PostBegin { .. }
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

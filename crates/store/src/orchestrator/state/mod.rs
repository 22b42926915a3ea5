//! The orchestrator: admits and retires nodes, assigns storage-node
//! prefixes and metadata-group slots, publishes capacity and device type,
//! and marks nodes down when they miss heartbeats for longer than the
//! short-failure timer (a down storage node is left out of placement).
//!
//! Like the metadata node it is a state machine (`handle`, `tick`) driven
//! by a runtime; its table is persisted in redb on every membership change.
//! `handle` and `tick` (here) decide what runs; one module per concern
//! holds the rest of the `impl`: `membership` (registrations), `handover`
//! (moves to a new node), `drains` (retiring storage nodes) and
//! `failures` (stand-ins, restores, hand-backs).
//!
//! Table epochs only go up, across restarts too: nodes keep the newer of
//! two tables, and drain and handover checks compare epochs. Changes not
//! worth an fsync (free space, drain progress) still move the epoch, so
//! the database also holds an epoch limit: no epoch above it is published
//! before a higher limit is stored, and a restart starts above it.

mod drains;
mod failures;
mod handover;
mod invariants;
mod membership;

use redb::{Database, TableDefinition};
use std::collections::HashMap;
use std::path::Path;
use strata_store_protocol::error::{DatabaseResult, Error};
use strata_store_protocol::table::{
    Device, Drain, MnEntry, Move, MovePhase, SnEntry, StandIn, State, Table,
};
use strata_store_protocol::wire::{Body, Code, Fingerprints, Msg, Role, WireError};

const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("orchestrator");

/// The key of the stored table in [`STATE`].
const TABLE_KEY: &str = "table";

/// The key of the epoch limit in [`STATE`]: 8 bytes, big-endian, never
/// below the stored table's epoch. Every epoch published so far is at or
/// below it.
const EPOCH_LIMIT_KEY: &str = "epoch-limit";

/// Epochs reserved by each store of the limit: one fsync per this many
/// unstored changes, and a restart skips at most this many epochs.
const EPOCH_RESERVE: u64 = 1 << 10;

/// How far a database stored before the epoch limit existed moves its
/// epoch on its first open: past any epoch its orchestrator may have
/// published without storing it (one per heartbeat or drain progress
/// between two membership changes).
const UNLIMITED_EPOCH_GAP: u64 = 1 << 32;

/// Default short-failure timer: a node silent this long is marked down.
pub const SHORT_FAILURE_MS: u64 = 3_000;

/// Default definitive-failure timer: a node silent this long is marked
/// dead; the metadata nodes re-create a storage node's replicas elsewhere,
/// and a metadata node's groups are restored on the others.
/// Long enough that a reboot is not mistaken for a lost disk.
pub const DEFINITIVE_FAILURE_MS: u64 = 600_000;

/// Groups frozen at once during handovers: a frozen group refuses new
/// changes (clients retry) until its final copy is taken, so only a few
/// are frozen at a time.
pub const FREEZE_BATCH: usize = 32;

/// A group frozen this long without its final copy reported goes back to
/// being copied (the new node may have died), so its old owner serves
/// changes again.
pub const FROZEN_LIMIT_MS: u64 = 15_000;

/// The orchestrator's state.
pub struct OnCore {
    db: Database,
    /// Which database this is, for errors: `orchestrator database PATH`.
    place: String,
    table: Table,
    expected_mns: u16,
    last_seen: HashMap<u64, u64>,
    short_failure_ms: u64,
    definitive_failure_ms: u64,
    /// When each frozen group was frozen (not persisted: after a restart
    /// every frozen group gets a full timer).
    frozen_since: HashMap<u32, u64>,
    /// The latest drain report of each (drained node index, metadata
    /// slot). Not persisted: after a restart the reports come again.
    drain_reports: HashMap<(u16, u16), DrainCount>,
    /// Per drained node index, the epoch published once every report
    /// showed nothing left: the node retires only on reports from scans
    /// started at that epoch or later that show nothing left again (see
    /// [`OnCore::update_drain`]). Not persisted: after a restart both
    /// rounds come again. Stale once owners change after it.
    drain_confirm: HashMap<u16, u64>,
    /// The epoch at which group owners last changed: a drain report only
    /// counts for a scan that started with a table at least this new (an
    /// older scan may have missed a group the node owns now). After a
    /// restart, the epoch the orchestrator opened at: above every epoch
    /// published before, so no scan from before the restart counts (the
    /// owners it saw are not known any more).
    owners_epoch: u64,
    /// The owners (and handover targets) at `owners_epoch`.
    owners: (Vec<u16>, Vec<(u32, u16)>),
    /// The stored epoch limit: the table's epoch never goes above it.
    epoch_limit: u64,
}

/// One metadata node's latest drain report.
#[derive(Clone, Copy, Debug)]
struct DrainCount {
    epoch: u64,
    /// The drain counted for ([`Drain::since`]).
    drain: u64,
    left: u64,
    copies: u64,
    unplaceable: u64,
}

/// Reports on one drain summed over the slots owning groups.
#[derive(Clone, Copy, Debug, Default)]
struct DrainSum {
    left: u64,
    copies: u64,
    unplaceable: u64,
    unreported: u16,
}

/// Group owners and handover targets: a drain report counts only for a
/// scan made under the same ones.
fn owners_of(t: &Table) -> (Vec<u16>, Vec<(u32, u16)>) {
    (
        t.mg_owner.clone(),
        t.moves.iter().map(|m| (m.group, m.to)).collect(),
    )
}

/// The first owner slot of each of `mg_count` groups: contiguous runs of
/// groups, one per slot.
///
/// Groups are numbered by address, so a quadrant of the metadata space is
/// a run of groups, and an object's metadata addresses lie in distinct
/// quadrants. With runs, a slot spans at most `⌈quadrants / slots⌉ + 1`
/// quadrants, so with as many slots as quadrants (or more), or with
/// `N_m = 3` on 2 or 3 slots, no name has all its copies on one node and a
/// node's loss leaves a copy to restore from. Dealing groups out in turn
/// (`mg % slots`) put all three copies of about 1 name in 27 on one node
/// of three.
pub fn initial_owners(mg_count: usize, slots: u16) -> Vec<u16> {
    let slots = slots.max(1) as usize;
    (0..mg_count)
        .map(|mg| (mg * slots / mg_count.max(1)) as u16)
        .collect()
}

/// The share of names whose every metadata copy would lie on one node
/// (other than `skip`) if groups had owners `owner`: such names lose every
/// copy when that node dies. A name's `n_m` addresses lie in `n_m`
/// distinct quadrants, all subsets equally likely, each address spread
/// evenly over its quadrant's groups; so with `f(s, q)` the part of
/// quadrant `q` that slot `s` owns, the share is
/// `Σ_s e_{n_m}(f(s, ·)) / C(quadrants, n_m)`, `e_k` being the elementary
/// symmetric polynomial of degree `k`.
pub fn lone_copy_share(owner: &[u16], mg_bits: u8, n_m: usize, skip: Option<u16>) -> f64 {
    let q_bits = strata_store_protocol::addr::quadrant_bits(n_m);
    let quadrants = 1usize << q_bits;
    if n_m < 2 || owner.is_empty() {
        return 0.0;
    }
    let slots = owner.iter().copied().max().map_or(0, |m| m as usize + 1);
    let mut part = vec![vec![0.0f64; quadrants]; slots];
    if mg_bits >= q_bits {
        let per = (1usize << (mg_bits - q_bits)) as f64;
        for (g, &o) in owner.iter().enumerate() {
            part[o as usize][g >> (mg_bits - q_bits)] += 1.0 / per;
        }
    } else {
        // Fewer groups than quadrants: each group holds whole quadrants.
        for (q, p) in (0..quadrants).map(|q| (q, q >> (q_bits - mg_bits))) {
            if let Some(&o) = owner.get(p) {
                part[o as usize][q] = 1.0;
            }
        }
    }
    let subsets = (0..n_m).fold(1.0, |c, i| c * (quadrants - i) as f64 / (i + 1) as f64);
    let mut share = 0.0;
    for (s, f) in part.iter().enumerate() {
        if skip == Some(s as u16) {
            continue;
        }
        // e[k] over the quadrants seen so far.
        let mut e = vec![0.0f64; n_m + 1];
        e[0] = 1.0;
        for &x in f {
            for k in (1..=n_m).rev() {
                e[k] += e[k - 1] * x;
            }
        }
        share += e[n_m];
    }
    share / subsets
}

/// [`lone_copy_share`] summed over every `N_m` in use (the cluster's and
/// each bucket's override), so placement weighs every bucket's names.
fn lone_copy_risk(t: &Table, owner: &[u16], skip: Option<u16>) -> f64 {
    let mut n_ms: Vec<usize> = std::iter::once(&t.params)
        .chain(t.buckets.iter().map(|(_, p)| p))
        .map(|p| p.n_m as usize)
        .collect();
    n_ms.sort_unstable();
    n_ms.dedup();
    n_ms.iter()
        .map(|&n_m| lone_copy_share(owner, t.layout.mg_bits, n_m, skip))
        .sum()
}

/// Reads the stored table and epoch limit (each `None` in a new
/// database), checking both.
fn read_state(db: &Database, path: &Path) -> Result<(Option<Table>, Option<u64>), Error> {
    let what = || {
        format!(
            "orchestrator database {}: reading its state",
            path.display()
        )
    };
    let tx = db.begin_write().database(what)?;
    tx.open_table(STATE).database(what)?;
    tx.commit().database(what)?;
    let tx = db.begin_read().database(what)?;
    let state = tx.open_table(STATE).database(what)?;
    let table = match state.get(TABLE_KEY).database(what)? {
        Some(v) => Some(Table::decode(v.value()).map_err(|e| {
            Error::malformed(format!("the stored prefix table in {}", path.display()), e)
        })?),
        None => None,
    };
    let limit = match state.get(EPOCH_LIMIT_KEY).database(what)? {
        Some(v) => Some(decode_limit(v.value()).map_err(|e| {
            Error::malformed(format!("the stored epoch limit in {}", path.display()), e)
        })?),
        None => None,
    };
    Ok((table, limit))
}

/// Decodes a stored epoch limit: 8 bytes, big-endian.
fn decode_limit(bytes: &[u8]) -> Result<u64, WireError> {
    let raw: [u8; 8] = bytes
        .try_into()
        .map_err(|_| WireError::Invalid(format!("{} bytes, expected 8", bytes.len())))?;
    Ok(u64::from_be_bytes(raw))
}

/// The epoch an orchestrator opens at: above every epoch published
/// before (the stored limit, or for a database from before the limit,
/// the stored table's epoch plus [`UNLIMITED_EPOCH_GAP`]); a new cluster
/// keeps its initial table's.
fn first_epoch(stored: Option<&Table>, limit: Option<u64>, initial: u64) -> Result<u64, String> {
    let exhausted = |e: u64| format!("table epoch {e} is exhausted");
    match (stored.map(|t| t.epoch), limit) {
        (Some(epoch), Some(limit)) if limit < epoch => Err(format!(
            "the stored epoch limit {limit} is below the stored table's epoch {epoch} (damaged database)"
        )),
        (_, Some(limit)) => limit.checked_add(1).ok_or_else(|| exhausted(limit)),
        (Some(epoch), None) => epoch
            .checked_add(UNLIMITED_EPOCH_GAP)
            .ok_or_else(|| exhausted(epoch)),
        (None, None) => Ok(initial),
    }
}

impl OnCore {
    /// Opens the orchestrator database at `path`. A new cluster takes
    /// `initial` (its layout, replication and `expected_mns` metadata slots,
    /// each owning `mg_count / expected_mns` groups); an existing one keeps
    /// what it stored, at an epoch above every one it published before.
    pub fn open(path: &Path, initial: Table, expected_mns: u16, now: u64) -> Result<OnCore, Error> {
        let place = format!("orchestrator database {}", path.display());
        let db = Database::create(path).database(|| format!("opening the {place}"))?;
        let (stored, limit) = read_state(&db, path)?;
        let start =
            first_epoch(stored.as_ref(), limit, initial.epoch).map_err(|why| Error::State {
                context: format!("{place}: {why}"),
                source: None,
            })?;
        let (mut table, expected_mns) = match stored {
            Some(t) => {
                // Slots in use: group owners, handover targets, and metadata
                // nodes (a new one owns no group until its first handover).
                let slots = t
                    .mg_owner
                    .iter()
                    .copied()
                    .chain(t.moves.iter().map(|m| m.to))
                    .chain(t.mns.iter().map(|m| m.slot))
                    .max()
                    .unwrap_or(0)
                    + 1;
                (t, slots)
            }
            None => {
                let mut t = initial;
                let slots = expected_mns.max(1);
                t.mg_owner = initial_owners(t.layout.mg_count(), slots);
                (t, slots)
            }
        };
        table.epoch = start;
        // Fingerprints are reported again by every node that is up.
        table.keys.clear();
        table.on_keys = None;
        // Everyone gets a full timer after an orchestrator restart.
        let last_seen = table
            .mns
            .iter()
            .map(|m| m.uuid)
            .chain(table.sns.iter().map(|s| s.uuid))
            .map(|u| (u, now))
            .collect();
        let owners = owners_of(&table);
        let mut on = OnCore {
            db,
            owners_epoch: table.epoch,
            owners,
            table,
            expected_mns,
            last_seen,
            short_failure_ms: SHORT_FAILURE_MS,
            definitive_failure_ms: DEFINITIVE_FAILURE_MS,
            frozen_since: HashMap::new(),
            drain_reports: HashMap::new(),
            epoch_limit: start
                .checked_add(EPOCH_RESERVE)
                .ok_or_else(|| Error::State {
                    context: format!("{place}: table epoch {start} is exhausted"),
                    source: None,
                })?,
            place,
            drain_confirm: HashMap::new(),
        };
        // Stored before anything is served: the epoch it opened at is
        // above every one published before, and stays below the limit.
        on.persist()?;
        Ok(on)
    }

    /// Sets the short-failure timer.
    pub fn set_short_failure(&mut self, ms: u64) {
        self.short_failure_ms = ms;
    }

    /// Sets the definitive-failure timer (storage and metadata nodes).
    pub fn set_definitive_failure(&mut self, ms: u64) {
        self.definitive_failure_ms = ms;
    }

    /// The current table.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// Stores the table with the epoch limit, in one transaction.
    fn persist(&mut self) -> Result<(), Error> {
        let bytes = self.table.encode();
        let epoch = self.table.epoch;
        let what = || format!("{}: storing the table of epoch {epoch}", self.place);
        let tx = self.db.begin_write().database(what)?;
        {
            let mut state = tx.open_table(STATE).database(what)?;
            state.insert(TABLE_KEY, bytes.as_slice()).database(what)?;
            state
                .insert(EPOCH_LIMIT_KEY, self.epoch_limit.to_be_bytes().as_slice())
                .database(what)?;
        }
        tx.commit().database(what)
    }

    /// Moves the table to the next epoch. Past the stored limit, a new
    /// limit is stored first: the new epoch is published only once a
    /// restart is sure to start above it. On failure the epoch is left
    /// as it was.
    fn next_epoch(&mut self) -> Result<(), Error> {
        let next = self
            .table
            .epoch
            .checked_add(1)
            .ok_or_else(|| Error::State {
                context: format!(
                    "{}: table epoch {} is exhausted",
                    self.place, self.table.epoch
                ),
                source: None,
            })?;
        if next > self.epoch_limit {
            let limit = next.saturating_add(EPOCH_RESERVE);
            let what = || format!("{}: storing the epoch limit {limit}", self.place);
            let tx = self.db.begin_write().database(what)?;
            tx.open_table(STATE)
                .database(what)?
                .insert(EPOCH_LIMIT_KEY, limit.to_be_bytes().as_slice())
                .database(what)?;
            tx.commit().database(what)?;
            self.epoch_limit = limit;
        }
        self.table.epoch = next;
        Ok(())
    }

    /// A change worth storing: the next epoch, then the table stored
    /// before the caller answers anyone.
    fn changed(&mut self) -> Result<(), Error> {
        self.next_epoch()?;
        let owners = owners_of(&self.table);
        if owners != self.owners {
            self.owners = owners;
            self.owners_epoch = self.table.epoch;
        }
        self.persist()
    }

    /// Publishes the orchestrator's own keyring fingerprints in the table
    /// it serves (its server calls this as it reloads its key).
    pub fn set_own_keys(&mut self, prints: Fingerprints) {
        self.table.on_keys = Some(prints);
    }

    /// Handles one request; returns the reply.
    pub fn handle(&mut self, now: u64, msg: &Msg) -> Msg {
        match self.request(now, msg) {
            Ok(body) => msg.reply(body),
            Err(Error::Remote { code, message }) => msg.error(code, message),
            Err(e) => msg.error(Code::Unavailable, e.report().to_string()),
        }
    }

    fn request(&mut self, now: u64, msg: &Msg) -> Result<Body, Error> {
        match &msg.body {
            Body::GetTable => Ok(Body::Table {
                bytes: self.table.encode(),
            }),
            Body::Register {
                role,
                uuid,
                endpoint,
                capacity,
                free,
                device,
                keys,
            } => {
                self.last_seen.insert(*uuid, now);
                let index = match role {
                    Role::Mn => self.register_mn(*uuid, *endpoint)?,
                    Role::Sn => self.register_sn(
                        *uuid,
                        *endpoint,
                        *capacity,
                        *free,
                        Device::from_u8(*device),
                    )?,
                };
                if let Some(k) = keys {
                    self.table.set_keys_of(*uuid, *k);
                }
                self.changed()?;
                Ok(Body::Registered { index })
            }
            Body::Heartbeat {
                uuid,
                free,
                objects,
                keys,
            } => {
                self.last_seen.insert(*uuid, now);
                let revived;
                if let Some(s) = self.table.sns.iter_mut().find(|s| s.uuid == *uuid) {
                    s.free = *free;
                    s.objects = *objects;
                    revived = matches!(s.state, State::Down | State::Dead);
                    if revived {
                        s.state = State::Up;
                    }
                } else if let Some(m) = self.table.mns.iter_mut().find(|m| m.uuid == *uuid) {
                    // A dead one is up again but owns nothing: its groups
                    // were restored elsewhere, and it drops their rows. A
                    // down one gets back the groups standing in for it.
                    revived = matches!(m.state, State::Down | State::Dead);
                    let (was_dead, slot) = (m.state == State::Dead, m.slot);
                    if revived {
                        m.state = State::Up;
                        self.hand_back();
                    }
                    // Back after its groups were restored elsewhere for
                    // good: it takes a share again, as a new node would.
                    if was_dead {
                        self.plan_moves(slot);
                    }
                } else {
                    return Err(Error::Remote {
                        code: Code::NotFound,
                        message: format!("node {uuid:016x} is not a member; register first"),
                    });
                }
                if let Some(k) = keys {
                    self.table.set_keys_of(*uuid, *k);
                }
                if revived {
                    self.changed()?;
                } else {
                    // Free space changes are published but not worth an
                    // fsync (only one per `EPOCH_RESERVE` for the limit).
                    self.next_epoch()?;
                }
                Ok(Body::Done { version: 0 })
            }
            Body::Retire { uuid } => self.retire(*uuid),
            Body::CancelRetire { uuid } => self.cancel_retire(*uuid),
            Body::RevokeTenant { tenant, below } => self.revoke_tenant(tenant, *below),
            Body::DrainReport {
                slot,
                epoch,
                drain,
                index,
                left,
                copies,
                unplaceable,
            } => {
                let count = DrainCount {
                    epoch: *epoch,
                    drain: *drain,
                    left: *left,
                    copies: *copies,
                    unplaceable: *unplaceable,
                };
                self.drain_report(*slot, *index, count)
            }
            Body::MoveReport {
                group,
                to,
                ready,
                epoch,
            } => self.move_report(now, *group, *to, *ready, *epoch),
            _ => Err(Error::Remote {
                code: Code::BadRequest,
                message: "this message is not a request the orchestrator serves".into(),
            }),
        }
    }

    /// Cancels the drain of a storage node (see [`OnCore::retire`]): the
    /// drain leaves the table, so the node takes new objects and repair
    /// copies again and its replicas count toward N_d. Records the drain
    /// already rewrote keep naming the new replicas; the copies left on
    /// the node that no record names any more are freed by its collection
    /// round. Reports for the cancelled drain are dropped, and any still
    /// in flight are ignored: they name a drain that no longer exists (a
    /// new drain of the node has a later `since`).
    ///
    /// A node that is not being drained is answered `Done` with nothing
    /// changed (a resent request after a lost answer must not fail). A
    /// retired node is refused: its replicas were freed, and it cannot
    /// register again.
    /// Raises tenant `tenant`'s minimum credential generation to `below`
    /// (a resend, or a lower `below`, changes nothing) and stores the
    /// table before answering, so the revocation survives a restart.
    /// Answers `Done` with the minimum now in force.
    fn revoke_tenant(&mut self, tenant: &str, below: u32) -> Result<Body, Error> {
        let refuse = |message: String| Error::Remote {
            code: Code::BadRequest,
            message,
        };
        strata_store_protocol::tenant::check_tenant_id(tenant).map_err(refuse)?;
        if tenant == strata_store_protocol::tenant::ADMIN {
            return Err(refuse(format!(
                "the admin tenant '{}' cannot be revoked alone (`strata store up` issues its \
                 credential again at every start): rotate the cluster key instead",
                strata_store_protocol::tenant::ADMIN
            )));
        }
        if below == 0 {
            return Err(refuse(format!(
                "revoking tenant '{tenant}' below generation 0 revokes nothing; ask for the \
                 tenant's minimum generation plus one"
            )));
        }
        if self.table.min_generation(tenant) >= below {
            return Ok(Body::Done {
                version: u64::from(self.table.min_generation(tenant)),
            });
        }
        let mut table = self.table.clone();
        let min = table.raise_min_generation(tenant, below).map_err(refuse)?;
        // The table must still fit in the datagram that serves it.
        let size = table.encode().len();
        if size > strata_store_protocol::wire::MAX_DATAGRAM - 1024 {
            return Err(refuse(format!(
                "revoking tenant '{tenant}' would make the table {size} bytes, more than a \
                 datagram carries; nothing done"
            )));
        }
        self.table.revoked = table.revoked;
        self.changed()?;
        Ok(Body::Done {
            version: u64::from(min),
        })
    }

    /// Marks nodes silent for longer than the short-failure timer as down,
    /// and nodes silent for longer than the definitive-failure timer as
    /// dead (a dead metadata node's groups are restored elsewhere).
    pub fn tick(&mut self, now: u64) -> Result<(), Error> {
        let silent = |uuid: u64, seen: &HashMap<u64, u64>, limit: u64| {
            seen.get(&uuid)
                .is_none_or(|&t| now.saturating_sub(t) > limit)
        };
        let (short, definitive) = (self.short_failure_ms, self.definitive_failure_ms);
        let mut changed = false;
        for s in &mut self.table.sns {
            let next = match s.state {
                State::Up | State::Down if silent(s.uuid, &self.last_seen, definitive) => {
                    State::Dead
                }
                State::Up if silent(s.uuid, &self.last_seen, short) => State::Down,
                other => other,
            };
            if next != s.state {
                s.state = next;
                changed = true;
            }
        }
        let mut dead = Vec::new();
        let mut down = Vec::new();
        for m in &self.table.mns {
            if matches!(m.state, State::Up | State::Down)
                && silent(m.uuid, &self.last_seen, definitive)
            {
                dead.push(m.slot);
            } else if (m.state == State::Up && silent(m.uuid, &self.last_seen, short))
                || (m.state == State::Down && self.table.groups_of(m.slot) > 0)
            {
                // Down (or down with groups nobody could take before).
                down.push(m.slot);
            }
        }
        for slot in dead {
            changed |= self.declare_dead(slot);
        }
        // All down first: no group goes to a node that is silent too.
        for m in &mut self.table.mns {
            if down.contains(&m.slot) && m.state == State::Up {
                m.state = State::Down;
                changed = true;
            }
        }
        for slot in down {
            changed |= self.stand_in(slot);
        }
        changed |= self.hand_back();
        // A freeze whose final copy never came is called off: the group
        // is copied again, and its old owner takes changes meanwhile.
        for m in &mut self.table.moves {
            if m.phase != MovePhase::Frozen {
                continue;
            }
            let since = *self.frozen_since.entry(m.group).or_insert(now);
            if now.saturating_sub(since) > FROZEN_LIMIT_MS {
                m.phase = MovePhase::Copying;
                m.frozen_epoch = 0;
                self.frozen_since.remove(&m.group);
                changed = true;
            }
        }
        changed |= self.freeze_some(now);
        if changed {
            self.changed()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lone_copy_share_matches_real_names() {
        use strata_store_protocol::addr::{Layout, DEFAULT_CLUSTER_PREFIX};
        let layout = Layout::new(DEFAULT_CLUSTER_PREFIX, 6);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for (slots, n_m) in [(2u16, 3usize), (3, 3), (3, 2), (4, 4), (3, 5)] {
            // Random owners: far from the first placement's zero.
            let owners: Vec<u16> = (0..layout.mg_count())
                .map(|_| {
                    rng = strata_store_protocol::addr::splitmix64(rng);
                    (rng % slots as u64) as u16
                })
                .collect();
            let names = 40_000;
            let lone = (0..names)
                .filter(|i| {
                    let addrs = layout.meta_addrs(format!("n/{i}").as_bytes(), n_m);
                    let first = owners[layout.mg_of(addrs[0]).unwrap() as usize];
                    addrs
                        .iter()
                        .all(|&a| owners[layout.mg_of(a).unwrap() as usize] == first)
                })
                .count();
            let measured = lone as f64 / names as f64;
            let predicted = lone_copy_share(&owners, layout.mg_bits, n_m, None);
            assert!(
                (measured - predicted).abs() < 0.01,
                "{slots} slots, N_m = {n_m}: {measured} of names, predicted {predicted}"
            );
        }
        // The first placement: none.
        let first = initial_owners(layout.mg_count(), 3);
        assert_eq!(lone_copy_share(&first, layout.mg_bits, 3, None), 0.0);
    }

    #[test]
    fn a_restore_places_groups_so_fewest_names_lose_every_copy() {
        // N_m = 3 for the whole cluster, then only for one bucket.
        for bucket_only in [false, true] {
            restore_keeps_copies_apart(bucket_only);
        }
    }

    fn restore_keeps_copies_apart(bucket_only: bool) {
        let dir = tempfile::tempdir().unwrap();
        let mut initial = empty_table();
        let three = Params {
            n_m: 3,
            w_m: 2,
            ..initial.params
        };
        if bucket_only {
            initial.buckets.push(("vm".into(), three));
        } else {
            initial.params = three;
        }
        let mut on = OnCore::open(&dir.path().join("on.redb"), initial, 3, 0).unwrap();
        on.set_definitive_failure(1_000);
        for uuid in [1, 2, 3] {
            register(&mut on, 0, uuid);
        }
        for now in (500..=2_000).step_by(500) {
            heartbeat(&mut on, now, 1);
            heartbeat(&mut on, now, 2);
            on.tick(now).unwrap();
        }
        let t = on.table().clone();
        assert_eq!(t.mns[2].state, State::Dead);
        let n_m = 3;
        let share = lone_copy_share(&t.mg_owner, t.layout.mg_bits, n_m, None);
        // The former rule, fewest groups first, on the same layout.
        let mut naive = initial_owners(t.mg_owner.len(), 3);
        let mut counts = [0usize; 2];
        for o in naive.iter().filter(|&&o| o < 2) {
            counts[*o as usize] += 1;
        }
        for o in naive.iter_mut().filter(|o| **o == 2) {
            let s = if counts[0] <= counts[1] { 0 } else { 1 };
            counts[s] += 1;
            *o = s as u16;
        }
        let before = lone_copy_share(&naive, t.layout.mg_bits, n_m, None);
        assert!(
            share < before * 0.9,
            "every copy on one node for {share} of names, {before} with the former rule"
        );
        // Still even.
        assert!(t.groups_of(0).abs_diff(t.groups_of(1)) <= 1);
    }

    #[test]
    fn a_new_node_takes_the_groups_that_keep_copies_apart() {
        let dir = tempfile::tempdir().unwrap();
        let mut initial = empty_table();
        initial.params.n_m = 3;
        initial.params.w_m = 2;
        let mut on = OnCore::open(&dir.path().join("on.redb"), initial, 3, 0).unwrap();
        for uuid in [1, 2, 3, 4] {
            register(&mut on, 0, uuid);
        }
        let t = on.table();
        let mut owner = t.mg_owner.clone();
        for m in &t.moves {
            owner[m.group as usize] = m.to;
        }
        assert_eq!(owner.iter().filter(|&&o| o == 3).count(), 16);
        let share = lone_copy_share(&owner, t.layout.mg_bits, 3, None);
        // The former choice: the highest group of the node owning most.
        let mut former = initial_owners(owner.len(), 3);
        for _ in 0..16 {
            let most = (0..3u16)
                .max_by_key(|&s| (former.iter().filter(|&&o| o == s).count(), s))
                .unwrap();
            let g = (0..former.len())
                .rev()
                .find(|&g| former[g] == most)
                .unwrap();
            former[g] = 3;
        }
        let before = lone_copy_share(&former, t.layout.mg_bits, 3, None);
        assert!(
            share < before,
            "every copy on one node for {share} of names, {before} with the former choice"
        );
    }

    #[test]
    fn first_owners_never_put_every_copy_of_a_name_on_one_node() {
        use strata_store_protocol::addr::{Layout, DEFAULT_CLUSTER_PREFIX};
        let layout = Layout::new(DEFAULT_CLUSTER_PREFIX, 8);
        for (slots, n_m) in [
            (2u16, 3usize),
            (3, 3),
            (4, 3),
            (4, 4),
            (2, 2),
            (4, 2),
            (5, 3),
        ] {
            let owners = initial_owners(layout.mg_count(), slots);
            // Balanced: every slot owns its share, give or take one group.
            for s in 0..slots {
                let n = owners.iter().filter(|&&o| o == s).count();
                assert!(
                    n.abs_diff(layout.mg_count() / slots as usize) <= 1,
                    "{slots} slots: {n}"
                );
            }
            for i in 0..20_000 {
                let name = format!("obj/{i}");
                let slots_of: Vec<u16> = layout
                    .meta_addrs(name.as_bytes(), n_m)
                    .iter()
                    .map(|&a| owners[layout.mg_of(a).unwrap() as usize])
                    .collect();
                assert!(
                    slots_of.iter().any(|&s| s != slots_of[0]),
                    "{slots} slots, N_m = {n_m}: every copy of {name} on slot {}",
                    slots_of[0]
                );
            }
        }
    }
    use strata_store_protocol::addr::{Layout, DEFAULT_CLUSTER_PREFIX};
    use strata_store_protocol::table::Params;

    /// A new cluster's table with 64 metadata groups and no node yet.
    fn empty_table() -> Table {
        Table::new(Layout::new(DEFAULT_CLUSTER_PREFIX, 6), Params::default())
    }

    /// A heartbeat of node `uuid` (no space, no objects) at `now`.
    fn heartbeat(on: &mut OnCore, now: u64, uuid: u64) -> Msg {
        let body = Body::Heartbeat {
            uuid,
            free: 0,
            objects: 0,
            keys: None,
        };
        on.handle(now, &Msg::new(uuid, 0, body))
    }

    fn register(on: &mut OnCore, now: u64, uuid: u64) -> Msg {
        on.handle(
            now,
            &Msg::new(
                uuid,
                0,
                Body::Register {
                    role: Role::Mn,
                    uuid,
                    endpoint: "127.0.0.1:9".parse().unwrap(),
                    capacity: 0,
                    free: 0,
                    device: 0,
                    keys: None,
                },
            ),
        )
    }

    fn report(on: &mut OnCore, now: u64, group: u32, ready: bool, epoch: u64) -> Body {
        let msg = Msg::new(
            1,
            0,
            Body::MoveReport {
                group,
                to: 2,
                ready,
                epoch,
            },
        );
        on.handle(now, &msg).body
    }

    fn register_sn(on: &mut OnCore, uuid: u64) {
        let body = Body::Register {
            role: Role::Sn,
            uuid,
            endpoint: "127.0.0.1:9".parse().unwrap(),
            capacity: 100,
            free: 100,
            device: 0,
            keys: None,
        };
        let reply = on.handle(0, &Msg::new(uuid, 0, body)).body;
        assert!(matches!(reply, Body::Registered { .. }), "{reply:?}");
    }

    /// A report from `slot` for the current drain of `index` (if any).
    fn drain_report(on: &mut OnCore, slot: u16, epoch: u64, index: u16, left: u64) -> Body {
        let drain = on.table().drain_of(index).map_or(0, |d| d.since);
        drain_report_for(on, slot, epoch, drain, index, left)
    }

    /// A report from `slot` for the drain of `index` that started at
    /// `drain`.
    fn drain_report_for(
        on: &mut OnCore,
        slot: u16,
        epoch: u64,
        drain: u64,
        index: u16,
        left: u64,
    ) -> Body {
        let body = Body::DrainReport {
            slot,
            epoch,
            drain,
            index,
            left,
            copies: 0,
            unplaceable: 0,
        };
        on.handle(0, &Msg::new(7, 0, body)).body
    }

    /// Sends the second round of clean reports on the drain of `index`,
    /// from scans of every slot in `slots` started at the current epoch,
    /// after checking that the first round alone retired nothing.
    fn confirm_drain(on: &mut OnCore, slots: &[u16], index: u16) {
        let d = *on.table().drain_of(index).unwrap();
        assert_eq!(usize::from(d.unreported), slots.len(), "{d:?}");
        let epoch = on.table().epoch;
        for &slot in slots {
            drain_report(on, slot, epoch, index, 0);
        }
    }

    /// Reports come from scans made at different times: a clean first
    /// round retires nothing, only a second clean round from scans that
    /// started after it does; owners changing in between, or a restart,
    /// start the rounds over.
    #[test]
    fn a_drain_retires_only_on_a_second_clean_round() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("on.redb");
        let mut on = drain_cluster(&path);
        assert_eq!(retire(&mut on, 11), Body::Done { version: 0 });
        let d = *on.table().drain_of(1).unwrap();
        drain_report(&mut on, 0, d.since, 1, 0);
        let before = on.table().epoch;
        drain_report(&mut on, 1, d.since, 1, 0);
        // Clean: not retired, and a new epoch asks for fresh scans.
        let t = *on.table().drain_of(1).unwrap();
        assert_eq!((t.left, t.copies, t.unreported), (0, 0, 2), "{t:?}");
        assert!(on.table().epoch > before);
        assert_eq!(on.table().sns[0].state, State::Up);
        // Scans started before the first clean round was seen count no
        // more, clean or not.
        drain_report(&mut on, 0, before, 1, 0);
        drain_report(&mut on, 1, before, 1, 0);
        assert_eq!(on.table().drain_of(1).unwrap().unreported, 2);
        // A fresh scan finds a record again (a copy written late): held.
        let fresh = on.table().epoch;
        drain_report(&mut on, 0, fresh, 1, 1);
        drain_report(&mut on, 1, fresh, 1, 0);
        let t = *on.table().drain_of(1).unwrap();
        assert_eq!((t.left, t.unreported), (1, 0), "{t:?}");
        // Owners change: the confirmation is void, the rounds start over.
        register(&mut on, 0, 3);
        let changed = on.table().epoch;
        drain_report(&mut on, 0, changed, 1, 0);
        drain_report(&mut on, 1, changed, 1, 0);
        assert!(on.table().retiring(1));
        // A restart forgets the first round too.
        drop(on);
        let mut on = OnCore::open(&path, empty_table(), 2, 0).unwrap();
        on.set_short_failure(100_000);
        let opened = on.table().epoch;
        drain_report(&mut on, 0, opened, 1, 0);
        drain_report(&mut on, 1, opened, 1, 0);
        assert!(on.table().retiring(1));
        confirm_drain(&mut on, &[0, 1], 1);
        assert!(!on.table().retiring(1));
        assert_eq!(on.table().sns[0].state, State::Retired);
    }

    #[test]
    fn nodes_fingerprints_are_kept_per_node_and_served_in_the_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("on.redb");
        let mut on = OnCore::open(&path, empty_table(), 2, 0).unwrap();
        let (old, new) = (
            Fingerprints {
                active: 1,
                other: None,
            },
            Fingerprints {
                active: 1,
                other: Some(2),
            },
        );
        let body = Body::Register {
            role: Role::Mn,
            uuid: 7,
            endpoint: "127.0.0.1:9".parse().unwrap(),
            capacity: 0,
            free: 0,
            device: 0,
            keys: Some(old),
        };
        on.handle(0, &Msg::new(7, 0, body));
        register(&mut on, 0, 8);
        on.set_own_keys(new);
        assert_eq!(on.table().keys_of(7), Some(old));
        // An older node's heartbeat (no fingerprints) keeps what it said.
        heartbeat(&mut on, 10, 7);
        assert_eq!(on.table().keys_of(7), Some(old));
        let beat = Body::Heartbeat {
            uuid: 7,
            free: 0,
            objects: 0,
            keys: Some(new),
        };
        on.handle(20, &Msg::new(7, 0, beat));
        let Body::Table { bytes } = on.handle(30, &Msg::new(9, 0, Body::GetTable)).body else {
            panic!("no table");
        };
        let served = Table::decode(&bytes).unwrap();
        assert_eq!(served.keys_of(7), Some(new));
        assert_eq!(served.keys_of(8), None);
        assert_eq!(served.on_keys, Some(new));
        // Not kept across a restart: nodes report again.
        drop(on);
        let on = OnCore::open(&path, empty_table(), 2, 0).unwrap();
        assert!(on.table().keys.is_empty() && on.table().on_keys.is_none());
    }

    #[test]
    fn a_tenant_revocation_raises_its_minimum_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("on.redb");
        let mut on = OnCore::open(&path, empty_table(), 2, 0).unwrap();
        let revoke = |on: &mut OnCore, tenant: &str, below: u32| {
            on.handle(
                0,
                &Msg::new(
                    7,
                    0,
                    Body::RevokeTenant {
                        tenant: tenant.into(),
                        below,
                    },
                ),
            )
            .body
        };
        assert_eq!(revoke(&mut on, "acme", 1), Body::Done { version: 1 });
        assert_eq!(on.table().min_generation("acme"), 1);
        assert_eq!(on.table().min_generation("bee"), 0);
        // A resend, or an older request, changes nothing.
        let epoch = on.table().epoch;
        assert_eq!(revoke(&mut on, "acme", 1), Body::Done { version: 1 });
        assert_eq!(on.table().epoch, epoch);
        assert_eq!(revoke(&mut on, "acme", 2), Body::Done { version: 2 });
        for (tenant, below) in [("*", 1), ("a/b", 1), ("bee", 0)] {
            let Body::Error { code, message } = revoke(&mut on, tenant, below) else {
                panic!("{tenant} {below} accepted");
            };
            assert_eq!(code, Code::BadRequest, "{message}");
        }
        // Served in the table, and kept across a restart.
        let Body::Table { bytes } = on.handle(0, &Msg::new(9, 0, Body::GetTable)).body else {
            panic!("no table");
        };
        assert_eq!(Table::decode(&bytes).unwrap().min_generation("acme"), 2);
        drop(on);
        let again = OnCore::open(&path, empty_table(), 2, 0).unwrap();
        assert_eq!(again.table().min_generation("acme"), 2);
    }

    #[test]
    fn a_storage_node_is_retired_only_once_every_owner_reports_it_drained() {
        let dir = tempfile::tempdir().unwrap();
        let mut initial = empty_table();
        initial.params.n_d = 2;
        let path = dir.path().join("on.redb");
        let mut on = OnCore::open(&path, initial, 2, 0).unwrap();
        on.set_short_failure(100_000);
        for uuid in [1, 2] {
            register(&mut on, 0, uuid);
        }
        for uuid in [11, 12, 13] {
            register_sn(&mut on, uuid);
        }
        let retire =
            |on: &mut OnCore, uuid: u64| on.handle(0, &Msg::new(5, 0, Body::Retire { uuid })).body;
        // Unknown, or a metadata node: refused.
        assert!(matches!(
            retire(&mut on, 99),
            Body::Error {
                code: Code::NotFound,
                ..
            }
        ));
        assert!(matches!(
            retire(&mut on, 1),
            Body::Error {
                code: Code::BadRequest,
                ..
            }
        ));
        assert_eq!(retire(&mut on, 11), Body::Done { version: 0 });
        let d = *on.table().drain_of(1).unwrap();
        assert_eq!((d.since, d.unreported), (on.table().epoch, 2));
        // Asked again: nothing changes.
        let epoch = on.table().epoch;
        assert_eq!(retire(&mut on, 11), Body::Done { version: 0 });
        assert_eq!(on.table().epoch, epoch);
        // A second one would leave 1 storage node for N_d = 2.
        let Body::Error { code, message } = retire(&mut on, 12) else {
            panic!("retired below N_d");
        };
        assert_eq!(code, Code::Conflict);
        assert!(message.contains("N_d=2"), "{message}");
        // A report from a scan older than the drain does not count; a
        // clean report from one slot is not enough.
        drain_report(&mut on, 0, d.since - 1, 1, 0);
        drain_report(&mut on, 1, d.since, 1, 4);
        let t = on.table().drain_of(1).copied().unwrap();
        assert_eq!((t.left, t.unreported), (4, 1));
        drain_report(&mut on, 0, d.since, 1, 0);
        assert_eq!(on.table().drain_of(1).unwrap().unreported, 0);
        assert_eq!(on.table().sns[0].state, State::Up);
        // Owners change (a third metadata node takes groups): reports
        // from scans before that no longer count.
        register(&mut on, 0, 3);
        let changed = on.table().epoch;
        drain_report(&mut on, 1, d.since, 1, 0);
        drain_report(&mut on, 0, d.since, 1, 0);
        assert!(on.table().retiring(1));
        drain_report(&mut on, 1, changed, 1, 0);
        assert!(on.table().retiring(1));
        drain_report(&mut on, 0, changed, 1, 0);
        confirm_drain(&mut on, &[0, 1], 1);
        let t = on.table().clone();
        assert!(!t.retiring(1));
        assert_eq!(t.sns[0].state, State::Retired);
        // Removing it again is harmless; it cannot register again.
        assert_eq!(retire(&mut on, 11), Body::Done { version: 0 });
        // Retirement survives a restart.
        drop(on);
        let again = OnCore::open(&path, t.clone(), 2, 0).unwrap();
        assert_eq!(again.table().sns[0].state, State::Retired);
        assert!(again.table().drains.is_empty());
    }

    /// A cluster of 2 metadata nodes (slots 0 and 1) and storage nodes
    /// 11, 12, 13 (indexes 1, 2, 3), N_d = 2.
    fn drain_cluster(path: &Path) -> OnCore {
        let mut initial = empty_table();
        initial.params.n_d = 2;
        let mut on = OnCore::open(path, initial, 2, 0).unwrap();
        on.set_short_failure(100_000);
        for uuid in [1, 2] {
            register(&mut on, 0, uuid);
        }
        for uuid in [11, 12, 13] {
            register_sn(&mut on, uuid);
        }
        on
    }

    fn retire(on: &mut OnCore, uuid: u64) -> Body {
        on.handle(0, &Msg::new(5, 0, Body::Retire { uuid })).body
    }

    fn cancel(on: &mut OnCore, uuid: u64) -> Body {
        on.handle(0, &Msg::new(6, 0, Body::CancelRetire { uuid }))
            .body
    }

    #[test]
    fn a_cancelled_drain_leaves_the_node_active_and_ignores_its_reports() {
        let dir = tempfile::tempdir().unwrap();
        let mut on = drain_cluster(&dir.path().join("on.redb"));
        // Refusals: an unknown node, a metadata node.
        let Body::Error { code, message } = cancel(&mut on, 99) else {
            panic!("cancelled an unknown node");
        };
        assert_eq!(code, Code::NotFound);
        assert!(message.contains("no node 0000000000000063"), "{message}");
        assert!(matches!(
            cancel(&mut on, 1),
            Body::Error {
                code: Code::BadRequest,
                ..
            }
        ));
        // A node that is not being drained: answered, nothing changes.
        let epoch = on.table().epoch;
        assert_eq!(cancel(&mut on, 11), Body::Done { version: 0 });
        assert_eq!(on.table().epoch, epoch);

        assert_eq!(retire(&mut on, 11), Body::Done { version: 0 });
        let d = *on.table().drain_of(1).unwrap();
        drain_report(&mut on, 0, d.since, 1, 0);
        assert_eq!(on.table().drain_of(1).unwrap().unreported, 1);
        // Cancelled: out of the table, up, counted for placement (a second
        // removal is no longer refused below N_d because of it).
        assert_eq!(cancel(&mut on, 11), Body::Done { version: 0 });
        let t = on.table().clone();
        assert!(!t.retiring(1) && t.drains.is_empty(), "{:?}", t.drains);
        assert_eq!(t.sns[0].state, State::Up);
        assert!(t.epoch > d.since);
        // Asked again: nothing changes.
        assert_eq!(cancel(&mut on, 11), Body::Done { version: 0 });
        assert_eq!(on.table().epoch, t.epoch);
        // Reports in flight for the cancelled drain, even clean ones from
        // every slot, retire nothing.
        drain_report_for(&mut on, 0, t.epoch, d.since, 1, 0);
        drain_report_for(&mut on, 1, t.epoch, d.since, 1, 0);
        assert_eq!(on.table().sns[0].state, State::Up);
        assert!(on.table().drains.is_empty());
        // The cancel survives a restart.
        drop(on);
        let mut on = OnCore::open(&dir.path().join("on.redb"), empty_table(), 2, 0).unwrap();
        assert!(on.table().drains.is_empty());
        assert_eq!(on.table().sns[0].state, State::Up);
        // Another node can now be removed, as the cancelled one holds
        // replicas again.
        assert_eq!(retire(&mut on, 12), Body::Done { version: 0 });
        let Body::Error { code, .. } = retire(&mut on, 11) else {
            panic!("retired below N_d");
        };
        assert_eq!(code, Code::Conflict);
    }

    #[test]
    fn a_drain_started_again_after_a_cancel_needs_fresh_reports() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("on.redb");
        let mut on = drain_cluster(&path);
        assert_eq!(retire(&mut on, 11), Body::Done { version: 0 });
        let first = *on.table().drain_of(1).unwrap();
        // Progress is published without an fsync: the epoch moves on.
        drain_report(&mut on, 0, first.since, 1, 5);
        drain_report(&mut on, 1, first.since, 1, 3);
        drain_report(&mut on, 1, first.since, 1, 2);
        let late = on.table().epoch;
        assert!(late > first.since + 1);
        // The orchestrator restarts (above every epoch it published),
        // the drain is cancelled and started again: it starts after any
        // scan under the first drain.
        drop(on);
        let mut on = OnCore::open(&path, empty_table(), 2, 0).unwrap();
        assert!(on.table().epoch > late);
        assert_eq!(cancel(&mut on, 11), Body::Done { version: 0 });
        assert!(!on.table().retiring(1));
        assert_eq!(retire(&mut on, 11), Body::Done { version: 0 });
        let second = *on.table().drain_of(1).unwrap();
        assert!(second.since > late);
        assert_eq!(second.unreported, 2);
        // Clean reports from scans under the first drain do not count,
        // by their epoch, and by the drain they name even with an epoch
        // as new as the second one's start.
        drain_report_for(&mut on, 0, late, first.since, 1, 0);
        drain_report_for(&mut on, 1, late, second.since, 1, 0);
        drain_report_for(&mut on, 0, second.since, first.since, 1, 0);
        drain_report_for(&mut on, 1, second.since, first.since, 1, 0);
        let d = *on.table().drain_of(1).unwrap();
        assert_eq!(d.unreported, 2, "{d:?}");
        assert_eq!(on.table().sns[0].state, State::Up);
        // Reports for the second drain from scans that started before it
        // do not count either.
        drain_report(&mut on, 0, second.since - 1, 1, 0);
        assert_eq!(on.table().drain_of(1).unwrap().unreported, 2);
        // Fresh reports do: the node is retired.
        drain_report(&mut on, 0, second.since, 1, 0);
        assert!(on.table().retiring(1));
        drain_report(&mut on, 1, second.since, 1, 0);
        confirm_drain(&mut on, &[0, 1], 1);
        assert!(!on.table().retiring(1));
        assert_eq!(on.table().sns[0].state, State::Retired);
        // A retired node's drain cannot be cancelled.
        let Body::Error { code, message } = cancel(&mut on, 11) else {
            panic!("cancelled a retirement");
        };
        assert_eq!(code, Code::Conflict);
        assert!(
            message.contains("retired already") && message.contains("add it again as a new node"),
            "{message}"
        );
        assert_eq!(on.table().sns[0].state, State::Retired);
    }

    /// A cluster of `drain_cluster` whose epoch moved past the stored one
    /// by heartbeats (published, never stored on their own); returns the
    /// last epoch published.
    fn publish_unstored_epochs(on: &mut OnCore, count: usize) -> u64 {
        for i in 0..count {
            let reply = heartbeat(on, 0, [1, 2, 11, 12, 13][i % 5]);
            assert_eq!(reply.body, Body::Done { version: 0 });
        }
        on.table().epoch
    }

    #[test]
    fn the_epoch_only_goes_up_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("on.redb");
        let mut on = drain_cluster(&path);
        let stored = on.table().epoch;
        // More heartbeats than one reservation covers.
        let late = publish_unstored_epochs(&mut on, 1_500);
        assert!(late > stored + 1_024);
        drop(on);
        let on = OnCore::open(&path, empty_table(), 2, 0).unwrap();
        let reopened = on.table().epoch;
        assert!(
            reopened > late,
            "epoch {reopened} after a restart, {late} before"
        );
        // A restart with nothing published since still moves on.
        drop(on);
        let mut on = OnCore::open(&path, empty_table(), 2, 0).unwrap();
        assert!(on.table().epoch > reopened);
        // A change after the restart publishes a newer table than any a
        // node holds from before it.
        let before = on.table().epoch;
        register_sn(&mut on, 14);
        assert!(on.table().epoch > before && on.table().sns.len() == 4);
        let Body::Table { bytes } = on.handle(0, &Msg::new(9, 0, Body::GetTable)).body else {
            panic!("no table");
        };
        assert!(Table::decode(&bytes).unwrap().epoch > late);
    }

    /// Stores `value` under `key` in the orchestrator database at `path`
    /// (closed), as a damaged or older database would hold it.
    fn store_raw(path: &Path, key: &str, value: Option<&[u8]>) {
        let db = Database::create(path).unwrap();
        let tx = db.begin_write().unwrap();
        {
            let mut state = tx.open_table(STATE).unwrap();
            match value {
                Some(v) => state.insert(key, v).map(drop).unwrap(),
                None => state.remove(key).map(drop).unwrap(),
            }
        }
        tx.commit().unwrap();
    }

    #[test]
    fn a_damaged_stored_table_is_refused_with_the_codec_error_as_its_source() {
        use std::error::Error as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("on.redb");
        drop(drain_cluster(&path));
        store_raw(&path, TABLE_KEY, Some(&[0x53, 0x54, 0x01]));
        let Err(err) = OnCore::open(&path, empty_table(), 2, 0) else {
            panic!("a damaged stored table was accepted");
        };
        assert_eq!(err.kind(), strata_store_protocol::ErrorKind::Malformed);
        let codec = err.source().and_then(|s| s.downcast_ref::<WireError>());
        assert!(codec.is_some(), "{err:?}");
        // Said once: the context names the file, the source what was wrong.
        let text = err.to_string();
        assert!(
            text.contains("stored prefix table") && text.contains("on.redb"),
            "{text}"
        );
        let report = err.report().to_string();
        assert_eq!(report, format!("{text}: {}", codec.unwrap()));
    }

    #[test]
    fn a_second_open_of_the_database_keeps_redb_error_as_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("on.redb");
        let first = drain_cluster(&path);
        let Err(err) = OnCore::open(&path, empty_table(), 2, 0) else {
            panic!("the database opened twice");
        };
        crate::test_support::assert_already_open(&err);
        assert!(err.to_string().contains("on.redb"), "{err}");
        drop(first);
    }

    #[test]
    fn a_damaged_epoch_limit_is_refused_and_an_older_database_moves_past_its_epochs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("on.redb");
        let on = drain_cluster(&path);
        let stored = on.table().epoch;
        drop(on);
        let open = || OnCore::open(&path, empty_table(), 2, 0).map(|on| on.table().epoch);
        let below = (stored - 1).to_be_bytes();
        let cases: [(&[u8], &str); 4] = [
            (&[], "stored epoch limit in"),
            (&[0, 0, 7], "3 bytes, expected 8"),
            (&below, "below the stored table's epoch"),
            (&[0xff; 8], "is exhausted"),
        ];
        for (bytes, want) in cases {
            store_raw(&path, EPOCH_LIMIT_KEY, Some(bytes));
            let err = open().unwrap_err().report().to_string();
            assert!(err.contains(want), "{bytes:?}: {err}");
            assert!(err.contains("on.redb"), "{bytes:?}: {err}");
        }
        // A database from before the limit: its orchestrator may have
        // published epochs far past the stored one.
        store_raw(&path, EPOCH_LIMIT_KEY, None);
        let first = open().unwrap();
        assert!(first >= stored + UNLIMITED_EPOCH_GAP, "{first}");
        // Then the stored limit holds, and the next restart goes past it.
        let second = open().unwrap();
        assert!(
            second > first && second <= first + EPOCH_RESERVE + 1,
            "{second}"
        );
        // Arbitrary bytes never panic.
        let mut rng = 7u64;
        for len in 0..40 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    rng = strata_store_protocol::addr::splitmix64(rng);
                    rng as u8
                })
                .collect();
            let _ = decode_limit(&bytes);
        }
    }

    #[test]
    fn a_scan_from_before_a_restart_does_not_count_once_owners_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("on.redb");
        let mut on = drain_cluster(&path);
        assert_eq!(retire(&mut on, 11), Body::Done { version: 0 });
        let d = *on.table().drain_of(1).unwrap();
        // Both metadata nodes start scans under a table published by
        // heartbeats, with the owners of before the restart.
        let scan = publish_unstored_epochs(&mut on, 10);
        drop(on);
        let mut on = OnCore::open(&path, empty_table(), 2, 0).unwrap();
        // A third metadata node takes groups over: owners change.
        register(&mut on, 0, 3);
        assert!(!on.table().moves.is_empty());
        // The old scans' clean reports prove nothing about the new owners.
        drain_report_for(&mut on, 0, scan, d.since, 1, 0);
        drain_report_for(&mut on, 1, scan, d.since, 1, 0);
        assert!(
            on.table().retiring(1),
            "retired on scans from before the owners changed"
        );
        assert_eq!(on.table().drain_of(1).unwrap().unreported, 2);
        // Scans under the new owners do count.
        let now = on.table().epoch;
        drain_report_for(&mut on, 0, now, d.since, 1, 0);
        drain_report_for(&mut on, 1, now, d.since, 1, 0);
        // ... in two clean rounds.
        confirm_drain(&mut on, &[0, 1], 1);
        assert!(!on.table().retiring(1));
        assert_eq!(on.table().sns[0].state, State::Retired);
    }

    #[test]
    fn a_node_beyond_the_slots_takes_groups_over_in_phases() {
        let dir = tempfile::tempdir().unwrap();
        let initial = empty_table();
        let path = dir.path().join("on.redb");
        let mut on = OnCore::open(&path, initial, 2, 0).unwrap();
        // No heartbeats here: nobody is marked down.
        on.set_short_failure(100_000);
        for uuid in [1, 2] {
            register(&mut on, 0, uuid);
        }
        assert!(on.table().moves.is_empty());
        // The third takes a third of the 64 groups, from both.
        assert_eq!(register(&mut on, 0, 3).body, Body::Registered { index: 2 });
        let moves = on.table().moves.clone();
        assert_eq!(moves.len(), 21);
        assert!(moves
            .iter()
            .all(|m| m.to == 2 && m.phase == MovePhase::Copying));
        let from: Vec<u16> = moves
            .iter()
            .map(|m| on.table().mg_owner[m.group as usize])
            .collect();
        assert!(from.contains(&0) && from.contains(&1));
        let g = moves[0].group;
        // Ready before frozen, or for another epoch, is refused.
        assert!(matches!(
            report(&mut on, 1, g, true, 0),
            Body::Error {
                code: Code::Moving,
                ..
            }
        ));
        // Copied: frozen at the next epoch.
        assert_eq!(report(&mut on, 1, g, false, 0), Body::Done { version: 0 });
        let m = *on.table().move_of(g).unwrap();
        assert_eq!(m.phase, MovePhase::Frozen);
        assert_eq!(m.frozen_epoch, on.table().epoch);
        assert!(matches!(
            report(&mut on, 2, g, true, m.frozen_epoch + 1),
            Body::Error { .. }
        ));
        // A freeze that is not finished in time is called off.
        on.tick(2 + FROZEN_LIMIT_MS + 1).unwrap();
        assert_eq!(on.table().move_of(g).unwrap().phase, MovePhase::Copying);
        assert!(matches!(
            report(&mut on, 3, g, true, m.frozen_epoch),
            Body::Error { .. }
        ));
        // Copied again, frozen again under a new epoch, then ready: the
        // group changes owner and the answer is the new table.
        report(&mut on, 4, g, false, 0);
        let m2 = *on.table().move_of(g).unwrap();
        assert!(m2.frozen_epoch > m.frozen_epoch);
        let Body::Table { bytes } = report(&mut on, 5, g, true, m2.frozen_epoch) else {
            panic!("no table");
        };
        let t = Table::decode(&bytes).unwrap();
        assert_eq!(t.mg_owner[g as usize], 2);
        assert!(t.move_of(g).is_none());
        // A resent ready report gets the table again.
        assert!(matches!(
            report(&mut on, 6, g, true, m2.frozen_epoch),
            Body::Table { .. }
        ));
        // The handovers survive an orchestrator restart.
        drop(on);
        let again = OnCore::open(&path, t.clone(), 2, 0).unwrap();
        assert_eq!(again.table().moves.len(), 20);
        assert_eq!(again.table().groups_of(2), 1);
    }

    #[test]
    fn a_dead_metadata_node_s_groups_are_restored_on_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let initial = empty_table();
        let path = dir.path().join("on.redb");
        let mut on = OnCore::open(&path, initial, 3, 0).unwrap();
        on.set_short_failure(1_000);
        on.set_definitive_failure(5_000);
        for uuid in [1, 2, 3] {
            register(&mut on, 0, uuid);
        }
        let owned = on.table().groups_of(2);
        assert_eq!(owned, 21);
        // Slot 2 goes silent: down after the short timer, dead after the
        // definitive one, its groups restored on slots 0 and 1.
        for now in (500..=4_500).step_by(500) {
            heartbeat(&mut on, now, 1);
            heartbeat(&mut on, now, 2);
            on.tick(now).unwrap();
        }
        // Down: its groups stand in on the others (restored there), and
        // remember their home.
        assert_eq!(on.table().mns[2].state, State::Down);
        assert_eq!(on.table().groups_of(2), 0);
        assert_eq!(on.table().stand_ins.len(), 21);
        assert!(on.table().stand_ins.iter().all(|s| s.home == 2));
        heartbeat(&mut on, 5_500, 1);
        heartbeat(&mut on, 5_500, 2);
        on.tick(5_500).unwrap();
        let t = on.table().clone();
        assert_eq!(t.mns[2].state, State::Dead);
        assert_eq!(t.groups_of(2), 0);
        // Dead: the stand-ins keep the groups for good.
        assert!(t.stand_ins.is_empty());
        assert_eq!(t.moves.len(), 21);
        assert!(t.moves.iter().all(|m| m.phase == MovePhase::Restoring
            && m.frozen_epoch < t.epoch
            && t.mg_owner[m.group as usize] == m.to));
        // Spread evenly: 64 groups, 32 each.
        assert_eq!((t.groups_of(0), t.groups_of(1)), (32, 32));
        assert_eq!(t.gc_mns().count(), 2);
        let m = t.moves[0];
        let msg = |epoch| {
            Msg::new(
                9,
                0,
                Body::MoveReport {
                    group: m.group,
                    to: m.to,
                    ready: true,
                    epoch,
                },
            )
        };
        // A report under another epoch, or from another slot, is refused.
        assert!(matches!(
            on.handle(5_600, &msg(m.frozen_epoch - 1)).body,
            Body::Error { .. }
        ));
        let mut other = msg(m.frozen_epoch);
        other.body = Body::MoveReport {
            group: m.group,
            to: 1 - m.to,
            ready: true,
            epoch: m.frozen_epoch,
        };
        assert!(matches!(on.handle(5_600, &other).body, Body::Error { .. }));
        let Body::Table { bytes } = on.handle(5_600, &msg(m.frozen_epoch)).body else {
            panic!("no table");
        };
        let after = Table::decode(&bytes).unwrap();
        assert!(after.move_of(m.group).is_none());
        assert_eq!(after.mg_owner[m.group as usize], m.to);
        // The dead node comes back: up, owning nothing yet, with a share of
        // the groups coming by handovers; restores and handovers survive an
        // orchestrator restart.
        heartbeat(&mut on, 6_000, 3);
        assert_eq!(on.table().mns[2].state, State::Up);
        assert_eq!(on.table().groups_of(2), 0);
        let coming = |t: &Table| {
            t.moves
                .iter()
                .filter(|m| m.to == 2 && m.phase == MovePhase::Copying)
                .count()
        };
        assert_eq!(coming(on.table()), 64 / 3);
        drop(on);
        let again = OnCore::open(&path, after.clone(), 3, 0).unwrap();
        let restoring = |t: &Table| {
            t.moves
                .iter()
                .filter(|m| m.phase == MovePhase::Restoring)
                .count()
        };
        assert_eq!(restoring(again.table()), 20);
        assert_eq!(coming(again.table()), 64 / 3);
    }

    #[test]
    fn a_down_metadata_node_s_groups_stand_in_elsewhere_and_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let initial = empty_table();
        let path = dir.path().join("on.redb");
        let mut on = OnCore::open(&path, initial, 3, 0).unwrap();
        on.set_short_failure(1_000);
        on.set_definitive_failure(60_000);
        for uuid in [1, 2, 3] {
            register(&mut on, 0, uuid);
        }
        let home: Vec<u32> = (0..64u32)
            .filter(|&g| on.table().mg_owner[g as usize] == 2)
            .collect();
        assert_eq!(home.len(), 21);
        heartbeat(&mut on, 1_500, 1);
        heartbeat(&mut on, 1_500, 2);
        on.tick(1_500).unwrap();
        let t = on.table().clone();
        assert_eq!(t.mns[2].state, State::Down);
        for &g in &home {
            assert_eq!(t.home_of(g), Some(2), "group {g}");
            let m = t.move_of(g).unwrap();
            assert_eq!(m.phase, MovePhase::Restoring);
            assert_eq!(t.mg_owner[g as usize], m.to);
        }
        // A new node takes no group standing in.
        let ready = |on: &mut OnCore, now: u64, g: u32| {
            let m = *on.table().move_of(g).unwrap();
            let msg = Msg::new(
                9,
                0,
                Body::MoveReport {
                    group: g,
                    to: m.to,
                    ready: true,
                    epoch: m.frozen_epoch,
                },
            );
            on.handle(now, &msg).body
        };
        // One stand-in is restored, the others not yet.
        let first = home[0];
        assert!(matches!(ready(&mut on, 1_600, first), Body::Table { .. }));
        assert!(on.table().move_of(first).is_none());
        assert_eq!(on.table().home_of(first), Some(2));
        // Back: the restored group is handed back (copying), the others
        // once restored.
        heartbeat(&mut on, 2_000, 3);
        let t = on.table().clone();
        assert_eq!(t.mns[2].state, State::Up);
        assert_eq!(
            t.move_of(first).map(|m| (m.to, m.phase)),
            Some((2, MovePhase::Copying))
        );
        assert_eq!(t.move_of(home[1]).unwrap().phase, MovePhase::Restoring);
        for &g in &home[1..] {
            assert!(matches!(ready(&mut on, 2_100, g), Body::Table { .. }));
        }
        let t = on.table().clone();
        assert!(home.iter().all(|&g| t.move_of(g).unwrap().to == 2));
        // The handback runs like any handover; done, the group is home.
        assert_eq!(
            report(&mut on, 2_200, first, false, 0),
            Body::Done { version: 0 }
        );
        let m = *on.table().move_of(first).unwrap();
        assert_eq!(m.phase, MovePhase::Frozen);
        let Body::Table { bytes } = report(&mut on, 2_300, first, true, m.frozen_epoch) else {
            panic!("no table");
        };
        let t = Table::decode(&bytes).unwrap();
        assert_eq!(t.mg_owner[first as usize], 2);
        assert_eq!(t.home_of(first), None);
        assert_eq!(t.stand_ins.len(), 20);
        // Down again mid-handback: the handbacks are called off, the
        // groups stay with their stand-ins, still homed on slot 2.
        for now in [3_000, 3_400] {
            heartbeat(&mut on, now, 1);
            heartbeat(&mut on, now, 2);
            on.tick(now).unwrap();
        }
        let t = on.table().clone();
        assert_eq!(t.mns[2].state, State::Down);
        // Its one group home stands in again.
        assert_eq!(t.stand_ins.len(), 21);
        assert!(home.iter().all(|&g| t.home_of(g) == Some(2)));
        assert!(home[1..].iter().all(|&g| t.move_of(g).is_none()));
        assert_eq!(t.groups_of(2), 0);
        // The stand-ins survive an orchestrator restart.
        drop(on);
        let mut on = OnCore::open(&path, t.clone(), 3, 3_400).unwrap();
        assert_eq!(on.table().stand_ins, t.stand_ins);
        on.set_short_failure(1_000);
        on.set_definitive_failure(60_000);
        // Dead meanwhile: the groups stay where they are, for good.
        for now in (4_000..=64_000).step_by(4_000) {
            heartbeat(&mut on, now, 1);
            heartbeat(&mut on, now, 2);
            on.tick(now).unwrap();
        }
        let t = on.table().clone();
        assert_eq!(t.mns[2].state, State::Dead);
        assert!(t.stand_ins.is_empty());
        // Back after that: no stand-in to hand back, but a share of the
        // groups by regular handovers, as a new node would get.
        heartbeat(&mut on, 65_000, 3);
        let t = on.table();
        assert_eq!(t.groups_of(2), 0);
        assert!(t.stand_ins.is_empty());
        let to_it: Vec<_> = t.moves.iter().filter(|m| m.to == 2).collect();
        assert_eq!(to_it.len(), 64 / 3);
        assert!(to_it.iter().all(|m| m.phase == MovePhase::Copying));
    }

    #[test]
    fn two_nodes_down_at_once_stand_in_one_after_the_other() {
        let dir = tempfile::tempdir().unwrap();
        let initial = empty_table();
        let mut on = OnCore::open(&dir.path().join("on.redb"), initial, 3, 0).unwrap();
        on.set_short_failure(1_000);
        on.set_definitive_failure(60_000);
        for uuid in [1, 2, 3] {
            register(&mut on, 0, uuid);
        }
        let beat = |on: &mut OnCore, now: u64, uuids: &[u64]| {
            for &uuid in uuids {
                heartbeat(on, now, uuid);
            }
            on.tick(now).unwrap();
        };
        let owners = on.table().mg_owner.clone();
        // Slots 1 and 2 silent at once: both down, and no stand-in (each
        // holds rows a restore of the other's groups would need).
        beat(&mut on, 1_500, &[1]);
        let t = on.table().clone();
        assert_eq!((t.mns[1].state, t.mns[2].state), (State::Down, State::Down));
        assert_eq!(t.mg_owner, owners);
        assert!(t.stand_ins.is_empty() && t.moves.is_empty());
        // Slot 2 back: slot 1's groups stand in on slots 0 and 2.
        beat(&mut on, 1_600, &[1, 3]);
        let t = on.table().clone();
        assert_eq!(t.mns[2].state, State::Up);
        assert_eq!(t.groups_of(1), 0);
        assert!(t.groups_of(0) > 22 && t.groups_of(2) > 21);
        assert_eq!(t.stand_ins.len(), 21);
        // Slot 2 down again while they are being restored: it keeps its
        // groups until the restores are done, then they stand in too.
        beat(&mut on, 2_700, &[1]);
        let t = on.table().clone();
        assert_eq!(t.mns[2].state, State::Down);
        assert!(t.groups_of(2) > 0);
        for m in t.moves.iter().filter(|m| m.to == 0) {
            let report = Body::MoveReport {
                group: m.group,
                to: m.to,
                ready: true,
                epoch: m.frozen_epoch,
            };
            let reply = on.handle(2_800, &Msg::new(9, 0, report)).body;
            assert!(matches!(reply, Body::Table { .. }), "{reply:?}");
        }
        // Slot 2's own restores cannot finish while it is down (and slot
        // 0 could not gather the rows only slots 1 and 2 hold): its groups
        // wait for it.
        beat(&mut on, 2_900, &[1]);
        let t = on.table().clone();
        assert!(t.groups_of(2) > 0);
        assert!(!t.moves.is_empty() && t.moves.iter().all(|m| m.to == 2));
        // Both back: the restores finish, and slot 1's groups are handed
        // back to it.
        beat(&mut on, 3_000, &[1, 3]);
        for m in on.table().moves.clone() {
            let report = Body::MoveReport {
                group: m.group,
                to: m.to,
                ready: true,
                epoch: m.frozen_epoch,
            };
            on.handle(3_100, &Msg::new(9, 0, report));
        }
        beat(&mut on, 3_200, &[1, 2, 3]);
        let t = on.table().clone();
        assert_eq!(t.mns[1].state, State::Up);
        assert_eq!(t.moves.len(), 21);
        assert!(t
            .moves
            .iter()
            .all(|m| m.to == 1 && m.phase == MovePhase::Copying));
    }

    #[test]
    fn a_handover_from_a_node_that_dies_becomes_a_restore_on_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let initial = empty_table();
        let mut on = OnCore::open(&dir.path().join("on.redb"), initial, 3, 0).unwrap();
        on.set_definitive_failure(5_000);
        for uuid in [1, 2, 3, 4] {
            register(&mut on, 0, uuid);
        }
        let from_dying: Vec<u32> = on
            .table()
            .moves
            .iter()
            .filter(|m| on.table().mg_owner[m.group as usize] == 2)
            .map(|m| m.group)
            .collect();
        let others = on.table().moves.len() - from_dying.len();
        assert!(!from_dying.is_empty() && others > 0);
        for uuid in [1, 2, 4] {
            heartbeat(&mut on, 6_000, uuid);
        }
        on.tick(6_000).unwrap();
        let t = on.table();
        assert_eq!(t.mns[2].state, State::Dead);
        for g in from_dying {
            let m = t.move_of(g).unwrap();
            assert_eq!((m.to, m.phase), (3, MovePhase::Restoring), "group {g}");
        }
        // Handovers from live nodes go on.
        assert_eq!(
            t.moves
                .iter()
                .filter(|m| m.phase == MovePhase::Copying)
                .count(),
            others
        );
        assert_eq!(t.groups_of(2), 0);
    }
}

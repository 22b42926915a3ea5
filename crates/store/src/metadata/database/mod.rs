//! The metadata node's embedded transactional database (redb).
//!
//! Two tables, both keyed by metadata group (4 bytes, big-endian) followed
//! by the object name, so one group's rows are contiguous (moving a group
//! streams one key range):
//! - `records`: the encoded [`Record`];
//! - `tombstones`: the version up to which the name was deleted, so a late
//!   or duplicated replication message can never resurrect a deleted object.

use super::hot_rows::HotRows;
use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use strata_store_protocol::addr::Addr;
use strata_store_protocol::error::{DatabaseResult, Error};
use strata_store_protocol::wire::{decode_record, encode_record, Record, Row};

const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
const TOMBS: TableDefinition<&[u8], u64> = TableDefinition::new("tombstones");
/// Groups sealed for a handover's final copy, by freeze epoch: kept across
/// a restart, so a node that restarts mid-copy does not take changes of a
/// group whose new owner may already serve it.
const SEALED: TableDefinition<u32, u64> = TableDefinition::new("sealed");

/// Which anti-entropy digest a row counts in: (coordinator group, copy
/// index, copy group, whether the row is the coordinator's). A
/// coordinator's row of a name counts once per copy of the name; a copy's
/// row once.
pub type SyncKey = (u32, u8, u32, bool);

/// The digest keys of the row of `name` in group `mg` (see
/// [`MetaDb::index_sync`]).
pub type Classify = Box<dyn Fn(u32, &str) -> Vec<SyncKey> + Send + Sync>;

/// The anti-entropy digests, kept in step with every write.
struct SyncIndex {
    classify: Classify,
    /// XOR of [`sync_hash`] over the rows counted in each key (no entry:
    /// zero).
    sums: HashMap<SyncKey, u64>,
}

impl SyncIndex {
    /// Moves the row of `name` in group `mg` from state `old` to `new`
    /// ((newest version, deleted); `None`: no row).
    fn change(&mut self, mg: u32, name: &str, old: Option<(u64, bool)>, new: Option<(u64, bool)>) {
        if old == new {
            return;
        }
        let h = |s: Option<(u64, bool)>| s.map_or(0, |(v, d)| sync_hash(name, v, d));
        let delta = h(old) ^ h(new);
        for k in (self.classify)(mg, name) {
            let sum = self.sums.entry(k).or_insert(0);
            *sum ^= delta;
            if *sum == 0 {
                self.sums.remove(&k);
            }
        }
    }
}

/// The hash of one name's newest state in the anti-entropy digests.
pub fn sync_hash(name: &str, version: u64, deleted: bool) -> u64 {
    strata_store_protocol::addr::hash(
        name.as_bytes(),
        strata_store_protocol::addr::splitmix64(version) ^ deleted as u64,
    )
}

/// The newest state of a row: its record's version, or its tombstone's
/// (a record is stored only above the tombstone).
fn state(record: Option<u64>, tomb: u64) -> Option<(u64, bool)> {
    match record {
        Some(v) if v > tomb => Some((v, false)),
        _ if tomb > 0 => Some((tomb, true)),
        _ => None,
    }
}

/// Runs `$body` with `$tx` bound to the transaction a read goes through:
/// group commit's open write transaction when there is one (its writes are
/// not durable yet, but they are the database's state, and a read must see
/// them), else a new read transaction. The body is compiled once for each:
/// their tables are distinct types with the same methods.
macro_rules! reading {
    ($db:expr, $what:expr, |$tx:ident| $body:block) => {{
        let open = $db.open_write();
        match open.as_ref() {
            Some($tx) => $body,
            None => {
                let read = $db.db.begin_read().database($what)?;
                let $tx = &read;
                $body
            }
        }
    }};
}

mod scans;

/// The metadata database of one metadata node.
pub struct MetaDb {
    /// Group commit's open write transaction ([`MetaDb::set_grouped`]):
    /// every write since the last flush, not yet durable. Declared before
    /// `db` so that it is dropped (rolled back) first.
    open: std::sync::Mutex<Option<redb::WriteTransaction>>,
    /// Why a group commit failed (its writes are lost): every later
    /// write and flush is refused with it, as nothing after it could be
    /// trusted durable.
    failed: std::sync::Mutex<Option<String>>,
    db: Database,
    /// Which database this is, for errors: `metadata database PATH`.
    place: String,
    /// Anti-entropy digests, once [`MetaDb::index_sync`] set them up.
    sync: std::sync::Mutex<Option<SyncIndex>>,
    /// Recently read records by key (`None`: known absent). A Get is one
    /// lookup, and a redb read transaction was more than half of a
    /// metadata node's user time per zero-byte Get. Every write goes
    /// through this type and drops what it changes, under this lock, so
    /// the cache never outlives a change (see [`MetaDb::forget`]).
    hot: std::sync::Mutex<HotRows>,
    /// Group commit ([`MetaDb::set_grouped`]): writes go into one open
    /// transaction, and [`MetaDb::flush`] commits it durably.
    grouped: AtomicBool,
    /// Writes made since the last durable commit (grouped mode).
    dirty: AtomicBool,
    /// Writes made so far ([`MetaDb::writes`]).
    writes: std::sync::atomic::AtomicU64,
}

/// Memory the database may keep as its page cache. The metadata itself
/// lives on disk; this bounds a metadata node's memory whatever the number
/// of objects (redb's default, 1 GiB, made the node's memory grow with its
/// database until then), and still holds the hot rows of the benchmarks.
pub const CACHE_BYTES: usize = 32 << 20;

fn key(mg: u32, name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + name.len());
    k.extend_from_slice(&mg.to_be_bytes());
    k.extend_from_slice(name.as_bytes());
    k
}

/// The first key after group `mg`'s rows.
fn group_end(mg: u32) -> Vec<u8> {
    match mg.checked_add(1) {
        Some(next) => next.to_be_bytes().to_vec(),
        None => vec![0xff; 5],
    }
}

impl MetaDb {
    /// `PLACE: what`, the context of an error in this database.
    fn at(&self, what: std::fmt::Arguments<'_>) -> String {
        format!("{}: {what}", self.place)
    }

    /// Encodes `rec` for its row under key `k`, checked before the write:
    /// the record's name is the key's (a row under another name's key would
    /// answer for that name), and the bytes decode back to the same record.
    fn encode_row(&self, k: &[u8], rec: &Record) -> Result<Vec<u8>, Error> {
        if k.get(4..) != Some(rec.name.as_bytes()) {
            return Err(Error::Corrupt(self.at(format_args!(
                "refusing to store the record of {:?} under the key of another name",
                rec.name
            ))));
        }
        let bytes = encode_record(rec);
        debug_assert!(
            decode_record(&bytes).as_ref().ok() == Some(rec),
            "the record of {:?} version {} does not decode to itself after encoding: {:?}",
            rec.name,
            rec.version,
            decode_record(&bytes).err()
        );
        Ok(bytes)
    }

    /// Decodes the row stored under key `k`, checked before use: it decodes,
    /// and names the key's name. An error says which group and name.
    fn decode_row(&self, k: &[u8], bytes: &[u8]) -> Result<Record, Error> {
        let group = k
            .get(..4)
            .map(|g| u32::from_be_bytes([g[0], g[1], g[2], g[3]]));
        let name = k.get(4..).and_then(|n| std::str::from_utf8(n).ok());
        let (Some(group), Some(name)) = (group, name) else {
            return Err(Error::Corrupt(
                self.at(format_args!("a record row under a malformed key {k:02x?}")),
            ));
        };
        let r = decode_record(bytes).map_err(|e| {
            Error::malformed(
                self.at(format_args!("the record of {name:?} in group {group}")),
                e,
            )
        })?;
        if r.name != name {
            return Err(Error::Corrupt(self.at(format_args!(
                "the row of {name:?} in group {group} holds the record of {:?}",
                r.name
            ))));
        }
        Ok(r)
    }

    /// Opens (or creates) the database at `path`.
    pub fn open(path: &Path) -> Result<MetaDb, Error> {
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .database(|| format!("opening the metadata database {}", path.display()))?;
        MetaDb::with_tables(db, format!("metadata database {}", path.display()))
    }

    /// Opens (or creates) the database on `backend` instead of a file:
    /// the simulation's disk that crashes and tears writes
    /// ([`crate::metadata::faulty_storage`]). `on_repair` is called with
    /// the progress while redb repairs the file on open, which it does
    /// after every shutdown that was not clean.
    pub fn open_with_backend(
        backend: impl redb::StorageBackend,
        on_repair: impl Fn(f64) + 'static,
    ) -> Result<MetaDb, Error> {
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .set_repair_callback(move |session| on_repair(session.progress()))
            .create_with_backend(backend)
            .database(|| "opening the metadata database on its storage backend".into())?;
        MetaDb::with_tables(db, "metadata database on its storage backend".into())
    }

    /// The metadata database over `db`, its tables created if new.
    fn with_tables(db: Database, place: String) -> Result<MetaDb, Error> {
        let what = || format!("{place}: creating its tables");
        let tx = db.begin_write().database(what)?;
        tx.open_table(RECORDS).database(what)?;
        tx.open_table(TOMBS).database(what)?;
        tx.open_table(SEALED).database(what)?;
        tx.commit().database(what)?;
        Ok(MetaDb {
            open: std::sync::Mutex::new(None),
            failed: std::sync::Mutex::new(None),
            db,
            place,
            sync: std::sync::Mutex::new(None),
            hot: std::sync::Mutex::new(HotRows::default()),
            grouped: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
            writes: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Turns group commit on or off. On, writes go into one redb write
    /// transaction left open: visible at once to every read of this
    /// database (reads go through it), but durable only once
    /// [`MetaDb::flush`] has committed it, with one disk flush for all of
    /// them. The caller must not let anything that depends on a write
    /// leave the node before that flush. Off (the default), every write is
    /// its own durable transaction; turning it off flushes what is pending
    /// first.
    ///
    /// One transaction per group rather than one per write: a commit, even
    /// without a disk flush, writes out every page the write dirtied, and
    /// a round of small writes shares most of its pages (the tables' upper
    /// levels, the allocator's state).
    pub fn set_grouped(&self, on: bool) -> Result<(), Error> {
        if !on {
            self.flush()?;
        }
        self.grouped.store(on, Ordering::Release);
        Ok(())
    }

    /// Makes every write since the last durable commit durable, with one
    /// durable commit of the open transaction (one disk flush for all of
    /// them); nothing to do when there is none. An error means the writes
    /// are lost: nothing that depends on them may be answered, and every
    /// later write and flush is refused with the same reason.
    pub fn flush(&self) -> Result<(), Error> {
        let what = || self.at(format_args!("making the grouped writes durable"));
        self.refuse_after_failure(what)?;
        let tx = self.open_write().take();
        let committed = match tx {
            Some(tx) => tx.commit().database(what),
            None => Ok(()),
        };
        if let Err(e) = &committed {
            self.fail(e.report().to_string());
        }
        self.dirty.store(false, Ordering::Release);
        committed
    }

    /// Whether writes wait for a [`MetaDb::flush`] (grouped mode) and
    /// some are waiting.
    pub fn has_unflushed(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }

    /// Writes made so far: unchanged across a request means it wrote
    /// nothing.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Acquire)
    }

    /// The open transaction of group commit (`None` between groups, and
    /// always when group commit is off).
    fn open_write(&self) -> std::sync::MutexGuard<'_, Option<redb::WriteTransaction>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn failure(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers that a group commit failed (`why`), so that nothing
    /// after it is taken as durable.
    fn fail(&self, why: String) {
        self.failure().get_or_insert(why);
    }

    /// The error of `what` when an earlier group commit failed.
    fn refuse_after_failure(&self, what: impl Fn() -> String) -> Result<(), Error> {
        match self.failure().as_ref() {
            Some(why) => Err(Error::database(
                what(),
                std::io::Error::other(format!(
                    "an earlier group commit failed ({why}); restart the node"
                )),
            )),
            None => Ok(()),
        }
    }

    /// Runs the write `f` in a write transaction: with group commit on,
    /// the open one (begun when there is none), left open for the next
    /// [`MetaDb::flush`]; off, one of its own, committed durably. A write
    /// that fails in the open transaction may have left part of itself
    /// there, so the whole group is rolled back and the database fails as
    /// a failed flush does.
    fn write<T>(
        &self,
        what: impl Fn() -> String,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.writes.fetch_add(1, Ordering::AcqRel);
        if !self.grouped.load(Ordering::Acquire) {
            let tx = self.db.begin_write().database(&what)?;
            let out = f(&tx)?;
            tx.commit().database(&what)?;
            return Ok(out);
        }
        self.refuse_after_failure(&what)?;
        let mut open = self.open_write();
        let tx = match open.take() {
            Some(tx) => tx,
            None => self.db.begin_write().database(&what)?,
        };
        let tx = open.insert(tx);
        self.dirty.store(true, Ordering::Release);
        let out = f(tx);
        if let Err(e) = &out {
            open.take();
            self.fail(e.report().to_string());
        }
        out
    }

    fn hot(&self) -> std::sync::MutexGuard<'_, HotRows> {
        self.hot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The record of `name` in group `mg`.
    pub fn get(&self, mg: u32, name: &str) -> Result<Option<Record>, Error> {
        let k = key(mg, name);
        // Held across the read, so a write cannot slip in between the read
        // and the caching of what it found.
        let mut hot = self.hot();
        if let Some(r) = hot.get(&k) {
            return Ok(r.clone());
        }
        let found = self.read_record(mg, name, &k)?;
        hot.insert(k, found.clone());
        Ok(found)
    }

    /// Whether the record of `name` in group `mg` is in the read cache,
    /// so that [`MetaDb::get`] finds it without reading the database.
    pub fn is_cached(&self, mg: u32, name: &str) -> bool {
        matches!(self.hot().get(&key(mg, name)), Some(Some(_)))
    }

    fn read_record(&self, mg: u32, name: &str, k: &[u8]) -> Result<Option<Record>, Error> {
        let what = || self.at(format_args!("reading the record of {name:?} in group {mg}"));
        reading!(self, what, |tx| {
            let t = tx.open_table(RECORDS).database(what)?;
            let Some(v) = t.get(k).database(what)? else {
                return Ok(None);
            };
            // A row that does not decode is reported, not trusted.
            self.decode_row(k, v.value()).map(Some)
        })
    }

    /// Runs a write of the records under `k` (`None`: possibly any) with
    /// the read cache locked, and drops what the cache held for them, so a
    /// concurrent `get` can neither serve the old row after the write nor
    /// cache it again.
    fn forget<T>(
        &self,
        k: Option<&[u8]>,
        write: impl FnOnce() -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut hot = self.hot();
        let result = write();
        match k {
            Some(k) => {
                hot.remove(k);
            }
            None => hot.clear(),
        }
        result
    }

    /// The tombstone version of `name` in group `mg` (0: none).
    pub fn tombstone(&self, mg: u32, name: &str) -> Result<u64, Error> {
        let what = || {
            self.at(format_args!(
                "reading the tombstone of {name:?} in group {mg}"
            ))
        };
        reading!(self, what, |tx| {
            let t = tx.open_table(TOMBS).database(what)?;
            let version = t
                .get(key(mg, name).as_slice())
                .database(what)?
                .map(|v| v.value())
                .unwrap_or(0);
            Ok(version)
        })
    }

    /// The highest version `name` has had in group `mg` (record or tombstone).
    pub fn latest_version(&self, mg: u32, name: &str) -> Result<u64, Error> {
        let rec = self.get(mg, name)?.map(|r| r.version).unwrap_or(0);
        Ok(rec.max(self.tombstone(mg, name)?))
    }

    /// Stores `rec` in group `mg` unless something at least as new is
    /// there. Returns whether the stored state now has `rec.version`.
    pub fn apply_record(&self, mg: u32, rec: &Record) -> Result<bool, Error> {
        let k = key(mg, &rec.name);
        self.forget(Some(&k), || {
            let (applied, old) = self.write_record(&k, rec)?;
            if let Some(old) = old {
                self.sync_change(mg, &rec.name, old, Some((rec.version, false)));
            }
            Ok(applied)
        })
    }

    fn sync_index(&self) -> std::sync::MutexGuard<'_, Option<SyncIndex>> {
        self.sync.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sync_change(&self, mg: u32, name: &str, old: Option<(u64, bool)>, new: Option<(u64, bool)>) {
        if let Some(ix) = self.sync_index().as_mut() {
            ix.change(mg, name, old, new);
        }
    }

    /// Writes `rec` if newer; returns whether the stored state has its
    /// version, and the state it replaced if it wrote.
    #[allow(clippy::type_complexity)]
    fn write_record(
        &self,
        k: &[u8],
        rec: &Record,
    ) -> Result<(bool, Option<Option<(u64, bool)>>), Error> {
        let what = || {
            self.at(format_args!(
                "writing the record of {:?} version {}",
                rec.name, rec.version
            ))
        };
        self.write(what, |tx| {
            let mut records = tx.open_table(RECORDS).database(what)?;
            let tombs = tx.open_table(TOMBS).database(what)?;
            let tomb = tombs.get(k).database(what)?.map(|v| v.value()).unwrap_or(0);
            let stored = records
                .get(k)
                .database(what)?
                .map(|v| decode_record(v.value()).map(|r| r.version).unwrap_or(0));
            let current = stored.unwrap_or(0);
            if rec.version > current && rec.version > tomb {
                records
                    .insert(k, self.encode_row(k, rec)?.as_slice())
                    .database(what)?;
                Ok((true, Some(state(stored, tomb))))
            } else {
                Ok((current == rec.version, None))
            }
        })
    }

    /// Deletes `name` in group `mg` up to `version`: raises the tombstone and
    /// removes a record that is not newer. Returns the removed record.
    pub fn apply_delete(&self, mg: u32, name: &str, version: u64) -> Result<Option<Record>, Error> {
        let k = key(mg, name);
        self.forget(Some(&k), || {
            let (removed, old, new) = self.write_delete(&k, version)?;
            self.sync_change(mg, name, old, new);
            Ok(removed)
        })
    }

    /// Deletes up to `version`; returns the removed record and the
    /// states before and after.
    #[allow(clippy::type_complexity)]
    fn write_delete(
        &self,
        k: &[u8],
        version: u64,
    ) -> Result<(Option<Record>, Option<(u64, bool)>, Option<(u64, bool)>), Error> {
        let what = || {
            self.at(format_args!(
                "deleting {:?} up to version {version}",
                String::from_utf8_lossy(k.get(4..).unwrap_or_default())
            ))
        };
        self.write(what, |tx| {
            let mut records = tx.open_table(RECORDS).database(what)?;
            let mut tombs = tx.open_table(TOMBS).database(what)?;
            let tomb = tombs.get(k).database(what)?.map(|v| v.value()).unwrap_or(0);
            if version > tomb {
                tombs.insert(k, version).database(what)?;
            }
            let current = records
                .get(k)
                .database(what)?
                .and_then(|v| decode_record(v.value()).ok());
            let old = state(current.as_ref().map(|r| r.version), tomb);
            let tomb = tomb.max(version);
            match current {
                Some(r) if r.version <= version => {
                    records.remove(k).database(what)?;
                    Ok((Some(r), old, state(None, tomb)))
                }
                r => {
                    let new = state(r.map(|r| r.version), tomb);
                    Ok((None, old, new))
                }
            }
        })
    }

    /// Applies a row copied from a group's previous owner, with the usual
    /// version rules (only newer records and tombstones take effect).
    pub fn apply_row(&self, mg: u32, row: &Row) -> Result<(), Error> {
        match row {
            Row::Record(r) => self.apply_record(mg, r).map(|_| ()),
            Row::Tomb { name, version } => self.apply_delete(mg, name, *version).map(|_| ()),
        }
    }

    /// Removes every record and tombstone of group `mg` (a group handed
    /// over to another node); returns how many rows went.
    pub fn drop_group(&self, mg: u32) -> Result<u64, Error> {
        self.forget(None, || {
            let n = self.drop_rows(mg)?;
            if let Some(ix) = self.sync_index().as_mut() {
                ix.sums.retain(
                    |&(coord, _, copy, ours), _| if ours { coord != mg } else { copy != mg },
                );
            }
            Ok(n)
        })
    }

    /// Sets up the anti-entropy digests: `classify` names the digests
    /// each row counts in (it depends on the address layout, which the
    /// database does not know), and every stored row is counted (one read
    /// of the whole database). From then on every write keeps them in
    /// step, under the same lock as the read cache.
    pub fn index_sync(&self, classify: Classify) -> Result<(), Error> {
        let what = || self.at(format_args!("indexing the anti-entropy digests"));
        let _hot = self.hot();
        let mut ix = SyncIndex {
            classify,
            sums: HashMap::new(),
        };
        reading!(self, what, |tx| {
            let records = tx.open_table(RECORDS).database(what)?;
            let tombs = tx.open_table(TOMBS).database(what)?;
            let split = |k: &[u8]| -> Option<(u32, String)> {
                let g = u32::from_be_bytes(k.get(..4)?.try_into().ok()?);
                let name = std::str::from_utf8(k.get(4..)?).ok()?;
                Some((g, name.to_string()))
            };
            for row in records.iter().database(what)? {
                let (k, v) = row.database(what)?;
                let (Some((g, name)), Ok(r)) = (split(k.value()), decode_record(v.value())) else {
                    continue;
                };
                ix.change(g, &name, None, Some((r.version, false)));
            }
            for row in tombs.iter().database(what)? {
                let (k, v) = row.database(what)?;
                let Some((g, name)) = split(k.value()) else {
                    continue;
                };
                // A record there is newer than the tombstone: counted above.
                if records.get(k.value()).database(what)?.is_some() {
                    continue;
                }
                ix.change(g, &name, None, state(None, v.value()));
            }
            *self.sync_index() = Some(ix);
            Ok(())
        })
    }

    /// Runs `f` over the anti-entropy digests (`None` before
    /// [`MetaDb::index_sync`]).
    pub fn with_sync_sums<R>(&self, f: impl FnOnce(&HashMap<SyncKey, u64>) -> R) -> Option<R> {
        self.sync_index().as_ref().map(|ix| f(&ix.sums))
    }

    /// The newest state of `name` in group `mg`: (version, deleted), or
    /// `None` if it has no row.
    pub fn newest(&self, mg: u32, name: &str) -> Result<Option<(u64, bool)>, Error> {
        let rec = self.get(mg, name)?.map(|r| r.version);
        Ok(state(rec, self.tombstone(mg, name)?))
    }

    fn drop_rows(&self, mg: u32) -> Result<u64, Error> {
        let what = || self.at(format_args!("dropping the rows of group {mg}"));
        let (start, end) = (key(mg, ""), group_end(mg));
        self.write(what, |tx| {
            let mut n = 0;
            let mut records = tx.open_table(RECORDS).database(what)?;
            n += records
                .extract_from_if(start.as_slice()..end.as_slice(), |_, _| true)
                .database(what)?
                .count() as u64;
            let mut tombs = tx.open_table(TOMBS).database(what)?;
            n += tombs
                .extract_from_if(start.as_slice()..end.as_slice(), |_, _| true)
                .database(what)?
                .count() as u64;
            Ok(n)
        })
    }

    /// Groups sealed for a handover, with their freeze epochs.
    pub fn sealed(&self) -> Result<Vec<(u32, u64)>, Error> {
        let what = || self.at(format_args!("reading the sealed groups"));
        reading!(self, what, |tx| {
            let t = tx.open_table(SEALED).database(what)?;
            let mut out = Vec::new();
            for row in t.iter().database(what)? {
                let (k, v) = row.database(what)?;
                out.push((k.value(), v.value()));
            }
            Ok(out)
        })
    }

    /// Records that group `mg` is sealed for the freeze of `epoch`
    /// (`None`: no longer sealed).
    pub fn set_sealed(&self, mg: u32, epoch: Option<u64>) -> Result<(), Error> {
        let what = || self.at(format_args!("marking group {mg} sealed at epoch {epoch:?}"));
        self.write(what, |tx| {
            let mut t = tx.open_table(SEALED).database(what)?;
            match epoch {
                Some(e) => t.insert(mg, e).database(what)?,
                None => t.remove(mg).database(what)?,
            };
            Ok(())
        })
    }

    /// Whether group `mg` has any record or tombstone.
    pub fn group_has_rows(&self, mg: u32) -> Result<bool, Error> {
        let what = || self.at(format_args!("looking for rows of group {mg}"));
        reading!(self, what, |tx| {
            let (start, end) = (key(mg, ""), group_end(mg));
            let records = tx.open_table(RECORDS).database(what)?;
            if records
                .range(start.as_slice()..end.as_slice())
                .database(what)?
                .next()
                .is_some()
            {
                return Ok(true);
            }
            let tombs = tx.open_table(TOMBS).database(what)?;
            let mut rows = tombs
                .range(start.as_slice()..end.as_slice())
                .database(what)?;
            let any = rows.next().is_some();
            Ok(any)
        })
    }

    /// Number of records of group `mg`.
    pub fn group_count(&self, mg: u32) -> Result<u64, Error> {
        let what = || self.at(format_args!("counting the records of group {mg}"));
        reading!(self, what, |tx| {
            let t = tx.open_table(RECORDS).database(what)?;
            let (start, end) = (key(mg, ""), group_end(mg));
            let mut n = 0;
            for row in t.range(start.as_slice()..end.as_slice()).database(what)? {
                row.database(what)?;
                n += 1;
            }
            Ok(n)
        })
    }

    /// Which of `addrs` the stored records name as replicas (one pass over
    /// every record: storage nodes ask rarely, to find leaked replicas).
    pub fn referenced(&self, addrs: &std::collections::HashSet<Addr>) -> Result<Vec<Addr>, Error> {
        let what = || self.at(format_args!("looking for the replicas records name"));
        reading!(self, what, |tx| {
            let t = tx.open_table(RECORDS).database(what)?;
            let mut found = std::collections::HashSet::new();
            for row in t.iter().database(what)? {
                let (_, v) = row.database(what)?;
                if let Ok(r) = decode_record(v.value()) {
                    found.extend(r.replicas.into_iter().filter(|a| addrs.contains(a)));
                }
            }
            Ok(found.into_iter().collect())
        })
    }

    /// Number of records (all groups).
    pub fn count(&self) -> Result<u64, Error> {
        let what = || self.at(format_args!("counting the records"));
        reading!(self, what, |tx| {
            let t = tx.open_table(RECORDS).database(what)?;
            t.len().database(what)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::hot_rows::HOT_RECORDS;
    use super::*;
    use strata_store_protocol::wire::GatherCursor;

    fn rec(name: &str, version: u64) -> Record {
        Record {
            name: name.into(),
            size: 1,
            crc: 2,
            version,
            meta: vec![],
            replicas: vec![],
            rename: None,
            attributes: Vec::new(),
            fragments: None,
            inline: None,
        }
    }

    #[test]
    fn a_database_failure_keeps_redb_error_as_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let first = MetaDb::open(&path).unwrap();
        let Err(err) = MetaDb::open(&path) else {
            panic!("the database opened twice");
        };
        let redb = crate::test_support::assert_already_open(&err);
        // The context says what and where; redb's text comes once, as the
        // cause.
        let text = err.to_string();
        assert!(
            text.contains("opening") && text.contains("m.redb"),
            "{text}"
        );
        assert_eq!(err.report().to_string(), format!("{text}: {redb}"));
        drop(first);
    }

    #[test]
    fn a_row_that_does_not_decode_is_refused_with_the_codec_error_as_its_source() {
        use std::error::Error as _;
        let dir = tempfile::tempdir().unwrap();
        let db = MetaDb::open(&dir.path().join("m.redb")).unwrap();
        let k = key(3, "a/b");
        let tx = db.db.begin_write().unwrap();
        tx.open_table(RECORDS)
            .unwrap()
            .insert(k.as_slice(), [1u8, 2, 3].as_slice())
            .unwrap();
        tx.commit().unwrap();
        let err = db.get(3, "a/b").unwrap_err();
        assert_eq!(err.kind(), strata_store_protocol::ErrorKind::Malformed);
        let codec = err
            .source()
            .and_then(|s| s.downcast_ref::<strata_store_protocol::wire::WireError>());
        assert!(codec.is_some(), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("\"a/b\" in group 3") && text.contains("m.redb"),
            "{text}"
        );
    }

    #[test]
    fn records_after_walks_one_group_in_batches() {
        let dir = tempfile::tempdir().unwrap();
        let db = MetaDb::open(&dir.path().join("m.redb")).unwrap();
        for name in ["b", "a", "c", "d"] {
            db.apply_record(7, &rec(name, 1)).unwrap();
        }
        db.apply_record(6, &rec("z", 1)).unwrap();
        db.apply_record(8, &rec("0", 1)).unwrap();
        let names = |v: Vec<Record>| v.into_iter().map(|r| r.name).collect::<Vec<_>>();
        assert_eq!(
            names(db.records_after(7, None, 3).unwrap()),
            ["a", "b", "c"]
        );
        assert_eq!(names(db.records_after(7, Some("c"), 3).unwrap()), ["d"]);
        assert!(db.records_after(7, Some("d"), 3).unwrap().is_empty());
        assert_eq!(
            names(db.records_after(u32::MAX, None, 3).unwrap()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_gather_scans_every_group_in_bounded_pages() {
        let dir = tempfile::tempdir().unwrap();
        let db = MetaDb::open(&dir.path().join("m.redb")).unwrap();
        for g in 0..4u32 {
            for i in 0..50 {
                db.apply_record(g, &rec(&format!("n{i:03}"), 1)).unwrap();
            }
            db.apply_delete(g, &format!("n{:03}", g * 10), 5).unwrap();
        }
        db.apply_delete(2, "gone", 3).unwrap();
        // Names ending in 7, plus the tombstones: pages of at most 10
        // rows and 25 rows looked at, resumed from each page's cursor.
        let wanted = |n: &str| n.ends_with('7') || n == "gone" || n.ends_with('0');
        let mut from = GatherCursor::default();
        let mut all = Vec::new();
        let mut pages = 0;
        loop {
            let (rows, next) = db.gather(&from, wanted, 10, 1 << 20, 25).unwrap();
            assert!(rows.len() <= 10);
            all.extend(rows);
            pages += 1;
            match next {
                Some(c) => from = c,
                None => break,
            }
            assert!(pages < 100, "the scan does not progress");
        }
        let records = all.iter().filter(|r| matches!(r, Row::Record(_))).count();
        let tombs: Vec<_> = all
            .iter()
            .filter_map(|r| match r {
                Row::Tomb { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect();
        // 5 names ending in 7 and 5 ending in 0 per group, minus each
        // group's deleted one (which ends in 0).
        assert_eq!(records, 4 * (5 + 5 - 1));
        assert_eq!(tombs.len(), 5);
        assert!(tombs.contains(&"gone".to_string()));
        // 200 records and 5 tombstones at 25 a page.
        assert!(pages >= 205 / 25, "{pages} pages");
    }

    #[test]
    fn a_group_is_copied_in_pages_and_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let from = MetaDb::open(&dir.path().join("a.redb")).unwrap();
        let to = MetaDb::open(&dir.path().join("b.redb")).unwrap();
        for i in 0..50 {
            from.apply_record(5, &rec(&format!("n{i:02}"), 3)).unwrap();
        }
        from.apply_record(6, &rec("other", 1)).unwrap();
        from.apply_delete(5, "n07", 4).unwrap();
        from.apply_delete(5, "gone", 9).unwrap();
        // The new owner already has an older copy of one and a newer of another.
        to.apply_record(5, &rec("n01", 2)).unwrap();
        to.apply_record(5, &rec("n02", 8)).unwrap();
        for tombs in [false, true] {
            let mut after = String::new();
            loop {
                let (rows, more) = from.group_rows(5, tombs, &after, 7, 60_000).unwrap();
                assert!(rows.len() <= 7);
                for row in &rows {
                    to.apply_row(5, row).unwrap();
                    after = match row {
                        Row::Record(r) => r.name.clone(),
                        Row::Tomb { name, .. } => name.clone(),
                    };
                }
                if !more {
                    break;
                }
            }
        }
        assert_eq!(to.group_count(5).unwrap(), 49);
        assert_eq!(to.get(5, "n01").unwrap().unwrap().version, 3);
        assert_eq!(to.get(5, "n02").unwrap().unwrap().version, 8);
        assert!(to.get(5, "n07").unwrap().is_none());
        assert_eq!(to.tombstone(5, "gone").unwrap(), 9);
        assert!(to.get(6, "other").unwrap().is_none());
        // A byte budget cuts pages too.
        let (rows, more) = from.group_rows(5, false, "", 1000, 10).unwrap();
        assert!(more && rows.len() == 1, "{}", rows.len());
        assert!(from.group_has_rows(5).unwrap());
        assert_eq!(from.drop_group(5).unwrap(), 51);
        assert!(!from.group_has_rows(5).unwrap());
        assert_eq!(from.group_count(5).unwrap(), 0);
        assert_eq!(from.tombstone(5, "gone").unwrap(), 0);
        assert_eq!(from.group_count(6).unwrap(), 1);
    }

    #[test]
    fn the_read_cache_never_serves_a_row_a_write_changed() {
        let dir = tempfile::tempdir().unwrap();
        let db = MetaDb::open(&dir.path().join("m.redb")).unwrap();
        // Absence is cached too, and a write ends it.
        assert!(db.get(1, "a").unwrap().is_none());
        assert!(db.apply_record(1, &rec("a", 1)).unwrap());
        assert_eq!(db.get(1, "a").unwrap().unwrap().version, 1);
        assert!(db.apply_record(1, &rec("a", 4)).unwrap());
        assert_eq!(db.get(1, "a").unwrap().unwrap().version, 4);
        assert!(db.apply_delete(1, "a", 4).unwrap().is_some());
        assert!(db.get(1, "a").unwrap().is_none());
        // Rows copied in from a handover and a group dropped after one.
        db.apply_row(2, &Row::Record(rec("b", 7))).unwrap();
        assert_eq!(db.get(2, "b").unwrap().unwrap().version, 7);
        db.drop_group(2).unwrap();
        assert!(db.get(2, "b").unwrap().is_none());
        // Past its bound the cache starts over and still answers right.
        for i in 0..HOT_RECORDS + 10 {
            assert!(db.get(9, &format!("n{i}")).unwrap().is_none());
        }
        assert!(db.hot().len() <= HOT_RECORDS);
        assert!(db.apply_record(9, &rec("n3", 1)).unwrap());
        assert_eq!(db.get(9, "n3").unwrap().unwrap().version, 1);
    }

    // A direct call answers only from memory: a record counts as cached
    // once a read found it, and no longer once a write changed it; a
    // cached absence does not count (its answer reads the tombstones).
    #[test]
    fn a_record_is_cached_once_read_and_not_after_a_write() {
        let dir = tempfile::tempdir().unwrap();
        let db = MetaDb::open(&dir.path().join("m.redb")).unwrap();
        assert!(db.get(1, "a").unwrap().is_none());
        assert!(!db.is_cached(1, "a"), "an absence");
        assert!(db.apply_record(1, &rec("a", 1)).unwrap());
        assert!(!db.is_cached(1, "a"), "written, not read yet");
        db.get(1, "a").unwrap();
        assert!(db.is_cached(1, "a"));
        assert!(!db.is_cached(2, "a"), "another group");
        assert!(db.apply_record(1, &rec("a", 2)).unwrap());
        assert!(!db.is_cached(1, "a"), "overwritten");
    }

    #[test]
    fn inline_records_round_trip_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = MetaDb::open(&dir.path().join("m.redb")).unwrap();
        let data = vec![0x42; strata_store_protocol::wire::MAX_INLINE];
        let inline = |name: &str| Record {
            size: data.len() as u64,
            crc: crc32c::crc32c(&data),
            replicas: Vec::new(),
            inline: Some(data.clone()),
            ..rec(name, 1)
        };
        for i in 0..3 {
            assert!(db.apply_record(3, &inline(&format!("i{i}"))).unwrap());
        }
        for i in 0..3 {
            let read = db.get(3, &format!("i{i}")).unwrap().unwrap();
            assert_eq!(read.inline.as_deref(), Some(&data[..]), "i{i}");
        }
        let (rows, _) = db.group_rows(3, false, "", 10, 1 << 20).unwrap();
        assert_eq!(rows.len(), 3);
        assert!(matches!(&rows[0], Row::Record(r) if r.inline.as_deref() == Some(&data[..])));
        // A row whose inline bytes were damaged on disk is refused.
        let bytes = encode_record(&inline("i0"));
        let mut damaged = bytes.clone();
        let at = damaged.len() - 1;
        damaged[at] ^= 1;
        let error = db.decode_row(&key(3, "i0"), &damaged).unwrap_err();
        assert!(
            error.report().to_string().contains("CRC-32C"),
            "{}",
            error.report()
        );
        assert_eq!(db.decode_row(&key(3, "i0"), &bytes).unwrap(), inline("i0"));
    }

    #[test]
    fn versions_and_tombstones_order_updates() {
        let dir = tempfile::tempdir().unwrap();
        let db = MetaDb::open(&dir.path().join("m.redb")).unwrap();
        assert!(db.apply_record(3, &rec("a", 2)).unwrap());
        // An older version arriving late is ignored; the same one is an ack.
        assert!(!db.apply_record(3, &rec("a", 1)).unwrap());
        assert!(db.apply_record(3, &rec("a", 2)).unwrap());
        assert_eq!(db.get(3, "a").unwrap().unwrap().version, 2);
        assert!(db.apply_delete(3, "a", 2).unwrap().is_some());
        // A duplicated replication of the deleted version cannot resurrect it.
        assert!(!db.apply_record(3, &rec("a", 2)).unwrap());
        assert!(db.get(3, "a").unwrap().is_none());
        assert_eq!(db.latest_version(3, "a").unwrap(), 2);
        assert!(db.apply_record(3, &rec("a", 3)).unwrap());
        // A late delete of an older version leaves the newer record.
        assert!(db.apply_delete(3, "a", 2).unwrap().is_none());
        assert_eq!(db.get(3, "a").unwrap().unwrap().version, 3);
        drop(db);
        let db = MetaDb::open(&dir.path().join("m.redb")).unwrap();
        assert_eq!(db.get(3, "a").unwrap().unwrap().version, 3);
    }

    #[test]
    fn list_is_paginated_by_prefix_over_groups() {
        let dir = tempfile::tempdir().unwrap();
        let db = MetaDb::open(&dir.path().join("m.redb")).unwrap();
        for i in 0..10 {
            db.apply_record(i % 3, &rec(&format!("p/{i:02}"), 1))
                .unwrap();
            db.apply_record(i % 3, &rec(&format!("q/{i:02}"), 1))
                .unwrap();
        }
        let (page, more) = db.list(&[0, 1, 2], "p/", "", 4).unwrap();
        assert!(more);
        let names: Vec<_> = page.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["p/00", "p/01", "p/02", "p/03"]);
        let (page, more) = db.list(&[0, 1, 2], "p/", "p/03", 100).unwrap();
        assert!(!more);
        assert_eq!(page.len(), 6);
        assert_eq!(page[0].name, "p/04");
        assert_eq!(db.count().unwrap(), 20);
    }

    #[test]
    fn a_row_written_before_attributes_reads_back_with_none_and_keeps_them_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let db = MetaDb::open(&path).unwrap();
        // A row as a build before attributes wrote it: the record's
        // encoding without the attributes' length (and the fragments'
        // and inline flag bytes, newer still) at its end.
        let old = rec("acme/old", 4);
        let mut legacy = encode_record(&old);
        legacy.truncate(legacy.len() - 4);
        let tx = db.db.begin_write().unwrap();
        tx.open_table(RECORDS)
            .unwrap()
            .insert(key(2, "acme/old").as_slice(), legacy.as_slice())
            .unwrap();
        tx.commit().unwrap();
        assert_eq!(db.get(2, "acme/old").unwrap(), Some(old.clone()));
        let (listed, _) = db.list(&[2], "acme/", "", 10).unwrap();
        assert_eq!(listed.len(), 1);
        assert!(listed[0].attributes.is_empty());
        // A new version with attributes keeps them across a reopen, and in
        // the listing.
        let new = Record {
            attributes: b"{\"etag\":\"abc\"}".to_vec(),
            ..rec("acme/old", 5)
        };
        assert!(db.apply_record(2, &new).unwrap());
        drop(db);
        let db = MetaDb::open(&path).unwrap();
        assert_eq!(db.get(2, "acme/old").unwrap(), Some(new.clone()));
        let (listed, _) = db.list(&[2], "acme/", "", 10).unwrap();
        assert_eq!(listed[0].attributes, new.attributes);
    }
}

//! The catalog: volumes, snapshots and layers, in an embedded transactional
//! database (redb). Every change is one transaction; the state readers see
//! is only replaced once the transaction has committed durably.
//!
//! Commits are grouped: each transaction commits without a sync, then
//! waits until a durable commit covers it. One caller at a time makes that
//! durable commit (an empty transaction, which redb makes durable with
//! every commit before it), for every transaction committed by then; the
//! callers queued behind it usually find theirs covered and return without
//! a sync of their own. Under 64 concurrent creates, a sync per change made
//! the catalog the daemon's bottleneck (docs/benchmarks.md, section 4).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use redb::{Database, Durability, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::error::{Result, VolumeError};

const VOLUMES: TableDefinition<&str, &[u8]> = TableDefinition::new("volumes");
const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots");
const LAYERS: TableDefinition<&str, &[u8]> = TableDefinition::new("layers");

/// A volume: a writable chain of layers exported over NBD.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRec {
    /// Unique name; also the NBD export name.
    pub name: String,
    /// Virtual size in bytes.
    pub size: u64,
    /// The layer it writes to.
    pub top: String,
    /// The snapshot (`volume@snapshot`) it was cloned from, if any.
    pub origin: Option<String>,
    /// Creation time, seconds since the Unix epoch.
    pub created: u64,
}

/// A snapshot: a frozen layer of a volume's chain, named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRec {
    /// The volume it was taken of.
    pub volume: String,
    /// Its name, unique within the volume.
    pub name: String,
    /// The frozen layer (the volume's top at the time of the snapshot).
    pub layer: String,
    /// Size of the volume at the time.
    pub size: u64,
    /// Creation time, seconds since the Unix epoch.
    pub created: u64,
}

impl SnapshotRec {
    /// `volume@name`, the key of a snapshot.
    pub fn key(&self) -> String {
        snapshot_key(&self.volume, &self.name)
    }
}

/// The key of snapshot `name` of `volume`.
pub fn snapshot_key(volume: &str, name: &str) -> String {
    format!("{volume}@{name}")
}

/// A layer file of the pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRec {
    /// Identifier; the file is `layers/<id>.qcow2`.
    pub id: String,
    /// The layer below it (its backing file), if any.
    pub parent: Option<String>,
    /// Its virtual size.
    pub size: u64,
}

/// The whole catalog in memory.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// Volumes by name.
    pub volumes: BTreeMap<String, VolumeRec>,
    /// Snapshots by `volume@name`.
    pub snapshots: BTreeMap<String, SnapshotRec>,
    /// Layers by id.
    pub layers: BTreeMap<String, LayerRec>,
}

impl State {
    /// The chain of layer ids from `top` down to the base.
    pub fn chain(&self, top: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut at = Some(top.to_string());
        while let Some(id) = at {
            if out.contains(&id) {
                break; // a loop would be a catalog bug; never spin on it
            }
            at = self.layers.get(&id).and_then(|l| l.parent.clone());
            out.push(id);
        }
        out
    }

    /// Layers no volume's chain reaches: nothing can read them any more.
    pub fn unreachable_layers(&self) -> Vec<String> {
        let live: BTreeSet<String> = self
            .volumes
            .values()
            .flat_map(|v| self.chain(&v.top))
            .collect();
        self.layers
            .keys()
            .filter(|id| !live.contains(*id))
            .cloned()
            .collect()
    }

    /// Volumes cloned from snapshot `key`.
    pub fn clones_of(&self, key: &str) -> Vec<String> {
        self.volumes
            .values()
            .filter(|v| v.origin.as_deref() == Some(key))
            .map(|v| v.name.clone())
            .collect()
    }

    /// Snapshots of `volume`, oldest first.
    pub fn snapshots_of(&self, volume: &str) -> Vec<SnapshotRec> {
        let mut list: Vec<SnapshotRec> = self
            .snapshots
            .values()
            .filter(|s| s.volume == volume)
            .cloned()
            .collect();
        list.sort_by_key(|s| (s.created, s.name.clone()));
        list
    }
}

/// One catalog transaction: changes go to the database and to a copy of
/// the state, which replaces the catalog's state only after the commit.
pub struct Txn {
    tx: redb::WriteTransaction,
    state: State,
}

impl Txn {
    /// The state as this transaction has changed it so far.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Inserts or replaces a volume.
    pub fn put_volume(&mut self, v: VolumeRec) -> Result<()> {
        put(&self.tx, VOLUMES, &v.name, &v)?;
        self.state.volumes.insert(v.name.clone(), v);
        Ok(())
    }

    /// Removes a volume.
    pub fn remove_volume(&mut self, name: &str) -> Result<()> {
        self.tx.open_table(VOLUMES)?.remove(name)?;
        self.state.volumes.remove(name);
        Ok(())
    }

    /// Inserts or replaces a snapshot.
    pub fn put_snapshot(&mut self, s: SnapshotRec) -> Result<()> {
        let key = s.key();
        put(&self.tx, SNAPSHOTS, &key, &s)?;
        self.state.snapshots.insert(key, s);
        Ok(())
    }

    /// Removes a snapshot by `volume@name`.
    pub fn remove_snapshot(&mut self, key: &str) -> Result<()> {
        self.tx.open_table(SNAPSHOTS)?.remove(key)?;
        self.state.snapshots.remove(key);
        Ok(())
    }

    /// Inserts or replaces a layer.
    pub fn put_layer(&mut self, l: LayerRec) -> Result<()> {
        put(&self.tx, LAYERS, &l.id, &l)?;
        self.state.layers.insert(l.id.clone(), l);
        Ok(())
    }

    /// Removes a layer.
    pub fn remove_layer(&mut self, id: &str) -> Result<()> {
        self.tx.open_table(LAYERS)?.remove(id)?;
        self.state.layers.remove(id);
        Ok(())
    }

    /// Removes every layer no volume reaches; returns their ids, whose
    /// files the caller unlinks after the commit.
    pub fn collect_garbage(&mut self) -> Result<Vec<String>> {
        let dead = self.state.unreachable_layers();
        for id in &dead {
            self.remove_layer(id)?;
        }
        Ok(dead)
    }
}

fn put<T: Serialize>(
    tx: &redb::WriteTransaction,
    table: TableDefinition<&str, &[u8]>,
    key: &str,
    value: &T,
) -> Result<()> {
    let bytes = serde_json::to_vec(value)?;
    tx.open_table(table)?.insert(key, bytes.as_slice())?;
    Ok(())
}

/// The catalog of a pool.
pub struct Catalog {
    db: Database,
    /// The state after every commit, durable or not: what the next
    /// transaction starts from. Held across a transaction, so that
    /// transactions apply one after another.
    applied: Mutex<Version>,
    /// The state after the last durable commit: what readers see.
    durable: Mutex<Durable>,
    /// Held while a durable commit is made; the callers waiting for it
    /// find their commits covered once they get it.
    syncing: Mutex<()>,
    /// Durable commits made (each is one sync of the database).
    syncs: AtomicU64,
}

/// A state and the number of commits it follows. Shared, not copied:
/// readers and the durable version take it as it is, and a transaction
/// copies it once to change it.
#[derive(Default)]
struct Version {
    state: Arc<State>,
    commits: u64,
}

/// The durable version, and why the catalog stopped, if a durable commit
/// failed.
#[derive(Default)]
struct Durable {
    version: Version,
    failed: Option<String>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog").finish_non_exhaustive()
    }
}

impl Catalog {
    /// Opens (or creates) the catalog database at `path` and loads it.
    /// Fails if another process has it open.
    pub fn open(path: &Path) -> Result<Catalog> {
        let db = Database::create(path).map_err(|e| {
            VolumeError::Catalog(format!(
                "cannot open {}: {e} (is another daemon using this pool?)",
                path.display()
            ))
        })?;
        let tx = db.begin_write()?;
        for t in [VOLUMES, SNAPSHOTS, LAYERS] {
            tx.open_table(t)?;
        }
        tx.commit()?;
        let state = Arc::new(load(&db)?);
        Ok(Catalog {
            db,
            applied: Mutex::new(Version {
                state: state.clone(),
                commits: 0,
            }),
            durable: Mutex::new(Durable {
                version: Version { state, commits: 0 },
                failed: None,
            }),
            syncing: Mutex::new(()),
            syncs: AtomicU64::new(0),
        })
    }

    /// The state as last committed durably.
    pub fn state(&self) -> Arc<State> {
        self.durable.lock().version.state.clone()
    }

    /// Durable commits made since the catalog was opened (fewer than the
    /// updates when concurrent updates share them).
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Runs `change` in one transaction and returns once it is committed
    /// durably. If `change` fails, nothing is written and the state is
    /// unchanged.
    pub fn update<T>(&self, change: impl FnOnce(&mut Txn) -> Result<T>) -> Result<T> {
        let (out, commit) = {
            let mut applied = self.applied.lock();
            self.check_healthy()?;
            let mut tx = self.db.begin_write()?;
            // Made durable below, by a commit that may cover others too.
            tx.set_durability(Durability::None);
            let mut txn = Txn {
                tx,
                state: State::clone(&applied.state),
            };
            match change(&mut txn) {
                Ok(out) => {
                    txn.tx.commit()?;
                    applied.state = Arc::new(txn.state);
                    applied.commits += 1;
                    (out, applied.commits)
                }
                Err(e) => {
                    txn.tx.abort()?;
                    return Err(e);
                }
            }
        };
        self.make_durable(commit)?;
        Ok(out)
    }

    /// Returns once commit number `commit` is durable, making every commit
    /// so far durable if it is not yet.
    fn make_durable(&self, commit: u64) -> Result<()> {
        let _turn = self.syncing.lock();
        if self.durable.lock().version.commits >= commit {
            return Ok(());
        }
        self.check_healthy()?;
        let covered = {
            let applied = self.applied.lock();
            Version {
                state: applied.state.clone(),
                commits: applied.commits,
            }
        };
        debug_assert!(covered.commits >= commit);
        // An empty transaction: redb's durable commit persists every
        // commit made before it.
        let synced = (|| -> Result<()> {
            self.db.begin_write()?.commit()?;
            Ok(())
        })();
        let mut durable = self.durable.lock();
        match synced {
            Ok(()) => {
                debug_assert!(covered.commits > durable.version.commits);
                durable.version = covered;
                self.syncs.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                // The applied state is now ahead of the disk, and nothing
                // says which of the commits it covered survive: stop.
                let why = format!(
                    "the catalog could not be made durable ({e}); restart the daemon, \
                     which reloads the catalog from disk"
                );
                durable.failed = Some(why.clone());
                Err(VolumeError::Catalog(why))
            }
        }
    }

    /// Fails once a durable commit has failed.
    fn check_healthy(&self) -> Result<()> {
        match &self.durable.lock().failed {
            Some(why) => Err(VolumeError::Catalog(why.clone())),
            None => Ok(()),
        }
    }
}

fn load(db: &Database) -> Result<State> {
    let rx = db.begin_read()?;
    let mut state = State::default();
    for item in rx.open_table(VOLUMES)?.iter()? {
        let (k, v) = item?;
        state.volumes.insert(
            k.value().to_string(),
            decode(v.value(), "volume", k.value())?,
        );
    }
    for item in rx.open_table(SNAPSHOTS)?.iter()? {
        let (k, v) = item?;
        state.snapshots.insert(
            k.value().to_string(),
            decode(v.value(), "snapshot", k.value())?,
        );
    }
    for item in rx.open_table(LAYERS)?.iter()? {
        let (k, v) = item?;
        state.layers.insert(
            k.value().to_string(),
            decode(v.value(), "layer", k.value())?,
        );
    }
    Ok(state)
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8], kind: &str, key: &str) -> Result<T> {
    serde_json::from_slice(bytes)
        .map_err(|e| VolumeError::Catalog(format!("{kind} record '{key}' does not decode: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    fn volume(name: &str) -> VolumeRec {
        VolumeRec {
            name: name.to_string(),
            size: 1 << 20,
            top: format!("layer-{name}"),
            origin: None,
            created: 0,
        }
    }

    /// Concurrent updates share durable commits, each returns only once
    /// its change is durable (it is there after the database is opened
    /// again), and readers see every change that returned.
    #[test]
    fn concurrent_updates_share_syncs_and_all_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.redb");
        let catalog = Arc::new(Catalog::open(&path).unwrap());
        let (threads, each) = (16, 25);
        let start = Arc::new(Barrier::new(threads));
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let (catalog, start) = (catalog.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for n in 0..each {
                        let name = format!("v{thread}-{n}");
                        catalog.update(|t| t.put_volume(volume(&name))).unwrap();
                        assert!(catalog.state().volumes.contains_key(&name));
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        let updates = (threads * each) as u64;
        assert!(
            catalog.syncs() < updates,
            "{} syncs for {updates} concurrent updates: none shared",
            catalog.syncs()
        );
        assert_eq!(catalog.state().volumes.len(), threads * each);
        drop(catalog);
        let again = Catalog::open(&path).unwrap();
        assert_eq!(again.state().volumes.len(), threads * each);
    }

    /// A failed change writes nothing, and the next one still commits.
    #[test]
    fn a_failed_change_leaves_the_state_and_the_next_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.redb");
        let catalog = Catalog::open(&path).unwrap();
        let refused: Result<()> = catalog.update(|t| {
            t.put_volume(volume("half"))?;
            Err(VolumeError::Conflict("refused".into()))
        });
        assert!(refused.is_err());
        catalog.update(|t| t.put_volume(volume("whole"))).unwrap();
        let names: Vec<String> = catalog.state().volumes.keys().cloned().collect();
        assert_eq!(names, ["whole"]);
        drop(catalog);
        let names: Vec<String> = Catalog::open(&path)
            .unwrap()
            .state()
            .volumes
            .keys()
            .cloned()
            .collect();
        assert_eq!(names, ["whole"]);
    }
}

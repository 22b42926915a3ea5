//! The catalog: volumes, snapshots and layers, in an embedded transactional
//! database (redb). Every change is one transaction; the in-memory copy is
//! only replaced once the transaction has committed durably.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use parking_lot::Mutex;
use redb::{Database, ReadableTable, TableDefinition};
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
    state: Mutex<State>,
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
        let state = load(&db)?;
        Ok(Catalog {
            db,
            state: Mutex::new(state),
        })
    }

    /// A copy of the current state.
    pub fn state(&self) -> State {
        self.state.lock().clone()
    }

    /// Runs `change` in one transaction and commits it durably. If
    /// `change` fails, nothing is written and the state is unchanged.
    pub fn update<T>(&self, change: impl FnOnce(&mut Txn) -> Result<T>) -> Result<T> {
        let mut state = self.state.lock();
        let mut txn = Txn {
            tx: self.db.begin_write()?,
            state: state.clone(),
        };
        match change(&mut txn) {
            Ok(out) => {
                txn.tx.commit()?;
                *state = txn.state;
                Ok(out)
            }
            Err(e) => {
                txn.tx.abort()?;
                Err(e)
            }
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

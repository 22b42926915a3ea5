//! The volume service: creates, snapshots, clones, grows and deletes
//! volumes, keeping the catalog, the layer files and the NBD exports in
//! step.
//!
//! Every multi-step change is ordered so that a crash at any point leaves
//! something [`Service::open`] can reconcile: the new layer file is written
//! and synced, then the catalog commits, and only then are old files
//! unlinked. A file the catalog does not know is an orphan of an
//! interrupted change and is removed at startup; a layer the catalog names
//! but whose file is missing is reported and its volumes are not served.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::Serialize;
use strata_disk::layer::Format;
use strata_disk::{create, CreateOptions, Disk, DiskError, OpenOptions};
use strata_nbd::{Export, ExportSet};

use crate::catalog::{snapshot_key, Catalog, LayerRec, SnapshotRec, State, Txn, VolumeRec};
use crate::pool::{self, layer_file, new_id};

pub mod autocompact;
pub mod compact;
pub mod standby;

use crate::error::{Result, VolumeError};
use crate::failpoint::failpoint;
use crate::metrics;
use crate::names::{check_name, check_size};
use crate::trash::Trash;
use crate::volume::Volume;
use compact::Jobs;
use standby::{Keeper, Standby};

/// How a service runs.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The pool directory: `catalog.redb` and `layers/`.
    pub pool: PathBuf,
    /// Metadata cache bound of each volume.
    pub cache_bytes: u64,
    /// Cluster size of new volumes' layers (snapshots keep their volume's).
    pub cluster_size: u64,
    /// Give new volumes' layers extended L2 entries (subclusters), so the
    /// first small write to a cluster after a snapshot writes one
    /// subcluster instead of copying the whole cluster. Ignored for
    /// clusters under 16 KiB, which qcow2 subclusters cannot divide.
    pub extended_l2: bool,
    /// Keep the next snapshot's top prepared ahead for volumes whose chain
    /// index is at least this many bytes (`None`: never). See
    /// [`standby`].
    pub standby_min_index: Option<u64>,
    /// How long a layer a snapshot froze may wait for the client's next
    /// flush before the daemon makes it durable itself. Zero: every
    /// snapshot call returns only once its layer is durable. See
    /// [`Service::create_snapshot`].
    pub durable_within: Duration,
    /// Drop a frozen layer's pages from the kernel's page cache once it
    /// is durable (see [`strata_disk::Disk::set_drop_sealed_cache`]).
    pub drop_sealed_cache: bool,
    /// When the daemon compacts a volume on its own (`None`: only when
    /// asked). See [`autocompact`].
    pub auto_compact: Option<autocompact::AutoCompact>,
}

/// Default of [`ServiceConfig::durable_within`]: the kernel's own bound
/// on how long written data stays in memory (`dirty_expire_centisecs`).
/// Hosts that drop sealed layers from the page cache
/// ([`ServiceConfig::drop_sealed_cache`]) want it short, so the pages are
/// released soon; see docs/volume.md, "Durability".
pub const DEFAULT_DURABLE_WITHIN: Duration = Duration::from_secs(30);

impl ServiceConfig {
    /// The layer format of a new volume: what `requested` names, the
    /// daemon's defaults for the rest. Extended L2 entries are a default
    /// only where the cluster size allows them. The values themselves are
    /// checked where the file is made ([`strata_disk::create`]), which
    /// refuses a bad combination before writing anything.
    fn volume_format(&self, requested: &VolumeFormat) -> (u64, bool) {
        let cluster_size = requested.cluster_size.unwrap_or(self.cluster_size);
        let default_extended = self.extended_l2
            && cluster_size >= 1 << strata_format::entry::MIN_EXTENDED_CLUSTER_BITS;
        (
            cluster_size,
            requested.extended_l2.unwrap_or(default_extended),
        )
    }
}

/// Layer format asked for when a volume is created; `None` fields take
/// the daemon's defaults (`--cluster-size`, `--extended-l2`). Snapshots,
/// grows and clones keep the format of the layer they build on.
#[derive(Debug, Clone, Default)]
pub struct VolumeFormat {
    /// Cluster size in bytes: a power of two from 512 B to 2 MiB.
    pub cluster_size: Option<u64>,
    /// Extended L2 entries (subclusters); needs clusters of 16 KiB or more.
    pub extended_l2: Option<bool>,
}

/// A volume as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct VolumeInfo {
    /// Name, also the NBD export name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Layers in its chain (snapshots, clone origins and grows add layers).
    pub chain_length: usize,
    /// The layer it writes to.
    pub top_layer: String,
    /// The layer file prepared ahead for its next snapshot, if any (see
    /// [`standby`]); the catalog names it once a snapshot uses it.
    pub standby_layer: Option<String>,
    /// The snapshot it was cloned from.
    pub origin: Option<String>,
    /// Its snapshots, oldest first.
    pub snapshots: Vec<String>,
    /// Creation time, seconds since the Unix epoch.
    pub created: u64,
    /// I/O pause of the last snapshot or grow since the daemon started, in ms.
    pub last_pause_ms: Option<f64>,
    /// Layers a compaction would remove now: layers of deleted snapshots
    /// and of grows that sit in runs of two or more.
    pub reclaimable_layers: usize,
    /// Cluster size of the layer it writes to, in bytes.
    pub cluster_size: Option<u64>,
    /// Whether the layer it writes to has extended L2 entries.
    pub extended_l2: bool,
    /// Where NBD clients reach it (`nbd://HOST:PORT/NAME`, `nbds://` over
    /// TLS), once the daemon has told the service its NBD address.
    pub nbd_uri: Option<String>,
}

/// A snapshot as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotInfo {
    /// Volume it was taken of.
    pub volume: String,
    /// Its name.
    pub name: String,
    /// The frozen layer.
    pub layer: String,
    /// Size of the volume when it was taken.
    pub size: u64,
    /// Creation time, seconds since the Unix epoch.
    pub created: u64,
    /// Volumes cloned from it.
    pub clones: Vec<String>,
}

/// What a snapshot took.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotReport {
    /// The new snapshot.
    pub snapshot: SnapshotInfo,
    /// Time I/O to the volume was held back, catalog commit included, in ms.
    pub pause_ms: f64,
    /// Wall time of the whole call, in ms.
    pub total_ms: f64,
    /// Whether the snapshot's layer was durable (synced, and clean on
    /// disk) when the call returned. If not, it becomes durable at the
    /// volume's next flush, or within the daemon's `--durable-within`.
    pub durable: bool,
    /// Time spent making it durable after the pause, in ms (0 if not).
    pub sync_ms: f64,
}

/// What a grow did.
#[derive(Debug, Clone, Serialize)]
pub struct ResizeReport {
    /// The volume.
    pub name: String,
    /// Size before.
    pub old_size: u64,
    /// Size now.
    pub size: u64,
    /// Time I/O was held back, in ms (0 when the size did not change).
    pub pause_ms: f64,
}

/// What a delete did.
#[derive(Debug, Clone, Serialize)]
pub struct DeleteReport {
    /// What was deleted (`volume` or `volume@snapshot`).
    pub deleted: String,
    /// Layer files removed because nothing reads them any more.
    pub layers_removed: usize,
    /// Layers kept because newer layers or clones still read them.
    pub layers_kept: usize,
}

/// The pool as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct PoolInfo {
    /// Pool directory.
    pub pool: PathBuf,
    /// Volumes in the catalog.
    pub volumes: usize,
    /// Snapshots in the catalog.
    pub snapshots: usize,
    /// Layer files in the catalog.
    pub layers: usize,
    /// Removed layer files a background thread has not unlinked yet.
    pub trash_pending: usize,
    /// Problems found at startup (missing files, chains that do not match).
    pub problems: Vec<String>,
}

/// What startup reconciliation found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecoveryReport {
    /// Volumes opened and exported.
    pub volumes: usize,
    /// Layer files removed because the catalog did not name them
    /// (left by a change interrupted before its commit).
    pub orphans_removed: Vec<String>,
    /// Catalog layers removed because no volume reached them (left by a
    /// change interrupted after its commit).
    pub unreachable_removed: Vec<String>,
    /// Problems that need an operator (volumes not served).
    pub problems: Vec<String>,
    /// Layer files whose backing name was set to the parent the catalog
    /// records (left by a compaction interrupted after its commit).
    pub rebased: Vec<String>,
    /// Layer files a crash left marked dirty (a snapshot's layer not yet
    /// made durable), whose refcounts were rebuilt and which are clean now.
    pub repaired: Vec<String>,
}

/// A served volume and the lock that serializes changes to it.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) volume: Arc<Volume>,
    pub(crate) changes: Mutex<()>,
    /// The next snapshot's top, prepared ahead (big volumes only).
    pub(crate) standby: Mutex<Option<Standby>>,
}

#[derive(Debug, Default)]
struct Registry {
    live: HashMap<String, Arc<Live>>,
    /// Names being created right now.
    reserved: HashSet<String>,
}

/// The volume service of one pool.
#[derive(Debug)]
pub struct Service {
    pub(crate) config: ServiceConfig,
    pub(crate) catalog: Catalog,
    exports: Arc<ExportSet>,
    registry: Mutex<Registry>,
    problems: Vec<String>,
    /// Compactions by volume: the running one or the last one.
    pub(crate) compactions: Jobs,
    /// Held while volumes are cloned and while a compaction decides which
    /// volumes read the layers it replaces, so no clone slips in between.
    pub(crate) topology: Mutex<()>,
    /// Where removed layer files go to be unlinked in the background.
    trash: Trash,
    /// The thread keeping standby tops ready.
    pub(crate) keeper: Keeper,
    /// The NBD server's URI base (`nbd://HOST:PORT`), set once it listens.
    nbd_base: std::sync::OnceLock<String>,
}

/// Bound on the runs one compaction merges (each removes a layer; chains
/// are at most 65,535 layers).
pub(crate) const MAX_COMPACTION_RUNS: usize = 1 << 16;

impl Service {
    /// Opens the pool (creating it if needed), reconciles the catalog with
    /// the files, opens every volume and adds it to `exports`.
    pub fn open(
        config: ServiceConfig,
        exports: Arc<ExportSet>,
    ) -> Result<(Service, RecoveryReport)> {
        let layers_dir = pool::layers(&config.pool);
        std::fs::create_dir_all(&layers_dir).map_err(|e| {
            VolumeError::Io(format!(
                "cannot create pool directory {}: {e}",
                layers_dir.display()
            ))
        })?;
        let catalog = Catalog::open(&pool::catalog(&config.pool))?;
        let mut report = RecoveryReport::default();
        let dead = catalog.update(Txn::collect_garbage)?;
        report.unreachable_removed = dead;
        report.rebased = rebase_to_catalog(&layers_dir, &catalog.state())?;
        let trash = Trash::open(&config.pool)?;
        report.orphans_removed = remove_orphans(&layers_dir, &catalog.state(), &trash)?;
        repair_frozen_layers(&layers_dir, &catalog.state(), &mut report);
        let mut service = Service {
            config,
            catalog,
            exports,
            registry: Mutex::new(Registry::default()),
            problems: Vec::new(),
            compactions: Jobs::default(),
            topology: Mutex::new(()),
            trash,
            keeper: Keeper::default(),
            nbd_base: std::sync::OnceLock::new(),
        };
        let state = service.catalog.state();
        for v in state.volumes.values() {
            match service.open_volume(&state, v) {
                Ok(live) => {
                    service.export(&v.name, &live)?;
                    service.registry.lock().live.insert(v.name.clone(), live);
                    report.volumes += 1;
                }
                Err(e) => report
                    .problems
                    .push(format!("volume '{}' is not served: {e}", v.name)),
            }
        }
        service.problems = report.problems.clone();
        Ok((service, report))
    }

    /// Path of a layer file.
    pub(crate) fn layer_path(&self, id: &str) -> PathBuf {
        pool::layers(&self.config.pool).join(layer_file(id))
    }

    /// Opens a volume's top for writing and checks that the chain its
    /// files describe is the one the catalog records.
    fn open_volume(&self, state: &State, v: &VolumeRec) -> Result<Arc<Live>> {
        let chain = state.chain(&v.top);
        for id in &chain {
            if !state.layers.contains_key(id) {
                return Err(VolumeError::Catalog(format!(
                    "layer {id} is missing from the catalog"
                )));
            }
            if !self.layer_path(id).exists() {
                return Err(VolumeError::Io(format!(
                    "layer file {} is missing",
                    self.layer_path(id).display()
                )));
            }
        }
        let disk = self.open_disk(&self.layer_path(&v.top))?;
        let on_disk: Vec<String> = disk
            .layers()
            .iter()
            .rev()
            .map(|l| {
                l.path()
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default()
            })
            .collect();
        if on_disk != chain {
            return Err(VolumeError::Catalog(format!(
                "its files chain {} but the catalog records {}",
                on_disk.join(" <- "),
                chain.join(" <- ")
            )));
        }
        Ok(Arc::new(Live {
            volume: Arc::new(Volume::new(&v.name, disk)),
            changes: Mutex::new(()),
            standby: Mutex::new(None),
        }))
    }

    /// Opens a served volume's chain for writing, with the service's
    /// cache policy for the layers its snapshots freeze.
    fn open_disk(&self, top: &Path) -> Result<Disk> {
        let disk = Disk::open(top, &self.open_options())?;
        disk.set_drop_sealed_cache(self.config.drop_sealed_cache);
        Ok(disk)
    }

    fn open_options(&self) -> OpenOptions {
        OpenOptions {
            writable: true,
            cache_bytes: self.config.cache_bytes,
            format: Some(Format::Qcow2),
            ignore_index: false,
            force_share: false,
        }
    }

    fn export(&self, name: &str, live: &Live) -> Result<()> {
        let export = Export::new(name, live.volume.clone(), false)
            .map_err(|e| VolumeError::Invalid(format!("cannot export '{name}': {e}")))?;
        self.exports.replace(export);
        Ok(())
    }

    /// Names of the served volumes.
    pub(crate) fn volume_names(&self) -> Vec<String> {
        self.registry.lock().live.keys().cloned().collect()
    }

    /// The live entry of volume `name`, if it is served.
    pub(crate) fn live_entry(&self, name: &str) -> Option<Arc<Live>> {
        self.registry.lock().live.get(name).cloned()
    }

    /// The served volume `name`, if it is served.
    pub(crate) fn live_volume(&self, name: &str) -> Option<Arc<Volume>> {
        self.live_entry(name).map(|l| l.volume.clone())
    }

    /// The live volume `name`; 409 while it is being created, else 404.
    fn live(&self, name: &str) -> Result<Arc<Live>> {
        let registry = self.registry.lock();
        if let Some(live) = registry.live.get(name) {
            return Ok(live.clone());
        }
        if registry.reserved.contains(name) {
            return Err(VolumeError::Conflict(format!(
                "volume '{name}' is being created by another request; retry once it is done"
            )));
        }
        Err(not_found(name))
    }

    /// Reserves a new volume name, or says why it cannot be used.
    fn reserve(&self, name: &str) -> Result<NameReservation<'_>> {
        check_name("volume", name)?;
        let mut reg = self.registry.lock();
        if reg.live.contains_key(name)
            || reg.reserved.contains(name)
            || self.catalog.state().volumes.contains_key(name)
        {
            return Err(VolumeError::Conflict(format!(
                "a volume named '{name}' already exists; pick another name"
            )));
        }
        reg.reserved.insert(name.to_string());
        Ok(NameReservation {
            service: self,
            name: name.to_string(),
        })
    }

    /// Creates an empty volume of `size` bytes in the daemon's default
    /// layer format and exports it.
    pub fn create_volume(&self, name: &str, size: u64) -> Result<VolumeInfo> {
        self.create_volume_as(name, size, &VolumeFormat::default())
    }

    /// Creates an empty volume of `size` bytes whose layers have `format`
    /// and exports it.
    pub fn create_volume_as(
        &self,
        name: &str,
        size: u64,
        format: &VolumeFormat,
    ) -> Result<VolumeInfo> {
        check_name("volume", name)?;
        check_size(size)?;
        let (cluster_size, extended_l2) = self.config.volume_format(format);
        let reservation = self.reserve(name)?;
        let id = new_id()?;
        let opts = CreateOptions {
            size: Some(size),
            cluster_size,
            extended_l2,
            ..CreateOptions::default()
        };
        self.add_volume(reservation, &id, &opts, None)
    }

    /// Creates volume `new` from snapshot `snapshot` of `volume`: its chain
    /// shares every layer of the snapshot, and its writes go to a new top.
    ///
    /// A delete of the snapshot or its volume that wins the race makes
    /// this 404 (the source is gone), never a failure of the pool's files.
    pub fn clone_snapshot(&self, volume: &str, snapshot: &str, new: &str) -> Result<VolumeInfo> {
        check_name("volume", new)?;
        let source = self.snapshot_rec(volume, snapshot)?;
        self.clone_from(volume, snapshot, new, &source)
            .map_err(|e| match self.snapshot_rec(volume, snapshot) {
                Err(VolumeError::NotFound(_)) if !matches!(e, VolumeError::Conflict(_)) => {
                    tracing::debug!("clone of {volume}@{snapshot} lost a race with a delete: {e}");
                    VolumeError::NotFound(format!(
                        "snapshot '{volume}@{snapshot}' was deleted while the clone was being \
                         made; nothing was created"
                    ))
                }
                _ => e,
            })
    }

    /// [`Service::clone_snapshot`] once the source is found.
    fn clone_from(
        &self,
        volume: &str,
        snapshot: &str,
        new: &str,
        source: &SnapshotRec,
    ) -> Result<VolumeInfo> {
        let key = snapshot_key(volume, snapshot);
        // The clone opens the snapshot's files: they must hold everything.
        if let Some(origin) = self.live_volume(volume) {
            origin.sync_frozen()?;
        }
        // The clone writes in the format of the layers it shares, as a
        // snapshot's new top does.
        let shared =
            strata_disk::info::info(&self.layer_path(&source.layer), Some(Format::Qcow2), false)?;
        let extended_l2 = shared
            .format_specific
            .as_ref()
            .is_some_and(|q| q.extended_l2);
        let reservation = self.reserve(new)?;
        let id = new_id()?;
        let _topology = self.topology.lock();
        let opts = CreateOptions {
            size: Some(source.size),
            backing: Some(layer_file(&source.layer)),
            backing_format: Some(Format::Qcow2),
            cluster_size: shared.cluster_size.unwrap_or(self.config.cluster_size),
            extended_l2,
            ..CreateOptions::default()
        };
        self.add_volume(reservation, &id, &opts, Some((key, source.layer.clone())))
    }

    /// Creates the top layer file, commits the volume, opens and exports it.
    fn add_volume(
        &self,
        reservation: NameReservation<'_>,
        id: &str,
        opts: &CreateOptions,
        origin: Option<(String, String)>,
    ) -> Result<VolumeInfo> {
        let name = reservation.name.clone();
        let path = self.layer_path(id);
        if let Err(e) = create(&path, opts) {
            // A file system that filled up midway leaves part of a file.
            remove_unused_layer(&path);
            return Err(e.into());
        }
        let size = opts.size.unwrap_or(0);
        failpoint("create-before-commit");
        let committed = self.catalog.update(|t| {
            if let Some((key, _)) = &origin {
                // The snapshot may have gone while the file was made.
                if !t.state().snapshots.contains_key(key) {
                    return Err(VolumeError::NotFound(format!(
                        "snapshot '{key}' does not exist"
                    )));
                }
            }
            t.put_layer(LayerRec {
                id: id.to_string(),
                parent: origin.as_ref().map(|(_, layer)| layer.clone()),
                size,
            })?;
            t.put_volume(VolumeRec {
                name: name.clone(),
                size,
                top: id.to_string(),
                origin: origin.as_ref().map(|(key, _)| key.clone()),
                created: now(),
            })
        });
        if let Err(e) = committed {
            remove_unused_layer(&path);
            return Err(e);
        }
        failpoint("create-after-commit");
        let disk = self.open_disk(&path)?;
        let live = Arc::new(Live {
            volume: Arc::new(Volume::new(&name, disk)),
            changes: Mutex::new(()),
            standby: Mutex::new(None),
        });
        self.export(&name, &live)?;
        // A delete that comes in now waits for the answer to be made, so
        // the create reports the volume it made.
        let changes = live.changes.lock();
        self.registry.lock().live.insert(name.clone(), live.clone());
        drop(reservation);
        let info = self.volume_info(&name);
        drop(changes);
        info
    }

    /// Every volume, by name.
    pub fn list_volumes(&self) -> Vec<VolumeInfo> {
        let state = self.catalog.state();
        state
            .volumes
            .values()
            .map(|v| self.describe(&state, v))
            .collect()
    }

    /// One volume.
    pub fn volume_info(&self, name: &str) -> Result<VolumeInfo> {
        let state = self.catalog.state();
        let v = state.volumes.get(name).ok_or_else(|| not_found(name))?;
        Ok(self.describe(&state, v))
    }

    /// Records where the NBD server listens (`nbd://HOST:PORT` or
    /// `nbds://HOST:PORT`), so volume descriptions carry their URI. Only
    /// the first call counts: the server binds once.
    pub fn set_nbd_base(&self, base: String) {
        let _ = self.nbd_base.set(base);
    }

    fn describe(&self, state: &State, v: &VolumeRec) -> VolumeInfo {
        let live = self.registry.lock().live.get(&v.name).cloned();
        let format = live.as_ref().map(|l| l.volume.top_format());
        VolumeInfo {
            name: v.name.clone(),
            size: v.size,
            chain_length: state.chain(&v.top).len(),
            top_layer: v.top.clone(),
            standby_layer: live
                .as_ref()
                .and_then(|l| l.standby.lock().as_ref().map(|s| s.id.clone())),
            origin: v.origin.clone(),
            snapshots: state
                .snapshots_of(&v.name)
                .into_iter()
                .map(|s| s.name)
                .collect(),
            created: v.created,
            last_pause_ms: live.and_then(|l| l.volume.stats().last_pause()).map(ms),
            reclaimable_layers: compact::compaction_runs(state, &v.top)
                .iter()
                .map(|run| run.len() - 1)
                .sum(),
            cluster_size: format.and_then(|f| f.0),
            extended_l2: format.is_some_and(|f| f.1),
            nbd_uri: self.nbd_base.get().map(|base| format!("{base}/{}", v.name)),
        }
    }

    /// Deletes a volume and its snapshots. Layers that clones still read
    /// are kept; the others are removed after the catalog commit.
    pub fn delete_volume(&self, name: &str) -> Result<DeleteReport> {
        let live = self.live(name)?;
        let _changes = live.changes.lock();
        self.exports.remove(name);
        let top = self
            .catalog
            .state()
            .volumes
            .get(name)
            .map(|v| v.top.clone())
            .ok_or_else(|| not_found(name))?;
        let (dead, kept) = self.catalog.update(|t| {
            let chain = t.state().volumes.get(name).map(|v| t.state().chain(&v.top));
            t.remove_volume(name)?;
            for s in t.state().snapshots_of(name) {
                t.remove_snapshot(&s.key())?;
            }
            let dead = t.collect_garbage()?;
            let kept = chain
                .unwrap_or_default()
                .iter()
                .filter(|id| !dead.contains(id))
                .count();
            Ok((dead, kept))
        })?;
        self.registry.lock().live.remove(name);
        // Its file is not in the catalog: dropping it removes it.
        live.standby.lock().take();
        drop(_changes);
        // Close the disk before its files go; a client still connected
        // keeps it open until it disconnects.
        if let Ok(live) = Arc::try_unwrap(live) {
            if let Ok(volume) = Arc::try_unwrap(live.volume) {
                // Writes about to be removed need no sync (a volume's
                // unsynced layers are its own: a clone syncs what it uses).
                let dead_path = |p: &PathBuf| dead.iter().any(|id| self.layer_path(id) == *p);
                let top_dead = dead.contains(&top);
                if top_dead && volume.frozen_paths().iter().all(dead_path) {
                    volume.close_discarding();
                } else {
                    volume.close()?;
                }
            }
        }
        failpoint("delete-after-commit");
        self.unlink_layers(&dead);
        Ok(DeleteReport {
            deleted: name.to_string(),
            layers_removed: dead.len(),
            layers_kept: kept,
        })
    }

    /// Removes layer files after the catalog no longer names them.
    pub(crate) fn unlink_layers(&self, ids: &[String]) {
        for id in ids {
            if let Err(e) = self.trash.discard(&self.layer_path(id)) {
                // Harmless: the next startup removes it as an orphan.
                tracing::warn!("could not remove layer {id}: {e}");
            }
        }
        sync_dir(&pool::layers(&self.config.pool));
    }

    fn snapshot_rec(&self, volume: &str, snapshot: &str) -> Result<SnapshotRec> {
        let state = self.catalog.state();
        if !state.volumes.contains_key(volume) {
            return Err(not_found(volume));
        }
        state
            .snapshots
            .get(&snapshot_key(volume, snapshot))
            .cloned()
            .ok_or_else(|| {
                VolumeError::NotFound(format!(
                    "volume '{volume}' has no snapshot '{snapshot}'; list them with \
                     `strata snapshot list {volume}`"
                ))
            })
    }

    /// Takes a snapshot of a volume while it serves I/O. Writes completed
    /// before the call are in the snapshot; writes after it returns are not.
    ///
    /// Durability follows the volume's: the pause only freezes the old top,
    /// and its writes become durable with the client's next flush (which
    /// covers every write acknowledged before it, wherever it lives), or
    /// when the daemon syncs layers frozen longer than
    /// [`ServiceConfig::durable_within`]. With `sync` (or a zero
    /// `durable_within`) the call makes the layer durable before it
    /// returns, after the pause, while I/O goes on.
    pub fn create_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
        sync: bool,
    ) -> Result<SnapshotReport> {
        check_name("snapshot", snapshot)?;
        let started = Instant::now();
        let live = self.live(volume)?;
        let _changes = live.changes.lock();
        let key = snapshot_key(volume, snapshot);
        let state = self.catalog.state();
        if state.snapshots.contains_key(&key) {
            return Err(VolumeError::Conflict(format!(
                "volume '{volume}' already has a snapshot '{snapshot}'"
            )));
        }
        let v = state
            .volumes
            .get(volume)
            .cloned()
            .ok_or_else(|| not_found(volume))?;
        let rec = SnapshotRec {
            volume: volume.to_string(),
            name: snapshot.to_string(),
            layer: v.top.clone(),
            size: v.size,
            created: now(),
        };
        let pause = self.switch_top(&live, &v, None, true, |t| t.put_snapshot(rec.clone()))?;
        let synced = Instant::now();
        let durable = sync || self.config.durable_within.is_zero();
        if durable {
            live.volume.sync_frozen()?;
        }
        Ok(SnapshotReport {
            snapshot: self.snapshot_info(&self.catalog.state(), &rec),
            pause_ms: ms(pause),
            total_ms: ms(started.elapsed()),
            durable,
            sync_ms: if durable { ms(synced.elapsed()) } else { 0.0 },
        })
    }

    /// Grows a volume. Connected NBD clients see the new size when they
    /// reconnect. Shrinking is refused.
    pub fn resize_volume(&self, name: &str, size: u64) -> Result<ResizeReport> {
        check_size(size)?;
        let live = self.live(name)?;
        let _changes = live.changes.lock();
        let v = self
            .catalog
            .state()
            .volumes
            .get(name)
            .cloned()
            .ok_or_else(|| not_found(name))?;
        if size < v.size {
            return Err(VolumeError::Invalid(format!(
                "cannot shrink volume '{name}' from {} to {size} bytes: only growing is supported",
                v.size
            )));
        }
        let mut pause = Duration::ZERO;
        if size > v.size {
            pause = self.switch_top(&live, &v, Some(size), false, |_| Ok(()))?;
            self.export(name, &live)?;
        }
        Ok(ResizeReport {
            name: name.to_string(),
            old_size: v.size,
            size,
            pause_ms: ms(pause),
        })
    }

    /// Pushes a new layer as the top of a live volume and commits it
    /// (with `extra` changes) inside the I/O pause: the volume's standby
    /// top when it has one that fits, else a new one. Returns the pause.
    fn switch_top(
        &self,
        live: &Live,
        v: &VolumeRec,
        size: Option<u64>,
        snapshot: bool,
        extra: impl FnOnce(&mut Txn) -> Result<()>,
    ) -> Result<Duration> {
        let (id, ready) = match self.take_standby(live, size) {
            Some(s) => (s.id, Some(s.top)),
            None => (new_id()?, None),
        };
        let id = id.as_str();
        let new_size = size.unwrap_or(v.size);
        let mut failed: Option<VolumeError> = None;
        let mut committed_ok = false;
        let commit = || {
            failpoint("switch-before-commit");
            let committed = self
                .catalog
                .update(|t| {
                    extra(t)?;
                    t.put_layer(LayerRec {
                        id: id.to_string(),
                        parent: Some(v.top.clone()),
                        size: new_size,
                    })?;
                    t.put_volume(VolumeRec {
                        top: id.to_string(),
                        size: new_size,
                        ..v.clone()
                    })
                })
                .map_err(|e| {
                    let msg = e.to_string();
                    failed = Some(e);
                    DiskError::Invalid(msg)
                });
            committed_ok = committed.is_ok();
            failpoint("switch-after-commit");
            committed
        };
        let result = live.volume.push_top(
            &self.layer_path(id),
            &layer_file(&v.top),
            size,
            snapshot,
            ready,
            commit,
        );
        // The standby was used or dropped, and the new top copies its index
        // from below: have the keeper do both now.
        self.keeper.kick();
        if result.is_err() && !committed_ok {
            // The catalog does not name the new file: it must not stay
            // behind (the file system may have filled up while it was made).
            remove_unused_layer(&self.layer_path(id));
        }
        match (result, failed) {
            (Ok(pause), _) => Ok(pause),
            (Err(_), Some(e)) => Err(e),
            (Err(e), None) => Err(e.into()),
        }
    }

    /// Snapshots of a volume, oldest first.
    pub fn list_snapshots(&self, volume: &str) -> Result<Vec<SnapshotInfo>> {
        let state = self.catalog.state();
        if !state.volumes.contains_key(volume) {
            return Err(not_found(volume));
        }
        Ok(state
            .snapshots_of(volume)
            .iter()
            .map(|s| self.snapshot_info(&state, s))
            .collect())
    }

    fn snapshot_info(&self, state: &State, s: &SnapshotRec) -> SnapshotInfo {
        SnapshotInfo {
            volume: s.volume.clone(),
            name: s.name.clone(),
            layer: s.layer.clone(),
            size: s.size,
            created: s.created,
            clones: state.clones_of(&s.key()),
        }
    }

    /// Deletes a snapshot. Refused while a clone was made from it. Its
    /// layer stays as long as newer layers of the volume read it.
    pub fn delete_snapshot(&self, volume: &str, snapshot: &str) -> Result<DeleteReport> {
        let live = self.live(volume)?;
        let _changes = live.changes.lock();
        self.snapshot_rec(volume, snapshot)?;
        let key = snapshot_key(volume, snapshot);
        let (dead, kept) = self.catalog.update(|t| {
            let clones = t.state().clones_of(&key);
            if !clones.is_empty() {
                return Err(VolumeError::Conflict(format!(
                    "snapshot '{key}' is in use by clone(s) {}; delete them first",
                    clones.join(", ")
                )));
            }
            t.remove_snapshot(&key)?;
            let dead = t.collect_garbage()?;
            Ok((dead.clone(), usize::from(dead.is_empty())))
        })?;
        failpoint("delete-after-commit");
        self.unlink_layers(&dead);
        Ok(DeleteReport {
            deleted: key,
            layers_removed: dead.len(),
            layers_kept: kept,
        })
    }

    /// The pool's summary.
    pub fn pool_info(&self) -> PoolInfo {
        let state = self.catalog.state();
        PoolInfo {
            pool: self.config.pool.clone(),
            volumes: state.volumes.len(),
            snapshots: state.snapshots.len(),
            layers: state.layers.len(),
            trash_pending: self.trash.pending(),
            problems: self.problems.clone(),
        }
    }

    /// Every volume's metrics in the Prometheus text format.
    pub fn metrics(&self) -> String {
        let mut lives: Vec<Arc<Live>> = self.registry.lock().live.values().cloned().collect();
        lives.sort_by(|a, b| a.volume.name().cmp(b.volume.name()));
        let rows: Vec<_> = lives
            .iter()
            .map(|l| (l.volume.gauges(), l.volume.stats()))
            .collect();
        metrics::render(&rows)
    }

    /// Closes every volume (stores indexes, marks tops clean). Call after
    /// the NBD server has stopped.
    pub fn close(self) -> Result<()> {
        self.stop_compactions();
        self.stop_standby_keeper();
        let lives: Vec<Arc<Live>> = self.registry.lock().live.drain().map(|(_, l)| l).collect();
        let mut first_error = None;
        for live in lives {
            self.exports.remove(live.volume.name());
            let volume = match Arc::try_unwrap(live) {
                Ok(l) => Arc::try_unwrap(l.volume).ok(),
                Err(_) => None,
            };
            if let Some(v) = volume {
                if let Err(e) = v.close() {
                    first_error.get_or_insert(VolumeError::from(e));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Keeps a name out of use while its volume is being created.
struct NameReservation<'a> {
    service: &'a Service,
    name: String,
}

impl Drop for NameReservation<'_> {
    fn drop(&mut self) {
        self.service.registry.lock().reserved.remove(&self.name);
    }
}

pub(crate) fn not_found(volume: &str) -> VolumeError {
    VolumeError::NotFound(format!(
        "no volume named '{volume}'; list volumes with `strata volume list`"
    ))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Removes a layer file a failed change made and the catalog does not
/// name (if it was made at all); startup removes it if this fails.
fn remove_unused_layer(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("could not remove unused layer file {}: {e}", path.display()),
    }
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Repairs layers a crash left marked dirty: snapshots' layers frozen but
/// not yet durable when the daemon died. Volume tops are left to their
/// writer, which repairs its own file when it opens it.
fn repair_frozen_layers(dir: &Path, state: &State, report: &mut RecoveryReport) {
    let tops: std::collections::HashSet<&str> =
        state.volumes.values().map(|v| v.top.as_str()).collect();
    for id in state.layers.keys() {
        if tops.contains(id.as_str()) {
            continue;
        }
        let path = dir.join(layer_file(id));
        if !path.exists() {
            continue; // reported when its volume is opened
        }
        match strata_disk::check::repair_dirty(&path) {
            Ok(true) => report.repaired.push(layer_file(id)),
            Ok(false) => {}
            Err(e) => report.problems.push(format!(
                "layer {} was left dirty and not repaired: {e}",
                path.display()
            )),
        }
    }
}

/// Whether `name` is a file name this pool gives layers (32 hex digits and
/// `.qcow2`): only those are ever removed as orphans.
fn is_layer_file(name: &str) -> Option<&str> {
    let id = name.strip_suffix(".qcow2")?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// Removes layer files the catalog does not name; returns their names.
fn remove_orphans(dir: &Path, state: &State, trash: &Trash) -> Result<Vec<String>> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| VolumeError::Io(format!("cannot list {}: {e}", dir.display())))?;
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(id) = is_layer_file(&name) else {
            continue;
        };
        if !state.layers.contains_key(id) {
            trash.discard(&entry.path()).map_err(|e| {
                VolumeError::Io(format!(
                    "cannot remove orphan layer {}: {e}",
                    entry.path().display()
                ))
            })?;
            removed.push(name);
        }
    }
    if !removed.is_empty() {
        sync_dir(dir);
    }
    removed.sort();
    Ok(removed)
}

/// Makes every layer file name the parent the catalog records. A
/// compaction commits the new parent before it rewrites the file, so after
/// a crash between the two the file still names a layer that the merged
/// one replaced (and holds the same bytes as). Returns the files changed.
fn rebase_to_catalog(dir: &Path, state: &State) -> Result<Vec<String>> {
    let mut rebased = Vec::new();
    for layer in state.layers.values() {
        let Some(parent) = &layer.parent else {
            continue;
        };
        let path = dir.join(layer_file(&layer.id));
        let want = layer_file(parent);
        match strata_disk::compact::backing_file(&path) {
            Ok(Some(name)) if name == want => {}
            Ok(Some(_)) if dir.join(&want).exists() => {
                strata_disk::set_backing_file(&path, &want)?;
                rebased.push(layer_file(&layer.id));
            }
            // Missing files and other mismatches are reported when the
            // volume is opened.
            _ => {}
        }
    }
    if !rebased.is_empty() {
        sync_dir(dir);
    }
    Ok(rebased)
}

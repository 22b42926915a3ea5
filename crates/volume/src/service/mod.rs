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
mod files;
mod reports;
mod snapshots;
pub mod standby;
mod volumes;

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

use files::{rebase_to_catalog, remove_orphans, remove_unused_layer, repair_frozen_layers};
pub use reports::{
    DeleteReport, PoolInfo, RecoveryReport, ResizeReport, SnapshotInfo, SnapshotReport,
    VolumeFormat, VolumeInfo,
};

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

    /// [`Service::open_disk`] for a top just created and synced clean
    /// (a new volume or clone), which nothing else has open.
    fn open_created_disk(&self, top: &Path) -> Result<Disk> {
        let disk = Disk::open_created(top, &self.open_options())?;
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

    /// Records where the NBD server listens (`nbd://HOST:PORT` or
    /// `nbds://HOST:PORT`), so volume descriptions carry their URI. Only
    /// the first call counts: the server binds once.
    pub fn set_nbd_base(&self, base: String) {
        let _ = self.nbd_base.set(base);
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
        let mut text = metrics::render(&rows);
        metrics::render_catalog(&mut text, self.catalog.syncs());
        text
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

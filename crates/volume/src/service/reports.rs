//! What the service answers: volumes, snapshots, the pool, and the
//! reports of its changes and of its recovery at startup.

use super::*;

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

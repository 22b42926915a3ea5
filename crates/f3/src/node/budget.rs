//! The node's local tier under a quota (`strata node --quota BYTES`):
//! what its directories hold, which entries were used least recently,
//! and how room is made when a write would pass the quota or the disk
//! is full.
//!
//! Room is made in this order, least recently used first, so that no
//! byte is lost:
//! 1. copies of other nodes' ephemeral files and local copies of durable
//!    files (both can be fetched again) that no open handle reads;
//! 2. ephemeral files held here that nobody has open: **spilled** to the
//!    durable tier (persisted, as `strata f3 persist` does), then their
//!    local copy dropped. A node without a durable tier spills nothing.
//!
//! A write that still does not fit gets ENOSPC. The thesis leaves a full
//! local disk to the function; here it costs the least recently used
//! data a trip to the store instead.
//!
//! The usage is measured from the directories (file lengths) at start
//! and when a write would pass the quota, and counted between measures
//! from what was added (writes past a file's end, copies arriving, local
//! copies downloaded), so a write costs no directory scan. Removals are
//! not counted: the count may be high, never low, and a measure puts it
//! right before anything is evicted.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::handles::Handle;
use super::Shared;

/// What a node's local tier holds, by kind, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Ephemeral files held here (the only copy of their content).
    pub ephemeral: u64,
    /// Copies of other nodes' ephemeral files.
    pub copies: u64,
    /// Local copies of durable files.
    pub cache: u64,
    /// Durable files being written here.
    pub staging: u64,
}

impl Usage {
    /// Every byte of the tier.
    pub fn total(&self) -> u64 {
        self.ephemeral + self.copies + self.cache + self.staging
    }
}

/// Counters of the room made (and the bytes served), for `/metrics`.
#[derive(Debug, Default)]
pub struct BudgetCounters {
    /// Copies and local copies dropped to make room.
    pub evictions: AtomicU64,
    /// Their bytes.
    pub evicted_bytes: AtomicU64,
    /// Ephemeral files spilled to the durable tier.
    pub spills: AtomicU64,
    /// Their bytes.
    pub spilled_bytes: AtomicU64,
    /// Writes refused with ENOSPC.
    pub refusals: AtomicU64,
    /// Bytes of held files this node's transfer service sent to other
    /// nodes: the network traffic F3's locality placement saves.
    pub served_bytes: AtomicU64,
}

/// The local tier's quota and recency.
#[derive(Debug)]
pub struct Budget {
    /// The quota in bytes, if any.
    pub quota: Option<u64>,
    /// Usage at the last measure.
    measured: AtomicU64,
    /// Bytes added since (writes, copies arriving, local copies
    /// downloaded), shared with the copies' fetchers.
    grown: Arc<AtomicU64>,
    /// Each path's last use, as a tick of `clock`.
    recency: Mutex<HashMap<String, u64>>,
    clock: AtomicU64,
    /// One room-maker at a time: two would spill the same file.
    making_room: Mutex<()>,
    /// Room made so far.
    pub counters: BudgetCounters,
}

/// Why a write did not fit.
#[derive(Debug, PartialEq, Eq)]
pub struct NoRoom {
    /// Bytes the write needed.
    pub needed: u64,
    /// Bytes the tier holds after making what room it could.
    pub used: u64,
}

/// Most paths whose recency is remembered; past it the oldest half is
/// forgotten (they count as least recently used).
const MAX_RECENCY: usize = 100_000;

impl Budget {
    /// A budget of `quota` bytes (none: only a full disk limits).
    pub fn new(quota: Option<u64>) -> Budget {
        Budget {
            quota,
            measured: AtomicU64::new(0),
            grown: Arc::new(AtomicU64::new(0)),
            recency: Mutex::new(HashMap::new()),
            clock: AtomicU64::new(0),
            making_room: Mutex::new(()),
            counters: BudgetCounters::default(),
        }
    }

    /// Records a use of `path` (an open, a read, a write).
    pub fn touch(&self, path: &str) {
        let tick = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut recency = self.recency.lock();
        if recency.len() >= MAX_RECENCY && !recency.contains_key(path) {
            let mut ticks: Vec<u64> = recency.values().copied().collect();
            ticks.sort_unstable();
            let cut = ticks[ticks.len() / 2];
            recency.retain(|_, t| *t > cut);
        }
        recency.insert(path.to_string(), tick);
    }

    fn last_use(&self, path: &str) -> u64 {
        self.recency.lock().get(path).copied().unwrap_or(0)
    }

    /// Lets a write grow the tier by `growth` bytes: at once when it fits
    /// under the quota, else after making room; `NoRoom` when even then
    /// it would not fit.
    pub fn admit(&self, shared: &Shared, growth: u64) -> Result<(), NoRoom> {
        let Some(quota) = self.quota else {
            return Ok(());
        };
        if growth == 0 {
            return Ok(());
        }
        let before = self.grown.fetch_add(growth, Ordering::Relaxed);
        if self.measured.load(Ordering::Relaxed) + before + growth <= quota {
            return Ok(());
        }
        self.grown.fetch_sub(growth, Ordering::Relaxed);
        let used = self.make_room(shared, growth, quota);
        if used + growth <= quota {
            self.grown.fetch_add(growth, Ordering::Relaxed);
            return Ok(());
        }
        self.counters.refusals.fetch_add(1, Ordering::Relaxed);
        Err(NoRoom {
            needed: growth,
            used,
        })
    }

    /// Makes room after the disk itself refused a write of `needed`
    /// bytes (ENOSPC); whether any was made.
    pub fn disk_full(&self, shared: &Shared, needed: u64) -> bool {
        // Room for `needed` more within what the disk held when it was full.
        let before = measure(shared).total();
        self.make_room(shared, needed, before) < before
    }

    /// Frees bytes, least recently used first, until `growth` more fit
    /// under `limit` or nothing more can go; the usage measured after.
    fn make_room(&self, shared: &Shared, growth: u64, limit: u64) -> u64 {
        let _one = self.making_room.lock();
        let mut used = self.remeasure(shared);
        if used + growth <= limit {
            return used;
        }
        for victim in self.victims(shared) {
            if used + growth <= limit {
                break;
            }
            let path = victim.path.as_str();
            let freed = match victim.kind {
                VictimKind::Copy => shared.copies.evict_idle(path),
                VictimKind::Cache => evict_cache(shared, path),
                VictimKind::Held => self.spill(shared, path),
            };
            if let (Some(bytes), true) = (freed, victim.kind != VictimKind::Held) {
                self.evicted(bytes);
            }
            if let Some(bytes) = freed {
                used = used.saturating_sub(bytes);
            }
        }
        self.remeasure(shared)
    }

    /// Measures the directories again; the usage.
    pub fn remeasure(&self, shared: &Shared) -> u64 {
        self.grown.store(0, Ordering::Relaxed);
        let used = measure(shared).total();
        self.measured.store(used, Ordering::Relaxed);
        used
    }

    /// Counts `bytes` added to the tier outside a write (a local copy
    /// downloaded).
    pub fn grew(&self, bytes: u64) {
        self.grown.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The counter a copy's fetcher adds its bytes to.
    pub fn growth_counter(&self) -> Arc<AtomicU64> {
        self.grown.clone()
    }

    /// What may go, in the order it goes: copies and local copies (least
    /// recently used first), then held ephemeral files nobody has open
    /// (least recently used first) when there is a durable tier.
    fn victims(&self, shared: &Shared) -> Vec<Victim> {
        let victim = |kind, path: String| Victim {
            kind,
            used: self.last_use(&path),
            path,
        };
        let cached: Vec<String> = shared.cached.lock().keys().cloned().collect();
        let mut refetchable: Vec<Victim> = shared
            .copies
            .idle()
            .into_iter()
            .map(|path| victim(VictimKind::Copy, path))
            .chain(
                cached
                    .into_iter()
                    .map(|path| victim(VictimKind::Cache, path)),
            )
            .collect();
        refetchable.sort_by_key(|v| v.used);
        let mut held: Vec<Victim> = Vec::new();
        if shared.durable.is_some() {
            held = shared
                .local
                .idle()
                .into_iter()
                .map(|path| victim(VictimKind::Held, path))
                .collect();
            held.sort_by_key(|v| v.used);
        }
        refetchable.into_iter().chain(held).collect()
    }

    /// Persists held file `path` to the durable tier and drops its local
    /// copy; the bytes freed, or `None` if it could not be spilled.
    fn spill(&self, shared: &Shared, path: &str) -> Option<u64> {
        let bytes = file_length(&shared.local.content_path(path));
        match super::persist::persist_file(shared, path) {
            Ok(_) => {
                // persist_file kept the content as the durable file's
                // local copy: drop it, or nothing was freed.
                evict_cache(shared, path);
                self.counters.spills.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .spilled_bytes
                    .fetch_add(bytes, Ordering::Relaxed);
                tracing::info!(
                    "node {}: spilled {path} ({bytes} bytes) to the durable tier to make room",
                    shared.name
                );
                Some(bytes)
            }
            Err(e) => {
                tracing::warn!("node {}: spilling {path}: {e}", shared.name);
                None
            }
        }
    }

    /// Counts an eviction of `bytes`.
    pub fn evicted(&self, bytes: u64) {
        self.counters.evictions.fetch_add(1, Ordering::Relaxed);
        self.counters
            .evicted_bytes
            .fetch_add(bytes, Ordering::Relaxed);
    }
}

/// An entry that may go to make room.
struct Victim {
    kind: VictimKind,
    path: String,
    /// Its last use, a tick of the budget's clock.
    used: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum VictimKind {
    /// A copy of another node's ephemeral file.
    Copy,
    /// A local copy of a durable file.
    Cache,
    /// An ephemeral file held here.
    Held,
}

/// Drops the local copy of durable file `path`; the bytes freed.
fn evict_cache(shared: &Shared, path: &str) -> Option<u64> {
    let bytes = shared.drop_cached(path)?;
    // The service ranks nodes by what they hold: this one holds none now.
    let _ = shared.service.report(
        &shared.name,
        vec![crate::protocol::HeldFile {
            path: path.to_string(),
            bytes: 0,
        }],
    );
    Some(bytes)
}

fn file_length(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The bytes each of the node's directories holds.
pub fn measure(shared: &Shared) -> Usage {
    Usage {
        ephemeral: directory_bytes(shared.local.directory()),
        // A copy by range is a sparse file: count the bytes that arrived.
        copies: directory_allocated_bytes(shared.copies.directory()),
        cache: directory_bytes(&shared.cache_dir),
        staging: directory_bytes(&shared.staging_dir),
    }
}

/// The bytes a directory's files take on disk, at most their lengths
/// (holes, such as the chunks a copy by range has not fetched, count
/// nothing).
fn directory_allocated_bytes(directory: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(directory) else {
        return 0;
    };
    entries
        .filter_map(|entry| entry.ok()?.metadata().ok())
        .filter(|metadata| metadata.is_file())
        .map(|metadata| metadata.len().min(metadata.blocks().saturating_mul(512)))
        .sum()
}

fn directory_bytes(directory: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return 0;
    };
    entries
        .filter_map(|entry| entry.ok()?.metadata().ok())
        .filter(|metadata| metadata.is_file())
        .map(|metadata| metadata.len())
        .sum()
}

/// Admits a write of `length` bytes at `offset` through `handle`: the
/// bytes it adds past the file's end count against the quota. ENOSPC
/// (with a warning naming the quota) when no room can be made.
pub fn admit_write(
    shared: &Shared,
    handle: &Handle,
    offset: u64,
    length: usize,
) -> Result<(), fuser::Errno> {
    let (path, size) = match handle {
        Handle::Local { file, .. } => (file.path.as_str(), file.snapshot().0),
        Handle::Durable { path, file, .. } => {
            (path.as_str(), file.metadata().map(|m| m.len()).unwrap_or(0))
        }
        Handle::Remote { .. } => return Ok(()),
    };
    let growth = (offset + length as u64).saturating_sub(size);
    shared.budget.admit(shared, growth).map_err(|no_room| {
        tracing::warn!(
            "node {}: a write of {path} needs {} more bytes, and the local tier holds {} of \
             its quota of {} after evicting copies and spilling idle files: ENOSPC (raise \
             --quota, persist or remove files)",
            shared.name,
            no_room.needed,
            no_room.used,
            shared.budget.quota.unwrap_or(0)
        );
        fuser::Errno::ENOSPC
    })
}

/// The agent's `/metrics`, in Prometheus' text format: what its local
/// tier holds by kind, its quota, and the room made.
pub fn exposition(shared: &Shared) -> String {
    use std::fmt::Write;
    let usage = measure(shared);
    let counters = &shared.budget.counters;
    let node = &shared.name;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP strata_f3_local_bytes Bytes the node's local tier holds, by kind.\n\
         # TYPE strata_f3_local_bytes gauge"
    );
    for (kind, bytes) in [
        ("ephemeral", usage.ephemeral),
        ("copies", usage.copies),
        ("cache", usage.cache),
        ("staging", usage.staging),
    ] {
        let _ = writeln!(
            out,
            "strata_f3_local_bytes{{node=\"{node}\",kind=\"{kind}\"}} {bytes}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP strata_f3_quota_bytes The local tier's quota (0: none).\n\
         # TYPE strata_f3_quota_bytes gauge\n\
         strata_f3_quota_bytes{{node=\"{node}\"}} {}",
        shared.budget.quota.unwrap_or(0)
    );
    for (name, help, counter) in [
        (
            "evictions",
            "Copies and local copies evicted to make room.",
            &counters.evictions,
        ),
        (
            "evicted_bytes",
            "Bytes of those evictions.",
            &counters.evicted_bytes,
        ),
        (
            "spills",
            "Ephemeral files spilled to the durable tier to make room.",
            &counters.spills,
        ),
        (
            "spilled_bytes",
            "Bytes of those spills.",
            &counters.spilled_bytes,
        ),
        ("nospace", "Writes refused with ENOSPC.", &counters.refusals),
        (
            "served_bytes",
            "Bytes of held files sent to other nodes.",
            &counters.served_bytes,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP strata_f3_{name}_total {help}\n# TYPE strata_f3_{name}_total counter\n\
             strata_f3_{name}_total{{node=\"{node}\"}} {}",
            counter.load(Ordering::Relaxed)
        );
    }
    out
}

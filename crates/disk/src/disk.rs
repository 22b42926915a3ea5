//! An open disk: a chain of layers read and written as one virtual disk.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
/// Allocation state of a run of guest bytes (from the block-device contract).
pub use strata_block::BlockStatus;
use strata_format::index::{LayerIdentity, MAX_CHAIN_DEPTH};
use strata_format::L2Mapping;

use crate::cache::{CacheStats, Slot, PAGE_UNITS};
use crate::chain::Chain;
use crate::chain_index::store_index_crc;
pub use crate::chain_index::IndexState;
use crate::error::{DiskError, Result};
use crate::header::seal_layer;
use crate::layer::{Format, Layer};
use crate::lock::LockMode;
use crate::write_times::{WriteCounters, WriteTimes};
use crate::writer::Writer;
use crate::DEFAULT_CACHE_BYTES;

/// How to open a disk.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Open the top layer for writing.
    pub writable: bool,
    /// Bound of the metadata cache in bytes.
    pub cache_bytes: u64,
    /// Format of the top layer; probed when `None`.
    pub format: Option<Format>,
    /// Ignore any stored chain index and walk the chain (for testing and
    /// for comparing the two lookup paths).
    pub ignore_index: bool,
    /// Read the chain even while other processes write it (qemu-img's
    /// `-U`): take locks that refuse nobody. Read-only opens only; what
    /// such a reader sees may be inconsistent.
    pub force_share: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            writable: false,
            cache_bytes: DEFAULT_CACHE_BYTES,
            format: None,
            ignore_index: false,
            force_share: false,
        }
    }
}

impl OpenOptions {
    /// Read-only defaults.
    pub fn read_only() -> Self {
        Self::default()
    }

    /// Read-write defaults.
    pub fn read_write() -> Self {
        OpenOptions {
            writable: true,
            ..Self::default()
        }
    }
}

/// An open disk.
pub struct Disk {
    /// The layers and what lookups and the writer share about them.
    pub(crate) chain: Chain,
    pub(crate) writer: Option<Mutex<Writer>>,
    /// Signalled whenever an allocating write publishes or gives up its
    /// cluster, waking writes that wait for the same cluster.
    pub(crate) alloc_done: parking_lot::Condvar,
    /// Former tops a push froze without making them durable, oldest first
    /// (see [`Disk::sync_frozen`]).
    pub(crate) frozen: Mutex<Vec<Frozen>>,
    /// Held while frozen layers are sealed (the list's own lock is held
    /// only briefly, so gauges never wait for a sync).
    pub(crate) sealing: Mutex<()>,
    /// Drop a frozen layer's pages from the page cache once it is sealed
    /// (see [`Disk::set_drop_sealed_cache`]).
    pub(crate) drop_sealed_cache: AtomicBool,
    /// Guest writes by kind, and their times.
    pub(crate) write_counters: WriteCounters,
}

/// A layer frozen by a push whose writes are not yet durable.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frozen {
    /// 0-based position in the chain (never the top).
    pub(crate) position: usize,
    /// When it was frozen.
    pub(crate) since: Instant,
    /// Its index checksum is computed when it is sealed, not when frozen
    /// (the region is final from the freeze on; reading it back inside a
    /// push's pause would cost milliseconds per GiB of disk).
    pub(crate) crc_pending: bool,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk")
            .field("top", &self.top().path())
            .field("layers", &self.chain.layers.len())
            .field("size", &self.chain.size)
            .finish()
    }
}

impl Disk {
    /// Opens the image at `path` and its whole backing chain.
    pub fn open(path: impl AsRef<Path>, opts: &OpenOptions) -> Result<Disk> {
        Disk::open_inner(path.as_ref(), opts, false)
    }

    /// [`Disk::open`] for writing a chain whose top its caller has just
    /// created, synced clean, and opens first (a new volume or clone):
    /// the dirty bit reaches the disk with the next sync instead of a sync
    /// of its own, as on the new top of a snapshot (see
    /// `Writer::start_on_new_top`). Until then the file on disk is the
    /// clean new top, so a crash loses nothing that was acknowledged. One
    /// sync fewer per create (a new top with no chain index yet still
    /// syncs the index it builds, and the dirty bit with it).
    pub fn open_created(path: impl AsRef<Path>, opts: &OpenOptions) -> Result<Disk> {
        Disk::open_inner(path.as_ref(), opts, true)
    }

    fn open_inner(path: &Path, opts: &OpenOptions, created: bool) -> Result<Disk> {
        let mut layers = open_chain(path, opts)?;
        for (i, layer) in layers.iter_mut().enumerate() {
            layer.file.place.depth = i as u32 + 1;
        }
        let mut disk = Disk {
            chain: Chain::new(layers, opts.cache_bytes, opts.ignore_index),
            writer: None,
            alloc_done: parking_lot::Condvar::new(),
            frozen: Mutex::new(Vec::new()),
            sealing: Mutex::new(()),
            drop_sealed_cache: AtomicBool::new(false),
            write_counters: WriteCounters::default(),
        };
        if opts.writable {
            let writer = if created {
                Writer::start_on_new_top(&disk.chain)?
            } else {
                Writer::start(&disk.chain)?
            };
            disk.writer = Some(Mutex::new(writer));
        }
        Ok(disk)
    }

    /// Virtual size in bytes.
    pub fn size(&self) -> u64 {
        self.chain.size
    }

    /// The layers, base first.
    pub fn layers(&self) -> &[Layer] {
        &self.chain.layers
    }

    /// The top layer.
    pub fn top(&self) -> &Layer {
        self.chain.top()
    }

    /// Number of layers.
    pub fn depth(&self) -> u32 {
        self.chain.depth()
    }

    /// Bytes one index unit covers (the chain's smallest cluster size).
    pub fn unit_size(&self) -> u64 {
        1 << self.chain.unit_bits
    }

    /// How lookups find owners.
    pub fn index_state(&self) -> IndexState {
        self.chain.index_state.read().clone()
    }

    /// Bytes of the chain index in use (`None`: lookups walk the chain).
    /// A new top copies this much, which is what makes a snapshot of a
    /// big disk slow to prepare.
    pub fn index_bytes(&self) -> Option<u64> {
        self.chain.index.read().as_ref().map(|ext| ext.region_len)
    }

    /// Guest writes since the disk was opened: how many overwrote in
    /// place and how many allocated, and their times
    /// ([`crate::write_times`]).
    pub fn write_times(&self) -> WriteTimes {
        self.write_counters.read()
    }

    /// Metadata cache statistics.
    pub fn cache_stats(&self) -> CacheStats {
        self.chain.cache.stats()
    }

    /// Whether the disk is open for writing.
    pub fn is_writable(&self) -> bool {
        self.writer.is_some()
    }

    /// Index units of the virtual disk.
    pub(crate) fn units(&self) -> u64 {
        self.chain.units()
    }

    /// Refuses a range that does not lie inside the virtual disk.
    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        self.chain.check_range(offset, len)
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.chain.read_at(buf, offset)
    }

    /// The owner and L2 entry of the unit holding guest offset `pos`.
    pub fn slot_at(&self, pos: u64) -> Result<Slot> {
        self.chain.slot_at(pos)
    }

    /// Owners of units `first..first+count`, for building a new index.
    /// Uses the stored index when valid, else resolves page by page
    /// (without filling the cache).
    pub fn owners(&self, first: u64, count: usize) -> Result<Vec<u16>> {
        self.chain.owners(first, count)
    }

    /// Copies up to `max_sectors` more sectors of a pushed top's index
    /// from the layer below (see [`crate::lazy_index`]), holding the
    /// writer's mutex only for one run at a time, while I/O goes on.
    /// Returns the sectors still to copy (0: the top's index region is
    /// whole).
    pub fn copy_index_rest(&self, max_sectors: u64) -> Result<u64> {
        if self.chain.index_copy_pending() == 0 {
            return Ok(0);
        }
        let writer = self.writer()?;
        self.chain.copy_index_rest(max_sectors, || writer.lock())
    }

    /// Copies every sector of the top's index still to be copied (see
    /// [`Disk::copy_index_rest`]).
    pub fn complete_index_copy(&self) -> Result<()> {
        while self.copy_index_rest(u64::MAX)? > 0 {}
        Ok(())
    }

    /// Index sectors of the top still read from the layer below.
    pub fn index_copy_pending(&self) -> u64 {
        self.chain.index_copy_pending()
    }

    /// Writes `buf` at `offset` into the top layer.
    ///
    /// Overwrites of clusters the top layer already owns outright go
    /// straight to the file without taking the writer lock, so concurrent
    /// requests are not serialized. Allocating writes take the lock only
    /// to allocate and to publish (see [`crate::cow`]).
    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let writer = self.writer()?;
        let end = offset + buf.len() as u64;
        let mut pos = offset;
        while pos < end {
            let (seg_end, host) = match self.in_place_target(pos)? {
                Some(host) => (self.owned_run_end(pos, end)?, Some(host)),
                // An allocating write handles a whole cluster at once, even
                // when the top layer allocates it subcluster by subcluster.
                None => (self.cluster_end(pos, end), None),
            };
            let part = &buf[(pos - offset) as usize..(seg_end - offset) as usize];
            let started = Instant::now();
            let allocated = match host {
                Some(host) => {
                    self.chain.write_guest_data(part, host, pos)?;
                    false
                }
                None => self.write_allocating(writer, part, pos)?,
            };
            self.write_counters.record(allocated, started.elapsed());
            pos = seg_end;
        }
        Ok(())
    }

    fn cluster_end(&self, pos: u64, end: u64) -> u64 {
        let cb = self.top().cluster_bits().unwrap_or(63);
        end.min(((pos >> cb) + 1) << cb)
    }

    /// End of the unit the top layer allocates (cluster, or subcluster
    /// with extended L2 entries) holding `pos`, capped at `end`.
    fn in_place_end(&self, pos: u64, end: u64) -> Result<u64> {
        // A subcluster with extended L2 entries: its neighbours may still
        // belong to lower layers.
        let cb = self.top().unit_bits().unwrap_or(63);
        Ok(end.min(((pos >> cb) + 1) << cb))
    }

    /// Where `pos` lives in the top file if the top layer owns its cluster
    /// outright (data with refcount one), so it can be overwritten in place.
    fn in_place_target(&self, pos: u64) -> Result<Option<u64>> {
        let top = self.top();
        let Some(cb) = top.cluster_bits() else {
            return Ok(Some(pos));
        };
        let slot = self.slot_at(pos)?;
        if u32::from(slot.layer) != self.depth() {
            return Ok(None);
        }
        Ok(match top.decode_at(slot.entry, slot.bitmap, pos)? {
            L2Mapping::Data {
                host_offset,
                copied: true,
            } => Some(host_offset + (pos & ((1 << cb) - 1))),
            _ => None,
        })
    }

    /// How far from `pos` (below `end`) the in-place target stays
    /// contiguous in the top file, so one `pwrite` covers it.
    fn owned_run_end(&self, pos: u64, end: u64) -> Result<u64> {
        let mut seg_end = self.in_place_end(pos, end)?;
        let Some(first) = self.in_place_target(pos)? else {
            return Ok(seg_end);
        };
        while seg_end < end {
            match self.in_place_target(seg_end)? {
                Some(h) if h == first + (seg_end - pos) => {
                    seg_end = self.in_place_end(seg_end, end)?
                }
                _ => break,
            }
        }
        Ok(seg_end)
    }

    /// Tells the disk that `len` bytes at `offset` are no longer needed.
    /// Whole clusters of the top layer are released: without a backing
    /// file they become unallocated, with one they read as zeros (so a
    /// discard never exposes older data). Partial clusters are left as
    /// they are: a discard is advisory.
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check_range(offset, len)?;
        self.writer()?.lock().discard(&self.chain, offset, len)
    }

    /// Makes `len` bytes at `offset` read as zeros.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.check_range(offset, len)?;
        if self.top().extended_l2() && len > 0 {
            // Partial subclusters at either end are written with zeros on
            // the unlocked path, which waits for writes in flight to the
            // same cluster; whole subclusters only get their zero bit.
            let ss = 1u64 << self.top().subcluster_bits();
            let end = offset + len;
            let head_end = offset.div_ceil(ss).saturating_mul(ss).min(end);
            let tail_start = if end == self.chain.size {
                end
            } else {
                (end / ss * ss).max(head_end)
            };
            if head_end > offset {
                self.write_at(&vec![0u8; (head_end - offset) as usize], offset)?;
            }
            if tail_start > head_end {
                self.writer()?
                    .lock()
                    .write_zeroes(&self.chain, head_end, tail_start - head_end)?;
            }
            if end > tail_start {
                self.write_at(&vec![0u8; (end - tail_start) as usize], tail_start)?;
            }
            return Ok(());
        }
        self.writer()?.lock().write_zeroes(&self.chain, offset, len)
    }

    /// Makes every completed write durable.
    ///
    /// The sync runs outside the writer lock: every write this flush must
    /// cover has already reached the file or the metadata kept in memory
    /// (which the sync writes out after making the data durable), and
    /// holding the lock would stall every connection's allocating writes
    /// behind one `fdatasync`.
    pub fn flush(&self) -> Result<()> {
        // Writes acknowledged before a push live in the layers it froze:
        // a flush covers them too.
        self.sync_frozen()?;
        match &self.writer {
            Some(_) => self.top().file.sync(),
            None => Ok(()),
        }
    }

    /// Makes every layer a push froze (see [`Disk::push_top`]) durable
    /// and clean on disk, oldest first, while I/O goes on. Returns how
    /// many were sealed. A concurrent caller waits for the seals in
    /// progress, so when any call returns, every layer frozen before it
    /// began is durable.
    pub fn sync_frozen(&self) -> Result<usize> {
        let _one = self.sealing.lock();
        // Only a push adds to the list, and it takes `&mut self`: nothing
        // is frozen while this runs.
        let pending = self.frozen.lock().clone();
        for f in &pending {
            debug_assert!(
                f.position + 1 < self.chain.layers.len(),
                "the top is never frozen"
            );
            let layer = &self.chain.layers[f.position];
            if f.crc_pending {
                store_index_crc(layer)?;
            }
            seal_layer(layer)?;
            // Sealed, it is a backing file like any other: QEMU tools may
            // read it again (never write it).
            layer.file.downgrade_lock()?;
            if self.drop_sealed_cache.load(Ordering::Relaxed) {
                layer.file.drop_cached();
            }
            self.frozen.lock().retain(|g| g.position != f.position);
        }
        Ok(pending.len())
    }

    /// Whether [`Disk::sync_frozen`] drops each layer it seals from the
    /// kernel's page cache (off by default).
    ///
    /// A sealed layer never changes again, and its pages are clean once it
    /// is durable. Keeping them costs memory that grows with every
    /// snapshot; dropping them lets the next top's writes reuse that
    /// memory. On a virtual machine that matters: a page the page cache
    /// takes from memory the guest has not touched (or has returned to the
    /// hypervisor) faults in the host on its first write, which made
    /// writes after each snapshot several times slower (see
    /// `docs/benchmarks.md`). Reads of the data the layer still holds
    /// then come from the file system rather than from memory.
    pub fn set_drop_sealed_cache(&self, on: bool) {
        self.drop_sealed_cache.store(on, Ordering::Relaxed);
    }

    /// Layers frozen and not yet durable, and how long ago the oldest of
    /// them was frozen.
    pub fn frozen_pending(&self) -> (usize, Option<Duration>) {
        let frozen = self.frozen.lock();
        (frozen.len(), frozen.first().map(|f| f.since.elapsed()))
    }

    /// Files of the layers frozen and not yet durable, oldest first.
    pub fn frozen_paths(&self) -> Vec<PathBuf> {
        self.frozen
            .lock()
            .iter()
            .map(|f| self.chain.layers[f.position].path().to_path_buf())
            .collect()
    }

    /// Closes without making anything durable: for a disk whose top and
    /// frozen layers are about to be removed (a deleted volume), whose
    /// unsynced writes nobody will read. Layers already durable are not
    /// touched.
    pub fn close_discarding(mut self) {
        let frozen = std::mem::take(&mut *self.frozen.lock());
        for f in frozen {
            self.chain.layers[f.position].file.forget_dirty();
        }
        if self.writer.take().is_some() {
            self.top().file.forget_dirty();
        }
    }

    /// Flushes, stores the chain index and marks the image clean.
    pub fn close(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        // The top's checksum reads its whole region: copy what it still
        // reads from below first. If that fails the top is left dirty, not
        // closed with a checksum over a partial region; the next open
        // repairs it and rebuilds its index.
        let copied = self.complete_index_copy();
        let frozen = self.sync_frozen().map(|_| ());
        let top = match (copied, self.writer.take()) {
            (Err(e), _) => Err(e),
            (Ok(()), Some(w)) => w.into_inner().close(&self.chain),
            (Ok(()), None) => Ok(()),
        };
        frozen.and(top)
    }

    pub(crate) fn writer(&self) -> Result<&Mutex<Writer>> {
        self.writer
            .as_ref()
            .ok_or_else(|| DiskError::ReadOnly(self.top().path().to_path_buf()))
    }

    /// Lineage of this chain, base first, as a new layer on top records it.
    pub fn lineage(&self) -> Result<Vec<LayerIdentity>> {
        self.chain.layers.iter().map(|l| l.identity()).collect()
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        // Best effort: a caller that wants the error calls `close`.
        let _ = self.finish();
    }
}

/// Follows backing file names from `top` down; returns layers base first.
fn open_chain(top: &Path, opts: &OpenOptions) -> Result<Vec<Layer>> {
    let mut layers: Vec<Layer> = Vec::new();
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut path: PathBuf = top.to_path_buf();
    let mut format = opts.format;
    if opts.force_share && opts.writable {
        return Err(DiskError::Invalid(format!(
            "{}: force-share (-U) is for read-only opens; a writer must have the image alone",
            top.display()
        )));
    }
    loop {
        if layers.len() as u32 >= MAX_CHAIN_DEPTH {
            return Err(DiskError::Chain(format!(
                "more than {MAX_CHAIN_DEPTH} layers below {}",
                top.display()
            )));
        }
        let writable = opts.writable && layers.is_empty();
        let lock = if opts.force_share {
            LockMode::ForceShare
        } else if writable {
            LockMode::Write
        } else {
            LockMode::Read
        };
        let layer = Layer::open_locked(&path, 0, writable, format, lock)?;
        let meta = layer.file.metadata()?;
        if !seen.insert((meta.dev(), meta.ino())) {
            return Err(DiskError::Chain(format!(
                "{} appears twice: the backing chain loops back to itself",
                path.display()
            )));
        }
        let next = match layer.header() {
            Some(h) => h
                .backing_file
                .clone()
                .map(|name| (name, h.backing_format().map(str::to_owned))),
            None => None,
        };
        let parent_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let referrer = path.clone();
        layers.push(layer);
        let Some((name, fmt)) = next else { break };
        if name.starts_with("json:") || name.contains("://") {
            return Err(DiskError::Chain(format!(
                "{}: backing file '{name}' is a protocol or json: name; Strata opens local files only",
                referrer.display()
            )));
        }
        let candidate = Path::new(&name);
        path = if candidate.is_absolute() {
            candidate.to_path_buf()
        } else {
            parent_dir.join(candidate)
        };
        if !path.exists() {
            return Err(DiskError::Chain(format!(
                "{}: backing file '{name}' not found (looked for {})",
                referrer.display(),
                path.display()
            )));
        }
        format = match fmt {
            Some(f) => Some(Format::parse(&f)?),
            None => None,
        };
    }
    layers.reverse();
    Ok(layers)
}

impl Disk {
    /// Whether `len` bytes at `offset` are known to read as zeros without
    /// reading data (unowned units and zero clusters).
    pub fn reads_as_zero(&self, offset: u64, len: u64) -> Result<bool> {
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(true);
        }
        let first = offset >> self.chain.unit_bits;
        let last = (offset + len - 1) >> self.chain.unit_bits;
        let mut unit = first;
        while unit <= last {
            let page_no = unit / PAGE_UNITS;
            let page = self.chain.page(page_no)?;
            let slots = page.slots.read();
            while unit <= last && unit / PAGE_UNITS == page_no {
                let slot = slots[(unit % PAGE_UNITS) as usize];
                if slot.layer != 0 {
                    let layer = &self.chain.layers[slot.layer as usize - 1];
                    if layer.cluster_bits().is_none() {
                        return Ok(false);
                    }
                    let at = unit << self.chain.unit_bits;
                    if !matches!(
                        layer.decode_at(slot.entry, slot.bitmap, at)?,
                        L2Mapping::Zero { .. }
                    ) {
                        return Ok(false);
                    }
                }
                unit += 1;
            }
        }
        Ok(true)
    }
}

impl Disk {
    /// Allocation state of `len` bytes at `offset`, as runs of equal state,
    /// at most `max_runs` of them (the last may end before `offset + len`).
    pub fn block_status(&self, offset: u64, len: u64, max_runs: usize) -> Result<Vec<BlockStatus>> {
        self.check_range(offset, len)?;
        let mut out: Vec<BlockStatus> = Vec::new();
        let end = offset + len;
        let mut pos = offset;
        let mut cursor = self.data_cursor();
        while pos < end {
            let unit_end = (((pos >> self.chain.unit_bits) + 1) << self.chain.unit_bits).min(end);
            let (hole, zero) = self.slot_state(self.slot_at(pos)?, pos)?;
            // Inside a hole, jump over whatever no layer maps at all. The
            // probe asks every layer, so on a long chain it costs more than
            // walking a page of resolved slots: pay it only where more than
            // a page lies ahead, and once per page.
            let unit = pos >> self.chain.unit_bits;
            let probe = hole
                && end - pos > PAGE_UNITS << self.chain.unit_bits
                && (pos == offset || unit.is_multiple_of(PAGE_UNITS));
            let run_end = if probe {
                self.next_possible_data(&mut cursor, pos)?
                    .clamp(unit_end, end)
            } else {
                unit_end
            };
            match out.last_mut() {
                Some(last) if last.hole == hole && last.zero == zero => {
                    last.length += run_end - pos
                }
                _ => {
                    if out.len() == max_runs.max(1) {
                        break;
                    }
                    out.push(BlockStatus {
                        length: run_end - pos,
                        hole,
                        zero,
                    });
                }
            }
            pos = run_end;
        }
        Ok(out)
    }

    /// (hole, zero) of one resolved slot.
    fn slot_state(&self, slot: Slot, pos: u64) -> Result<(bool, bool)> {
        if slot.layer == 0 {
            return Ok((true, true));
        }
        let layer = &self.chain.layers[slot.layer as usize - 1];
        if layer.cluster_bits().is_none() {
            return Ok((false, false));
        }
        Ok(match layer.decode_at(slot.entry, slot.bitmap, pos)? {
            L2Mapping::Zero { .. } | L2Mapping::Unallocated => (true, true),
            _ => (false, false),
        })
    }
}

/// Remembers, per layer, where its next possibly allocated region starts,
/// so a pass over the disk skips unallocated regions in time proportional
/// to the L1 tables, not to the virtual size.
#[derive(Debug, Clone, Default)]
pub struct DataCursor {
    next: Vec<u64>,
    from: Vec<u64>,
}

impl Disk {
    /// A cursor for [`Disk::next_possible_data`].
    pub fn data_cursor(&self) -> DataCursor {
        DataCursor {
            next: vec![0; self.chain.layers.len()],
            from: vec![u64::MAX; self.chain.layers.len()],
        }
    }

    /// The smallest offset at or after `pos` where some layer may hold data
    /// (the disk size if none). Everything in between reads as zeros.
    /// Calls must not go backwards for the cursor to stay cheap.
    pub fn next_possible_data(&self, cursor: &mut DataCursor, pos: u64) -> Result<u64> {
        let mut best = self.chain.size;
        for (k, layer) in self.chain.layers.iter().enumerate() {
            let stale = cursor.from[k] == u64::MAX || cursor.from[k] > pos || cursor.next[k] < pos;
            if stale {
                cursor.next[k] = layer.next_possible_data(pos)?;
                cursor.from[k] = pos;
            }
            best = best.min(cursor.next[k]);
        }
        Ok(best.max(pos).min(self.chain.size))
    }
}

//! An open disk: a chain of layers read and written as one virtual disk.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strata_format::index::{ChainIndexExt, LayerIdentity, MAX_CHAIN_DEPTH};
use strata_format::L2Mapping;

use crate::cache::{CacheStats, Page, PageCache, Slot, PAGE_UNITS};
pub use crate::chain_index::IndexState;
use crate::chain_index::{store_index_crc, validate_index};
use crate::error::{DiskError, Result};
use crate::header::seal_layer;
use crate::layer::{Format, Layer};
use crate::lock::LockMode;
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
    /// Layers, base first.
    pub(crate) layers: Vec<Layer>,
    /// log2 of the bytes one index unit covers.
    pub(crate) unit_bits: u32,
    pub(crate) size: u64,
    pub(crate) cache: PageCache,
    /// The stored index used for lookups, when valid.
    pub(crate) index: parking_lot::RwLock<Option<ChainIndexExt>>,
    pub(crate) index_state: parking_lot::RwLock<IndexState>,
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
    /// Sectors of a pushed top's index still read from the frozen layer
    /// below (see [`crate::lazy_index`]).
    pub(crate) lazy: parking_lot::RwLock<Option<std::sync::Arc<crate::lazy_index::LazyIndex>>>,
    /// Drop a frozen layer's pages from the page cache once it is sealed
    /// (see [`Disk::set_drop_sealed_cache`]).
    pub(crate) drop_sealed_cache: AtomicBool,
    /// Host clusters of the top layer that hold metadata, checked before
    /// every guest data write (see [`crate::overlap`]).
    pub(crate) metadata: std::sync::Arc<crate::overlap::Guard>,
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
            .field("layers", &self.layers.len())
            .field("size", &self.size)
            .finish()
    }
}

impl Disk {
    /// Opens the image at `path` and its whole backing chain.
    pub fn open(path: impl AsRef<Path>, opts: &OpenOptions) -> Result<Disk> {
        let mut layers = open_chain(path.as_ref(), opts)?;
        let n = layers.len() as u32;
        for (i, layer) in layers.iter_mut().enumerate() {
            layer.file.place.depth = i as u32 + 1;
        }
        // The index unit is the chain's smallest allocation unit (a
        // subcluster with extended L2 entries), so one layer holds each unit.
        let unit_bits = layers
            .iter()
            .filter_map(|l| l.unit_bits())
            .min()
            .unwrap_or(16);
        let top = &layers[layers.len() - 1];
        let size = top.size();
        let (index, state) = if opts.ignore_index {
            (
                None,
                IndexState::Walk {
                    reason: "index ignored on request".into(),
                },
            )
        } else {
            match validate_index(&layers, unit_bits, size) {
                Ok(ext) => (Some(ext), IndexState::Stored { depth: n }),
                Err(reason) => (None, IndexState::Walk { reason }),
            }
        };
        let mut disk = Disk {
            layers,
            unit_bits,
            size,
            cache: PageCache::new(opts.cache_bytes),
            index: parking_lot::RwLock::new(index),
            index_state: parking_lot::RwLock::new(state),
            writer: None,
            alloc_done: parking_lot::Condvar::new(),
            frozen: Mutex::new(Vec::new()),
            sealing: Mutex::new(()),
            lazy: parking_lot::RwLock::new(None),
            drop_sealed_cache: AtomicBool::new(false),
            metadata: std::sync::Arc::default(),
        };
        if opts.writable {
            let writer = Writer::start(&disk)?;
            disk.writer = Some(Mutex::new(writer));
        }
        Ok(disk)
    }

    /// Virtual size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The layers, base first.
    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// The top layer.
    pub fn top(&self) -> &Layer {
        &self.layers[self.layers.len() - 1]
    }

    /// Number of layers.
    pub fn depth(&self) -> u32 {
        self.layers.len() as u32
    }

    /// Bytes one index unit covers (the chain's smallest cluster size).
    pub fn unit_size(&self) -> u64 {
        1 << self.unit_bits
    }

    /// How lookups find owners.
    pub fn index_state(&self) -> IndexState {
        self.index_state.read().clone()
    }

    /// Bytes of the chain index in use (`None`: lookups walk the chain).
    /// A new top copies this much, which is what makes a snapshot of a
    /// big disk slow to prepare.
    pub fn index_bytes(&self) -> Option<u64> {
        self.index.read().as_ref().map(|ext| ext.region_len)
    }

    /// Metadata cache statistics.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Whether the disk is open for writing.
    pub fn is_writable(&self) -> bool {
        self.writer.is_some()
    }

    pub(crate) fn units(&self) -> u64 {
        self.size.div_ceil(1 << self.unit_bits)
    }

    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(DiskError::OutOfRange {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// Returns the resolved page `page`, filling it on a miss.
    pub(crate) fn page(&self, page: u64) -> Result<Arc<Page>> {
        self.cache
            .get_or_fill(page, || Ok(Page::new(self.resolve_page(page)?)))
    }

    /// Resolves every unit of a page: from the stored index when there is
    /// one, else by walking the chain from the top.
    pub(crate) fn resolve_page(&self, page: u64) -> Result<Vec<Slot>> {
        let first = page * PAGE_UNITS;
        let last = (first + PAGE_UNITS).min(self.units());
        let count = last.saturating_sub(first) as usize;
        let mut slots = vec![Slot::default(); count];
        let index = self.index.read().clone();
        let pending: Vec<u64> = match index {
            Some(ext) => self.resolve_from_index(&ext, first, &mut slots)?,
            None => (first..last).collect(),
        };
        self.walk(first, &pending, self.depth(), &mut slots)?;
        Ok(slots)
    }

    /// Reads owners from the stored index and the owners' L2 entries.
    /// Returns the units the index could not answer (to be walked).
    fn resolve_from_index(
        &self,
        ext: &ChainIndexExt,
        first: u64,
        slots: &mut [Slot],
    ) -> Result<Vec<u64>> {
        let owners = self.read_index_owners(ext, first, slots.len())?;
        let n = self.depth();
        let mut pending = Vec::new();
        let mut by_layer: Vec<(u16, u64)> = Vec::with_capacity(slots.len());
        for (i, owner) in owners.iter().enumerate() {
            let unit = first + i as u64;
            match u32::from(*owner) {
                0 => {}
                k if k > n => pending.push(unit),
                _ => by_layer.push((*owner, unit)),
            }
        }
        by_layer.sort_unstable();
        let mut units: Vec<u64> = Vec::with_capacity(PAGE_UNITS as usize);
        let mut found: Vec<(u64, u64)> = Vec::with_capacity(PAGE_UNITS as usize);
        let mut scratch = Scratch::default();
        for group in by_layer.chunk_by(|a, b| a.0 == b.0) {
            let k = u32::from(group[0].0);
            units.clear();
            units.extend(group.iter().map(|g| g.1));
            // Units the layer does not actually hold mean the index
            // disagrees with it: never trust it for those, walk them.
            self.claim_units(
                k,
                &units,
                first,
                slots,
                &mut pending,
                &mut found,
                &mut scratch,
            )?;
        }
        pending.sort_unstable();
        Ok(pending)
    }

    /// Reads `count` owner entries of the stored index starting at `first`.
    pub(crate) fn read_index_owners(
        &self,
        ext: &ChainIndexExt,
        first: u64,
        count: usize,
    ) -> Result<Vec<u16>> {
        let mut buf = vec![0u8; count * 2];
        self.read_region_owners(ext, &mut buf, first * 2)?;
        Ok(buf
            .chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect())
    }

    /// Finds the owners of `units` (sorted) by walking layers `from..=1`.
    pub(crate) fn walk(
        &self,
        first: u64,
        units: &[u64],
        from: u32,
        slots: &mut [Slot],
    ) -> Result<()> {
        // Buffers sized for a whole page, reused for every layer.
        let mut pending: Vec<u64> = Vec::with_capacity(PAGE_UNITS as usize);
        pending.extend_from_slice(units);
        let mut still: Vec<u64> = Vec::with_capacity(PAGE_UNITS as usize);
        let mut found: Vec<(u64, u64)> = Vec::with_capacity(PAGE_UNITS as usize);
        let mut scratch = Scratch::default();
        for k in (1..=from).rev() {
            if pending.is_empty() {
                break;
            }
            let layer = &self.layers[k as usize - 1];
            // A layer smaller than the disk reads as zeros past its end and
            // hides everything below it there.
            let size = layer.size();
            let unit_bits = self.unit_bits;
            pending.retain(|u| (u << unit_bits) < size);
            let raw_layer = layer.qcow2.is_none();
            still.clear();
            self.claim_units(
                k,
                &pending,
                first,
                slots,
                &mut still,
                &mut found,
                &mut scratch,
            )?;
            if raw_layer {
                break;
            }
            std::mem::swap(&mut pending, &mut still);
        }
        Ok(())
    }

    /// Gives layer `k` the units of `units` (sorted) it holds: a raw layer
    /// holds all of them, a qcow2 layer those its L2 entries allocate. The
    /// others are pushed to `rest`.
    #[allow(clippy::too_many_arguments)]
    fn claim_units(
        &self,
        k: u32,
        units: &[u64],
        first: u64,
        slots: &mut [Slot],
        rest: &mut Vec<u64>,
        found: &mut Vec<(u64, u64)>,
        scratch: &mut Scratch,
    ) -> Result<()> {
        let layer = &self.layers[k as usize - 1];
        // The invariant lookups rest on: a unit never spans two of a
        // layer's allocation units (clusters, or subclusters with extended
        // L2 entries), so exactly one layer holds all of it.
        debug_assert!(
            layer.unit_bits().is_none_or(|b| b >= self.unit_bits),
            "index unit 2^{} larger than layer {k}'s allocation unit",
            self.unit_bits
        );
        if layer.qcow2.is_none() {
            for u in units {
                slots[(u - first) as usize] = Slot {
                    layer: k as u16,
                    entry: 0,
                    bitmap: 0,
                };
            }
            return Ok(());
        }
        self.lookup_units_into(layer, units, found, scratch)?;
        for (u, (raw, bitmap)) in units.iter().zip(found.iter().copied()) {
            if entry_unallocated(layer, raw, bitmap, u << self.unit_bits) {
                rest.push(*u);
            } else {
                slots[(u - first) as usize] = Slot {
                    layer: k as u16,
                    entry: raw,
                    bitmap,
                };
            }
        }
        Ok(())
    }

    /// Reads the raw L2 entries that `layer` has for `units` (sorted) into
    /// `out`, batching units that share an L2 table into one read. Page
    /// fills call this once per layer: fixed-size, reused buffers keep
    /// glibc's per-thread caches from filling with chunks of every size,
    /// which cost ~230 KiB per thread at chain length 1,000.
    fn lookup_units_into(
        &self,
        layer: &Layer,
        units: &[u64],
        out: &mut Vec<(u64, u64)>,
        scratch: &mut Scratch,
    ) -> Result<()> {
        let cb = layer.cluster_bits().unwrap_or(16);
        let l2_entries = layer.l2_entries();
        let cluster_of = |u: u64| (u << self.unit_bits) >> cb;
        out.clear();
        out.resize(units.len(), (0, 0));
        let mut i = 0;
        while i < units.len() {
            let table = cluster_of(units[i]) / l2_entries;
            let mut j = i;
            while j + 1 < units.len() && cluster_of(units[j + 1]) / l2_entries == table {
                j += 1;
            }
            let lo = cluster_of(units[i]);
            let hi = cluster_of(units[j]);
            let entries = &mut scratch.entries;
            entries.clear();
            entries.resize((hi - lo + 1) as usize, (0, 0));
            layer.read_l2_entries_with(lo, entries, &mut scratch.bytes)?;
            for k in i..=j {
                out[k] = entries[(cluster_of(units[k]) - lo) as usize];
            }
            i = j + 1;
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let mut pending: Option<Extent> = None;
        let mut pos = offset;
        let end = offset + buf.len() as u64;
        while pos < end {
            let unit = pos >> self.unit_bits;
            let page_no = unit / PAGE_UNITS;
            let page = self.page(page_no)?;
            let slots = page.slots.read();
            let mut unit = unit;
            while pos < end && unit / PAGE_UNITS == page_no {
                let slot = slots[(unit % PAGE_UNITS) as usize];
                let unit_end = ((unit + 1) << self.unit_bits).min(end);
                let ext = self.extent_of(slot, pos, unit_end - pos)?;
                pending = match pending.take() {
                    Some(p) => match p.merge(ext) {
                        Ok(m) => Some(m),
                        Err((p, ext)) => {
                            self.read_extent(&p, &mut buf[(p.guest - offset) as usize..])?;
                            Some(ext)
                        }
                    },
                    None => Some(ext),
                };
                pos = unit_end;
                unit += 1;
            }
        }
        if let Some(p) = pending {
            self.read_extent(&p, &mut buf[(p.guest - offset) as usize..])?;
        }
        Ok(())
    }

    /// Where `len` bytes at guest `pos` (inside one unit) come from.
    fn extent_of(&self, slot: Slot, pos: u64, len: u64) -> Result<Extent> {
        let source = if slot.layer == 0 {
            Source::Zero
        } else {
            let layer = self
                .layers
                .get(slot.layer as usize - 1)
                .ok_or_else(|| DiskError::Chain(format!("owner layer {} missing", slot.layer)))?;
            match layer.cluster_bits() {
                None => Source::Raw {
                    layer: slot.layer,
                    offset: pos,
                },
                Some(cb) => {
                    let in_cluster = pos & ((1 << cb) - 1);
                    match layer.decode_at(slot.entry, slot.bitmap, pos)? {
                        L2Mapping::Data { host_offset, .. } => Source::Host {
                            layer: slot.layer,
                            offset: host_offset + in_cluster,
                        },
                        L2Mapping::Zero { .. } | L2Mapping::Unallocated => Source::Zero,
                        L2Mapping::Compressed { .. } => Source::Compressed {
                            layer: slot.layer,
                            entry: slot.entry,
                            in_cluster,
                        },
                    }
                }
            }
        };
        Ok(Extent {
            guest: pos,
            len,
            source,
        })
    }

    fn read_extent(&self, e: &Extent, buf: &mut [u8]) -> Result<()> {
        let buf = &mut buf[..e.len as usize];
        match e.source {
            Source::Zero => {
                buf.fill(0);
                Ok(())
            }
            Source::Host { layer, offset } => {
                self.layers[layer as usize - 1].file.read_data(buf, offset)
            }
            Source::Raw { layer, offset } => self.layers[layer as usize - 1].read_raw(buf, offset),
            Source::Compressed {
                layer,
                entry,
                in_cluster,
            } => self.layers[layer as usize - 1].read_mapped(entry, in_cluster, buf),
        }
    }

    /// The owner and L2 entry of the unit holding guest offset `pos`.
    pub fn slot_at(&self, pos: u64) -> Result<Slot> {
        self.check_range(pos, 1)?;
        let unit = pos >> self.unit_bits;
        let page = self.page(unit / PAGE_UNITS)?;
        let slot = page.slots.read()[(unit % PAGE_UNITS) as usize];
        Ok(slot)
    }

    /// Owners of units `first..first+count`, for building a new index.
    /// Uses the stored index when valid, else resolves page by page
    /// (without filling the cache).
    pub fn owners(&self, first: u64, count: usize) -> Result<Vec<u16>> {
        if let Some(ext) = self.index.read().clone() {
            return self.read_index_owners(&ext, first, count);
        }
        let mut out = Vec::with_capacity(count);
        let end = first + count as u64;
        let mut unit = first;
        while unit < end {
            let page = unit / PAGE_UNITS;
            let slots = self.resolve_page(page)?;
            let page_first = page * PAGE_UNITS;
            while unit < end && unit / PAGE_UNITS == page {
                out.push(slots[(unit - page_first) as usize].layer);
                unit += 1;
            }
        }
        Ok(out)
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
            match host {
                Some(host) => self.write_guest_data(part, host, pos)?,
                None => self.write_allocating(writer, part, pos)?,
            }
            pos = seg_end;
        }
        Ok(())
    }

    /// Writes guest data (guest offset `guest`) at `host` in the top file,
    /// unless that would overwrite the top layer's metadata (see
    /// [`crate::overlap`]).
    pub(crate) fn write_guest_data(&self, data: &[u8], host: u64, guest: u64) -> Result<()> {
        let top = self.top();
        self.metadata
            .check_data_write(top, host, data.len() as u64, guest)?;
        top.file.write_data(data, host)
    }

    /// End of the top layer's cluster holding `pos`, capped at `end`.
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
        self.writer()?.lock().discard(self, offset, len)
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
            let tail_start = if end == self.size {
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
                    .write_zeroes(self, head_end, tail_start - head_end)?;
            }
            if end > tail_start {
                self.write_at(&vec![0u8; (end - tail_start) as usize], tail_start)?;
            }
            return Ok(());
        }
        self.writer()?.lock().write_zeroes(self, offset, len)
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
                f.position + 1 < self.layers.len(),
                "the top is never frozen"
            );
            let layer = &self.layers[f.position];
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
            .map(|f| self.layers[f.position].path().to_path_buf())
            .collect()
    }

    /// Closes without making anything durable: for a disk whose top and
    /// frozen layers are about to be removed (a deleted volume), whose
    /// unsynced writes nobody will read. Layers already durable are not
    /// touched.
    pub fn close_discarding(mut self) {
        let frozen = std::mem::take(&mut *self.frozen.lock());
        for f in frozen {
            self.layers[f.position].file.forget_dirty();
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
            (Ok(()), Some(w)) => w.into_inner().close(self),
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
        self.layers.iter().map(|l| l.identity()).collect()
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        // Best effort: a caller that wants the error calls `close`.
        let _ = self.finish();
    }
}

/// Reusable buffers of a page fill.
#[derive(Default)]
struct Scratch {
    entries: Vec<(u64, u64)>,
    bytes: Vec<u8>,
}

/// A run of guest bytes with one source.
#[derive(Debug, Clone, Copy)]
struct Extent {
    guest: u64,
    len: u64,
    source: Source,
}

#[derive(Debug, Clone, Copy)]
enum Source {
    Zero,
    Host {
        layer: u16,
        offset: u64,
    },
    Raw {
        layer: u16,
        offset: u64,
    },
    Compressed {
        layer: u16,
        entry: u64,
        in_cluster: u64,
    },
}

impl Extent {
    /// Appends `next` if it continues this extent in the same file.
    fn merge(self, next: Extent) -> std::result::Result<Extent, (Extent, Extent)> {
        let joined = match (self.source, next.source) {
            (Source::Zero, Source::Zero) => true,
            (
                Source::Host {
                    layer: a,
                    offset: o,
                },
                Source::Host {
                    layer: b,
                    offset: p,
                },
            )
            | (
                Source::Raw {
                    layer: a,
                    offset: o,
                },
                Source::Raw {
                    layer: b,
                    offset: p,
                },
            ) => a == b && o + self.len == p,
            _ => false,
        };
        if joined && self.guest + self.len == next.guest {
            Ok(Extent {
                len: self.len + next.len,
                ..self
            })
        } else {
            Err((self, next))
        }
    }
}

/// Whether a raw L2 entry leaves its unit to the layers below. An entry that
/// does not decode (reserved bits, misaligned offset...) counts as owned by
/// its layer, so the error surfaces when *that* cluster is read, instead of
/// failing the whole resolved page and every neighbouring cluster with it.
fn entry_unallocated(layer: &Layer, raw: u64, bitmap: u64, pos: u64) -> bool {
    matches!(
        layer.decode_at(raw, bitmap, pos),
        Ok(L2Mapping::Unallocated)
    )
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
        let first = offset >> self.unit_bits;
        let last = (offset + len - 1) >> self.unit_bits;
        let mut unit = first;
        while unit <= last {
            let page_no = unit / PAGE_UNITS;
            let page = self.page(page_no)?;
            let slots = page.slots.read();
            while unit <= last && unit / PAGE_UNITS == page_no {
                let slot = slots[(unit % PAGE_UNITS) as usize];
                if slot.layer != 0 {
                    let layer = &self.layers[slot.layer as usize - 1];
                    if layer.cluster_bits().is_none() {
                        return Ok(false);
                    }
                    let at = unit << self.unit_bits;
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

/// Allocation state of a run of guest bytes, as NBD's `base:allocation`
/// and `qemu-img map` describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BlockStatus {
    /// Bytes in the run.
    pub length: u64,
    /// No layer stores data for it (unowned, or a zero cluster).
    pub hole: bool,
    /// Reads as zeros.
    pub zero: bool,
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
            let unit_end = (((pos >> self.unit_bits) + 1) << self.unit_bits).min(end);
            let (hole, zero) = self.slot_state(self.slot_at(pos)?, pos)?;
            // Inside a hole, jump over whatever no layer maps at all. The
            // probe asks every layer, so on a long chain it costs more than
            // walking a page of resolved slots: pay it only where more than
            // a page lies ahead, and once per page.
            let unit = pos >> self.unit_bits;
            let probe = hole
                && end - pos > PAGE_UNITS << self.unit_bits
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
        let layer = &self.layers[slot.layer as usize - 1];
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
            next: vec![0; self.layers.len()],
            from: vec![u64::MAX; self.layers.len()],
        }
    }

    /// The smallest offset at or after `pos` where some layer may hold data
    /// (the disk size if none). Everything in between reads as zeros.
    /// Calls must not go backwards for the cursor to stay cheap.
    pub fn next_possible_data(&self, cursor: &mut DataCursor, pos: u64) -> Result<u64> {
        let mut best = self.size;
        for (k, layer) in self.layers.iter().enumerate() {
            let stale = cursor.from[k] == u64::MAX || cursor.from[k] > pos || cursor.next[k] < pos;
            if stale {
                cursor.next[k] = layer.next_possible_data(pos)?;
                cursor.from[k] = pos;
            }
            best = best.min(cursor.next[k]);
        }
        Ok(best.max(pos).min(self.size))
    }
}

//! The shared state of an open chain: its layers, the resolved-page cache
//! and the chain index lookups use, and the map of the top layer's
//! metadata. [`crate::Disk`] owns one and hands it to the writer, which
//! changes owners and entries in it, and to the lazy index copy.
//!
//! Lookups go through the resolved pages: a page miss reads owners from
//! the stored index when there is a valid one (see [`crate::chain_index`]),
//! else walks the chain from the top; either way the owners' L2 entries
//! are read in batches, one read per L2 table and layer.

use std::sync::Arc;

use parking_lot::RwLock;
use strata_format::index::ChainIndexExt;
use strata_format::L2Mapping;

use crate::cache::{Page, PageCache, Slot, PAGE_UNITS};
use crate::chain_index::{validate_index, IndexState};
use crate::error::{DiskError, Result};
use crate::layer::Layer;
use crate::lazy_index::LazyIndex;
use crate::overlap::Guard;

/// The layers of an open chain and what lookups and writes share about
/// them.
pub(crate) struct Chain {
    /// Layers, base first.
    pub(crate) layers: Vec<Layer>,
    /// log2 of the bytes one index unit covers.
    pub(crate) unit_bits: u32,
    /// Virtual size in bytes.
    pub(crate) size: u64,
    /// Resolved pages: owners and L2 entries of index units.
    pub(crate) cache: PageCache,
    /// The stored index used for lookups, when valid.
    pub(crate) index: RwLock<Option<ChainIndexExt>>,
    /// How lookups find owners, and why.
    pub(crate) index_state: RwLock<IndexState>,
    /// Sectors of a pushed top's index still read from the frozen layer
    /// below (see [`crate::lazy_index`]).
    pub(crate) lazy: RwLock<Option<Arc<LazyIndex>>>,
    /// Host clusters of the top layer that hold metadata, checked before
    /// every guest data write (see [`crate::overlap`]).
    pub(crate) metadata: Arc<Guard>,
}

impl Chain {
    /// The chain of `layers` (base first, already numbered), with a
    /// metadata cache of `cache_bytes`; its stored index is used unless
    /// `ignore_index` or it does not match the chain.
    pub(crate) fn new(layers: Vec<Layer>, cache_bytes: u64, ignore_index: bool) -> Chain {
        let unit_bits = smallest_unit_bits(&layers);
        let size = layers.last().map_or(0, Layer::size);
        let (index, state) = if ignore_index {
            (
                None,
                IndexState::Walk {
                    reason: "index ignored on request".into(),
                },
            )
        } else {
            stored_index(&layers, unit_bits, size)
        };
        Chain {
            layers,
            unit_bits,
            size,
            cache: PageCache::new(cache_bytes),
            index: RwLock::new(index),
            index_state: RwLock::new(state),
            lazy: RwLock::new(None),
            metadata: Arc::default(),
        }
    }

    /// Validates the top's stored index against the layers as they are
    /// now and uses it, or walks the chain and says why.
    pub(crate) fn reload_index(&mut self) {
        let (index, state) = stored_index(&self.layers, self.unit_bits, self.size);
        *self.index.write() = index;
        *self.index_state.write() = state;
    }

    /// Makes `layer` the top of a chain of `size` bytes.
    pub(crate) fn push_top(&mut self, layer: Layer, size: u64) {
        let (old_size, old_unit_bits) = (self.size, self.unit_bits);
        let unit_bits = layer.unit_bits().unwrap_or(self.unit_bits);
        self.layers.push(layer);
        self.size = size;
        self.unit_bits = self.unit_bits.min(unit_bits);
        if self.size != old_size || self.unit_bits != old_unit_bits {
            // Page lengths follow the disk size; start over.
            self.cache.clear();
        }
    }

    /// Puts `layer` in place of layers `first..=last` (1-based) and
    /// renumbers; lookups walk the chain until the index is rebuilt.
    pub(crate) fn splice(&mut self, first: u32, last: u32, layer: Layer, reason: &str) {
        self.layers
            .splice(first as usize - 1..last as usize, std::iter::once(layer));
        for (i, l) in self.layers.iter_mut().enumerate() {
            l.file.place.depth = i as u32 + 1;
        }
        self.unit_bits = smallest_unit_bits(&self.layers);
        self.cache.clear();
        *self.index.write() = None;
        *self.index_state.write() = IndexState::Walk {
            reason: reason.into(),
        };
    }

    /// The top layer.
    pub(crate) fn top(&self) -> &Layer {
        &self.layers[self.layers.len() - 1]
    }

    /// Number of layers.
    pub(crate) fn depth(&self) -> u32 {
        self.layers.len() as u32
    }

    /// Index units of the virtual disk.
    pub(crate) fn units(&self) -> u64 {
        self.size.div_ceil(1 << self.unit_bits)
    }

    /// Refuses a range that does not lie inside the virtual disk.
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
    pub(crate) fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
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
    pub(crate) fn slot_at(&self, pos: u64) -> Result<Slot> {
        self.check_range(pos, 1)?;
        let unit = pos >> self.unit_bits;
        let page = self.page(unit / PAGE_UNITS)?;
        let slot = page.slots.read()[(unit % PAGE_UNITS) as usize];
        Ok(slot)
    }

    /// Owners of units `first..first+count`, for building a new index.
    /// Uses the stored index when valid, else resolves page by page
    /// (without filling the cache).
    pub(crate) fn owners(&self, first: u64, count: usize) -> Result<Vec<u16>> {
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

    /// Writes guest data (guest offset `guest`) at `host` in the top file,
    /// unless that would overwrite the top layer's metadata (see
    /// [`crate::overlap`]).
    pub(crate) fn write_guest_data(&self, data: &[u8], host: u64, guest: u64) -> Result<()> {
        let top = self.top();
        self.metadata
            .check_data_write(top, host, data.len() as u64, guest)?;
        top.file.write_data(data, host)
    }

    /// The lazy copy in progress on the top, if any.
    fn lazy_index(&self) -> Option<Arc<LazyIndex>> {
        self.lazy.read().clone()
    }

    /// Reads owner bytes `at..at + buf.len()` of the top's index region
    /// `ext`, taking sectors not yet copied from the frozen layer below.
    pub(crate) fn read_region_owners(
        &self,
        ext: &ChainIndexExt,
        buf: &mut [u8],
        at: u64,
    ) -> Result<()> {
        match self.lazy_index() {
            Some(lazy) => lazy.read_owners(&self.layers, ext, buf, at),
            None => self.top().file.read_exact_at(buf, ext.region_offset + at),
        }
    }

    /// Copies the sectors of the top's region holding owner bytes
    /// `start..end` that are not copied yet, before the writer changes
    /// them. The caller holds the writer's mutex.
    pub(crate) fn copy_index_span(&self, ext: &ChainIndexExt, start: u64, end: u64) -> Result<()> {
        let Some(lazy) = self.lazy_index() else {
            return Ok(());
        };
        lazy.copy_span(&self.layers, ext, start, end)?;
        self.drop_lazy_if_done(&lazy);
        Ok(())
    }

    /// Copies up to `max_sectors` more sectors of a pushed top's index
    /// from the layer below, calling `lock` for the writer's mutex and
    /// holding it for one run at a time. Returns the sectors still to copy.
    pub(crate) fn copy_index_rest<G>(&self, max_sectors: u64, lock: impl Fn() -> G) -> Result<u64> {
        let Some(lazy) = self.lazy_index() else {
            return Ok(0);
        };
        let Some(ext) = self.index.read().clone() else {
            return Ok(0);
        };
        lazy.copy_some(&self.layers, &ext, max_sectors, lock)?;
        self.drop_lazy_if_done(&lazy);
        Ok(lazy.left())
    }

    /// Forgets the lazy copy once every sector of it is copied.
    fn drop_lazy_if_done(&self, lazy: &LazyIndex) {
        if lazy.left() == 0 {
            let mut slot = self.lazy.write();
            if slot.as_ref().is_some_and(|l| l.left() == 0) {
                *slot = None;
            }
        }
    }

    /// Index sectors of the top still read from the layer below.
    pub(crate) fn index_copy_pending(&self) -> u64 {
        self.lazy_index().map_or(0, |l| l.left())
    }
}

/// The index unit of a chain of `layers`: its smallest allocation unit (a
/// subcluster with extended L2 entries), so that one layer holds each unit.
fn smallest_unit_bits(layers: &[Layer]) -> u32 {
    layers
        .iter()
        .filter_map(|l| l.unit_bits())
        .min()
        .unwrap_or(16)
}

/// The top's stored index if it matches the chain of `layers`, with the
/// state lookups report.
fn stored_index(
    layers: &[Layer],
    unit_bits: u32,
    size: u64,
) -> (Option<ChainIndexExt>, IndexState) {
    match validate_index(layers, unit_bits, size) {
        Ok(ext) => (
            Some(ext),
            IndexState::Stored {
                depth: layers.len() as u32,
            },
        ),
        Err(reason) => (None, IndexState::Walk { reason }),
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

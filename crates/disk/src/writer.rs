//! Writing to the top layer.
//!
//! Protocol:
//! - On open for writing, the header is rewritten first: the dirty bit is
//!   set (v3) and the chain-index autoclear bit cleared, then synced. A crash
//!   from here on leaves an image that QEMU and Strata both repair on their
//!   next open for writing, and an index nobody trusts.
//! - Metadata is updated in an order that never lets a table point at
//!   something not yet written: data, then refcount, then L2 entry, then
//!   L1 entry, then index entry. Small metadata writes wait in memory for
//!   the next sync, which makes the data durable before writing them (see
//!   [`crate::file`]). After a crash the file is consistent except for
//!   leaks, which the dirty bit makes the next writer repair.
//! - On close, the index checksum is recomputed, the autoclear bit set and
//!   the dirty bit cleared, after a sync.

use strata_format::entry::OFLAG_COPIED;
use strata_format::header::{Header, AUTOCLEAR_STRATA_INDEX, INCOMPAT_CORRUPT, INCOMPAT_DIRTY};
use strata_format::index::{ChainIndexExt, LINEAGE_RECORD_BYTES, MAX_REGION_BYTES};
use strata_format::{refcount, L2Mapping};

use std::collections::HashSet;

use crate::cache::{Slot, PAGE_UNITS};
use crate::disk::{region_crc, Disk, IndexState};
use crate::error::{DiskError, Result};
use crate::layer::Layer;

/// Units of owners written per chunk when (re)building an index.
const OWNER_CHUNK: u64 = 1 << 16;

/// State of an open writer.
pub(crate) struct Writer {
    /// `None` for a raw top layer.
    alloc: Option<Allocator>,
    /// The index region this writer maintains.
    index: Option<ChainIndexExt>,
    /// Guest clusters whose new top-layer cluster has been allocated but
    /// not yet published in the L2 table: their data is being written
    /// outside the lock. Another allocating write to one of them waits.
    in_flight: HashSet<u64>,
}

/// What an allocating write to one guest cluster must do, decided under
/// the writer lock by [`Writer::prepare_alloc`].
pub(crate) enum AllocStep {
    /// The top layer owns the cluster now: overwrite it in place at this
    /// host offset (of the cluster's start).
    InPlace(u64),
    /// Another write is allocating this cluster: wait and ask again.
    Busy,
    /// A new host cluster was allocated and the guest cluster reserved.
    /// Fill it (copying what the write does not cover from `old`), then
    /// publish it with [`Writer::publish_alloc`].
    Fill {
        /// Host offset of the new cluster in the top file.
        host: u64,
        /// The mapping the write replaces, for copy-on-write.
        old: L2Mapping,
    },
}

impl Writer {
    /// Prepares the top layer for writing.
    pub(crate) fn start(disk: &Disk) -> Result<Writer> {
        Writer::start_with_owners(disk, None)
    }

    /// Like [`Writer::start`], but when a new index must be built it takes
    /// the owner of every unit from `owners` instead of walking the chain
    /// (a caller that just changed the chain under an open disk knows them).
    pub(crate) fn start_with_owners(disk: &Disk, owners: Option<&[u16]>) -> Result<Writer> {
        let top = disk.top();
        let Some(header) = top.header() else {
            return Ok(Writer {
                alloc: None,
                index: None,
                in_flight: HashSet::new(),
            });
        };
        if header.nb_snapshots > 0 {
            return Err(DiskError::Unsupported {
                place: top.place().clone(),
                detail: format!(
                    "writing an image with {} internal snapshots; Strata reads them \
                     but only writes images without internal snapshots",
                    header.nb_snapshots
                ),
            });
        }
        if header.incompatible_features & INCOMPAT_CORRUPT != 0 {
            return Err(DiskError::corrupt(
                top.place(),
                "image is marked corrupt; repair it with `strata img check -r all` first",
            ));
        }
        let was_dirty = header.incompatible_features & INCOMPAT_DIRTY != 0;
        let mut h = header;
        if h.version >= 3 {
            h.incompatible_features |= INCOMPAT_DIRTY;
            // Clear every autoclear bit: we maintain none of those features
            // while writing (bitmaps included), and our own index is only
            // valid again at close.
            h.autoclear_features = 0;
        }
        write_header(top, &h)?;
        top.file.sync()?;
        let mut alloc = Allocator::load(top)?;
        if was_dirty {
            crate::check::repair_refcounts(top)?;
            alloc = Allocator::load(top)?;
        }
        let mut writer = Writer {
            alloc: Some(alloc),
            index: None,
            in_flight: HashSet::new(),
        };
        if h.version >= 3 {
            writer.attach_index(disk, owners)?;
            // The dirty bit is on disk: a crash between syncs is repaired
            // on the next open, so metadata may wait for the next sync.
            top.file.set_write_back(true)?;
        }
        Ok(writer)
    }

    /// Uses the stored index if it is valid, else builds a new one.
    fn attach_index(&mut self, disk: &Disk, owners: Option<&[u16]>) -> Result<()> {
        let top = disk.top();
        let fresh_uuid = new_uuid()?;
        if let Some(mut ext) = disk.index.read().clone() {
            ext.layer_uuid = fresh_uuid;
            self.index = Some(ext.clone());
            write_index_ext(top, &ext, false)?;
            return Ok(());
        }
        let region = ChainIndexExt::region_len_for(disk.size(), disk.unit_bits, disk.depth());
        if region > MAX_REGION_BYTES {
            // Too large to keep: lookups walk the chain, with the same cache.
            return Ok(());
        }
        let alloc = self
            .alloc
            .as_mut()
            .ok_or_else(|| DiskError::Invalid("raw top".into()))?;
        let ext = build_index(disk, alloc, fresh_uuid, owners)?;
        write_index_ext(top, &ext, false)?;
        *disk.index.write() = Some(ext.clone());
        *disk.index_state.write() = IndexState::Stored { depth: ext.depth };
        self.index = Some(ext);
        Ok(())
    }

    pub(crate) fn write(&mut self, disk: &Disk, buf: &[u8], offset: u64) -> Result<()> {
        let top = disk.top();
        let Some(cb) = top.cluster_bits() else {
            return top.file.write_data(buf, offset);
        };
        let cs = 1u64 << cb;
        let end = offset + buf.len() as u64;
        let mut pos = offset;
        while pos < end {
            let cluster = pos >> cb;
            let seg_end = end.min((cluster + 1) << cb);
            let part = &buf[(pos - offset) as usize..(seg_end - offset) as usize];
            self.write_in_cluster(disk, cluster, pos - (cluster << cb), part, cs)?;
            pos = seg_end;
        }
        Ok(())
    }

    /// First step of an allocating write to guest `cluster`: decides
    /// between in place, wait, and a fresh cluster to fill outside the lock.
    pub(crate) fn prepare_alloc(&mut self, disk: &Disk, cluster: u64) -> Result<AllocStep> {
        if self.in_flight.contains(&cluster) {
            return Ok(AllocStep::Busy);
        }
        let top = disk.top();
        let old = top_mapping(top, cluster)?;
        if let L2Mapping::Data {
            host_offset,
            copied: true,
        } = old
        {
            return Ok(AllocStep::InPlace(host_offset));
        }
        let host = self.allocator()?.alloc(top, 1)?;
        self.in_flight.insert(cluster);
        Ok(AllocStep::Fill { host, old })
    }

    /// Last step of an allocating write: points `cluster` at its filled
    /// `host` cluster and drops the reference of whatever it replaces.
    ///
    /// The replaced mapping is read again here rather than taken from
    /// [`AllocStep::Fill`]: a discard or zero write may have changed it
    /// meanwhile, and releasing a stale mapping would free a cluster twice.
    pub(crate) fn publish_alloc(&mut self, disk: &Disk, cluster: u64, host: u64) -> Result<()> {
        self.in_flight.remove(&cluster);
        let top = disk.top();
        let current = top_mapping(top, cluster)?;
        self.set_l2(disk, cluster, L2Mapping::encode_data(host))?;
        self.release(top, current, host)
    }

    /// Gives up an allocating write whose fill failed: the new cluster is
    /// freed and the guest cluster keeps its old mapping.
    pub(crate) fn abort_alloc(&mut self, disk: &Disk, cluster: u64, host: u64) -> Result<()> {
        self.in_flight.remove(&cluster);
        self.free_cluster(disk.top(), host)
    }

    /// Frees a cluster allocated for a write that failed before anything
    /// pointed at it.
    fn free_cluster(&mut self, top: &Layer, host: u64) -> Result<()> {
        let alloc = self.allocator()?;
        let cs = alloc.cs;
        alloc.set_refcount(top, host / cs, 0)
    }

    /// Writes `data` at `in_cluster` inside guest cluster `cluster`.
    fn write_in_cluster(
        &mut self,
        disk: &Disk,
        cluster: u64,
        in_cluster: u64,
        data: &[u8],
        cs: u64,
    ) -> Result<()> {
        let top = disk.top();
        let old = top_mapping(top, cluster)?;
        if let L2Mapping::Data {
            host_offset,
            copied: true,
        } = old
        {
            return top.file.write_data(data, host_offset + in_cluster);
        }
        let reused = match old {
            L2Mapping::Zero {
                prealloc: Some(h),
                copied: true,
            } => Some(h),
            _ => None,
        };
        let host = match reused {
            Some(h) => h,
            None => self.allocator()?.alloc(top, 1)?,
        };
        let cb = cs.trailing_zeros();
        if let Err(e) = disk.fill_cluster(cluster, cb, in_cluster, data, old, host) {
            if reused.is_none() {
                self.free_cluster(top, host)?;
            }
            return Err(e);
        }
        let entry = L2Mapping::encode_data(host);
        self.set_l2(disk, cluster, entry)?;
        self.release(top, old, host)?;
        Ok(())
    }

    /// Makes `len` bytes at `offset` read as zeros.
    pub(crate) fn write_zeroes(&mut self, disk: &Disk, offset: u64, len: u64) -> Result<()> {
        let top = disk.top();
        let zero_flag = top.header().is_some_and(|h| h.version >= 3);
        let cb = top.cluster_bits().unwrap_or(16);
        let cs = 1u64 << cb;
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let cluster = pos >> cb;
            let c_start = cluster << cb;
            let seg_end = end.min(c_start + cs);
            let covers = pos == c_start && (seg_end == c_start + cs || seg_end == disk.size());
            if zero_flag && covers {
                let old = top_mapping(top, cluster)?;
                self.set_l2(disk, cluster, L2Mapping::encode_zero())?;
                self.release(top, old, 0)?;
            } else {
                let zeros = vec![0u8; (seg_end - pos) as usize];
                self.write(disk, &zeros, pos)?;
            }
            pos = seg_end;
        }
        Ok(())
    }

    /// Releases whole top-layer clusters in the range (see [`Disk::discard`]).
    pub(crate) fn discard(&mut self, disk: &Disk, offset: u64, len: u64) -> Result<()> {
        let top = disk.top();
        let Some(h) = top.header() else {
            return Ok(());
        };
        let cb = h.cluster_bits;
        let cs = 1u64 << cb;
        let end = offset + len;
        let first = offset.div_ceil(cs);
        // A partial last cluster at the end of the disk counts as whole.
        let last = if end == disk.size() {
            end.div_ceil(cs)
        } else {
            end / cs
        };
        let has_backing = disk.depth() > 1;
        if has_backing && h.version < 3 {
            return Ok(());
        }
        for cluster in first..last {
            let old = top_mapping(top, cluster)?;
            let entry = if has_backing {
                L2Mapping::encode_zero()
            } else {
                0
            };
            if old.is_unallocated() && !has_backing {
                continue;
            }
            self.set_l2(disk, cluster, entry)?;
            self.release(top, old, 0)?;
        }
        Ok(())
    }

    /// Points guest cluster `cluster` of the top layer at `entry`, then
    /// updates the index and the cache.
    fn set_l2(&mut self, disk: &Disk, cluster: u64, entry: u64) -> Result<()> {
        let top = disk.top();
        let cb = top.cluster_bits().unwrap_or(16);
        let l2_entries = 1u64 << (cb - 3);
        let l1_index = cluster / l2_entries;
        let mut table = top.l2_table(l1_index)?;
        if table == 0 {
            let alloc = self.allocator()?;
            table = alloc.alloc(top, 1)?;
            top.file.write_all_at(&vec![0u8; 1 << cb], table)?;
            set_l1_entry(top, l1_index, table | OFLAG_COPIED)?;
        }
        top.file
            .write_all_at(&entry.to_be_bytes(), table + (cluster % l2_entries) * 8)?;
        // Units of this cluster now belong to the top layer, or to nobody
        // when it was unallocated (only done without a backing file).
        let ub = disk.unit_bits;
        let first = (cluster << cb) >> ub;
        let last = (((cluster + 1) << cb).min(disk.size()) >> ub).max(first + 1);
        debug_assert!(
            entry != 0 || disk.depth() == 1,
            "unallocating over a backing file"
        );
        let depth = if entry == 0 { 0 } else { disk.depth() as u16 };
        if let Some(ext) = &self.index {
            let owners: Vec<u8> = (first..last).flat_map(|_| depth.to_be_bytes()).collect();
            top.file
                .write_all_at(&owners, ext.region_offset + first * 2)?;
        }
        let mut unit = first;
        while unit < last {
            let page = unit / PAGE_UNITS;
            let page_end = last.min((page + 1) * PAGE_UNITS);
            disk.cache.update_if_cached(page, |slots| {
                for u in unit..page_end {
                    if let Some(s) = slots.get_mut((u - page * PAGE_UNITS) as usize) {
                        *s = Slot {
                            layer: depth,
                            entry,
                        };
                    }
                }
            });
            unit = page_end;
        }
        Ok(())
    }

    /// Drops the top layer's reference held by a replaced L2 entry, unless
    /// it is the cluster now reused (`kept`).
    fn release(&mut self, top: &Layer, old: L2Mapping, kept: u64) -> Result<()> {
        let Some((first, last)) = old.host_range() else {
            return Ok(());
        };
        if first == kept {
            return Ok(());
        }
        let alloc = self.allocator()?;
        let cs = alloc.cs;
        for c in first / cs..=last / cs {
            let rc = alloc.get_refcount(top, c)?;
            if rc == 0 {
                return Err(DiskError::corrupt(
                    top.place(),
                    format!("cluster 0x{:x} is referenced but has refcount 0", c * cs),
                ));
            }
            alloc.set_refcount(top, c, rc - 1)?;
        }
        Ok(())
    }

    /// Syncs, stores the index checksum and marks the image clean.
    pub(crate) fn close(self, disk: &Disk) -> Result<()> {
        let top = disk.top();
        top.file.sync()?;
        let Some(mut h) = top.header() else {
            return Ok(());
        };
        if h.version < 3 {
            return Ok(());
        }
        if let Some(mut ext) = self.index {
            ext.crc32c = region_crc(top, &ext)?;
            h.set_chain_index(Some(ext));
            h.autoclear_features |= AUTOCLEAR_STRATA_INDEX;
        }
        h.incompatible_features &= !INCOMPAT_DIRTY;
        write_header(top, &h)?;
        // Writes the clean header through and syncs.
        top.file.set_write_back(false)
    }

    fn allocator(&mut self) -> Result<&mut Allocator> {
        self.alloc
            .as_mut()
            .ok_or_else(|| DiskError::Invalid("raw images have no allocator".into()))
    }
}

/// The top layer's current mapping of guest `cluster`.
fn top_mapping(top: &Layer, cluster: u64) -> Result<L2Mapping> {
    let mut raw = [0u64];
    top.read_l2_entries(cluster, &mut raw)?;
    top.decode_l2(raw[0])
}

/// Builds a fresh index for the top layer from the chain as it is now.
fn build_index(
    disk: &Disk,
    alloc: &mut Allocator,
    uuid: [u8; 16],
    known_owners: Option<&[u16]>,
) -> Result<ChainIndexExt> {
    let top = disk.top();
    let depth = disk.depth();
    let units = disk.units();
    let region_len = ChainIndexExt::region_len_for(disk.size(), disk.unit_bits, depth);
    let clusters = region_len.div_ceil(alloc.cs).max(1);
    // The region is not refcounted: to QEMU it is free space. Reuse the
    // previous region when it has the right size and nothing took it over.
    let previous = top.header().and_then(|h| h.chain_index().cloned());
    let region_offset = match previous {
        Some(p)
            if p.region_len == region_len
                && alloc.region_is_free(top, p.region_offset, clusters)? =>
        {
            p.region_offset
        }
        _ => alloc.reserve_unrefcounted(clusters),
    };
    let mut first = 0;
    while first < units {
        let count = (units - first).min(OWNER_CHUNK);
        let owners = match known_owners {
            Some(all) if all.len() as u64 == units => {
                all[first as usize..(first + count) as usize].to_vec()
            }
            _ => disk.owners(first, count as usize)?,
        };
        let bytes: Vec<u8> = owners.iter().flat_map(|o| o.to_be_bytes()).collect();
        top.file.write_all_at(&bytes, region_offset + first * 2)?;
        first += count;
    }
    let lineage: Vec<u8> = disk.layers()[..depth as usize - 1]
        .iter()
        .map(|l| l.identity().map(|i| i.encode()))
        .collect::<Result<Vec<_>>>()?
        .concat();
    debug_assert_eq!(
        lineage.len() as u64,
        u64::from(depth - 1) * LINEAGE_RECORD_BYTES
    );
    top.file.write_all_at(&lineage, region_offset + units * 2)?;
    // Pad the region to whole clusters so the file never ends mid-cluster.
    let pad_from = region_offset + region_len;
    let pad_to = region_offset + clusters * alloc.cs;
    if pad_to > pad_from {
        top.file
            .write_all_at(&vec![0u8; (pad_to - pad_from) as usize], pad_from)?;
    }
    Ok(ChainIndexExt {
        region_offset,
        region_len,
        depth,
        granularity_bits: disk.unit_bits,
        virtual_size: disk.size(),
        layer_uuid: uuid,
        crc32c: 0,
    })
}

/// Writes the index extension into the header, valid or not.
fn write_index_ext(top: &Layer, ext: &ChainIndexExt, valid: bool) -> Result<()> {
    let Some(mut h) = top.header() else {
        return Ok(());
    };
    h.set_chain_index(Some(ext.clone()));
    if valid {
        h.autoclear_features |= AUTOCLEAR_STRATA_INDEX;
    } else {
        h.autoclear_features &= !AUTOCLEAR_STRATA_INDEX;
    }
    write_header(top, &h)?;
    top.file.sync()
}

/// Encodes `h` into the first cluster and makes it the layer's header.
pub(crate) fn write_header(top: &Layer, h: &Header) -> Result<()> {
    let buf = h.encode().map_err(|e| DiskError::format(top.place(), e))?;
    top.file.write_all_at(&buf, 0)?;
    if let Some(q) = &top.qcow2 {
        *q.header.write() = h.clone();
    }
    Ok(())
}

/// Updates one entry of the top layer's L1 table, on disk and in memory.
fn set_l1_entry(top: &Layer, index: u64, raw: u64) -> Result<()> {
    let q = top
        .qcow2
        .as_ref()
        .ok_or_else(|| DiskError::Invalid("raw layer has no L1 table".into()))?;
    let (offset, size) = {
        let h = q.header.read();
        (h.l1_table_offset, u64::from(h.l1_size))
    };
    if index >= size {
        return Err(DiskError::corrupt(
            top.place(),
            format!("L1 index {index} beyond the L1 table ({size} entries)"),
        ));
    }
    top.with_l1(|_| ())?;
    top.file
        .write_all_at(&raw.to_be_bytes(), offset + index * 8)?;
    if let Some(l1) = q.l1.write().as_mut() {
        l1[index as usize] = raw;
    }
    Ok(())
}

/// A random UUID (version 4).
pub(crate) fn new_uuid() -> Result<[u8; 16]> {
    let mut u = [0u8; 16];
    getrandom::fill(&mut u)
        .map_err(|e| DiskError::Invalid(format!("no randomness for a layer UUID: {e}")))?;
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    Ok(u)
}

/// Cluster allocation and refcount upkeep for one qcow2 file. New clusters
/// are taken from the end of the file.
pub(crate) struct Allocator {
    pub(crate) cs: u64,
    order: u32,
    epb: u64,
    reftable: Vec<u64>,
    reftable_offset: u64,
    /// Entries of the on-disk refcount table.
    disk_capacity: u64,
    /// While relocating the table, entries are kept in memory only.
    relocating: bool,
    pub(crate) next_free: u64,
}

impl Allocator {
    pub(crate) fn load(top: &Layer) -> Result<Allocator> {
        let h = top
            .header()
            .ok_or_else(|| DiskError::Invalid("raw images have no refcounts".into()))?;
        let cs = h.cluster_size();
        // Bounded by MAX_REFTABLE_BYTES, checked when parsing the header.
        let bytes = u64::from(h.refcount_table_clusters) * cs;
        let mut buf = vec![0u8; bytes as usize];
        top.file.read_exact_at(&mut buf, h.refcount_table_offset)?;
        let mut reftable = Vec::with_capacity(buf.len() / 8);
        for (i, c) in buf.chunks_exact(8).enumerate() {
            let raw = u64::from_be_bytes(c.try_into().unwrap_or([0; 8]));
            let off = strata_format::entry::decode_reftable_entry(raw, cs).map_err(|e| {
                DiskError::corrupt(top.place(), format!("refcount table entry {i}: {e}"))
            })?;
            if off != 0 && off.saturating_add(cs) > top.file_len() {
                return Err(DiskError::corrupt(
                    top.place(),
                    format!("refcount block offset 0x{off:x} beyond end of file"),
                ));
            }
            reftable.push(off);
        }
        Ok(Allocator {
            cs,
            order: h.refcount_order,
            epb: refcount::entries_per_block(cs, h.refcount_order),
            disk_capacity: reftable.len() as u64,
            reftable,
            reftable_offset: h.refcount_table_offset,
            relocating: false,
            next_free: top.file_len().div_ceil(cs) * cs,
        })
    }

    /// Takes `n` contiguous clusters with refcount 1.
    pub(crate) fn alloc(&mut self, top: &Layer, n: u64) -> Result<u64> {
        let host = self.next_free;
        self.next_free += n * self.cs;
        for i in 0..n {
            self.set_refcount(top, host / self.cs + i, 1)?;
        }
        Ok(host)
    }

    /// Takes `n` clusters that stay at refcount 0 (the index region).
    fn reserve_unrefcounted(&mut self, n: u64) -> u64 {
        let at = self.next_free;
        self.next_free += n * self.cs;
        at
    }

    fn region_is_free(&self, top: &Layer, offset: u64, clusters: u64) -> Result<bool> {
        if !offset.is_multiple_of(self.cs)
            || offset + clusters * self.cs > top.file_len()
            || offset == 0
        {
            return Ok(false);
        }
        for c in offset / self.cs..offset / self.cs + clusters {
            if self.get_refcount(top, c)? != 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    pub(crate) fn get_refcount(&self, top: &Layer, cluster: u64) -> Result<u64> {
        let bi = cluster / self.epb;
        let block = self.reftable.get(bi as usize).copied().unwrap_or(0);
        if block == 0 {
            return Ok(0);
        }
        let (at, len) = refcount::entry_bytes(cluster % self.epb, self.order);
        let mut bytes = vec![0u8; len];
        top.file.read_exact_at(&mut bytes, block + at)?;
        Ok(refcount::get(&bytes, self.local_index(cluster), self.order))
    }

    pub(crate) fn set_refcount(&mut self, top: &Layer, cluster: u64, value: u64) -> Result<()> {
        if value > refcount::max_refcount(self.order) {
            return Err(DiskError::Invalid(format!(
                "refcount {value} does not fit {}-bit refcounts",
                1u32 << self.order
            )));
        }
        let block = self.block_for(top, cluster / self.epb)?;
        let (at, len) = refcount::entry_bytes(cluster % self.epb, self.order);
        let mut bytes = vec![0u8; len];
        top.file.read_exact_at(&mut bytes, block + at)?;
        refcount::set(&mut bytes, self.local_index(cluster), self.order, value);
        top.file.write_all_at(&bytes, block + at)
    }

    /// Index of `cluster`'s entry inside the bytes `entry_bytes` returns.
    fn local_index(&self, cluster: u64) -> u64 {
        if self.order < 3 {
            (cluster % self.epb) % (8 >> self.order)
        } else {
            0
        }
    }

    /// Offset of refcount block `bi`, allocating it (and growing the
    /// refcount table) when missing.
    fn block_for(&mut self, top: &Layer, bi: u64) -> Result<u64> {
        if let Some(&b) = self.reftable.get(bi as usize) {
            if b != 0 {
                return Ok(b);
            }
        }
        if bi >= self.reftable.len() as u64 {
            self.grow_table(top, bi + 1)?;
            // Growing may itself have allocated block `bi` (to count the
            // new table's own clusters): look again.
            return self.block_for(top, bi);
        }
        let block = self.next_free;
        self.next_free += self.cs;
        let own = block / self.cs;
        let mut buf = vec![0u8; self.cs as usize];
        if own / self.epb == bi {
            refcount::set(&mut buf, own % self.epb, self.order, 1);
        }
        top.file.write_all_at(&buf, block)?;
        self.reftable[bi as usize] = block;
        if !self.relocating && bi < self.disk_capacity {
            top.file
                .write_all_at(&block.to_be_bytes(), self.reftable_offset + bi * 8)?;
        }
        if own / self.epb != bi {
            self.set_refcount(top, own, 1)?;
        }
        Ok(block)
    }

    /// Moves the refcount table to a larger place at the end of the file.
    fn grow_table(&mut self, top: &Layer, min_entries: u64) -> Result<()> {
        let cs = self.cs;
        let want = min_entries.max(self.reftable.len() as u64 * 2);
        let clusters = (want * 8).div_ceil(cs);
        if clusters * cs > strata_format::MAX_REFTABLE_BYTES {
            return Err(DiskError::Invalid(
                "image too large: the refcount table would exceed 8 MiB".into(),
            ));
        }
        let new_offset = self.next_free;
        self.next_free += clusters * cs;
        let old_offset = self.reftable_offset;
        let old_clusters = (self.disk_capacity * 8).div_ceil(cs);
        let was_relocating = self.relocating;
        self.relocating = true;
        self.reftable.resize((clusters * cs / 8) as usize, 0);
        for c in 0..clusters {
            self.set_refcount(top, new_offset / cs + c, 1)?;
        }
        let bytes: Vec<u8> = self.reftable.iter().flat_map(|e| e.to_be_bytes()).collect();
        top.file.write_all_at(&bytes, new_offset)?;
        top.file.sync()?;
        let mut h = top
            .header()
            .ok_or_else(|| DiskError::Invalid("raw layer".into()))?;
        h.refcount_table_offset = new_offset;
        h.refcount_table_clusters = clusters as u32;
        write_header(top, &h)?;
        top.file.sync()?;
        self.reftable_offset = new_offset;
        self.disk_capacity = self.reftable.len() as u64;
        self.relocating = was_relocating;
        for c in 0..old_clusters {
            self.set_refcount(top, old_offset / cs + c, 0)?;
        }
        Ok(())
    }
}

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
//!
//! The writer takes the chain's shared state ([`crate::chain::Chain`]),
//! not the disk that owns it. Zero writes and discards are in [`zeroes`],
//! the chain index it keeps up to date in [`index`]; clusters come from
//! [`crate::allocator`].

use strata_format::entry::OFLAG_COPIED;
use strata_format::entry::{subcluster_mask, SUBCLUSTERS};
use strata_format::header::{AUTOCLEAR_STRATA_INDEX, INCOMPAT_CORRUPT, INCOMPAT_DIRTY};
use strata_format::index::{ChainIndexExt, ENTRY_BYTES};
use strata_format::{ExtendedL2, L2Mapping};

use std::collections::HashSet;
use std::sync::Arc;

use crate::allocator::Allocator;
use crate::cache::{Slot, PAGE_UNITS};
use crate::chain::Chain;
use crate::chain_index::region_crc;
use crate::error::{DiskError, Result};
use crate::header::{seal_layer, write_header};
use crate::layer::Layer;
use crate::overlap::Structure;

mod index;
mod zeroes;

/// State of an open writer.
pub(crate) struct Writer {
    /// `None` for a raw top layer.
    alloc: Option<Allocator>,
    /// The index region this writer maintains.
    index: Option<ChainIndexExt>,
    /// Guest clusters whose new top-layer cluster has been allocated but
    /// not yet published in the L2 table: their data is being written
    /// outside the lock. Another allocating write to one of them waits.
    in_flight: HashSet<u64, ahash::RandomState>,
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
    /// Extended L2 top layer: the write's subclusters go into host cluster
    /// `host` (the cluster's existing one, or a new one when `fresh`).
    /// Fill them with [`Chain::fill_subclusters`], then publish them with
    /// [`Writer::publish_subclusters`].
    FillSub {
        /// Host offset of the cluster in the top file.
        host: u64,
        /// Whether `host` was allocated for this write.
        fresh: bool,
        /// Subclusters the top layer had allocated when the write began:
        /// their bytes are current in `host` and must not be rewritten
        /// with older content.
        alloc: u32,
        /// The old entry is compressed: the whole cluster must be written.
        whole: bool,
    },
}

impl Writer {
    /// Prepares the top layer for writing.
    pub(crate) fn start(chain: &Chain) -> Result<Writer> {
        Writer::start_with_owners(chain, None)
    }

    /// [`Writer::start`] on a top a push just made, without syncing the
    /// dirty bit (nor the index's not-valid bit) first: that sync only
    /// orders the bits before metadata written in place, and in write-back
    /// mode metadata reaches the file only through
    /// [`crate::file::ImageFile::sync`], whose first `fdatasync` makes the
    /// bits durable. Until then the file on disk is the clean new top as
    /// its prepare synced it (or as the push rewrote it, if that reached
    /// the disk), plus data in clusters that nothing points at. This keeps
    /// a sync out of the snapshot's pause.
    pub(crate) fn start_on_new_top(chain: &Chain) -> Result<Writer> {
        Writer::start_inner(chain, None, false)
    }

    /// Like [`Writer::start`], but when a new index must be built it takes
    /// the owner of every unit from `owners` instead of walking the chain
    /// (a caller that just changed the chain under an open disk knows them).
    pub(crate) fn start_with_owners(chain: &Chain, owners: Option<&[u16]>) -> Result<Writer> {
        Writer::start_inner(chain, owners, true)
    }

    fn start_inner(chain: &Chain, owners: Option<&[u16]>, sync_dirty_bit: bool) -> Result<Writer> {
        let top = chain.top();
        let Some(header) = top.header() else {
            return Ok(Writer {
                alloc: None,
                index: None,
                in_flight: HashSet::default(),
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
        // Everything that can refuse the image is checked before the first
        // byte of it changes.
        let mut alloc = Allocator::load(top)?;
        let mut map = alloc.scan(top, chain.index.read().as_ref())?;
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
        if sync_dirty_bit || was_dirty {
            top.file.sync()?;
        }
        if was_dirty {
            crate::refcounts::repair_refcounts(top)?;
            alloc = Allocator::load(top)?;
            map = alloc.scan(top, chain.index.read().as_ref())?;
        }
        alloc.next_free = alloc.next_free.max(map.end());
        chain.metadata.replace(map);
        alloc.guard = Some(Arc::clone(&chain.metadata));
        let mut writer = Writer {
            alloc: Some(alloc),
            index: None,
            in_flight: HashSet::default(),
        };
        if h.version >= 3 {
            writer.attach_index(chain, owners, sync_dirty_bit)?;
            // The dirty bit is on disk: a crash between syncs is repaired
            // on the next open, so metadata may wait for the next sync.
            top.file.set_write_back(true)?;
        }
        Ok(writer)
    }

    pub(crate) fn write(&mut self, chain: &Chain, buf: &[u8], offset: u64) -> Result<()> {
        refuse_if_corrupt(chain)?;
        let top = chain.top();
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
            self.write_in_cluster(chain, cluster, pos - (cluster << cb), part, cs)?;
            pos = seg_end;
        }
        Ok(())
    }

    /// First step of an allocating write to guest `cluster`: decides
    /// between in place, wait, and a fresh cluster to fill outside the lock.
    ///
    /// `need` is the mask of subclusters the write touches (used only with
    /// extended L2 entries).
    pub(crate) fn prepare_alloc(
        &mut self,
        chain: &Chain,
        cluster: u64,
        need: u32,
    ) -> Result<AllocStep> {
        refuse_if_corrupt(chain)?;
        if self.in_flight.contains(&cluster) {
            return Ok(AllocStep::Busy);
        }
        let top = chain.top();
        if top.extended_l2() {
            let e = top_extended(top, cluster)?;
            let (host, fresh, whole) = match e.cluster {
                L2Mapping::Data {
                    host_offset,
                    copied: true,
                } => {
                    if need & !e.alloc == 0 {
                        return Ok(AllocStep::InPlace(host_offset));
                    }
                    (host_offset, false, false)
                }
                L2Mapping::Data { copied: false, .. } => {
                    return Err(shared_cluster(top, cluster));
                }
                L2Mapping::Compressed { .. } => {
                    self.check_replace(chain, cluster, &e.cluster)?;
                    (self.allocator()?.alloc(top, 1)?, true, true)
                }
                L2Mapping::Unallocated | L2Mapping::Zero { .. } => {
                    let cs = self.allocator()?.cs;
                    let host = self.allocator()?.alloc(top, 1)?;
                    // Only some subclusters get written now: reserve the
                    // whole cluster so the file stays in large extents.
                    top.file.preallocate(host, cs);
                    (host, true, false)
                }
            };
            self.in_flight.insert(cluster);
            return Ok(AllocStep::FillSub {
                host,
                fresh,
                alloc: e.alloc,
                whole,
            });
        }
        let old = top_mapping(top, cluster)?;
        if let L2Mapping::Data {
            host_offset,
            copied: true,
        } = old
        {
            return Ok(AllocStep::InPlace(host_offset));
        }
        self.check_replace(chain, cluster, &old)?;
        let host = self.allocator()?.alloc(top, 1)?;
        self.in_flight.insert(cluster);
        Ok(AllocStep::Fill { host, old })
    }

    /// First step of a write of whole clusters that need no copy-on-write:
    /// reserves the longest run of at most `max` guest clusters from
    /// `first` on (and in the L2 table of `first`) that the top layer maps to no host cluster (unallocated,
    /// or zero without a preallocated cluster) and no write has in flight,
    /// and allocates one contiguous host run for them, so their data goes
    /// to the file in one `pwrite`.
    ///
    /// Returns the host offset of the run and its length in clusters; a
    /// length of 0 (nothing allocated) when `first` itself does not
    /// qualify or the top layer has extended L2 entries or is raw. Each
    /// cluster of the run is then published with [`Writer::publish_alloc`]
    /// once the whole run's data is in the file (or given up with
    /// [`Writer::abort_alloc`]), so the same invariants as single-cluster
    /// allocating writes hold: no entry points at unwritten data.
    pub(crate) fn prepare_run(
        &mut self,
        chain: &Chain,
        first: u64,
        max: u64,
    ) -> Result<(u64, u64)> {
        refuse_if_corrupt(chain)?;
        let top = chain.top();
        if top.extended_l2() || top.cluster_bits().is_none() {
            return Ok((0, 0));
        }
        // One read for the entries of the run (it stays in one L2 table),
        // not one per cluster.
        let l2_entries = top.l2_entries();
        let max = max.min(l2_entries - first % l2_entries);
        let mut entries = vec![(0u64, 0u64); max as usize];
        top.read_l2_entries_with(first, &mut entries, &mut Vec::new())?;
        let mut count = 0;
        for &(raw, _) in &entries {
            let unmapped = matches!(
                top.decode_l2(raw)?,
                L2Mapping::Unallocated | L2Mapping::Zero { prealloc: None, .. }
            );
            if !unmapped || self.in_flight.contains(&(first + count)) {
                break;
            }
            count += 1;
        }
        if count == 0 {
            return Ok((0, 0));
        }
        let host = self.allocator()?.alloc(top, count)?;
        self.in_flight.extend(first..first + count);
        Ok((host, count))
    }

    /// Last step of an allocating write: points `cluster` at its filled
    /// `host` cluster and drops the reference of whatever it replaces.
    ///
    /// The replaced mapping is read again here rather than taken from
    /// [`AllocStep::Fill`]: a discard or zero write may have changed it
    /// meanwhile, and releasing a stale mapping would free a cluster twice.
    pub(crate) fn publish_alloc(&mut self, chain: &Chain, cluster: u64, host: u64) -> Result<()> {
        self.in_flight.remove(&cluster);
        let top = chain.top();
        let current = top_mapping(top, cluster)?;
        self.check_replace(chain, cluster, &current)?;
        self.set_l2(chain, cluster, L2Mapping::encode_data(host))?;
        self.release(chain, cluster, current, host)
    }

    /// Last step of an allocating write into an extended L2 top layer:
    /// marks subclusters `mask` allocated in `host` (their data is in the
    /// file) and drops whatever compressed cluster the entry replaces.
    ///
    /// The entry is read again: a zero write may have changed other
    /// subclusters meanwhile (discards and zero writes never free the host
    /// cluster of a cluster in flight, so it is still `host` or none).
    pub(crate) fn publish_subclusters(
        &mut self,
        chain: &Chain,
        cluster: u64,
        host: u64,
        mask: u32,
    ) -> Result<()> {
        self.in_flight.remove(&cluster);
        let top = chain.top();
        let cur = top_extended(top, cluster)?;
        if matches!(cur.cluster, L2Mapping::Compressed { .. }) {
            self.check_replace(chain, cluster, &cur.cluster)?;
        }
        let (alloc, zero) = match cur.host() {
            Some((h, _)) if h == host => (cur.alloc | mask, cur.zero & !mask),
            Some((h, _)) => {
                // Cannot happen while the cluster is in flight; refuse
                // rather than lose the subclusters `h` holds.
                return Err(DiskError::corrupt(
                    top.place(),
                    format!(
                        "L2 entry {cluster} changed host cluster (0x{h:x}, expected 0x{host:x}) \
                         during a write"
                    ),
                ));
            }
            // Compressed or no host: only our subclusters are allocated.
            None => (mask, cur.zero & !mask),
        };
        self.set_l2_ext(chain, cluster, ExtendedL2::encode(host, alloc, zero), mask)?;
        if matches!(cur.cluster, L2Mapping::Compressed { .. }) {
            self.release(chain, cluster, cur.cluster, host)?;
        }
        Ok(())
    }

    /// Gives up an allocating write into an extended L2 top layer: a host
    /// cluster allocated for it is freed; an existing one keeps its
    /// entry (the subclusters written are not marked allocated).
    pub(crate) fn abort_subclusters(
        &mut self,
        chain: &Chain,
        cluster: u64,
        host: u64,
        fresh: bool,
    ) -> Result<()> {
        self.in_flight.remove(&cluster);
        if fresh {
            self.free_cluster(chain.top(), host)?;
        }
        Ok(())
    }

    /// Gives up an allocating write whose fill failed: the new cluster is
    /// freed and the guest cluster keeps its old mapping.
    pub(crate) fn abort_alloc(&mut self, chain: &Chain, cluster: u64, host: u64) -> Result<()> {
        self.in_flight.remove(&cluster);
        self.free_cluster(chain.top(), host)
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
        chain: &Chain,
        cluster: u64,
        in_cluster: u64,
        data: &[u8],
        cs: u64,
    ) -> Result<()> {
        let top = chain.top();
        if top.extended_l2() {
            return self.write_in_cluster_ext(chain, cluster, in_cluster, data, cs);
        }
        let guest = cluster * cs + in_cluster;
        let old = top_mapping(top, cluster)?;
        if let L2Mapping::Data {
            host_offset,
            copied: true,
        } = old
        {
            return chain.write_guest_data(data, host_offset + in_cluster, guest);
        }
        self.check_replace(chain, cluster, &old)?;
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
        if let Err(e) = chain.fill_cluster(cluster, cb, in_cluster, data, old, host) {
            if reused.is_none() {
                self.free_cluster(top, host)?;
            }
            return Err(e);
        }
        let entry = L2Mapping::encode_data(host);
        self.set_l2(chain, cluster, entry)?;
        self.release(chain, cluster, old, host)?;
        Ok(())
    }

    /// The locked path of a write into an extended L2 top layer (the same
    /// steps as the unlocked one in [`crate::cow`], run in sequence).
    fn write_in_cluster_ext(
        &mut self,
        chain: &Chain,
        cluster: u64,
        in_cluster: u64,
        data: &[u8],
        cs: u64,
    ) -> Result<()> {
        let cb = cs.trailing_zeros();
        let need = chain.subcluster_span(in_cluster, data.len() as u64);
        match self.prepare_alloc(chain, cluster, need)? {
            AllocStep::InPlace(host) => {
                chain.write_guest_data(data, host + in_cluster, cluster * cs + in_cluster)
            }
            AllocStep::FillSub {
                host,
                fresh,
                alloc,
                whole,
            } => match chain.fill_subclusters(cluster, cb, in_cluster, data, host, alloc, whole) {
                Ok(mask) => self.publish_subclusters(chain, cluster, host, mask),
                Err(e) => self
                    .abort_subclusters(chain, cluster, host, fresh)
                    .and(Err(e)),
            },
            // The locked path cannot wait for an unlocked write without
            // deadlocking; only a partial zero write into a compressed
            // cluster that is being rewritten gets here.
            AllocStep::Busy => Err(DiskError::Invalid(format!(
                "guest cluster {cluster} is being written concurrently; retry"
            ))),
            AllocStep::Fill { .. } => Err(DiskError::Invalid(
                "unexpected allocation step for an extended L2 layer".into(),
            )),
        }
    }

    /// Writes the raw L2 entry of guest `cluster` in the top layer (8 or
    /// 16 bytes), allocating its L2 table if needed.
    fn write_l2_raw(&mut self, chain: &Chain, cluster: u64, word: u64, bitmap: u64) -> Result<()> {
        let top = chain.top();
        let cb = top.cluster_bits().unwrap_or(16);
        let l2_entries = top.l2_entries();
        let eb = top.l2_entry_bytes();
        let l1_index = cluster / l2_entries;
        let mut table = top.l2_table(l1_index)?;
        if table == 0 {
            let alloc = self.allocator()?;
            table = alloc.alloc(top, 1)?;
            chain.metadata.insert(table, 1 << cb, Structure::L2Table);
            top.file.write_all_at(&vec![0u8; 1 << cb], table)?;
            set_l1_entry(top, l1_index, table | OFLAG_COPIED)?;
        }
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&word.to_be_bytes());
        raw[8..].copy_from_slice(&bitmap.to_be_bytes());
        top.file
            .write_all_at(&raw[..eb as usize], table + (cluster % l2_entries) * eb)
    }

    /// Points guest cluster `cluster` of the top layer at `entry`, then
    /// updates the index and the cache.
    fn set_l2(&mut self, chain: &Chain, cluster: u64, entry: u64) -> Result<()> {
        let top = chain.top();
        let cb = top.cluster_bits().unwrap_or(16);
        self.write_l2_raw(chain, cluster, entry, 0)?;
        // Units of this cluster now belong to the top layer, or to nobody
        // when it was unallocated (only done without a backing file).
        let ub = chain.unit_bits;
        let first = (cluster << cb) >> ub;
        let last = (((cluster + 1) << cb).min(chain.size) >> ub).max(first + 1);
        debug_assert!(
            entry != 0 || chain.depth() == 1,
            "unallocating over a backing file"
        );
        let depth = if entry == 0 { 0 } else { chain.depth() as u16 };
        self.publish_units(chain, first, last, depth, entry, 0)
    }

    /// Writes the extended entry `(word, bitmap)` of guest `cluster`, then
    /// gives the units of subclusters `changed` to the top layer (or to
    /// nobody when they became unallocated, only done without a backing
    /// file). Units of other subclusters keep their owners: an unallocated
    /// subcluster still reads from the layer below that owns it.
    fn set_l2_ext(
        &mut self,
        chain: &Chain,
        cluster: u64,
        (word, bitmap): (u64, u64),
        changed: u32,
    ) -> Result<()> {
        let top = chain.top();
        let cb = top.cluster_bits().unwrap_or(16);
        let sb = top.subcluster_bits();
        self.write_l2_raw(chain, cluster, word, bitmap)?;
        let ub = chain.unit_bits;
        debug_assert!(sb >= ub, "subcluster smaller than the index unit");
        let held = (bitmap as u32) | ((bitmap >> 32) as u32);
        let mut rest = changed;
        while rest != 0 {
            // One run of consecutive changed subclusters with one new state.
            let lo = rest.trailing_zeros();
            let owned = held & (1 << lo) != 0;
            let mut hi = lo;
            while hi + 1 < SUBCLUSTERS
                && rest & (1 << (hi + 1)) != 0
                && (held & (1 << (hi + 1)) != 0) == owned
            {
                hi += 1;
            }
            rest &= !subcluster_mask(lo, hi);
            let start = (cluster << cb) + (u64::from(lo) << sb);
            if start >= chain.size {
                break;
            }
            let stop = ((cluster << cb) + (u64::from(hi + 1) << sb)).min(chain.size);
            let first = start >> ub;
            let last = stop.div_ceil(1 << ub);
            debug_assert!(
                owned || chain.depth() == 1,
                "unallocating a subcluster over a backing file"
            );
            let depth = if owned { chain.depth() as u16 } else { 0 };
            self.publish_units(chain, first, last, depth, word, bitmap)?;
        }
        Ok(())
    }

    /// Records `depth` as the owner of units `first..last` in the index
    /// and in cached pages, with the owner's raw entry.
    fn publish_units(
        &mut self,
        chain: &Chain,
        first: u64,
        last: u64,
        depth: u16,
        entry: u64,
        bitmap: u64,
    ) -> Result<()> {
        let top = chain.top();
        if let Some(ext) = &self.index {
            // A pushed top may still read these owners from below: copy
            // their sectors before changing them.
            chain.copy_index_span(ext, first * ENTRY_BYTES, last * ENTRY_BYTES)?;
            let owners: Vec<u8> = (first..last).flat_map(|_| depth.to_be_bytes()).collect();
            top.file
                .write_all_at(&owners, ext.region_offset + first * ENTRY_BYTES)?;
        }
        let mut unit = first;
        while unit < last {
            let page = unit / PAGE_UNITS;
            let page_end = last.min((page + 1) * PAGE_UNITS);
            chain.cache.update_if_cached(page, |slots| {
                for u in unit..page_end {
                    if let Some(s) = slots.get_mut((u - page * PAGE_UNITS) as usize) {
                        *s = Slot {
                            layer: depth,
                            entry,
                            bitmap,
                        };
                    }
                }
            });
            unit = page_end;
        }
        Ok(())
    }

    /// Refuses to replace the top layer's mapping `old` of guest `cluster`
    /// when that would drop the last reference to a host cluster holding
    /// metadata: its refcount would then free the metadata for reuse.
    /// Called before the L2 entry changes. A metadata cluster a repair
    /// counted twice (refcount 2) may lose the guest's reference.
    fn check_replace(&mut self, chain: &Chain, cluster: u64, old: &L2Mapping) -> Result<()> {
        let Some((first, last)) = old.host_range() else {
            return Ok(());
        };
        if chain.metadata.find(first, last - first + 1).is_none() {
            return Ok(());
        }
        let top = chain.top();
        let guest = cluster << top.cluster_bits().unwrap_or(16);
        let alloc = self.allocator()?;
        let cs = alloc.cs;
        for c in first / cs..=last / cs {
            if chain.metadata.find(c * cs, cs).is_some() && alloc.get_refcount(top, c)? <= 1 {
                return chain.metadata.check_release(top, c * cs, cs, guest);
            }
        }
        Ok(())
    }

    /// Drops the top layer's reference held by a replaced L2 entry, unless
    /// it is the cluster now reused (`kept`).
    fn release(&mut self, chain: &Chain, cluster: u64, old: L2Mapping, kept: u64) -> Result<()> {
        let Some((first, last)) = old.host_range() else {
            return Ok(());
        };
        if first == kept {
            return Ok(());
        }
        self.check_replace(chain, cluster, &old)?;
        let top = chain.top();
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

    /// The index region this writer maintains.
    pub(crate) fn index(&self) -> Option<&ChainIndexExt> {
        self.index.as_ref()
    }

    /// Syncs, stores the index checksum and marks the image clean.
    pub(crate) fn close(self, chain: &Chain) -> Result<()> {
        self.freeze(chain, true)?;
        seal_layer(chain.top())
    }

    /// Stops writing to the top without making it durable: its final
    /// header (clean, with the index checksum) is kept in memory only, so
    /// the layer reads and identifies itself as it will once sealed, while
    /// the file still says dirty until [`seal_layer`] writes it back. The
    /// frozen layer takes no more writes, so a seal any time later stores
    /// exactly what it holds now.
    ///
    /// With `crc_now` false the index checksum is left for the seal to
    /// compute ([`store_index_crc`]): the region is final from now on, and
    /// reading it back here would put its whole length inside a push's
    /// pause. The region must be whole either way: a top still reading
    /// owners from below (see [`crate::lazy_index`]) is refused.
    pub(crate) fn freeze(self, chain: &Chain, crc_now: bool) -> Result<()> {
        let top = chain.top();
        let Some(mut h) = top.header() else {
            return Ok(());
        };
        if h.version < 3 {
            return Ok(());
        }
        if let Some(mut ext) = self.index {
            let pending = chain.index_copy_pending();
            if pending > 0 {
                return Err(DiskError::Invalid(format!(
                    "{}: {pending} index sectors are still read from the layer below; \
                     copy them (Disk::complete_index_copy) before closing or freezing",
                    top.path().display()
                )));
            }
            ext.crc32c = if crc_now { region_crc(top, &ext)? } else { 0 };
            h.set_chain_index(Some(ext));
            h.autoclear_features |= AUTOCLEAR_STRATA_INDEX;
        }
        h.incompatible_features &= !INCOMPAT_DIRTY;
        if let Some(q) = &top.qcow2 {
            *q.header.write() = h;
        }
        Ok(())
    }

    fn allocator(&mut self) -> Result<&mut Allocator> {
        self.alloc
            .as_mut()
            .ok_or_else(|| DiskError::Invalid("raw images have no allocator".into()))
    }
}

/// The top layer's current mapping of guest `cluster` (standard entries).
fn top_mapping(top: &Layer, cluster: u64) -> Result<L2Mapping> {
    top.decode_l2(top.read_l2_entry(cluster)?.0)
}

/// The top layer's current extended entry of guest `cluster`.
fn top_extended(top: &Layer, cluster: u64) -> Result<ExtendedL2> {
    let (entry, bitmap) = top.read_l2_entry(cluster)?;
    top.decode_extended(cluster, entry, bitmap)
}

/// A shared (refcount > 1) host cluster in an extended L2 top layer: only
/// internal snapshots make those, and Strata does not write such images.
fn shared_cluster(top: &Layer, cluster: u64) -> DiskError {
    DiskError::Unsupported {
        place: top.place().clone(),
        detail: format!(
            "L2 entry {cluster}: writing into a shared cluster of an extended L2 layer"
        ),
    }
}

/// Refuses any change to an image marked corrupt by a refused write over
/// its metadata in this session.
fn refuse_if_corrupt(chain: &Chain) -> Result<()> {
    chain.metadata.refuse_if_corrupt(chain.top())
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

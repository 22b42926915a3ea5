//! A new top's chain index, copied from the layer below after the push
//! instead of before it.
//!
//! A top pushed under a running disk (see [`crate::live`]) starts with the
//! same owners as the top it froze: every unit keeps its owner until the
//! new top writes it. So instead of copying the frozen top's index region
//! into the new file before the switch (52.8 MB for 50 GiB of 2 KiB
//! subclusters, most of it changing again within a second under random
//! writes), the new top reads the owners of each 4 KiB sector of its
//! region from the frozen layer until that sector is copied. A sector is
//! copied the first time the writer publishes an owner in it
//! (copy-on-write), or by [`crate::Disk::copy_index_rest`], which the daemon
//! runs in the background; once every sector is copied the top's region
//! is whole and this state is dropped.
//!
//! Invariants:
//! - the frozen layer's region never changes (it takes no more writes), so
//!   a sector read from it is what the copy would hold;
//! - a sector is marked copied only after its bytes are in the top's file
//!   (the writer's mutex orders the copy, the publish and the mark);
//! - the top's region is whole before anything reads it as a whole: its
//!   checksum at close or freeze, a chain change that renumbers layers.
//!   [`crate::Disk::complete_index_copy`] runs first on each of those paths.

use std::sync::atomic::{AtomicU64, Ordering};

use strata_format::index::{ChainIndexExt, ENTRY_BYTES};

use crate::error::{DiskError, Result};
use crate::layer::Layer;

/// Bytes per sector of an index region: the unit copied and tracked.
const SECTOR: u64 = 4096;

/// Sectors copied per write (and per hold of the writer's mutex) by the
/// background copy.
const COPY_RUN: u64 = 64;

/// The part of a top's index region still to be copied from below.
#[derive(Debug)]
pub(crate) struct LazyIndex {
    /// 0-based chain position of the frozen layer the owners come from.
    source: usize,
    /// That layer's index region.
    from: ChainIndexExt,
    /// Owner bytes of the top's region (its lineage follows them and was
    /// written whole at the push).
    owner_bytes: u64,
    /// One bit per sector of the top's owner bytes, set once copied.
    copied: Vec<AtomicU64>,
    /// Sectors not copied yet.
    left: AtomicU64,
    /// Where the background copy looks next.
    cursor: AtomicU64,
}

impl LazyIndex {
    /// The state of a top at `top_ext` whose owners are all still those of
    /// the frozen layer at chain position `source`, region `from`.
    pub(crate) fn new(source: usize, from: ChainIndexExt, top_ext: &ChainIndexExt) -> LazyIndex {
        let owner_bytes = top_ext.entry_count() * ENTRY_BYTES;
        let sectors = owner_bytes.div_ceil(SECTOR);
        LazyIndex {
            source,
            from,
            owner_bytes,
            copied: (0..sectors.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            left: AtomicU64::new(sectors),
            cursor: AtomicU64::new(0),
        }
    }

    fn sectors(&self) -> u64 {
        self.owner_bytes.div_ceil(SECTOR)
    }

    fn is_copied(&self, sector: u64) -> bool {
        self.copied[(sector / 64) as usize].load(Ordering::Acquire) & (1 << (sector % 64)) != 0
    }

    fn mark_copied(&self, sector: u64) {
        let bit = 1 << (sector % 64);
        let old = self.copied[(sector / 64) as usize].fetch_or(bit, Ordering::AcqRel);
        if old & bit == 0 {
            self.left.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Sectors still to copy.
    pub(crate) fn left(&self) -> u64 {
        self.left.load(Ordering::Acquire)
    }

    /// The owner bytes `at..at + buf.len()` of the top's region as the
    /// frozen layer holds them: its bytes where it has owners, zeros for
    /// units a grown disk added.
    fn read_source(&self, layers: &[Layer], buf: &mut [u8], at: u64) -> Result<()> {
        let from_bytes = self.from.entry_count() * ENTRY_BYTES;
        let have = from_bytes.saturating_sub(at).min(buf.len() as u64) as usize;
        if have > 0 {
            layers[self.source]
                .file
                .read_exact_at(&mut buf[..have], self.from.region_offset + at)?;
        }
        buf[have..].fill(0);
        Ok(())
    }

    /// Byte range of owner bytes in sectors `first..last`.
    fn owner_span(&self, first: u64, last: u64) -> (u64, u64) {
        (first * SECTOR, (last * SECTOR).min(self.owner_bytes))
    }

    /// Reads owner bytes `at..at + buf.len()` of the top's index region
    /// `ext` in the chain of `layers`: copied sectors from the top, the
    /// others from the frozen layer below.
    pub(crate) fn read_owners(
        &self,
        layers: &[Layer],
        ext: &ChainIndexExt,
        buf: &mut [u8],
        at: u64,
    ) -> Result<()> {
        let top = top_of(layers)?;
        let end = at + buf.len() as u64;
        let mut pos = at;
        while pos < end {
            let sector = pos / SECTOR;
            let copied = self.is_copied(sector);
            // A run of sectors in the same state, read in one call.
            let mut run_end = ((sector + 1) * SECTOR).min(end);
            while run_end < end && self.is_copied(run_end / SECTOR) == copied {
                run_end = ((run_end / SECTOR + 1) * SECTOR).min(end);
            }
            let part = &mut buf[(pos - at) as usize..(run_end - at) as usize];
            if copied {
                top.file.read_exact_at(part, ext.region_offset + pos)?;
            } else {
                self.read_source(layers, part, pos)?;
            }
            pos = run_end;
        }
        Ok(())
    }

    /// Copies the sectors of the top's region `ext` holding owner bytes
    /// `start..end` that are not copied yet. The caller holds the writer's
    /// mutex.
    pub(crate) fn copy_span(
        &self,
        layers: &[Layer],
        ext: &ChainIndexExt,
        start: u64,
        end: u64,
    ) -> Result<()> {
        if end <= start {
            return Ok(());
        }
        let first = start / SECTOR;
        let last = (end - 1) / SECTOR + 1;
        if (first..last).all(|s| self.is_copied(s)) {
            return Ok(());
        }
        self.copy_sectors(layers, ext, first, last).map(drop)
    }

    /// Copies the not-yet-copied sectors among `first..last`, in runs.
    /// Returns how many it copied.
    fn copy_sectors(
        &self,
        layers: &[Layer],
        ext: &ChainIndexExt,
        first: u64,
        last: u64,
    ) -> Result<u64> {
        let top = top_of(layers)?;
        let mut buf = Vec::new();
        let mut copied = 0;
        let mut s = first;
        while s < last {
            if self.is_copied(s) {
                s += 1;
                continue;
            }
            let mut e = s + 1;
            while e < last && e - s < COPY_RUN && !self.is_copied(e) {
                e += 1;
            }
            let (from, to) = self.owner_span(s, e);
            buf.resize((to - from) as usize, 0);
            self.read_source(layers, &mut buf, from)?;
            top.file.write_all_at(&buf, ext.region_offset + from)?;
            for k in s..e {
                self.mark_copied(k);
            }
            copied += e - s;
            s = e;
        }
        Ok(copied)
    }

    /// Copies up to `max_sectors` more sectors of the top's region `ext`,
    /// in runs, calling `lock` for the writer's mutex and holding it for
    /// one run at a time, while I/O goes on.
    pub(crate) fn copy_some<G>(
        &self,
        layers: &[Layer],
        ext: &ChainIndexExt,
        max_sectors: u64,
        lock: impl Fn() -> G,
    ) -> Result<()> {
        let sectors = self.sectors();
        let mut budget = max_sectors;
        while budget > 0 && self.left() > 0 {
            let start = self.cursor.load(Ordering::Relaxed) % sectors.max(1);
            let Some(s) = (start..sectors)
                .chain(0..start)
                .find(|&s| !self.is_copied(s))
            else {
                break;
            };
            let e = (s + COPY_RUN.min(budget)).min(sectors);
            let copied = {
                let _writer = lock();
                self.copy_sectors(layers, ext, s, e)?
            };
            self.cursor.store(e, Ordering::Relaxed);
            budget -= copied.min(budget);
        }
        Ok(())
    }
}

/// The top of a chain's `layers`.
fn top_of(layers: &[Layer]) -> Result<&Layer> {
    layers
        .last()
        .ok_or_else(|| DiskError::Chain("a chain without layers has no index".into()))
}

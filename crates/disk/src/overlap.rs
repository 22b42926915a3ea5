//! Metadata-overlap protection, as QEMU's `overlap-check` does it.
//!
//! A damaged image may map a guest cluster onto one of its own metadata
//! clusters (an L2 entry pointing at the refcount table, an L1 entry
//! pointing at the L1 table). A guest write there would then overwrite
//! the image's metadata with guest bytes and turn a small corruption into
//! a lost image. So while a qcow2 top layer is open for writing, the set
//! of host clusters holding its metadata is kept here, and every guest
//! data write looks its host cluster up first (one hash lookup).
//!
//! On a hit nothing is written: the image is marked corrupt on disk
//! (`INCOMPAT_CORRUPT`, as QEMU does), the write fails, and so does every
//! later write of this session. Reads go on.
//!
//! The set is built when the writer starts, from what is cheap to read:
//! the header, the L1 table, the L2 table offsets the L1 table names, the
//! refcount table and its blocks, and the chain index region in use. The
//! L2 tables' entries are not read. Structures beyond the end of the
//! file, unaligned, or overlapping each other make the writer refuse the
//! image, before it changes a byte of it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;
use strata_format::entry::L1Entry;
use strata_format::header::{Header, HeaderExtension, EXT_BITMAPS, INCOMPAT_CORRUPT};
use strata_format::index::ChainIndexExt;

use crate::error::{DiskError, Result};
use crate::header::write_header;
use crate::layer::Layer;

/// What a metadata cluster holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Structure {
    /// The header cluster (header, extensions, backing file name).
    Header,
    /// The active L1 table.
    L1Table,
    /// An L2 table.
    L2Table,
    /// The refcount table.
    RefcountTable,
    /// A refcount block.
    RefcountBlock,
    /// The Strata chain index region.
    ChainIndex,
    /// The persistent bitmaps' directory (QEMU checks it too).
    BitmapDirectory,
}

impl Structure {
    /// How messages name it.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Structure::Header => "the image header",
            Structure::L1Table => "the L1 table",
            Structure::L2Table => "an L2 table",
            Structure::RefcountTable => "the refcount table",
            Structure::RefcountBlock => "a refcount block",
            Structure::ChainIndex => "the chain index region",
            Structure::BitmapDirectory => "the bitmap directory",
        }
    }
}

/// Host clusters holding metadata in one qcow2 file.
#[derive(Debug, Default)]
pub(crate) struct MetadataMap {
    cluster_bits: u32,
    clusters: HashMap<u64, Structure, ahash::RandomState>,
}

impl MetadataMap {
    /// An empty map for a file of `2^cluster_bits`-byte clusters.
    pub(crate) fn new(cluster_bits: u32) -> MetadataMap {
        MetadataMap {
            cluster_bits,
            clusters: HashMap::default(),
        }
    }

    /// Clusters `first..=last` covering `[offset, offset + len)`, or `None`
    /// for an empty range or an empty map.
    fn span(&self, offset: u64, len: u64) -> Option<std::ops::RangeInclusive<u64>> {
        if len == 0 || self.clusters.is_empty() {
            return None;
        }
        let last = offset.saturating_add(len - 1) >> self.cluster_bits;
        Some((offset >> self.cluster_bits)..=last)
    }

    /// The first metadata cluster in `[offset, offset + len)` (its host
    /// offset and what it holds).
    pub(crate) fn find(&self, offset: u64, len: u64) -> Option<(u64, Structure)> {
        let span = self.span(offset, len)?;
        span.into_iter()
            .find_map(|c| self.clusters.get(&c).map(|s| (c << self.cluster_bits, *s)))
    }

    /// Records `[offset, offset + len)` as holding `what`.
    pub(crate) fn insert(&mut self, offset: u64, len: u64, what: Structure) {
        if len == 0 {
            return;
        }
        let last = offset.saturating_add(len - 1) >> self.cluster_bits;
        for c in offset >> self.cluster_bits..=last {
            self.clusters.insert(c, what);
        }
    }

    /// Forgets `[offset, offset + len)` (a structure moved away).
    pub(crate) fn remove(&mut self, offset: u64, len: u64) {
        if let Some(span) = self.span(offset, len) {
            for c in span {
                self.clusters.remove(&c);
            }
        }
    }

    /// First byte past the highest metadata cluster.
    pub(crate) fn end(&self) -> u64 {
        self.clusters
            .keys()
            .max()
            .map_or(0, |c| (c + 1) << self.cluster_bits)
    }
}

/// The metadata map of the top layer being written, shared by the
/// writer (which updates it) and the unlocked write path (which reads it).
#[derive(Debug, Default)]
pub(crate) struct Guard {
    map: RwLock<MetadataMap>,
    /// A write over metadata was refused: the image is marked corrupt and
    /// takes no more writes.
    corrupt: AtomicBool,
}

impl Guard {
    /// Installs the map of a top layer whose writer just started.
    pub(crate) fn replace(&self, map: MetadataMap) {
        *self.map.write() = map;
        self.corrupt.store(false, Ordering::Release);
    }

    /// Records new metadata clusters.
    pub(crate) fn insert(&self, offset: u64, len: u64, what: Structure) {
        self.map.write().insert(offset, len, what);
    }

    /// Forgets metadata clusters that were freed.
    pub(crate) fn remove(&self, offset: u64, len: u64) {
        self.map.write().remove(offset, len);
    }

    /// The first metadata cluster in `[offset, offset + len)`.
    pub(crate) fn find(&self, offset: u64, len: u64) -> Option<(u64, Structure)> {
        self.map.read().find(offset, len)
    }

    /// Whether a write over metadata was refused in this session.
    pub(crate) fn is_corrupt(&self) -> bool {
        self.corrupt.load(Ordering::Acquire)
    }
}

impl Guard {
    /// Refuses a guest write of `len` bytes at guest `guest` that would
    /// land on metadata of `top` at `host` (marking the image corrupt),
    /// and every write after such a refusal.
    pub(crate) fn check_data_write(
        &self,
        top: &Layer,
        host: u64,
        len: u64,
        guest: u64,
    ) -> Result<()> {
        if self.is_corrupt() {
            return Err(already_corrupt(top));
        }
        let Some((cluster, what)) = self.find(host, len) else {
            return Ok(());
        };
        let guest_at = guest + cluster.saturating_sub(host);
        let marked = self.mark_corrupt(top);
        Err(DiskError::corrupt(
            top.place(),
            format!(
                "guest write at 0x{guest_at:x} maps to host cluster 0x{cluster:x}, which holds \
                 {}; refusing to write over metadata ({marked}; run `strata img check -r all`)",
                what.describe()
            ),
        ))
    }

    /// Refuses to drop a reference to host clusters `[host, host + len)`
    /// of `top` (for guest offset `guest`) that hold metadata: the
    /// refcount would then free the metadata for reuse.
    pub(crate) fn check_release(&self, top: &Layer, host: u64, len: u64, guest: u64) -> Result<()> {
        let Some((cluster, what)) = self.find(host, len) else {
            return Ok(());
        };
        let marked = self.mark_corrupt(top);
        Err(DiskError::corrupt(
            top.place(),
            format!(
                "guest cluster at 0x{guest:x} maps to host cluster 0x{cluster:x}, which holds \
                 {}; refusing to release it ({marked}; run `strata img check -r all`)",
                what.describe()
            ),
        ))
    }

    /// Refuses any change to `top` once a write over its metadata was
    /// refused in this session.
    pub(crate) fn refuse_if_corrupt(&self, top: &Layer) -> Result<()> {
        if self.is_corrupt() {
            return Err(already_corrupt(top));
        }
        Ok(())
    }

    /// Sets the corrupt bit in the header of `top`, on disk, once.
    /// Returns what the message says about it.
    fn mark_corrupt(&self, top: &Layer) -> String {
        if self.corrupt.swap(true, Ordering::AcqRel) {
            return "image marked corrupt".into();
        }
        let Some(mut h) = top.header() else {
            return "raw image".into();
        };
        h.incompatible_features |= INCOMPAT_CORRUPT;
        let written = write_header(top, &h).and_then(|()| top.file.sync());
        match written {
            Ok(()) => "image marked corrupt".into(),
            Err(e) => format!("marking the image corrupt failed too: {e}"),
        }
    }
}

/// The error of every write to `top` after a refused one.
fn already_corrupt(top: &Layer) -> DiskError {
    DiskError::corrupt(
        top.place(),
        "a write over metadata was refused earlier and the image is marked corrupt; \
         no more writes in this session (run `strata img check -r all`)",
    )
}

/// Builds the metadata map of `top` from its header `h`, its refcount
/// table `reftable` (block offsets, 0 = none) and the chain index region
/// in use (if any). Refuses structures that lie beyond the end of the
/// file, are not cluster aligned, or overlap one another.
pub(crate) fn scan(
    top: &Layer,
    h: &Header,
    reftable: &[u64],
    index: Option<&ChainIndexExt>,
) -> Result<MetadataMap> {
    let mut scan = Scan {
        top,
        cs: h.cluster_size(),
        map: MetadataMap::new(h.cluster_bits),
    };
    scan.claim(0, scan.cs, Structure::Header, "header".into())?;
    scan.claim(
        h.l1_table_offset,
        u64::from(h.l1_size) * 8,
        Structure::L1Table,
        "L1 table".into(),
    )?;
    scan.claim(
        h.refcount_table_offset,
        u64::from(h.refcount_table_clusters) * scan.cs,
        Structure::RefcountTable,
        "refcount table".into(),
    )?;
    for (i, &block) in reftable.iter().enumerate() {
        if block != 0 {
            let what = format!("refcount block {i}");
            scan.claim(block, scan.cs, Structure::RefcountBlock, what)?;
        }
    }
    let l1 = top.with_l1(|l1| l1.to_vec())?;
    for (i, raw) in l1.into_iter().enumerate() {
        let entry =
            L1Entry::decode(raw, scan.cs).map_err(|e| scan.refuse(format!("L1 entry {i}: {e}")))?;
        if entry.l2_offset != 0 {
            let what = format!("L2 table of L1 entry {i}");
            scan.claim(entry.l2_offset, scan.cs, Structure::L2Table, what)?;
        }
    }
    if let Some(ext) = index {
        let len = ext.region_len.div_ceil(scan.cs) * scan.cs;
        let what = "chain index region".to_string();
        scan.claim(ext.region_offset, len, Structure::ChainIndex, what)?;
    }
    if let Some((offset, len)) = bitmap_directory(h) {
        let what = "bitmap directory".to_string();
        scan.claim(offset, len, Structure::BitmapDirectory, what)?;
    }
    Ok(scan.map)
}

/// Offset and length of the persistent bitmaps' directory, from the
/// bitmaps header extension (`None`: no bitmaps, or an extension too
/// short to name one, which the writer then treats as having none).
fn bitmap_directory(h: &Header) -> Option<(u64, u64)> {
    let data = h.extensions.iter().find_map(|e| match e {
        HeaderExtension::Other { kind, data } if *kind == EXT_BITMAPS => Some(data),
        _ => None,
    })?;
    let field = |at: usize| -> Option<u64> {
        let bytes: [u8; 8] = data.get(at..at + 8)?.try_into().ok()?;
        Some(u64::from_be_bytes(bytes))
    };
    let count = u32::from_be_bytes(data.get(0..4)?.try_into().ok()?);
    let (len, offset) = (field(8)?, field(16)?);
    (count > 0 && len > 0).then_some((offset, len))
}

/// State of [`scan`].
struct Scan<'a> {
    top: &'a Layer,
    cs: u64,
    map: MetadataMap,
}

impl Scan<'_> {
    /// Adds `[offset, offset + len)` (named `what`) to the map, checking it.
    fn claim(&mut self, offset: u64, len: u64, kind: Structure, what: String) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if !offset.is_multiple_of(self.cs) {
            return Err(self.refuse(format!(
                "{what} at 0x{offset:x} is not aligned to the cluster size ({})",
                self.cs
            )));
        }
        let file_len = self.top.file_len();
        if offset.checked_add(len).is_none_or(|end| end > file_len) {
            return Err(self.refuse(format!(
                "{what} at 0x{offset:x} ({len} bytes) lies beyond the end of the file (0x{file_len:x})"
            )));
        }
        if let Some((at, other)) = self.map.find(offset, len) {
            return Err(self.refuse(format!(
                "{what} at 0x{offset:x} overlaps {} (host cluster 0x{at:x})",
                other.describe()
            )));
        }
        self.map.insert(offset, len, kind);
        Ok(())
    }

    /// The error refusing to write the image.
    fn refuse(&self, problem: String) -> DiskError {
        DiskError::corrupt(
            self.top.place(),
            format!(
                "{problem}; refusing to open the image for writing (it can still be opened \
                 read-only; `strata img check -r all` reports the damage and repairs what it can)"
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_reports_the_first_metadata_cluster_of_a_range() {
        let mut map = MetadataMap::new(16);
        map.insert(0x30000, 0x10000, Structure::RefcountTable);
        map.insert(0x50000, 0x20000, Structure::ChainIndex);
        assert_eq!(map.find(0x20000, 0x10000), None);
        assert_eq!(
            map.find(0x2f000, 0x2000),
            Some((0x30000, Structure::RefcountTable))
        );
        assert_eq!(map.find(0x60000, 1), Some((0x60000, Structure::ChainIndex)));
        assert_eq!(map.end(), 0x70000);
        map.remove(0x50000, 0x20000);
        assert_eq!(map.find(0x50000, 0x20000), None);
        assert_eq!(map.end(), 0x40000);
        assert_eq!(map.find(u64::MAX - 10, 100), None);
    }
}

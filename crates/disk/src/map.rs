//! Allocation map with the owning layer, as `qemu-img map` (QEMU 10)
//! reports it: for every guest range, the first layer from the top that
//! holds data or zeros there, its depth, and where the bytes are in its
//! file; neighbouring ranges merge exactly when qemu-img merges them.

use std::os::unix::io::AsRawFd;

use strata_format::L2Mapping;

use crate::cache::PAGE_UNITS;
use crate::disk::Disk;
use crate::error::{DiskError, Result};
use crate::layer::Layer;

/// One run of guest bytes with the same owner and kind. The fields up to
/// `offset` are qemu-img's, in its order; `layer` and `filename` are
/// Strata's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MapExtent {
    /// Guest offset.
    pub start: u64,
    /// Bytes.
    pub length: u64,
    /// Layers above the one that answered (0 = top), as qemu-img counts.
    pub depth: u32,
    /// Some layer holds this range (data or zeros).
    pub present: bool,
    /// Reads as zeros.
    pub zero: bool,
    /// Has data (not a zero cluster).
    pub data: bool,
    /// Stored compressed.
    pub compressed: bool,
    /// Host offset in the owner's file, when qemu-img reports one: data
    /// clusters, preallocated zero clusters, raw files (also their holes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Owning layer counted from the base (1); 0 when no layer has it.
    pub layer: u32,
    /// The file `offset` is in (qemu-img names a file only with an offset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
}

impl MapExtent {
    /// Whether `next` continues this extent in qemu-img's terms (its
    /// `entry_mergeable`): same kind, depth and file, and contiguous in
    /// the file when there is an offset.
    pub fn mergeable(&self, next: &MapExtent) -> bool {
        self.length > 0
            && self.start + self.length == next.start
            && self.zero == next.zero
            && self.data == next.data
            && self.compressed == next.compressed
            && self.depth == next.depth
            && self.present == next.present
            && self.filename == next.filename
            && match (self.offset, next.offset) {
                (Some(a), Some(b)) => a + self.length == b,
                (None, None) => true,
                _ => false,
            }
    }
}

/// Extents merged as they are produced.
struct Merger(Vec<MapExtent>);

impl Merger {
    fn push(&mut self, ext: MapExtent) {
        match self.0.last_mut() {
            Some(prev) if prev.mergeable(&ext) => prev.length += ext.length,
            _ => self.0.push(ext),
        }
    }
}

/// The allocation map of the whole disk.
pub fn map(disk: &Disk) -> Result<Vec<MapExtent>> {
    let mut out = Merger(Vec::new());
    let unit = disk.unit_size();
    let units = disk.units();
    let page_bytes = PAGE_UNITS * unit;
    let mut cursor = disk.data_cursor();
    let mut page_no = 0;
    while page_no * PAGE_UNITS < units {
        // Skip whole pages that no layer maps: they read as zeros.
        let start = page_no * page_bytes;
        let next = disk.next_possible_data(&mut cursor, start)?;
        if next >= start + page_bytes {
            let skip_to = (next / page_bytes).max(page_no + 1);
            let end = (skip_to * page_bytes).min(disk.size());
            // No L2 table there: no host cluster to report either.
            unowned(disk, start, end - start, false, &mut out)?;
            page_no = skip_to;
            continue;
        }
        let slots = disk.chain.resolve_page(page_no)?;
        for (i, slot) in slots.iter().enumerate() {
            let start = (page_no * PAGE_UNITS + i as u64) * unit;
            if start >= disk.size() {
                break;
            }
            let length = unit.min(disk.size() - start);
            if slot.layer == 0 {
                unowned(disk, start, length, true, &mut out)?;
            } else {
                owned(
                    disk,
                    slot.layer,
                    (slot.entry, slot.bitmap),
                    start,
                    length,
                    &mut out,
                )?;
            }
        }
        page_no += 1;
    }
    Ok(out.0)
}

/// What one layer says about guest offset `pos` (qemu's block status).
enum Status {
    /// Data, at `offset` in the file unless compressed.
    Data {
        offset: Option<u64>,
        compressed: bool,
    },
    /// Zeros; a preallocated cluster has an offset.
    Zero { offset: Option<u64> },
    /// Not here: ask the backing file. An extended L2 cluster that has a
    /// host cluster but not this subcluster still reports its offset.
    Unallocated { offset: Option<u64> },
}

/// Block status of qcow2 layer `layer` at `pos`, given its L2 entry.
fn status(layer: &Layer, (entry, bitmap): (u64, u64), pos: u64) -> Result<Status> {
    let cb = layer
        .cluster_bits()
        .ok_or_else(|| DiskError::Invalid("block status of a raw layer".into()))?;
    let in_cluster = pos & ((1 << cb) - 1);
    if !layer.extended_l2() {
        return Ok(match layer.decode_l2(entry)? {
            L2Mapping::Data { host_offset, .. } => Status::Data {
                offset: Some(host_offset + in_cluster),
                compressed: false,
            },
            L2Mapping::Compressed { .. } => Status::Data {
                offset: None,
                compressed: true,
            },
            L2Mapping::Zero { prealloc, .. } => Status::Zero {
                offset: prealloc.map(|h| h + in_cluster),
            },
            L2Mapping::Unallocated => Status::Unallocated { offset: None },
        });
    }
    let e = layer.decode_extended(pos >> cb, entry, bitmap)?;
    if let L2Mapping::Compressed { .. } = e.cluster {
        return Ok(Status::Data {
            offset: None,
            compressed: true,
        });
    }
    let offset = e.host().map(|(h, _)| h + in_cluster);
    let bit = 1u32 << ((in_cluster >> layer.subcluster_bits()) % 32);
    Ok(if e.alloc & bit != 0 {
        Status::Data {
            offset,
            compressed: false,
        }
    } else if e.zero & bit != 0 {
        Status::Zero { offset }
    } else {
        Status::Unallocated { offset }
    })
}

/// Adds `[start, start + length)`, owned by `owner` (1 = base), to `out`.
fn owned(
    disk: &Disk,
    owner: u16,
    entry: (u64, u64),
    start: u64,
    length: u64,
    out: &mut Merger,
) -> Result<()> {
    let layer = &disk.layers()[owner as usize - 1];
    let base = MapExtent {
        start,
        length,
        depth: disk.depth() - u32::from(owner),
        present: true,
        zero: false,
        data: false,
        compressed: false,
        offset: None,
        layer: u32::from(owner),
        filename: None,
    };
    if layer.cluster_bits().is_none() {
        return raw_extents(layer, base, out);
    }
    let mut e = base;
    match status(layer, entry, start)? {
        Status::Data { offset, compressed } => {
            e.data = true;
            e.compressed = compressed;
            e.offset = offset;
        }
        Status::Zero { offset } => {
            e.zero = true;
            e.offset = offset;
        }
        // The cache names the owner of the unit; a layer that does not
        // hold it cannot own it.
        Status::Unallocated { .. } => {
            return Err(DiskError::Invalid(format!(
                "{}: guest offset 0x{start:x} is owned by a layer that does not map it",
                layer.path().display()
            )))
        }
    }
    if e.offset.is_some() {
        e.filename = Some(layer.path().display().to_string());
    }
    out.push(e);
    Ok(())
}

/// A range of a raw layer: data where its file has data, zeros over its
/// holes (qemu asks the host file with SEEK_DATA/SEEK_HOLE); the offset is
/// the guest offset either way.
fn raw_extents(layer: &Layer, base: MapExtent, out: &mut Merger) -> Result<()> {
    let file = std::fs::File::open(layer.path())
        .map_err(|e| DiskError::io(layer.place(), "open to find holes", e))?;
    let end = base.start + base.length;
    let mut pos = base.start;
    while pos < end {
        let (data, until) = raw_run(&file, pos)?;
        let until = until.clamp(pos + 1, end);
        out.push(MapExtent {
            start: pos,
            length: until - pos,
            zero: !data,
            data,
            offset: Some(pos),
            filename: Some(layer.path().display().to_string()),
            ..base.clone()
        });
        pos = until;
    }
    Ok(())
}

/// Whether the file has data at `pos`, and where that run ends.
fn raw_run(file: &std::fs::File, pos: u64) -> Result<(bool, u64)> {
    let fd = file.as_raw_fd();
    let at = i64::try_from(pos).map_err(|_| DiskError::Invalid("offset beyond 2^63".into()))?;
    // SAFETY: lseek on an open descriptor we own; no memory is touched.
    let data = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
    if data < 0 {
        // ENXIO: no data at or after pos (a trailing hole).
        return Ok((false, u64::MAX));
    }
    if data as u64 > pos {
        return Ok((false, data as u64));
    }
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(fd, at, libc::SEEK_HOLE) };
    if hole < 0 {
        return Ok((true, u64::MAX));
    }
    Ok((true, hole as u64))
}

/// Adds `[start, start + length)`, which no layer holds, to `out`: qemu
/// stops at the first layer without a backing file, or whose backing file
/// ends before the range; that layer's depth is reported. With
/// `tables`, the range may be under L2 tables and is looked up.
fn unowned(disk: &Disk, start: u64, length: u64, tables: bool, out: &mut Merger) -> Result<()> {
    let layers = disk.layers();
    let end = start + length;
    let mut pos = start;
    while pos < end {
        // Top first: layers[i] is backed by layers[i - 1].
        let mut index = layers.len() - 1;
        let mut until = end;
        while index > 0 {
            let backing = layers[index - 1].size();
            if backing <= pos {
                break;
            }
            until = until.min(backing);
            index -= 1;
        }
        let layer = &layers[index];
        let depth = disk.depth() - 1 - index as u32;
        let mut ext = MapExtent {
            start: pos,
            length: until - pos,
            depth,
            present: false,
            zero: true,
            data: false,
            compressed: false,
            offset: None,
            layer: 0,
            filename: None,
        };
        if tables && layer.extended_l2() && pos < layer.size() {
            // One subcluster at a time: a host cluster without this
            // subcluster still reports its offset.
            let sub = 1u64 << layer.subcluster_bits();
            let stop = until.min((pos / sub + 1) * sub);
            let cb = layer.cluster_bits().unwrap_or(16);
            let entry = layer.read_l2_entry(pos >> cb)?;
            if let Status::Unallocated { offset: Some(o) } = status(layer, entry, pos)? {
                ext.offset = Some(o);
                ext.filename = Some(layer.path().display().to_string());
            }
            ext.length = stop - pos;
        }
        pos += ext.length;
        out.push(ext);
    }
    Ok(())
}

//! Allocation map with the owning layer, like `qemu-img map`.

use strata_format::L2Mapping;

use crate::cache::PAGE_UNITS;
use crate::disk::Disk;
use crate::error::Result;

/// One run of guest bytes with the same owner and kind.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MapExtent {
    /// Guest offset.
    pub start: u64,
    /// Bytes.
    pub length: u64,
    /// Layers above the owner (0 = top), as qemu-img counts.
    pub depth: u32,
    /// Owning layer counted from the base (1); 0 when no layer has it.
    pub layer: u32,
    /// Some layer holds this range.
    pub present: bool,
    /// Reads as zeros.
    pub zero: bool,
    /// Has data (not a zero cluster).
    pub data: bool,
    /// Stored compressed.
    pub compressed: bool,
    /// Host offset in the owner's file, for uncompressed data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// The owner's file name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
}

/// The allocation map of the whole disk.
pub fn map(disk: &Disk) -> Result<Vec<MapExtent>> {
    let mut out: Vec<MapExtent> = Vec::new();
    let n = disk.depth();
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
            let ext = describe(disk, n, 0, (0, 0), start, end - start)?;
            match out.last_mut() {
                Some(prev) if continues(prev, &ext) => prev.length += ext.length,
                _ => out.push(ext),
            }
            page_no = skip_to;
            continue;
        }
        let slots = disk.resolve_page(page_no)?;
        for (i, slot) in slots.iter().enumerate() {
            let start = (page_no * PAGE_UNITS + i as u64) * unit;
            let length = unit.min(disk.size() - start);
            let ext = describe(
                disk,
                n,
                slot.layer,
                (slot.entry, slot.bitmap),
                start,
                length,
            )?;
            match out.last_mut() {
                Some(prev) if continues(prev, &ext) => prev.length += ext.length,
                _ => out.push(ext),
            }
        }
        page_no += 1;
    }
    Ok(out)
}

fn describe(
    disk: &Disk,
    n: u32,
    owner: u16,
    (entry, bitmap): (u64, u64),
    start: u64,
    length: u64,
) -> Result<MapExtent> {
    let mut e = MapExtent {
        start,
        length,
        depth: if owner == 0 {
            n - 1
        } else {
            n - u32::from(owner)
        },
        layer: u32::from(owner),
        present: owner != 0,
        zero: owner == 0,
        data: false,
        compressed: false,
        offset: None,
        filename: None,
    };
    if owner == 0 {
        return Ok(e);
    }
    let layer = &disk.layers()[owner as usize - 1];
    e.filename = Some(layer.path().display().to_string());
    match layer.cluster_bits() {
        None => {
            e.data = true;
            e.offset = Some(start);
        }
        Some(cb) => match layer.decode_at(entry, bitmap, start)? {
            L2Mapping::Data { host_offset, .. } => {
                e.data = true;
                e.offset = Some(host_offset + (start & ((1 << cb) - 1)));
            }
            L2Mapping::Compressed { .. } => {
                e.data = true;
                e.compressed = true;
            }
            L2Mapping::Zero { .. } | L2Mapping::Unallocated => e.zero = true,
        },
    }
    Ok(e)
}

fn continues(prev: &MapExtent, next: &MapExtent) -> bool {
    prev.start + prev.length == next.start
        && prev.layer == next.layer
        && prev.zero == next.zero
        && prev.data == next.data
        && prev.compressed == next.compressed
        && !prev.compressed
        && match (prev.offset, next.offset) {
            (Some(a), Some(b)) => a + prev.length == b,
            (None, None) => true,
            _ => false,
        }
}

//! Changing an image's virtual size (`qemu-img resize`).
//!
//! Growing a qcow2 image writes a larger L1 table at the end of the file
//! when the old one is too small (table, then its refcounts, then the
//! header that points at it, then the old table is freed: a crash leaves
//! at worst a leak). Like QEMU, when the backing file is longer than the
//! old size, the new area is made to read as zeros rather than exposing
//! the backing file's bytes there.
//!
//! Shrinking needs `allow_shrink` (qemu-img's `--shrink`) and, as in
//! QEMU, drops whatever the image holds past the new end.

use std::path::Path;

use strata_format::entry::{L1Entry, OFLAG_COMPRESSED};
use strata_format::header::Header;

use crate::allocator::Allocator;
use crate::amend::{edit_header, header_of};
use crate::disk::{Disk, OpenOptions};
use crate::error::{DiskError, Result};
use crate::layer::{Format, Layer};

/// Bits of an L2 entry that hold a host offset.
const L2_OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;

/// Largest L1 table QEMU opens (32 MiB of entries).
const MAX_L1_ENTRIES: u64 = (32 << 20) / 8;

/// The size asked for, as qemu-img spells it (`SIZE`, `+SIZE`, `-SIZE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeChange {
    /// An absolute new size.
    To(u64),
    /// Grow by this many bytes.
    Grow(u64),
    /// Shrink by this many bytes.
    Shrink(u64),
}

/// What a resize did.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct ResizeReport {
    /// Virtual size before.
    pub old_size: u64,
    /// Virtual size after.
    pub new_size: u64,
}

/// Resizes the image at `path` (the top file only; its backing chain is
/// only read). Shrinking is refused unless `allow_shrink`.
pub fn resize(
    path: &Path,
    format: Option<Format>,
    change: SizeChange,
    allow_shrink: bool,
) -> Result<ResizeReport> {
    // Held to the end: no other process opens the image in between steps.
    let layer = Layer::open(path, 0, true, format)?;
    let old_size = layer.size();
    let new_size = target_size(path, old_size, change)?;
    if new_size < old_size && !allow_shrink {
        return Err(DiskError::Invalid(format!(
            "{}: {new_size} bytes is smaller than the current {old_size}: use the --shrink \
             option to perform a shrink operation (data past the new end is lost)",
            path.display()
        )));
    }
    let report = ResizeReport { old_size, new_size };
    if new_size == old_size {
        return Ok(report);
    }
    match layer.format() {
        Format::Raw => resize_raw(path, new_size)?,
        Format::Qcow2 => {
            let h = header_of(&layer)?;
            if !new_size.is_multiple_of(512) {
                return Err(DiskError::Invalid(format!(
                    "{}: a qcow2 image's size must be a multiple of 512 bytes, not {new_size}",
                    path.display()
                )));
            }
            if new_size > old_size {
                grow_qcow2(&layer, &h, new_size)?;
                zero_new_area(path, old_size, new_size)?;
            } else {
                shrink_qcow2(path, &layer, new_size)?;
            }
        }
    }
    Ok(report)
}

/// The new size `change` asks for, from `old`.
fn target_size(path: &Path, old: u64, change: SizeChange) -> Result<u64> {
    match change {
        SizeChange::To(s) => Ok(s),
        SizeChange::Grow(d) => old.checked_add(d).ok_or_else(|| {
            DiskError::Invalid(format!("{}: {old} + {d} bytes overflows", path.display()))
        }),
        SizeChange::Shrink(d) => old.checked_sub(d).ok_or_else(|| {
            DiskError::Invalid(format!(
                "{}: cannot shrink {old} bytes by {d}: the size would be negative",
                path.display()
            ))
        }),
    }
}

/// A raw image is its file: truncate or extend it.
fn resize_raw(path: &Path, new_size: u64) -> Result<()> {
    let invalid = |op: &str, e: std::io::Error| {
        DiskError::Invalid(format!("{}: {op} failed: {e}", path.display()))
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| invalid("open", e))?;
    file.set_len(new_size).map_err(|e| invalid("truncate", e))?;
    file.sync_all().map_err(|e| invalid("sync", e))
}

/// Grows a qcow2 image to `new_size`, with a larger L1 table if needed.
fn grow_qcow2(layer: &Layer, h: &Header, new_size: u64) -> Result<()> {
    let need = Header::l1_entries_for_l2(h.cluster_bits, h.extended_l2(), new_size);
    if need > MAX_L1_ENTRIES {
        return Err(DiskError::Invalid(format!(
            "{}: {new_size} bytes needs an L1 table of {need} entries, more than QEMU's \
             limit of {MAX_L1_ENTRIES}; use an image with larger clusters",
            layer.path().display()
        )));
    }
    if need <= u64::from(h.l1_size) {
        return edit_header(layer, |h| h.size = new_size);
    }
    let cs = h.cluster_size();
    let old_offset = h.l1_table_offset;
    let old_clusters = (u64::from(h.l1_size) * 8).div_ceil(cs);
    let new_clusters = (need * 8).div_ceil(cs);
    let mut table = layer.with_l1(|l1| l1.to_vec())?;
    table.resize((new_clusters * cs / 8) as usize, 0);
    let bytes: Vec<u8> = table.iter().flat_map(|e| e.to_be_bytes()).collect();
    let mut alloc = Allocator::load(layer)?;
    // The table first, then its refcounts, then the header that uses it.
    let at = alloc.next_free;
    layer.file.write_all_at(&bytes, at)?;
    layer.file.sync()?;
    let got = alloc.alloc(layer, new_clusters)?;
    if got != at {
        return Err(DiskError::corrupt(
            layer.place(),
            format!("new L1 table written at 0x{at:x} but allocated at 0x{got:x}"),
        ));
    }
    layer.file.sync()?;
    edit_header(layer, |h| {
        h.size = new_size;
        h.l1_table_offset = at;
        h.l1_size = need as u32;
    })?;
    // Nothing points at the old table any more: freeing it last means a
    // crash before here leaks it, never frees something in use.
    for c in 0..old_clusters {
        alloc.set_refcount(layer, old_offset / cs + c, 0)?;
    }
    layer.file.sync()
}

/// Makes `old..new` read as zeros where the backing chain would show
/// through (QEMU does the same when the backing file is longer).
fn zero_new_area(path: &Path, old_size: u64, new_size: u64) -> Result<()> {
    let disk = Disk::open(
        path,
        &OpenOptions {
            format: Some(Format::Qcow2),
            ..OpenOptions::read_write()
        },
    )?;
    let below = disk
        .layers()
        .len()
        .checked_sub(2)
        .map_or(0, |i| disk.layers()[i].size());
    let end = below.min(new_size);
    if end > old_size {
        disk.write_zeroes(old_size, end - old_size)?;
    }
    disk.close()
}

/// Shrinks a qcow2 image: releases the clusters past the new end, then
/// stores the new size (and a shorter L1 table when the dropped part
/// maps nothing any more).
fn shrink_qcow2(path: &Path, layer: &Layer, new_size: u64) -> Result<()> {
    let cs = layer.cluster_size().unwrap_or(65536);
    let old_size = layer.size();
    let from = new_size.div_ceil(cs) * cs;
    if from < old_size {
        let disk = Disk::open(
            path,
            &OpenOptions {
                format: Some(Format::Qcow2),
                ..OpenOptions::read_write()
            },
        )?;
        disk.discard(from, old_size - from)?;
        disk.close()?;
    }
    let h = crate::layer::read_header(&layer.file)?;
    let keep = Header::l1_entries_for_l2(h.cluster_bits, h.extended_l2(), new_size);
    let l1 = read_l1(layer, &h)?;
    let dropped: Vec<u64> = l1
        .iter()
        .skip(keep as usize)
        .map(|&raw| L1Entry::decode(raw, cs).map(|e| e.l2_offset))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| DiskError::corrupt(layer.place(), format!("L1 table: {e}")))?
        .into_iter()
        .filter(|&o| o != 0)
        .collect();
    if !tables_map_nothing(layer, &dropped, cs)? {
        // Something still lives there (e.g. preallocated zero clusters):
        // keep the table whole, only the size changes.
        return edit_header(layer, |h| h.size = new_size);
    }
    edit_header(layer, |h| {
        h.size = new_size;
        h.l1_size = keep as u32;
    })?;
    let zeros = vec![0u8; (l1.len() as u64 - keep) as usize * 8];
    layer
        .file
        .write_all_at(&zeros, h.l1_table_offset + keep * 8)?;
    layer.file.sync()?;
    let mut alloc = Allocator::load(layer)?;
    for table in dropped {
        alloc.set_refcount(layer, table / cs, 0)?;
    }
    // The table's clusters past its new length are free too.
    let l1_first = h.l1_table_offset / cs;
    let (kept, had) = ((keep * 8).div_ceil(cs), (l1.len() as u64 * 8).div_ceil(cs));
    for c in kept..had {
        alloc.set_refcount(layer, l1_first + c, 0)?;
    }
    layer.file.sync()?;
    // As QEMU does, give the space past the last used cluster back.
    truncate_unused(path, layer)
}

/// The L1 table as stored in the file (the layer's cached copy may be
/// older than the last writer's).
fn read_l1(layer: &Layer, h: &Header) -> Result<Vec<u64>> {
    let mut buf = vec![0u8; h.l1_size as usize * 8];
    layer.file.read_exact_at(&mut buf, h.l1_table_offset)?;
    Ok(buf
        .chunks_exact(8)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

/// Whether no entry of the L2 tables at `tables` points at a host cluster.
fn tables_map_nothing(layer: &Layer, tables: &[u64], cs: u64) -> Result<bool> {
    let entry_bytes = layer.l2_entry_bytes() as usize;
    let mut buf = vec![0u8; cs as usize];
    for &t in tables {
        layer.file.read_exact_at(&mut buf, t)?;
        let maps = buf.chunks_exact(entry_bytes).any(|e| {
            let raw = u64::from_be_bytes(e[..8].try_into().unwrap_or([0; 8]));
            raw & OFLAG_COMPRESSED != 0 || raw & L2_OFFSET_MASK != 0
        });
        if maps {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Cuts the file after its last cluster in use.
pub(crate) fn truncate_unused(path: &Path, layer: &Layer) -> Result<()> {
    let report = crate::check::check(path, crate::check::Repair::None)?;
    if report.corruptions > 0 || report.image_end_offset == 0 {
        return Ok(());
    }
    if report.image_end_offset < layer.file_len() {
        let invalid = |op: &str, e: std::io::Error| {
            DiskError::Invalid(format!("{}: {op}: {e}", path.display()))
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| invalid("open", e))?;
        file.set_len(report.image_end_offset)
            .map_err(|e| invalid("truncate", e))?;
        file.sync_all().map_err(|e| invalid("sync", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::create::{create, CreateOptions};

    #[test]
    fn growing_past_the_l1_table_keeps_data_and_shrinking_needs_permission() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.qcow2");
        let opts = CreateOptions {
            size: Some(1 << 20),
            cluster_size: 4096,
            ..CreateOptions::default()
        };
        create(&path, &opts).expect("create");
        let disk = Disk::open(&path, &OpenOptions::read_write()).expect("open");
        disk.write_at(&[7u8; 4096], 8192).expect("write");
        disk.close().expect("close");
        // 4 KiB clusters: one L1 entry covers 2 MiB, one L1 cluster 1 GiB.
        resize(&path, None, SizeChange::To(3 << 30), false).expect("grow");
        assert_clean(&path);
        let disk = Disk::open(&path, &OpenOptions::read_write()).expect("reopen");
        assert_eq!(disk.size(), 3 << 30);
        let mut buf = [0u8; 4096];
        disk.read_at(&mut buf, 8192).expect("read");
        assert_eq!(buf, [7u8; 4096]);
        disk.write_at(&[9u8; 4096], (3 << 30) - 4096)
            .expect("write at the new end");
        disk.close().expect("close");
        assert_clean(&path);
        let refused = resize(&path, None, SizeChange::Shrink(1 << 20), false);
        assert!(refused.is_err(), "shrink without permission must fail");
        resize(&path, None, SizeChange::To(1 << 20), true).expect("shrink");
        assert_clean(&path);
    }

    #[track_caller]
    fn assert_clean(path: &Path) {
        let report = crate::check::check(path, crate::check::Repair::None).expect("check");
        assert_eq!(report.corruptions + report.leaks, 0, "{report:?}");
    }
}

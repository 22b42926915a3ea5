//! Consistency check and repair of one qcow2 file, as `qemu-img check`
//! does it: every reference is counted and compared with the stored
//! refcounts. Strata also verifies its chain index against the chain.

use std::path::Path;

use strata_format::entry::{OFFSET_MASK, OFLAG_COPIED};
use strata_format::header::{INCOMPAT_CORRUPT, INCOMPAT_DIRTY};

use crate::allocator::Allocator;
use crate::cache::PAGE_UNITS;
use crate::disk::{Disk, IndexState, OpenOptions};
use crate::error::{DiskError, Result};
use crate::header::write_header;
use crate::layer::{Format, Layer};
use crate::lock::LockMode;
use crate::refcounts::{repair_refcounts, run, run_counting, Overlap, MAX_MESSAGES};
pub use crate::refcounts::{CheckReport, Repair};

/// Checks (and optionally repairs) the image at `path`.
pub fn check(path: &Path, repair: Repair) -> Result<CheckReport> {
    check_shared(path, repair, false)
}

/// [`check`], with qemu-img's `-U`: `force_share` reads an image another
/// process may be writing (what is counted may then be inconsistent). A
/// repair must have the image alone.
pub fn check_shared(path: &Path, repair: Repair, force_share: bool) -> Result<CheckReport> {
    let lock = match (repair, force_share) {
        (Repair::None, true) => LockMode::ForceShare,
        (Repair::None, false) => LockMode::Read,
        (_, true) => {
            return Err(DiskError::Invalid(format!(
                "{}: force-share (-U) is for checks without -r; a repair must have the image alone",
                path.display()
            )))
        }
        (_, false) => LockMode::Write,
    };
    open_backing(path, lock)?;
    let layer = Layer::open_locked(path, 0, repair != Repair::None, Some(Format::Qcow2), lock)?;
    let (mut report, overlaps) = run_counting(&layer, repair)?;
    if repair == Repair::All && !overlaps.is_empty() {
        relocate_overlaps(&layer, &overlaps)?;
        // The moved references change the counts: fix refcounts again.
        let (again, _) = run_counting(&layer, repair)?;
        report.leaks_fixed += again.leaks_fixed;
        report.corruptions_fixed += again.corruptions_fixed + overlaps.len() as u64;
    }
    if repair != Repair::None && (report.leaks_fixed > 0 || report.corruptions_fixed > 0) {
        let fixed = (report.leaks_fixed, report.corruptions_fixed);
        let mut again = run(&layer, Repair::None)?;
        again.leaks_fixed = fixed.0;
        again.corruptions_fixed = fixed.1;
        report = again;
    }
    if repair == Repair::All && report.corruptions == 0 && report.check_errors == 0 {
        clear_corrupt_bit(&layer)?;
    }
    drop(layer);
    report.chain_index = index_status(path, &mut report, force_share);
    Ok(report)
}

/// Opens the backing chain below the image at `path`, if it has one: as
/// qemu-img, check refuses an image whose backing file cannot be opened.
fn open_backing(path: &Path, lock: LockMode) -> Result<()> {
    let lock = match lock {
        LockMode::ForceShare => LockMode::ForceShare,
        _ => LockMode::Read,
    };
    let layer = Layer::open_locked(path, 0, false, Some(Format::Qcow2), lock)?;
    let Some(name) = layer.header().and_then(|h| h.backing_file) else {
        return Ok(());
    };
    drop(layer);
    if name.starts_with("json:") || name.contains("://") {
        // Strata opens local files only; check the file itself.
        return Ok(());
    }
    let dir = path.parent().unwrap_or(Path::new(""));
    let backing = dir.join(&name);
    Disk::open(
        &backing,
        &OpenOptions {
            ignore_index: true,
            force_share: lock == LockMode::ForceShare,
            ..OpenOptions::read_only()
        },
    )
    .map(drop)
    .map_err(|e| {
        DiskError::Chain(format!(
            "{}: could not open backing file {}: {e}",
            path.display(),
            backing.display()
        ))
    })
}

/// Repairs a layer a crash left marked dirty, typically a former top
/// frozen by an online snapshot and not sealed yet: rebuilds its refcounts
/// from its references and clears the dirty bit. Its chain index stays
/// invalid (a writer cleared it), so the chain above walks or rebuilds
/// its own. Returns whether the file was dirty; a clean file is not
/// opened for writing at all.
///
/// Only for a layer no process writes to: a top being written is dirty
/// by design and repaired by its next writer.
pub fn repair_dirty(path: &Path) -> Result<bool> {
    let layer = Layer::open(path, 0, false, Some(Format::Qcow2))?;
    let dirty = layer
        .header()
        .is_some_and(|h| h.incompatible_features & INCOMPAT_DIRTY != 0);
    drop(layer);
    if !dirty {
        return Ok(false);
    }
    let layer = Layer::open(path, 0, true, Some(Format::Qcow2))?;
    repair_refcounts(&layer)?;
    let mut h = layer
        .header()
        .ok_or_else(|| DiskError::Invalid(format!("{}: not qcow2", path.display())))?;
    // Refcounts first, durable, then the header that calls them right.
    layer.file.sync()?;
    h.incompatible_features &= !INCOMPAT_DIRTY;
    write_header(&layer, &h)?;
    layer.file.sync()?;
    Ok(true)
}

/// Gives every data cluster that overlaps metadata a cluster of its own
/// at the end of the file, holding the same bytes: the guest reads what it
/// read before, and its writes no longer land on metadata. The refcounts
/// are recounted afterwards.
fn relocate_overlaps(layer: &Layer, overlaps: &[Overlap]) -> Result<()> {
    let mut alloc = Allocator::load(layer)?;
    let cs = alloc.cs;
    let mut bytes = vec![0u8; cs as usize];
    for &at in overlaps {
        let mut raw = [0u8; 8];
        layer.file.read_exact_at(&mut raw, at)?;
        let entry = u64::from_be_bytes(raw);
        let old = entry & OFFSET_MASK;
        // Bytes past the end of the file read as zeros, as the guest saw them.
        layer.file.read_data(&mut bytes, old)?;
        let new = alloc.alloc(layer, 1)?;
        layer.file.write_data(&bytes, new)?;
        layer.file.sync()?;
        let moved = (entry & !OFFSET_MASK) | new | OFLAG_COPIED;
        layer.file.write_all_at(&moved.to_be_bytes(), at)?;
    }
    layer.file.sync()
}

/// Clears the corrupt bit of a repaired image (QEMU's check does the same
/// once no corruption is left).
fn clear_corrupt_bit(layer: &Layer) -> Result<()> {
    let Some(q) = &layer.qcow2 else {
        return Ok(());
    };
    let mut h = q.header.read().clone();
    if h.incompatible_features & INCOMPAT_CORRUPT == 0 {
        return Ok(());
    }
    h.incompatible_features &= !INCOMPAT_CORRUPT;
    // Not `write_header`: it keeps a corrupt bit set.
    let buf = h
        .encode()
        .map_err(|e| DiskError::format(layer.place(), e))?;
    layer.file.write_all_at(&buf, 0)?;
    layer.file.sync()?;
    *q.header.write() = h;
    Ok(())
}

/// Verifies the stored chain index, if any, against a walk of the chain.
/// Mismatches count as corruptions: they would make reads return wrong data.
fn index_status(path: &Path, report: &mut CheckReport, force_share: bool) -> Option<String> {
    let walk = Disk::open(
        path,
        &OpenOptions {
            ignore_index: true,
            force_share,
            ..OpenOptions::read_only()
        },
    );
    let indexed = Disk::open(
        path,
        &OpenOptions {
            force_share,
            ..OpenOptions::read_only()
        },
    );
    let (walk, indexed) = match (walk, indexed) {
        (Ok(w), Ok(i)) => (w, i),
        (Err(e), _) | (_, Err(e)) => return Some(format!("not verified: {e}")),
    };
    let has_ext = indexed
        .top()
        .header()
        .and_then(|h| h.chain_index().cloned())
        .is_some();
    match indexed.index_state() {
        IndexState::Walk { reason } => {
            return has_ext.then(|| format!("not used: {reason}"));
        }
        IndexState::Stored { .. } => {}
    }
    let units = indexed.units();
    let mut mismatches = 0u64;
    let mut first = 0u64;
    while first < units {
        let count = (units - first).min(PAGE_UNITS * 256) as usize;
        let (a, b) = match (indexed.owners(first, count), walk.owners(first, count)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return Some(format!("not verified: {e}")),
        };
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            if x != y {
                mismatches += 1;
                if report.messages.len() < MAX_MESSAGES {
                    report.messages.push(format!(
                        "ERROR chain index: unit {} says layer {x}, chain says layer {y}",
                        first + i as u64
                    ));
                }
            }
        }
        first += count as u64;
    }
    report.corruptions += mismatches;
    Some(if mismatches == 0 {
        format!(
            "valid ({} layers, {units} units, matches the chain)",
            indexed.depth()
        )
    } else {
        format!("{mismatches} units disagree with the chain")
    })
}

//! Changing an image's backing file (`qemu-img rebase`).
//!
//! Safe mode copies into the image every unit it does not hold itself
//! where the old chain and the new backing file read differently, so the
//! image reads the same afterwards; only then is the backing name in the
//! header switched. A crash before the switch leaves the image reading
//! as before (with some data copied up). Unsafe mode (`-u`) only
//! rewrites the name.

use std::path::{Path, PathBuf};

use crate::amend::{edit_header, header_of, set_backing};
use crate::disk::{Disk, OpenOptions};
use crate::error::{DiskError, Result};
use crate::layer::{Format, Layer};

/// Units whose owners are looked up at once.
const OWNER_BATCH: u64 = 1 << 14;

/// Largest read-compare-write step.
const STEP_BYTES: u64 = 1 << 20;

/// How to rebase.
#[derive(Debug, Clone, Default)]
pub struct RebaseOptions {
    /// Format of the image (probed when `None`).
    pub format: Option<Format>,
    /// Format of the new backing file: required unless the image is
    /// made standalone (probing it is unsafe, and qemu-img 10 refuses too).
    pub backing_format: Option<Format>,
    /// Only rewrite the name (qemu-img's `-u`).
    pub unsafe_mode: bool,
}

/// What a rebase did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RebaseReport {
    /// Backing name before.
    pub old_backing: Option<String>,
    /// Backing name after.
    pub new_backing: Option<String>,
    /// Bytes copied into the image (safe mode).
    pub bytes_copied: u64,
}

/// Makes the qcow2 image at `path` use `backing` (as stored, relative to
/// the image's directory; empty for none). `on_progress(done, total)`
/// reports bytes looked at.
pub fn rebase(
    path: &Path,
    backing: &str,
    opts: &RebaseOptions,
    mut on_progress: impl FnMut(u64, u64),
) -> Result<RebaseReport> {
    if !backing.is_empty() && opts.backing_format.is_none() {
        // As qemu-img 10: a probed format would let a raw file that looks
        // like qcow2 be read as one.
        return Err(DiskError::Invalid(format!(
            "could not change the backing file of {} to '{backing}': the backing format \
             must be specified (-F qcow2 or -F raw); nothing was changed",
            path.display()
        )));
    }
    // Held to the end, so nobody opens the image between the copy and
    // the header switch.
    let guard = Layer::open(path, 0, true, opts.format)?;
    let h = header_of(&guard)?;
    let mut report = RebaseReport {
        old_backing: h.backing_file.clone(),
        new_backing: (!backing.is_empty()).then(|| backing.to_string()),
        bytes_copied: 0,
    };
    let new_chain = match backing {
        "" => None,
        name => match open_new_backing(path, name, opts.backing_format) {
            Ok(disk) => Some(disk),
            // Like qemu-img: -u does not need the new file to exist.
            Err(_) if opts.unsafe_mode => None,
            Err(e) => return Err(e),
        },
    };
    let format = opts.backing_format;
    if !opts.unsafe_mode {
        let top = Disk::open(
            path,
            &OpenOptions {
                format: Some(Format::Qcow2),
                ..OpenOptions::read_write()
            },
        )?;
        report.bytes_copied = copy_differences(&top, new_chain.as_ref(), &mut on_progress)?;
        top.close()?;
    }
    drop(new_chain);
    edit_header(&guard, |h| set_backing(h, backing, format))?;
    Ok(report)
}

/// Where a backing name stored in the image at `image` points.
pub(crate) fn resolve_backing(image: &Path, name: &str) -> PathBuf {
    if Path::new(name).is_absolute() {
        return PathBuf::from(name);
    }
    image.parent().unwrap_or(Path::new(".")).join(name)
}

/// Opens the new backing chain read-only, with an error that names it.
fn open_new_backing(image: &Path, name: &str, format: Option<Format>) -> Result<Disk> {
    let full = resolve_backing(image, name);
    let ro = OpenOptions {
        format,
        cache_bytes: 4 << 20,
        ..OpenOptions::read_only()
    };
    Disk::open(&full, &ro).map_err(|e| {
        DiskError::Invalid(format!(
            "could not open new backing file '{name}' ({}): {e}; nothing was changed",
            full.display()
        ))
    })
}

/// Copies into `top` every unit it does not own whose content under the
/// old chain differs from `new_chain`'s (zeros when `None` or past its
/// end). Returns the bytes copied.
fn copy_differences(
    top: &Disk,
    new_chain: Option<&Disk>,
    on_progress: &mut impl FnMut(u64, u64),
) -> Result<u64> {
    let unit = top.unit_size();
    let size = top.size();
    let depth = top.depth() as u16;
    let units = size.div_ceil(unit);
    let step_units = (STEP_BYTES / unit).max(1);
    let mut copied = 0;
    let (mut old, mut new) = (Vec::new(), Vec::new());
    // Stretches where neither chain can hold data read as zeros in both:
    // skipped without reading, so a sparse disk costs its data, not its size.
    let mut old_cursor = top.data_cursor();
    let mut new_cursor = new_chain.map(Disk::data_cursor);
    let mut at = 0;
    while at < units {
        let count = (units - at).min(OWNER_BATCH);
        let owners = top.owners(at, count as usize)?;
        let mut i = 0usize;
        while i < owners.len() {
            if owners[i] == depth {
                i += 1;
                continue;
            }
            let start = i;
            while i < owners.len() && owners[i] != depth && ((i - start) as u64) < step_units {
                i += 1;
            }
            let offset = (at + start as u64) * unit;
            let len = ((i - start) as u64 * unit).min(size - offset);
            let end = offset + len;
            let old_next = top.next_possible_data(&mut old_cursor, offset)?;
            let new_next = match (new_chain, new_cursor.as_mut()) {
                (Some(d), Some(c)) if offset < d.size() => d.next_possible_data(c, offset)?,
                _ => u64::MAX,
            };
            if old_next >= end && new_next >= end {
                on_progress(end, size);
                continue;
            }
            old.resize(len as usize, 0);
            new.resize(len as usize, 0);
            top.read_at(&mut old, offset)?;
            read_or_zero(new_chain, &mut new, offset)?;
            copied += write_differing(top, &old, &new, offset, unit)?;
            on_progress(offset + len, size);
        }
        at += count;
    }
    on_progress(size, size);
    Ok(copied)
}

/// Reads `buf` at `offset` from `disk`, zeros where it has no bytes.
fn read_or_zero(disk: Option<&Disk>, buf: &mut [u8], offset: u64) -> Result<()> {
    buf.fill(0);
    let Some(disk) = disk else {
        return Ok(());
    };
    let have = disk.size().saturating_sub(offset).min(buf.len() as u64) as usize;
    if have > 0 {
        disk.read_at(&mut buf[..have], offset)?;
    }
    Ok(())
}

/// Writes into `top` each unit of `old` that differs from `new`.
fn write_differing(top: &Disk, old: &[u8], new: &[u8], offset: u64, unit: u64) -> Result<u64> {
    let mut written = 0;
    for (k, (o, n)) in old
        .chunks(unit as usize)
        .zip(new.chunks(unit as usize))
        .enumerate()
    {
        if o != n {
            top.write_at(o, offset + k as u64 * unit)?;
            written += o.len() as u64;
        }
    }
    Ok(written)
}

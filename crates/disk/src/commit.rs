//! Writing an image's data down into its backing file (`qemu-img commit`).
//!
//! Every unit that a layer above the base owns is read through the chain
//! and written into the base, which is then made durable. Only after that
//! is the top emptied (unless the caller keeps it): its L1 table is
//! cleared under the dirty bit, refcounts are rebuilt from what is still
//! referenced, and the file is cut after its last used cluster, which
//! leaves what `qemu-img commit` leaves: an image that reads entirely
//! through to its backing file. A crash while emptying leaves an image
//! marked dirty that still reads correctly (the base holds everything).

use std::path::{Path, PathBuf};

use strata_format::header::INCOMPAT_DIRTY;

use crate::amend::{edit_header, header_of};
use crate::convert::is_zero;
use crate::disk::{Disk, OpenOptions};
use crate::error::{DiskError, Result};
use crate::header::write_header;
use crate::layer::{read_header, Format, Layer};
use crate::resize::{resize, SizeChange};

/// Units whose owners are looked up at once.
const OWNER_BATCH: u64 = 1 << 14;

/// Largest read-and-write step.
const STEP_BYTES: u64 = 1 << 20;

/// How to commit.
#[derive(Debug, Clone, Default)]
pub struct CommitOptions {
    /// Format of the image (probed when `None`).
    pub format: Option<Format>,
    /// The image of the chain to commit into (default: the backing file).
    /// As in qemu-img, naming one keeps the top as it is.
    pub base: Option<PathBuf>,
    /// Keep the top's data instead of emptying it (qemu-img's `-d`).
    pub keep_top: bool,
}

/// What a commit did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CommitReport {
    /// The image written into.
    pub base: PathBuf,
    /// Bytes written into it.
    pub bytes_committed: u64,
    /// Whether the top was emptied.
    pub emptied: bool,
}

/// Commits the image at `path` into its backing file or `opts.base`.
/// `on_progress(done, total)` reports bytes looked at.
pub fn commit(
    path: &Path,
    opts: &CommitOptions,
    mut on_progress: impl FnMut(u64, u64),
) -> Result<CommitReport> {
    // Held to the end: the top is not opened by anyone while it is
    // committed and emptied.
    let guard = Layer::open(path, 0, true, opts.format)?;
    if guard.format() == Format::Qcow2 {
        header_of(&guard)?;
    }
    let chain = Disk::open(
        path,
        &OpenOptions {
            format: Some(guard.format()),
            cache_bytes: 8 << 20,
            ..OpenOptions::read_only()
        },
    )?;
    if chain.depth() < 2 {
        return Err(DiskError::Invalid(format!(
            "{} does not have a backing file: there is nothing to commit into",
            path.display()
        )));
    }
    let base_depth = find_base(&chain, path, opts.base.as_deref())?;
    let base = &chain.layers()[base_depth as usize - 1];
    let base_path = base.path().to_path_buf();
    let base_format = base.format();
    // As qemu-img does, a base smaller than the top is grown first.
    if base.size() < chain.size() {
        resize(
            &base_path,
            Some(base_format),
            SizeChange::To(chain.size()),
            false,
        )?;
    }
    let target = Disk::open(
        &base_path,
        &OpenOptions {
            format: Some(base_format),
            ..OpenOptions::read_write()
        },
    )?;
    let bytes = copy_down(&chain, base_depth, &target, &mut on_progress)?;
    target.close()?;
    drop(chain);
    let empty = !opts.keep_top && opts.base.is_none() && guard.format() == Format::Qcow2;
    if empty {
        make_empty(path, &guard)?;
    }
    Ok(CommitReport {
        base: base_path,
        bytes_committed: bytes,
        emptied: empty,
    })
}

/// Depth (from 1 at the bottom) of the layer to commit into.
fn find_base(chain: &Disk, path: &Path, base: Option<&Path>) -> Result<u32> {
    let Some(base) = base else {
        return Ok(chain.depth() - 1);
    };
    let want = std::fs::canonicalize(base)
        .map_err(|e| DiskError::Invalid(format!("base image '{}': {e}", base.display())))?;
    let below_top = &chain.layers()[..chain.depth() as usize - 1];
    below_top
        .iter()
        .position(|l| std::fs::canonicalize(l.path()).is_ok_and(|p| p == want))
        .map(|i| i as u32 + 1)
        .ok_or_else(|| {
            DiskError::Invalid(format!(
                "did not find '{}' in the backing chain of '{}'",
                base.display(),
                path.display()
            ))
        })
}

/// Writes into `target` every unit that a layer above `base_depth` owns.
fn copy_down(
    chain: &Disk,
    base_depth: u32,
    target: &Disk,
    on_progress: &mut impl FnMut(u64, u64),
) -> Result<u64> {
    let unit = chain.unit_size();
    let size = chain.size();
    let units = size.div_ceil(unit);
    let step_units = (STEP_BYTES / unit).max(1);
    // Zero units become zero writes only where they cover whole target
    // clusters; elsewhere zeros are written as data.
    let zero_ok = target.top().cluster_size().is_none_or(|cs| cs <= unit);
    let above = |o: u16| u32::from(o) > base_depth;
    let mut written = 0;
    let mut buf = Vec::new();
    let mut at = 0;
    while at < units {
        let count = (units - at).min(OWNER_BATCH);
        let owners = chain.owners(at, count as usize)?;
        let mut i = 0usize;
        while i < owners.len() {
            if !above(owners[i]) {
                i += 1;
                continue;
            }
            let start = i;
            while i < owners.len() && above(owners[i]) && ((i - start) as u64) < step_units {
                i += 1;
            }
            let offset = (at + start as u64) * unit;
            let len = ((i - start) as u64 * unit).min(size - offset);
            buf.resize(len as usize, 0);
            chain.read_at(&mut buf, offset)?;
            for (k, part) in buf.chunks(unit as usize).enumerate() {
                let pos = offset + k as u64 * unit;
                if zero_ok && is_zero(part) {
                    target.write_zeroes(pos, part.len() as u64)?;
                } else {
                    target.write_at(part, pos)?;
                }
            }
            written += len;
            on_progress(offset + len, size);
        }
        at += count;
    }
    on_progress(size, size);
    Ok(written)
}

/// Empties the qcow2 image of `layer` (its write lock held): afterwards
/// every cluster is unallocated and reads from the backing file.
fn make_empty(path: &Path, layer: &Layer) -> Result<()> {
    let mut h = read_header(&layer.file)?;
    if h.version >= 3 {
        // From here until the end a crash leaves the image to be repaired
        // (leaked clusters), never reading wrong data.
        h.incompatible_features |= INCOMPAT_DIRTY;
        write_header(layer, &h)?;
        layer.file.sync()?;
    }
    let zeros = vec![0u8; h.l1_size as usize * 8];
    layer.file.write_all_at(&zeros, h.l1_table_offset)?;
    layer.file.sync()?;
    if let Some(q) = &layer.qcow2 {
        *q.l1.write() = None;
    }
    crate::refcounts::repair_refcounts(layer)?;
    layer.file.sync()?;
    edit_header(layer, |h| h.incompatible_features &= !INCOMPAT_DIRTY)?;
    crate::resize::truncate_unused(path, layer)
}

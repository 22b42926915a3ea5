//! Chain compaction: merging a run of layers into one new layer, and
//! splicing that layer into a disk that stays open.
//!
//! A run `first..=last` of a chain is replaced by one layer `M` whose
//! backing file is layer `first - 1` and which holds, for every unit that
//! some layer of the run owns, the run's newest version of it (data, or a
//! zero cluster). Everything above the run then reads exactly what it read
//! before, so the layer above the run (`last + 1`) can be rebased onto `M`
//! and the run's files removed. Nothing above the run is ever written by a
//! merge: snapshots and clones that share those layers keep their bytes.
//!
//! The copy ([`merge_layers`]) runs with the disk online and is paced by
//! its caller; the splice ([`Disk::replace_layers`]) needs I/O excluded for
//! a few syncs and one pass over the index.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::convert::is_zero;
use crate::create::{create, CreateOptions};
use crate::disk::{Disk, OpenOptions};
use crate::error::{DiskError, Result};
use crate::header::write_header;
use crate::layer::{Format, Layer};
use crate::writer::Writer;

/// Units whose owners are looked up at once while merging.
const OWNER_BATCH: u64 = 1 << 14;

/// Largest read-and-write step of a merge: short steps keep the copy's
/// bursts short next to the I/O it runs beside.
const COPY_BATCH_BYTES: u64 = 256 << 10;

/// Where a merge is, passed to its caller before every copy step.
#[derive(Debug, Clone, Copy, Default)]
pub struct MergeProgress {
    /// Units of the disk looked at so far.
    pub units_done: u64,
    /// Units of the disk in all.
    pub units_total: u64,
    /// Bytes copied (or zeroed) into the new layer so far.
    pub bytes_copied: u64,
    /// Bytes the step about to run will copy: a caller that paces the
    /// merge waits here.
    pub next_bytes: u64,
}

/// What a merge did.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct MergeReport {
    /// Layers the new layer replaces.
    pub layers_merged: u32,
    /// Bytes of data copied into the new layer.
    pub bytes_copied: u64,
    /// Bytes recorded as zero clusters in the new layer.
    pub bytes_zeroed: u64,
    /// Bytes of the disk whose newest version was below the run.
    pub bytes_skipped: u64,
}

/// Merges layers `first..=depth` of the chain whose top is `run_top` (depth
/// counts from 1 at the base) into a new qcow2 file `out`, backed by layer
/// `first - 1` (none when `first` is 1).
///
/// `on_step` runs before every copy step; an error from it stops the merge
/// (that is how a caller cancels or paces it). On any error `out` is
/// removed. The layers of the run are only read, from their files: a
/// live disk's frozen layers must be made durable first
/// ([`Disk::sync_frozen`]), or the merge misses what they hold in memory.
pub fn merge_layers(
    run_top: &Path,
    first: u32,
    out: &Path,
    mut on_step: impl FnMut(&MergeProgress) -> Result<()>,
) -> Result<MergeReport> {
    let run = Disk::open(
        run_top,
        &OpenOptions {
            cache_bytes: 4 << 20,
            ..OpenOptions::read_only()
        },
    )?;
    let depth = run.depth();
    if first == 0 || first > depth {
        return Err(DiskError::Invalid(format!(
            "cannot merge from layer {first} of {}: its chain has {depth} layers",
            run_top.display()
        )));
    }
    // The merged layer must allocate units as small as the run's: with
    // subclusters in the chain, an extended L2 layer of the smallest
    // cluster size when qcow2 allows it, else clusters of one unit.
    let min_cluster_bits = run.layers().iter().filter_map(|l| l.cluster_bits()).min();
    let extended_l2 = min_cluster_bits.is_some_and(|cb| {
        cb > run.chain.unit_bits
            && cb >= strata_format::entry::MIN_EXTENDED_CLUSTER_BITS
            && cb - strata_format::entry::SUBCLUSTERS.trailing_zeros() == run.chain.unit_bits
    });
    let cluster_size = match min_cluster_bits {
        Some(cb) if extended_l2 => 1u64 << cb,
        _ => run.unit_size(),
    };
    let opts = CreateOptions {
        size: Some(run.size()),
        cluster_size,
        extended_l2,
        backing: backing_name_for(&run, first, out),
        backing_format: (first > 1).then(|| run.layers()[first as usize - 2].format()),
        ..CreateOptions::default()
    };
    create(out, &opts)?;
    let result = Disk::open(out, &OpenOptions::read_write())
        .and_then(|merged| copy_run(&run, first, merged, &mut on_step))
        .inspect(|_| sync_parent(out));
    if result.is_err() {
        let _ = std::fs::remove_file(out);
    }
    result
}

/// The backing name `out` should store for layer `first - 1` of `run`:
/// its file name when both live in one directory, else its full path.
fn backing_name_for(run: &Disk, first: u32, out: &Path) -> Option<String> {
    if first < 2 {
        return None;
    }
    let lower = run.layers()[first as usize - 2].path();
    let same_dir = lower.parent() == out.parent();
    match (same_dir, lower.file_name()) {
        (true, Some(name)) => Some(name.to_string_lossy().into_owned()),
        _ => Some(lower.to_string_lossy().into_owned()),
    }
}

/// Copies every unit that layers `first..` of `run` own into `merged`.
fn copy_run(
    run: &Disk,
    first: u32,
    merged: Disk,
    on_step: &mut impl FnMut(&MergeProgress) -> Result<()>,
) -> Result<MergeReport> {
    let unit = run.unit_size();
    let size = run.size();
    let units = size.div_ceil(unit);
    let batch_units = (COPY_BATCH_BYTES / unit).max(1);
    let mut report = MergeReport {
        layers_merged: run.depth() - first + 1,
        ..MergeReport::default()
    };
    let mut progress = MergeProgress {
        units_total: units,
        ..MergeProgress::default()
    };
    let mut buf = Vec::new();
    let mut at = 0;
    while at < units {
        let count = (units - at).min(OWNER_BATCH);
        let owners = run.owners(at, count as usize)?;
        let mut i = 0usize;
        while i < owners.len() {
            if u32::from(owners[i]) < first {
                report.bytes_skipped += unit_len(at + i as u64, unit, size);
                i += 1;
                continue;
            }
            // A stretch of consecutive units the run owns.
            let start = i;
            while i < owners.len()
                && u32::from(owners[i]) >= first
                && ((i - start) as u64) < batch_units
            {
                i += 1;
            }
            let offset = (at + start as u64) * unit;
            let len = ((i - start) as u64 * unit).min(size - offset);
            progress.units_done = at + start as u64;
            progress.next_bytes = len;
            on_step(&progress)?;
            buf.resize(len as usize, 0);
            run.read_at(&mut buf, offset)?;
            copy_units(&merged, &buf, offset, unit, &mut report)?;
            progress.bytes_copied += len;
        }
        at += count;
    }
    progress.units_done = units;
    progress.next_bytes = 0;
    on_step(&progress)?;
    merged.close()?;
    Ok(report)
}

/// Writes `buf` (read at guest `offset`) into `merged` unit by unit: zero
/// units become zero clusters, which keep covering older data below.
fn copy_units(
    merged: &Disk,
    buf: &[u8],
    offset: u64,
    unit: u64,
    report: &mut MergeReport,
) -> Result<()> {
    let mut pos = 0usize;
    while pos < buf.len() {
        let zero = is_zero(&buf[pos..(pos + unit as usize).min(buf.len())]);
        // Extend over following units of the same kind.
        let mut end = pos;
        while end < buf.len() {
            let next = (end + unit as usize).min(buf.len());
            if is_zero(&buf[end..next]) != zero {
                break;
            }
            end = next;
        }
        let guest = offset + pos as u64;
        if zero {
            merged.write_zeroes(guest, (end - pos) as u64)?;
            report.bytes_zeroed += (end - pos) as u64;
        } else {
            merged.write_at(&buf[pos..end], guest)?;
            report.bytes_copied += (end - pos) as u64;
        }
        pos = end;
    }
    Ok(())
}

fn unit_len(unit_index: u64, unit: u64, size: u64) -> u64 {
    unit.min(size.saturating_sub(unit_index * unit))
}

/// Makes a new directory entry durable.
fn sync_parent(path: &Path) {
    if let Some(dir) = path.parent() {
        if let Ok(d) = std::fs::File::open(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        }) {
            let _ = d.sync_all();
        }
    }
}

/// Rewrites the backing file name stored in the qcow2 image at `path`
/// (like `qemu-img rebase -u`): no data is read or moved, so the caller
/// must know that the new backing file reads exactly like the old one.
/// The backing format extension is kept. The file must not be open for
/// writing elsewhere.
pub fn set_backing_file(path: &Path, backing: &str) -> Result<()> {
    let layer = Layer::open(path, 0, true, Some(Format::Qcow2))?;
    let mut h = layer
        .header()
        .ok_or_else(|| DiskError::Invalid(format!("{} is not a qcow2 image", path.display())))?;
    if h.backing_file.is_none() {
        return Err(DiskError::Invalid(format!(
            "{} has no backing file to replace",
            path.display()
        )));
    }
    h.backing_file = Some(backing.to_string());
    write_header(&layer, &h)?;
    layer.file.sync()
}

/// The backing file name stored in the qcow2 image at `path` (`None` for
/// an image without one), read from its header alone.
pub fn backing_file(path: &Path) -> Result<Option<String>> {
    let layer = Layer::open(path, 0, false, Some(Format::Qcow2))?;
    Ok(layer.header().and_then(|h| h.backing_file))
}

/// Why lookups walk a chain that a compaction changed under an open disk.
const SPLICED: &str = "chain changed by compaction; the index is rebuilt on the next write-open";

impl Disk {
    /// Replaces layers `first..=last` (depth counted from 1 at the base) of
    /// this open disk with the layer at `merged`, made by [`merge_layers`]
    /// from exactly those layers. `expected_last` names the file layer
    /// `last` must be, so a caller whose view of the chain is out of date
    /// gets an error instead of a wrong splice.
    ///
    /// The layer above the run is rebased onto `merged`: written to its
    /// header when it is this disk's writable top, only in memory
    /// otherwise (a frozen layer's file is rebased once by the caller with
    /// [`set_backing_file`], not by every disk that reads it). The chain
    /// index is carried over with owners renumbered, and the cache starts
    /// empty.
    ///
    /// The caller must exclude I/O for the duration (it takes `&mut self`).
    /// On an error before the splice the disk is unchanged.
    pub fn replace_layers(
        &mut self,
        first: u32,
        last: u32,
        merged: &Path,
        expected_last: &Path,
    ) -> Result<()> {
        // Frozen layers are named by position, which the splice changes,
        // and their headers must be final before a rebase rewrites one.
        // Callers seal them before merging; this only catches the rest.
        // A top still reading owners from a frozen layer is copied whole
        // first, for the same reason (and its close sums the region).
        self.complete_index_copy()?;
        self.sync_frozen()?;
        let depth = self.depth();
        if first == 0 || first > last || last >= depth {
            return Err(DiskError::Invalid(format!(
                "cannot replace layers {first}..={last} of a {depth}-layer chain: \
                 the run must lie below the top"
            )));
        }
        self.check_run_end(last, expected_last)?;
        let new_layer = Layer::open(merged, first, false, Some(Format::Qcow2))?;
        self.check_replacement(first, last, &new_layer)?;
        let merged_name = file_name(merged)?;
        let owners = self.renumbered_owners(first, last)?;
        let child = last as usize; // 0-based position of the layer above the run
        let old_name = self.set_backing_in_memory(child, Some(merged_name));
        if let Some(writer) = self.writer.take() {
            // Closing writes the top's header: with the new backing name
            // when the top is the layer above the run.
            if let Err(e) = writer.into_inner().close(&self.chain) {
                self.set_backing_in_memory(child, old_name);
                let w = Writer::start(&self.chain)?;
                self.writer = Some(Mutex::new(w));
                return Err(e);
            }
            self.chain.splice(first, last, new_layer, SPLICED);
            let owners = owners.filter(|o| o.len() as u64 == self.units());
            let w = Writer::start_with_owners(&self.chain, owners.as_deref())?;
            self.writer = Some(Mutex::new(w));
        } else {
            self.chain.splice(first, last, new_layer, SPLICED);
        }
        debug_assert!(
            self.links_are_consistent(),
            "chain links broken by a splice"
        );
        Ok(())
    }

    /// Checks that layer `last` is the file `expected`.
    fn check_run_end(&self, last: u32, expected: &Path) -> Result<()> {
        let layer = &self.chain.layers[last as usize - 1];
        let have = layer.file.metadata()?;
        let want = std::fs::metadata(expected)
            .map_err(|e| DiskError::Invalid(format!("{}: {e}", expected.display())))?;
        if (have.dev(), have.ino()) != (want.dev(), want.ino()) {
            return Err(DiskError::Invalid(format!(
                "layer {last} of {} is {}, not {}: the chain changed",
                self.top().path().display(),
                layer.path().display(),
                expected.display()
            )));
        }
        Ok(())
    }

    /// Checks that `merged` can stand for layers `first..=last`: same size
    /// as the run's top and backed by the layer below the run.
    fn check_replacement(&self, first: u32, last: u32, merged: &Layer) -> Result<()> {
        let run_top = &self.chain.layers[last as usize - 1];
        if merged.size() != run_top.size() {
            return Err(DiskError::Invalid(format!(
                "{} is {} bytes but the layers it replaces are {}",
                merged.path().display(),
                merged.size(),
                run_top.size()
            )));
        }
        let backing = merged.header().and_then(|h| h.backing_file);
        let expected = (first > 1).then(|| &self.chain.layers[first as usize - 2]);
        let matches = match (&backing, expected) {
            (None, None) => true,
            (Some(name), Some(lower)) => Path::new(name).file_name() == lower.path().file_name(),
            _ => false,
        };
        if !matches {
            return Err(DiskError::Invalid(format!(
                "{} is backed by {:?}, not by the layer below the run",
                merged.path().display(),
                backing
            )));
        }
        Ok(())
    }

    /// The owner of every unit, renumbered for the chain after the splice,
    /// when the disk has a valid index to read them from.
    fn renumbered_owners(&self, first: u32, last: u32) -> Result<Option<Vec<u16>>> {
        if self.chain.index.read().is_none() {
            return Ok(None);
        }
        let removed = (last - first) as u16;
        let (first, last) = (first as u16, last as u16);
        let mut owners = self.owners(0, self.units() as usize)?;
        for o in owners.iter_mut() {
            if *o > last {
                *o -= removed;
            } else if *o >= first {
                *o = first;
            }
        }
        Ok(Some(owners))
    }

    /// Sets the in-memory backing name of layer `pos` (0-based); returns
    /// the old one.
    fn set_backing_in_memory(&self, pos: usize, name: Option<String>) -> Option<String> {
        let q = self.chain.layers[pos].qcow2.as_ref()?;
        let mut h = q.header.write();
        std::mem::replace(&mut h.backing_file, name)
    }

    /// Whether every layer's stored backing name names the layer below it.
    fn links_are_consistent(&self) -> bool {
        self.chain.layers.windows(2).all(|pair| {
            let backing = pair[1].header().and_then(|h| h.backing_file);
            backing
                .as_deref()
                .map(|b| PathBuf::from(b).file_name().map(|n| n.to_owned()))
                == Some(pair[0].path().file_name().map(|n| n.to_owned()))
        })
    }
}

fn file_name(path: &Path) -> Result<String> {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| DiskError::Invalid(format!("{} has no file name", path.display())))
}

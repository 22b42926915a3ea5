//! How large a new image would be (`qemu-img measure`), computed as QEMU
//! 10 computes it, so the numbers match to the byte.

use std::path::Path;

use crate::disk::{Disk, OpenOptions};
use crate::error::{DiskError, Result};
use crate::layer::Format;

/// Largest L1 table QEMU creates (32 MiB).
const MAX_L1_BYTES: u64 = 32 << 20;

/// The image to be created.
#[derive(Debug, Clone)]
pub struct MeasureTarget {
    /// Its format.
    pub format: Format,
    /// Cluster size (qcow2).
    pub cluster_size: u64,
    /// qcow2 version (2 or 3).
    pub version: u32,
    /// Refcount width in bits (qcow2).
    pub refcount_bits: u32,
    /// Extended L2 entries (qcow2).
    pub extended_l2: bool,
    /// The target will have a backing file: every cluster may differ from
    /// it, so all are counted.
    pub has_backing: bool,
    /// `preallocation=full` or `falloc`: every data cluster is counted.
    pub full_preallocation: bool,
}

impl Default for MeasureTarget {
    fn default() -> Self {
        MeasureTarget {
            format: Format::Qcow2,
            cluster_size: 65536,
            version: 3,
            refcount_bits: 16,
            extended_l2: false,
            has_backing: false,
            full_preallocation: false,
        }
    }
}

/// What to measure: a size, or an existing image (whole chain).
#[derive(Debug, Clone, Copy)]
pub enum MeasureSource<'a> {
    /// A new empty image of this many bytes.
    Size(u64),
    /// The content of this image, in this format (probed when `None`).
    Image(&'a Path, Option<Format>),
}

/// qemu-img measure's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Measurement {
    /// Bytes of persistent bitmaps to copy (printed by qemu-img for a
    /// qcow2 v3 target measured from a qcow2 image).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bitmaps: Option<u64>,
    /// File size the new image needs for the content.
    pub required: u64,
    /// File size if every cluster were allocated.
    #[serde(rename = "fully-allocated")]
    pub fully_allocated: u64,
}

/// Measures `source` converted to `target`.
pub fn measure(source: MeasureSource<'_>, target: &MeasureTarget) -> Result<Measurement> {
    let disk = match source {
        MeasureSource::Size(_) => None,
        MeasureSource::Image(path, format) => Some(Disk::open(
            path,
            &OpenOptions {
                format,
                cache_bytes: 4 << 20,
                ..OpenOptions::read_only()
            },
        )?),
    };
    let size = disk.as_ref().map_or_else(
        || match source {
            MeasureSource::Size(s) => s,
            MeasureSource::Image(..) => 0,
        },
        Disk::size,
    );
    match target.format {
        Format::Raw => {
            let required = match &disk {
                Some(_) => size,
                None => size.div_ceil(512) * 512,
            };
            Ok(Measurement {
                bitmaps: None,
                required,
                fully_allocated: required,
            })
        }
        Format::Qcow2 => measure_qcow2(disk.as_ref(), size, target),
    }
}

fn measure_qcow2(disk: Option<&Disk>, size: u64, t: &MeasureTarget) -> Result<Measurement> {
    let cs = t.cluster_size;
    if !cs.is_power_of_two() || !(512..=(2 << 20)).contains(&cs) {
        return Err(DiskError::Invalid(format!(
            "cluster size must be a power of two between 512 and 2M, not {cs}"
        )));
    }
    if !t.refcount_bits.is_power_of_two() || t.refcount_bits > 64 {
        return Err(DiskError::Invalid(format!(
            "refcount_bits must be a power of two up to 64, not {}",
            t.refcount_bits
        )));
    }
    let virtual_size = size.div_ceil(cs) * cs;
    let l2_tables = (virtual_size / cs).div_ceil(cs / 8);
    if l2_tables * 8 > MAX_L1_BYTES {
        return Err(DiskError::Invalid(
            "the image size is too large (try using a larger cluster size)".into(),
        ));
    }
    let data = match disk {
        _ if t.full_preallocation => virtual_size,
        Some(_) if t.has_backing => virtual_size,
        Some(d) => allocated_data(d, cs)?,
        None => 0,
    };
    let fully_allocated = prealloc_size(
        virtual_size,
        cs,
        t.refcount_bits.trailing_zeros(),
        t.extended_l2,
    );
    let bitmaps = match disk {
        Some(d) if t.version >= 3 && d.top().format() == Format::Qcow2 => {
            if d.top().header().is_some_and(|h| h.has_bitmaps()) {
                return Err(DiskError::Unsupported {
                    place: d.top().place().clone(),
                    detail: "measuring an image with persistent bitmaps".into(),
                });
            }
            Some(0)
        }
        _ => None,
    };
    Ok(Measurement {
        bitmaps,
        required: fully_allocated - virtual_size + data,
        fully_allocated,
    })
}

/// Bytes of target clusters that the source's data touches, counted the
/// way QEMU counts them (zero and unallocated runs are skipped; a data
/// run is extended to the end of its target cluster).
fn allocated_data(disk: &Disk, cs: u64) -> Result<u64> {
    let runs = if disk.depth() == 1 && disk.top().format() == Format::Raw {
        raw_data_runs(disk.top().path(), disk.size())?
    } else {
        chain_data_runs(disk)?
    };
    let mut required = 0;
    let mut pos = 0;
    for (start, end) in runs {
        if end <= pos {
            continue;
        }
        let start = start.max(pos);
        let end = end.div_ceil(cs) * cs;
        required += start % cs + (end - start);
        pos = end;
    }
    Ok(required)
}

/// Runs of the chain that hold data (not zero, not unallocated).
fn chain_data_runs(disk: &Disk) -> Result<Vec<(u64, u64)>> {
    let size = disk.size();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut offset = 0;
    while offset < size {
        let statuses = disk.block_status(offset, size - offset, 1024)?;
        if statuses.is_empty() {
            return Err(DiskError::Invalid("block status returned nothing".into()));
        }
        for s in statuses {
            let end = offset + s.length;
            if !s.zero {
                match runs.last_mut() {
                    Some(last) if last.1 == offset => last.1 = end,
                    _ => runs.push((offset, end)),
                }
            }
            offset = end;
        }
    }
    Ok(runs)
}

/// Runs of a raw file that hold data: what is not a hole in the file
/// (QEMU's file driver reports holes as zeros).
fn raw_data_runs(path: &Path, size: u64) -> Result<Vec<(u64, u64)>> {
    use std::os::unix::io::AsRawFd;
    let file = std::fs::File::open(path)
        .map_err(|e| DiskError::Invalid(format!("{}: open: {e}", path.display())))?;
    let fd = file.as_raw_fd();
    let seek = |at: u64, whence: libc::c_int| -> Option<u64> {
        let at = libc::off_t::try_from(at).ok()?;
        // SAFETY: lseek on a descriptor this function owns; no memory is touched.
        let r = unsafe { libc::lseek(fd, at, whence) };
        u64::try_from(r).ok()
    };
    let mut runs = Vec::new();
    let mut pos = 0;
    while pos < size {
        let Some(data) = seek(pos, libc::SEEK_DATA) else {
            // ENXIO: no data after `pos`. Anything else: the file system
            // cannot tell holes, so the rest counts as data.
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::ENXIO) {
                runs.push((pos, size));
            }
            break;
        };
        if data >= size {
            break;
        }
        let hole = seek(data, libc::SEEK_HOLE).unwrap_or(size).min(size);
        runs.push((data, hole));
        pos = hole.max(data + 1);
    }
    Ok(runs)
}

/// QEMU's `qcow2_calc_prealloc_size`: file size of a fully allocated
/// image, metadata included.
fn prealloc_size(virtual_size: u64, cs: u64, refcount_order: u32, extended_l2: bool) -> u64 {
    let entry = if extended_l2 { 16 } else { 8 };
    let mut meta = cs; // header
    let l2_entries = (virtual_size / cs).div_ceil(cs / entry) * (cs / entry);
    meta += l2_entries * entry;
    let l1_entries = (l2_entries * entry / cs).div_ceil(cs / 8) * (cs / 8);
    meta += l1_entries * 8;
    meta += refcount_metadata_size((meta + virtual_size) / cs, cs, refcount_order);
    meta + virtual_size
}

/// QEMU's `qcow2_refcount_metadata_size`: refcount table and blocks for
/// `clusters` clusters, their own included (a fixed point).
fn refcount_metadata_size(clusters: u64, cs: u64, refcount_order: u32) -> u64 {
    let blocks_per_table_cluster = cs / 8;
    let refcounts_per_block = cs * 8 / (1 << refcount_order);
    let (mut table, mut blocks, mut n) = (0u64, 0u64, 0u64);
    loop {
        let last = n;
        blocks = (clusters + table + blocks).div_ceil(refcounts_per_block);
        table = blocks.div_ceil(blocks_per_table_cluster);
        n = clusters + blocks + table;
        if n == last {
            break;
        }
    }
    (blocks + table) * cs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_img_10_figures_for_a_new_image() {
        // `qemu-img measure -O qcow2 --size 10G` and `-o cluster_size=4k --size 1G`.
        let m = measure(MeasureSource::Size(10 << 30), &MeasureTarget::default()).expect("m");
        assert_eq!((m.required, m.fully_allocated), (1_900_544, 10_739_318_784));
        let small = MeasureTarget {
            cluster_size: 4096,
            ..MeasureTarget::default()
        };
        let m = measure(MeasureSource::Size(1 << 30), &small).expect("m");
        assert_eq!((m.required, m.fully_allocated), (2_637_824, 1_076_379_648));
    }
}

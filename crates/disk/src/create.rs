//! Creating images, and external snapshots (a new top layer that carries
//! the chain index forward).

use std::path::{Path, PathBuf};
use std::time::Instant;

use strata_format::header::{
    CompressionType, Header, HeaderExtension, AUTOCLEAR_STRATA_INDEX, COMPAT_LAZY_REFCOUNTS,
    INCOMPAT_COMPRESSION, V2_HEADER_LEN, V3_HEADER_LEN,
};
use strata_format::index::{ChainIndexExt, MAX_CHAIN_DEPTH, MAX_REGION_BYTES};
use strata_format::refcount;

use crate::chain_index::{crc32c_of_zeros, new_uuid};
use crate::disk::{Disk, OpenOptions};
use crate::error::{DiskError, Place, Result};
use crate::layer::Format;
use crate::lock::{ImageLock, LockMode};

/// Units of owners copied per chunk when carrying an index forward.
const OWNER_CHUNK: u64 = 1 << 18;

/// Options of a new image, named as qemu-img names them.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// Format of the new image.
    pub format: Format,
    /// Virtual size; defaults to the backing file's.
    pub size: Option<u64>,
    /// Cluster size in bytes (512 B to 2 MiB, a power of two).
    pub cluster_size: u64,
    /// qcow2 version: 2 ("0.10") or 3 ("1.1").
    pub version: u32,
    /// Refcount width in bits (1 to 64, a power of two).
    pub refcount_bits: u32,
    /// Enable lazy refcounts (v3).
    pub lazy_refcounts: bool,
    /// Compression type recorded for compressed clusters.
    pub compression: CompressionType,
    /// Backing file name, as it will be stored (relative names are relative
    /// to the new image's directory).
    pub backing: Option<String>,
    /// Backing file format; probed when `None`.
    pub backing_format: Option<Format>,
    /// Store a chain index in the new image (v3 only).
    pub chain_index: bool,
    /// Extended L2 entries: 32 subclusters per cluster, allocated one by
    /// one (v3, clusters of 16 KiB or more). Off by default, as in QEMU.
    pub extended_l2: bool,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            format: Format::Qcow2,
            size: None,
            cluster_size: 65536,
            version: 3,
            refcount_bits: 16,
            lazy_refcounts: false,
            compression: CompressionType::Zlib,
            backing: None,
            backing_format: None,
            chain_index: true,
            extended_l2: false,
        }
    }
}

/// What a create did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CreateReport {
    /// The new image.
    pub path: PathBuf,
    /// Its virtual size.
    pub size: u64,
    /// Layers in its chain, itself included.
    pub depth: u32,
    /// Bytes of chain index it stores (0 if none).
    pub index_bytes: u64,
    /// Length of the new file.
    pub file_bytes: u64,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// Creates an image. With a backing file, the new image's chain index is
/// carried forward from the chain below: no data is copied, and the cost
/// is one pass over the index (2 bytes per cluster), not over the chain.
pub fn create(path: &Path, opts: &CreateOptions) -> Result<CreateReport> {
    let backing = match &opts.backing {
        Some(name) => {
            let dir = path.parent().unwrap_or(Path::new("."));
            let full = if Path::new(name).is_absolute() {
                PathBuf::from(name)
            } else {
                dir.join(name)
            };
            let ro = OpenOptions {
                format: opts.backing_format,
                ..OpenOptions::read_only()
            };
            Some(Disk::open(&full, &ro)?)
        }
        None => None,
    };
    create_on(path, opts, backing.as_ref())
}

/// Creates an image on top of an already open chain (`backing`, whose top
/// file `opts.backing` names): the index is carried forward from it
/// without reopening any layer.
pub(crate) fn create_on(
    path: &Path,
    opts: &CreateOptions,
    backing: Option<&Disk>,
) -> Result<CreateReport> {
    create_with(path, opts, backing, Carry::Owners).map(|c| c.report)
}

/// How a new layer's chain index is filled.
pub(crate) enum Carry {
    /// The resolved owners of the chain below: the index is valid at once.
    Owners,
    /// Nothing yet: the region is reserved (it reads as zeros) and stored
    /// invalid (no checksum, autoclear bit clear), for a prepared top whose
    /// push writes the lineage and whose owners are copied from the layer
    /// below after the push (see [`crate::lazy_index`]).
    Reserved,
}

/// What [`create_with`] made.
pub(crate) struct Created {
    pub(crate) report: CreateReport,
    /// The header written (`None` for raw images).
    pub(crate) header: Option<Header>,
    /// The index stored, if any.
    pub(crate) index: Option<ChainIndexExt>,
}

/// [`create_on`], with the way the index is filled chosen by `carry`.
pub(crate) fn create_with(
    path: &Path,
    opts: &CreateOptions,
    backing: Option<&Disk>,
    carry: Carry,
) -> Result<Created> {
    let started = Instant::now();
    let place = Place {
        depth: 0,
        path: path.to_path_buf(),
    };
    let size = match (opts.size, backing) {
        (Some(s), _) => s,
        (None, Some(b)) => b.size(),
        (None, None) => {
            return Err(DiskError::Invalid(
                "an image size is required when there is no backing file".into(),
            ))
        }
    };
    if opts.format == Format::Raw {
        if backing.is_some() {
            return Err(DiskError::Invalid(
                "raw images cannot have a backing file".into(),
            ));
        }
        let (f, _lock) = open_for_create(path, &place)?;
        f.set_len(size)
            .map_err(|e| DiskError::io(&place, "truncate", e))?;
        return Ok(Created {
            report: CreateReport {
                path: path.to_path_buf(),
                size,
                depth: 1,
                index_bytes: 0,
                file_bytes: size,
                seconds: started.elapsed().as_secs_f64(),
            },
            header: None,
            index: None,
        });
    }
    let geometry = Geometry::new(opts, size)?;
    let depth = backing.map_or(0, Disk::depth) + 1;
    if depth > MAX_CHAIN_DEPTH {
        return Err(DiskError::Chain(format!(
            "a chain is limited to {MAX_CHAIN_DEPTH} layers"
        )));
    }
    let unit_bits = backing.map_or(geometry.unit_bits, |b| {
        b.chain.unit_bits.min(geometry.unit_bits)
    });
    let with_index = opts.chain_index
        && opts.version >= 3
        && ChainIndexExt::region_len_for(size, unit_bits, depth) <= MAX_REGION_BYTES;
    let index = with_index.then(|| {
        let region_len = ChainIndexExt::region_len_for(size, unit_bits, depth);
        ChainIndexExt {
            region_offset: geometry.end,
            region_len,
            depth,
            granularity_bits: unit_bits,
            virtual_size: size,
            layer_uuid: [0; 16],
            crc32c: 0,
        }
    });
    let mut header = geometry.header(opts, size);
    let (file, _lock) = open_for_create(path, &place)?;
    let write = |buf: &[u8], at: u64| -> Result<()> {
        use std::os::unix::fs::FileExt;
        file.write_all_at(buf, at)
            .map_err(|e| DiskError::io(&place, "write", e))
    };
    write(&geometry.reftable_bytes(), geometry.reftable_offset)?;
    for (i, block) in geometry.refblocks().into_iter().enumerate() {
        write(&block, geometry.refblock_offset + i as u64 * geometry.cs)?;
    }
    let mut file_end = geometry.end;
    let index_bytes = index.as_ref().map_or(0, |i| i.region_len);
    let mut stored = None;
    if let Some(mut ext) = index {
        ext.layer_uuid = new_uuid()?;
        match (carry, backing) {
            (Carry::Owners, _) => {
                ext.crc32c = write_carried_index(&ext, backing, &write)?;
                header.autoclear_features |= AUTOCLEAR_STRATA_INDEX;
            }
            (Carry::Reserved, _) => {}
        }
        file_end = ext.region_offset + ext.region_len.div_ceil(geometry.cs) * geometry.cs;
        header
            .extensions
            .push(HeaderExtension::ChainIndex(ext.clone()));
        stored = Some(ext);
    }
    let hbytes = header.encode().map_err(|e| DiskError::format(&place, e))?;
    write(&hbytes, 0)?;
    file.set_len(file_end)
        .map_err(|e| DiskError::io(&place, "truncate", e))?;
    file.sync_all()
        .map_err(|e| DiskError::io(&place, "fsync", e))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        // Make the new name durable too; failure here is not fatal.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(Created {
        report: CreateReport {
            path: path.to_path_buf(),
            size,
            depth,
            index_bytes,
            file_bytes: file_end,
            seconds: started.elapsed().as_secs_f64(),
        },
        header: Some(header),
        index: stored,
    })
}

/// Writes the new layer's index: the owners of the chain below (expanded if
/// the new layer's clusters are smaller), then the lineage. Returns the
/// region's CRC-32C.
fn write_carried_index(
    ext: &ChainIndexExt,
    backing: Option<&Disk>,
    write: &dyn Fn(&[u8], u64) -> Result<()>,
) -> Result<u32> {
    let units = ext.entry_count();
    let mut crc = 0u32;
    let mut at = ext.region_offset;
    let mut emit = |bytes: &[u8], crc: &mut u32| -> Result<()> {
        *crc = crc32c::crc32c_append(*crc, bytes);
        write(bytes, at)?;
        at += bytes.len() as u64;
        Ok(())
    };
    match backing {
        // Nothing below owns anything: the owners are all zeros, which the
        // region reads as while it is a hole of the file (the caller sets
        // the file's length past it). Writing them would cost a megabyte
        // per gibibyte of a new volume, and as much again to discard when
        // it is deleted.
        None => crc = crc32c_of_zeros(units * 2),
        Some(b) => {
            let shift = b.chain.unit_bits - ext.granularity_bits;
            let below_units = b.units();
            let mut unit = 0u64;
            while unit < units {
                let count = (units - unit).min(OWNER_CHUNK);
                let src_first = unit >> shift;
                let src_last = ((unit + count - 1) >> shift).min(below_units.saturating_sub(1));
                let src = if src_first < below_units {
                    b.owners(src_first, (src_last - src_first + 1) as usize)?
                } else {
                    Vec::new()
                };
                let mut bytes = Vec::with_capacity(count as usize * 2);
                for u in unit..unit + count {
                    let s = (u >> shift).checked_sub(src_first);
                    let owner = s.and_then(|s| src.get(s as usize)).copied().unwrap_or(0);
                    bytes.extend_from_slice(&owner.to_be_bytes());
                }
                emit(&bytes, &mut crc)?;
                unit += count;
            }
            let lineage: Vec<u8> = b.lineage()?.iter().flat_map(|i| i.encode()).collect();
            emit(&lineage, &mut crc)?;
        }
    }
    Ok(crc)
}

/// Where a new image's metadata goes: header, refcount table, refcount
/// blocks, L1 table, then (unrefcounted) the chain index.
struct Geometry {
    cs: u64,
    cluster_bits: u32,
    /// log2 of the allocation unit: the subcluster with extended L2.
    unit_bits: u32,
    refcount_order: u32,
    l1_entries: u64,
    reftable_offset: u64,
    reftable_clusters: u64,
    refblock_offset: u64,
    refblocks: u64,
    l1_offset: u64,
    /// First byte after the refcounted metadata.
    end: u64,
}

impl Geometry {
    fn new(opts: &CreateOptions, size: u64) -> Result<Geometry> {
        let cs = opts.cluster_size;
        if !cs.is_power_of_two() || !(512..=2 * 1024 * 1024).contains(&cs) {
            return Err(DiskError::Invalid(format!(
                "cluster size {cs} must be a power of two between 512 B and 2 MiB"
            )));
        }
        if opts.version != 2 && opts.version != 3 {
            return Err(DiskError::Invalid(format!(
                "qcow2 version {} (use compat=0.10 for 2 or compat=1.1 for 3)",
                opts.version
            )));
        }
        let rb = opts.refcount_bits;
        if !rb.is_power_of_two() || rb > 64 || (opts.version == 2 && rb != 16) {
            return Err(DiskError::Invalid(format!(
                "refcount_bits {rb} must be a power of two up to 64 (16 for version 2)"
            )));
        }
        if opts.version == 2 && (opts.lazy_refcounts || opts.compression != CompressionType::Zlib) {
            return Err(DiskError::Invalid(
                "lazy refcounts and zstd compression need compat=1.1 (version 3)".into(),
            ));
        }
        if size >= strata_format::MAX_HOST_OFFSET {
            return Err(DiskError::Invalid(format!(
                "size {size} exceeds the qcow2 limit"
            )));
        }
        let cluster_bits = cs.trailing_zeros();
        if opts.extended_l2
            && (opts.version < 3 || cluster_bits < strata_format::entry::MIN_EXTENDED_CLUSTER_BITS)
        {
            return Err(DiskError::Invalid(format!(
                "extended_l2=on needs compat=1.1 and a cluster size of at least 16 KiB (got {cs})"
            )));
        }
        let unit_bits = if opts.extended_l2 {
            cluster_bits - strata_format::entry::SUBCLUSTERS.trailing_zeros()
        } else {
            cluster_bits
        };
        let refcount_order = rb.trailing_zeros();
        let l1_entries = Header::l1_entries_for_l2(cluster_bits, opts.extended_l2, size).max(1);
        if l1_entries > strata_format::MAX_L1_ENTRIES {
            return Err(DiskError::Invalid(format!(
                "size {size} needs an L1 table of {l1_entries} entries (limit {}); use a larger cluster size",
                strata_format::MAX_L1_ENTRIES
            )));
        }
        let l1_clusters = (l1_entries * 8).div_ceil(cs);
        let epb = refcount::entries_per_block(cs, refcount_order);
        // Grow until the refcount blocks cover every metadata cluster and
        // the table covers every block.
        let (mut reftable_clusters, mut refblocks) = (1u64, 1u64);
        loop {
            let total = 1 + reftable_clusters + refblocks + l1_clusters;
            let need_blocks = total.div_ceil(epb);
            let need_table = (need_blocks * 8).div_ceil(cs);
            if need_blocks <= refblocks && need_table <= reftable_clusters {
                break;
            }
            refblocks = refblocks.max(need_blocks);
            reftable_clusters = reftable_clusters.max(need_table);
        }
        let reftable_offset = cs;
        let refblock_offset = reftable_offset + reftable_clusters * cs;
        let l1_offset = refblock_offset + refblocks * cs;
        Ok(Geometry {
            cs,
            cluster_bits,
            unit_bits,
            refcount_order,
            l1_entries,
            reftable_offset,
            reftable_clusters,
            refblock_offset,
            refblocks,
            l1_offset,
            end: l1_offset + l1_clusters * cs,
        })
    }

    fn header(&self, opts: &CreateOptions, size: u64) -> Header {
        let mut extensions = Vec::new();
        if opts.backing.is_some() {
            let fmt = opts.backing_format.unwrap_or(Format::Qcow2);
            extensions.push(HeaderExtension::BackingFormat(fmt.name().to_string()));
        }
        Header {
            version: opts.version,
            cluster_bits: self.cluster_bits,
            size,
            crypt_method: 0,
            l1_size: self.l1_entries as u32,
            l1_table_offset: self.l1_offset,
            refcount_table_offset: self.reftable_offset,
            refcount_table_clusters: self.reftable_clusters as u32,
            nb_snapshots: 0,
            snapshots_offset: 0,
            incompatible_features: if opts.compression == CompressionType::Zstd {
                INCOMPAT_COMPRESSION
            } else {
                0
            } | if opts.extended_l2 {
                strata_format::header::INCOMPAT_EXTL2
            } else {
                0
            },
            compatible_features: if opts.lazy_refcounts {
                COMPAT_LAZY_REFCOUNTS
            } else {
                0
            },
            autoclear_features: 0,
            refcount_order: self.refcount_order,
            header_length: if opts.version == 3 {
                V3_HEADER_LEN
            } else {
                V2_HEADER_LEN
            },
            compression_type: opts.compression,
            backing_file: opts.backing.clone(),
            extensions,
        }
    }

    fn reftable_bytes(&self) -> Vec<u8> {
        let mut t = vec![0u8; (self.reftable_clusters * self.cs) as usize];
        for i in 0..self.refblocks {
            let off = self.refblock_offset + i * self.cs;
            t[(i * 8) as usize..(i * 8 + 8) as usize].copy_from_slice(&off.to_be_bytes());
        }
        t
    }

    fn refblocks(&self) -> Vec<Vec<u8>> {
        let epb = refcount::entries_per_block(self.cs, self.refcount_order);
        let used = self.end / self.cs;
        (0..self.refblocks)
            .map(|b| {
                let mut block = vec![0u8; self.cs as usize];
                for i in 0..epb {
                    if b * epb + i < used {
                        refcount::set(&mut block, i, self.refcount_order, 1);
                    }
                }
                block
            })
            .collect()
    }
}

/// Opens `path` for a new image, creating it if need be, and empties it
/// only once its write lock is held: creating over an image that another
/// process has open is refused without touching a byte, as in QEMU.
fn open_for_create(path: &Path, place: &Place) -> Result<(std::fs::File, ImageLock)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| DiskError::io(place, "create", e))?;
    let lock = ImageLock::acquire(&file, path, LockMode::Write)?;
    file.set_len(0)
        .map_err(|e| DiskError::io(place, "truncate", e))?;
    Ok((file, lock))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_volume_leaves_its_owner_table_a_hole_and_opens_with_its_crc() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.qcow2");
        let opts = CreateOptions {
            size: Some(1 << 30),
            cluster_size: 4096,
            ..CreateOptions::default()
        };
        create(&path, &opts).unwrap();
        // 2 bytes of owner per 4 KiB unit of 1 GiB: 512 KiB not written.
        let allocated = std::fs::metadata(&path).unwrap().blocks() * 512;
        assert!(allocated < 256 * 1024, "{allocated} bytes allocated");
        let disk = Disk::open(&path, &OpenOptions::default()).unwrap();
        let state = disk.index_state();
        assert!(
            matches!(state, crate::chain_index::IndexState::Stored { .. }),
            "the stored index was not trusted: {state:?}"
        );
    }
}

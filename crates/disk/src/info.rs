//! Image information, shaped like `qemu-img info --output json` (QEMU
//! 10): the same keys, nesting and order, so that scripts written for
//! qemu-img (OpenStack, libvirt) parse Strata's output unchanged. Strata's
//! own details (the chain index) come as an extra key at the end.

use std::path::Path;

use serde::ser::{SerializeStruct, Serializer};
use strata_format::header::{COMPAT_LAZY_REFCOUNTS, INCOMPAT_CORRUPT, INCOMPAT_DIRTY};

use crate::disk::{Disk, IndexState, OpenOptions};
use crate::error::Result;
use crate::layer::{Format, Layer};
use crate::lock::LockMode;

/// qcow2 details, as qemu-img's "format-specific" data. Serialized inside
/// qemu-img's `{"type": "qcow2", "data": {...}}` wrapper; a version 2
/// image (compat 0.10) has no lazy-refcounts, corrupt or extended-l2 key,
/// as in qemu-img.
#[derive(Debug, Clone)]
pub struct Qcow2Details {
    /// "0.10" or "1.1".
    pub compat: String,
    /// "zlib" or "zstd".
    pub compression_type: String,
    /// Lazy refcounts enabled.
    pub lazy_refcounts: bool,
    /// Refcount width.
    pub refcount_bits: u32,
    /// Marked corrupt.
    pub corrupt: bool,
    /// Extended L2 entries (32 subclusters per cluster).
    pub extended_l2: bool,
    /// Persistent dirty bitmaps (listed only while the bitmaps autoclear
    /// bit says they are consistent, as qemu-img does).
    pub bitmaps: Vec<BitmapInfo>,
}

/// A persistent dirty bitmap, as qemu-img lists it (keys in its order).
#[derive(Debug, Clone, serde::Serialize)]
pub struct BitmapInfo {
    /// "in-use" and/or "auto".
    pub flags: Vec<String>,
    /// Name.
    pub name: String,
    /// Bytes per bit.
    pub granularity: u64,
}

impl Qcow2Details {
    /// Whether this is a version 2 image, whose details qemu-img lists
    /// without the version 3 keys.
    pub fn is_v2(&self) -> bool {
        self.compat == "0.10"
    }

    /// The details as qemu-img lists them, in its order: (key, value).
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        // The order is that of QEMU's QDict (a hash of the key), which is
        // what its JSON and human output both follow.
        let mut out = vec![
            ("compat", self.compat.clone()),
            ("compression-type", self.compression_type.clone()),
        ];
        if !self.is_v2() {
            out.push(("lazy-refcounts", self.lazy_refcounts.to_string()));
        }
        out.push(("refcount-bits", self.refcount_bits.to_string()));
        if !self.is_v2() {
            out.push(("corrupt", self.corrupt.to_string()));
            out.push(("extended-l2", self.extended_l2.to_string()));
        }
        out
    }
}

impl serde::Serialize for Qcow2Details {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let v3 = !self.is_v2();
        let mut s = serializer.serialize_struct("Qcow2Details", 7)?;
        s.serialize_field("compat", &self.compat)?;
        s.serialize_field("compression-type", &self.compression_type)?;
        if v3 {
            s.serialize_field("lazy-refcounts", &self.lazy_refcounts)?;
        }
        if !self.bitmaps.is_empty() {
            s.serialize_field("bitmaps", &self.bitmaps)?;
        }
        s.serialize_field("refcount-bits", &self.refcount_bits)?;
        if v3 {
            s.serialize_field("corrupt", &self.corrupt)?;
            s.serialize_field("extended-l2", &self.extended_l2)?;
        }
        s.end()
    }
}

/// qemu-img's tagged "format-specific" wrapper.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FormatSpecific<T> {
    /// The driver: "qcow2", "file".
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The driver's details.
    pub data: T,
}

/// Serializes the qcow2 details inside qemu-img's wrapper.
fn qcow2_specific<S: Serializer>(
    details: &Option<Qcow2Details>,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    match details {
        Some(d) => serde::Serialize::serialize(
            &FormatSpecific {
                kind: "qcow2",
                data: d,
            },
            serializer,
        ),
        None => serializer.serialize_none(),
    }
}

/// The protocol node under an image (qemu-img's child "file"): the host
/// file itself.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct FileNodeInfo {
    /// Always empty: a host file has no children.
    pub children: Vec<ChildInfo>,
    /// The file's length in bytes.
    pub virtual_size: u64,
    /// File name.
    pub filename: String,
    /// Always "file".
    pub format: String,
    /// Bytes allocated on the host.
    pub actual_size: u64,
    /// Always `{"type": "file", "data": {}}`.
    pub format_specific: FormatSpecific<EmptyObject>,
    /// Always false.
    pub dirty_flag: bool,
}

/// An empty JSON object, as qemu-img writes the data of a "file" node.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct EmptyObject {}

/// A child node of an image, as qemu-img lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChildInfo {
    /// The child's role: "file".
    pub name: String,
    /// The child node.
    pub info: FileNodeInfo,
}

/// Strata chain index details.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct IndexDetails {
    /// The autoclear bit is set (no other writer touched the image).
    pub flag_set: bool,
    /// Layers the index describes.
    pub depth: u32,
    /// Bytes of guest disk per entry.
    pub granularity: u64,
    /// Bytes of the index region.
    pub bytes: u64,
    /// Whether lookups use it when this image is the top (only known with
    /// the backing chain open).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_use: Option<bool>,
    /// Why not, when it is not used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// An internal snapshot, as listed by qemu-img (its keys in its order).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct SnapshotInfo {
    /// Instruction count at creation, when recorded (record/replay).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub icount: Option<u64>,
    /// Guest clock at creation: nanoseconds within the second.
    pub vm_clock_nsec: u64,
    /// Name.
    pub name: String,
    /// Creation time, seconds since the epoch.
    pub date_sec: u32,
    /// Creation time: nanoseconds within the second.
    pub date_nsec: u32,
    /// Guest clock at creation: whole seconds.
    pub vm_clock_sec: u64,
    /// ID.
    pub id: String,
    /// VM state size.
    pub vm_state_size: u64,
}

/// Information about one image file, with qemu-img's keys in its order.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ImageInfo {
    /// The host file under the image (qemu-img's child "file").
    pub children: Vec<ChildInfo>,
    /// Backing file format as stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backing_filename_format: Option<String>,
    /// Internal snapshots.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotInfo>,
    /// Virtual size in bytes.
    pub virtual_size: u64,
    /// File name as given (for backing files: as resolved).
    pub filename: String,
    /// Cluster size (qcow2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_size: Option<u64>,
    /// "qcow2" or "raw".
    pub format: String,
    /// Bytes allocated on the host.
    pub actual_size: u64,
    /// qcow2 details.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "qcow2_specific"
    )]
    pub format_specific: Option<Qcow2Details>,
    /// Backing file name resolved against this image's directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full_backing_filename: Option<String>,
    /// Backing file name as stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backing_filename: Option<String>,
    /// The dirty bit is set.
    pub dirty_flag: bool,
    /// Strata chain index (not in qemu-img's output).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain_index: Option<IndexDetails>,
}

/// Information about one image, without opening its backing chain.
/// With `force_share`, the image may be in use by a writer (qemu-img's
/// `-U`); without it such an image is refused, as qemu-img refuses it.
pub fn info(path: &Path, format: Option<Format>, force_share: bool) -> Result<ImageInfo> {
    let lock = if force_share {
        LockMode::ForceShare
    } else {
        LockMode::Read
    };
    let layer = Layer::open_locked(path, 0, false, format, lock)?;
    describe(&layer, path.display().to_string())
}

/// Information about every image of a chain, top first (`force_share`
/// as in [`info`]).
pub fn chain_info(
    path: &Path,
    format: Option<Format>,
    force_share: bool,
) -> Result<Vec<ImageInfo>> {
    let disk = Disk::open(
        path,
        &OpenOptions {
            format,
            force_share,
            ..OpenOptions::read_only()
        },
    )?;
    let mut out = Vec::new();
    for (i, layer) in disk.layers().iter().enumerate().rev() {
        let mut inf = describe(layer, layer.path().display().to_string())?;
        if i + 1 == disk.layers().len() {
            if let Some(ci) = inf.chain_index.as_mut() {
                match disk.index_state() {
                    IndexState::Stored { .. } => ci.in_use = Some(true),
                    IndexState::Walk { reason } => {
                        ci.in_use = Some(false);
                        ci.reason = Some(reason);
                    }
                }
            }
        }
        out.push(inf);
    }
    Ok(out)
}

fn describe(layer: &Layer, filename: String) -> Result<ImageInfo> {
    let actual_size = layer.allocated_bytes();
    let file = FileNodeInfo {
        children: Vec::new(),
        // QEMU counts the file in whole 512-byte sectors.
        virtual_size: layer.file_len().div_ceil(512) * 512,
        filename: filename.clone(),
        format: "file".into(),
        actual_size,
        format_specific: FormatSpecific {
            kind: "file",
            data: EmptyObject {},
        },
        dirty_flag: false,
    };
    let mut inf = ImageInfo {
        children: vec![ChildInfo {
            name: "file".into(),
            info: file,
        }],
        backing_filename_format: None,
        snapshots: Vec::new(),
        virtual_size: layer.size(),
        filename,
        cluster_size: None,
        format: layer.format().name().into(),
        actual_size,
        format_specific: None,
        full_backing_filename: None,
        backing_filename: None,
        dirty_flag: false,
        chain_index: None,
    };
    let Some(h) = layer.header() else {
        return Ok(inf);
    };
    inf.cluster_size = Some(h.cluster_size());
    inf.dirty_flag = h.incompatible_features & INCOMPAT_DIRTY != 0;
    if let Some(b) = &h.backing_file {
        inf.backing_filename = Some(b.clone());
        let dir = layer.path().parent().unwrap_or(Path::new(""));
        let full = if Path::new(b).is_absolute() {
            b.clone()
        } else {
            dir.join(b).display().to_string()
        };
        inf.full_backing_filename = Some(full);
        inf.backing_filename_format = h.backing_format().map(str::to_owned);
    }
    inf.format_specific = Some(Qcow2Details {
        compat: if h.version == 2 { "0.10" } else { "1.1" }.into(),
        compression_type: h.compression_type.name().into(),
        lazy_refcounts: h.compatible_features & COMPAT_LAZY_REFCOUNTS != 0,
        refcount_bits: h.refcount_bits(),
        corrupt: h.incompatible_features & INCOMPAT_CORRUPT != 0,
        extended_l2: h.extended_l2(),
        bitmaps: bitmaps(layer, &h)?,
    });
    if h.nb_snapshots > 0 {
        let avail = layer
            .file_len()
            .saturating_sub(h.snapshots_offset)
            .min(64 << 20);
        let mut buf = vec![0u8; avail as usize];
        layer.file.read_exact_at(&mut buf, h.snapshots_offset)?;
        let (snaps, _) = strata_format::snapshot::parse_table(&buf, h.nb_snapshots)
            .map_err(|e| crate::DiskError::format(layer.place(), e))?;
        let extras = snapshot_extras(&buf, snaps.len());
        inf.snapshots = snaps
            .into_iter()
            .zip(extras)
            .map(|(s, (date_nsec, icount))| SnapshotInfo {
                icount,
                vm_clock_nsec: s.vm_clock_nsec % 1_000_000_000,
                name: s.name,
                date_sec: s.date_sec,
                date_nsec,
                vm_clock_sec: s.vm_clock_nsec / 1_000_000_000,
                id: s.id,
                vm_state_size: s.vm_state_size,
            })
            .collect();
    }
    if let Some(ext) = h.chain_index() {
        inf.chain_index = Some(IndexDetails {
            flag_set: h.chain_index_valid(),
            depth: ext.depth,
            granularity: 1 << ext.granularity_bits,
            bytes: ext.region_len,
            in_use: None,
            reason: None,
        });
    }
    Ok(inf)
}

/// The fields of each snapshot table entry that the format parser leaves
/// out and qemu-img lists: (date nanoseconds, icount if recorded). The
/// table was validated by the parser; a short read gives zeros.
fn snapshot_extras(buf: &[u8], count: usize) -> Vec<(u32, Option<u64>)> {
    let u16_at = |at: usize| {
        buf.get(at..at + 2)
            .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        buf.get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u32::from_be_bytes)
    };
    let u64_at = |at: usize| {
        buf.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
    };
    let mut out = Vec::with_capacity(count);
    let mut at = 0usize;
    for _ in 0..count {
        let id_len = usize::from(u16_at(at + 12));
        let name_len = usize::from(u16_at(at + 14));
        let extra_len = u32_at(at + 36) as usize;
        // QEMU records icount in the third word of the extra data; -1
        // means not recorded.
        let icount = if extra_len >= 24 {
            u64_at(at + 40 + 16).filter(|&n| n != u64::MAX)
        } else {
            None
        };
        out.push((u32_at(at + 20), icount));
        at = (at + 40 + extra_len + id_len + name_len).div_ceil(8) * 8;
    }
    out
}

/// The persistent bitmaps of a qcow2 image, from its bitmap directory;
/// none when the bitmaps autoclear bit is clear (a writer without bitmap
/// support touched the image, and QEMU then ignores them).
fn bitmaps(layer: &Layer, h: &strata_format::header::Header) -> Result<Vec<BitmapInfo>> {
    use strata_format::header::{AUTOCLEAR_BITMAPS, EXT_BITMAPS};
    use strata_format::HeaderExtension;
    if h.autoclear_features & AUTOCLEAR_BITMAPS == 0 {
        return Ok(Vec::new());
    }
    let Some(ext) = h.extensions.iter().find_map(|e| match e {
        HeaderExtension::Other { kind, data } if *kind == EXT_BITMAPS => Some(data),
        _ => None,
    }) else {
        return Ok(Vec::new());
    };
    let word = |b: &[u8], at: usize, n: usize| -> u64 {
        b.get(at..at + n)
            .map_or(0, |w| w.iter().fold(0u64, |v, x| (v << 8) | u64::from(*x)))
    };
    let count = word(ext, 0, 4);
    let dir_size = word(ext, 8, 8);
    let dir_offset = word(ext, 16, 8);
    // QEMU caps the directory at 64 MiB; a larger one is not read.
    if dir_size == 0 || dir_size > 64 << 20 {
        return Ok(Vec::new());
    }
    let mut dir = vec![0u8; dir_size as usize];
    layer.file.read_exact_at(&mut dir, dir_offset)?;
    let mut out = Vec::new();
    let mut at = 0usize;
    for _ in 0..count {
        if at + 24 > dir.len() {
            break;
        }
        let flags = word(&dir, at + 12, 4);
        let granularity_bits = word(&dir, at + 17, 1);
        let name_len = word(&dir, at + 18, 2) as usize;
        let extra_len = word(&dir, at + 20, 4) as usize;
        let name_at = at + 24 + extra_len;
        let name = dir
            .get(name_at..name_at + name_len)
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .unwrap_or_default();
        let mut names = Vec::new();
        if flags & 1 != 0 {
            names.push("in-use".to_string());
        }
        if flags & 2 != 0 {
            names.push("auto".to_string());
        }
        out.push(BitmapInfo {
            flags: names,
            name,
            granularity: 1u64.checked_shl(granularity_bits as u32).unwrap_or(0),
        });
        at = (name_at + name_len).div_ceil(8) * 8;
    }
    Ok(out)
}

//! The qcow2 header (version 2 and 3) and its header extensions.

use crate::error::{FormatError, Reader};
use crate::index::{ChainIndexExt, CHAIN_INDEX_EXT_MAGIC};
use crate::*;

/// Header extension type: backing file format name.
pub const EXT_BACKING_FORMAT: u32 = 0xe279_2aca;
/// Header extension type: feature name table.
pub const EXT_FEATURE_TABLE: u32 = 0x6803_f857;
/// Header extension type: persistent bitmaps.
pub const EXT_BITMAPS: u32 = 0x2385_2875;
/// Header extension type: full disk encryption header pointer.
pub const EXT_CRYPTO: u32 = 0x0537_be77;
/// Header extension type: external data file name.
pub const EXT_DATA_FILE: u32 = 0x4441_5441;

/// Incompatible feature: refcounts may be inconsistent (lazy refcounts).
pub const INCOMPAT_DIRTY: u64 = 1 << 0;
/// Incompatible feature: image is corrupt, must not be written.
pub const INCOMPAT_CORRUPT: u64 = 1 << 1;
/// Incompatible feature: guest data lives in an external file.
pub const INCOMPAT_DATA_FILE: u64 = 1 << 2;
/// Incompatible feature: non-zlib compression type.
pub const INCOMPAT_COMPRESSION: u64 = 1 << 3;
/// Incompatible feature: extended L2 entries (subclusters).
pub const INCOMPAT_EXTL2: u64 = 1 << 4;
/// Compatible feature: lazy refcounts.
pub const COMPAT_LAZY_REFCOUNTS: u64 = 1 << 0;
/// Autoclear feature: persistent bitmaps are consistent.
pub const AUTOCLEAR_BITMAPS: u64 = 1 << 0;
/// Autoclear feature: Strata's chain index matches the chain.
///
/// QEMU clears every autoclear bit it does not know whenever it opens an
/// image for writing, so a set bit proves that no QEMU writer touched the
/// image since Strata stored the index.
pub const AUTOCLEAR_STRATA_INDEX: u64 = 1 << 62;

/// Size of the version 2 header.
pub const V2_HEADER_LEN: u32 = 72;
/// Header length Strata writes for version 3 (includes compression_type).
pub const V3_HEADER_LEN: u32 = 112;

/// Compression algorithm used by compressed clusters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompressionType {
    /// Raw deflate (type 0, the default).
    Zlib,
    /// Zstandard (type 1).
    Zstd,
}

impl CompressionType {
    /// Name as qemu-img prints it.
    pub fn name(self) -> &'static str {
        match self {
            CompressionType::Zlib => "zlib",
            CompressionType::Zstd => "zstd",
        }
    }
}

/// A header extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderExtension {
    /// Backing file format ("qcow2", "raw", ...).
    BackingFormat(String),
    /// Strata's chain index descriptor.
    ChainIndex(ChainIndexExt),
    /// Any other extension, kept verbatim so rewriting the header keeps it.
    Other {
        /// Extension type.
        kind: u32,
        /// Raw data (without padding).
        data: Vec<u8>,
    },
}

/// A parsed and validated qcow2 header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// 2 or 3.
    pub version: u32,
    /// log2 of the cluster size.
    pub cluster_bits: u32,
    /// Virtual disk size in bytes.
    pub size: u64,
    /// 0 none, 1 AES, 2 LUKS.
    pub crypt_method: u32,
    /// Entries in the active L1 table.
    pub l1_size: u32,
    /// Offset of the active L1 table.
    pub l1_table_offset: u64,
    /// Offset of the refcount table.
    pub refcount_table_offset: u64,
    /// Clusters the refcount table occupies.
    pub refcount_table_clusters: u32,
    /// Number of internal snapshots.
    pub nb_snapshots: u32,
    /// Offset of the snapshot table.
    pub snapshots_offset: u64,
    /// Incompatible feature bits.
    pub incompatible_features: u64,
    /// Compatible feature bits.
    pub compatible_features: u64,
    /// Autoclear feature bits.
    pub autoclear_features: u64,
    /// log2 of refcount width in bits.
    pub refcount_order: u32,
    /// Header length in bytes (72 for v2).
    pub header_length: u32,
    /// Compression type of compressed clusters.
    pub compression_type: CompressionType,
    /// Backing file name, if any.
    pub backing_file: Option<String>,
    /// Header extensions in file order.
    pub extensions: Vec<HeaderExtension>,
}

impl Header {
    /// Cluster size in bytes.
    pub fn cluster_size(&self) -> u64 {
        1u64 << self.cluster_bits
    }

    /// Whether L2 entries are extended (128 bits, with subclusters).
    pub fn extended_l2(&self) -> bool {
        self.incompatible_features & INCOMPAT_EXTL2 != 0
    }

    /// Bytes per L2 entry: 16 with extended L2 entries, else 8.
    pub fn l2_entry_bytes(&self) -> u64 {
        if self.extended_l2() {
            16
        } else {
            8
        }
    }

    /// L2 entries per L2 table.
    pub fn l2_entries(&self) -> u64 {
        self.cluster_size() / self.l2_entry_bytes()
    }

    /// Refcount width in bits.
    pub fn refcount_bits(&self) -> u32 {
        1 << self.refcount_order
    }

    /// L1 entries needed to map `size` bytes with this cluster size.
    pub fn l1_entries_for(cluster_bits: u32, size: u64) -> u64 {
        Self::l1_entries_for_l2(cluster_bits, false, size)
    }

    /// L1 entries needed to map `size` bytes with this cluster size and
    /// L2 entry width (extended entries halve what one L2 table maps).
    pub fn l1_entries_for_l2(cluster_bits: u32, extended: bool, size: u64) -> u64 {
        let cluster_size = 1u64 << cluster_bits;
        let entry = if extended { 16 } else { 8 };
        let per_l1 = cluster_size * (cluster_size / entry);
        size.div_ceil(per_l1)
    }

    /// Backing file format from its header extension.
    pub fn backing_format(&self) -> Option<&str> {
        self.extensions.iter().find_map(|e| match e {
            HeaderExtension::BackingFormat(f) => Some(f.as_str()),
            _ => None,
        })
    }

    /// Strata's chain index descriptor, whether or not it is still valid.
    pub fn chain_index(&self) -> Option<&ChainIndexExt> {
        self.extensions.iter().find_map(|e| match e {
            HeaderExtension::ChainIndex(c) => Some(c),
            _ => None,
        })
    }

    /// Whether the chain index descriptor is present and its autoclear bit
    /// says no other writer has touched the image since it was stored.
    pub fn chain_index_valid(&self) -> bool {
        self.autoclear_features & AUTOCLEAR_STRATA_INDEX != 0
            && self.incompatible_features & INCOMPAT_DIRTY == 0
            && self.chain_index().is_some()
    }

    /// Whether the image has persistent bitmaps.
    pub fn has_bitmaps(&self) -> bool {
        self.extensions
            .iter()
            .any(|e| matches!(e, HeaderExtension::Other { kind, .. } if *kind == EXT_BITMAPS))
    }

    /// Reads the cluster size from the first bytes of a file, so the caller
    /// knows how much to read before calling [`Header::parse`].
    pub fn peek_cluster_bits(buf: &[u8]) -> Result<u32, FormatError> {
        let r = Reader::new(buf, "qcow2 header");
        let magic = r.u32(0)?;
        if magic != QCOW2_MAGIC {
            return Err(FormatError::BadMagic(magic));
        }
        let cluster_bits = r.u32(20)?;
        check_cluster_bits(cluster_bits)?;
        Ok(cluster_bits)
    }

    /// Parses the header from the image's first cluster (or the whole file,
    /// if shorter). `file_len` is the image file's length; every offset in
    /// the header is checked against it.
    pub fn parse(cluster0: &[u8], file_len: u64) -> Result<Header, FormatError> {
        let r = Reader::new(cluster0, "qcow2 header");
        let magic = r.u32(0)?;
        if magic != QCOW2_MAGIC {
            return Err(FormatError::BadMagic(magic));
        }
        let version = r.u32(4)?;
        if version != 2 && version != 3 {
            return Err(FormatError::BadVersion(version));
        }
        let backing_file_offset = r.u64(8)?;
        let backing_file_size = r.u32(16)?;
        let cluster_bits = r.u32(20)?;
        check_cluster_bits(cluster_bits)?;
        let cluster_size = 1u64 << cluster_bits;
        let mut h = Header {
            version,
            cluster_bits,
            size: r.u64(24)?,
            crypt_method: r.u32(32)?,
            l1_size: r.u32(36)?,
            l1_table_offset: r.u64(40)?,
            refcount_table_offset: r.u64(48)?,
            refcount_table_clusters: r.u32(56)?,
            nb_snapshots: r.u32(60)?,
            snapshots_offset: r.u64(64)?,
            incompatible_features: 0,
            compatible_features: 0,
            autoclear_features: 0,
            refcount_order: 4,
            header_length: V2_HEADER_LEN,
            compression_type: CompressionType::Zlib,
            backing_file: None,
            extensions: Vec::new(),
        };
        if version == 3 {
            h.incompatible_features = r.u64(72)?;
            h.compatible_features = r.u64(80)?;
            h.autoclear_features = r.u64(88)?;
            h.refcount_order = r.u32(96)?;
            h.header_length = r.u32(100)?;
            if h.header_length < 104 || !h.header_length.is_multiple_of(8) {
                return Err(FormatError::invalid(
                    "header_length",
                    format!("{} (must be >= 104 and a multiple of 8)", h.header_length),
                ));
            }
            if u64::from(h.header_length) > cluster_size {
                return Err(FormatError::invalid(
                    "header_length",
                    format!(
                        "{} exceeds the cluster size {cluster_size}",
                        h.header_length
                    ),
                ));
            }
            let ctype = if h.header_length > 104 { r.u8(104)? } else { 0 };
            h.compression_type = match ctype {
                0 => CompressionType::Zlib,
                1 => CompressionType::Zstd,
                other => {
                    return Err(FormatError::Unsupported(format!(
                        "compression type {other}"
                    )))
                }
            };
            let has_bit = h.incompatible_features & INCOMPAT_COMPRESSION != 0;
            if has_bit != (ctype != 0) {
                return Err(FormatError::invalid(
                    "compression_type",
                    format!("type {ctype} does not match the compression-type feature bit"),
                ));
            }
        }
        h.validate_fields(file_len)?;
        h.parse_extensions(cluster0)?;
        if backing_file_offset != 0 {
            h.backing_file = Some(parse_backing_name(
                cluster0,
                backing_file_offset,
                backing_file_size,
            )?);
        }
        Ok(h)
    }

    fn validate_fields(&self, file_len: u64) -> Result<(), FormatError> {
        let cs = self.cluster_size();
        if self.refcount_order > 6 {
            return Err(FormatError::invalid(
                "refcount_order",
                format!("{} (at most 6, i.e. 64-bit refcounts)", self.refcount_order),
            ));
        }
        match self.crypt_method {
            0 => {}
            1 => return Err(FormatError::Unsupported("AES encryption".into())),
            2 => return Err(FormatError::Unsupported("LUKS encryption".into())),
            m => return Err(FormatError::invalid("crypt_method", format!("{m}"))),
        }
        let known = INCOMPAT_DIRTY
            | INCOMPAT_CORRUPT
            | INCOMPAT_DATA_FILE
            | INCOMPAT_COMPRESSION
            | INCOMPAT_EXTL2;
        if self.incompatible_features & !known != 0 {
            return Err(FormatError::Unsupported(format!(
                "unknown incompatible feature bits 0x{:x}",
                self.incompatible_features & !known
            )));
        }
        if self.incompatible_features & INCOMPAT_DATA_FILE != 0 {
            return Err(FormatError::Unsupported("external data file".into()));
        }
        if self.extended_l2() {
            if self.version < 3 {
                return Err(FormatError::invalid(
                    "incompatible_features",
                    "extended L2 entries in a version 2 image".to_string(),
                ));
            }
            if self.cluster_bits < crate::entry::MIN_EXTENDED_CLUSTER_BITS {
                return Err(FormatError::Unsupported(format!(
                    "extended L2 entries with {}-byte clusters (subclusters \
                     smaller than 512 bytes); 16 KiB clusters or larger are supported",
                    self.cluster_size()
                )));
            }
        }
        if self.size >= MAX_HOST_OFFSET {
            return Err(FormatError::invalid(
                "size",
                format!(
                    "virtual size {} is beyond the 64 PiB format limit",
                    self.size
                ),
            ));
        }
        let needed = Self::l1_entries_for_l2(self.cluster_bits, self.extended_l2(), self.size);
        if u64::from(self.l1_size) < needed {
            return Err(FormatError::invalid(
                "l1_size",
                format!(
                    "{} entries cannot map a virtual size of {} (need {needed})",
                    self.l1_size, self.size
                ),
            ));
        }
        if u64::from(self.l1_size) > MAX_L1_ENTRIES {
            return Err(FormatError::invalid(
                "l1_size",
                format!(
                    "{} entries exceeds the limit of {MAX_L1_ENTRIES}",
                    self.l1_size
                ),
            ));
        }
        check_table(
            "l1_table_offset",
            self.l1_table_offset,
            u64::from(self.l1_size) * 8,
            cs,
            file_len,
        )?;
        let reftable_bytes = u64::from(self.refcount_table_clusters) * cs;
        if reftable_bytes > MAX_REFTABLE_BYTES || self.refcount_table_clusters == 0 {
            return Err(FormatError::invalid(
                "refcount_table_clusters",
                format!(
                    "{} clusters (must be 1..{} bytes)",
                    self.refcount_table_clusters, MAX_REFTABLE_BYTES
                ),
            ));
        }
        check_table(
            "refcount_table_offset",
            self.refcount_table_offset,
            reftable_bytes,
            cs,
            file_len,
        )?;
        if self.nb_snapshots > MAX_SNAPSHOTS {
            return Err(FormatError::invalid(
                "nb_snapshots",
                format!("{} (at most {MAX_SNAPSHOTS})", self.nb_snapshots),
            ));
        }
        if self.nb_snapshots > 0 {
            check_table("snapshots_offset", self.snapshots_offset, 40, cs, file_len)?;
        }
        Ok(())
    }

    fn parse_extensions(&mut self, cluster0: &[u8]) -> Result<(), FormatError> {
        let r = Reader::new(cluster0, "header extensions");
        let end = cluster0.len().min(self.cluster_size() as usize);
        let mut at = self.header_length as usize;
        while at + 8 <= end {
            let kind = r.u32(at)?;
            let len = r.u32(at + 4)? as usize;
            if kind == 0 {
                return Ok(());
            }
            let data_at = at + 8;
            if data_at + len > end {
                return Err(FormatError::invalid(
                    "header extension",
                    format!("type 0x{kind:08x} length {len} runs past the first cluster"),
                ));
            }
            let data = r.bytes(data_at, len)?;
            let ext = match kind {
                EXT_BACKING_FORMAT => HeaderExtension::BackingFormat(
                    String::from_utf8(data.to_vec())
                        .map_err(|_| FormatError::invalid("backing format", "not valid UTF-8"))?,
                ),
                CHAIN_INDEX_EXT_MAGIC => HeaderExtension::ChainIndex(ChainIndexExt::parse(data)?),
                _ => HeaderExtension::Other {
                    kind,
                    data: data.to_vec(),
                },
            };
            self.extensions.push(ext);
            at = data_at + len.div_ceil(8) * 8;
        }
        // An image whose extension area fills the first cluster has no end marker.
        Ok(())
    }

    /// Encodes the header, its extensions and the backing file name into a
    /// buffer of one cluster. Fails if they do not fit.
    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        let cs = self.cluster_size() as usize;
        let mut out = Vec::with_capacity(4096);
        put32(&mut out, QCOW2_MAGIC);
        put32(&mut out, self.version);
        put64(&mut out, 0); // backing_file_offset, patched below
        put32(&mut out, 0); // backing_file_size, patched below
        put32(&mut out, self.cluster_bits);
        put64(&mut out, self.size);
        put32(&mut out, self.crypt_method);
        put32(&mut out, self.l1_size);
        put64(&mut out, self.l1_table_offset);
        put64(&mut out, self.refcount_table_offset);
        put32(&mut out, self.refcount_table_clusters);
        put32(&mut out, self.nb_snapshots);
        put64(&mut out, self.snapshots_offset);
        if self.version == 3 {
            put64(&mut out, self.incompatible_features);
            put64(&mut out, self.compatible_features);
            put64(&mut out, self.autoclear_features);
            put32(&mut out, self.refcount_order);
            let len = self.header_length.max(V3_HEADER_LEN);
            put32(&mut out, len);
            out.push(match self.compression_type {
                CompressionType::Zlib => 0,
                CompressionType::Zstd => 1,
            });
            out.resize(len as usize, 0);
        }
        for ext in &self.extensions {
            let (kind, data) = match ext {
                HeaderExtension::BackingFormat(f) => (EXT_BACKING_FORMAT, f.as_bytes().to_vec()),
                HeaderExtension::ChainIndex(c) => (CHAIN_INDEX_EXT_MAGIC, c.encode()),
                HeaderExtension::Other { kind, data } => (*kind, data.clone()),
            };
            put32(&mut out, kind);
            put32(&mut out, data.len() as u32);
            out.extend_from_slice(&data);
            out.resize(out.len().div_ceil(8) * 8, 0);
        }
        put64(&mut out, 0); // end of extensions
        if let Some(name) = &self.backing_file {
            if name.is_empty() || name.len() > MAX_BACKING_NAME as usize {
                return Err(FormatError::invalid(
                    "backing file name",
                    format!("length {} (must be 1..=1023 bytes)", name.len()),
                ));
            }
            let at = out.len() as u64;
            out.extend_from_slice(name.as_bytes());
            out[8..16].copy_from_slice(&at.to_be_bytes());
            out[16..20].copy_from_slice(&(name.len() as u32).to_be_bytes());
        }
        if out.len() > cs {
            return Err(FormatError::invalid(
                "header",
                format!(
                    "header, extensions and backing name need {} bytes, more than the \
                     {cs}-byte first cluster",
                    out.len()
                ),
            ));
        }
        Ok(out)
    }

    /// Replaces (or adds) the chain index extension.
    pub fn set_chain_index(&mut self, ext: Option<ChainIndexExt>) {
        self.extensions
            .retain(|e| !matches!(e, HeaderExtension::ChainIndex(_)));
        if let Some(ext) = ext {
            self.extensions.push(HeaderExtension::ChainIndex(ext));
        }
    }
}

fn check_cluster_bits(bits: u32) -> Result<(), FormatError> {
    if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&bits) {
        return Err(FormatError::invalid(
            "cluster_bits",
            format!("{bits} (cluster size must be 512 B to 2 MiB)"),
        ));
    }
    Ok(())
}

/// Checks that a table starts on a cluster boundary and ends inside the file.
fn check_table(
    field: &'static str,
    offset: u64,
    len: u64,
    cluster_size: u64,
    file_len: u64,
) -> Result<(), FormatError> {
    if !offset.is_multiple_of(cluster_size) {
        return Err(FormatError::invalid(
            field,
            format!("0x{offset:x} is not aligned to the cluster size {cluster_size}"),
        ));
    }
    if offset == 0 {
        return Err(FormatError::invalid(
            field,
            "0x0 overlaps the header cluster".to_string(),
        ));
    }
    match offset.checked_add(len) {
        Some(end) if end <= file_len => Ok(()),
        _ => Err(FormatError::invalid(
            field,
            format!(
                "table at 0x{offset:x} ({len} bytes) runs beyond the end of the file (0x{file_len:x})"
            ),
        )),
    }
}

fn parse_backing_name(cluster0: &[u8], offset: u64, size: u32) -> Result<String, FormatError> {
    if size == 0 || size > MAX_BACKING_NAME {
        return Err(FormatError::invalid(
            "backing_file_size",
            format!("{size} (must be 1..=1023)"),
        ));
    }
    let end = offset.checked_add(u64::from(size));
    match end {
        Some(end) if end <= cluster0.len() as u64 => {}
        _ => {
            return Err(FormatError::invalid(
                "backing_file_offset",
                format!("name at 0x{offset:x} (+{size}) lies outside the first cluster"),
            ))
        }
    }
    let bytes = &cluster0[offset as usize..(offset + u64::from(size)) as usize];
    String::from_utf8(bytes.to_vec())
        .map_err(|_| FormatError::invalid("backing file name", "not valid UTF-8"))
}

fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            version: 3,
            cluster_bits: 16,
            size: 1 << 30,
            crypt_method: 0,
            l1_size: 2,
            l1_table_offset: 0x30000,
            refcount_table_offset: 0x10000,
            refcount_table_clusters: 1,
            nb_snapshots: 0,
            snapshots_offset: 0,
            incompatible_features: 0,
            compatible_features: 0,
            autoclear_features: 0,
            refcount_order: 4,
            header_length: V3_HEADER_LEN,
            compression_type: CompressionType::Zlib,
            backing_file: Some("base.qcow2".into()),
            extensions: vec![HeaderExtension::BackingFormat("qcow2".into())],
        }
    }

    #[test]
    fn encode_parse_round_trip() {
        let h = sample();
        let buf = h.encode().unwrap();
        let back = Header::parse(&buf, 1 << 20).unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn l1_table_past_eof_is_rejected() {
        let h = sample();
        let buf = h.encode().unwrap();
        let err = Header::parse(&buf, 0x30000).unwrap_err();
        assert!(err.to_string().contains("l1_table_offset"), "{err}");
    }

    #[test]
    fn absurd_l1_size_is_rejected_without_allocating() {
        let mut h = sample();
        h.l1_size = u32::MAX;
        let buf = h.encode().unwrap();
        let err = Header::parse(&buf, u64::MAX).unwrap_err();
        assert!(err.to_string().contains("l1_size"), "{err}");
    }
}

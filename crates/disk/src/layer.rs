//! One file of a chain: a qcow2 image or a raw file.

use std::io::Read;
use std::path::Path;

use parking_lot::RwLock;
use strata_format::entry::L1Entry;
use strata_format::entry::SUBCLUSTERS;
use strata_format::header::Header;
use strata_format::index::LayerIdentity;
use strata_format::{CompressionType, ExtendedL2, L2Mapping, QCOW2_MAGIC};

use crate::error::{DiskError, Place, Result};
use crate::file::ImageFile;
use crate::lock::LockMode;

/// Image file formats Strata reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// qcow2, version 2 or 3.
    Qcow2,
    /// A raw disk image.
    Raw,
}

impl Format {
    /// Parses a format name as qemu-img spells it.
    pub fn parse(name: &str) -> Result<Format> {
        match name {
            "qcow2" => Ok(Format::Qcow2),
            "raw" => Ok(Format::Raw),
            other => Err(DiskError::Invalid(format!(
                "unknown image format '{other}' (Strata supports qcow2 and raw)"
            ))),
        }
    }

    /// Name as qemu-img spells it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Qcow2 => "qcow2",
            Format::Raw => "raw",
        }
    }
}

/// qcow2-specific state of a layer.
#[derive(Debug)]
pub(crate) struct Qcow2Meta {
    pub(crate) header: RwLock<Header>,
    pub(crate) cluster_bits: u32,
    pub(crate) version: u32,
    pub(crate) compression: CompressionType,
    /// L2 entries are 128 bits with a subcluster bitmap.
    pub(crate) extended: bool,
    /// Active L1 table, loaded on first use.
    pub(crate) l1: RwLock<Option<Vec<u64>>>,
}

/// One layer of a chain.
#[derive(Debug)]
pub struct Layer {
    pub(crate) file: ImageFile,
    pub(crate) qcow2: Option<Qcow2Meta>,
    pub(crate) size: u64,
}

impl Layer {
    /// Opens `path`, probing the format unless `format` is given, with
    /// the locks of a writer or of a reader.
    pub(crate) fn open(
        path: &Path,
        depth: u32,
        writable: bool,
        format: Option<Format>,
    ) -> Result<Layer> {
        let lock = if writable {
            LockMode::Write
        } else {
            LockMode::Read
        };
        Layer::open_locked(path, depth, writable, format, lock)
    }

    /// [`Layer::open`] with the locks of `lock`.
    pub(crate) fn open_locked(
        path: &Path,
        depth: u32,
        writable: bool,
        format: Option<Format>,
        lock: LockMode,
    ) -> Result<Layer> {
        let file = ImageFile::open(path, depth, writable, lock)?;
        let format = match format {
            Some(f) => f,
            None => probe(&file)?,
        };
        match format {
            Format::Raw => {
                let size = file.len();
                Ok(Layer {
                    file,
                    qcow2: None,
                    size,
                })
            }
            Format::Qcow2 => {
                let header = read_header(&file)?;
                let meta = Qcow2Meta {
                    cluster_bits: header.cluster_bits,
                    version: header.version,
                    compression: header.compression_type,
                    extended: header.extended_l2(),
                    header: RwLock::new(header.clone()),
                    l1: RwLock::new(None),
                };
                Ok(Layer {
                    file,
                    size: header.size,
                    qcow2: Some(meta),
                })
            }
        }
    }

    /// The file's place, for messages.
    pub fn place(&self) -> &Place {
        &self.file.place
    }

    /// Path of the file.
    pub fn path(&self) -> &Path {
        &self.file.place.path
    }

    /// Virtual size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Format of the file.
    pub fn format(&self) -> Format {
        if self.qcow2.is_some() {
            Format::Qcow2
        } else {
            Format::Raw
        }
    }

    /// A copy of the qcow2 header, if this is a qcow2 layer.
    pub fn header(&self) -> Option<Header> {
        self.qcow2.as_ref().map(|q| q.header.read().clone())
    }

    /// File length in bytes.
    pub fn file_len(&self) -> u64 {
        self.file.len()
    }

    /// Bytes the file occupies on disk.
    pub fn allocated_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        self.file.metadata().map(|m| m.blocks() * 512).unwrap_or(0)
    }

    /// Cluster size in bytes (`None` for raw layers).
    pub fn cluster_size(&self) -> Option<u64> {
        self.cluster_bits().map(|bits| 1u64 << bits)
    }

    pub(crate) fn cluster_bits(&self) -> Option<u32> {
        self.qcow2.as_ref().map(|q| q.cluster_bits)
    }

    /// Whether this is a qcow2 layer with extended L2 entries (subclusters).
    pub fn extended_l2(&self) -> bool {
        self.qcow2.as_ref().is_some_and(|q| q.extended)
    }

    /// log2 of the smallest unit this layer allocates: its subcluster with
    /// extended L2 entries, else its cluster (`None` for raw layers).
    pub(crate) fn unit_bits(&self) -> Option<u32> {
        self.qcow2.as_ref().map(|q| {
            if q.extended {
                q.cluster_bits - SUBCLUSTERS.trailing_zeros()
            } else {
                q.cluster_bits
            }
        })
    }

    /// log2 of the subcluster size (the cluster size without extended L2).
    pub(crate) fn subcluster_bits(&self) -> u32 {
        self.unit_bits().unwrap_or(63)
    }

    /// How an index recognises this layer.
    pub(crate) fn identity(&self) -> Result<LayerIdentity> {
        if let Some(q) = &self.qcow2 {
            let h = q.header.read();
            if h.chain_index_valid() {
                if let Some(ext) = h.chain_index() {
                    return Ok(LayerIdentity::Uuid(ext.layer_uuid));
                }
            }
        }
        let meta = self.file.metadata()?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Ok(LayerIdentity::Stat {
            len: meta.len(),
            mtime_ns: mtime,
        })
    }

    fn meta(&self) -> &Qcow2Meta {
        // Only called on paths that checked `qcow2` first.
        self.qcow2.as_ref().expect("qcow2 layer")
    }

    /// Loads the active L1 table if needed and runs `f` on it.
    pub(crate) fn with_l1<T>(&self, f: impl FnOnce(&[u64]) -> T) -> Result<T> {
        let q = self.meta();
        {
            let l1 = q.l1.read();
            if let Some(l1) = l1.as_ref() {
                return Ok(f(l1));
            }
        }
        let mut l1 = q.l1.write();
        if l1.is_none() {
            let (offset, entries) = {
                let h = q.header.read();
                (h.l1_table_offset, h.l1_size as usize)
            };
            // Bounded: l1_size <= 4 Mi entries and the table lies inside the
            // file, both checked when the header was parsed.
            let mut buf = vec![0u8; entries * 8];
            self.file.read_exact_at(&mut buf, offset)?;
            *l1 = Some(
                buf.chunks_exact(8)
                    .map(|c| u64::from_be_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect(),
            );
        }
        Ok(f(l1.as_deref().unwrap_or(&[])))
    }

    /// The L2 table offset for L1 index `l1_index` (0 = none).
    pub(crate) fn l2_table(&self, l1_index: u64) -> Result<u64> {
        let cs = 1u64 << self.meta().cluster_bits;
        let raw = self.with_l1(|l1| l1.get(l1_index as usize).copied().unwrap_or(0))?;
        let entry = L1Entry::decode(raw, cs)
            .map_err(|e| DiskError::corrupt(self.place(), format!("L1 entry {l1_index}: {e}")))?;
        if entry.l2_offset != 0 && entry.l2_offset.saturating_add(cs) > self.file.len() {
            return Err(DiskError::corrupt(
                self.place(),
                format!(
                    "L2 table offset 0x{:x} beyond end of file (0x{:x})",
                    entry.l2_offset,
                    self.file.len()
                ),
            ));
        }
        if entry.l2_offset != 0 && entry.l2_offset < cs {
            return Err(DiskError::corrupt(
                self.place(),
                format!(
                    "L2 table offset 0x{:x} overlaps the header",
                    entry.l2_offset
                ),
            ));
        }
        Ok(entry.l2_offset)
    }

    /// The raw L2 entry (and, in extended layers, its bitmap) of guest
    /// `cluster`. Every allocating write reads one, so this does without
    /// a heap buffer.
    pub(crate) fn read_l2_entry(&self, cluster: u64) -> Result<(u64, u64)> {
        let eb = self.l2_entry_bytes();
        let table = self.l2_table(cluster / self.l2_entries())?;
        if table == 0 {
            return Ok((0, 0));
        }
        let mut bytes = [0u8; 16];
        let bytes = &mut bytes[..eb as usize];
        self.file
            .read_exact_at(bytes, table + (cluster % self.l2_entries()) * eb)?;
        Ok(decode_l2_bytes(bytes))
    }

    /// Entries per L2 table.
    pub(crate) fn l2_entries(&self) -> u64 {
        let q = self.meta();
        1u64 << (q.cluster_bits - if q.extended { 4 } else { 3 })
    }

    /// Bytes per L2 entry.
    pub(crate) fn l2_entry_bytes(&self) -> u64 {
        if self.meta().extended {
            16
        } else {
            8
        }
    }

    /// Reads the raw L2 entries of guest clusters `first..first+out.len()`,
    /// which must lie in one L2 table, as (first word, subcluster bitmap),
    /// through a reusable buffer; the bitmap is 0 for standard entries.
    pub(crate) fn read_l2_entries_with(
        &self,
        first_cluster: u64,
        out: &mut [(u64, u64)],
        bytes: &mut Vec<u8>,
    ) -> Result<()> {
        let l2_entries = self.l2_entries();
        let eb = self.l2_entry_bytes();
        let l1_index = first_cluster / l2_entries;
        debug_assert_eq!(
            l1_index,
            (first_cluster + out.len() as u64 - 1) / l2_entries,
            "range crosses an L2 table"
        );
        let table = self.l2_table(l1_index)?;
        if table == 0 {
            out.fill((0, 0));
            return Ok(());
        }
        bytes.clear();
        bytes.resize(out.len() * eb as usize, 0);
        let at = table + (first_cluster % l2_entries) * eb;
        self.file.read_exact_at(bytes, at)?;
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(eb as usize)) {
            *o = decode_l2_bytes(c);
        }
        Ok(())
    }

    /// Decodes an extended L2 entry of this layer (for guest `cluster`,
    /// named in errors).
    pub(crate) fn decode_extended(
        &self,
        cluster: u64,
        raw: u64,
        bitmap: u64,
    ) -> Result<ExtendedL2> {
        let q = self.meta();
        ExtendedL2::decode(raw, bitmap, q.cluster_bits).map_err(|e| {
            DiskError::corrupt(
                self.place(),
                format!("L2 entry {cluster} of layer {}: {e}", self.path().display()),
            )
        })
    }

    /// What guest offset `pos` reads as in this layer, given the raw L2
    /// entry of its cluster: for extended entries, the state of the
    /// subcluster holding `pos`.
    pub(crate) fn decode_at(&self, raw: u64, bitmap: u64, pos: u64) -> Result<L2Mapping> {
        let q = self.meta();
        if !q.extended {
            return self.decode_l2(raw);
        }
        let cluster = pos >> q.cluster_bits;
        let sc = ((pos >> self.subcluster_bits()) % u64::from(SUBCLUSTERS)) as u32;
        Ok(self.decode_extended(cluster, raw, bitmap)?.subcluster(sc))
    }

    /// Decodes a raw standard L2 entry of this layer (for extended entries
    /// see [`Layer::decode_at`]).
    pub(crate) fn decode_l2(&self, raw: u64) -> Result<L2Mapping> {
        let q = self.meta();
        L2Mapping::decode(raw, q.cluster_bits, q.version)
            .map_err(|e| DiskError::format(self.place(), e))
    }

    /// Reads part of a cluster described by an L2 entry of this layer.
    /// `in_cluster` is the byte offset inside the guest cluster.
    pub(crate) fn read_mapped(&self, raw: u64, in_cluster: u64, buf: &mut [u8]) -> Result<()> {
        match self.decode_l2(raw)? {
            L2Mapping::Unallocated | L2Mapping::Zero { .. } => {
                buf.fill(0);
                Ok(())
            }
            L2Mapping::Data { host_offset, .. } => {
                self.file.read_data(buf, host_offset + in_cluster)
            }
            L2Mapping::Compressed {
                host_offset,
                max_len,
            } => {
                let cluster = self.decompress(host_offset, max_len)?;
                let start = in_cluster as usize;
                buf.copy_from_slice(&cluster[start..start + buf.len()]);
                Ok(())
            }
        }
    }

    /// Reads raw-format data (zeros past the end of the file).
    pub(crate) fn read_raw(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.file.read_data(buf, offset)
    }

    /// Decompresses one compressed cluster.
    pub(crate) fn decompress(&self, host_offset: u64, max_len: u64) -> Result<Vec<u8>> {
        let q = self.meta();
        let cs = 1usize << q.cluster_bits;
        if host_offset >= self.file.len() {
            return Err(DiskError::corrupt(
                self.place(),
                format!(
                    "compressed cluster at 0x{host_offset:x} beyond end of file (0x{:x})",
                    self.file.len()
                ),
            ));
        }
        // max_len is at most two clusters by construction of the descriptor.
        let mut input = vec![0u8; max_len as usize];
        self.file.read_data(&mut input, host_offset)?;
        let mut out = vec![0u8; cs];
        let produced = match q.compression {
            CompressionType::Zlib => {
                let mut d = flate2::read::DeflateDecoder::new(&input[..]);
                read_full(&mut d, &mut out)
            }
            CompressionType::Zstd => match zstd::stream::read::Decoder::new(&input[..]) {
                Ok(d) => {
                    let mut d = d.single_frame();
                    read_full(&mut d, &mut out)
                }
                Err(e) => Err(e),
            },
        };
        match produced {
            Ok(n) if n == cs => Ok(out),
            Ok(n) => Err(DiskError::corrupt(
                self.place(),
                format!(
                    "compressed cluster at 0x{host_offset:x} decompresses to {n} bytes, not {cs}"
                ),
            )),
            Err(e) => Err(DiskError::corrupt(
                self.place(),
                format!("compressed cluster at 0x{host_offset:x}: {e}"),
            )),
        }
    }
}

fn read_full(r: &mut impl Read, out: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < out.len() {
        match r.read(&mut out[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn probe(file: &ImageFile) -> Result<Format> {
    let mut magic = [0u8; 4];
    if file.len() < 4 {
        return Ok(Format::Raw);
    }
    file.read_exact_at(&mut magic, 0)?;
    Ok(if u32::from_be_bytes(magic) == QCOW2_MAGIC {
        Format::Qcow2
    } else {
        Format::Raw
    })
}

/// Reads and validates the header of a qcow2 file.
///
/// Header, extensions and backing name nearly always fit in the first
/// 4 KiB; reading only that keeps opening a 1,000-layer chain cheap. When
/// they do not, the whole first cluster is read and parsed again.
pub(crate) fn read_header(file: &ImageFile) -> Result<Header> {
    const FIRST_READ: u64 = 4096;
    let len = file.len();
    let mut first = vec![0u8; len.min(FIRST_READ) as usize];
    file.read_exact_at(&mut first, 0)?;
    let bits = Header::peek_cluster_bits(&first).map_err(|e| DiskError::format(&file.place, e))?;
    let cluster = len.min(1 << bits);
    if cluster <= FIRST_READ {
        first.truncate(cluster as usize);
        return Header::parse(&first, len).map_err(|e| DiskError::format(&file.place, e));
    }
    if let Ok(h) = Header::parse(&first, len) {
        if !header_may_continue(&first, &h) {
            return Ok(h);
        }
    }
    let mut cluster0 = vec![0u8; cluster as usize];
    file.read_exact_at(&mut cluster0, 0)?;
    Header::parse(&cluster0, len).map_err(|e| DiskError::format(&file.place, e))
}

/// Whether a header parsed from a prefix of the first cluster may have more
/// extensions past that prefix: true unless the end-of-extensions marker was
/// inside the prefix.
fn header_may_continue(prefix: &[u8], h: &Header) -> bool {
    let mut at = h.header_length as usize;
    loop {
        let Some(word) = prefix.get(at..at + 8) else {
            return true;
        };
        let kind = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        let len = u32::from_be_bytes([word[4], word[5], word[6], word[7]]) as usize;
        if kind == 0 {
            return false;
        }
        at = at + 8 + len.div_ceil(8) * 8;
    }
}

impl Layer {
    /// The smallest guest offset at or after `pos` where this layer may
    /// hold data, or `u64::MAX` if none: a raw layer holds data everywhere
    /// up to its size; a qcow2 layer only under L1 entries with an L2 table.
    pub(crate) fn next_possible_data(&self, pos: u64) -> Result<u64> {
        if pos >= self.size {
            return Ok(u64::MAX);
        }
        let Some(cb) = self.cluster_bits() else {
            return Ok(pos);
        };
        let span = (1u64 << cb) * self.l2_entries();
        let first = pos / span;
        let next = self.with_l1(|l1| {
            l1.iter()
                .enumerate()
                .skip(first as usize)
                .find(|(_, e)| **e != 0)
                .map(|(i, _)| i as u64)
        })?;
        Ok(match next {
            Some(i) => (i * span).max(pos),
            None => u64::MAX,
        })
    }
}

/// One big-endian L2 entry as stored: 8 bytes, or 16 with the subcluster
/// bitmap of an extended entry (0 for standard ones).
fn decode_l2_bytes(c: &[u8]) -> (u64, u64) {
    let word = |c: &[u8]| u64::from_be_bytes(c.try_into().unwrap_or([0; 8]));
    if c.len() == 16 {
        (word(&c[..8]), word(&c[8..]))
    } else {
        (word(c), 0)
    }
}

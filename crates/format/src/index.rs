//! Strata's chain index: which layer of a backing chain holds the newest
//! version of every guest cluster.
//!
//! The index lives in the top layer of a chain and is described by a header
//! extension. Its validity is guarded by the autoclear bit
//! [`crate::header::AUTOCLEAR_STRATA_INDEX`]: QEMU clears unknown autoclear
//! bits when it opens an image for writing, so a stale index is never
//! trusted. The index region is deliberately *not* refcounted: to QEMU it is
//! free space, so `qemu-img check` reports neither leaks nor corruption, and
//! if QEMU ever reuses that space it has cleared the bit first.
//!
//! Region layout (all big-endian):
//! - `entry_count` owners, `u16` each: 0 = no layer holds the unit (reads
//!   as zeros), `k` = layer `k` counted from the base (1) to this layer;
//! - `lineage_count` [`LayerIdentity`] records of 24 bytes for layers
//!   `1..depth`, in base-first order, naming the exact files the index was
//!   computed against.

use crate::error::{FormatError, Reader};

/// Header extension type of the chain index ("STRX").
pub const CHAIN_INDEX_EXT_MAGIC: u32 = 0x5354_5258;
/// Encoded size of the extension data.
pub const CHAIN_INDEX_EXT_LEN: usize = 72;
/// Format version of the index region.
pub const CHAIN_INDEX_VERSION: u32 = 1;
/// Bytes per owner entry.
pub const ENTRY_BYTES: u64 = 2;
/// Bytes per lineage record.
pub const LINEAGE_RECORD_BYTES: u64 = 24;
/// Largest index region Strata writes (256 MiB: 8 TiB of 64 KiB clusters).
/// Larger disks are served by walking the chain, with the same cache.
pub const MAX_REGION_BYTES: u64 = 256 << 20;
/// Longest chain an index can describe (owners are 16-bit).
pub const MAX_CHAIN_DEPTH: u32 = u16::MAX as u32;

/// The chain index header extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainIndexExt {
    /// Offset of the index region in this file (cluster aligned).
    pub region_offset: u64,
    /// Length of the region in bytes (entries plus lineage).
    pub region_len: u64,
    /// Position of this layer in its chain, 1 = base.
    pub depth: u32,
    /// log2 of the guest bytes one entry covers.
    pub granularity_bits: u32,
    /// Virtual size the index covers.
    pub virtual_size: u64,
    /// Identity of this layer's content; a new one is drawn whenever Strata
    /// writes to the layer.
    pub layer_uuid: [u8; 16],
    /// CRC-32C of the whole region.
    pub crc32c: u32,
}

impl ChainIndexExt {
    /// Number of owner entries.
    pub fn entry_count(&self) -> u64 {
        self.virtual_size.div_ceil(1u64 << self.granularity_bits)
    }

    /// Byte offset of the lineage records inside the region.
    pub fn lineage_offset(&self) -> u64 {
        self.entry_count() * ENTRY_BYTES
    }

    /// Region length needed for a chain of `depth` layers.
    pub fn region_len_for(virtual_size: u64, granularity_bits: u32, depth: u32) -> u64 {
        virtual_size.div_ceil(1u64 << granularity_bits) * ENTRY_BYTES
            + u64::from(depth.saturating_sub(1)) * LINEAGE_RECORD_BYTES
    }

    /// Parses and validates the extension data.
    pub fn parse(data: &[u8]) -> Result<ChainIndexExt, FormatError> {
        let r = Reader::new(data, "Strata chain index extension");
        let version = r.u32(0)?;
        if version != CHAIN_INDEX_VERSION {
            return Err(FormatError::Unsupported(format!(
                "Strata chain index version {version}"
            )));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(r.bytes(48, 16)?);
        let ext = ChainIndexExt {
            region_offset: r.u64(8)?,
            region_len: r.u64(16)?,
            depth: r.u32(24)?,
            granularity_bits: r.u32(28)?,
            virtual_size: r.u64(32)?,
            layer_uuid: uuid,
            crc32c: r.u32(40)?,
        };
        if !(9..=21).contains(&ext.granularity_bits) {
            return Err(FormatError::invalid(
                "chain index granularity",
                format!("2^{} bytes", ext.granularity_bits),
            ));
        }
        if ext.depth == 0 || ext.depth > MAX_CHAIN_DEPTH {
            return Err(FormatError::invalid(
                "chain index depth",
                format!("{} (must be 1..={MAX_CHAIN_DEPTH})", ext.depth),
            ));
        }
        let need = Self::region_len_for(ext.virtual_size, ext.granularity_bits, ext.depth);
        if ext.region_len > MAX_REGION_BYTES {
            return Err(FormatError::invalid(
                "chain index length",
                format!(
                    "{} bytes exceeds the {MAX_REGION_BYTES}-byte limit",
                    ext.region_len
                ),
            ));
        }
        if ext.region_len != need {
            return Err(FormatError::invalid(
                "chain index length",
                format!("{} bytes, expected {need}", ext.region_len),
            ));
        }
        Ok(ext)
    }

    /// Encodes the extension data.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(CHAIN_INDEX_EXT_LEN);
        out.extend_from_slice(&CHAIN_INDEX_VERSION.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&self.region_offset.to_be_bytes());
        out.extend_from_slice(&self.region_len.to_be_bytes());
        out.extend_from_slice(&self.depth.to_be_bytes());
        out.extend_from_slice(&self.granularity_bits.to_be_bytes());
        out.extend_from_slice(&self.virtual_size.to_be_bytes());
        out.extend_from_slice(&self.crc32c.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&self.layer_uuid);
        out.resize(CHAIN_INDEX_EXT_LEN, 0);
        out
    }
}

/// How an index recognises one lower layer of its chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerIdentity {
    /// A layer with a valid Strata chain index: its content UUID.
    Uuid([u8; 16]),
    /// Any other file: its length and modification time, which change
    /// whenever anything writes it.
    Stat {
        /// File length in bytes.
        len: u64,
        /// Modification time in nanoseconds since the epoch.
        mtime_ns: u64,
    },
}

impl LayerIdentity {
    /// Encodes into a 24-byte lineage record.
    pub fn encode(&self) -> [u8; 24] {
        let mut out = [0u8; 24];
        match self {
            LayerIdentity::Uuid(u) => {
                out[0] = 1;
                out[8..24].copy_from_slice(u);
            }
            LayerIdentity::Stat { len, mtime_ns } => {
                out[0] = 2;
                out[8..16].copy_from_slice(&len.to_be_bytes());
                out[16..24].copy_from_slice(&mtime_ns.to_be_bytes());
            }
        }
        out
    }

    /// Decodes a 24-byte lineage record.
    pub fn decode(rec: &[u8]) -> Result<LayerIdentity, FormatError> {
        let r = Reader::new(rec, "chain index lineage record");
        match r.u8(0)? {
            1 => {
                let mut u = [0u8; 16];
                u.copy_from_slice(r.bytes(8, 16)?);
                Ok(LayerIdentity::Uuid(u))
            }
            2 => Ok(LayerIdentity::Stat {
                len: r.u64(8)?,
                mtime_ns: r.u64(16)?,
            }),
            k => Err(FormatError::invalid(
                "chain index lineage record",
                format!("kind {k}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ext_round_trip() {
        let ext = ChainIndexExt {
            region_offset: 0x50000,
            region_len: ChainIndexExt::region_len_for(1 << 30, 16, 7),
            depth: 7,
            granularity_bits: 16,
            virtual_size: 1 << 30,
            layer_uuid: [7; 16],
            crc32c: 0xdead_beef,
        };
        assert_eq!(ChainIndexExt::parse(&ext.encode()).unwrap(), ext);
    }

    #[test]
    fn identity_round_trip() {
        for id in [
            LayerIdentity::Uuid([3; 16]),
            LayerIdentity::Stat {
                len: 42,
                mtime_ns: 99,
            },
        ] {
            assert_eq!(LayerIdentity::decode(&id.encode()).unwrap(), id);
        }
    }
}

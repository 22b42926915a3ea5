//! L1 and L2 table entries and refcount table entries.

use crate::error::FormatError;

/// Bit 63 of L1/L2 entries: refcount is exactly one, writable in place.
pub const OFLAG_COPIED: u64 = 1 << 63;
/// Bit 62 of L2 entries: compressed cluster.
pub const OFLAG_COMPRESSED: u64 = 1 << 62;
/// Bit 0 of standard L2 entries: reads as zeros (version 3).
pub const OFLAG_ZERO: u64 = 1;
/// Bits 9-55: host offset in L1 and standard L2 entries.
pub const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
/// Reserved bits of an L1 entry (0-8 and 56-62).
const L1_RESERVED: u64 = 0x7f00_0000_0000_01ff;
/// Reserved bits of a standard L2 entry (1-8 and 56-61).
const L2_RESERVED: u64 = 0x3f00_0000_0000_01fe;
/// Bits 9-63 of a refcount table entry.
pub const REFTABLE_OFFSET_MASK: u64 = 0xffff_ffff_ffff_fe00;

/// A decoded L1 entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L1Entry {
    /// Offset of the L2 table, or 0 when unallocated.
    pub l2_offset: u64,
    /// Whether the L2 table's refcount is exactly one.
    pub copied: bool,
}

impl L1Entry {
    /// Decodes and validates an L1 entry.
    pub fn decode(raw: u64, cluster_size: u64) -> Result<L1Entry, FormatError> {
        if raw & L1_RESERVED != 0 {
            return Err(FormatError::invalid(
                "L1 entry",
                format!("0x{raw:016x} has reserved bits set"),
            ));
        }
        let l2_offset = raw & OFFSET_MASK;
        if !l2_offset.is_multiple_of(cluster_size) {
            return Err(FormatError::invalid(
                "L1 entry",
                format!("L2 table offset 0x{l2_offset:x} is not cluster aligned"),
            ));
        }
        Ok(L1Entry {
            l2_offset,
            copied: raw & OFLAG_COPIED != 0,
        })
    }

    /// Encodes an L1 entry pointing at an L2 table with refcount one.
    pub fn encode_owned(l2_offset: u64) -> u64 {
        l2_offset | OFLAG_COPIED
    }
}

/// What an L2 entry says about one guest cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L2Mapping {
    /// Not allocated in this layer: read from the backing file.
    Unallocated,
    /// Reads as zeros; may keep a preallocated host cluster.
    Zero {
        /// Preallocated host cluster, if any.
        prealloc: Option<u64>,
        /// Whether that cluster's refcount is exactly one.
        copied: bool,
    },
    /// Data at a host cluster.
    Data {
        /// Host cluster offset.
        host_offset: u64,
        /// Whether the refcount is exactly one (writable in place).
        copied: bool,
    },
    /// Compressed data.
    Compressed {
        /// Byte offset of the compressed stream (not aligned).
        host_offset: u64,
        /// Upper bound of the compressed stream's length in bytes.
        max_len: u64,
    },
}

impl L2Mapping {
    /// Decodes and validates a standard (non-extended) L2 entry.
    pub fn decode(raw: u64, cluster_bits: u32, version: u32) -> Result<L2Mapping, FormatError> {
        let cluster_size = 1u64 << cluster_bits;
        if raw & OFLAG_COMPRESSED != 0 {
            if raw & OFLAG_COPIED != 0 {
                return Err(FormatError::invalid(
                    "L2 entry",
                    format!("0x{raw:016x}: compressed cluster with the COPIED flag"),
                ));
            }
            let x = 62 - (cluster_bits - 8);
            let host_offset = raw & ((1u64 << x) - 1);
            if host_offset >= 1 << 56 {
                return Err(FormatError::invalid(
                    "L2 entry",
                    format!("compressed offset 0x{host_offset:x} beyond 56 bits"),
                ));
            }
            let extra_sectors = (raw >> x) & ((1u64 << (62 - x)) - 1);
            let max_len = (extra_sectors + 1) * 512 - (host_offset & 511);
            return Ok(L2Mapping::Compressed {
                host_offset,
                max_len,
            });
        }
        if raw & L2_RESERVED != 0 {
            return Err(FormatError::invalid(
                "L2 entry",
                format!("0x{raw:016x} has reserved bits set"),
            ));
        }
        let host = raw & OFFSET_MASK;
        let copied = raw & OFLAG_COPIED != 0;
        if !host.is_multiple_of(cluster_size) {
            return Err(FormatError::invalid(
                "L2 entry",
                format!("host offset 0x{host:x} is not aligned to the cluster size {cluster_size}"),
            ));
        }
        if raw & OFLAG_ZERO != 0 {
            if version < 3 {
                return Err(FormatError::invalid(
                    "L2 entry",
                    format!("0x{raw:016x}: zero flag in a version 2 image"),
                ));
            }
            return Ok(L2Mapping::Zero {
                prealloc: (host != 0).then_some(host),
                copied,
            });
        }
        if host == 0 {
            if copied {
                return Err(FormatError::invalid(
                    "L2 entry",
                    "COPIED flag set on an unallocated cluster".to_string(),
                ));
            }
            return Ok(L2Mapping::Unallocated);
        }
        Ok(L2Mapping::Data {
            host_offset: host,
            copied,
        })
    }

    /// Encodes a data cluster owned only by the active L1 table.
    pub fn encode_data(host_offset: u64) -> u64 {
        host_offset | OFLAG_COPIED
    }

    /// Encodes a zero cluster with no preallocation.
    pub fn encode_zero() -> u64 {
        OFLAG_ZERO
    }

    /// Whether reads must go to the backing file.
    pub fn is_unallocated(&self) -> bool {
        matches!(self, L2Mapping::Unallocated)
    }

    /// The host clusters this entry holds a reference to, as
    /// `(first byte, last byte inclusive)`, or `None`.
    pub fn host_range(&self) -> Option<(u64, u64)> {
        match *self {
            L2Mapping::Unallocated | L2Mapping::Zero { prealloc: None, .. } => None,
            L2Mapping::Zero {
                prealloc: Some(h), ..
            } => Some((h, h)),
            L2Mapping::Data { host_offset, .. } => Some((host_offset, host_offset)),
            L2Mapping::Compressed {
                host_offset,
                max_len,
            } => Some((host_offset, host_offset + max_len - 1)),
        }
    }
}

/// Decodes a refcount table entry into a refcount block offset (0 = none).
pub fn decode_reftable_entry(raw: u64, cluster_size: u64) -> Result<u64, FormatError> {
    if raw & !REFTABLE_OFFSET_MASK != 0 {
        return Err(FormatError::invalid(
            "refcount table entry",
            format!("0x{raw:016x} has reserved bits set"),
        ));
    }
    if !raw.is_multiple_of(cluster_size) {
        return Err(FormatError::invalid(
            "refcount table entry",
            format!("block offset 0x{raw:x} is not cluster aligned"),
        ));
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn compressed_descriptor_64k() {
        // cluster_bits 16 -> x = 54: offset in bits 0..53, sectors above.
        let raw = OFLAG_COMPRESSED | (3u64 << 54) | 0x12345;
        let m = L2Mapping::decode(raw, 16, 3).unwrap();
        assert_eq!(
            m,
            L2Mapping::Compressed {
                host_offset: 0x12345,
                max_len: 4 * 512 - 0x145
            }
        );
    }

    #[test]
    fn reserved_bits_are_corruption() {
        assert!(L2Mapping::decode(0x10000 | (1 << 57), 16, 3).is_err());
        assert!(L1Entry::decode(0x10000 | 1, 65536).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(raw: u64, bits in 9u32..=21, v in 2u32..=3) {
            let _ = L2Mapping::decode(raw, bits, v);
            let _ = L1Entry::decode(raw, 1 << bits);
        }

        #[test]
        fn data_round_trip(cluster in 1u64..(1 << 30)) {
            let host = cluster << 16;
            let m = L2Mapping::decode(L2Mapping::encode_data(host), 16, 3).unwrap();
            prop_assert_eq!(m, L2Mapping::Data { host_offset: host, copied: true });
        }
    }
}

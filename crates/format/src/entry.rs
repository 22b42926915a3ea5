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

/// Subclusters per cluster in images with extended L2 entries.
pub const SUBCLUSTERS: u32 = 32;
/// Smallest cluster size (log2) Strata accepts with extended L2 entries:
/// 16 KiB clusters have 512-byte subclusters, the smallest I/O unit.
pub const MIN_EXTENDED_CLUSTER_BITS: u32 = 14;

/// A decoded extended (128-bit) L2 entry: the cluster descriptor of the
/// first word plus the subcluster allocation bitmap of the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtendedL2 {
    /// The cluster descriptor: `Data` (a host cluster, whichever of its
    /// subclusters are allocated), `Compressed`, or `Unallocated` (no host
    /// cluster). Never `Zero`: zeros are per subcluster.
    pub cluster: L2Mapping,
    /// Bit `i` set: subcluster `i` is allocated in the host cluster.
    pub alloc: u32,
    /// Bit `i` set: subcluster `i` reads as zeros.
    pub zero: u32,
}

impl ExtendedL2 {
    /// Decodes and validates an extended L2 entry (`raw` is the first word,
    /// `bitmap` the second).
    pub fn decode(raw: u64, bitmap: u64, cluster_bits: u32) -> Result<ExtendedL2, FormatError> {
        if raw & OFLAG_COMPRESSED != 0 {
            if bitmap != 0 {
                return Err(FormatError::invalid(
                    "L2 entry",
                    format!("compressed cluster with a non-zero subcluster bitmap 0x{bitmap:016x}"),
                ));
            }
            let cluster = L2Mapping::decode(raw, cluster_bits, 3)?;
            return Ok(ExtendedL2 {
                cluster,
                alloc: 0,
                zero: 0,
            });
        }
        // Bit 0 (the standard zero flag) is reserved with extended entries:
        // zeros are described by the bitmap.
        if raw & OFLAG_ZERO != 0 {
            return Err(FormatError::invalid(
                "L2 entry",
                format!("0x{raw:016x}: zero flag set in an extended L2 entry"),
            ));
        }
        let cluster = L2Mapping::decode(raw, cluster_bits, 3)?;
        let alloc = bitmap as u32;
        let zero = (bitmap >> 32) as u32;
        let both = alloc & zero;
        if both != 0 {
            return Err(FormatError::invalid(
                "L2 entry",
                format!(
                    "subcluster {} both allocated and zero (bitmap 0x{bitmap:016x})",
                    both.trailing_zeros()
                ),
            ));
        }
        if alloc != 0 && cluster.is_unallocated() {
            return Err(FormatError::invalid(
                "L2 entry",
                format!(
                    "subcluster {} allocated but the entry has no host offset",
                    alloc.trailing_zeros()
                ),
            ));
        }
        Ok(ExtendedL2 {
            cluster,
            alloc,
            zero,
        })
    }

    /// What subcluster `i` (0..32) reads as, in the terms of a standard
    /// entry: `Data` (the cluster's host offset), `Zero`, `Compressed`
    /// (the whole cluster), or `Unallocated` (read the backing chain).
    pub fn subcluster(&self, i: u32) -> L2Mapping {
        let bit = 1u32 << (i % SUBCLUSTERS);
        match self.cluster {
            L2Mapping::Compressed { .. } => self.cluster,
            _ if self.alloc & bit != 0 => self.cluster,
            _ if self.zero & bit != 0 => L2Mapping::Zero {
                prealloc: None,
                copied: false,
            },
            _ => L2Mapping::Unallocated,
        }
    }

    /// The host cluster of a standard (non-compressed) entry, with its
    /// COPIED flag, if it has one.
    pub fn host(&self) -> Option<(u64, bool)> {
        match self.cluster {
            L2Mapping::Data {
                host_offset,
                copied,
            } => Some((host_offset, copied)),
            _ => None,
        }
    }

    /// Encodes an entry with host cluster `host` (0 for none) owned only by
    /// the active L1 table, and the given subcluster bits.
    pub fn encode(host: u64, alloc: u32, zero: u32) -> (u64, u64) {
        debug_assert_eq!(alloc & zero, 0, "subcluster both allocated and zero");
        debug_assert!(host != 0 || alloc == 0, "allocated subcluster without host");
        let word = if host == 0 { 0 } else { host | OFLAG_COPIED };
        (word, u64::from(alloc) | (u64::from(zero) << 32))
    }
}

/// Subcluster bits `first..=last` (of 32) set.
pub fn subcluster_mask(first: u32, last: u32) -> u32 {
    debug_assert!(first <= last && last < SUBCLUSTERS);
    let hi = if last == 31 {
        u32::MAX
    } else {
        (1u32 << (last + 1)) - 1
    };
    hi & !((1u32 << first) - 1)
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

    #[test]
    fn extended_entries() {
        let host = 0x30000u64;
        let e = ExtendedL2::decode(host | OFLAG_COPIED, 0b101 | (0b10 << 32), 16).unwrap();
        assert_eq!(
            e.subcluster(0),
            L2Mapping::Data {
                host_offset: host,
                copied: true
            }
        );
        assert!(matches!(e.subcluster(1), L2Mapping::Zero { .. }));
        assert_eq!(e.subcluster(3), L2Mapping::Unallocated);
        let both = ExtendedL2::decode(host, (1 << 5) | (1 << 37), 16).unwrap_err();
        assert!(
            both.to_string()
                .contains("subcluster 5 both allocated and zero"),
            "{both}"
        );
        let nohost = ExtendedL2::decode(0, 1 << 4, 16).unwrap_err();
        assert!(nohost.to_string().contains("no host offset"), "{nohost}");
        let comp = ExtendedL2::decode(OFLAG_COMPRESSED | 0x12345, 1, 16).unwrap_err();
        assert!(comp.to_string().contains("compressed"), "{comp}");
        assert!(ExtendedL2::decode(host | 1, 0, 16).is_err());
        let (w, b) = ExtendedL2::encode(host, 0xf0, 0xf00);
        let d = ExtendedL2::decode(w, b, 16).unwrap();
        assert_eq!((d.alloc, d.zero), (0xf0, 0xf00));
        assert_eq!(subcluster_mask(0, 31), u32::MAX);
        assert_eq!(subcluster_mask(2, 4), 0b11100);
    }

    proptest! {
        #[test]
        fn decode_never_panics(raw: u64, bm: u64, bits in 9u32..=21, v in 2u32..=3) {
            let _ = L2Mapping::decode(raw, bits, v);
            if let Ok(e) = ExtendedL2::decode(raw, bm, bits) {
                for i in 0..SUBCLUSTERS {
                    let _ = e.subcluster(i);
                }
            }
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

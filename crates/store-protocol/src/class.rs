//! Storage classes: how an object's data is kept, as full replicas or as
//! erasure-coded fragments, and how an erasure-coded object is cut into
//! stripes and fragments. Pure arithmetic; the coding itself is the
//! client's (`strata_store_client::erasure`).

use std::fmt;

/// Most replicas of an object's data, or fragments of an erasure-coded
/// one (one storage node each).
pub const MAX_DATA_REPLICAS: usize = 16;

/// Bytes of an object's data in one full stripe: the unit that is
/// encoded at once, so a client or a repair holds `k + m` shards of
/// about `STRIPE_DATA / k` bytes each, whatever the object's size.
pub const STRIPE_DATA: usize = 1 << 20;

/// Shards are multiples of this many bytes (the Reed–Solomon crate
/// needs an even size; 64 keeps its SIMD loops on whole vectors).
pub const SHARD_ALIGN: usize = 64;

/// Fewest data fragments of an erasure-coded class: one data fragment
/// and `m` parity fragments would be replication done slowly.
pub const MIN_DATA_FRAGMENTS: u8 = 2;

/// Largest object kept inside its metadata record instead of on storage
/// nodes ([`Record::inline`](crate::wire::Record::inline)). A small
/// object on the data path costs every storage node a replica file and
/// its fdatasync on a Post, and every Get a second exchange (a TCP
/// request after the metadata one); inline, a Post is one request and a
/// Get one datagram. 4 KiB holds the common page-sized small object,
/// while a record at every other bound (name, rename link, attributes,
/// addresses) with these bytes and a ticket still fits one datagram,
/// alone and as a row of a handover page.
pub const MAX_INLINE: usize = 4096;

/// How an object's data is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageClass {
    /// `copies` full replicas, each on its own storage node.
    Replicated {
        /// Replicas.
        copies: u8,
    },
    /// Reed–Solomon over `data` data fragments and `parity` parity
    /// fragments, each on its own storage node: any `data` of them give
    /// the object back.
    ErasureCoded {
        /// Data fragments (k).
        data: u8,
        /// Parity fragments (m).
        parity: u8,
    },
}

impl StorageClass {
    /// Parses `replicated(N)` or `ec(K,M)` (also `ec:K+M`), and checks
    /// the bounds ([`StorageClass::validate`]).
    pub fn parse(text: &str) -> Result<StorageClass, String> {
        let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let numbers = |inner: &str, separator: char| -> Option<Vec<u8>> {
            inner.split(separator).map(|n| n.parse().ok()).collect()
        };
        let class = if let Some(inner) = compact
            .strip_prefix("replicated(")
            .and_then(|s| s.strip_suffix(')'))
        {
            match numbers(inner, ',').as_deref() {
                Some([copies]) => Some(StorageClass::Replicated { copies: *copies }),
                _ => None,
            }
        } else if let Some(inner) = compact
            .strip_prefix("ec(")
            .and_then(|s| s.strip_suffix(')'))
            .map(|s| (s, ','))
            .or_else(|| compact.strip_prefix("ec:").map(|s| (s, '+')))
        {
            match numbers(inner.0, inner.1).as_deref() {
                Some([data, parity]) => Some(StorageClass::ErasureCoded {
                    data: *data,
                    parity: *parity,
                }),
                _ => None,
            }
        } else {
            None
        };
        let class = class.ok_or_else(|| {
            format!(
                "storage class {text:?} is not understood: write replicated(N) \
                 or ec(K,M), such as replicated(3) or ec(4,2)"
            )
        })?;
        class.validate()?;
        Ok(class)
    }

    /// Checks the bounds: 1 to 16 replicas; for `ec(k, m)`, k ≥ 2, m ≥ 1
    /// and k + m ≤ 16 (one storage node per fragment).
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            StorageClass::Replicated { copies } => {
                if copies == 0 || copies as usize > MAX_DATA_REPLICAS {
                    return Err(format!(
                        "{self} is out of bounds: a replicated class keeps 1 to \
                         {MAX_DATA_REPLICAS} replicas"
                    ));
                }
            }
            StorageClass::ErasureCoded { data, parity } => {
                let total = data as usize + parity as usize;
                if data < MIN_DATA_FRAGMENTS || parity == 0 || total > MAX_DATA_REPLICAS {
                    return Err(format!(
                        "{self} is out of bounds: an erasure-coded class ec(K,M) needs \
                         K >= {MIN_DATA_FRAGMENTS}, M >= 1 and K + M <= {MAX_DATA_REPLICAS} \
                         (one storage node per fragment), such as ec(4,2) or ec(8,3)"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Storage nodes an object of this class takes: replicas, or k + m.
    pub fn nodes(&self) -> u8 {
        match *self {
            StorageClass::Replicated { copies } => copies,
            StorageClass::ErasureCoded { data, parity } => data + parity,
        }
    }

    /// Whether an object of `size` bytes in this class may be kept inside
    /// its record on `metadata_copies` metadata copies, without its
    /// redundancy dropping: the object must be at most [`MAX_INLINE`]
    /// bytes, and the metadata copies at least as many as the storage
    /// node failures the class survives, plus one. `replicated(n)`
    /// survives n - 1 failures, so it needs n metadata copies; `ec(k,m)`
    /// survives m, so it needs m + 1. An empty object has no data to
    /// lose and is always kept in its record. Otherwise the object takes
    /// the data path as any larger one does.
    pub fn may_inline(&self, size: u64, metadata_copies: u8) -> bool {
        let needed = match *self {
            StorageClass::Replicated { copies } => copies,
            StorageClass::ErasureCoded { parity, .. } => parity.saturating_add(1),
        };
        size == 0 || (size <= MAX_INLINE as u64 && metadata_copies >= needed)
    }

    /// The data fragments (k) of an erasure-coded class; 0 for replicas.
    pub fn data_fragments(&self) -> u8 {
        match *self {
            StorageClass::Replicated { .. } => 0,
            StorageClass::ErasureCoded { data, .. } => data,
        }
    }

    /// The class of `nodes` storage nodes of which `data_fragments` are
    /// data (0: replicas), as tables and records store it.
    pub fn from_counts(nodes: u8, data_fragments: u8) -> StorageClass {
        match data_fragments {
            0 => StorageClass::Replicated { copies: nodes },
            data => StorageClass::ErasureCoded {
                data,
                parity: nodes.saturating_sub(data),
            },
        }
    }
}

impl fmt::Display for StorageClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageClass::Replicated { copies } => write!(f, "replicated({copies})"),
            StorageClass::ErasureCoded { data, parity } => write!(f, "ec({data},{parity})"),
        }
    }
}

/// How an erasure-coded object of `size` bytes is cut: stripes of `data`
/// shards of `shard` bytes each (the last stripe padded with zeros),
/// each stripe encoded into `parity` more shards; fragment `i` is the
/// concatenation of shard `i` of every stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripeLayout {
    /// Data fragments (k).
    pub data: usize,
    /// Parity fragments (m).
    pub parity: usize,
    /// Bytes of one shard.
    pub shard: usize,
    /// Stripes.
    pub stripes: u64,
}

impl StripeLayout {
    /// The layout of an object of `size` bytes (at least 1) in `ec(data,
    /// parity)`: as few stripes as hold it with at most [`STRIPE_DATA`]
    /// bytes each, and shards just long enough (rounded up to
    /// [`SHARD_ALIGN`]) for those stripes to hold it, so the padding is
    /// under `data × SHARD_ALIGN` bytes a stripe.
    pub fn new(size: u64, data: u8, parity: u8) -> StripeLayout {
        let data = usize::from(data.max(1));
        let stripes = size.div_ceil(STRIPE_DATA as u64).max(1);
        let per_shard = size.div_ceil(stripes * data as u64).max(1);
        let shard = usize::try_from(per_shard)
            .unwrap_or(usize::MAX / 2)
            .div_ceil(SHARD_ALIGN)
            * SHARD_ALIGN;
        StripeLayout {
            data,
            parity: usize::from(parity),
            shard,
            stripes,
        }
    }

    /// Bytes of one fragment: a shard per stripe.
    pub fn fragment_len(&self) -> u64 {
        self.shard as u64 * self.stripes
    }

    /// Bytes of the object's data in one stripe.
    pub fn stripe_data(&self) -> usize {
        self.shard * self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_inlined_only_where_the_metadata_copies_keep_their_redundancy() {
        let replicated = |copies| StorageClass::Replicated { copies };
        let coded = |data, parity| StorageClass::ErasureCoded { data, parity };
        let small = MAX_INLINE as u64;
        // replicated(n) needs n metadata copies; ec(k,m) needs m + 1.
        assert!(replicated(3).may_inline(small, 3));
        assert!(!replicated(3).may_inline(small, 2));
        assert!(replicated(1).may_inline(1, 1));
        assert!(coded(4, 2).may_inline(small, 3));
        assert!(!coded(4, 2).may_inline(small, 2));
        // One byte too many takes the data path whatever the copies.
        assert!(!replicated(1).may_inline(small + 1, 16));
        // An empty object has nothing to lose.
        assert!(replicated(3).may_inline(0, 1));
        assert!(coded(8, 3).may_inline(0, 1));
    }

    #[test]
    fn classes_parse_and_print_back() {
        for text in ["replicated(3)", "ec(4,2)", "ec(8,3)"] {
            assert_eq!(StorageClass::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(
            StorageClass::parse("ec:4+2").unwrap(),
            StorageClass::ErasureCoded { data: 4, parity: 2 }
        );
    }

    #[test]
    fn classes_beyond_the_bounds_are_refused_with_what_to_write() {
        for text in [
            "ec(1,2)",
            "ec(4,0)",
            "ec(12,5)",
            "replicated(0)",
            "replicated(17)",
        ] {
            let error = StorageClass::parse(text).unwrap_err();
            assert!(error.contains("out of bounds"), "{text}: {error}");
        }
        for text in ["ec(4)", "raid5", "ec(a,b)", "ec(300,2)"] {
            let error = StorageClass::parse(text).unwrap_err();
            assert!(
                error.contains("write replicated(N) or ec(K,M)"),
                "{text}: {error}"
            );
        }
    }

    #[test]
    fn stripes_cover_the_object_with_aligned_shards() {
        for (size, data, parity) in [
            (1u64, 4u8, 2u8),
            (4096, 4, 2),
            (1 << 20, 4, 2),
            ((1 << 20) + 1, 4, 2),
            (10 << 20, 8, 3),
            (1_000_003, 3, 1),
        ] {
            let layout = StripeLayout::new(size, data, parity);
            assert_eq!(layout.shard % SHARD_ALIGN, 0);
            assert!(layout.stripe_data() as u64 * layout.stripes >= size);
            // No stripe is wholly padding.
            assert!(layout.stripe_data() as u64 * (layout.stripes - 1) < size);
            assert!(layout.stripe_data() <= STRIPE_DATA + data as usize * SHARD_ALIGN);
            // Padding under one aligned unit per shard and stripe.
            let stored = layout.stripe_data() as u64 * layout.stripes;
            assert!(stored - size < (data as u64 * SHARD_ALIGN as u64) * layout.stripes);
        }
        // A 4 KiB object in ec(4,2): six 1 KiB fragments, 1.5x its size.
        let small = StripeLayout::new(4096, 4, 2);
        assert_eq!((small.shard, small.stripes), (1024, 1));
    }
}

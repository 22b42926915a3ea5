//! IPv6 addressing of the cluster: metadata groups, the quadrant-based
//! metadata addresses of an object, and storage-node prefixes.
//!
//! Layout of a cluster `/48` prefix `C`:
//! - `C:0000::/64` is the metadata space. Its low 64 bits are split into
//!   `2^mg_bits` metadata groups (MGs) by their top bits.
//! - `C:k::/64` for `k` in `1..=0xffff` is the prefix of the storage node
//!   with index `k`; every replica it holds gets one address inside it.
//!
//! Everything here is a pure function so clients, metadata nodes and the
//! simulation compute the same addresses.

use std::net::Ipv6Addr;

/// A 128-bit IPv6 address as an integer.
pub type Addr = u128;

/// The most metadata replicas an object may have (quadrant bits stay ≤ 4).
pub const MAX_META_REPLICAS: usize = 16;

/// The most metadata-group bits a cluster may use (65,536 groups).
pub const MAX_MG_BITS: u8 = 16;

/// The cluster prefix used when none is given (`fd53:7472:6174::/48`, a
/// unique-local prefix spelling "Strat").
pub const DEFAULT_CLUSTER_PREFIX: Addr = 0xfd53_7472_6174_u128 << 80;

/// Where a cluster lives in the IPv6 space and how its metadata space is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The cluster's `/48` prefix (low 80 bits zero).
    pub cluster: Addr,
    /// log2 of the number of metadata groups.
    pub mg_bits: u8,
}

impl Layout {
    /// A layout for `cluster` (only its top 48 bits are kept) with
    /// `2^mg_bits` metadata groups; `mg_bits` is clamped to 4..=16 so every
    /// quadrant holds at least one group.
    pub fn new(cluster: Addr, mg_bits: u8) -> Self {
        Layout {
            cluster: cluster & !((1u128 << 80) - 1),
            mg_bits: mg_bits.clamp(4, MAX_MG_BITS),
        }
    }

    /// Number of metadata groups.
    pub fn mg_count(&self) -> usize {
        1usize << self.mg_bits
    }

    /// The metadata space prefix (`/64`).
    pub fn meta_prefix(&self) -> Addr {
        self.cluster
    }

    /// Whether `addr` lies in the metadata space.
    pub fn is_meta(&self, addr: Addr) -> bool {
        addr >> 64 == self.cluster >> 64
    }

    /// The prefix of metadata group `mg` and its length in bits: what a
    /// routed network routes to the metadata node owning the group.
    pub fn mg_prefix(&self, mg: u32) -> (Addr, u8) {
        let shift = 64 - u32::from(self.mg_bits);
        let low = u128::from(mg) << shift;
        (self.cluster | low, 64 + self.mg_bits)
    }

    /// The metadata group of a metadata address, or `None` when `addr` is
    /// not in the metadata space.
    pub fn mg_of(&self, addr: Addr) -> Option<u32> {
        if !self.is_meta(addr) {
            return None;
        }
        Some(((addr as u64) >> (64 - self.mg_bits)) as u32)
    }

    /// The `N_m` metadata addresses of `name`, coordinator first.
    ///
    /// The metadata space is split into `2^⌈log2 N_m⌉` quadrants; the
    /// name's hash picks and orders `N_m` distinct quadrants, and address `i`
    /// is quadrant `q_i`'s prefix plus a hash of the name seeded by `i`.
    pub fn meta_addrs(&self, name: &[u8], n_m: usize) -> Vec<Addr> {
        let n_m = n_m.clamp(1, MAX_META_REPLICAS);
        let q_bits = quadrant_bits(n_m);
        let order = quadrant_order(name, q_bits);
        order
            .iter()
            .take(n_m)
            .enumerate()
            .map(|(i, &quadrant)| {
                let low_bits = 64 - q_bits;
                let h = if low_bits == 64 {
                    hash(name, i as u64)
                } else {
                    hash(name, i as u64) & ((1u64 << low_bits) - 1)
                };
                let quadrant_prefix = if q_bits == 0 {
                    0
                } else {
                    (quadrant as u64) << low_bits
                };
                self.meta_prefix() | (quadrant_prefix | h) as u128
            })
            .collect()
    }

    /// The `/64` prefix of storage node `index` (1..=65,535).
    pub fn sn_prefix(&self, index: u16) -> Addr {
        self.cluster | ((index as u128) << 64)
    }

    /// The storage-node index whose prefix holds `addr`, or `None` when the
    /// address is outside the cluster or in the metadata space.
    pub fn sn_of(&self, addr: Addr) -> Option<u16> {
        if addr >> 80 != self.cluster >> 80 {
            return None;
        }
        let index = ((addr >> 64) & 0xffff) as u16;
        (index != 0).then_some(index)
    }

    /// The address of replica `id` (non-zero) inside storage node `index`.
    pub fn replica_addr(&self, index: u16, id: u64) -> Addr {
        self.sn_prefix(index) | id.max(1) as u128
    }
}

/// Number of quadrant bits for `n_m` metadata replicas: ⌈log2 n_m⌉.
pub fn quadrant_bits(n_m: usize) -> u8 {
    let n = n_m.max(1);
    (usize::BITS - (n - 1).leading_zeros()) as u8
}

/// All `2^q_bits` quadrants in the order the name's hash gives them
/// (a Fisher–Yates shuffle driven by the hash).
fn quadrant_order(name: &[u8], q_bits: u8) -> Vec<u32> {
    let count = 1u32 << q_bits;
    let mut order: Vec<u32> = (0..count).collect();
    let mut state = hash(name, u64::MAX);
    for i in (1..order.len()).rev() {
        state = splitmix64(state);
        let j = (state % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// A seeded 64-bit hash of a name: FNV-1a over the bytes, finished with
/// SplitMix64. Stable across versions and platforms because addresses
/// computed with it are stored.
pub fn hash(name: &[u8], seed: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ splitmix64(seed);
    for &b in name {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    splitmix64(h)
}

/// SplitMix64's finaliser: a fast, well-mixed 64-bit permutation.
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Formats an address the usual IPv6 way.
pub fn fmt_addr(addr: Addr) -> String {
    Ipv6Addr::from(addr).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layout() -> Layout {
        Layout::new(DEFAULT_CLUSTER_PREFIX, 8)
    }

    #[test]
    fn every_metadata_address_lies_in_its_groups_prefix() {
        for bits in [4u8, 8, 16] {
            let l = Layout::new(DEFAULT_CLUSTER_PREFIX, bits);
            for mg in [0, 1, (1u32 << bits) - 1] {
                let (prefix, len) = l.mg_prefix(mg);
                assert_eq!(len, 64 + bits);
                assert_eq!(l.mg_of(prefix), Some(mg));
                let last = prefix | ((1u128 << (128 - u32::from(len))) - 1);
                assert_eq!(l.mg_of(last), Some(mg));
            }
            for a in l.meta_addrs(b"bucket/object", 3) {
                let (prefix, len) = l.mg_prefix(l.mg_of(a).unwrap());
                assert_eq!(
                    a >> (128 - u32::from(len)),
                    prefix >> (128 - u32::from(len))
                );
            }
        }
    }

    #[test]
    fn quadrant_bits_is_ceil_log2() {
        assert_eq!(quadrant_bits(1), 0);
        assert_eq!(quadrant_bits(2), 1);
        assert_eq!(quadrant_bits(3), 2);
        assert_eq!(quadrant_bits(4), 2);
        assert_eq!(quadrant_bits(5), 3);
        assert_eq!(quadrant_bits(16), 4);
    }

    #[test]
    fn sn_prefixes_round_trip() {
        let l = layout();
        for index in [1u16, 2, 77, 0xffff] {
            let a = l.replica_addr(index, 12345);
            assert_eq!(l.sn_of(a), Some(index));
            assert!(!l.is_meta(a));
        }
        assert_eq!(l.sn_of(l.meta_prefix() | 5), None);
        assert_eq!(l.sn_of(0x2001_0db8_u128 << 96), None);
    }

    proptest! {
        #[test]
        fn meta_addrs_are_in_distinct_quadrants(name in proptest::collection::vec(any::<u8>(), 0..64), n_m in 1usize..=16) {
            let l = layout();
            let addrs = l.meta_addrs(&name, n_m);
            prop_assert_eq!(addrs.len(), n_m);
            let q = quadrant_bits(n_m);
            let mut quadrants: Vec<u64> = addrs.iter().map(|&a| if q == 0 { 0 } else { (a as u64) >> (64 - q) }).collect();
            for &a in &addrs {
                prop_assert!(l.is_meta(a));
                prop_assert!(l.mg_of(a).unwrap() < l.mg_count() as u32);
            }
            quadrants.sort_unstable();
            quadrants.dedup();
            prop_assert_eq!(quadrants.len(), n_m);
            // Deterministic: the same name gives the same addresses.
            prop_assert_eq!(addrs, l.meta_addrs(&name, n_m));
        }

        #[test]
        fn distinct_quadrants_mean_distinct_groups(name in proptest::collection::vec(any::<u8>(), 1..32)) {
            let l = layout();
            let addrs = l.meta_addrs(&name, 3);
            let mut mgs: Vec<u32> = addrs.iter().map(|&a| l.mg_of(a).unwrap()).collect();
            mgs.sort_unstable();
            mgs.dedup();
            prop_assert_eq!(mgs.len(), 3);
        }
    }

    #[test]
    fn names_spread_over_groups() {
        let l = layout();
        let mut seen = vec![0u32; l.mg_count()];
        for i in 0..20_000u32 {
            let a = l.meta_addrs(format!("obj-{i}").as_bytes(), 1)[0];
            seen[l.mg_of(a).unwrap() as usize] += 1;
        }
        // 20,000 names over 256 groups: about 78 each; none empty or doubled.
        assert!(seen.iter().all(|&n| n > 30 && n < 160), "{seen:?}");
    }
}

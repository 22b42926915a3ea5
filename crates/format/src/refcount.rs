//! Refcount block entries of 1 to 64 bits.
//!
//! Sub-byte entries are packed least significant bit first; entries of a
//! byte or more are big-endian.

/// Number of refcount entries in one refcount block.
pub fn entries_per_block(cluster_size: u64, refcount_order: u32) -> u64 {
    (cluster_size * 8) >> refcount_order
}

/// Largest refcount an entry of this width can hold.
pub fn max_refcount(refcount_order: u32) -> u64 {
    let bits = 1u32 << refcount_order;
    if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// The bytes that hold entry `index`: `(byte offset, byte count)`.
/// Sub-byte entries share their byte with neighbours.
pub fn entry_bytes(index: u64, refcount_order: u32) -> (u64, usize) {
    let bits = 1u64 << refcount_order;
    if bits < 8 {
        (index * bits / 8, 1)
    } else {
        (index * (bits / 8), (bits / 8) as usize)
    }
}

/// Reads entry `index` from a refcount block buffer. Out-of-range indexes
/// read as 0.
pub fn get(block: &[u8], index: u64, refcount_order: u32) -> u64 {
    let bits = 1u64 << refcount_order;
    let (at, len) = entry_bytes(index, refcount_order);
    let Some(bytes) = block.get(at as usize..at as usize + len) else {
        return 0;
    };
    if bits < 8 {
        let shift = (index * bits) % 8;
        u64::from(bytes[0] >> shift) & ((1 << bits) - 1)
    } else {
        bytes.iter().fold(0u64, |acc, b| acc << 8 | u64::from(*b))
    }
}

/// Writes entry `index` into a refcount block buffer. The value must fit the
/// width (see [`max_refcount`]); out-of-range indexes are ignored.
pub fn set(block: &mut [u8], index: u64, refcount_order: u32, value: u64) {
    let bits = 1u64 << refcount_order;
    let (at, len) = entry_bytes(index, refcount_order);
    let Some(bytes) = block.get_mut(at as usize..at as usize + len) else {
        return;
    };
    if bits < 8 {
        let shift = (index * bits) % 8;
        let mask = (((1u16 << bits) - 1) as u8) << shift;
        bytes[0] = (bytes[0] & !mask) | (((value as u8) << shift) & mask);
    } else {
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (value >> (8 * (len - 1 - i))) as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn set_then_get(order in 0u32..=6, index in 0u64..512, value: u64, other: u64) {
            // Room for entry 512 at 64 bits: index + 1 may be 512.
            let mut block = vec![0u8; 8192];
            let max = max_refcount(order);
            set(&mut block, index + 1, order, other & max);
            set(&mut block, index, order, value & max);
            prop_assert_eq!(get(&block, index, order), value & max);
            prop_assert_eq!(get(&block, index + 1, order), other & max);
        }
    }

    #[test]
    fn one_bit_entries_are_lsb_first() {
        let mut block = vec![0u8; 8];
        set(&mut block, 0, 0, 1);
        set(&mut block, 3, 0, 1);
        assert_eq!(block[0], 0b1001);
    }
}

//! The metadata database's read cache: recently read records by key,
//! bounded in count and in bytes (inline objects make a record up to a
//! few KiB larger), started over when either bound is reached, which
//! keeps it simple.

use std::collections::HashMap;
use strata_store_protocol::wire::Record;

/// Records the read cache holds at most.
pub(crate) const HOT_RECORDS: usize = 16_384;

/// Bytes of keys and records the read cache holds at most (about): with
/// records of 4 KiB inline objects, some 8,000 of them.
pub(crate) const HOT_BYTES: usize = 32 << 20;

/// Recently read records by key (`None`: known absent).
#[derive(Default)]
pub(crate) struct HotRows {
    rows: HashMap<Vec<u8>, Option<Record>>,
    /// The [`cost`] of every row held.
    bytes: usize,
}

/// About the memory one row of the cache takes.
fn cost(key: &[u8], record: &Option<Record>) -> usize {
    let record_bytes = record.as_ref().map_or(0, |r| {
        r.name.len()
            + r.attributes.len()
            + r.inline.as_ref().map_or(0, Vec::len)
            + 16 * (r.meta.len() + r.replicas.len())
            + std::mem::size_of::<Record>()
    });
    key.len() + record_bytes + 64
}

impl HotRows {
    /// The row cached under `key`, if any.
    pub(crate) fn get(&self, key: &[u8]) -> Option<&Option<Record>> {
        self.rows.get(key)
    }

    /// Caches `record` under `key` (replacing what it held), first
    /// starting over if that would pass either bound.
    pub(crate) fn insert(&mut self, key: Vec<u8>, record: Option<Record>) {
        self.remove(&key);
        let size = cost(&key, &record);
        if self.rows.len() >= HOT_RECORDS || self.bytes + size > HOT_BYTES {
            self.clear();
        }
        self.bytes += size;
        self.rows.insert(key, record);
    }

    /// Drops the row cached under `key`.
    pub(crate) fn remove(&mut self, key: &[u8]) {
        if let Some(old) = self.rows.remove(key) {
            self.bytes = self.bytes.saturating_sub(cost(key, &old));
        }
    }

    /// Drops every row.
    pub(crate) fn clear(&mut self) {
        self.rows.clear();
        self.bytes = 0;
    }

    /// Rows held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }

    /// Bytes held ([`cost`] of each row).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inline_record(name: &str) -> Record {
        let data = vec![7; strata_store_protocol::wire::MAX_INLINE];
        Record {
            name: name.into(),
            size: data.len() as u64,
            crc: crc32c::crc32c(&data),
            version: 1,
            meta: vec![1, 2, 3],
            replicas: Vec::new(),
            rename: None,
            attributes: Vec::new(),
            fragments: None,
            inline: Some(data),
        }
    }

    #[test]
    fn records_with_inline_bytes_are_held_within_the_byte_bound() {
        let mut hot = HotRows::default();
        // Twice as many 4 KiB records as the bytes allow, fewer than the
        // count allows: the byte bound is the one that starts it over.
        let count = 2 * HOT_BYTES / strata_store_protocol::wire::MAX_INLINE;
        assert!(count < 2 * HOT_RECORDS);
        let mut most = 0;
        for i in 0..count {
            let key = format!("k{i}").into_bytes();
            hot.insert(key.clone(), Some(inline_record(&format!("k{i}"))));
            assert!(hot.bytes() <= HOT_BYTES, "{} bytes after {i}", hot.bytes());
            assert!(hot.get(&key).is_some());
            most = most.max(hot.len());
        }
        assert!(most < HOT_RECORDS, "{most} rows held");
        // Replacing and removing rows keeps the count of bytes exact.
        let mut hot = HotRows::default();
        hot.insert(b"a".to_vec(), Some(inline_record("a")));
        let one = hot.bytes();
        hot.insert(b"a".to_vec(), Some(inline_record("a")));
        assert_eq!(hot.bytes(), one);
        hot.insert(b"b".to_vec(), None);
        hot.remove(b"a");
        hot.remove(b"b");
        assert_eq!((hot.len(), hot.bytes()), (0, 0));
    }
}

//! Which chunks of a ranged copy have arrived and which are being
//! fetched: the bookkeeping that lets a read far into a large file fetch
//! just its own range, never fetch a chunk twice, and never wait for a
//! chunk that is already here.
//!
//! A file of `size` bytes is cut into chunks of [`CHUNK_BYTES`] (the last
//! one shorter). Two bit sets of one bit a chunk record them, so their
//! memory is bounded by the size, and the size is bounded by
//! [`MAX_CHUNKS`] (larger files are pulled whole instead).

use std::ops::Range;

use bit_vec::BitVec;

use crate::{F3Error, Result};

/// Bytes of one chunk: the unit of a range fetch.
pub const CHUNK_BYTES: u64 = 1024 * 1024;

/// Most chunks a ranged copy tracks (4 TiB at [`CHUNK_BYTES`]; two bit
/// sets of 512 KiB each).
pub const MAX_CHUNKS: u64 = 1 << 22;

/// What [`Chunks::claim`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The chunk is here: read it.
    Arrived,
    /// Another thread fetches it: wait for it.
    Busy,
    /// The caller fetches it now, and then calls [`Chunks::arrive`] or
    /// [`Chunks::release`].
    Claimed,
}

/// The chunks of one file of a known size.
#[derive(Debug, Clone)]
pub struct Chunks {
    size: u64,
    arrived: BitVec,
    fetching: BitVec,
    arrived_count: u64,
}

impl Chunks {
    /// None arrived yet, of a file of `size` bytes; refused past
    /// [`MAX_CHUNKS`] chunks.
    pub fn new(size: u64) -> Result<Chunks> {
        let count = size.div_ceil(CHUNK_BYTES);
        if count > MAX_CHUNKS {
            return Err(F3Error::invalid(format!(
                "a file of {size} bytes has more than {MAX_CHUNKS} chunks of {CHUNK_BYTES} bytes \
                 to track"
            )));
        }
        let bits = count as usize;
        Ok(Chunks {
            size,
            arrived: BitVec::from_elem(bits, false),
            fetching: BitVec::from_elem(bits, false),
            arrived_count: 0,
        })
    }

    /// The file's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// How many chunks the file has.
    pub fn count(&self) -> u64 {
        self.arrived.len() as u64
    }

    /// Chunk `index`'s first byte and length.
    pub fn span(&self, index: u64) -> (u64, u64) {
        let start = index * CHUNK_BYTES;
        (start, CHUNK_BYTES.min(self.size.saturating_sub(start)))
    }

    /// The chunks holding `length` bytes from `offset`, clipped to the
    /// file (empty at or past its end).
    pub fn covering(&self, offset: u64, length: u64) -> Range<u64> {
        let end = offset.saturating_add(length).min(self.size);
        if offset >= end {
            return 0..0;
        }
        offset / CHUNK_BYTES..end.div_ceil(CHUNK_BYTES)
    }

    /// Whether chunk `index` has arrived (false past the end).
    pub fn has(&self, index: u64) -> bool {
        self.arrived.get(index as usize).unwrap_or(false)
    }

    /// Whether every chunk of `range` has arrived.
    pub fn has_all(&self, range: Range<u64>) -> bool {
        range.into_iter().all(|index| self.has(index))
    }

    /// Takes chunk `index` for fetching, unless it is here or being
    /// fetched. An index past the end counts as arrived (nothing to do).
    pub fn claim(&mut self, index: u64) -> Claim {
        if index >= self.count() || self.has(index) {
            return Claim::Arrived;
        }
        if self.fetching.get(index as usize).unwrap_or(false) {
            return Claim::Busy;
        }
        self.fetching.set(index as usize, true);
        Claim::Claimed
    }

    /// The first chunk of `range` neither here nor being fetched, taken
    /// for fetching (a read-ahead's next step).
    pub fn claim_first_missing(&mut self, range: Range<u64>) -> Option<u64> {
        let end = range.end.min(self.count());
        (range.start..end).find(|&index| self.claim(index) == Claim::Claimed)
    }

    /// Claimed chunk `index` arrived.
    pub fn arrive(&mut self, index: u64) {
        if index >= self.count() {
            return;
        }
        self.fetching.set(index as usize, false);
        if !self.has(index) {
            self.arrived.set(index as usize, true);
            self.arrived_count += 1;
        }
    }

    /// Claimed chunk `index` did not arrive: another may fetch it.
    pub fn release(&mut self, index: u64) {
        if index < self.count() {
            self.fetching.set(index as usize, false);
        }
    }

    /// The bytes that have arrived.
    pub fn arrived_bytes(&self) -> u64 {
        let whole = self.arrived_count * CHUNK_BYTES;
        let last = self.count().checked_sub(1);
        match last {
            // The last chunk may be short.
            Some(last) if self.has(last) => whole - CHUNK_BYTES + self.span(last).1,
            _ => whole,
        }
    }

    /// Whether every chunk has arrived.
    pub fn complete(&self) -> bool {
        self.arrived_count == self.count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = CHUNK_BYTES;

    #[test]
    fn covering_clips_to_the_file_and_spans_partial_chunks() {
        let chunks = Chunks::new(10 * MIB + 5).unwrap();
        assert_eq!(chunks.count(), 11);
        assert_eq!(chunks.covering(0, 1), 0..1);
        assert_eq!(chunks.covering(MIB - 1, 2), 0..2);
        assert_eq!(chunks.covering(3 * MIB, MIB), 3..4);
        assert_eq!(chunks.covering(10 * MIB, 1 << 30), 10..11);
        assert_eq!(chunks.covering(10 * MIB + 5, 10), 0..0);
        assert_eq!(chunks.covering(u64::MAX - 1, u64::MAX), 0..0);
        assert_eq!(chunks.span(10), (10 * MIB, 5));
        assert_eq!(chunks.span(2), (2 * MIB, MIB));
    }

    #[test]
    fn a_chunk_is_fetched_once_and_released_on_failure() {
        let mut chunks = Chunks::new(4 * MIB).unwrap();
        assert_eq!(chunks.claim(2), Claim::Claimed);
        assert_eq!(chunks.claim(2), Claim::Busy);
        chunks.release(2);
        assert_eq!(chunks.claim(2), Claim::Claimed);
        chunks.arrive(2);
        assert_eq!(chunks.claim(2), Claim::Arrived);
        assert!(chunks.has(2));
        // Arriving twice counts once.
        chunks.arrive(2);
        assert_eq!(chunks.arrived_bytes(), MIB);
        assert!(!chunks.has_all(1..3));
        assert_eq!(
            chunks.claim(9),
            Claim::Arrived,
            "past the end: nothing to fetch"
        );
    }

    #[test]
    fn read_ahead_skips_what_is_here_or_being_fetched() {
        let mut chunks = Chunks::new(8 * MIB).unwrap();
        chunks.claim(1);
        chunks.arrive(1);
        assert_eq!(chunks.claim(2), Claim::Claimed);
        assert_eq!(chunks.claim_first_missing(1..6), Some(3));
        assert_eq!(chunks.claim_first_missing(1..4), None);
        assert_eq!(chunks.claim_first_missing(7..100), Some(7));
        assert_eq!(chunks.claim_first_missing(8..100), None);
    }

    #[test]
    fn arrived_bytes_count_a_short_last_chunk_and_complete_at_the_end() {
        let mut chunks = Chunks::new(2 * MIB + 100).unwrap();
        chunks.claim(2);
        chunks.arrive(2);
        assert_eq!(chunks.arrived_bytes(), 100);
        chunks.claim(0);
        chunks.arrive(0);
        assert_eq!(chunks.arrived_bytes(), MIB + 100);
        assert!(!chunks.complete());
        chunks.claim(1);
        chunks.arrive(1);
        assert!(chunks.complete());
        assert_eq!(chunks.arrived_bytes(), 2 * MIB + 100);
        assert!(chunks.has_all(0..3));
    }

    #[test]
    fn an_empty_file_is_complete_and_a_huge_one_refused() {
        let chunks = Chunks::new(0).unwrap();
        assert!(chunks.complete());
        assert_eq!(chunks.arrived_bytes(), 0);
        assert_eq!(chunks.covering(0, 10), 0..0);
        assert!(Chunks::new(MAX_CHUNKS * CHUNK_BYTES).is_ok());
        let error = Chunks::new(MAX_CHUNKS * CHUNK_BYTES + 1).unwrap_err();
        assert!(error.message.contains("chunks"), "{error}");
        assert!(Chunks::new(u64::MAX).is_err());
    }
}

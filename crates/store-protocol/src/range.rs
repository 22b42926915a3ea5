//! Byte ranges of a stored object: which ranges a ranged read
//! ([`crate::data::Request::GetRange`]) may ask, and which checksummed
//! chunks of a replica cover one. A storage node serves the chunks
//! covering the range with the CRC-32C of each; the client checks every
//! chunk and keeps only the bytes asked.

/// Most bytes one ranged read asks: a longer range is read in pieces of
/// at most this, so the CRC table a node sends for one stays small
/// (4 KiB at 64 KiB chunks) and a node's send stays bounded.
pub const MAX_RANGE: u64 = 64 << 20;
/// The smallest chunk a node may announce: smaller would make a range's
/// CRC table longer than a client takes.
pub const MIN_CHUNK: u64 = 4 << 10;
/// The largest chunk a node may announce: a client holds one in memory
/// to check it before passing any of its bytes on.
pub const MAX_CHUNK: u64 = 1 << 20;

/// Checks a range of `length` bytes from `offset` of an object of `size`
/// bytes: not empty, at most [`MAX_RANGE`], within the object. The error
/// says what is wrong.
pub fn check_range(offset: u64, length: u64, size: u64) -> Result<(), String> {
    check_request(offset, length)?;
    let end = offset + length;
    if end > size {
        return Err(format!(
            "the range [{offset}, {end}) ends beyond the object's {size} bytes: ask within it"
        ));
    }
    Ok(())
}

/// Checks what a request carries before the object is known: a length
/// of 1 to [`MAX_RANGE`] bytes whose end fits in a u64.
pub fn check_request(offset: u64, length: u64) -> Result<(), String> {
    if length == 0 {
        return Err(format!(
            "an empty range at {offset}: ask for at least one byte"
        ));
    }
    if length > MAX_RANGE {
        return Err(format!(
            "a range of {length} bytes; one read asks at most {MAX_RANGE}: split it"
        ));
    }
    if offset.checked_add(length).is_none() {
        return Err(format!(
            "the range of {length} bytes at {offset} ends past 2^64"
        ));
    }
    Ok(())
}

/// The chunks of an object that cover a range: chunks are `chunk` bytes
/// from the object's start, the last one shorter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSpan {
    /// Index of the first chunk.
    pub first: u64,
    /// Number of chunks.
    pub count: u64,
    /// Offset in the object of the first chunk's first byte.
    pub start: u64,
    /// Bytes of the chunks (the last one cut at the object's end).
    pub len: u64,
}

impl ChunkSpan {
    /// The chunks of `chunk` bytes (at least 1) covering `length` bytes
    /// from `offset` of an object of `size` bytes, a range
    /// [`check_range`] accepted.
    pub fn covering(offset: u64, length: u64, size: u64, chunk: u64) -> ChunkSpan {
        let chunk = chunk.max(1);
        let end = offset.saturating_add(length).min(size);
        let first = offset / chunk;
        let last = end.saturating_sub(1) / chunk;
        let start = first * chunk;
        let stop = ((last + 1).saturating_mul(chunk)).min(size);
        ChunkSpan {
            first,
            count: last + 1 - first,
            start,
            len: stop.saturating_sub(start),
        }
    }

    /// The bytes of the span's chunk `i` (0-based within the span) as
    /// offsets in the object.
    pub fn chunk(&self, i: u64, chunk: u64) -> std::ops::Range<u64> {
        let from = self.start + i * chunk;
        from..(from + chunk).min(self.start + self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bad_ranges_are_refused_with_the_reason() {
        assert!(check_range(0, 0, 10).unwrap_err().contains("empty range"));
        assert!(check_range(5, 6, 10).unwrap_err().contains("beyond"));
        assert!(check_range(u64::MAX, 2, u64::MAX)
            .unwrap_err()
            .contains("past 2^64"));
        assert!(check_range(0, MAX_RANGE + 1, u64::MAX)
            .unwrap_err()
            .contains("split it"));
        assert_eq!(check_range(9, 1, 10), Ok(()));
        assert_eq!(check_range(0, 10, 10), Ok(()));
    }

    #[test]
    fn a_span_is_the_aligned_chunks_cut_at_the_object_s_end() {
        let span = ChunkSpan::covering(70_000, 10, 200_000, 65_536);
        assert_eq!(
            span,
            ChunkSpan {
                first: 1,
                count: 1,
                start: 65_536,
                len: 65_536
            }
        );
        let span = ChunkSpan::covering(65_535, 2, 131_073, 65_536);
        assert_eq!((span.first, span.count, span.len), (0, 2, 131_072));
        let tail = ChunkSpan::covering(131_072, 1, 131_073, 65_536);
        assert_eq!((tail.first, tail.count, tail.len), (2, 1, 1));
        assert_eq!(tail.chunk(0, 65_536), 131_072..131_073);
    }

    proptest! {
        /// Every byte asked lies in exactly one chunk of the span, the
        /// chunks tile the span, and the span holds no chunk more than
        /// needed.
        #[test]
        fn a_span_covers_the_range_and_no_more(
            size in 1u64..1_000_000,
            a in 0u64..1_000_000,
            b in 0u64..1_000_000,
            chunk in prop::sample::select(vec![1u64, 7, 4096, 65_536]),
        ) {
            let (offset, end) = (a.min(b) % size, (a.max(b) % size) + 1);
            prop_assume!(offset < end);
            let length = end - offset;
            prop_assume!(check_range(offset, length, size).is_ok());
            let span = ChunkSpan::covering(offset, length, size, chunk);
            prop_assert!(span.start <= offset && span.start + span.len >= end);
            prop_assert_eq!(span.start % chunk, 0);
            prop_assert!(span.start + span.len <= size);
            let mut at = span.start;
            for i in 0..span.count {
                let c = span.chunk(i, chunk);
                prop_assert_eq!(c.start, at);
                prop_assert!(!c.is_empty());
                at = c.end;
            }
            prop_assert_eq!(at, span.start + span.len);
            // The first and last chunks hold asked bytes.
            prop_assert!(span.chunk(0, chunk).end > offset);
            prop_assert!(span.chunk(span.count - 1, chunk).start < end);
        }
    }
}

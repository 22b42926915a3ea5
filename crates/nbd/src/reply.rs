//! Encoded replies on their way to the socket.
//!
//! A reply is a list of byte segments: small headers kept inline, longer
//! encoded payloads, and slices of one data buffer (read data is never
//! copied into a second buffer). It is written with one `writev` in the
//! common case.

use std::io::{IoSlice, Write};

use crate::proto::{self, Extent};

/// Largest header kept inline (an `OFFSET_HOLE` chunk).
const INLINE: usize = 32;

enum Part {
    Inline { bytes: [u8; INLINE], len: u8 },
    Owned(Vec<u8>),
    Data { start: usize, end: usize },
}

/// One encoded reply (all the chunks of one request), borrowing the data
/// buffer of a read.
pub(crate) struct Reply<'a> {
    parts: Vec<Part>,
    data: &'a [u8],
}

impl<'a> Reply<'a> {
    fn new() -> Reply<'a> {
        Reply {
            parts: Vec::with_capacity(2),
            data: &[],
        }
    }

    fn inline(&mut self, b: &[u8]) {
        let mut bytes = [0u8; INLINE];
        bytes[..b.len()].copy_from_slice(b);
        self.parts.push(Part::Inline {
            bytes,
            len: b.len() as u8,
        });
    }

    /// Success without data: a simple reply, or a lone `NONE` chunk.
    pub(crate) fn ok(handle: u64, structured: bool) -> Reply<'a> {
        let mut r = Reply::new();
        if structured {
            r.inline(&proto::encode_none_chunk(handle));
        } else {
            r.inline(&proto::encode_simple_reply(0, handle));
        }
        r
    }

    /// A failed request: a simple reply with the error, or an `ERROR`
    /// chunk carrying the message too.
    pub(crate) fn error(handle: u64, error: u32, message: &str, structured: bool) -> Reply<'a> {
        let mut r = Reply::new();
        if structured {
            let mut out = Vec::with_capacity(proto::CHUNK_HEADER_LEN + 6 + message.len());
            proto::encode_error_chunk(&mut out, handle, error, message);
            r.parts.push(Part::Owned(out));
        } else {
            r.inline(&proto::encode_simple_reply(error, handle));
        }
        r
    }

    /// A successful simple read reply: header, then the data.
    pub(crate) fn simple_data(handle: u64, data: &'a [u8]) -> Reply<'a> {
        let mut r = Reply::new();
        r.inline(&proto::encode_simple_reply(0, handle));
        r.parts.push(Part::Data {
            start: 0,
            end: data.len(),
        });
        r.data = data;
        r
    }

    /// A successful structured read of `data` (read at `offset`): data
    /// chunks, and hole chunks for `holes` (sorted, disjoint ranges
    /// relative to `offset`). The last chunk carries the DONE flag: the
    /// data is all in memory, so no error can follow it.
    pub(crate) fn structured_read(
        handle: u64,
        offset: u64,
        data: &'a [u8],
        holes: &[(u64, u64)],
    ) -> Reply<'a> {
        let total = data.len() as u64;
        let mut r = Reply::new();
        // (start, end, is_hole) pieces covering the whole read.
        let mut pieces: Vec<(u64, u64, bool)> = Vec::with_capacity(holes.len() * 2 + 1);
        let mut pos = 0u64;
        for &(start, len) in holes {
            let end = start.saturating_add(len).min(total);
            if start < pos || start >= end {
                continue;
            }
            if start > pos {
                pieces.push((pos, start, false));
            }
            pieces.push((start, end, true));
            pos = end;
        }
        if pos < total || pieces.is_empty() {
            pieces.push((pos, total, false));
        }
        let last = pieces.len() - 1;
        for (i, &(start, end, hole)) in pieces.iter().enumerate() {
            let flags = if i == last { proto::REPLY_FLAG_DONE } else { 0 };
            let at = offset + start;
            // Pieces lie inside one read of at most 32 MiB: lengths fit.
            let len = (end - start) as u32;
            if hole {
                r.inline(&proto::encode_offset_hole(flags, handle, at, len));
            } else {
                match proto::encode_offset_data_header(flags, handle, at, len as usize) {
                    Some(h) => r.inline(&h),
                    None => return Reply::error(handle, proto::EOVERFLOW, "read too long", true),
                }
                r.parts.push(Part::Data {
                    start: start as usize,
                    end: end as usize,
                });
            }
        }
        r.data = data;
        r
    }

    /// A successful block status reply for one context.
    pub(crate) fn block_status(handle: u64, context: u32, extents: &[Extent]) -> Reply<'a> {
        let mut out = Vec::with_capacity(proto::CHUNK_HEADER_LEN + 4 + 8 * extents.len());
        match proto::encode_block_status(&mut out, proto::REPLY_FLAG_DONE, handle, context, extents)
        {
            Some(()) => {
                let mut r = Reply::new();
                r.parts.push(Part::Owned(out));
                r
            }
            None => Reply::error(handle, proto::EINVAL, "no extents", true),
        }
    }

    fn part<'s>(&'s self, part: &'s Part) -> &'s [u8] {
        match part {
            Part::Inline { bytes, len } => &bytes[..*len as usize],
            Part::Owned(v) => v,
            Part::Data { start, end } => self.data.get(*start..*end).unwrap_or(&[]),
        }
    }

    fn slices(&self) -> Vec<&[u8]> {
        self.parts
            .iter()
            .map(|p| self.part(p))
            .filter(|s| !s.is_empty())
            .collect()
    }

    /// Writes the whole reply to `w`, gathering its parts into as few
    /// `writev` calls as the socket allows.
    pub(crate) fn write_to<W: Write>(&self, w: &mut W) -> std::io::Result<()> {
        let slices = self.slices();
        let (mut first, mut skip) = (0usize, 0usize);
        while first < slices.len() {
            let mut io: Vec<IoSlice<'_>> = Vec::with_capacity(slices.len() - first);
            io.push(IoSlice::new(&slices[first][skip..]));
            io.extend(slices[first + 1..].iter().map(|s| IoSlice::new(s)));
            let mut n = match w.write_vectored(&io) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            // Advance past what was written.
            while n > 0 && first < slices.len() {
                let left = slices[first].len() - skip;
                if n >= left {
                    n -= left;
                    first += 1;
                    skip = 0;
                } else {
                    skip += n;
                    n = 0;
                }
            }
        }
        Ok(())
    }

    /// Length of the encoded reply in bytes.
    pub(crate) fn len(&self) -> usize {
        self.parts.iter().map(|p| self.part(p).len()).sum()
    }

    /// Appends the encoded reply to `out`.
    pub(crate) fn append_to(&self, out: &mut Vec<u8>) {
        for p in &self.parts {
            out.extend_from_slice(self.part(p));
        }
    }

    /// Every byte of the reply, concatenated (for tests).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> Vec<u8> {
        self.slices().concat()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::*;

    /// Splits a structured reply into (header, payload) chunks.
    fn chunks(mut b: &[u8]) -> Vec<(ChunkHeader, Vec<u8>)> {
        let mut out = Vec::new();
        while !b.is_empty() {
            let h = parse_chunk_header(b[..CHUNK_HEADER_LEN].try_into().unwrap()).unwrap();
            let end = CHUNK_HEADER_LEN + h.length as usize;
            out.push((h, b[CHUNK_HEADER_LEN..end].to_vec()));
            b = &b[end..];
        }
        out
    }

    #[test]
    fn read_split_into_data_and_holes() {
        let mut data = vec![0u8; 64 * 1024];
        data[..4096].fill(7);
        data[60 * 1024..].fill(9);
        let r = Reply::structured_read(5, 1 << 20, &data, &[(4096, 56 * 1024)]);
        let c = chunks(&r.bytes());
        assert_eq!(c.len(), 3);
        assert_eq!(c[0].0.kind, REPLY_TYPE_OFFSET_DATA);
        assert_eq!(c[0].0.flags, 0);
        assert_eq!(&c[0].1[..8], &(1u64 << 20).to_be_bytes());
        assert_eq!(c[0].1.len(), 8 + 4096);
        assert_eq!(c[1].0.kind, REPLY_TYPE_OFFSET_HOLE);
        assert_eq!(&c[1].1[8..], &(56u32 * 1024).to_be_bytes());
        assert_eq!(c[2].0.kind, REPLY_TYPE_OFFSET_DATA);
        assert_eq!(c[2].0.flags, REPLY_FLAG_DONE);
        assert!(c[2].1[8..].iter().all(|&b| b == 9));
    }

    #[test]
    fn read_all_hole_and_bad_holes_ignored() {
        let data = vec![0u8; 8192];
        let r = Reply::structured_read(1, 0, &data, &[(0, 8192)]);
        let c = chunks(&r.bytes());
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].0.kind, REPLY_TYPE_OFFSET_HOLE);
        assert_eq!(c[0].0.flags, REPLY_FLAG_DONE);

        // Overlapping or out-of-order holes are skipped, never sent twice.
        let r = Reply::structured_read(1, 0, &data, &[(4096, 4096), (0, 8192)]);
        let c = chunks(&r.bytes());
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].0.kind, REPLY_TYPE_OFFSET_DATA);
        assert_eq!(c[1].0.kind, REPLY_TYPE_OFFSET_HOLE);
    }

    /// A writer that takes at most 5 bytes per call, like a full socket.
    struct Dribble(Vec<u8>);

    impl Write for Dribble {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let n = b.len().min(5);
            self.0.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
            let mut n = 0;
            for b in bufs {
                let k = (5 - n).min(b.len());
                self.0.extend_from_slice(&b[..k]);
                n += k;
                if n == 5 {
                    break;
                }
            }
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn partial_writes_resume() {
        let mut data = vec![0u8; 100];
        for (i, b) in data.iter_mut().enumerate() {
            *b = i as u8;
        }
        let r = Reply::simple_data(42, &data);
        let mut w = Dribble(Vec::new());
        r.write_to(&mut w).unwrap();
        assert_eq!(w.0, r.bytes());
        assert_eq!(w.0.len(), 116);
    }
}

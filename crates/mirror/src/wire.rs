//! The peer protocol's frames, pure encode and decode.
//!
//! Every frame is a big-endian u32 length, then a type byte and its body.
//! Frames are bounded (a chunk plus a small header) and every field is
//! checked against the image before use; anything else ends the link.
//!
//! - `HELLO` (1): magic `STRMIRR1`, image id (32 bytes, the manifest's
//!   digest), chunk size (u32), chunk count (u32), the sender's peer
//!   address (u8 length, then text). Both sides send it first; a link
//!   between mirrors of different images is refused.
//! - `HAVE` (2): count (u32) then that many chunk numbers (u32), in the
//!   order the sender acquired them. At most [`MAX_HAVE`] per frame.
//! - `WANT` (3): request id (u64), chunk (u32), priority (0 on demand,
//!   1 prefetch).
//! - `DATA` (4): request id, chunk, then the chunk's bytes.
//! - `NONE` (5): request id, chunk: not held (or written locally).
//! - `BUSY` (7): request id, chunk: held, but the sender's upload queue is
//!   full; ask another holder (or again later).
//! - `COMING` (6): like `HAVE`, for chunks the sender is fetching from the
//!   repository now: a peer that needs one waits for the `HAVE` instead of
//!   reading the same chunk from the repository too.

use std::io::Read;

use crate::digest::Hash;

/// Magic inside `HELLO`.
pub const MAGIC: &[u8; 8] = b"STRMIRR1";
/// Most chunk numbers in one `HAVE`.
pub const MAX_HAVE: usize = 8192;
/// Longest peer address in `HELLO`.
pub const MAX_ADDR: usize = 128;
/// Bytes of a frame besides chunk data (type, request id, chunk).
const DATA_HEADER: usize = 1 + 8 + 4;

/// A message between two mirrors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// First message on a link.
    Hello {
        /// Digest of the image's manifest.
        image_id: Hash,
        /// Chunk size.
        chunk_size: u32,
        /// Chunk count.
        chunks: u32,
        /// Where the sender accepts peer links.
        listen: String,
    },
    /// Chunks the sender holds, in acquisition order.
    Have(Vec<u32>),
    /// Chunks the sender is fetching from the repository.
    Coming(Vec<u32>),
    /// The chunk is held but the sender is too busy to send it now.
    Busy {
        /// Request id.
        req: u64,
        /// Chunk number.
        chunk: u32,
    },
    /// A request for a chunk.
    Want {
        /// Request id, echoed in the reply.
        req: u64,
        /// Chunk number.
        chunk: u32,
        /// On demand (served first) rather than prefetch.
        demand: bool,
    },
    /// A chunk's data.
    Data {
        /// Request id.
        req: u64,
        /// Chunk number.
        chunk: u32,
        /// The bytes (checked against the manifest by the receiver).
        data: Vec<u8>,
    },
    /// The chunk is not available from the sender.
    Missing {
        /// Request id.
        req: u64,
        /// Chunk number.
        chunk: u32,
    },
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad peer message: {0}")]
pub struct WireError(pub String);

fn bad<T>(why: impl Into<String>) -> Result<T, WireError> {
    Err(WireError(why.into()))
}

/// Limits a frame is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Chunk count of the image (chunk numbers must be below it).
    pub chunks: u32,
    /// Chunk size (data must not be longer).
    pub chunk_size: u32,
}

impl Limits {
    /// Largest frame body allowed.
    pub fn max_frame(&self) -> usize {
        (DATA_HEADER + self.chunk_size as usize).max(1 + 4 + 4 * MAX_HAVE)
    }
}

/// Encodes a message as a whole frame, length prefix included.
pub fn encode(msg: &Msg) -> Vec<u8> {
    let mut b = vec![0u8; 4];
    match msg {
        Msg::Hello {
            image_id,
            chunk_size,
            chunks,
            listen,
        } => {
            b.push(1);
            b.extend_from_slice(MAGIC);
            b.extend_from_slice(image_id);
            b.extend_from_slice(&chunk_size.to_be_bytes());
            b.extend_from_slice(&chunks.to_be_bytes());
            let addr = &listen.as_bytes()[..listen.len().min(MAX_ADDR)];
            b.push(addr.len() as u8);
            b.extend_from_slice(addr);
        }
        Msg::Have(list) | Msg::Coming(list) => {
            b.push(if matches!(msg, Msg::Have(_)) { 2 } else { 6 });
            b.extend_from_slice(&(list.len() as u32).to_be_bytes());
            for c in list {
                b.extend_from_slice(&c.to_be_bytes());
            }
        }
        Msg::Want { req, chunk, demand } => {
            b.push(3);
            b.extend_from_slice(&req.to_be_bytes());
            b.extend_from_slice(&chunk.to_be_bytes());
            b.push(if *demand { 0 } else { 1 });
        }
        Msg::Data { req, chunk, data } => {
            b.push(4);
            b.extend_from_slice(&req.to_be_bytes());
            b.extend_from_slice(&chunk.to_be_bytes());
            b.extend_from_slice(data);
        }
        Msg::Missing { req, chunk } | Msg::Busy { req, chunk } => {
            b.push(if matches!(msg, Msg::Missing { .. }) {
                5
            } else {
                7
            });
            b.extend_from_slice(&req.to_be_bytes());
            b.extend_from_slice(&chunk.to_be_bytes());
        }
    }
    let len = (b.len() - 4) as u32;
    b[..4].copy_from_slice(&len.to_be_bytes());
    b
}

/// Reads one frame body (after its length), refusing bodies longer than
/// `max` before allocating them.
pub fn read_frame(r: &mut impl Read, max: usize) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 || len > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("peer frame of {len} bytes (limit {max})"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(body)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn chunk_at(b: &[u8], at: usize, limits: &Limits) -> Result<u32, WireError> {
    let c = u32_at(b, at);
    if c >= limits.chunks {
        return bad(format!(
            "chunk {c} beyond the image's {} chunks",
            limits.chunks
        ));
    }
    Ok(c)
}

/// Decodes a `HELLO` body (no limits are known yet).
pub fn decode_hello(body: &[u8]) -> Result<Msg, WireError> {
    if body.len() < 1 + 8 + 32 + 8 + 1 || body[0] != 1 || &body[1..9] != MAGIC {
        return bad("expected HELLO with the mirror magic");
    }
    let n = body[49] as usize;
    if body.len() != 50 + n || n > MAX_ADDR {
        return bad("HELLO has the wrong length");
    }
    let listen = std::str::from_utf8(&body[50..])
        .map_err(|_| WireError("HELLO address is not UTF-8".into()))?
        .to_string();
    Ok(Msg::Hello {
        image_id: body[9..41].try_into().expect("32 bytes"),
        chunk_size: u32_at(body, 41),
        chunks: u32_at(body, 45),
        listen,
    })
}

/// Decodes a frame body after the handshake.
pub fn decode(body: &[u8], limits: &Limits) -> Result<Msg, WireError> {
    let Some((&kind, rest)) = body.split_first() else {
        return bad("empty frame");
    };
    match kind {
        2 | 6 => {
            if rest.len() < 4 {
                return bad("short HAVE");
            }
            let n = u32_at(rest, 0) as usize;
            if n > MAX_HAVE || rest.len() != 4 + 4 * n {
                return bad(format!("HAVE of {n} chunks in {} bytes", rest.len()));
            }
            let list = (0..n)
                .map(|i| chunk_at(rest, 4 + 4 * i, limits))
                .collect::<Result<_, _>>()?;
            Ok(if kind == 2 {
                Msg::Have(list)
            } else {
                Msg::Coming(list)
            })
        }
        3 => {
            if rest.len() != 13 || rest[12] > 1 {
                return bad("malformed WANT");
            }
            Ok(Msg::Want {
                req: u64_at(rest, 0),
                chunk: chunk_at(rest, 8, limits)?,
                demand: rest[12] == 0,
            })
        }
        4 => {
            if rest.len() < 12 || rest.len() - 12 > limits.chunk_size as usize {
                return bad("DATA of the wrong size");
            }
            Ok(Msg::Data {
                req: u64_at(rest, 0),
                chunk: chunk_at(rest, 8, limits)?,
                data: rest[12..].to_vec(),
            })
        }
        5 | 7 => {
            if rest.len() != 12 {
                return bad("malformed NONE or BUSY");
            }
            let (req, chunk) = (u64_at(rest, 0), chunk_at(rest, 8, limits)?);
            Ok(if kind == 5 {
                Msg::Missing { req, chunk }
            } else {
                Msg::Busy { req, chunk }
            })
        }
        1 => bad("second HELLO"),
        k => bad(format!("unknown message type {k}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const L: Limits = Limits {
        chunks: 100,
        chunk_size: 4096,
    };

    fn body(msg: &Msg) -> Vec<u8> {
        encode(msg)[4..].to_vec()
    }

    #[test]
    fn round_trips() {
        let hello = Msg::Hello {
            image_id: [9; 32],
            chunk_size: 4096,
            chunks: 100,
            listen: "127.0.0.1:5000".into(),
        };
        assert_eq!(decode_hello(&body(&hello)).unwrap(), hello);
        for m in [
            Msg::Have(vec![1, 5, 99]),
            Msg::Coming(vec![0, 2]),
            Msg::Want {
                req: 7,
                chunk: 3,
                demand: true,
            },
            Msg::Data {
                req: 8,
                chunk: 4,
                data: vec![1; 4096],
            },
            Msg::Missing { req: 9, chunk: 0 },
            Msg::Busy { req: 10, chunk: 99 },
        ] {
            assert_eq!(decode(&body(&m), &L).unwrap(), m);
        }
    }

    #[test]
    fn refuses_out_of_range_and_oversized() {
        assert!(decode(&body(&Msg::Have(vec![100])), &L).is_err());
        let big = Msg::Data {
            req: 1,
            chunk: 1,
            data: vec![0; 4097],
        };
        assert!(decode(&body(&big), &L).is_err());
        let mut lying_count = body(&Msg::Have(vec![1, 2]));
        lying_count[4] = 3;
        assert!(decode(&lying_count, &L).is_err());
        let frame = [0xffu8, 0xff, 0xff, 0xff, 1];
        assert!(read_frame(&mut &frame[..], L.max_frame()).is_err());
        assert!(decode(&[], &L).is_err());
        assert!(decode(&[1], &L).is_err());
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes, &L);
            let _ = decode_hello(&bytes);
            let _ = read_frame(&mut &bytes[..], L.max_frame());
        }
    }
}

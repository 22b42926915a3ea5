//! The image's chunk manifest: the image size, the chunk size and the
//! SHA-256 digest of every chunk. It is stored next to the image in the
//! repository (`IMAGE.digest`), made once by `strata mirror digest`, and is
//! the only thing a mirror trusts: every chunk, from a peer or from the
//! repository, is checked against it before it is stored or served.
//!
//! Layout (big-endian): magic `STRDGST1`, image size (u64), chunk size
//! (u32), chunk count (u64), then 32 bytes per chunk.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::{io_err, MirrorError, Result};

/// Magic at the start of a manifest.
pub const MAGIC: &[u8; 8] = b"STRDGST1";
/// Bytes before the digests.
pub const HEADER_LEN: usize = 28;
/// Default chunk size: 32 KiB, as in the paper.
pub const DEFAULT_CHUNK_SIZE: u32 = 32 * 1024;
/// Smallest chunk size accepted.
pub const MIN_CHUNK_SIZE: u32 = 4 * 1024;
/// Largest chunk size accepted (bounds every buffer and peer frame).
pub const MAX_CHUNK_SIZE: u32 = 4 * 1024 * 1024;
/// Most chunks in one image (bounds the manifest at 256 MiB and every
/// per-chunk table).
pub const MAX_CHUNKS: u64 = 8 * 1024 * 1024;
/// Suffix of the manifest's name next to the image.
pub const SUFFIX: &str = ".digest";

/// A SHA-256 digest.
pub type Hash = [u8; 32];

/// The per-chunk digests of one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Image size in bytes.
    pub image_size: u64,
    /// Chunk size in bytes (the last chunk may be shorter).
    pub chunk_size: u32,
    /// One digest per chunk.
    pub digests: Vec<Hash>,
}

/// Checks a chunk size: a power of two between the bounds.
pub fn check_chunk_size(chunk_size: u64) -> Result<u32> {
    if !chunk_size.is_power_of_two()
        || chunk_size < MIN_CHUNK_SIZE as u64
        || chunk_size > MAX_CHUNK_SIZE as u64
    {
        return Err(MirrorError::Config(format!(
            "chunk size {chunk_size} is not a power of two between {MIN_CHUNK_SIZE} and {MAX_CHUNK_SIZE} bytes"
        )));
    }
    Ok(chunk_size as u32)
}

/// Number of chunks of an image, checked against [`MAX_CHUNKS`].
pub fn chunk_count(image_size: u64, chunk_size: u32) -> Result<u64> {
    let n = image_size.div_ceil(chunk_size as u64);
    if n > MAX_CHUNKS {
        return Err(MirrorError::Config(format!(
            "an image of {image_size} bytes has {n} chunks of {chunk_size} bytes, more than {MAX_CHUNKS}: use larger chunks"
        )));
    }
    Ok(n)
}

/// SHA-256 of `data`.
pub fn hash(data: &[u8]) -> Hash {
    Sha256::digest(data).into()
}

impl Manifest {
    /// Digests the image at `path` chunk by chunk; `progress` gets the
    /// bytes done so far.
    pub fn compute(path: &Path, chunk_size: u32, mut progress: impl FnMut(u64)) -> Result<Self> {
        let chunk_size = check_chunk_size(chunk_size as u64)?;
        let shown = path.display().to_string();
        let mut file = File::open(path).map_err(io_err(format!("cannot open '{shown}'")))?;
        let image_size = file
            .metadata()
            .map_err(io_err(format!("cannot stat '{shown}'")))?
            .len();
        let n = chunk_count(image_size, chunk_size)?;
        let mut digests = Vec::with_capacity(n as usize);
        let mut buf = vec![0u8; chunk_size as usize];
        let mut done = 0u64;
        for _ in 0..n {
            let len = (image_size - done).min(chunk_size as u64) as usize;
            file.read_exact(&mut buf[..len])
                .map_err(io_err(format!("cannot read '{shown}' at {done}")))?;
            digests.push(hash(&buf[..len]));
            done += len as u64;
            progress(done);
        }
        Ok(Manifest {
            image_size,
            chunk_size,
            digests,
        })
    }

    /// Number of chunks.
    pub fn chunks(&self) -> u32 {
        self.digests.len() as u32
    }

    /// Byte offset and length of chunk `c`.
    pub fn extent(&self, c: u32) -> (u64, usize) {
        let off = c as u64 * self.chunk_size as u64;
        let len = (self.image_size - off).min(self.chunk_size as u64) as usize;
        (off, len)
    }

    /// Whether `data` is chunk `c` of the image.
    pub fn verify(&self, c: u32, data: &[u8]) -> bool {
        self.digests
            .get(c as usize)
            .is_some_and(|d| data.len() == self.extent(c).1 && hash(data) == *d)
    }

    /// The image's identity: the digest of the encoded manifest. Peers
    /// exchange it so mirrors of different images never talk.
    pub fn id(&self) -> Hash {
        hash(&self.encode())
    }

    /// The manifest as stored.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + 32 * self.digests.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.image_size.to_be_bytes());
        out.extend_from_slice(&self.chunk_size.to_be_bytes());
        out.extend_from_slice(&(self.digests.len() as u64).to_be_bytes());
        for d in &self.digests {
            out.extend_from_slice(d);
        }
        out
    }

    /// Parses a stored manifest; `origin` names it in errors.
    pub fn decode(bytes: &[u8], origin: &str) -> Result<Self> {
        let bad = |why: String| {
            MirrorError::Invalid(format!(
                "{origin}: not a valid chunk manifest: {why} (remake it with `strata mirror digest`)"
            ))
        };
        if bytes.len() < HEADER_LEN || &bytes[..8] != MAGIC {
            return Err(bad("wrong magic or too short".into()));
        }
        let image_size = u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes"));
        let chunk_size = u32::from_be_bytes(bytes[16..20].try_into().expect("4 bytes"));
        let count = u64::from_be_bytes(bytes[20..28].try_into().expect("8 bytes"));
        let chunk_size = check_chunk_size(chunk_size as u64).map_err(|e| bad(e.to_string()))?;
        let expected = chunk_count(image_size, chunk_size).map_err(|e| bad(e.to_string()))?;
        if count != expected {
            return Err(bad(format!(
                "{count} chunks listed, an image of {image_size} bytes has {expected}"
            )));
        }
        if (bytes.len() - HEADER_LEN) as u64 != count * 32 {
            return Err(bad(format!(
                "{} bytes of digests, expected {}",
                bytes.len() - HEADER_LEN,
                count * 32
            )));
        }
        let digests = bytes[HEADER_LEN..]
            .chunks_exact(32)
            .map(|d| d.try_into().expect("32 bytes"))
            .collect();
        Ok(Manifest {
            image_size,
            chunk_size,
            digests,
        })
    }

    /// Largest encoded manifest accepted from a repository.
    pub fn max_encoded_len() -> u64 {
        HEADER_LEN as u64 + 32 * MAX_CHUNKS
    }
}

/// Hex rendering of a digest.
pub fn hex(h: &Hash) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            image_size: 3 * 4096 + 100,
            chunk_size: 4096,
            digests: vec![[1; 32], [2; 32], [3; 32], [4; 32]],
        }
    }

    #[test]
    fn round_trip_and_extents() {
        let m = sample();
        assert_eq!(Manifest::decode(&m.encode(), "t").unwrap(), m);
        assert_eq!(m.extent(3), (3 * 4096, 100));
        assert_eq!(m.extent(0), (0, 4096));
    }

    #[test]
    fn verify_checks_content_and_length() {
        let data = vec![7u8; 4096];
        let m = Manifest {
            image_size: 4096,
            chunk_size: 4096,
            digests: vec![hash(&data)],
        };
        assert!(m.verify(0, &data));
        assert!(!m.verify(0, &data[..4095]));
        assert!(!m.verify(0, &[8u8; 4096]));
        assert!(!m.verify(1, &data));
    }

    #[test]
    fn rejects_malformed() {
        let good = sample().encode();
        assert!(Manifest::decode(&good[..10], "t").is_err());
        assert!(Manifest::decode(&good[..good.len() - 1], "t").is_err());
        let mut wrong_count = good.clone();
        wrong_count[27] = 9;
        assert!(Manifest::decode(&wrong_count, "t").is_err());
        let mut bad_chunk = good.clone();
        bad_chunk[16..20].copy_from_slice(&3000u32.to_be_bytes());
        assert!(Manifest::decode(&bad_chunk, "t").is_err());
        let mut huge = good;
        huge[8..16].copy_from_slice(&u64::MAX.to_be_bytes());
        let e = Manifest::decode(&huge, "t").unwrap_err().to_string();
        assert!(e.contains("more than"), "{e}");
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = Manifest::decode(&bytes, "fuzz");
        }
    }
}

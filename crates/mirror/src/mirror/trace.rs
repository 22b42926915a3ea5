//! The recorded access trace a mirror prefetches along: its file name,
//! and its stored form (magic, image id, count, chunk numbers).

use super::*;

/// Magic of a stored trace.
const TRACE_MAGIC: &[u8; 8] = b"STRTRAC1";
/// Name of the trace in the mirror directory.
pub const TRACE_FILE: &str = "trace";

/// A trace as stored: magic, image id, count, chunk numbers.
pub fn encode_trace(image_id: &digest::Hash, order: &[u32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(44 + 4 * order.len());
    b.extend_from_slice(TRACE_MAGIC);
    b.extend_from_slice(image_id);
    b.extend_from_slice(&(order.len() as u32).to_be_bytes());
    for c in order {
        b.extend_from_slice(&c.to_be_bytes());
    }
    b
}

/// Parses a stored trace of the image `image_id` with `chunks` chunks.
pub fn decode_trace(b: &[u8], image_id: &digest::Hash, chunks: u32) -> Result<Vec<u32>> {
    let bad =
        |why: &str| MirrorError::Invalid(format!("the image's access trace is unusable: {why}"));
    if b.len() < 44 || &b[..8] != TRACE_MAGIC {
        return Err(bad("wrong magic or too short"));
    }
    if &b[8..40] != image_id {
        return Err(bad("it was recorded for another image"));
    }
    let n = u32::from_be_bytes(b[40..44].try_into().expect("4 bytes")) as usize;
    if n > chunks as usize || b.len() != 44 + 4 * n {
        return Err(bad("wrong length"));
    }
    Ok(b[44..]
        .chunks_exact(4)
        .map(|x| u32::from_be_bytes(x.try_into().expect("4 bytes")))
        .filter(|c| *c < chunks)
        .collect())
}

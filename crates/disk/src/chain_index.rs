//! Bookkeeping of the chain index stored in a top layer (see
//! [`strata_format::index`]): whether a stored index may be trusted, its
//! checksum, and its extension in the header.

use strata_format::header::AUTOCLEAR_STRATA_INDEX;
use strata_format::index::{ChainIndexExt, LayerIdentity, LINEAGE_RECORD_BYTES};

use crate::error::{DiskError, Result};
use crate::header::write_header;
use crate::layer::Layer;

/// How lookups find the owning layer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "mode", rename_all = "kebab-case")]
pub enum IndexState {
    /// The top layer's stored index is valid and used.
    Stored {
        /// Why it is trusted.
        depth: u32,
    },
    /// No usable index: lookups walk the chain from the top.
    Walk {
        /// Why the stored index (if any) was not used.
        reason: String,
    },
}

/// Checks that the top layer's stored index matches this exact chain.
/// Returns the reason when it does not.
pub(crate) fn validate_index(
    layers: &[Layer],
    unit_bits: u32,
    size: u64,
) -> std::result::Result<ChainIndexExt, String> {
    let top = &layers[layers.len() - 1];
    let Some(header) = top.header() else {
        return Err("top layer is raw".into());
    };
    let Some(ext) = header.chain_index().cloned() else {
        return Err("no chain index stored".into());
    };
    if !header.chain_index_valid() {
        return Err("chain index is stale (another writer touched the image)".into());
    }
    let n = layers.len() as u32;
    if ext.depth != n {
        return Err(format!(
            "index describes {} layers, chain has {n}",
            ext.depth
        ));
    }
    if ext.granularity_bits != unit_bits || ext.virtual_size != size {
        return Err("index geometry does not match the chain".into());
    }
    let cs = top.cluster_bits().map(|b| 1u64 << b).unwrap_or(1);
    let end = ext.region_offset.checked_add(ext.region_len);
    if ext.region_offset % cs != 0 || end.is_none_or(|e| e > top.file_len()) {
        return Err("index region lies outside the file".into());
    }
    // Lineage: every lower layer must be the very file the index was built on.
    let lineage_len = (n as u64 - 1) * LINEAGE_RECORD_BYTES;
    let mut buf = vec![0u8; lineage_len as usize];
    top.file
        .read_exact_at(&mut buf, ext.region_offset + ext.lineage_offset())
        .map_err(|e| e.to_string())?;
    for (i, rec) in buf.chunks_exact(LINEAGE_RECORD_BYTES as usize).enumerate() {
        let want = LayerIdentity::decode(rec).map_err(|e| e.to_string())?;
        let have = layers[i].identity().map_err(|e| e.to_string())?;
        if want != have {
            return Err(format!(
                "layer {} ({}) changed since the index was built",
                i + 1,
                layers[i].path().display()
            ));
        }
    }
    let crc = region_crc(top, &ext).map_err(|e| e.to_string())?;
    if crc != ext.crc32c {
        return Err("index checksum mismatch".into());
    }
    Ok(ext)
}

/// Bytes of an index region checksummed at a time.
const CRC_CHUNK: u64 = 1 << 20;

/// CRC-32C of an index region, read in bounded chunks. A chunk that is a
/// hole of the file is not read: a new layer's region is a hole until its
/// writer publishes owners, and reading a megabyte of zeros per opened
/// volume filled the page cache for nothing.
pub(crate) fn region_crc(layer: &Layer, ext: &ChainIndexExt) -> Result<u32> {
    let mut crc = 0u32;
    let mut buf = Vec::new();
    let mut done = 0u64;
    while done < ext.region_len {
        let n = (ext.region_len - done).min(CRC_CHUNK);
        let at = ext.region_offset + done;
        if layer.file.is_hole(at, n) {
            crc = crc32c::crc32c_combine(crc, crc32c_of_zeros(n), n as usize);
        } else {
            buf.resize(n as usize, 0);
            layer.file.read_exact_at(&mut buf, at)?;
            crc = crc32c::crc32c_append(crc, &buf);
        }
        done += n;
    }
    Ok(crc)
}

/// The CRC-32C of `len` zero bytes. Remembered per length: a pool's
/// volumes share a few sizes, and each of their regions starts as zeros.
pub(crate) fn crc32c_of_zeros(len: u64) -> u32 {
    const CHUNK: usize = 64 * 1024;
    const REMEMBERED: usize = 16;
    static ZEROS: [u8; CHUNK] = [0; CHUNK];
    static KNOWN: parking_lot::Mutex<Vec<(u64, u32)>> = parking_lot::Mutex::new(Vec::new());
    if let Some(&(_, crc)) = KNOWN.lock().iter().find(|(l, _)| *l == len) {
        return crc;
    }
    let mut crc = 0u32;
    let mut left = len;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        crc = crc32c::crc32c_append(crc, &ZEROS[..n]);
        left -= n as u64;
    }
    let mut known = KNOWN.lock();
    if known.iter().any(|(l, _)| *l == len) {
        return crc;
    }
    if known.len() == REMEMBERED {
        known.remove(0);
    }
    known.push((len, crc));
    crc
}

/// Computes a frozen layer's index checksum and puts it in the header it
/// keeps in memory, for a layer frozen with the checksum left for later
/// (see `Writer::freeze`). Its region no longer changes.
pub(crate) fn store_index_crc(layer: &Layer) -> Result<()> {
    let Some(mut h) = layer.header() else {
        return Ok(());
    };
    let Some(mut ext) = h.chain_index().cloned() else {
        return Ok(());
    };
    ext.crc32c = region_crc(layer, &ext)?;
    h.set_chain_index(Some(ext));
    if let Some(q) = &layer.qcow2 {
        *q.header.write() = h;
    }
    Ok(())
}

/// Writes the index extension into the header, valid or not, and syncs it
/// if `sync`.
pub(crate) fn write_index_ext(
    top: &Layer,
    ext: &ChainIndexExt,
    valid: bool,
    sync: bool,
) -> Result<()> {
    let Some(mut h) = top.header() else {
        return Ok(());
    };
    h.set_chain_index(Some(ext.clone()));
    if valid {
        h.autoclear_features |= AUTOCLEAR_STRATA_INDEX;
    } else {
        h.autoclear_features &= !AUTOCLEAR_STRATA_INDEX;
    }
    write_header(top, &h)?;
    if sync {
        top.file.sync()?;
    }
    Ok(())
}

/// A random UUID (version 4).
pub(crate) fn new_uuid() -> Result<[u8; 16]> {
    let mut u = [0u8; 16];
    getrandom::fill(&mut u)
        .map_err(|e| DiskError::Invalid(format!("no randomness for a layer UUID: {e}")))?;
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crc_of_zeros_matches_the_crc_of_a_zeroed_buffer() {
        for len in [0u64, 1, 65_535, 65_536, 65_537, 3 * 65_536 + 5, 1 << 21] {
            let zeros = vec![0u8; len as usize];
            assert_eq!(crc32c_of_zeros(len), crc32c::crc32c(&zeros), "{len} bytes");
            // Asked again: the remembered value.
            assert_eq!(crc32c_of_zeros(len), crc32c::crc32c(&zeros), "{len} bytes");
        }
    }

    #[test]
    fn zeros_combined_after_data_give_the_crc_of_both() {
        let data = b"owners of a chain";
        let mut both = data.to_vec();
        both.extend_from_slice(&[0u8; 3000]);
        let combined = crc32c::crc32c_combine(crc32c::crc32c(data), crc32c_of_zeros(3000), 3000);
        assert_eq!(combined, crc32c::crc32c(&both));
        assert_eq!(
            crc32c::crc32c_combine(0, crc32c_of_zeros(3000), 3000),
            crc32c_of_zeros(3000)
        );
    }
}

//! Writes of a qcow2 layer's header, and the seal that writes a frozen
//! layer's clean header once its data and metadata are durable.

use strata_format::header::{Header, INCOMPAT_CORRUPT};

use crate::error::{DiskError, Result};
use crate::layer::Layer;

/// Encodes `h` into the first cluster and makes it the layer's header.
///
/// A corrupt bit already set in memory stays set: it was set by a refused
/// write over metadata (see [`crate::overlap`]), and a header update racing
/// with it must not clear it.
pub(crate) fn write_header(top: &Layer, h: &Header) -> Result<()> {
    let sticky = top
        .header()
        .map_or(0, |now| now.incompatible_features & INCOMPAT_CORRUPT);
    let mut h = h.clone();
    h.incompatible_features |= sticky;
    let h = &h;
    let buf = h.encode().map_err(|e| DiskError::format(top.place(), e))?;
    top.file.write_all_at(&buf, 0)?;
    if let Some(q) = &top.qcow2 {
        *q.header.write() = h.clone();
    }
    Ok(())
}

/// Makes a frozen layer durable and marks it clean on disk: its data,
/// then the metadata that points at it, then (only once those are
/// durable) the clean header `Writer::freeze` kept in memory. A crash
/// before the end leaves the file marked dirty, and startup repairs it.
pub(crate) fn seal_layer(layer: &Layer) -> Result<()> {
    layer.file.sync()?;
    let Some(h) = layer.header() else {
        return Ok(());
    };
    if h.version < 3 {
        return Ok(());
    }
    write_header(layer, &h)?;
    // Writes the clean header through and syncs.
    layer.file.set_write_back(false)?;
    // A frozen layer takes no more clusters: give back the space
    // reserved past its end (up to 4 MiB per layer of a long chain).
    layer.file.release_reserved();
    Ok(())
}

//! The chain index a writer keeps up to date in its top layer: the stored
//! one when it is valid, else one built from the chain as it is.

use strata_format::index::{ChainIndexExt, LINEAGE_RECORD_BYTES, MAX_REGION_BYTES};

use super::Writer;
use crate::allocator::Allocator;
use crate::chain::Chain;
use crate::chain_index::{new_uuid, write_index_ext, IndexState};
use crate::error::{DiskError, Result};
use crate::overlap::Structure;

/// Units of owners written per chunk when (re)building an index.
const OWNER_CHUNK: u64 = 1 << 16;

impl Writer {
    /// Uses the stored index if it is valid, else builds a new one.
    ///
    /// The header then names the index not valid; `sync_header` makes that
    /// durable at once. A new top skips it for the dirty bit's reason (see
    /// [`Writer::start_on_new_top`]): the index can only go stale on disk
    /// through metadata written back by a sync whose first `fdatasync`
    /// carries this header. A push that left its index copy unsynced would
    /// otherwise pay for writing the whole copy here, inside its pause.
    pub(super) fn attach_index(
        &mut self,
        chain: &Chain,
        owners: Option<&[u16]>,
        sync_header: bool,
    ) -> Result<()> {
        let top = chain.top();
        let fresh_uuid = new_uuid()?;
        if let Some(mut ext) = chain.index.read().clone() {
            ext.layer_uuid = fresh_uuid;
            self.index = Some(ext.clone());
            write_index_ext(top, &ext, false, sync_header)?;
            return Ok(());
        }
        let region = ChainIndexExt::region_len_for(chain.size, chain.unit_bits, chain.depth());
        if region > MAX_REGION_BYTES {
            // Too large to keep: lookups walk the chain, with the same cache.
            return Ok(());
        }
        let alloc = self
            .alloc
            .as_mut()
            .ok_or_else(|| DiskError::Invalid("raw top".into()))?;
        let ext = build_index(chain, alloc, fresh_uuid, owners)?;
        write_index_ext(top, &ext, false, true)?;
        *chain.index.write() = Some(ext.clone());
        *chain.index_state.write() = IndexState::Stored { depth: ext.depth };
        self.index = Some(ext);
        Ok(())
    }
}

/// Builds a fresh index for the top layer from the chain as it is now.
fn build_index(
    chain: &Chain,
    alloc: &mut Allocator,
    uuid: [u8; 16],
    known_owners: Option<&[u16]>,
) -> Result<ChainIndexExt> {
    let top = chain.top();
    let depth = chain.depth();
    let units = chain.units();
    let region_len = ChainIndexExt::region_len_for(chain.size, chain.unit_bits, depth);
    let clusters = region_len.div_ceil(alloc.cs).max(1);
    // The region is not refcounted: to QEMU it is free space. Reuse the
    // previous region when it has the right size and nothing took it over.
    let previous = top.header().and_then(|h| h.chain_index().cloned());
    let region_offset = match previous {
        Some(p)
            if p.region_len == region_len
                && alloc.region_is_free(top, p.region_offset, clusters)? =>
        {
            p.region_offset
        }
        _ => alloc.reserve_unrefcounted(clusters),
    };
    alloc.note_metadata(region_offset, clusters * alloc.cs, Structure::ChainIndex);
    let mut first = 0;
    while first < units {
        let count = (units - first).min(OWNER_CHUNK);
        let owners = match known_owners {
            Some(all) if all.len() as u64 == units => {
                all[first as usize..(first + count) as usize].to_vec()
            }
            _ => chain.owners(first, count as usize)?,
        };
        let bytes: Vec<u8> = owners.iter().flat_map(|o| o.to_be_bytes()).collect();
        top.file.write_all_at(&bytes, region_offset + first * 2)?;
        first += count;
    }
    let lineage: Vec<u8> = chain.layers[..depth as usize - 1]
        .iter()
        .map(|l| l.identity().map(|i| i.encode()))
        .collect::<Result<Vec<_>>>()?
        .concat();
    debug_assert_eq!(
        lineage.len() as u64,
        u64::from(depth - 1) * LINEAGE_RECORD_BYTES
    );
    top.file.write_all_at(&lineage, region_offset + units * 2)?;
    // Pad the region to whole clusters so the file never ends mid-cluster.
    let pad_from = region_offset + region_len;
    let pad_to = region_offset + clusters * alloc.cs;
    if pad_to > pad_from {
        top.file
            .write_all_at(&vec![0u8; (pad_to - pad_from) as usize], pad_from)?;
    }
    Ok(ChainIndexExt {
        region_offset,
        region_len,
        depth,
        granularity_bits: chain.unit_bits,
        virtual_size: chain.size,
        layer_uuid: uuid,
        crc32c: 0,
    })
}

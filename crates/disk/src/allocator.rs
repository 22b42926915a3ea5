//! Cluster allocation and refcount upkeep for one qcow2 file.

use std::sync::Arc;

use strata_format::index::ChainIndexExt;
use strata_format::refcount;

use crate::error::{DiskError, Result};
use crate::header::write_header;
use crate::layer::Layer;
use crate::overlap::{Guard, MetadataMap, Structure};

/// Cluster allocation and refcount upkeep for one qcow2 file. New clusters
/// are taken from the end of the file.
pub(crate) struct Allocator {
    pub(crate) cs: u64,
    order: u32,
    epb: u64,
    reftable: Vec<u64>,
    reftable_offset: u64,
    /// Entries of the on-disk refcount table.
    disk_capacity: u64,
    /// While relocating the table, entries are kept in memory only.
    relocating: bool,
    pub(crate) next_free: u64,
    /// The writer's metadata map, told of every metadata cluster this
    /// allocator adds or frees (`None` outside a writer, e.g. in check).
    pub(crate) guard: Option<Arc<Guard>>,
}

impl Allocator {
    pub(crate) fn load(top: &Layer) -> Result<Allocator> {
        let h = top
            .header()
            .ok_or_else(|| DiskError::Invalid("raw images have no refcounts".into()))?;
        let cs = h.cluster_size();
        // Bounded by MAX_REFTABLE_BYTES, checked when parsing the header.
        let bytes = u64::from(h.refcount_table_clusters) * cs;
        let mut buf = vec![0u8; bytes as usize];
        top.file.read_exact_at(&mut buf, h.refcount_table_offset)?;
        let mut reftable = Vec::with_capacity(buf.len() / 8);
        for (i, c) in buf.chunks_exact(8).enumerate() {
            let raw = u64::from_be_bytes(c.try_into().unwrap_or([0; 8]));
            let off = strata_format::entry::decode_reftable_entry(raw, cs).map_err(|e| {
                DiskError::corrupt(top.place(), format!("refcount table entry {i}: {e}"))
            })?;
            if off != 0 && off.saturating_add(cs) > top.file_len() {
                return Err(DiskError::corrupt(
                    top.place(),
                    format!(
                        "refcount block {i} at 0x{off:x} lies beyond the end of the file \
                         (0x{:x}); refusing to open the image for writing (it can still be \
                         opened read-only; `strata img check -r all` reports the damage)",
                        top.file_len()
                    ),
                ));
            }
            reftable.push(off);
        }
        Allocator {
            cs,
            order: h.refcount_order,
            epb: refcount::entries_per_block(cs, h.refcount_order),
            disk_capacity: reftable.len() as u64,
            reftable,
            reftable_offset: h.refcount_table_offset,
            relocating: false,
            next_free: 0,
            guard: None,
        }
        .with_first_free(top)
    }

    /// Sets where new clusters start: past the end of the file and past
    /// the last cluster with a non-zero refcount, so a file cut short
    /// (or with clusters referenced beyond its end) never gets a cluster
    /// it still references handed out again.
    fn with_first_free(mut self, top: &Layer) -> Result<Allocator> {
        let end_of_file = top.file_len().div_ceil(self.cs) * self.cs;
        let last_used = self.last_referenced(top)?;
        self.next_free = end_of_file.max(last_used.map_or(0, |c| (c + 1) * self.cs));
        Ok(self)
    }

    /// The highest cluster with a non-zero refcount: found in the last
    /// refcount block that has one, scanning just that block.
    fn last_referenced(&self, top: &Layer) -> Result<Option<u64>> {
        let mut buf = vec![0u8; self.cs as usize];
        for (bi, &block) in self.reftable.iter().enumerate().rev() {
            if block == 0 {
                continue;
            }
            top.file.read_exact_at(&mut buf, block)?;
            if let Some(i) = last_nonzero_entry(&buf, self.epb, self.order) {
                return Ok(Some(bi as u64 * self.epb + i));
            }
        }
        Ok(None)
    }

    /// Builds the metadata map of `top` (see [`crate::overlap::scan`]),
    /// with the chain index region `index` that lookups use.
    pub(crate) fn scan(&self, top: &Layer, index: Option<&ChainIndexExt>) -> Result<MetadataMap> {
        let h = top
            .header()
            .ok_or_else(|| DiskError::Invalid("raw images have no metadata".into()))?;
        crate::overlap::scan(top, &h, &self.reftable, index)
    }

    /// Tells the writer's metadata map that `[offset, offset + len)` now
    /// holds `what`.
    pub(crate) fn note_metadata(&self, offset: u64, len: u64, what: Structure) {
        if let Some(g) = &self.guard {
            g.insert(offset, len, what);
        }
    }

    /// Takes `n` contiguous clusters with refcount 1.
    pub(crate) fn alloc(&mut self, top: &Layer, n: u64) -> Result<u64> {
        let host = self.next_free;
        self.next_free += n * self.cs;
        for i in 0..n {
            self.set_refcount(top, host / self.cs + i, 1)?;
        }
        Ok(host)
    }

    /// Takes `n` clusters that stay at refcount 0 (the index region).
    pub(crate) fn reserve_unrefcounted(&mut self, n: u64) -> u64 {
        let at = self.next_free;
        self.next_free += n * self.cs;
        self.note_metadata(at, n * self.cs, Structure::ChainIndex);
        at
    }

    /// Whether `clusters` clusters at `offset` lie inside the file, hold no
    /// metadata and have refcount 0 (a previous index region to reuse).
    pub(crate) fn region_is_free(&self, top: &Layer, offset: u64, clusters: u64) -> Result<bool> {
        if !offset.is_multiple_of(self.cs)
            || offset + clusters * self.cs > top.file_len()
            || offset == 0
        {
            return Ok(false);
        }
        let len = clusters * self.cs;
        if self
            .guard
            .as_ref()
            .is_some_and(|g| g.find(offset, len).is_some())
        {
            return Ok(false);
        }
        for c in offset / self.cs..offset / self.cs + clusters {
            if self.get_refcount(top, c)? != 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    pub(crate) fn get_refcount(&self, top: &Layer, cluster: u64) -> Result<u64> {
        let bi = cluster / self.epb;
        let block = self.reftable.get(bi as usize).copied().unwrap_or(0);
        if block == 0 {
            return Ok(0);
        }
        let (at, len) = refcount::entry_bytes(cluster % self.epb, self.order);
        let mut bytes = vec![0u8; len];
        top.file.read_exact_at(&mut bytes, block + at)?;
        Ok(refcount::get(&bytes, self.local_index(cluster), self.order))
    }

    pub(crate) fn set_refcount(&mut self, top: &Layer, cluster: u64, value: u64) -> Result<()> {
        if value > refcount::max_refcount(self.order) {
            return Err(DiskError::Invalid(format!(
                "refcount {value} does not fit {}-bit refcounts",
                1u32 << self.order
            )));
        }
        let block = self.block_for(top, cluster / self.epb)?;
        let (at, len) = refcount::entry_bytes(cluster % self.epb, self.order);
        // At most 8 bytes (64-bit refcounts): no heap buffer per allocation.
        let mut entry = [0u8; 8];
        let bytes = entry
            .get_mut(..len)
            .ok_or_else(|| DiskError::Invalid(format!("refcount entry of {len} bytes")))?;
        top.file.read_exact_at(bytes, block + at)?;
        refcount::set(bytes, self.local_index(cluster), self.order, value);
        top.file.write_all_at(bytes, block + at)
    }

    /// Index of `cluster`'s entry inside the bytes `entry_bytes` returns.
    fn local_index(&self, cluster: u64) -> u64 {
        if self.order < 3 {
            (cluster % self.epb) % (8 >> self.order)
        } else {
            0
        }
    }

    /// Offset of refcount block `bi`, allocating it (and growing the
    /// refcount table) when missing.
    fn block_for(&mut self, top: &Layer, bi: u64) -> Result<u64> {
        if let Some(&b) = self.reftable.get(bi as usize) {
            if b != 0 {
                return Ok(b);
            }
        }
        if bi >= self.reftable.len() as u64 {
            self.grow_table(top, bi + 1)?;
            // Growing may itself have allocated block `bi` (to count the
            // new table's own clusters): look again.
            return self.block_for(top, bi);
        }
        let block = self.next_free;
        self.next_free += self.cs;
        self.note_metadata(block, self.cs, Structure::RefcountBlock);
        let own = block / self.cs;
        let mut buf = vec![0u8; self.cs as usize];
        if own / self.epb == bi {
            refcount::set(&mut buf, own % self.epb, self.order, 1);
        }
        top.file.write_all_at(&buf, block)?;
        self.reftable[bi as usize] = block;
        if !self.relocating && bi < self.disk_capacity {
            top.file
                .write_all_at(&block.to_be_bytes(), self.reftable_offset + bi * 8)?;
        }
        if own / self.epb != bi {
            self.set_refcount(top, own, 1)?;
        }
        Ok(block)
    }

    /// Moves the refcount table to a larger place at the end of the file.
    fn grow_table(&mut self, top: &Layer, min_entries: u64) -> Result<()> {
        let cs = self.cs;
        let want = min_entries.max(self.reftable.len() as u64 * 2);
        let clusters = (want * 8).div_ceil(cs);
        if clusters * cs > strata_format::MAX_REFTABLE_BYTES {
            return Err(DiskError::Invalid(
                "image too large: the refcount table would exceed 8 MiB".into(),
            ));
        }
        let new_offset = self.next_free;
        self.next_free += clusters * cs;
        self.note_metadata(new_offset, clusters * cs, Structure::RefcountTable);
        let old_offset = self.reftable_offset;
        let old_clusters = (self.disk_capacity * 8).div_ceil(cs);
        let was_relocating = self.relocating;
        self.relocating = true;
        self.reftable.resize((clusters * cs / 8) as usize, 0);
        for c in 0..clusters {
            self.set_refcount(top, new_offset / cs + c, 1)?;
        }
        let bytes: Vec<u8> = self.reftable.iter().flat_map(|e| e.to_be_bytes()).collect();
        top.file.write_all_at(&bytes, new_offset)?;
        top.file.sync()?;
        let mut h = top
            .header()
            .ok_or_else(|| DiskError::Invalid("raw layer".into()))?;
        h.refcount_table_offset = new_offset;
        h.refcount_table_clusters = clusters as u32;
        write_header(top, &h)?;
        top.file.sync()?;
        self.reftable_offset = new_offset;
        self.disk_capacity = self.reftable.len() as u64;
        self.relocating = was_relocating;
        for c in 0..old_clusters {
            self.set_refcount(top, old_offset / cs + c, 0)?;
        }
        if let Some(g) = &self.guard {
            g.remove(old_offset, old_clusters * cs);
        }
        Ok(())
    }
}

/// The index of the last non-zero entry of a refcount block of `epb`
/// entries. Found from its last non-zero byte: a new image's block is
/// zeros past its first few clusters, and decoding its entries one by one
/// from the end was most of the work of opening a new volume.
fn last_nonzero_entry(block: &[u8], epb: u64, order: u32) -> Option<u64> {
    let byte = block.iter().rposition(|&b| b != 0)? as u64;
    let bits = 1u64 << order;
    let first = byte * 8 / bits;
    let last = ((byte + 1) * 8 - 1) / bits;
    (first..=last.min(epb.saturating_sub(1)))
        .rev()
        .find(|&i| refcount::get(block, i, order) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_nonzero_entry_is_found_at_every_refcount_width() {
        let cs = 512u64;
        for order in 0..=6u32 {
            let epb = refcount::entries_per_block(cs, order);
            assert_eq!(last_nonzero_entry(&vec![0; cs as usize], epb, order), None);
            for at in [0, 1, 7, epb / 2 + 3, epb - 2, epb - 1] {
                let mut block = vec![0u8; cs as usize];
                refcount::set(&mut block, 0, order, 1);
                refcount::set(&mut block, at, order, 1);
                assert_eq!(
                    last_nonzero_entry(&block, epb, order),
                    Some(at),
                    "order {order}, entry {at}"
                );
            }
        }
    }
}

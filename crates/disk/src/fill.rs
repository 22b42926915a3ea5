//! Filling a cluster allocated for a write: the write's bytes and, around
//! them, what the cluster reads as now (copy-on-write from the layer that
//! owns it). Both write paths fill this way: the unlocked one in
//! [`crate::cow`] and the writer's locked one.

use strata_format::entry::{subcluster_mask, SUBCLUSTERS};
use strata_format::L2Mapping;

use crate::chain::Chain;
use crate::error::Result;

impl Chain {
    /// Writes the new cluster at `host`: `data` at `in_cluster`, and around
    /// it what the guest cluster reads as now (from `old`'s owner).
    pub(crate) fn fill_cluster(
        &self,
        cluster: u64,
        cb: u32,
        in_cluster: u64,
        data: &[u8],
        old: L2Mapping,
        host: u64,
    ) -> Result<()> {
        let cs = 1u64 << cb;
        let start = cluster << cb;
        if in_cluster == 0 && data.len() as u64 == cs {
            return self.write_guest_data(data, host, start);
        }
        let mut content = vec![0u8; cs as usize];
        let readable = self.size.saturating_sub(start).min(cs) as usize;
        if !matches!(old, L2Mapping::Zero { .. }) {
            self.read_at(&mut content[..readable], start)?;
        }
        content[in_cluster as usize..in_cluster as usize + data.len()].copy_from_slice(data);
        self.write_guest_data(&content, host, start)
    }

    /// Mask of the top layer's subclusters that bytes
    /// `in_cluster..in_cluster + len` of one cluster touch (all bits for a
    /// standard top layer).
    pub(crate) fn subcluster_span(&self, in_cluster: u64, len: u64) -> u32 {
        let top = self.top();
        if !top.extended_l2() || len == 0 {
            return u32::MAX;
        }
        let sb = top.subcluster_bits();
        let first = (in_cluster >> sb) as u32;
        let last = ((in_cluster + len - 1) >> sb) as u32;
        subcluster_mask(first, last.min(SUBCLUSTERS - 1))
    }

    /// Writes `data` at `in_cluster` of guest `cluster` into host cluster
    /// `host` of an extended L2 top layer, and completes the subclusters it
    /// touches partially from what they read as now, unless the top layer
    /// already has them (`alloc`: their bytes in `host` are current and
    /// may be overwritten concurrently in place, so they are not
    /// rewritten). `whole` rewrites the whole cluster (replacing a
    /// compressed one). Returns the mask of subclusters to publish.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fill_subclusters(
        &self,
        cluster: u64,
        cb: u32,
        in_cluster: u64,
        data: &[u8],
        host: u64,
        alloc: u32,
        whole: bool,
    ) -> Result<u32> {
        let sb = self.top().subcluster_bits();
        let in_end = in_cluster + data.len() as u64;
        let (s0, s1) = if whole {
            (0, SUBCLUSTERS - 1)
        } else {
            ((in_cluster >> sb) as u32, ((in_end - 1) >> sb) as u32)
        };
        let owned = |s: u32| !whole && alloc & (1 << s) != 0;
        let start = if owned(s0) {
            in_cluster
        } else {
            u64::from(s0) << sb
        };
        let end = if owned(s1) {
            in_end
        } else {
            u64::from(s1 + 1) << sb
        };
        let mask = subcluster_mask(s0, s1);
        if start == in_cluster && end == in_end {
            self.write_guest_data(data, host + in_cluster, (cluster << cb) + in_cluster)?;
            return Ok(mask);
        }
        let base = cluster << cb;
        let mut content = vec![0u8; (end - start) as usize];
        // What the bytes around the write read as now; nothing past the
        // end of the disk (those stay zero).
        for (lo, hi) in [(start, in_cluster), (in_end, end)] {
            let hi_in_disk = hi.min(self.size.saturating_sub(base));
            if lo < hi_in_disk {
                let at = (lo - start) as usize;
                self.read_at(&mut content[at..at + (hi_in_disk - lo) as usize], base + lo)?;
            }
        }
        let at = (in_cluster - start) as usize;
        content[at..at + data.len()].copy_from_slice(data);
        self.write_guest_data(&content, host + start, base + start)?;
        Ok(mask)
    }
}

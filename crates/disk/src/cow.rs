//! Allocating writes with their data I/O outside the writer lock.
//!
//! The first write to a guest cluster the top layer does not own yet
//! copies the rest of the cluster from the chain (copy-on-write) and
//! writes a whole new cluster. Holding the writer lock for those two I/Os
//! made every other allocating write wait behind them (a 4 ms p99 at
//! queue depth 16). Now the lock is held only to allocate (and reserve the
//! guest cluster) and to publish the new L2 entry; the copy and the write
//! run unlocked, in parallel with other writes.
//!
//! Invariants:
//! - a guest cluster has at most one allocating write in flight (the
//!   writer's in-flight set); others wait on `Disk::alloc_done`;
//! - the L2 entry is published only after the data is in the file, so a
//!   crash never leaves an entry pointing at unwritten data (at worst a
//!   leaked cluster, repaired on the next open for writing);
//! - reads keep seeing the old mapping until the publish.

use parking_lot::Mutex;
use strata_format::L2Mapping;

use crate::disk::Disk;
use crate::error::Result;
use crate::writer::{AllocStep, Writer};

impl Disk {
    /// Writes `data` at guest `pos`, all inside one cluster of the top
    /// layer, allocating the cluster if the top layer does not own it.
    pub(crate) fn write_allocating(
        &self,
        writer: &Mutex<Writer>,
        data: &[u8],
        pos: u64,
    ) -> Result<()> {
        let top = self.top();
        let Some(cb) = top.cluster_bits() else {
            return writer.lock().write(self, data, pos);
        };
        let cluster = pos >> cb;
        let in_cluster = pos & ((1 << cb) - 1);
        debug_assert!(in_cluster + data.len() as u64 <= 1 << cb);
        let (host, old) = {
            let mut w = writer.lock();
            loop {
                match w.prepare_alloc(self, cluster)? {
                    AllocStep::InPlace(host) => {
                        drop(w);
                        return top.file.write_data(data, host + in_cluster);
                    }
                    AllocStep::Busy => self.alloc_done.wait(&mut w),
                    AllocStep::Fill { host, old } => break (host, old),
                }
            }
        };
        let filled = self.fill_cluster(cluster, cb, in_cluster, data, old, host);
        let mut w = writer.lock();
        let result = match filled {
            Ok(()) => w.publish_alloc(self, cluster, host),
            Err(e) => w.abort_alloc(self, cluster, host).and(Err(e)),
        };
        drop(w);
        self.alloc_done.notify_all();
        result
    }

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
        if in_cluster == 0 && data.len() as u64 == cs {
            return self.top().file.write_data(data, host);
        }
        let mut content = vec![0u8; cs as usize];
        let start = cluster << cb;
        let readable = self.size().saturating_sub(start).min(cs) as usize;
        if !matches!(old, L2Mapping::Zero { .. }) {
            self.read_at(&mut content[..readable], start)?;
        }
        content[in_cluster as usize..in_cluster as usize + data.len()].copy_from_slice(data);
        self.top().file.write_data(&content, host)
    }
}

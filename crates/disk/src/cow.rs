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
//!
//! With extended L2 entries (subclusters) there is no copy-on-write of the
//! cluster: the write goes into the top layer's host cluster for this guest
//! cluster (allocated on first use) and only the subclusters it touches
//! are marked allocated; the others keep reading from the layers below.
//! Only a subcluster the write covers partially is completed from what it
//! reads as now. The same invariants hold: the bitmap bits are published
//! after the subclusters' data is written, so an allocated subcluster never
//! points at unwritten bytes (a crash leaves at most unreferenced bytes in
//! a host cluster, or a leaked one).

use crate::disk::Disk;
use crate::error::Result;
use crate::writer::{AllocStep, Writer};
use parking_lot::Mutex;

impl Disk {
    /// Writes `data` at guest `pos`, all inside one cluster of the top
    /// layer, allocating the cluster if the top layer does not own it.
    /// Returns whether it allocated: the cluster may turn out to be the
    /// top layer's own once the writer lock is held, and then the write
    /// goes in place.
    pub(crate) fn write_allocating(
        &self,
        writer: &Mutex<Writer>,
        data: &[u8],
        pos: u64,
    ) -> Result<bool> {
        let top = self.top();
        let Some(cb) = top.cluster_bits() else {
            return writer.lock().write(&self.chain, data, pos).map(|()| false);
        };
        let cluster = pos >> cb;
        let in_cluster = pos & ((1 << cb) - 1);
        debug_assert!(in_cluster + data.len() as u64 <= 1 << cb);
        let need = self.chain.subcluster_span(in_cluster, data.len() as u64);
        let (host, old) = {
            let mut w = writer.lock();
            loop {
                match w.prepare_alloc(&self.chain, cluster, need)? {
                    AllocStep::InPlace(host) => {
                        drop(w);
                        return self
                            .chain
                            .write_guest_data(data, host + in_cluster, pos)
                            .map(|()| false);
                    }
                    AllocStep::Busy => self.alloc_done.wait(&mut w),
                    AllocStep::Fill { host, old } => break (host, old),
                    AllocStep::FillSub {
                        host,
                        fresh,
                        alloc,
                        whole,
                    } => {
                        drop(w);
                        let filled = self
                            .chain
                            .fill_subclusters(cluster, cb, in_cluster, data, host, alloc, whole);
                        let mut w = writer.lock();
                        let result = match filled {
                            Ok(mask) => w.publish_subclusters(&self.chain, cluster, host, mask),
                            Err(e) => w
                                .abort_subclusters(&self.chain, cluster, host, fresh)
                                .and(Err(e)),
                        };
                        drop(w);
                        self.alloc_done.notify_all();
                        return result.map(|()| true);
                    }
                }
            }
        };
        let filled = self
            .chain
            .fill_cluster(cluster, cb, in_cluster, data, old, host);
        let mut w = writer.lock();
        let result = match filled {
            Ok(()) => w.publish_alloc(&self.chain, cluster, host),
            Err(e) => w.abort_alloc(&self.chain, cluster, host).and(Err(e)),
        };
        drop(w);
        self.alloc_done.notify_all();
        result.map(|()| true)
    }
}

/// Clusters at most in one run of [`Disk::write_runs`] (8 MiB of 64 KiB
/// clusters): bounds how long other allocating writes to those clusters
/// wait for the run's publish.
const MAX_RUN_CLUSTERS: u64 = 128;

impl Disk {
    /// Writes `buf` at guest `pos` like [`Disk::write_at`], but gives each
    /// run of whole clusters the top layer does not map yet (no
    /// copy-on-write to do) one contiguous host run, written with one
    /// `pwrite` and then published cluster by cluster (see
    /// [`Writer::prepare_run`]). Partial clusters, clusters the top layer
    /// already maps, and top layers with extended L2 entries or raw ones
    /// take the ordinary path.
    ///
    /// For bulk copies into a new image (`img convert`): a 2 MiB step is
    /// one system call instead of 32.
    pub(crate) fn write_runs(&self, buf: &[u8], pos: u64) -> Result<()> {
        self.check_range(pos, buf.len() as u64)?;
        let top = self.top();
        let Some(cb) = top.cluster_bits() else {
            return self.write_at(buf, pos);
        };
        if top.extended_l2() {
            return self.write_at(buf, pos);
        }
        let writer = self.writer()?;
        let cs = 1u64 << cb;
        let end = pos + buf.len() as u64;
        let mut at = pos;
        while at < end {
            let whole = if at.is_multiple_of(cs) {
                (end - at) >> cb
            } else {
                0
            };
            let (host, count) = if whole == 0 {
                (0, 0)
            } else {
                writer
                    .lock()
                    .prepare_run(&self.chain, at >> cb, whole.min(MAX_RUN_CLUSTERS))?
            };
            let next = if count == 0 {
                // One cluster (or its partial head or tail) the usual way.
                let next = end.min(((at >> cb) + 1) << cb);
                self.write_at(&buf[(at - pos) as usize..(next - pos) as usize], at)?;
                next
            } else {
                let next = at + (count << cb);
                let data = &buf[(at - pos) as usize..(next - pos) as usize];
                self.publish_run(
                    writer,
                    self.chain.write_guest_data(data, host, at),
                    at >> cb,
                    count,
                    host,
                )?;
                next
            };
            at = next;
        }
        Ok(())
    }

    /// Publishes the `count` clusters from guest cluster `first` that
    /// [`Writer::prepare_run`] gave the host run at `host`, once their data
    /// is written (`written`); if the write failed, frees the run instead
    /// and returns its error.
    fn publish_run(
        &self,
        writer: &Mutex<Writer>,
        written: Result<()>,
        first: u64,
        count: u64,
        host: u64,
    ) -> Result<()> {
        let cs = 1u64 << self.top().cluster_bits().unwrap_or(16);
        let mut w = writer.lock();
        let mut error = written.err();
        for i in 0..count {
            let (cluster, at) = (first + i, host + i * cs);
            // Every cluster of the run leaves the in-flight set, even after
            // an error, so no writer waits for it forever.
            let step = match error {
                None => w.publish_alloc(&self.chain, cluster, at),
                Some(_) => w.abort_alloc(&self.chain, cluster, at),
            };
            if let Err(e) = step {
                error.get_or_insert(e);
            }
        }
        drop(w);
        self.alloc_done.notify_all();
        error.map_or(Ok(()), Err)
    }
}

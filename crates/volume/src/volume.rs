//! A live volume: the open disk behind an I/O gate, so its top layer can be
//! switched (online snapshot, grow) while clients keep reading and writing.

use std::path::Path;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use strata_block::{BlockDevice, BlockStatus};
use strata_disk::{Disk, PreparedTop};

use crate::failpoint::failpoint;
use crate::metrics::{Op, VolumeGauges, VolumeStats};

/// Write-back rounds before a pause at most. Under write load each round
/// writes back what was written while the one before ran, so the sync
/// inside the pause only has the last round's writes left.
const FLUSH_ROUNDS: usize = 4;
/// A write-back round this quick leaves little for the pause: stop there.
const FLUSH_QUICK: Duration = Duration::from_millis(10);

/// A volume being served.
///
/// Every request holds the gate shared for its duration; a top switch
/// holds it exclusively. The switch therefore waits only for requests
/// already in flight (which complete normally, never fail), and requests
/// that arrive meanwhile wait for the switch. parking_lot's lock is fair:
/// a waiting switch stops new requests from overtaking it.
#[derive(Debug)]
pub struct Volume {
    name: String,
    disk: RwLock<Disk>,
    stats: VolumeStats,
}

impl Volume {
    /// Wraps an open disk.
    pub fn new(name: &str, disk: Disk) -> Volume {
        Volume {
            name: name.to_string(),
            disk: RwLock::new(disk),
            stats: VolumeStats::default(),
        }
    }

    /// The volume name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// I/O statistics.
    pub fn stats(&self) -> &VolumeStats {
        &self.stats
    }

    /// The top layer's cluster size and whether it has extended L2 entries.
    pub fn top_format(&self) -> (Option<u64>, bool) {
        let disk = self.disk.read();
        (disk.top().cluster_size(), disk.top().extended_l2())
    }

    /// Layers in the chain.
    pub fn chain_length(&self) -> u32 {
        self.disk.read().depth()
    }

    /// Gauges for `/metrics`.
    pub fn gauges(&self) -> VolumeGauges {
        let disk = self.disk.read();
        let cache = disk.cache_stats();
        VolumeGauges {
            name: self.name.clone(),
            chain_length: disk.depth(),
            size: disk.size(),
            cache_hits: cache.hits,
            cache_misses: cache.misses,
            frozen_layers: disk.frozen_pending().0,
            writes: disk.write_times(),
        }
    }

    /// Bytes of the chain index a new top copies (`None`: no stored
    /// index, so there is nothing to copy ahead).
    pub fn index_bytes(&self) -> Option<u64> {
        self.disk.read().index_bytes()
    }

    /// Prepares a new top at `path` over the current one while I/O goes
    /// on (see [`Disk::prepare_top`]), to be pushed later.
    pub fn prepare_top(&self, path: &Path, backing_name: &str) -> strata_disk::Result<PreparedTop> {
        self.disk.read().prepare_top(path, backing_name, None)
    }

    /// Whether a top prepared earlier can still be pushed by patching it.
    pub fn prepared_is_current(&self, top: &PreparedTop) -> bool {
        self.disk.read().prepared_is_current(top)
    }

    /// Copies up to `max_sectors` more 4 KiB sectors of the index a
    /// snapshot's new top still reads from the layer below (see
    /// [`Disk::copy_index_rest`]), while I/O goes on; returns how many are
    /// left.
    pub fn copy_index_rest(&self, max_sectors: u64) -> strata_disk::Result<u64> {
        self.disk.read().copy_index_rest(max_sectors)
    }

    /// Switches to a new top layer at `path` (see [`Disk::prepare_top`]
    /// and [`Disk::push_top`]): the file is made while I/O goes on (or was
    /// made earlier: `ready`, a top prepared at `path` and still current),
    /// then switched to with I/O held back; `commit` runs once the new
    /// file can be named by the catalog and before anything is written to
    /// it. The new top copies its index from the frozen layer afterwards
    /// (see [`Volume::copy_index_rest`]). Returns the I/O pause.
    pub fn push_top(
        &self,
        path: &Path,
        backing_name: &str,
        size: Option<u64>,
        snapshot: bool,
        ready: Option<PreparedTop>,
        commit: impl FnOnce() -> strata_disk::Result<()>,
    ) -> strata_disk::Result<Duration> {
        // The part of the work that grows with the disk happens outside the
        // pause: the file is made here (or was made earlier: `ready`), and
        // the index the current top may still read from below is copied
        // whole now, while I/O goes on (the push freezes only whole tops).
        let started = Instant::now();
        let (prepared, had_standby) = match ready {
            Some(top) if top.path() == path => (top, true),
            _ => (
                self.disk.read().prepare_top(path, backing_name, size)?,
                false,
            ),
        };
        let prepared_at = started.elapsed();
        failpoint("switch-after-prepare");
        self.disk.read().complete_index_copy()?;
        let copied_at = started.elapsed();
        // No write-back first: the push freezes the old top without
        // syncing it (see `Disk::push_top`), so the pause does not grow
        // with what was written since the last flush.
        let pause = self.with_io_held(false, |disk| disk.push_top(prepared, commit).map(|_| ()))?;
        self.stats.record_pause(pause, snapshot);
        // Where a switch's call goes, for whoever tunes it.
        tracing::debug!(
            volume = %self.name,
            had_standby,
            prepare_ms = prepared_at.as_secs_f64() * 1e3,
            index_copy_ms = (copied_at - prepared_at).as_secs_f64() * 1e3,
            pause_ms = pause.as_secs_f64() * 1e3,
            "switched top"
        );
        Ok(pause)
    }

    /// Splices a merged layer in place of layers `first..=last` (see
    /// [`Disk::replace_layers`]) with I/O held back. Returns the pause.
    pub fn replace_layers(
        &self,
        first: u32,
        last: u32,
        merged: &Path,
        expected_last: &Path,
    ) -> strata_disk::Result<Duration> {
        let pause = self.with_io_held(true, |disk| {
            disk.replace_layers(first, last, merged, expected_last)
        })?;
        self.stats.compaction.record_pause(pause);
        Ok(pause)
    }

    /// Runs a change of the chain with the I/O gate held exclusively;
    /// returns how long I/O was held back. With `write_back_first`, for a
    /// change that syncs the top inside the pause (a compaction's splice
    /// closes it), what is already written is written back first while
    /// I/O still flows, so that sync only covers the last moment's writes.
    fn with_io_held(
        &self,
        write_back_first: bool,
        change: impl FnOnce(&mut Disk) -> strata_disk::Result<()>,
    ) -> strata_disk::Result<Duration> {
        for _ in 0..if write_back_first { FLUSH_ROUNDS } else { 0 } {
            let round = Instant::now();
            self.disk.read().flush()?;
            if round.elapsed() < FLUSH_QUICK {
                break;
            }
        }
        // The pause starts when the gate is asked for, not when it is
        // granted: from then on new requests wait, while the ones in flight
        // (and any holder of the gate, such as the keeper's index copy)
        // finish.
        let paused = Instant::now();
        let mut disk = self.disk.write();
        change(&mut disk)?;
        Ok(paused.elapsed())
    }

    /// Makes the layers earlier snapshots froze durable and clean on disk
    /// (see [`Disk::sync_frozen`]) while I/O goes on; returns how many.
    pub fn sync_frozen(&self) -> strata_disk::Result<usize> {
        self.disk.read().sync_frozen()
    }

    /// Frozen layers not yet durable, and the age of the oldest.
    pub fn frozen_pending(&self) -> (usize, Option<Duration>) {
        self.disk.read().frozen_pending()
    }

    /// Files of the layers frozen and not yet durable.
    pub fn frozen_paths(&self) -> Vec<std::path::PathBuf> {
        self.disk.read().frozen_paths()
    }

    /// Closes without syncing (see [`Disk::close_discarding`]): for a
    /// deleted volume whose top and frozen layers are being removed.
    pub fn close_discarding(self) {
        self.disk.into_inner().close_discarding();
    }

    /// Flushes, stores the index and marks the top clean.
    pub fn close(self) -> strata_disk::Result<()> {
        self.disk.into_inner().close()
    }

    /// Runs one request under the gate and records it.
    fn io<T>(
        &self,
        op: Op,
        bytes: u64,
        f: impl FnOnce(&Disk) -> strata_disk::Result<T>,
    ) -> strata_disk::Result<T> {
        let disk = self.disk.read();
        let started = Instant::now();
        let result = f(&disk);
        drop(disk);
        self.stats
            .record(op, bytes, started.elapsed(), result.is_ok());
        result
    }
}

impl BlockDevice for Volume {
    fn size(&self) -> u64 {
        self.disk.read().size()
    }

    fn is_writable(&self) -> bool {
        self.disk.read().is_writable()
    }

    fn unit_size(&self) -> u64 {
        self.disk.read().unit_size()
    }

    fn zero_cluster_bits(&self) -> Option<u32> {
        BlockDevice::zero_cluster_bits(&*self.disk.read())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> strata_block::Result<()> {
        let len = buf.len() as u64;
        Ok(self.io(Op::Read, len, |d| d.read_at(buf, offset))?)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> strata_block::Result<()> {
        Ok(self.io(Op::Write, buf.len() as u64, |d| d.write_at(buf, offset))?)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> strata_block::Result<()> {
        Ok(self.io(Op::Write, len, |d| d.write_zeroes(offset, len))?)
    }

    fn discard(&self, offset: u64, len: u64) -> strata_block::Result<()> {
        Ok(self.io(Op::Discard, 0, |d| d.discard(offset, len))?)
    }

    fn flush(&self) -> strata_block::Result<()> {
        Ok(self.io(Op::Flush, 0, |d| d.flush())?)
    }

    fn reads_as_zero(&self, offset: u64, len: u64) -> strata_block::Result<bool> {
        Ok(self.disk.read().reads_as_zero(offset, len)?)
    }

    fn block_status(
        &self,
        offset: u64,
        len: u64,
        max_runs: usize,
    ) -> strata_block::Result<Vec<BlockStatus>> {
        Ok(self.disk.read().block_status(offset, len, max_runs)?)
    }
}

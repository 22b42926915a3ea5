//! The block device interface: what a protocol front end (the NBD server)
//! needs from whatever it serves.
//!
//! [`Disk`] implements it directly. Services wrap a disk to add behaviour
//! without the front end knowing: the volume service swaps the top layer
//! under live I/O for online snapshots, a mirror fetches chunks on first
//! read. Like nbdkit's plugins and filters, the protocol core stays small.

use crate::disk::{BlockStatus, Disk};
use crate::error::Result;

/// Requests of one connection run at once on a local device (see
/// [`BlockDevice::parallel_requests`]).
pub const DEFAULT_PARALLEL_REQUESTS: usize = 16;

/// A byte-addressed device of fixed size (for the life of one session)
/// that can be read, written and asked about its allocation.
///
/// Every method may be called from many threads at once; implementations
/// decide their own locking.
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    /// Size in bytes.
    fn size(&self) -> u64;

    /// Whether writes are possible at all.
    fn is_writable(&self) -> bool;

    /// Allocation granularity: allocation state is uniform within each
    /// aligned unit of this many bytes.
    fn unit_size(&self) -> u64;

    /// log2 of the cluster size when zeroing whole clusters is a metadata
    /// update (qcow2 v3 zero clusters); `None` if zeroing costs a write.
    fn zero_cluster_bits(&self) -> Option<u32> {
        None
    }

    /// How many requests of one client connection are worth running at
    /// once. A device served from the page cache is CPU-bound, and more
    /// threads than this only add memory and preemption; a device that
    /// waits on the network (a mirror fetching chunks) wants more.
    fn parallel_requests(&self) -> usize {
        DEFAULT_PARALLEL_REQUESTS
    }

    /// Fills `buf` from `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;

    /// Writes `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()>;

    /// Makes `len` bytes at `offset` read as zeros.
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()>;

    /// Releases `len` bytes at `offset`; they read as zeros afterwards.
    fn discard(&self, offset: u64, len: u64) -> Result<()>;

    /// Makes every completed write durable.
    fn flush(&self) -> Result<()>;

    /// Whether the range reads as zeros, from allocation metadata only.
    /// `false` is always a truthful answer.
    fn reads_as_zero(&self, offset: u64, len: u64) -> Result<bool>;

    /// Allocation runs of the range, at most `max_runs` of them.
    fn block_status(&self, offset: u64, len: u64, max_runs: usize) -> Result<Vec<BlockStatus>>;
}

impl BlockDevice for Disk {
    fn size(&self) -> u64 {
        Disk::size(self)
    }

    fn is_writable(&self) -> bool {
        Disk::is_writable(self)
    }

    fn unit_size(&self) -> u64 {
        Disk::unit_size(self)
    }

    fn zero_cluster_bits(&self) -> Option<u32> {
        self.top()
            .header()
            .filter(|h| h.version >= 3)
            // With extended L2 entries a subcluster zeroes by metadata alone.
            .map(|h| {
                if h.extended_l2() {
                    h.cluster_bits - strata_format::entry::SUBCLUSTERS.trailing_zeros()
                } else {
                    h.cluster_bits
                }
            })
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        Disk::read_at(self, buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        Disk::write_at(self, buf, offset)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        Disk::write_zeroes(self, offset, len)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        Disk::discard(self, offset, len)
    }

    fn flush(&self) -> Result<()> {
        Disk::flush(self)
    }

    fn reads_as_zero(&self, offset: u64, len: u64) -> Result<bool> {
        Disk::reads_as_zero(self, offset, len)
    }

    fn block_status(&self, offset: u64, len: u64, max_runs: usize) -> Result<Vec<BlockStatus>> {
        Disk::block_status(self, offset, len, max_runs)
    }
}

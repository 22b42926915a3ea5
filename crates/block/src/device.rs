//! The block device interface: what a protocol front end (the NBD server)
//! needs from whatever it serves.
//!
//! The engine's `Disk` implements it directly. Services wrap a disk to add
//! behaviour without the front end knowing: the volume service swaps the
//! top layer under live I/O for online snapshots, a mirror fetches chunks
//! on first read. Like nbdkit's plugins and filters, the protocol core
//! stays small.

use std::sync::Arc;

use crate::error::Result;

/// Requests of one connection run at once on a local device (see
/// [`BlockDevice::parallel_requests`]).
pub const DEFAULT_PARALLEL_REQUESTS: usize = 16;

/// Allocation state of a run of guest bytes, as NBD's `base:allocation`
/// and `qemu-img map` describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BlockStatus {
    /// Bytes in the run.
    pub length: u64,
    /// No layer stores data for it (unowned, or a zero cluster).
    pub hole: bool,
    /// Reads as zeros.
    pub zero: bool,
}

/// A byte-addressed device of fixed size (for the life of one session)
/// that can be read, written and asked about its allocation.
///
/// Every method may be called from many threads at once; implementations
/// decide their own locking. A request that reaches past [`size`] fails
/// with [`ErrorKind::OutOfRange`] (or [`ErrorKind::Invalid`]) and changes
/// nothing; a write to a device that is not writable fails with
/// [`ErrorKind::ReadOnly`]. `strata_block::conformance` checks these
/// promises for any implementation.
///
/// [`size`]: BlockDevice::size
/// [`ErrorKind::OutOfRange`]: crate::ErrorKind::OutOfRange
/// [`ErrorKind::Invalid`]: crate::ErrorKind::Invalid
/// [`ErrorKind::ReadOnly`]: crate::ErrorKind::ReadOnly
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

    /// Releases `len` bytes at `offset`: the device may stop storing
    /// them. Advisory, like NBD's TRIM: afterwards each byte reads as
    /// zero or as it did before, never as anything else (older data from
    /// a layer below, say). Use [`write_zeroes`](BlockDevice::write_zeroes)
    /// for bytes that must read as zeros.
    fn discard(&self, offset: u64, len: u64) -> Result<()>;

    /// Makes every completed write durable.
    fn flush(&self) -> Result<()>;

    /// Whether the range reads as zeros, from allocation metadata only.
    /// `false` is always a truthful answer; `true` must be true.
    fn reads_as_zero(&self, offset: u64, len: u64) -> Result<bool>;

    /// Allocation runs of the range, in order from `offset`, at most
    /// `max_runs` of them (at least one for a non-empty range). They
    /// cover the whole range unless there would be more than `max_runs`;
    /// then the last one ends early and the caller asks again from there.
    fn block_status(&self, offset: u64, len: u64, max_runs: usize) -> Result<Vec<BlockStatus>>;
}

/// Forwards every method, so a shared device can be wrapped (by
/// [`FaultyDevice`](crate::FaultyDevice), say) and served as it is.
macro_rules! forward {
    ($pointer:ty) => {
        impl BlockDevice for $pointer {
            fn size(&self) -> u64 {
                (**self).size()
            }
            fn is_writable(&self) -> bool {
                (**self).is_writable()
            }
            fn unit_size(&self) -> u64 {
                (**self).unit_size()
            }
            fn zero_cluster_bits(&self) -> Option<u32> {
                (**self).zero_cluster_bits()
            }
            fn parallel_requests(&self) -> usize {
                (**self).parallel_requests()
            }
            fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
                (**self).read_at(buf, offset)
            }
            fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
                (**self).write_at(buf, offset)
            }
            fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
                (**self).write_zeroes(offset, len)
            }
            fn discard(&self, offset: u64, len: u64) -> Result<()> {
                (**self).discard(offset, len)
            }
            fn flush(&self) -> Result<()> {
                (**self).flush()
            }
            fn reads_as_zero(&self, offset: u64, len: u64) -> Result<bool> {
                (**self).reads_as_zero(offset, len)
            }
            fn block_status(
                &self,
                offset: u64,
                len: u64,
                max_runs: usize,
            ) -> Result<Vec<BlockStatus>> {
                (**self).block_status(offset, len, max_runs)
            }
        }
    };
}

forward!(Box<dyn BlockDevice>);
forward!(Arc<dyn BlockDevice>);

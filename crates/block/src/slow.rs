//! [`SlowDevice`]: a device that answers late, so that what serves it
//! can be tested on storage that stalls (a network disk, a mirror waiting
//! on its repository): requests must still complete, and others must not
//! wait behind them longer than they have to.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::device::{BlockDevice, BlockStatus};
use crate::error::Result;
use crate::fault::Operation;

/// A device that sleeps before each request of the chosen operations,
/// then passes it to the device it wraps.
#[derive(Debug)]
pub struct SlowDevice<D> {
    inner: D,
    delays: [Duration; Operation::ALL.len()],
    delayed: AtomicU64,
}

impl<D: BlockDevice> SlowDevice<D> {
    /// Wraps `inner`, with no delay yet.
    pub fn new(inner: D) -> Self {
        SlowDevice {
            inner,
            delays: [Duration::ZERO; Operation::ALL.len()],
            delayed: AtomicU64::new(0),
        }
    }

    /// Delays every request of `operation` by `delay`.
    pub fn delay(mut self, operation: Operation, delay: Duration) -> Self {
        self.delays[operation as usize] = delay;
        self
    }

    /// Delays every request of every operation by `delay`.
    pub fn delay_all(mut self, delay: Duration) -> Self {
        self.delays = [delay; Operation::ALL.len()];
        self
    }

    /// How many requests have been delayed.
    pub fn delayed(&self) -> u64 {
        self.delayed.load(Ordering::Relaxed)
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn wait(&self, operation: Operation) {
        let delay = self.delays[operation as usize];
        if !delay.is_zero() {
            self.delayed.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(delay);
        }
    }
}

impl<D: BlockDevice> BlockDevice for SlowDevice<D> {
    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn is_writable(&self) -> bool {
        self.inner.is_writable()
    }

    fn unit_size(&self) -> u64 {
        self.inner.unit_size()
    }

    fn zero_cluster_bits(&self) -> Option<u32> {
        self.inner.zero_cluster_bits()
    }

    fn parallel_requests(&self) -> usize {
        self.inner.parallel_requests()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.wait(Operation::Read);
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.wait(Operation::Write);
        self.inner.write_at(buf, offset)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.wait(Operation::WriteZeroes);
        self.inner.write_zeroes(offset, len)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.wait(Operation::Discard);
        self.inner.discard(offset, len)
    }

    fn flush(&self) -> Result<()> {
        self.wait(Operation::Flush);
        self.inner.flush()
    }

    fn reads_as_zero(&self, offset: u64, len: u64) -> Result<bool> {
        self.wait(Operation::ReadsAsZero);
        self.inner.reads_as_zero(offset, len)
    }

    fn block_status(&self, offset: u64, len: u64, max_runs: usize) -> Result<Vec<BlockStatus>> {
        self.wait(Operation::BlockStatus);
        self.inner.block_status(offset, len, max_runs)
    }
}

//! [`SlowDevice`]: a device that answers late, so that what serves it
//! can be tested on storage that stalls (a network disk, a mirror waiting
//! on its repository): requests must still complete, and others must not
//! wait behind them longer than they have to.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    in_flight: AtomicUsize,
    peak_in_flight: AtomicUsize,
}

impl<D: BlockDevice> SlowDevice<D> {
    /// Wraps `inner`, with no delay yet.
    pub fn new(inner: D) -> Self {
        SlowDevice {
            inner,
            delays: [Duration::ZERO; Operation::ALL.len()],
            delayed: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            peak_in_flight: AtomicUsize::new(0),
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

    /// Most requests that were inside the device at once: more than one
    /// shows that whatever serves it runs requests in parallel.
    pub fn peak_in_flight(&self) -> usize {
        self.peak_in_flight.load(Ordering::Relaxed)
    }

    /// Runs one request: waits its delay, then passes it on, counting it
    /// as in flight throughout.
    fn run<T>(&self, operation: Operation, request: impl FnOnce(&D) -> T) -> T {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak_in_flight.fetch_max(now, Ordering::SeqCst);
        let delay = self.delays[operation as usize];
        if !delay.is_zero() {
            self.delayed.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(delay);
        }
        let result = request(&self.inner);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        result
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
        self.run(Operation::Read, |d| d.read_at(buf, offset))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.run(Operation::Write, |d| d.write_at(buf, offset))
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.run(Operation::WriteZeroes, |d| d.write_zeroes(offset, len))
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.run(Operation::Discard, |d| d.discard(offset, len))
    }

    fn flush(&self) -> Result<()> {
        self.run(Operation::Flush, |d| d.flush())
    }

    fn reads_as_zero(&self, offset: u64, len: u64) -> Result<bool> {
        self.run(Operation::ReadsAsZero, |d| d.reads_as_zero(offset, len))
    }

    fn block_status(&self, offset: u64, len: u64, max_runs: usize) -> Result<Vec<BlockStatus>> {
        self.run(Operation::BlockStatus, |d| {
            d.block_status(offset, len, max_runs)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::conformance::tests::{Flaw, MemoryDevice};
    use crate::conformance::{run, Subject};

    #[test]
    fn a_slow_device_delays_the_chosen_operations_and_keeps_the_contract() {
        let device = SlowDevice::new(MemoryDevice::new(Flaw::None, true))
            .delay(Operation::Flush, Duration::from_millis(50));
        let started = Instant::now();
        device.flush().unwrap();
        assert!(started.elapsed() >= Duration::from_millis(50));
        device.write_at(&[1, 2, 3], 10).unwrap();
        assert_eq!(device.delayed(), 1);
        run(&mut || {
            Subject::zeroed(Box::new(
                SlowDevice::new(MemoryDevice::new(Flaw::None, true))
                    .delay(Operation::Flush, Duration::from_millis(1)),
            ))
        })
        .assert_conforms();
    }

    #[test]
    fn requests_inside_a_slow_device_at_once_are_counted() {
        let device = SlowDevice::new(MemoryDevice::new(Flaw::None, true))
            .delay_all(Duration::from_millis(200));
        std::thread::scope(|scope| {
            for i in 0..4 {
                let device = &device;
                scope.spawn(move || device.read_at(&mut [0; 8], i * 8).unwrap());
            }
        });
        assert_eq!(device.delayed(), 4);
        assert!(device.peak_in_flight() >= 2, "{}", device.peak_in_flight());
    }
}

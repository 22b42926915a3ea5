//! [`FaultyDevice`]: a device that fails chosen requests, so that what
//! serves a device (the NBD server, a mirror's client) can be tested on
//! the errors real storage gives: a bad sector at one offset, a disk that
//! fills after so many writes, a flush that fails once.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::device::{BlockDevice, BlockStatus};
use crate::error::{BlockError, ErrorKind, Result};

/// A device operation, as faults and delays choose them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// [`BlockDevice::read_at`].
    Read,
    /// [`BlockDevice::write_at`].
    Write,
    /// [`BlockDevice::write_zeroes`].
    WriteZeroes,
    /// [`BlockDevice::discard`].
    Discard,
    /// [`BlockDevice::flush`].
    Flush,
    /// [`BlockDevice::reads_as_zero`].
    ReadsAsZero,
    /// [`BlockDevice::block_status`].
    BlockStatus,
}

impl Operation {
    /// Every operation that can fail.
    pub const ALL: [Operation; 7] = [
        Operation::Read,
        Operation::Write,
        Operation::WriteZeroes,
        Operation::Discard,
        Operation::Flush,
        Operation::ReadsAsZero,
        Operation::BlockStatus,
    ];

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// One rule of a [`FaultyDevice`]: which requests fail, and how.
///
/// A request matches when its operation is one of the fault's and, if the
/// fault has a range, its bytes overlap that range (a flush has no bytes
/// and matches only faults without a range). The first [`after`] matching
/// requests pass; then up to [`times`] of them fail (every one, if not
/// limited) with the fault's [`ErrorKind`].
///
/// [`after`]: Fault::after
/// [`times`]: Fault::times
#[derive(Debug, Clone)]
pub struct Fault {
    operations: u8,
    range: Option<Range<u64>>,
    after: u64,
    times: Option<u64>,
    kind: ErrorKind,
    matched: u64,
    fired: u64,
}

impl Fault {
    /// Fails every `operation` with an I/O error.
    pub fn on(operation: Operation) -> Fault {
        Fault {
            operations: operation.bit(),
            range: None,
            after: 0,
            times: None,
            kind: ErrorKind::Io,
            matched: 0,
            fired: 0,
        }
    }

    /// Fails every operation with an I/O error.
    pub fn any() -> Fault {
        let mut fault = Fault::on(Operation::Read);
        fault.operations = Operation::ALL.iter().fold(0, |bits, op| bits | op.bit());
        fault
    }

    /// Fails `operation` too.
    pub fn also(mut self, operation: Operation) -> Fault {
        self.operations |= operation.bit();
        self
    }

    /// Fails only requests whose bytes overlap `range`.
    pub fn within(mut self, range: Range<u64>) -> Fault {
        self.range = Some(range);
        self
    }

    /// Lets the first `calls` matching requests pass.
    pub fn after(mut self, calls: u64) -> Fault {
        self.after = calls;
        self
    }

    /// Fails at most `count` requests, then lets them pass again.
    pub fn times(mut self, count: u64) -> Fault {
        self.times = Some(count);
        self
    }

    /// Fails with `kind` instead of an I/O error.
    pub fn error(mut self, kind: ErrorKind) -> Fault {
        self.kind = kind;
        self
    }

    /// Counts a request against this fault; `true` if it must fail.
    fn strikes(&mut self, operation: Operation, bytes: Option<Range<u64>>) -> bool {
        if self.operations & operation.bit() == 0 {
            return false;
        }
        let overlaps = match (&self.range, bytes) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(range), Some(bytes)) => {
                // An empty request overlaps a range that holds its offset.
                bytes.start < range.end && range.start < bytes.end.max(bytes.start + 1)
            }
        };
        if !overlaps {
            return false;
        }
        self.matched += 1;
        if self.matched <= self.after || self.times.is_some_and(|n| self.fired >= n) {
            return false;
        }
        self.fired += 1;
        true
    }
}

/// A device that fails the requests its [`Fault`]s choose and passes the
/// rest to the device it wraps. Faults can be added and cleared while the
/// device is being served.
#[derive(Debug)]
pub struct FaultyDevice<D> {
    inner: D,
    faults: Mutex<Vec<Fault>>,
    failures: AtomicU64,
}

impl<D: BlockDevice> FaultyDevice<D> {
    /// Wraps `inner`, with no fault yet.
    pub fn new(inner: D) -> Self {
        FaultyDevice {
            inner,
            faults: Mutex::new(Vec::new()),
            failures: AtomicU64::new(0),
        }
    }

    /// Wraps `inner` with `fault` in place.
    pub fn with(inner: D, fault: Fault) -> Self {
        let device = FaultyDevice::new(inner);
        device.inject(fault);
        device
    }

    /// Adds a fault; it counts requests from now on.
    pub fn inject(&self, fault: Fault) {
        self.lock().push(fault);
    }

    /// Removes every fault: all requests pass from now on.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// How many requests this device has failed.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Fault>> {
        // A panic elsewhere while holding the lock leaves the list whole.
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fails the request if a fault says so. Every fault counts the
    /// request, whichever fails it.
    fn check(&self, operation: Operation, offset: u64, len: Option<u64>) -> Result<()> {
        let bytes = len.map(|len| offset..offset.saturating_add(len));
        let mut kind = None;
        for fault in self.lock().iter_mut() {
            if fault.strikes(operation, bytes.clone()) && kind.is_none() {
                kind = Some(fault.kind);
            }
        }
        let Some(kind) = kind else {
            return Ok(());
        };
        self.failures.fetch_add(1, Ordering::Relaxed);
        let what = match len {
            Some(len) => format!("{operation:?} of {len} bytes at offset {offset}"),
            None => format!("{operation:?}"),
        };
        Err(BlockError::new(
            kind,
            format!("injected fault: {what} fails ({kind})"),
        ))
    }
}

impl<D: BlockDevice> BlockDevice for FaultyDevice<D> {
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
        self.check(Operation::Read, offset, Some(buf.len() as u64))?;
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check(Operation::Write, offset, Some(buf.len() as u64))?;
        self.inner.write_at(buf, offset)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.check(Operation::WriteZeroes, offset, Some(len))?;
        self.inner.write_zeroes(offset, len)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check(Operation::Discard, offset, Some(len))?;
        self.inner.discard(offset, len)
    }

    fn flush(&self) -> Result<()> {
        self.check(Operation::Flush, 0, None)?;
        self.inner.flush()
    }

    fn reads_as_zero(&self, offset: u64, len: u64) -> Result<bool> {
        self.check(Operation::ReadsAsZero, offset, Some(len))?;
        self.inner.reads_as_zero(offset, len)
    }

    fn block_status(&self, offset: u64, len: u64, max_runs: usize) -> Result<Vec<BlockStatus>> {
        self.check(Operation::BlockStatus, offset, Some(len))?;
        self.inner.block_status(offset, len, max_runs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::tests::{Flaw, MemoryDevice, UNIT};
    use crate::conformance::{run, Outcome, Subject};

    fn device() -> FaultyDevice<MemoryDevice> {
        FaultyDevice::new(MemoryDevice::new(Flaw::None, true))
    }

    #[test]
    fn a_fault_fails_only_the_requests_it_chooses() {
        let device = device();
        device.inject(
            Fault::on(Operation::Read)
                .within(UNIT..2 * UNIT)
                .after(1)
                .times(2),
        );
        let mut buf = [0u8; 100];
        // Outside the range, and the first match: they pass.
        device.read_at(&mut buf, 0).unwrap();
        device.read_at(&mut buf, UNIT).unwrap();
        // Overlapping either end: they fail, twice.
        let error = device.read_at(&mut buf, UNIT - 50).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Io);
        assert!(error.to_string().contains("injected fault"), "{error}");
        device.read_at(&mut buf, 2 * UNIT - 1).unwrap_err();
        // Then the fault is spent; writes were never chosen.
        device.read_at(&mut buf, UNIT).unwrap();
        device.write_at(&buf, UNIT).unwrap();
        assert_eq!(device.failures(), 2);
    }

    #[test]
    fn a_fault_fails_with_the_chosen_kind_and_clear_removes_it() {
        let device = device();
        device.inject(Fault::on(Operation::Write).error(ErrorKind::NoSpace));
        device.inject(Fault::on(Operation::Flush).within(0..UNIT));
        let error = device.write_at(&[1], 5).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::NoSpace);
        // A flush has no bytes: a fault with a range never chooses it.
        device.flush().unwrap();
        device.inject(Fault::any().times(1));
        device.flush().unwrap_err();
        device.clear();
        device.write_at(&[1], 5).unwrap();
        assert_eq!(device.failures(), 2);
    }

    #[test]
    fn the_suite_passes_a_faultless_wrapper_and_fails_one_whose_discard_fails() {
        run(&mut || Subject::zeroed(Box::new(device()))).assert_conforms();
        let report = run(&mut || {
            Subject::zeroed(Box::new(FaultyDevice::with(
                MemoryDevice::new(Flaw::None, true),
                Fault::on(Operation::Discard),
            )))
        });
        assert!(
            matches!(
                report.outcome("discard reads as zeros or as before, nothing else"),
                Some(Outcome::Failed(_))
            ),
            "{report}"
        );
    }
}

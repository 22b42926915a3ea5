//! One test suite for every [`BlockDevice`]: it checks the promises of
//! the trait, so that whatever serves a device (the NBD server) can rely
//! on them whichever device it is.
//!
//! A device's tests hand [`run`] (or [`check_device`]) a function that
//! makes a fresh device and says what it holds before anything is
//! written ([`Subject`]). Each check gets a device of its own, and the
//! suite keeps a model of the bytes the device must hold: after every
//! check it reads the whole device back and compares, so a write that
//! lands in the wrong place fails as surely as one that is lost.
//!
//! What is checked (names as in the [`Report`]):
//! - the size is positive, at least four allocation units, and stable;
//! - reads before any write return the initial content (zeros where the
//!   device was never written);
//! - writes read back, aligned or not, within a unit or across several;
//! - `write_zeroes` reads back as zeros; after a `discard`, which is
//!   advisory, each byte reads as zero or as it was, never anything else
//!   (not older data from below); `reads_as_zero` never says true where
//!   a byte is not zero, before or after either;
//! - `block_status` runs follow the asked range in order, stay in it
//!   and on the device, number at most `max_runs`, cover the range
//!   when there are fewer, and a run said to be zero reads as zeros;
//! - `flush` succeeds and keeps what was written;
//! - requests past the end fail with an error (not a panic) and change
//!   nothing;
//! - a device that is not writable refuses every write;
//! - writes from many threads at once to disjoint ranges all land.
//!
//! The suite holds the whole device in memory: devices under test are at
//! most [`MAX_SIZE`] bytes.

mod checks;
#[cfg(test)]
pub(crate) mod tests;

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::device::BlockDevice;
use crate::error::BlockError;

/// Largest device the suite checks (it keeps a copy of every byte).
pub const MAX_SIZE: u64 = 256 << 20;

/// Bytes read at once when comparing the device with the model.
const READ_PIECE: usize = 1 << 20;

/// A fresh device to check, and the bytes it holds before the suite
/// writes anything.
#[derive(Debug)]
pub struct Subject {
    /// The device.
    pub device: Box<dyn BlockDevice>,
    /// Its content before any write, `size` bytes; `None` for all zeros
    /// (a new image with nothing below it).
    pub initial: Option<Vec<u8>>,
}

impl Subject {
    /// A device that reads as zeros until written.
    pub fn zeroed(device: Box<dyn BlockDevice>) -> Subject {
        Subject {
            device,
            initial: None,
        }
    }

    /// A device holding `initial` (a backing layer's data, a mirrored
    /// image) before the suite writes.
    pub fn holding(device: Box<dyn BlockDevice>, initial: Vec<u8>) -> Subject {
        Subject {
            device,
            initial: Some(initial),
        }
    }
}

/// What became of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The device kept the promise.
    Passed,
    /// The check does not apply to this device, and why.
    Skipped(&'static str),
    /// The device broke the promise: how.
    Failed(String),
}

/// One check of the suite and its outcome.
#[derive(Debug, Clone)]
pub struct Check {
    /// What the check holds the device to.
    pub name: &'static str,
    /// What came of it.
    pub outcome: Outcome,
}

/// The outcome of every check of the suite on one kind of device.
#[derive(Debug, Clone)]
pub struct Report {
    /// Every check, in the order run.
    pub checks: Vec<Check>,
}

impl Report {
    /// The checks the device failed.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Failed(_)))
            .collect()
    }

    /// The outcome of the check named `name`, if it ran.
    pub fn outcome(&self, name: &str) -> Option<&Outcome> {
        self.checks
            .iter()
            .find(|c| c.name == name)
            .map(|c| &c.outcome)
    }

    /// Panics, listing every failure, unless the device passed all checks
    /// that apply to it.
    #[track_caller]
    pub fn assert_conforms(&self) {
        assert!(
            self.failures().is_empty(),
            "the device breaks the block device contract:\n{self}"
        );
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for check in &self.checks {
            match &check.outcome {
                Outcome::Passed => writeln!(f, "  ok      {}", check.name)?,
                Outcome::Skipped(why) => writeln!(f, "  skipped {}: {why}", check.name)?,
                Outcome::Failed(how) => writeln!(f, "  FAILED  {}: {how}", check.name)?,
            }
        }
        Ok(())
    }
}

/// Runs every check, each on a fresh device from `make`, and reports.
pub fn run(make: &mut dyn FnMut() -> Subject) -> Report {
    let checks = checks::ALL
        .iter()
        .map(|&(name, check)| Check {
            name,
            outcome: run_one(make, check),
        })
        .collect();
    Report { checks }
}

/// Runs every check and panics with the report if the device broke any.
#[track_caller]
pub fn check_device(make: &mut dyn FnMut() -> Subject) {
    run(make).assert_conforms();
}

/// What a check returns: `Ok(None)` passed, `Ok(Some(why))` did not
/// apply, `Err(how)` failed.
type CheckResult = Result<Option<&'static str>, String>;

/// A check of the suite.
type CheckFn = fn(&mut Tester<'_>) -> CheckResult;

/// Runs one check on a fresh device, then holds the device to the model
/// and its size; a panic in the device or the check is a failure.
fn run_one(make: &mut dyn FnMut() -> Subject, check: CheckFn) -> Outcome {
    let subject = make();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let mut tester = Tester::new(&*subject.device, subject.initial.as_deref())?;
        let result = check(&mut tester)?;
        tester.size_unchanged()?;
        tester.verify_all()?;
        Ok(result)
    }));
    match outcome {
        Ok(Ok(None)) => Outcome::Passed,
        Ok(Ok(Some(why))) => Outcome::Skipped(why),
        Ok(Err(how)) => Outcome::Failed(how),
        Err(panic) => Outcome::Failed(format!("panicked: {}", panic_message(&*panic))),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

/// A device under check and the bytes it must hold.
struct Tester<'a> {
    device: &'a dyn BlockDevice,
    model: Vec<u8>,
    size: u64,
    unit: u64,
}

impl<'a> Tester<'a> {
    fn new(device: &'a dyn BlockDevice, initial: Option<&[u8]>) -> Result<Self, String> {
        let size = device.size();
        let unit = device.unit_size();
        if size == 0 || size > MAX_SIZE {
            return Err(format!(
                "size {size}: the suite checks devices of 1 byte to {MAX_SIZE} bytes"
            ));
        }
        if unit == 0 || size < 4 * unit {
            return Err(format!(
                "unit size {unit} on a device of {size} bytes: the unit must be positive and \
                 the device hold at least four units"
            ));
        }
        let model = match initial {
            None => vec![0; size as usize],
            Some(bytes) if bytes.len() as u64 == size => bytes.to_vec(),
            Some(bytes) => {
                return Err(format!(
                    "the subject's initial content is {} bytes but the device {size}",
                    bytes.len()
                ))
            }
        };
        Ok(Tester {
            device,
            model,
            size,
            unit,
        })
    }

    fn writable(&self) -> bool {
        self.device.is_writable()
    }

    fn range(&self, offset: u64, len: u64) -> std::ops::Range<usize> {
        offset as usize..(offset + len) as usize
    }

    /// Reads `len` bytes at `offset`; an error is a failure.
    fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        let mut buf = vec![0; len as usize];
        self.device
            .read_at(&mut buf, offset)
            .map_err(|e| failed("read", offset, len, &e))?;
        Ok(buf)
    }

    /// Reads a range and compares it with the model.
    fn expect_read(&self, offset: u64, len: u64) -> Result<(), String> {
        let got = self.read(offset, len)?;
        let want = &self.model[self.range(offset, len)];
        match got.iter().zip(want).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(i) => Err(format!(
                "read of {len} bytes at offset {offset}: byte at offset {} is {:#04x}, \
                 expected {:#04x}",
                offset + i as u64,
                got[i],
                want[i]
            )),
        }
    }

    /// Compares the whole device with the model.
    fn verify_all(&self) -> Result<(), String> {
        let mut offset = 0;
        while offset < self.size {
            let len = (self.size - offset).min(READ_PIECE as u64);
            self.expect_read(offset, len)?;
            offset += len;
        }
        Ok(())
    }

    fn size_unchanged(&self) -> Result<(), String> {
        match self.device.size() {
            size if size == self.size => Ok(()),
            size => Err(format!("the size changed from {} to {size}", self.size)),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        self.device
            .write_at(data, offset)
            .map_err(|e| failed("write", offset, data.len() as u64, &e))?;
        let range = self.range(offset, data.len() as u64);
        self.model[range].copy_from_slice(data);
        Ok(())
    }

    fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<(), String> {
        self.device
            .write_zeroes(offset, len)
            .map_err(|e| failed("write_zeroes", offset, len, &e))?;
        let range = self.range(offset, len);
        self.model[range].fill(0);
        Ok(())
    }

    /// Discards, and holds the device to what a discard promises: each
    /// byte reads as zero or as it was (a discard is advisory), never as
    /// anything else. The model takes what the bytes read.
    fn discard(&mut self, offset: u64, len: u64) -> Result<(), String> {
        self.device
            .discard(offset, len)
            .map_err(|e| failed("discard", offset, len, &e))?;
        let got = self.read(offset, len)?;
        let range = self.range(offset, len);
        for (i, (&now, before)) in got.iter().zip(&mut self.model[range]).enumerate() {
            if now != 0 && now != *before {
                return Err(format!(
                    "after a discard of {len} bytes at offset {offset}, the byte at offset {} \
                     reads {now:#04x}: neither zero nor what it held ({before:#04x})",
                    offset + i as u64
                ));
            }
            *before = now;
        }
        Ok(())
    }

    /// Whether the model holds only zeros in the range.
    fn model_zero(&self, offset: u64, len: u64) -> bool {
        self.model[self.range(offset, len)].iter().all(|&b| b == 0)
    }
}

/// A failure message for a request that should have succeeded.
fn failed(operation: &str, offset: u64, len: u64, error: &BlockError) -> String {
    format!(
        "{operation} of {len} bytes at offset {offset} failed ({}): {error}",
        error.kind()
    )
}

/// Bytes that are never zero and differ with `seed` and position.
fn pattern(seed: u8, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| ((i % 251) as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

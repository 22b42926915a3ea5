//! The suite on a device in memory that keeps the contract, and on
//! versions of it that each break one promise: the suite must pass the
//! first and report each of the others.

use std::sync::Mutex;

use super::{run, Outcome, Subject};
use crate::device::{BlockDevice, BlockStatus};
use crate::error::{BlockError, ErrorKind, Result};

pub(crate) const UNIT: u64 = 4096;
pub(crate) const SIZE: u64 = 64 * UNIT + 1000;

/// One promise a [`MemoryDevice`] breaks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Flaw {
    None,
    /// `discard` brings back older data (a layer below, say).
    DiscardExposesOlder,
    /// `write_zeroes` does nothing.
    ZeroesIgnored,
    /// `reads_as_zero` always says true.
    ZeroLies,
    /// `block_status` returns one run longer than asked.
    RunPastRange,
    /// `block_status` ignores `max_runs`.
    TooManyRuns,
    /// A read past the end panics instead of failing.
    PanicPastEnd,
    /// A device said to be read-only takes writes.
    WritableReadOnly,
    /// Writes land one byte late.
    WriteShifted,
}

/// A device in memory: every unit allocated once written, none before.
#[derive(Debug)]
pub(crate) struct MemoryDevice {
    bytes: Mutex<Vec<u8>>,
    writable: bool,
    flaw: Flaw,
}

impl MemoryDevice {
    pub(crate) fn new(flaw: Flaw, writable: bool) -> MemoryDevice {
        MemoryDevice {
            bytes: Mutex::new(vec![0; SIZE as usize]),
            writable,
            flaw,
        }
    }

    fn check(&self, offset: u64, len: u64) -> Result<std::ops::Range<usize>> {
        BlockError::check_range(offset, len, SIZE)?;
        Ok(offset as usize..(offset + len) as usize)
    }

    fn check_write(&self, offset: u64, len: u64) -> Result<std::ops::Range<usize>> {
        if !self.writable && self.flaw != Flaw::WritableReadOnly {
            return Err(BlockError::new(ErrorKind::ReadOnly, "read-only"));
        }
        self.check(offset, len)
    }
}

impl BlockDevice for MemoryDevice {
    fn size(&self) -> u64 {
        SIZE
    }

    fn is_writable(&self) -> bool {
        self.writable
    }

    fn unit_size(&self) -> u64 {
        UNIT
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        if self.flaw == Flaw::PanicPastEnd {
            buf.copy_from_slice(&self.bytes.lock().unwrap()[offset as usize..][..buf.len()]);
            return Ok(());
        }
        let range = self.check(offset, buf.len() as u64)?;
        buf.copy_from_slice(&self.bytes.lock().unwrap()[range]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let range = self.check_write(offset, buf.len() as u64)?;
        let mut bytes = self.bytes.lock().unwrap();
        if self.flaw == Flaw::WriteShifted && range.end < bytes.len() {
            bytes[range.start + 1..range.end + 1].copy_from_slice(buf);
        } else {
            bytes[range].copy_from_slice(buf);
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        let range = self.check_write(offset, len)?;
        if self.flaw != Flaw::ZeroesIgnored {
            self.bytes.lock().unwrap()[range].fill(0);
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let range = self.check_write(offset, len)?;
        let older = if self.flaw == Flaw::DiscardExposesOlder {
            0xee
        } else {
            0
        };
        self.bytes.lock().unwrap()[range].fill(older);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn reads_as_zero(&self, offset: u64, len: u64) -> Result<bool> {
        let range = self.check(offset, len)?;
        Ok(
            self.flaw == Flaw::ZeroLies
                || self.bytes.lock().unwrap()[range].iter().all(|&b| b == 0),
        )
    }

    fn block_status(&self, offset: u64, len: u64, max_runs: usize) -> Result<Vec<BlockStatus>> {
        let range = self.check(offset, len)?;
        let bytes = self.bytes.lock().unwrap();
        let mut runs: Vec<BlockStatus> = Vec::new();
        let mut pos = range.start;
        while pos < range.end {
            let end = ((pos as u64 / UNIT + 1) * UNIT).min(range.end as u64) as usize;
            let zero = bytes[pos..end].iter().all(|&b| b == 0);
            let full = runs.len() == max_runs && self.flaw != Flaw::TooManyRuns;
            match runs.last_mut() {
                Some(last) if last.zero == zero => last.length += (end - pos) as u64,
                _ if full => break,
                _ => runs.push(BlockStatus {
                    length: (end - pos) as u64,
                    hole: zero,
                    zero,
                }),
            }
            pos = end;
        }
        if self.flaw == Flaw::RunPastRange {
            if let Some(last) = runs.last_mut() {
                last.length += 1;
            }
        }
        Ok(runs)
    }
}

fn outcome_of(flaw: Flaw, writable: bool, check: &str) -> Outcome {
    let report = run(&mut || Subject::zeroed(Box::new(MemoryDevice::new(flaw, writable))));
    report
        .outcome(check)
        .unwrap_or_else(|| panic!("no check named {check:?}:\n{report}"))
        .clone()
}

#[test]
fn a_device_that_keeps_the_contract_passes_every_check() {
    for writable in [true, false] {
        let report =
            run(&mut || Subject::zeroed(Box::new(MemoryDevice::new(Flaw::None, writable))));
        report.assert_conforms();
        let passed = report
            .checks
            .iter()
            .filter(|c| c.outcome == Outcome::Passed)
            .count();
        assert!(passed >= 7, "only {passed} checks ran:\n{report}");
    }
}

#[test]
fn a_device_whose_discard_exposes_older_data_fails_the_suite() {
    let report =
        run(&mut || Subject::zeroed(Box::new(MemoryDevice::new(Flaw::DiscardExposesOlder, true))));
    for check in [
        "discard reads as zeros or as before, nothing else",
        "block_status runs are ordered, bounded and truthful",
    ] {
        assert!(
            matches!(report.outcome(check), Some(Outcome::Failed(_))),
            "{check}: {report}"
        );
    }
    assert_eq!(report.failures().len(), 2, "{report}");
    let result = std::panic::catch_unwind(|| report.assert_conforms());
    assert!(result.is_err(), "assert_conforms passed a broken device");
}

#[test]
fn each_broken_promise_is_reported_by_its_check() {
    let cases = [
        (
            Flaw::ZeroesIgnored,
            true,
            "write_zeroes reads back as zeros",
        ),
        (
            Flaw::ZeroLies,
            true,
            "reads_as_zero never says true over data",
        ),
        (Flaw::ZeroLies, true, "write_zeroes reads back as zeros"),
        (
            Flaw::RunPastRange,
            true,
            "block_status runs are ordered, bounded and truthful",
        ),
        (
            Flaw::TooManyRuns,
            true,
            "block_status runs are ordered, bounded and truthful",
        ),
        (
            Flaw::PanicPastEnd,
            true,
            "requests past the end fail and change nothing",
        ),
        (
            Flaw::WritableReadOnly,
            false,
            "a read-only device refuses writes",
        ),
        (Flaw::WriteShifted, true, "aligned writes read back"),
        (
            Flaw::WriteShifted,
            true,
            "concurrent writes to disjoint ranges all land",
        ),
    ];
    for (flaw, writable, check) in cases {
        let outcome = outcome_of(flaw, writable, check);
        assert!(
            matches!(outcome, Outcome::Failed(_)),
            "{flaw:?}: {check:?} was {outcome:?}"
        );
    }
}

#[test]
fn a_subject_whose_initial_content_is_wrong_fails_every_check() {
    let report = run(&mut || {
        Subject::holding(
            Box::new(MemoryDevice::new(Flaw::None, true)),
            vec![1; SIZE as usize],
        )
    });
    assert_eq!(report.failures().len(), report.checks.len(), "{report}");
}

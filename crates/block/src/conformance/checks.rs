//! The checks of the suite, each one promise of the contract.

use super::{failed, pattern, CheckFn, CheckResult, Tester};
use crate::error::{BlockError, ErrorKind};

/// Every check, with the name the report gives it.
pub(super) const ALL: &[(&str, CheckFn)] = &[
    ("size and unit are sane and stable", size_is_stable),
    (
        "reads before any write return the initial content",
        initial_content,
    ),
    ("aligned writes read back", aligned_writes),
    ("unaligned writes across units read back", unaligned_writes),
    ("write_zeroes reads back as zeros", write_zeroes),
    ("discard reads as zeros or as before, nothing else", discard),
    (
        "reads_as_zero never says true over data",
        reads_as_zero_is_honest,
    ),
    (
        "block_status runs are ordered, bounded and truthful",
        block_status,
    ),
    ("flush succeeds and keeps what was written", flush),
    (
        "requests past the end fail and change nothing",
        out_of_range,
    ),
    ("a read-only device refuses writes", read_only),
    (
        "concurrent writes to disjoint ranges all land",
        concurrent_writes,
    ),
];

/// Why write checks do not apply.
const NOT_WRITABLE: &str = "the device is not writable";

fn size_is_stable(t: &mut Tester<'_>) -> CheckResult {
    for _ in 0..3 {
        t.size_unchanged()?;
    }
    if t.device.parallel_requests() == 0 {
        return Err("parallel_requests is 0: a front end could run nothing".into());
    }
    if t.device.unit_size() != t.unit {
        return Err("the unit size changed between two calls".into());
    }
    Ok(None)
}

fn initial_content(t: &mut Tester<'_>) -> CheckResult {
    t.verify_all()?;
    // Small reads across unit boundaries and at the very end.
    let unit = t.unit;
    for (offset, len) in [(unit - 3, 7), (2 * unit - 1, 2), (t.size - 1, 1), (0, 1)] {
        t.expect_read(offset, len)?;
    }
    Ok(None)
}

fn aligned_writes(t: &mut Tester<'_>) -> CheckResult {
    if !t.writable() {
        return Ok(Some(NOT_WRITABLE));
    }
    let unit = t.unit;
    t.write(unit, &pattern(10, unit))?;
    t.expect_read(unit, unit)?;
    t.write(2 * unit, &pattern(40, 2 * unit))?;
    t.expect_read(unit, 3 * unit)?;
    // The last unit, which ends at the end of the device.
    let last = (t.size - 1) / unit * unit;
    t.write(last, &pattern(90, t.size - last))?;
    t.expect_read(last, t.size - last)?;
    Ok(None)
}

fn unaligned_writes(t: &mut Tester<'_>) -> CheckResult {
    if !t.writable() {
        return Ok(Some(NOT_WRITABLE));
    }
    let unit = t.unit;
    // From inside unit 0 to inside unit 3: a head, whole units, a tail.
    let offset = unit - unit.min(517);
    let len = 2 * unit + 2 * unit.min(517);
    t.write(offset, &pattern(20, len))?;
    t.expect_read(offset, len)?;
    // One byte inside, and a write over the first one's end.
    t.write(2 * unit + 7, &[0xa5])?;
    t.write(offset + len - 100, &pattern(60, 300))?;
    for (offset, len) in [(unit - 1, 2), (2 * unit + 5, 5), (offset + len - 150, 400)] {
        t.expect_read(offset, len)?;
    }
    // A write that ends exactly at the end of the device.
    t.write(t.size - 33, &pattern(70, 33))?;
    t.expect_read(t.size - 40, 40)?;
    Ok(None)
}

/// Fills the first four units with data, zeroes (or discards) an
/// unaligned span across units and one whole unit with `zero`, and holds
/// the device to what that promises (the model knows).
fn zeroing(
    t: &mut Tester<'_>,
    zero: fn(&mut Tester<'_>, u64, u64) -> Result<(), String>,
) -> CheckResult {
    if !t.writable() {
        return Ok(Some(NOT_WRITABLE));
    }
    let unit = t.unit;
    t.write(0, &pattern(30, 4 * unit))?;
    let spans = [(unit / 2 + 3, 2 * unit), (3 * unit, unit)];
    for (offset, len) in spans {
        zero(t, offset, len)?;
    }
    // The model holds what the device must read now.
    for (offset, len) in spans {
        t.expect_read(offset, len)?;
    }
    // Data around the zeroed spans is untouched (verify_all sees the rest).
    t.expect_read(0, 4 * unit)?;
    honest_over(t, 0, 4 * unit)?;
    Ok(None)
}

fn write_zeroes(t: &mut Tester<'_>) -> CheckResult {
    zeroing(t, |t, offset, len| t.write_zeroes(offset, len))
}

fn discard(t: &mut Tester<'_>) -> CheckResult {
    zeroing(t, |t, offset, len| t.discard(offset, len))
}

/// Asks `reads_as_zero` about every unit, half unit and a few unaligned
/// pieces of `len` bytes at `offset`: a true answer must be true.
fn honest_over(t: &Tester<'_>, offset: u64, len: u64) -> Result<(), String> {
    let unit = t.unit;
    let half = (unit / 2).max(1);
    let mut ranges = vec![(offset, len), (offset + 1, len - 2)];
    for step in [unit, half] {
        let mut pos = offset;
        while pos < offset + len {
            ranges.push((pos, step.min(offset + len - pos)));
            pos += step;
        }
    }
    for (start, n) in ranges {
        let says = t
            .device
            .reads_as_zero(start, n)
            .map_err(|e| failed("reads_as_zero", start, n, &e))?;
        if says && !(t.model_zero(start, n) && t.read(start, n)?.iter().all(|&b| b == 0)) {
            return Err(format!(
                "reads_as_zero says {n} bytes at offset {start} are zeros, but they hold data"
            ));
        }
    }
    Ok(())
}

fn reads_as_zero_is_honest(t: &mut Tester<'_>) -> CheckResult {
    let unit = t.unit;
    if t.writable() {
        t.write(unit + 100, &pattern(50, 10))?;
        t.write(3 * unit - 1, &[7])?;
    }
    honest_over(t, 0, 4 * unit)?;
    honest_over(t, 0, t.size)?;
    Ok(None)
}

fn block_status(t: &mut Tester<'_>) -> CheckResult {
    let unit = t.unit;
    if t.writable() {
        t.write(unit, &pattern(80, unit))?;
        t.write_zeroes(2 * unit, unit)?;
        t.write(3 * unit + 11, &pattern(81, 5))?;
        t.write(5 * unit / 2, &pattern(82, unit))?;
        t.discard(5 * unit / 2, unit)?;
    }
    let size = t.size;
    let ranges = [
        (0, size),
        (unit - 100, 2 * unit + 200),
        (unit, unit),
        (size - unit / 2 - 1, unit / 2 + 1),
        (5, 1),
    ];
    for (offset, len) in ranges {
        for max_runs in [1, 2, 3, 1024] {
            runs_hold(t, offset, len, max_runs)?;
        }
    }
    Ok(None)
}

/// Holds one `block_status` answer to the contract.
fn runs_hold(t: &Tester<'_>, offset: u64, len: u64, max_runs: usize) -> Result<(), String> {
    let asked = format!("block_status of {len} bytes at offset {offset}, at most {max_runs} runs");
    let runs = t
        .device
        .block_status(offset, len, max_runs)
        .map_err(|e| failed("block_status", offset, len, &e))?;
    if runs.is_empty() || runs.len() > max_runs {
        return Err(format!("{asked}: {} runs", runs.len()));
    }
    let mut pos = offset;
    for run in &runs {
        if run.length == 0 || run.length > offset + len - pos {
            return Err(format!(
                "{asked}: a run of {} bytes at offset {pos} (empty, or past the range)",
                run.length
            ));
        }
        // A run said to be zero must read as zeros; one said to hold data
        // must read back what was written (the model).
        if run.zero
            && !(t.model_zero(pos, run.length) && t.read(pos, run.length)?.iter().all(|&b| b == 0))
        {
            return Err(format!(
                "{asked}: the run of {} bytes at offset {pos} is said to be zero but holds data",
                run.length
            ));
        }
        t.expect_read(pos, run.length)?;
        pos += run.length;
    }
    if runs.len() < max_runs && pos != offset + len {
        return Err(format!(
            "{asked}: {} runs end at offset {pos}, before the end of the range, though more \
             were allowed",
            runs.len()
        ));
    }
    Ok(())
}

fn flush(t: &mut Tester<'_>) -> CheckResult {
    if t.writable() {
        t.write(t.unit + 1, &pattern(100, t.unit))?;
    }
    t.device
        .flush()
        .map_err(|e| format!("flush failed ({}): {e}", e.kind()))?;
    t.expect_read(0, 3 * t.unit)?;
    Ok(None)
}

/// A request past the end must fail with one of `kinds`.
fn refused(
    request: &str,
    result: crate::error::Result<impl std::fmt::Debug>,
    kinds: &[ErrorKind],
) -> Result<(), String> {
    match result {
        Ok(value) => Err(format!("{request} succeeded ({value:?}); it must fail")),
        Err(e) if kinds.contains(&e.kind()) => Ok(()),
        Err(e) => Err(format!(
            "{request} failed as {}, expected one of {kinds:?}: {e}",
            e.kind()
        )),
    }
}

fn out_of_range(t: &mut Tester<'_>) -> CheckResult {
    let size = t.size;
    let range = [ErrorKind::OutOfRange, ErrorKind::Invalid];
    let device = t.device;
    let mut buf = [0u8; 4];
    for (offset, len) in [(size - 1, 2), (size, 1), (u64::MAX - 1, 4)] {
        let request = format!("a read of {len} bytes at offset {offset} on {size} bytes");
        refused(
            &request,
            device.read_at(&mut buf[..len as usize], offset),
            &range,
        )?;
        let request = format!("reads_as_zero of {len} bytes at offset {offset}");
        refused(&request, device.reads_as_zero(offset, len), &range)?;
        let request = format!("block_status of {len} bytes at offset {offset}");
        refused(&request, device.block_status(offset, len, 8), &range)?;
    }
    // On a read-only device a write past the end may be refused as either.
    let write = [
        ErrorKind::OutOfRange,
        ErrorKind::Invalid,
        ErrorKind::ReadOnly,
    ];
    for (offset, len) in [(size - 2, 4), (size, 1), (u64::MAX - 1, 4)] {
        let request = format!("a write of {len} bytes at offset {offset} on {size} bytes");
        refused(
            &request,
            device.write_at(&[0x5a; 4][..len as usize], offset),
            &write,
        )?;
        let request = format!("write_zeroes of {len} bytes at offset {offset}");
        refused(&request, device.write_zeroes(offset, len), &write)?;
        let request = format!("discard of {len} bytes at offset {offset}");
        refused(&request, device.discard(offset, len), &write)?;
    }
    // The model is unchanged: verify_all checks the last bytes kept theirs.
    Ok(None)
}

fn read_only(t: &mut Tester<'_>) -> CheckResult {
    if t.writable() {
        return Ok(Some("the device is writable"));
    }
    let unit = t.unit;
    let read_only = [ErrorKind::ReadOnly];
    let device = t.device;
    refused("a write", device.write_at(&pattern(1, unit), 0), &read_only)?;
    refused("a write", device.write_at(&[1, 2, 3], unit + 5), &read_only)?;
    refused("write_zeroes", device.write_zeroes(0, 2 * unit), &read_only)?;
    refused("discard", device.discard(unit, unit), &read_only)?;
    Ok(None)
}

fn concurrent_writes(t: &mut Tester<'_>) -> CheckResult {
    if !t.writable() {
        return Ok(Some(NOT_WRITABLE));
    }
    const THREADS: u64 = 4;
    const PIECES: u64 = 8;
    // Pieces of an odd length, interleaved: thread i writes every
    // THREADS-th piece, so neighbours cross units together.
    let piece = (t.unit / 2 + 13).min(t.size / (THREADS * PIECES));
    let device = t.device;
    let errors: Vec<BlockError> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                scope.spawn(move || {
                    (0..PIECES)
                        .map(|k| {
                            let offset = (k * THREADS + thread) * piece;
                            device.write_at(&pattern(thread as u8 * 16 + k as u8, piece), offset)
                        })
                        .filter_map(Result::err)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| {
                w.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    if let Some(e) = errors.first() {
        return Err(format!("a concurrent write failed ({}): {e}", e.kind()));
    }
    for k in 0..PIECES {
        for thread in 0..THREADS {
            let offset = (k * THREADS + thread) * piece;
            let range = t.range(offset, piece);
            t.model[range].copy_from_slice(&pattern(thread as u8 * 16 + k as u8, piece));
        }
    }
    Ok(None)
}

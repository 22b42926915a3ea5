//! A simple I/O benchmark with `qemu-img bench`'s semantics, so both can be
//! run on the same image with the same access pattern.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::disk::Disk;
use crate::error::{DiskError, Result};

/// Benchmark parameters (qemu-img bench's flags).
#[derive(Debug, Clone)]
pub struct BenchParams {
    /// Requests to issue (-c).
    pub count: u64,
    /// Requests in flight (-d): one thread each.
    pub depth: u64,
    /// Bytes per request (-s).
    pub bufsize: u64,
    /// Distance between request offsets (-S); defaults to `bufsize`.
    pub step: Option<u64>,
    /// First offset (-o).
    pub offset: u64,
    /// Write instead of read (-w).
    pub write: bool,
    /// Byte written (--pattern).
    pub pattern: u8,
}

/// What a benchmark run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchReport {
    /// Requests completed.
    pub ops: u64,
    /// Wall time.
    pub seconds: f64,
    /// Requests per second.
    pub iops: f64,
    /// Bytes per second.
    pub bytes_per_second: f64,
}

/// Offset of request `i`, by qemu-img 10.0's rule: request 0 goes to
/// `offset` as given, every later one adds the step modulo the image size.
/// (A request that then runs past the end fails, as it does in QEMU.)
pub fn request_offset(p: &BenchParams, size: u64, i: u64) -> u64 {
    if i == 0 || size == 0 {
        return p.offset;
    }
    let step = p.step.unwrap_or(p.bufsize);
    ((p.offset as u128 + i as u128 * step as u128) % size as u128) as u64
}

/// Runs the benchmark.
pub fn run(disk: &Disk, p: &BenchParams) -> Result<BenchReport> {
    if p.bufsize == 0 || p.bufsize > disk.size() || p.bufsize > 256 << 20 {
        return Err(DiskError::Invalid(format!(
            "buffer size {} must be between 1 and the disk size (and at most 256 MiB)",
            p.bufsize
        )));
    }
    if p.offset.saturating_add(p.bufsize) > disk.size() {
        return Err(DiskError::Invalid(format!(
            "offset {} + buffer size {} is beyond the end of the image ({} bytes)",
            p.offset,
            p.bufsize,
            disk.size()
        )));
    }
    let next = AtomicU64::new(0);
    let started = Instant::now();
    let result: Result<()> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..p.depth.clamp(1, 256))
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    let mut buf = crate::buf::AlignedBuf::zeroed(p.bufsize as usize);
                    buf.fill(p.pattern);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= p.count {
                            return Ok(());
                        }
                        let off = request_offset(p, disk.size(), i);
                        if p.write {
                            disk.write_at(&buf, off)?;
                        } else {
                            disk.read_at(&mut buf, off)?;
                        }
                    }
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| {
            w.join()
                .unwrap_or_else(|_| Err(DiskError::Invalid("worker panicked".into())))
        })
    });
    result?;
    if p.write {
        disk.flush()?;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(BenchReport {
        ops: p.count,
        seconds,
        iops: p.count as f64 / seconds,
        bytes_per_second: (p.count * p.bufsize) as f64 / seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_follow_qemu_img_10_0() {
        let p = BenchParams {
            count: 4,
            depth: 1,
            bufsize: 4096,
            step: Some(3 << 20),
            offset: 4096,
            write: false,
            pattern: 0,
        };
        let size = 8 << 20;
        let got: Vec<u64> = (0..4).map(|i| request_offset(&p, size, i)).collect();
        assert_eq!(
            got,
            vec![4096, (3 << 20) + 4096, (6 << 20) + 4096, (1 << 20) + 4096]
        );
    }
}

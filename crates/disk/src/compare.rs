//! Comparing the content of two disks, like `qemu-img compare`.

use crate::convert::{is_zero, CHUNK};
use crate::disk::Disk;
use crate::error::Result;

/// Outcome of a comparison.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Comparison {
    /// Same content.
    Identical,
    /// First differing byte, rounded down to a 512-byte sector.
    Mismatch {
        /// Guest offset.
        offset: u64,
    },
    /// Sizes differ in strict mode.
    SizeMismatch {
        /// Size of the first disk.
        first: u64,
        /// Size of the second disk.
        second: u64,
    },
}

/// Compares two disks. Without `strict`, a size difference is allowed if the
/// larger disk's extra bytes are zeros.
pub fn compare(
    a: &Disk,
    b: &Disk,
    strict: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Comparison> {
    if strict && a.size() != b.size() {
        return Ok(Comparison::SizeMismatch {
            first: a.size(),
            second: b.size(),
        });
    }
    let common = a.size().min(b.size());
    let total = a.size().max(b.size());
    let mut x = crate::buf::AlignedBuf::zeroed(CHUNK as usize);
    let mut y = crate::buf::AlignedBuf::zeroed(CHUNK as usize);
    let mut pos = 0;
    let (mut ca, mut cb) = (a.data_cursor(), b.data_cursor());
    while pos < common {
        let next = a
            .next_possible_data(&mut ca, pos)?
            .min(b.next_possible_data(&mut cb, pos)?)
            .min(common)
            / CHUNK
            * CHUNK;
        if next > pos {
            pos = next;
            progress(pos, total);
            continue;
        }
        let len = (common - pos).min(CHUNK);
        let both_zero = a.reads_as_zero(pos, len)? && b.reads_as_zero(pos, len)?;
        if !both_zero {
            let (xs, ys) = (&mut x[..len as usize], &mut y[..len as usize]);
            a.read_at(xs, pos)?;
            b.read_at(ys, pos)?;
            if let Some(i) = xs.iter().zip(ys.iter()).position(|(p, q)| p != q) {
                return Ok(Comparison::Mismatch {
                    offset: (pos + i as u64) & !511,
                });
            }
        }
        pos += len;
        progress(pos, total);
    }
    let longer = if a.size() > b.size() { a } else { b };
    let mut cl = longer.data_cursor();
    while pos < total {
        let next = longer.next_possible_data(&mut cl, pos)? / CHUNK * CHUNK;
        if next > pos {
            pos = next;
            progress(pos, total);
            continue;
        }
        let len = (total - pos).min(CHUNK);
        if !longer.reads_as_zero(pos, len)? {
            let xs = &mut x[..len as usize];
            longer.read_at(xs, pos)?;
            if !is_zero(xs) {
                let i = xs.iter().position(|p| *p != 0).unwrap_or(0);
                return Ok(Comparison::Mismatch {
                    offset: (pos + i as u64) & !511,
                });
            }
        }
        pos += len;
        progress(pos, total);
    }
    Ok(Comparison::Identical)
}

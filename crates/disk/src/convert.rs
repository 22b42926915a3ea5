//! Copying a disk (or a whole chain, flattened) into a new image.

use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;
use std::time::Instant;

use crate::create::{create, CreateOptions};
use crate::disk::{Disk, OpenOptions};
use crate::error::{DiskError, Place, Result};
use crate::layer::Format;

/// Writes a buffer at a target offset.
type WriteFn = dyn FnMut(&[u8], u64) -> Result<()>;

/// Bytes copied per step.
pub const CHUNK: u64 = 2 << 20;

/// What a convert did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConvertReport {
    /// Bytes of guest disk covered.
    pub size: u64,
    /// Bytes written (zero runs are skipped).
    pub bytes_written: u64,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// Copies `src` to a new image at `dst`. `target` says the format and, for
/// qcow2, its options (the backing file must be `None`: the result is
/// flattened). `progress` is called with (bytes done, total).
pub fn convert(
    src: &Disk,
    dst: &Path,
    target: &CreateOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ConvertReport> {
    let started = Instant::now();
    let size = src.size();
    let place = Place {
        depth: 0,
        path: dst.to_path_buf(),
    };
    let mut out: Box<WriteFn> = match target.format {
        Format::Raw => {
            let special = std::fs::metadata(dst)
                .map(|m| m.file_type().is_char_device() || m.file_type().is_block_device())
                .unwrap_or(false);
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(!special)
                .truncate(!special)
                .open(dst)
                .map_err(|e| DiskError::io(&place, "create", e))?;
            if !special {
                file.set_len(size)
                    .map_err(|e| DiskError::io(&place, "truncate", e))?;
            }
            let place = place.clone();
            Box::new(move |buf: &[u8], at: u64| {
                file.write_all_at(buf, at)
                    .map_err(|e| DiskError::io(&place, "write", e))
            })
        }
        Format::Qcow2 => {
            let opts = CreateOptions {
                size: Some(size),
                backing: None,
                backing_format: None,
                ..target.clone()
            };
            create(dst, &opts)?;
            let disk = Disk::open(dst, &OpenOptions::read_write())?;
            Box::new(move |buf: &[u8], at: u64| disk.write_at(buf, at))
        }
    };
    let mut buf = crate::buf::AlignedBuf::zeroed(CHUNK as usize);
    let mut written = 0u64;
    let mut pos = 0u64;
    let mut cursor = src.data_cursor();
    while pos < size {
        let next = src.next_possible_data(&mut cursor, pos)? / CHUNK * CHUNK;
        if next > pos {
            pos = next;
            progress(pos, size);
            continue;
        }
        let len = (size - pos).min(CHUNK);
        if !src.reads_as_zero(pos, len)? {
            let chunk = &mut buf[..len as usize];
            src.read_at(chunk, pos)?;
            written += write_nonzero(&mut out, chunk, pos)?;
        }
        pos += len;
        progress(pos, size);
    }
    drop(out);
    Ok(ConvertReport {
        size,
        bytes_written: written,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Writes the parts of `chunk` that are not zero, in 64 KiB steps, so the
/// target stays sparse.
fn write_nonzero(
    out: &mut dyn FnMut(&[u8], u64) -> Result<()>,
    chunk: &[u8],
    at: u64,
) -> Result<u64> {
    const STEP: usize = 64 * 1024;
    let mut written = 0;
    let mut i = 0;
    while i < chunk.len() {
        let mut j = i;
        while j < chunk.len() {
            let end = (j + STEP).min(chunk.len());
            if is_zero(&chunk[j..end]) {
                break;
            }
            j = end;
        }
        if j > i {
            out(&chunk[i..j], at + i as u64)?;
            written += (j - i) as u64;
            i = j;
        } else {
            i = (i + STEP).min(chunk.len());
        }
    }
    Ok(written)
}

/// Whether a buffer is all zeros.
pub fn is_zero(buf: &[u8]) -> bool {
    let (pre, mid, post) = unsafe { buf.align_to::<u128>() };
    pre.iter().all(|b| *b == 0) && mid.iter().all(|w| *w == 0) && post.iter().all(|b| *b == 0)
}

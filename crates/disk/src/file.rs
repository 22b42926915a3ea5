//! Positional I/O on one image file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{DiskError, Place, Result};

/// An open image file. Reads and writes are positional, so one handle is
/// shared by every thread without a lock.
#[derive(Debug)]
pub(crate) struct ImageFile {
    file: File,
    pub(crate) place: Place,
    len: AtomicU64,
    writable: bool,
}

impl ImageFile {
    pub(crate) fn open(path: &Path, depth: u32, writable: bool) -> Result<ImageFile> {
        let place = Place {
            depth,
            path: path.to_path_buf(),
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|e| DiskError::io(&place, "open", e))?;
        let meta = file
            .metadata()
            .map_err(|e| DiskError::io(&place, "stat", e))?;
        Ok(ImageFile {
            file,
            place,
            len: AtomicU64::new(meta.len()),
            writable,
        })
    }

    pub(crate) fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    pub(crate) fn metadata(&self) -> Result<std::fs::Metadata> {
        self.file
            .metadata()
            .map_err(|e| DiskError::io(&self.place, "stat", e))
    }

    /// Reads exactly `buf.len()` bytes; the range must lie inside the file.
    pub(crate) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|end| end > self.len()) {
            return Err(DiskError::corrupt(
                &self.place,
                format!(
                    "read of {} bytes at 0x{offset:x} runs beyond the end of the file (0x{:x})",
                    buf.len(),
                    self.len()
                ),
            ));
        }
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| DiskError::io(&self.place, "read", e))
    }

    /// Reads what the file holds at `offset` and fills the rest with zeros.
    pub(crate) fn read_or_zero(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = self.len();
        let have = len.saturating_sub(offset).min(buf.len() as u64) as usize;
        if have > 0 {
            self.file
                .read_exact_at(&mut buf[..have], offset)
                .map_err(|e| DiskError::io(&self.place, "read", e))?;
        }
        buf[have..].fill(0);
        Ok(())
    }

    pub(crate) fn write_all_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        if !self.writable {
            return Err(DiskError::ReadOnly(self.place.path.clone()));
        }
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| DiskError::io(&self.place, "write", e))?;
        self.len
            .fetch_max(offset + buf.len() as u64, Ordering::AcqRel);
        Ok(())
    }

    pub(crate) fn sync(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| DiskError::io(&self.place, "fdatasync", e))
    }
}

//! [`BlockDevice`] for [`Mirror`], so the NBD server can export it: reads
//! fetch the chunks they need first, writes stay local.

use super::*;

impl Inner {
    pub(super) fn to_disk_error(&self, e: MirrorError) -> DiskError {
        DiskError::Io {
            place: Place {
                depth: 0,
                path: self.store.image_path.clone(),
            },
            op: "mirror fetch",
            error: std::io::Error::other(e.to_string()),
        }
    }
}

impl BlockDevice for Mirror {
    fn size(&self) -> u64 {
        self.inner.manifest.image_size
    }

    /// Reads may wait on peers or the repository: run many at once so a
    /// client's queue depth becomes parallel chunk fetches.
    fn parallel_requests(&self) -> usize {
        64
    }

    fn is_writable(&self) -> bool {
        true
    }

    fn unit_size(&self) -> u64 {
        self.inner.manifest.chunk_size as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> strata_block::Result<()> {
        let Some((first, last)) = self.chunk_span(offset, buf.len() as u64)? else {
            return Ok(());
        };
        let i = &self.inner;
        i.ensure_read(first, last).map_err(|e| i.to_disk_error(e))?;
        i.store
            .image
            .read_exact_at(buf, offset)
            .map_err(|e| DiskError::Io {
                place: Place {
                    depth: 0,
                    path: i.store.image_path.clone(),
                },
                op: "read",
                error: e,
            })?;
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> strata_block::Result<()> {
        let Some((first, last)) = self.chunk_span(offset, buf.len() as u64)? else {
            return Ok(());
        };
        let i = &self.inner;
        let end = offset + buf.len() as u64;
        for c in first..=last {
            let (start, len) = i.manifest.extent(c);
            let whole = offset <= start && end >= start + len as u64;
            i.ensure_write(c, whole).map_err(|e| i.to_disk_error(e))?;
        }
        let io = |op, e| DiskError::Io {
            place: Place {
                depth: 0,
                path: i.store.image_path.clone(),
            },
            op,
            error: e,
        };
        i.store
            .image
            .write_all_at(buf, offset)
            .map_err(|e| io("write", e))?;
        for c in first..=last {
            i.store
                .set(c, ChunkState::Written)
                .map_err(|e| i.to_disk_error(e))?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> strata_block::Result<()> {
        let zeros = vec![0u8; (1 << 20).min(len as usize)];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.write_at(&zeros[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> strata_block::Result<()> {
        self.write_zeroes(offset, len)
    }

    fn flush(&self) -> strata_block::Result<()> {
        self.inner
            .store
            .sync()
            .map_err(|e| self.inner.to_disk_error(e))?;
        Ok(())
    }

    fn reads_as_zero(&self, offset: u64, len: u64) -> strata_block::Result<bool> {
        // No allocation map to ask: "not known to be zero", within range.
        self.chunk_span(offset, len)?;
        Ok(false)
    }

    fn block_status(
        &self,
        offset: u64,
        len: u64,
        _max_runs: usize,
    ) -> strata_block::Result<Vec<BlockStatus>> {
        self.chunk_span(offset, len)?;
        Ok(vec![BlockStatus {
            length: len,
            hole: false,
            zero: false,
        }])
    }
}

impl Mirror {
    /// First and last chunk of a request, checked against the size.
    fn chunk_span(&self, offset: u64, len: u64) -> strata_disk::Result<Option<(u32, u32)>> {
        let size = self.size();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(DiskError::OutOfRange { offset, len, size });
        }
        if len == 0 {
            return Ok(None);
        }
        let cs = self.inner.manifest.chunk_size as u64;
        Ok(Some((
            (offset / cs) as u32,
            ((offset + len - 1) / cs) as u32,
        )))
    }
}

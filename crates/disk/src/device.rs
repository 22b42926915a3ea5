//! The engine's side of the block-device contract (`strata-block`): the
//! [`BlockDevice`] implementation of [`Disk`], and how an engine error
//! becomes a contract error that a front end can answer with.
//!
//! The trait, [`BlockStatus`] and [`DEFAULT_PARALLEL_REQUESTS`] live in
//! `strata-block` so that the NBD server depends on the contract alone;
//! they are re-exported here at their old paths.

pub use strata_block::{BlockDevice, BlockStatus, DEFAULT_PARALLEL_REQUESTS};
use strata_block::{BlockError, ErrorKind};

use crate::disk::Disk;
use crate::error::DiskError;

/// The contract's kind of each engine error: what a client is told
/// (NBD: read-only is `EPERM`, a bad range `EINVAL`, a full file system
/// `ENOSPC`, anything else `EIO`). The engine's message goes along.
impl From<DiskError> for BlockError {
    fn from(error: DiskError) -> Self {
        let kind = match &error {
            DiskError::ReadOnly(_) => ErrorKind::ReadOnly,
            DiskError::OutOfRange { .. } => ErrorKind::OutOfRange,
            DiskError::Invalid(_) => ErrorKind::Invalid,
            DiskError::Io { error, .. } => ErrorKind::of_io(error),
            _ => ErrorKind::Io,
        };
        BlockError::new(kind, error)
    }
}

impl BlockDevice for Disk {
    fn size(&self) -> u64 {
        Disk::size(self)
    }

    fn is_writable(&self) -> bool {
        Disk::is_writable(self)
    }

    fn unit_size(&self) -> u64 {
        Disk::unit_size(self)
    }

    fn zero_cluster_bits(&self) -> Option<u32> {
        self.top()
            .header()
            .filter(|h| h.version >= 3)
            // With extended L2 entries a subcluster zeroes by metadata alone.
            .map(|h| {
                if h.extended_l2() {
                    h.cluster_bits - strata_format::entry::SUBCLUSTERS.trailing_zeros()
                } else {
                    h.cluster_bits
                }
            })
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> strata_block::Result<()> {
        Ok(Disk::read_at(self, buf, offset)?)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> strata_block::Result<()> {
        Ok(Disk::write_at(self, buf, offset)?)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> strata_block::Result<()> {
        Ok(Disk::write_zeroes(self, offset, len)?)
    }

    fn discard(&self, offset: u64, len: u64) -> strata_block::Result<()> {
        Ok(Disk::discard(self, offset, len)?)
    }

    fn flush(&self) -> strata_block::Result<()> {
        Ok(Disk::flush(self)?)
    }

    fn reads_as_zero(&self, offset: u64, len: u64) -> strata_block::Result<bool> {
        Ok(Disk::reads_as_zero(self, offset, len)?)
    }

    fn block_status(
        &self,
        offset: u64,
        len: u64,
        max_runs: usize,
    ) -> strata_block::Result<Vec<BlockStatus>> {
        Ok(Disk::block_status(self, offset, len, max_runs)?)
    }
}

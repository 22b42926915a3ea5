//! An export: a named disk, and the blocking execution of checked requests
//! against it, producing encoded replies.
//!
//! Everything here runs on a blocking thread (the disk engine does file
//! I/O); the async side only moves bytes.

use std::sync::Arc;

use strata_block::buf::AlignedBuf;
use strata_block::{BlockDevice, BlockError, ErrorKind};

use crate::command::Op;
use crate::proto::{self, Extent};
use crate::reply::Reply;

/// Context id given to `base:allocation` by `NBD_OPT_SET_META_CONTEXT`.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Most extents one block status reply describes. Bounds the work and the
/// reply size of one request; clients ask again from where it stopped.
pub const MAX_EXTENTS: usize = 1024;

/// Structured reads at least this long are split into data and hole
/// chunks, so zeroes need not cross the wire; below it one lookup more
/// costs more than the bytes it saves.
const HOLE_SPLIT_MIN: u32 = 64 * 1024;

/// Holes shorter than this are sent as data: a chunk header per tiny
/// hole is not worth it.
const MIN_HOLE: u64 = 4096;

/// Reads spanning more allocation units than this are sent as data only:
/// the per-unit lookups would cost more than the copy they save.
const MAX_HOLE_UNITS: u64 = 1024;

/// Largest piece of a TRIM or WRITE_ZEROES handed to the engine at once,
/// so one huge request does not hold the engine's writer lock for long
/// while other connections wait to allocate.
const ENGINE_PIECE: u64 = 64 * 1024 * 1024;

/// Size of the zero buffer used for `NO_HOLE` writes and of prefetch reads.
const IO_PIECE: usize = 1024 * 1024;

/// Largest scratch buffer a thread keeps between requests: covers the
/// request sizes of common clients (fio, nbdcopy, qemu-img convert).
const KEEP_SCRATCH: usize = 4 * 1024 * 1024;

/// A thread's reusable I/O buffer. Allocating a fresh page-aligned buffer
/// per request costs a page fault per page (large allocations are fresh
/// mappings); reusing one costs nothing.
pub(crate) struct Scratch {
    buf: AlignedBuf,
}

impl Scratch {
    /// An empty buffer.
    pub(crate) fn new() -> Scratch {
        Scratch {
            buf: AlignedBuf::zeroed(0),
        }
    }

    /// The first `len` bytes, growing the buffer if needed. Contents are
    /// whatever an earlier request left: callers overwrite them.
    pub(crate) fn get(&mut self, len: usize) -> &mut [u8] {
        if self.buf.len() < len {
            self.buf = AlignedBuf::zeroed(len.max(64 * 1024));
        }
        &mut self.buf[..len]
    }

    /// Gives back memory a rare huge request made the buffer hold.
    pub(crate) fn trim(&mut self) {
        if self.buf.len() > KEEP_SCRATCH {
            self.clear();
        }
    }

    /// Bytes the buffer holds.
    pub(crate) fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Gives back all of the buffer's memory.
    pub(crate) fn clear(&mut self) {
        self.buf = AlignedBuf::zeroed(0);
    }
}

/// Why an export cannot be created.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The name is not a valid NBD string.
    #[error("invalid export name: {0}")]
    Name(#[from] proto::ProtoError),
}

/// A device served under a name.
#[derive(Debug)]
pub struct Export {
    name: String,
    description: Option<String>,
    disk: Arc<dyn BlockDevice>,
    read_only: bool,
    /// log2 of the top layer's cluster size when it can store zero
    /// clusters (qcow2 v3): only then is writing zeroes faster than
    /// writing data.
    zero_cluster_bits: Option<u32>,
}

impl Export {
    /// Serves `disk` as `name`. A device that cannot be written is always
    /// served read-only; `read_only` makes a writable one read-only too.
    pub fn new(
        name: &str,
        disk: Arc<dyn BlockDevice>,
        read_only: bool,
    ) -> Result<Export, ExportError> {
        proto::parse_string(name.as_bytes(), "export name")?;
        let read_only = read_only || !disk.is_writable();
        let zero_cluster_bits = disk.zero_cluster_bits();
        Ok(Export {
            name: name.to_string(),
            description: None,
            disk,
            read_only,
            zero_cluster_bits,
        })
    }

    /// Adds a description, sent to clients that ask (`NBD_INFO_DESCRIPTION`).
    pub fn with_description(mut self, description: &str) -> Result<Export, ExportError> {
        proto::parse_string(description.as_bytes(), "export description")?;
        self.description = Some(description.to_string());
        Ok(self)
    }

    /// The export name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The description, if any.
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }

    /// The device.
    pub fn disk(&self) -> &Arc<dyn BlockDevice> {
        &self.disk
    }

    /// Whether writes are refused.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.disk.size()
    }

    /// Transmission flags for a session (`SEND_DF` needs structured replies).
    ///
    /// `CAN_MULTI_CONN` is safe because every connection to an export
    /// shares one device, whose flush must cover every write any
    /// connection completed ([`BlockDevice::flush`]; the engine's disk has
    /// no write-back cache of its own and syncs the top file).
    pub fn transmission_flags(&self, structured: bool) -> u16 {
        use proto::*;
        let mut f = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_CAN_MULTI_CONN;
        f |= FLAG_SEND_CACHE;
        if structured {
            f |= FLAG_SEND_DF;
        }
        if self.read_only {
            f |= FLAG_READ_ONLY;
        } else {
            f |= FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
        }
        f
    }

    /// Runs a checked operation (not `Disc`) and encodes its reply. A
    /// write's payload is the first `len` bytes of `scratch`; a read's data
    /// goes there too, and the reply borrows it. Blocking.
    pub(crate) fn execute<'a>(
        &self,
        op: Op,
        handle: u64,
        scratch: &'a mut Scratch,
        structured: bool,
    ) -> Reply<'a> {
        let result = match op {
            Op::Read { offset, len, df } => {
                return self.read(offset, len, df, handle, scratch, structured);
            }
            Op::Write { offset, len, fua } => self
                .disk
                .write_at(scratch.get(len as usize), offset)
                .and_then(|()| self.fua(fua)),
            Op::Flush => self.disk.flush(),
            Op::Trim { offset, len, fua } => self
                .in_pieces(offset, u64::from(len), |o, l| self.disk.discard(o, l))
                .and_then(|()| self.fua(fua)),
            Op::Cache { offset, len } => self.prefetch(offset, len, scratch),
            Op::WriteZeroes {
                offset,
                len,
                fua,
                no_hole,
                fast,
            } => match self.write_zeroes(offset, u64::from(len), no_hole, fast) {
                Ok(true) => self.fua(fua),
                Ok(false) => {
                    return Reply::error(
                        handle,
                        proto::ENOTSUP,
                        "zeroing this range is not faster than writing it",
                        structured,
                    );
                }
                Err(e) => Err(e),
            },
            Op::BlockStatus {
                offset,
                len,
                req_one,
            } => return self.block_status(offset, len, req_one, handle, structured),
            Op::Disc => Ok(()),
        };
        match result {
            Ok(()) => Reply::ok(handle, structured),
            Err(e) => self.failure(handle, &e, structured),
        }
    }

    fn failure<'a>(&self, handle: u64, e: &BlockError, structured: bool) -> Reply<'a> {
        let error = errno(e);
        if error == proto::EIO {
            tracing::warn!(export = %self.name, "request failed: {e}");
        } else {
            tracing::debug!(export = %self.name, "request refused: {e}");
        }
        Reply::error(handle, error, &e.to_string(), structured)
    }

    fn fua(&self, fua: bool) -> Result<(), BlockError> {
        if fua {
            self.disk.flush()
        } else {
            Ok(())
        }
    }

    fn in_pieces(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(u64, u64) -> Result<(), BlockError>,
    ) -> Result<(), BlockError> {
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let n = (end - pos).min(ENGINE_PIECE);
            f(pos, n)?;
            pos += n;
        }
        Ok(())
    }

    fn read<'a>(
        &self,
        offset: u64,
        len: u32,
        df: bool,
        handle: u64,
        scratch: &'a mut Scratch,
        structured: bool,
    ) -> Reply<'a> {
        if len == 0 {
            return Reply::ok(handle, structured);
        }
        let buf = scratch.get(len as usize);
        if let Err(e) = self.disk.read_at(buf, offset) {
            return self.failure(handle, &e, structured);
        }
        let buf: &'a [u8] = buf;
        if !structured {
            return Reply::simple_data(handle, buf);
        }
        let runs = if df || len < HOLE_SPLIT_MIN {
            Vec::new()
        } else {
            // Only a size optimisation: if the lookup fails, send data.
            self.zero_runs(offset, len).unwrap_or_default()
        };
        Reply::structured_read(handle, offset, buf, &runs)
    }

    /// Zero ranges (relative to `offset`, at least [`MIN_HOLE`] long) of
    /// a read, from the allocation map. Asked unit by unit through the
    /// resolved-page cache, which costs the same at any chain length.
    fn zero_runs(&self, offset: u64, len: u32) -> Result<Vec<(u64, u64)>, BlockError> {
        let unit = self.disk.unit_size();
        let end = offset + u64::from(len);
        if u64::from(len) / unit > MAX_HOLE_UNITS {
            return Ok(Vec::new());
        }
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut pos = offset;
        while pos < end {
            let piece_end = ((pos / unit + 1) * unit).min(end);
            if self.disk.reads_as_zero(pos, piece_end - pos)? {
                match out.last_mut() {
                    Some((start, n)) if *start + *n == pos - offset => *n += piece_end - pos,
                    _ => out.push((pos - offset, piece_end - pos)),
                }
            }
            pos = piece_end;
        }
        out.retain(|&(_, n)| n >= MIN_HOLE);
        Ok(out)
    }

    fn prefetch(&self, offset: u64, len: u32, scratch: &mut Scratch) -> Result<(), BlockError> {
        // Reading warms both the page cache and the engine's metadata
        // cache, which is what a client asking for CACHE wants.
        let buf = scratch.get(IO_PIECE.min(len.max(1) as usize));
        let end = offset + u64::from(len);
        let mut pos = offset;
        while pos < end {
            let n = (end - pos).min(buf.len() as u64) as usize;
            self.disk.read_at(&mut buf[..n], pos)?;
            pos += n as u64;
        }
        Ok(())
    }

    /// Zeroes a range. Returns `Ok(false)` when `fast` was asked and it
    /// would not be fast (nothing is changed then).
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        no_hole: bool,
        fast: bool,
    ) -> Result<bool, BlockError> {
        if len == 0 {
            return Ok(true);
        }
        if no_hole {
            if fast {
                // Real zeroes cost as much as any write.
                return Ok(false);
            }
            let zeros = vec![0u8; IO_PIECE.min(len as usize)];
            let end = offset + len;
            let mut pos = offset;
            while pos < end {
                let n = (end - pos).min(zeros.len() as u64);
                self.disk.write_at(&zeros[..n as usize], pos)?;
                pos += n;
            }
            return Ok(true);
        }
        // Already zero (unallocated, zero clusters): nothing to do, and
        // that is fast. Cheap: it only consults the allocation map.
        if self.disk.reads_as_zero(offset, len)? {
            return Ok(true);
        }
        let Some(cb) = self.zero_cluster_bits else {
            if fast {
                return Ok(false);
            }
            self.in_pieces(offset, len, |o, l| self.disk.write_zeroes(o, l))?;
            return Ok(true);
        };
        // Whole clusters become zero clusters (metadata only); partial
        // clusters at either end need real zeroes unless they already
        // read as zero.
        let cs = 1u64 << cb;
        let size = self.disk.size();
        let end = offset + len;
        let head_end = offset.div_ceil(cs).saturating_mul(cs).min(end);
        let tail_start = if end == size { end } else { end / cs * cs };
        let (head, mid, tail) = if tail_start <= head_end {
            // No whole cluster inside, unless the range is one aligned
            // cluster cut short by the end of the disk.
            if offset.is_multiple_of(cs) && end == size {
                ((offset, offset), (offset, end), (end, end))
            } else {
                ((offset, end), (end, end), (end, end))
            }
        } else {
            (
                (offset, head_end),
                (head_end, tail_start),
                (tail_start, end),
            )
        };
        let mut partial = Vec::new();
        for (a, b) in [head, tail] {
            if b > a && !self.disk.reads_as_zero(a, b - a)? {
                partial.push((a, b));
            }
        }
        if fast && !partial.is_empty() {
            return Ok(false);
        }
        for (a, b) in partial {
            self.disk.write_zeroes(a, b - a)?;
        }
        if mid.1 > mid.0 {
            self.in_pieces(mid.0, mid.1 - mid.0, |o, l| self.disk.write_zeroes(o, l))?;
        }
        Ok(true)
    }

    fn block_status(
        &self,
        offset: u64,
        len: u32,
        req_one: bool,
        handle: u64,
        structured: bool,
    ) -> Reply<'static> {
        let max = if req_one { 1 } else { MAX_EXTENTS };
        let runs = match self.disk.block_status(offset, u64::from(len), max) {
            Ok(r) => r,
            Err(e) => return self.failure(handle, &e, structured),
        };
        let mut extents: Vec<Extent> = runs
            .iter()
            .filter(|r| r.length > 0)
            .map(|r| Extent {
                // A run never exceeds the request, whose length is 32-bit.
                length: u32::try_from(r.length).unwrap_or(u32::MAX),
                flags: (if r.hole { proto::STATE_HOLE } else { 0 })
                    | (if r.zero { proto::STATE_ZERO } else { 0 }),
            })
            .collect();
        if extents.is_empty() {
            // "Unknown" is always a truthful answer.
            extents.push(Extent {
                length: len,
                flags: 0,
            });
        }
        Reply::block_status(handle, BASE_ALLOCATION_ID, &extents)
    }
}

/// The NBD error for a device error: the contract's kind decides.
pub fn errno(e: &BlockError) -> u32 {
    match e.kind() {
        ErrorKind::ReadOnly => proto::EPERM,
        ErrorKind::OutOfRange | ErrorKind::Invalid => proto::EINVAL,
        ErrorKind::NoSpace => proto::ENOSPC,
        ErrorKind::OutOfMemory => proto::ENOMEM,
        _ => proto::EIO,
    }
}

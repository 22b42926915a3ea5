//! Copying a disk (or a whole chain, flattened) into a new image.

use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::create::{create, CreateOptions};
use crate::disk::{Disk, OpenOptions};
use crate::error::{DiskError, Place, Result};
use crate::layer::Format;

/// Bytes copied per step.
pub const CHUNK: u64 = 2 << 20;

/// Copy steps in flight at once: reads and writes of different steps
/// overlap (qemu-img runs 8 coroutines over a thread pool).
const WORKERS: usize = 4;

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

/// How a convert writes its target.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConvertOptions {
    /// Make the target durable before returning (qemu-img's
    /// `-t writeback`): a qcow2 target is synced before its clean header
    /// is written, a raw one at the end.
    ///
    /// Off by default, as qemu-img's default cache mode `unsafe`: every
    /// byte is written, in the same safe order (data, then the metadata
    /// pointing at it, then the clean header), but nothing waits for the
    /// disk. The target is whole and consistent for any reader unless the
    /// machine crashes before the kernel writes it back; after such a
    /// crash it must be converted again.
    pub flush: bool,
}

/// Where the copy goes.
enum Target {
    /// A raw file or device, written with `pwrite`.
    Raw { file: std::fs::File, place: Place },
    /// A new qcow2 image.
    Qcow2(Box<Disk>),
}

impl Target {
    /// Writes `buf` at guest offset `at`.
    fn write(&self, buf: &[u8], at: u64) -> Result<()> {
        match self {
            Target::Raw { file, place } => file
                .write_all_at(buf, at)
                .map_err(|e| DiskError::io(place, "write", e)),
            // Whole new clusters in runs: one `pwrite` per run.
            Target::Qcow2(disk) => disk.write_runs(buf, at),
        }
    }

    /// Finishes the target: a qcow2 one is closed (its metadata written
    /// out and marked clean, synced first if `flush`), a raw one synced
    /// if `flush`. Errors are returned, not lost in a drop.
    fn finish(self, flush: bool) -> Result<()> {
        match self {
            Target::Raw { file, place } if flush => file
                .sync_data()
                .map_err(|e| DiskError::io(&place, "fdatasync", e)),
            Target::Raw { .. } => Ok(()),
            Target::Qcow2(disk) => disk.close(),
        }
    }

    /// Granularity of the zero runs left unwritten: 4 KiB in a raw file
    /// (qemu-img's default `-S 4k`, so the file is as sparse as its), a
    /// 64 KiB cluster in qcow2 (smaller holes would still allocate it).
    fn zero_step(&self) -> usize {
        match self {
            Target::Raw { .. } => 4096,
            Target::Qcow2(_) => 64 * 1024,
        }
    }
}

/// Copies `src` to a new image at `dst` with the default
/// [`ConvertOptions`] (not synced, as qemu-img's default): see
/// [`convert_with`].
pub fn convert(
    src: &Disk,
    dst: &Path,
    target: &CreateOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ConvertReport> {
    convert_with(src, dst, target, &ConvertOptions::default(), progress)
}

/// Copies `src` to a new image at `dst`. `target` says the format and, for
/// qcow2, its options (the backing file must be `None`: the result is
/// flattened). `options` says whether the result is made durable.
/// `progress` is called with (bytes done, total).
///
/// Only ranges some layer stores data for are read (holes and zero
/// clusters are skipped, so a raw target stays sparse); they are copied in
/// steps of at most [`CHUNK`] by [`WORKERS`] threads. A qcow2 target gets
/// each run of data clusters of a step as one contiguous host run written
/// with one `pwrite`, as qemu-img's does.
pub fn convert_with(
    src: &Disk,
    dst: &Path,
    target: &CreateOptions,
    options: &ConvertOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ConvertReport> {
    let started = Instant::now();
    let size = src.size();
    let out = open_target(dst, target, size)?;
    if let (Target::Qcow2(disk), false) = (&out, options.flush) {
        disk.top().file.set_flushes(false);
    }
    let writeback = Writeback::open(&out, dst, options.flush);
    let steps = data_steps(src)?;
    let written = copy_steps(src, &out, &steps, &mut |done, total| {
        writeback.kick(done);
        progress(done, total)
    })?;
    out.finish(options.flush)?;
    Ok(ConvertReport {
        size,
        bytes_written: written,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Bytes copied between two writeback starts.
const WRITEBACK_STEP: u64 = 64 << 20;

/// Starts writeback of a target's dirty pages while the copy runs, when
/// the target is to be made durable ([`ConvertOptions::flush`]): without
/// this, the whole image would go to the disk only at the final sync,
/// after the copy, instead of alongside it.
struct Writeback {
    /// A second handle on the target file (`None`: no flush wanted, or the
    /// file could not be opened: the final sync still covers everything).
    file: Option<std::fs::File>,
    /// Progress figure at the last start.
    last: std::cell::Cell<u64>,
}

impl Writeback {
    fn open(out: &Target, dst: &Path, flush: bool) -> Writeback {
        let regular = match out {
            Target::Qcow2(_) => true,
            Target::Raw { file, .. } => file.metadata().is_ok_and(|m| m.is_file()),
        };
        let file = if flush && regular {
            std::fs::File::open(dst).ok()
        } else {
            None
        };
        Writeback {
            file,
            last: std::cell::Cell::new(0),
        }
    }

    /// Starts writeback of everything dirty once `done` moved on by
    /// [`WRITEBACK_STEP`]. Only a hint: errors show up at the final sync.
    fn kick(&self, done: u64) {
        let Some(file) = &self.file else { return };
        if done < self.last.get() + WRITEBACK_STEP {
            return;
        }
        self.last.set(done);
        // SAFETY: a plain syscall on an fd this struct owns; no memory is
        // passed.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
}

/// Opens a raw target for writing: a regular file is created or
/// truncated, a character or block device is opened as it is. Returns the
/// file and whether it is a device (whose size is not to be set).
pub fn open_raw_target(path: &Path) -> std::io::Result<(std::fs::File, bool)> {
    let special = std::fs::metadata(path)
        .map(|m| m.file_type().is_char_device() || m.file_type().is_block_device())
        .unwrap_or(false);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(!special)
        .truncate(!special)
        .open(path)?;
    Ok((file, special))
}

/// Creates (or, for a device, opens) the target.
fn open_target(dst: &Path, target: &CreateOptions, size: u64) -> Result<Target> {
    let place = Place {
        depth: 0,
        path: dst.to_path_buf(),
    };
    Ok(match target.format {
        Format::Raw => {
            let (file, special) =
                open_raw_target(dst).map_err(|e| DiskError::io(&place, "create", e))?;
            if !special {
                file.set_len(size)
                    .map_err(|e| DiskError::io(&place, "truncate", e))?;
            }
            Target::Raw { file, place }
        }
        Format::Qcow2 => {
            let opts = CreateOptions {
                size: Some(size),
                backing: None,
                backing_format: None,
                ..target.clone()
            };
            create(dst, &opts)?;
            Target::Qcow2(Box::new(Disk::open(dst, &OpenOptions::read_write())?))
        }
    })
}

/// The ranges (offset, length) of `src` some layer stores data for, in
/// guest order, cut at multiples of [`CHUNK`]. Everything else reads as
/// zeros and is not copied.
fn data_steps(src: &Disk) -> Result<Vec<(u64, u64)>> {
    if let Some(ranges) = raw_data_ranges(src) {
        return Ok(cut_into_steps(&ranges));
    }
    let size = src.size();
    let mut ranges = Vec::new();
    let mut pos = 0;
    while pos < size {
        let runs = src.block_status(pos, size - pos, 1024)?;
        if runs.is_empty() {
            break;
        }
        for run in runs {
            if !run.hole {
                ranges.push((pos, run.length));
            }
            pos += run.length;
        }
    }
    Ok(cut_into_steps(&ranges))
}

/// Cuts `ranges` (offset, length) at multiples of [`CHUNK`].
fn cut_into_steps(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut steps = Vec::new();
    for &(start, len) in ranges {
        let end = start + len;
        let mut at = start;
        while at < end {
            let next = ((at / CHUNK + 1) * CHUNK).min(end);
            steps.push((at, next - at));
            at = next;
        }
    }
    steps
}

/// The ranges of a source that is one raw file which hold data, from the
/// file system (`SEEK_DATA`/`SEEK_HOLE`, as qemu-img's raw driver asks):
/// block status sees a raw layer as data throughout, so a sparse raw
/// source would otherwise be read whole, holes included. `None` when the
/// source is not a single raw file or its file system cannot tell (a
/// device, say): then everything is read and zero runs are skipped.
fn raw_data_ranges(src: &Disk) -> Option<Vec<(u64, u64)>> {
    let top = src.top();
    if src.depth() != 1 || top.cluster_bits().is_some() {
        return None;
    }
    // A second descriptor for the seeks: the image's locks are open file
    // description locks, which closing this one does not drop.
    let file = std::fs::File::open(top.path()).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let fd = file.as_raw_fd();
    let size = src.size();
    let mut ranges = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        let start = seek(fd, pos, libc::SEEK_DATA)?;
        let Some(start) = start.filter(|&s| s < size) else {
            break;
        };
        let end = seek(fd, start, libc::SEEK_HOLE)?.unwrap_or(size).min(size);
        if end <= start {
            return None;
        }
        ranges.push((start, end - start));
        pos = end;
    }
    Some(ranges)
}

/// `lseek(fd, at, whence)`: `Some(Some(offset))`, `Some(None)` when there
/// is no more data (`ENXIO`), `None` on any other error.
fn seek(fd: std::os::fd::RawFd, at: u64, whence: libc::c_int) -> Option<Option<u64>> {
    let at = libc::off_t::try_from(at).ok()?;
    // SAFETY: lseek on a descriptor the caller keeps open; no memory is
    // passed.
    let rc = unsafe { libc::lseek(fd, at, whence) };
    if rc >= 0 {
        return Some(Some(rc as u64));
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ENXIO) => Some(None),
        _ => None,
    }
}

/// Shared state of the copy threads.
struct Copy<'a> {
    src: &'a Disk,
    out: &'a Target,
    steps: &'a [(u64, u64)],
    /// Index of the next step to take.
    next: AtomicUsize,
    /// Index of the step whose turn it is to write. Reads run in parallel,
    /// writes in guest order, one at a time (as qemu-img's without `-W`):
    /// a qcow2 target then allocates its clusters in guest order, and
    /// writers of one file do not contend for its inode lock.
    turn: Mutex<usize>,
    turn_changed: Condvar,
    /// Set when a thread failed: the others stop.
    failed: AtomicBool,
}

/// Copies `steps` from `src` to `out` with [`WORKERS`] threads, reporting
/// progress from this thread. Returns the bytes written.
fn copy_steps(
    src: &Disk,
    out: &Target,
    steps: &[(u64, u64)],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64> {
    let size = src.size();
    let data: u64 = steps.iter().map(|s| s.1).sum();
    let mut done = size - data;
    progress(done, size);
    let copy = Copy {
        src,
        out,
        steps,
        next: AtomicUsize::new(0),
        turn: Mutex::new(0),
        turn_changed: Condvar::new(),
        failed: AtomicBool::new(false),
    };
    let workers = WORKERS.min(steps.len()).max(1);
    std::thread::scope(|scope| {
        let (sender, receiver) = mpsc::channel::<u64>();
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let sender = sender.clone();
                let copy = &copy;
                scope.spawn(move || copy.run(&sender))
            })
            .collect();
        drop(sender);
        for len in receiver {
            done += len;
            progress(done, size);
        }
        let mut written = 0;
        for handle in handles {
            written += handle
                .join()
                .map_err(|_| DiskError::Invalid("a convert copy thread panicked".into()))??;
        }
        Ok(written)
    })
}

impl Copy<'_> {
    /// One thread's loop: takes steps until none are left or one failed.
    fn run(&self, done: &mpsc::Sender<u64>) -> Result<u64> {
        let mut buf = crate::buf::AlignedBuf::zeroed(CHUNK as usize);
        let mut written = 0;
        loop {
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(&(at, len)) = self.steps.get(index) else {
                return Ok(written);
            };
            if self.failed.load(Ordering::Relaxed) {
                return Ok(written);
            }
            match self.step(&mut buf[..len as usize], at, index) {
                Ok(n) => written += n,
                Err(e) => {
                    self.failed.store(true, Ordering::Relaxed);
                    // Wake threads waiting for a turn that will not come.
                    let _turn = self.turn.lock();
                    self.turn_changed.notify_all();
                    return Err(e);
                }
            }
            // The receiver lives until every thread ends.
            let _ = done.send(len);
        }
    }

    /// Copies step `index` (`chunk.len()` bytes at `at`).
    fn step(&self, chunk: &mut [u8], at: u64, index: usize) -> Result<u64> {
        self.src.read_at(chunk, at)?;
        let mut turn = self.turn.lock();
        while *turn != index {
            if self.failed.load(Ordering::Relaxed) {
                return Ok(0);
            }
            self.turn_changed.wait(&mut turn);
        }
        drop(turn);
        let result = write_nonzero(
            &mut |b, o| self.out.write(b, o),
            chunk,
            at,
            self.out.zero_step(),
        );
        *self.turn.lock() += 1;
        self.turn_changed.notify_all();
        result
    }
}

/// Writes the parts of `chunk` that are not zero, in `step`-byte steps, so the
/// target stays sparse.
fn write_nonzero(
    out: &mut dyn FnMut(&[u8], u64) -> Result<()>,
    chunk: &[u8],
    at: u64,
    step: usize,
) -> Result<u64> {
    let mut written = 0;
    let mut i = 0;
    while i < chunk.len() {
        let mut j = i;
        while j < chunk.len() {
            let end = (j + step).min(chunk.len());
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
            i = (i + step).min(chunk.len());
        }
    }
    Ok(written)
}

/// Whether a buffer is all zeros.
pub fn is_zero(buf: &[u8]) -> bool {
    let (pre, mid, post) = unsafe { buf.align_to::<u128>() };
    pre.iter().all(|b| *b == 0) && mid.iter().all(|w| *w == 0) && post.iter().all(|b| *b == 0)
}

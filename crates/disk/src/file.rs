//! Positional I/O on one image file, with write-back of metadata.
//!
//! Guest data goes straight to the file ([`ImageFile::read_data`],
//! [`ImageFile::write_data`]). Everything else (headers, L1 and L2
//! entries, refcounts, the chain index) goes through
//! [`ImageFile::read_exact_at`] and [`ImageFile::write_all_at`]. While the
//! file is the top layer of a writer, small metadata writes are kept in
//! memory, 512-byte sector by sector, and written out by
//! [`ImageFile::sync`]. An allocating write then costs its data `pwrite` and
//! a few memory updates instead of three more system calls under the
//! writer lock; the first write after a snapshot allocates in every
//! cluster it touches, so this is what keeps snapshots cheap for I/O.
//!
//! Crash safety. Metadata in memory only ever points at data whose
//! `pwrite` completed before it was recorded. A sync copies the dirty
//! sectors, makes the data durable (`fdatasync`), writes the copy and
//! syncs again, so the file never points at data that is not on disk.
//! Between syncs the file holds the metadata of the last sync plus data
//! no table references yet: leaks, repaired on the next open for writing
//! (the image's dirty bit is set while a writer has it). Unflushed writes
//! may be lost in a crash, as the block protocols allow.
//!
//! Invariant: data and metadata never share a sector (both are whole
//! clusters of at least 512 bytes), and a cluster freed while writing is
//! never reused for data in the same session (new clusters come from the
//! end of the file). Debug builds check that data writes miss the dirty
//! sectors.

use std::collections::hash_map::Entry;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::error::{DiskError, Place, Result};
use crate::lock::{ImageLock, LockMode};

/// Dirty sectors by sector number. Every allocating write looks up a few,
/// so the map uses a fast hasher rather than the standard SipHash.
type DirtyMap = std::collections::HashMap<u64, Box<[u8]>, ahash::RandomState>;

/// Granularity of the metadata write-back.
const SECTOR: u64 = 512;
/// Writes this large go to the file even in write-back mode: they are
/// whole new tables (a zeroed L2 table, a refcount block, the index
/// region) that nothing points at yet.
const DIRECT_WRITE: usize = 4096;
/// Dirty sectors kept before a write forces a sync (32 MiB).
const MAX_DIRTY_SECTORS: usize = 65_536;

/// An open image file. Reads and writes are positional, so one handle is
/// shared by every thread without a lock.
#[derive(Debug)]
pub(crate) struct ImageFile {
    file: File,
    pub(crate) place: Place,
    /// Length including metadata not yet written out.
    len: AtomicU64,
    /// Length of the file itself.
    disk_len: AtomicU64,
    writable: bool,
    write_back: AtomicBool,
    /// Dirty metadata sectors by sector number.
    dirty: Mutex<DirtyMap>,
    dirty_count: AtomicUsize,
    /// One sync at a time.
    syncing: Mutex<()>,
    /// End of the space reserved by [`ImageFile::preallocate`].
    reserved: AtomicU64,
    /// Whether a sync waits for the disk (`fdatasync`). Off only for a
    /// convert target written with qemu-img's default cache mode
    /// `unsafe` (see [`ImageFile::set_flushes`]).
    flushes: AtomicBool,
    /// This opener's hold on the image's QEMU-compatible locks.
    lock: ImageLock,
}

/// Bytes reserved per `fallocate` ahead of allocating writes: 64 clusters
/// of 64 KiB, a bounded waste per layer.
pub(crate) const RESERVE_CHUNK: u64 = 4 << 20;

impl ImageFile {
    /// Opens `path` and takes the image locks of `lock` before anything
    /// reads or writes it: a refused opener changes no byte.
    pub(crate) fn open(
        path: &Path,
        depth: u32,
        writable: bool,
        lock: LockMode,
    ) -> Result<ImageFile> {
        debug_assert!(
            writable || lock != LockMode::Write,
            "a write lock on a file opened read-only"
        );
        let place = Place {
            depth,
            path: path.to_path_buf(),
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|e| DiskError::io(&place, "open", e))?;
        let lock = ImageLock::acquire(&file, path, lock)?;
        let meta = file
            .metadata()
            .map_err(|e| DiskError::io(&place, "stat", e))?;
        Ok(ImageFile {
            file,
            place,
            len: AtomicU64::new(meta.len()),
            disk_len: AtomicU64::new(meta.len()),
            writable,
            write_back: AtomicBool::new(false),
            dirty: Mutex::new(DirtyMap::default()),
            dirty_count: AtomicUsize::new(0),
            syncing: Mutex::new(()),
            reserved: AtomicU64::new(0),
            flushes: AtomicBool::new(true),
            lock,
        })
    }

    /// Gives up the write permissions of this opener's locks: the file
    /// became a backing file that nothing writes any more, so other
    /// processes may read it again.
    pub(crate) fn downgrade_lock(&self) -> Result<()> {
        self.lock.set_mode(LockMode::Read)
    }

    /// Keeps small metadata writes in memory until the next sync (the
    /// top layer while a writer has it), or, with `false`, writes them
    /// through again. Turning it off syncs first.
    pub(crate) fn set_write_back(&self, on: bool) -> Result<()> {
        if !on {
            self.write_back.store(false, Ordering::Release);
            return self.sync();
        }
        self.write_back.store(self.writable, Ordering::Release);
        Ok(())
    }

    pub(crate) fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    pub(crate) fn metadata(&self) -> Result<std::fs::Metadata> {
        self.file
            .metadata()
            .map_err(|e| DiskError::io(&self.place, "stat", e))
    }

    /// Reads exactly `buf.len()` bytes of metadata, dirty sectors
    /// included; the range must lie inside the file.
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
        if self.dirty_count.load(Ordering::Acquire) == 0 {
            return self.read_data(buf, offset);
        }
        // Under the lock: a sync removes sectors only after writing them.
        let dirty = self.dirty.lock();
        let end = offset + buf.len() as u64;
        let all_dirty = (offset / SECTOR..end.div_ceil(SECTOR)).all(|s| dirty.contains_key(&s));
        if !all_dirty {
            self.read_data(buf, offset)?;
        }
        patch_from(&dirty, buf, offset);
        Ok(())
    }

    /// Whether `len` bytes at `offset` read as zeros because nothing was
    /// ever written there: a hole of the file (or past its end) with no
    /// dirty sector in memory. `false` when unsure (the file system cannot
    /// tell its holes): the caller then reads.
    pub(crate) fn is_hole(&self, offset: u64, len: u64) -> bool {
        use std::os::fd::AsRawFd;
        let end = offset.saturating_add(len);
        if self.dirty_count.load(Ordering::Acquire) > 0 {
            let dirty = self.dirty.lock();
            let (first, last) = (offset / SECTOR, end.div_ceil(SECTOR));
            let touched = if (dirty.len() as u64) < last - first {
                dirty.keys().any(|s| (first..last).contains(s))
            } else {
                (first..last).any(|s| dirty.contains_key(&s))
            };
            if touched {
                return false;
            }
        }
        let file_end = self.disk_len.load(Ordering::Acquire);
        if offset >= file_end {
            return true;
        }
        let Ok(at) = i64::try_from(offset) else {
            return false;
        };
        // SAFETY: lseek on a file descriptor this struct owns; the file's
        // position is not used by anything else (every access is pread or
        // pwrite).
        let data = unsafe { libc::lseek(self.file.as_raw_fd(), at, libc::SEEK_DATA) };
        if data < 0 {
            // ENXIO: no data at or after `offset`.
            return std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
        }
        data as u64 >= end.min(file_end)
    }

    /// Reads guest data (never in a dirty sector) straight from the file,
    /// zeros past its end.
    pub(crate) fn read_data(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = self.disk_len.load(Ordering::Acquire);
        let have = len.saturating_sub(offset).min(buf.len() as u64) as usize;
        if have > 0 {
            self.file
                .read_exact_at(&mut buf[..have], offset)
                .map_err(|e| DiskError::io(&self.place, "read", e))?;
        }
        buf[have..].fill(0);
        Ok(())
    }

    /// Writes guest data straight to the file.
    pub(crate) fn write_data(&self, buf: &[u8], offset: u64) -> Result<()> {
        if !self.writable {
            return Err(DiskError::ReadOnly(self.place.path.clone()));
        }
        debug_assert!(
            !self.is_dirty(offset, buf.len() as u64),
            "data write at 0x{offset:x} over a dirty metadata sector"
        );
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| DiskError::io(&self.place, "write", e))?;
        let end = offset + buf.len() as u64;
        raise(&self.disk_len, end);
        raise(&self.len, end);
        Ok(())
    }

    /// Reserves `len` bytes at `offset` in the file system without writing
    /// them, so the small writes that later fill them land in one extent
    /// instead of fragmenting the file. Best effort: a file system without
    /// `fallocate` just gets the writes.
    ///
    /// Space is reserved [`RESERVE_CHUNK`] at a time beyond the end of the
    /// file (`FALLOC_FL_KEEP_SIZE`): one system call serves the next few
    /// dozen new clusters, where one per cluster cost about a tenth of the
    /// daemon's time right after a snapshot (every write then allocates).
    /// The file's size still grows only with what is written, so a crash
    /// leaves no tail of reserved clusters the allocator would skip.
    pub(crate) fn preallocate(&self, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        let end = offset.saturating_add(len);
        if !self.writable || end <= self.reserved.load(Ordering::Acquire) {
            return;
        }
        let chunk_end = end.max(offset.saturating_add(RESERVE_CHUNK));
        let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(chunk_end - offset)) else {
            return;
        };
        // SAFETY: fallocate on a file descriptor this struct owns.
        let rc =
            unsafe { libc::fallocate(self.file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, off, n) };
        if rc == 0 {
            self.reserved.fetch_max(chunk_end, Ordering::AcqRel);
        }
    }

    /// Asks the kernel to drop the file's cached pages. Best effort and
    /// only for clean pages: the caller has synced the file, and a page
    /// still dirty or under writeback just stays.
    pub(crate) fn drop_cached(&self) {
        use std::os::fd::AsRawFd;
        // SAFETY: posix_fadvise on a file descriptor this struct owns; it
        // reads no memory of ours.
        let rc =
            unsafe { libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            tracing::debug!(
                "{}: page cache not dropped (error {rc})",
                self.place.path.display()
            );
        }
    }

    /// Frees the space [`ImageFile::preallocate`] reserved past the end of
    /// the file. Best effort: truncating to the current size drops blocks
    /// reserved beyond it (ext4 and XFS do); the content is unchanged.
    pub(crate) fn release_reserved(&self) {
        if self.reserved.load(Ordering::Acquire) == 0 {
            return;
        }
        // The size the file system has, not our count: nothing is cut.
        if let Ok(meta) = self.file.metadata() {
            if self.file.set_len(meta.len()).is_ok() {
                self.reserved.store(0, Ordering::Release);
            }
        }
    }

    /// Writes metadata: into memory in write-back mode (small writes),
    /// else to the file.
    pub(crate) fn write_all_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        if !self.writable {
            return Err(DiskError::ReadOnly(self.place.path.clone()));
        }
        let end = offset + buf.len() as u64;
        let direct = !self.write_back.load(Ordering::Acquire) || buf.len() >= DIRECT_WRITE;
        if direct {
            let mut dirty = self.dirty.lock();
            if !partly_covers(&dirty, offset, end) {
                self.file
                    .write_all_at(buf, offset)
                    .map_err(|e| DiskError::io(&self.place, "write", e))?;
                raise(&self.disk_len, end);
                raise(&self.len, end);
                // What the file now holds supersedes those sectors.
                if !dirty.is_empty() {
                    for s in offset / SECTOR..end.div_ceil(SECTOR) {
                        self.drop_or_update(&mut dirty, s, buf, offset);
                    }
                }
                return Ok(());
            }
        }
        let count = {
            let mut dirty = self.dirty.lock();
            for s in offset / SECTOR..end.div_ceil(SECTOR) {
                let sector = match dirty.entry(s) {
                    Entry::Occupied(e) => e.into_mut(),
                    Entry::Vacant(e) => {
                        let mut fresh = vec![0u8; SECTOR as usize].into_boxed_slice();
                        self.read_data(&mut fresh, s * SECTOR)?;
                        e.insert(fresh)
                    }
                };
                copy_into_sector(sector, s, buf, offset);
            }
            raise(&self.len, end);
            self.dirty_count.store(dirty.len(), Ordering::Release);
            dirty.len()
        };
        if count > MAX_DIRTY_SECTORS {
            self.sync()?;
        }
        Ok(())
    }

    /// After a direct write over sector `s`: a sector the write covers
    /// whole is dropped, one it covers in part takes the new bytes.
    fn drop_or_update(&self, dirty: &mut DirtyMap, s: u64, buf: &[u8], offset: u64) {
        let start = s * SECTOR;
        let end = offset + buf.len() as u64;
        if offset <= start && start + SECTOR <= end {
            dirty.remove(&s);
        } else if let Some(sector) = dirty.get_mut(&s) {
            copy_into_sector(sector, s, buf, offset);
        }
        self.dirty_count.store(dirty.len(), Ordering::Release);
    }

    fn is_dirty(&self, offset: u64, len: u64) -> bool {
        if self.dirty_count.load(Ordering::Acquire) == 0 || len == 0 {
            return false;
        }
        let dirty = self.dirty.lock();
        (offset / SECTOR..(offset + len).div_ceil(SECTOR)).any(|s| dirty.contains_key(&s))
    }

    /// Makes every write so far durable: data first, then the metadata
    /// that points at it.
    pub(crate) fn sync(&self) -> Result<()> {
        let _one = self.syncing.lock();
        if self.dirty_count.load(Ordering::Acquire) == 0 {
            return self.fdatasync();
        }
        // Only metadata recorded by now is written out: it points at data
        // whose writes completed, which the first fdatasync makes durable.
        let mut copy: Vec<(u64, Box<[u8]>)> = self
            .dirty
            .lock()
            .iter()
            .map(|(s, b)| (*s, b.clone()))
            .collect();
        copy.sort_unstable_by_key(|(s, _)| *s);
        self.fdatasync()?;
        {
            let mut dirty = self.dirty.lock();
            // A sector a direct write superseded meanwhile is no longer
            // dirty: the file already holds newer bytes there.
            copy.retain(|(s, _)| dirty.contains_key(s));
            for run in copy.chunk_by(|a, b| a.0 + 1 == b.0) {
                let bytes: Vec<u8> = run.iter().flat_map(|(_, b)| b.iter().copied()).collect();
                let at = run[0].0 * SECTOR;
                self.file
                    .write_all_at(&bytes, at)
                    .map_err(|e| DiskError::io(&self.place, "write", e))?;
                self.disk_len
                    .fetch_max(at + bytes.len() as u64, Ordering::AcqRel);
            }
            for (s, b) in &copy {
                if dirty.get(s).is_some_and(|now| now == b) {
                    dirty.remove(s);
                }
            }
            self.dirty_count.store(dirty.len(), Ordering::Release);
        }
        self.fdatasync()
    }

    /// Forgets the metadata not yet written out, for a file about to be
    /// removed: nothing of it is written, now or when it is dropped.
    pub(crate) fn forget_dirty(&self) {
        let _one = self.syncing.lock();
        let mut dirty = self.dirty.lock();
        dirty.clear();
        self.dirty_count.store(0, Ordering::Release);
    }

    /// With `false`, a sync still writes everything out in the same order
    /// (data, then the metadata pointing at it, then whatever follows)
    /// but no longer waits for the disk: qemu's cache mode `unsafe`. The
    /// file is whole and consistent for every reader as long as the
    /// machine does not crash; a crash may leave it with any mix of what
    /// was written, so this is only for a new image nobody uses yet and
    /// whose creator can start again (`img convert`'s target).
    pub(crate) fn set_flushes(&self, on: bool) {
        self.flushes.store(on, Ordering::Release);
    }

    fn fdatasync(&self) -> Result<()> {
        if !self.flushes.load(Ordering::Acquire) {
            return Ok(());
        }
        self.file
            .sync_data()
            .map_err(|e| DiskError::io(&self.place, "fdatasync", e))
    }
}

impl Drop for ImageFile {
    fn drop(&mut self) {
        // Best effort: a writer syncs on close; this only catches an error
        // path that dropped the file with metadata still in memory.
        if self.dirty_count.load(Ordering::Acquire) > 0 {
            let _ = self.sync();
        }
    }
}

/// Whether the first or last sector of `offset..end` is dirty and only
/// partly covered: a direct write there would leave the file with a sector
/// that mixes new bytes with bytes older than the last sync, so such a
/// write goes through memory instead.
fn partly_covers(dirty: &DirtyMap, offset: u64, end: u64) -> bool {
    if dirty.is_empty() {
        return false;
    }
    let (first, last) = (offset / SECTOR, (end - 1) / SECTOR);
    (!offset.is_multiple_of(SECTOR) && dirty.contains_key(&first))
        || (!end.is_multiple_of(SECTOR) && dirty.contains_key(&last))
}

/// Copies the part of `buf` (at file offset `offset`) that falls in
/// sector `s` into it.
fn copy_into_sector(sector: &mut [u8], s: u64, buf: &[u8], offset: u64) {
    let start = (s * SECTOR).max(offset);
    let end = ((s + 1) * SECTOR).min(offset + buf.len() as u64);
    if start >= end {
        return;
    }
    let src = &buf[(start - offset) as usize..(end - offset) as usize];
    let at = (start - s * SECTOR) as usize;
    sector[at..at + src.len()].copy_from_slice(src);
}

/// Overwrites `buf` (file offset `offset`) with the dirty sectors it
/// overlaps.
fn patch_from(dirty: &DirtyMap, buf: &mut [u8], offset: u64) {
    if dirty.is_empty() || buf.is_empty() {
        return;
    }
    let end = offset + buf.len() as u64;
    for s in offset / SECTOR..end.div_ceil(SECTOR) {
        let Some(sector) = dirty.get(&s) else {
            continue;
        };
        let start = (s * SECTOR).max(offset);
        let stop = ((s + 1) * SECTOR).min(end);
        let from = (start - s * SECTOR) as usize;
        buf[(start - offset) as usize..(stop - offset) as usize]
            .copy_from_slice(&sector[from..from + (stop - start) as usize]);
    }
}

/// Raises `length` to at least `end`. Most writes land inside the file, so
/// a plain load first keeps them from taking the shared cache line for
/// writing, which every I/O thread would otherwise pass back and forth.
fn raise(length: &AtomicU64, end: u64) {
    if length.load(Ordering::Acquire) < end {
        length.fetch_max(end, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Metadata lives in the first 64 sectors, data in the next 64 (the
    /// engine never mixes them within a sector).
    const META_END: u64 = 64 * SECTOR;
    const FILE_END: u64 = 128 * SECTOR;

    #[derive(Debug, Clone)]
    enum Op {
        Meta { at: u64, len: usize, byte: u8 },
        Data { sector: u64, sectors: u64, byte: u8 },
        Read { at: u64, len: usize },
        Sync,
        WriteBack(bool),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..META_END, 1usize..5000, any::<u8>()).prop_map(|(at, len, byte)| Op::Meta {
                at,
                len: len.min((META_END - at) as usize),
                byte
            }),
            2 => (64u64..128, 1u64..8, any::<u8>()).prop_map(|(sector, n, byte)| Op::Data {
                sector,
                sectors: n.min(128 - sector),
                byte
            }),
            2 => (0..FILE_END, 1usize..3000).prop_map(|(at, len)| Op::Read {
                at,
                len: len.min((FILE_END - at) as usize)
            }),
            1 => Just(Op::Sync),
            1 => any::<bool>().prop_map(Op::WriteBack),
        ]
    }

    /// A direct write that supersedes dirty sectors while a sync runs must
    /// not be overwritten by the sync's older copy of them.
    #[test]
    fn a_sync_racing_a_direct_write_keeps_the_newer_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![0u8; 64 * 1024]).unwrap();
        let f = std::sync::Arc::new(ImageFile::open(&path, 1, true, LockMode::Write).unwrap());
        f.set_write_back(true).unwrap();
        for round in 0..200u32 {
            let old = (round % 250) as u8 + 1;
            f.write_all_at(&[old; 100], 8192).unwrap(); // dirty, in memory
            let syncer = {
                let f = f.clone();
                std::thread::spawn(move || f.sync().unwrap())
            };
            let new = vec![old.wrapping_add(1); DIRECT_WRITE];
            // Aim at the sync's first fdatasync, after it copied the sectors.
            std::thread::sleep(std::time::Duration::from_micros(u64::from(round % 8) * 100));
            f.write_all_at(&new, 8192).unwrap(); // whole sectors, direct
            syncer.join().unwrap();
            f.sync().unwrap();
            let disk = std::fs::read(&path).unwrap();
            assert!(
                disk[8192..8192 + DIRECT_WRITE] == new[..],
                "round {round}: a sync wrote older bytes over a direct write"
            );
        }
    }

    /// A hole is a range nothing was written to: neither the file nor a
    /// dirty sector in memory.
    #[test]
    fn a_hole_is_told_apart_from_written_and_dirty_ranges() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(4 << 20)
            .unwrap();
        let f = ImageFile::open(&path, 1, true, LockMode::Write).unwrap();
        assert!(f.is_hole(0, 4 << 20), "a new sparse file");
        assert!(f.is_hole(8 << 20, 4096), "past the end");
        f.write_all_at(&[7; 4096], 1 << 20).unwrap();
        assert!(!f.is_hole(0, 2 << 20), "a range with a direct write");
        assert!(f.is_hole(2 << 20, 1 << 20), "a range after it");
        f.set_write_back(true).unwrap();
        f.write_all_at(&[9; 100], 3 << 20).unwrap(); // dirty, in memory
        assert!(!f.is_hole(3 << 20, 1 << 20), "a range with a dirty sector");
        f.sync().unwrap();
        assert!(!f.is_hole(3 << 20, 1 << 20), "the same, written out");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Reads always see every write. The file itself holds every data
        /// write at once; each metadata sector in it holds a content that
        /// sector really had since the last sync (never a mix of old and
        /// new bytes); after a sync it holds everything.
        #[test]
        fn write_back_reads_and_persists_like_a_plain_file(ops in proptest::collection::vec(op(), 1..60)) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("f");
            // Sparse: its holes are what `is_hole` must tell apart.
            std::fs::File::create(&path).unwrap().set_len(FILE_END).unwrap();
            let f = ImageFile::open(&path, 1, true, LockMode::Write).unwrap();
            f.set_write_back(true).unwrap();
            let mut model = vec![0u8; FILE_END as usize];
            let sector = |m: &[u8], s: u64| m[(s * SECTOR) as usize..((s + 1) * SECTOR) as usize].to_vec();
            // Per metadata sector: every content it had since the last sync.
            let mut history: Vec<Vec<Vec<u8>>> =
                (0..META_END / SECTOR).map(|s| vec![sector(&model, s)]).collect();
            for op in ops {
                match op {
                    Op::Meta { at, len, byte } => {
                        f.write_all_at(&vec![byte; len], at).unwrap();
                        model[at as usize..at as usize + len].fill(byte);
                    }
                    Op::Data { sector, sectors, byte } => {
                        let (at, len) = (sector * SECTOR, (sectors * SECTOR) as usize);
                        f.write_data(&vec![byte; len], at).unwrap();
                        model[at as usize..at as usize + len].fill(byte);
                    }
                    Op::Read { at, len } => {
                        let mut buf = vec![0u8; len];
                        f.read_exact_at(&mut buf, at).unwrap();
                        prop_assert!(buf == model[at as usize..at as usize + len]);
                        if f.is_hole(at, len as u64) {
                            prop_assert!(
                                buf.iter().all(|b| *b == 0),
                                "0x{:x}+{} called a hole holds data", at, len
                            );
                        }
                    }
                    Op::Sync => f.sync().unwrap(),
                    Op::WriteBack(on) => f.set_write_back(on).unwrap(),
                }
                for (s, h) in history.iter_mut().enumerate() {
                    let now = sector(&model, s as u64);
                    if f.dirty_count.load(Ordering::Acquire) == 0 {
                        *h = vec![now];
                    } else if h.last() != Some(&now) {
                        h.push(now);
                    }
                }
                let disk = std::fs::read(&path).unwrap();
                prop_assert!(disk[META_END as usize..] == model[META_END as usize..]);
                for (s, h) in history.iter().enumerate() {
                    let on_disk = sector(&disk, s as u64);
                    prop_assert!(
                        h.contains(&on_disk),
                        "metadata sector {} on disk holds a content it never had", s
                    );
                }
            }
            f.sync().unwrap();
            prop_assert!(std::fs::read(&path).unwrap() == model);
        }
    }
}

//! Local replicas checked once and then pinned in memory, so that a GET
//! of a hot object sends it without reading every byte again.
//!
//! A whole GET of a local replica is checked against the record's
//! CRC-32C before `sendfile` sends it ([`super::local`]); reading each
//! byte to sum it was 16–18% of the gateway's CPU under large GETs. The
//! check exists because the disk may return other bytes than were
//! written; the page cache does not change them. So a replica of at least
//! [`PIN_FROM`] bytes is mapped and locked in memory (`mlock`), *then*
//! summed: the pinned pages are the bytes that passed, and no eviction
//! can swap them for another read from the disk while they stay pinned.
//! A later GET of the same replica finds its pages pinned and sends them
//! unread. This is what Ceph's BlueStore does for its cache, whose
//! buffers were checked when they were read from the disk.
//!
//! A pinned replica is sent only while its file is the one that was
//! pinned: same device and inode, size, and modification and change
//! times (`ctime` moves on any write, and no caller can set it back).
//! The store never writes a replica after it renamed it into place, so a
//! change is somebody else's, and the replica is checked again.
//!
//! Pinned bytes are bounded by a budget (`strata store up
//! --s3-pinned`), least recently used out first. A replica whose object
//! is deleted through this process's client is let go at once
//! ([`PinnedReplicas::forget`]); one deleted otherwise (another client,
//! an overwrite) when its file is seen unlinked, by the sweep
//! [`super::local::LocalDisk::sweep_pins`] runs or at the next pin.
//!
//! A process that may not lock memory (`RLIMIT_MEMLOCK`, without
//! `CAP_IPC_LOCK`) checks every GET as before.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use strata_store_protocol::addr::Addr;

/// Replicas smaller than this are checked on every GET: their sum costs
/// about what pinning them would (a MiB sums in about 60 µs here).
pub const PIN_FROM: u64 = 1 << 20;

/// How often `strata store up` looks for pinned replicas whose files
/// were deleted ([`super::local::LocalDisk::sweep_pins`]).
pub const SWEEP_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

/// The default budget: 1 GiB, or an eighth of the machine's memory if
/// that is less.
pub fn default_budget() -> u64 {
    // SAFETY: sysconf reads a system value and touches no memory of ours.
    let (pages, page_size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let memory = u64::try_from(pages)
        .unwrap_or(0)
        .saturating_mul(u64::try_from(page_size).unwrap_or(0));
    (memory / 8).min(1 << 30)
}

/// What identifies a replica file's content as pinned: a file replaced,
/// rewritten or truncated differs in one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    device: u64,
    inode: u64,
    length: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

impl FileIdentity {
    /// The identity of `file` now.
    pub fn of(file: &File) -> std::io::Result<FileIdentity> {
        Ok(FileIdentity::from_metadata(&file.metadata()?))
    }

    /// The identity of the file at `path` now, without opening it.
    pub fn of_path(path: &std::path::Path) -> std::io::Result<FileIdentity> {
        Ok(FileIdentity::from_metadata(&std::fs::metadata(path)?))
    }

    fn from_metadata(meta: &std::fs::Metadata) -> FileIdentity {
        FileIdentity {
            device: meta.dev(),
            inode: meta.ino(),
            length: meta.len(),
            modified: (meta.mtime(), meta.mtime_nsec()),
            changed: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// A replica's data, mapped and locked, with what it was checked as.
struct Pinned {
    /// Unmapped (and so unlocked) when dropped.
    _map: memmap2::Mmap,
    /// The file, to tell when it is deleted, and to send from.
    file: std::sync::Arc<File>,
    /// Where the replica's data starts in it.
    offset: u64,
    identity: FileIdentity,
    size: u64,
    crc: u32,
    last_used: u64,
}

#[derive(Default)]
struct State {
    entries: HashMap<Addr, Pinned>,
    bytes: u64,
    clock: u64,
}

/// The pinned replicas of one process, within a budget of bytes.
pub struct PinnedReplicas {
    budget: u64,
    state: Mutex<State>,
    /// The process may not lock memory: pin nothing.
    refused: std::sync::atomic::AtomicBool,
    hits: AtomicU64,
    pinned_total: AtomicU64,
}

/// What [`PinnedReplicas::stats`] shows for `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PinnedStats {
    /// Bytes pinned now.
    pub bytes: u64,
    /// Replicas pinned now.
    pub replicas: u64,
    /// GETs sent from a pinned replica without reading it.
    pub hits: u64,
    /// Replicas pinned since the start.
    pub pinned_total: u64,
}

/// A replica mapped and locked, and the CRC-32C of its bytes as they are
/// locked: what [`PinnedReplicas::admit`] keeps if they pass.
pub struct Locked {
    map: memmap2::Mmap,
    /// Where the locked bytes start in their file.
    offset: u64,
    /// The sum of the locked bytes.
    pub crc: u32,
    /// Whether the pages are locked (false: the process may not lock
    /// memory; the sum is good for this GET only).
    pub locked: bool,
}

impl PinnedReplicas {
    /// Pins up to `budget` bytes (0: none).
    pub fn new(budget: u64) -> PinnedReplicas {
        PinnedReplicas {
            budget,
            state: Mutex::new(State::default()),
            refused: false.into(),
            hits: AtomicU64::new(0),
            pinned_total: AtomicU64::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a replica of `size` bytes should be pinned when checked.
    pub fn wants(&self, size: u64) -> bool {
        size >= PIN_FROM && size <= self.budget && !self.refused.load(Ordering::Relaxed)
    }

    /// Whether [`PinnedReplicas::pinned_file`] finds the replica pinned.
    #[cfg(test)]
    fn hit(&self, addr: Addr, identity: FileIdentity, size: u64, crc: u32) -> bool {
        self.pinned_file(addr, identity, size, crc).is_some()
    }

    /// If the replica at `addr`, whose file is now `identity`, is pinned
    /// as the bytes of an object of `size` bytes summing to `crc`, the
    /// pinned file with where its data starts: a GET may send from it
    /// unread, without opening the replica again. A pinned replica whose
    /// file changed is let go.
    pub fn pinned_file(
        &self,
        addr: Addr,
        identity: FileIdentity,
        size: u64,
        crc: u32,
    ) -> Option<(std::sync::Arc<File>, u64)> {
        let mut state = self.state();
        state.clock += 1;
        let now = state.clock;
        let entry = state.entries.get_mut(&addr)?;
        if entry.identity == identity && entry.size == size && entry.crc == crc {
            entry.last_used = now;
            let found = (entry.file.clone(), entry.offset);
            drop(state);
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Some(found);
        }
        if let Some(gone) = state.entries.remove(&addr) {
            state.bytes -= gone.size;
        }
        None
    }

    /// Keeps `locked` (the replica at `addr`, of `size` bytes, in `file`,
    /// `identity` when it was mapped) pinned if its sum is `crc` and it is
    /// locked. Replicas deleted since they were pinned are let go first,
    /// then the least recently used, to make room.
    pub fn admit(
        &self,
        addr: Addr,
        file: std::sync::Arc<File>,
        identity: FileIdentity,
        (size, crc): (u64, u32),
        locked: Locked,
    ) {
        if !locked.locked || locked.crc != crc || !self.wants(size) {
            return;
        }
        self.let_go_of_deleted();
        let mut state = self.state();
        if let Some(old) = state.entries.remove(&addr) {
            state.bytes -= old.size;
        }
        while state.bytes + size > self.budget {
            let Some(oldest) = state
                .entries
                .iter()
                .min_by_key(|(_, entry)| entry.last_used)
                .map(|(addr, _)| *addr)
            else {
                break;
            };
            if let Some(gone) = state.entries.remove(&oldest) {
                state.bytes -= gone.size;
            }
        }
        state.clock += 1;
        let last_used = state.clock;
        state.bytes += size;
        state.entries.insert(
            addr,
            Pinned {
                _map: locked.map,
                file,
                offset: locked.offset,
                identity,
                size,
                crc,
                last_used,
            },
        );
        debug_assert!(state.bytes <= self.budget, "pinned past the budget");
        self.pinned_total.fetch_add(1, Ordering::Relaxed);
    }

    /// Lets go of the replica at `addr`, if pinned: its object was
    /// deleted, so no GET will ask for it again.
    pub fn forget(&self, addr: Addr) {
        let mut state = self.state();
        if let Some(gone) = state.entries.remove(&addr) {
            state.bytes -= gone.size;
        }
    }

    /// Lets go of every pinned replica whose file was deleted since
    /// (deleted or overwritten objects, by any client): its pages are
    /// read by nobody and only hold memory. Returns how many went. The
    /// files are looked at without the lock, which GETs take.
    pub fn let_go_of_deleted(&self) -> usize {
        let held: Vec<(Addr, std::sync::Arc<File>)> = self
            .state()
            .entries
            .iter()
            .map(|(addr, entry)| (*addr, entry.file.clone()))
            .collect();
        let deleted: Vec<(Addr, std::sync::Arc<File>)> = held
            .into_iter()
            .filter(|(_, file)| file.metadata().is_ok_and(|m| m.nlink() == 0))
            .collect();
        let mut state = self.state();
        let mut gone = 0;
        for (addr, file) in deleted {
            // Only the entry that was looked at: the replica may have
            // been pinned again from another file meanwhile.
            let same = state
                .entries
                .get(&addr)
                .is_some_and(|entry| std::sync::Arc::ptr_eq(&entry.file, &file));
            if let Some(entry) = same.then(|| state.entries.remove(&addr)).flatten() {
                state.bytes -= entry.size;
                gone += 1;
            }
        }
        gone
    }

    /// Maps `length` bytes of `file` from `offset`, locks them in memory
    /// and sums them (blocking: the first read of a cold file waits on
    /// the disk). The file must hold `offset + length` bytes and never
    /// shrink, as a replica file never does.
    pub fn lock_and_sum(&self, file: &File, offset: u64, length: u64) -> std::io::Result<Locked> {
        // The pinned map is read only here, before it is kept.
        let map = map_replica(file, offset, length)?;
        // Locked first, summed after: the sum is of the pages that stay.
        let locked = match map.lock() {
            Ok(()) => true,
            Err(e) => {
                if !self.refused.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        "this process may not lock memory ({e}): local replicas are checked on \
                         every GET (raise RLIMIT_MEMLOCK, or run with CAP_IPC_LOCK, to pin them)"
                    );
                }
                false
            }
        };
        let crc = crc32c::crc32c(&map);
        Ok(Locked {
            map,
            offset,
            crc,
            locked,
        })
    }

    /// What is pinned now, and how often it served.
    pub fn stats(&self) -> PinnedStats {
        let state = self.state();
        PinnedStats {
            bytes: state.bytes,
            replicas: state.entries.len() as u64,
            hits: self.hits.load(Ordering::Relaxed),
            pinned_total: self.pinned_total.load(Ordering::Relaxed),
        }
    }
}

/// A read-only map of `length` bytes of the replica file `file` from
/// `offset`, its pages read in: an error, not a fault, if the file is
/// shorter. The file must never shrink while mapped, as a replica file
/// never does.
pub(super) fn map_replica(file: &File, offset: u64, length: u64) -> std::io::Result<memmap2::Mmap> {
    let file_length = file.metadata()?.len();
    if offset
        .checked_add(length)
        .is_none_or(|end| end > file_length)
    {
        // A map past the end would fault on its first read.
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{length} bytes from {offset} wanted of a file of {file_length}"),
        ));
    }
    let length = usize::try_from(length).map_err(std::io::Error::other)?;
    // SAFETY: a map of a file is sound while nobody shrinks the file
    // under it (a read past its end faults). The store writes a replica
    // whole under a temporary name, renames it into place and never
    // writes or truncates it again (deleting unlinks it, which a map
    // survives), and the file held `offset + length` bytes just above.
    unsafe {
        memmap2::MmapOptions::new()
            .offset(offset)
            .len(length)
            .populate()
            .map(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A file holding `bytes`, named (a replica file is: an unnamed one
    /// counts as deleted), in a directory removed on drop.
    fn file_of(bytes: &[u8]) -> (tempfile::TempDir, std::sync::Arc<File>) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("replica");
        let mut file = File::options()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&path)
            .expect("a file");
        file.write_all(bytes).expect("writing");
        (dir, std::sync::Arc::new(file))
    }

    #[test]
    fn a_pinned_replica_hits_until_its_file_changes() {
        let pinned = PinnedReplicas::new(8 << 20);
        let data = vec![7u8; PIN_FROM as usize];
        let (_dir, file) = file_of(&data);
        let crc = crc32c::crc32c(&data);
        let locked = pinned.lock_and_sum(&file, 0, PIN_FROM).expect("mapped");
        assert_eq!(locked.crc, crc);
        if !locked.locked {
            // Not allowed to lock memory here: nothing to test.
            return;
        }
        let identity = FileIdentity::of(&file).unwrap();
        pinned.admit(1, file.clone(), identity, (PIN_FROM, crc), locked);
        assert!(pinned.hit(1, identity, PIN_FROM, crc));
        assert!(
            !pinned.hit(1, identity, PIN_FROM, crc ^ 1),
            "another record"
        );
        // Let go on the mismatch above.
        assert!(!pinned.hit(1, identity, PIN_FROM, crc));
        assert_eq!(pinned.stats().bytes, 0);

        let locked = pinned.lock_and_sum(&file, 0, PIN_FROM).unwrap();
        pinned.admit(1, file.clone(), identity, (PIN_FROM, crc), locked);
        std::thread::sleep(std::time::Duration::from_millis(10));
        file.write_all_at_start(b"x");
        let changed = FileIdentity::of(&file).unwrap();
        assert_ne!(changed, identity, "a write moves the change time");
        assert!(!pinned.hit(1, changed, PIN_FROM, crc));
    }

    #[test]
    fn a_bad_sum_is_not_pinned_and_the_budget_holds() {
        let pinned = PinnedReplicas::new(3 * PIN_FROM);
        let data = vec![1u8; PIN_FROM as usize];
        let (_dir, file) = file_of(&data);
        let identity = FileIdentity::of(&file).unwrap();
        let crc = crc32c::crc32c(&data);
        let locked = pinned.lock_and_sum(&file, 0, PIN_FROM).unwrap();
        if !locked.locked {
            return;
        }
        pinned.admit(9, file.clone(), identity, (PIN_FROM, crc ^ 1), locked);
        assert_eq!(
            pinned.stats().replicas,
            0,
            "a replica that failed is pinned"
        );
        for n in 0..5 {
            let locked = pinned.lock_and_sum(&file, 0, PIN_FROM).unwrap();
            pinned.admit(n, file.clone(), identity, (PIN_FROM, crc), locked);
            assert!(pinned.stats().bytes <= 3 * PIN_FROM);
        }
        let stats = pinned.stats();
        assert_eq!((stats.replicas, stats.bytes), (3, 3 * PIN_FROM));
        assert!(!pinned.hit(0, identity, PIN_FROM, crc), "the oldest went");
        assert!(pinned.hit(4, identity, PIN_FROM, crc));
        assert!(!pinned.wants(4 * PIN_FROM), "larger than the budget");
        assert!(!pinned.wants(PIN_FROM - 1), "too small to pin");
    }

    #[test]
    fn a_deleted_replica_is_let_go_when_another_is_pinned() {
        let pinned = PinnedReplicas::new(8 << 20);
        let dir = tempfile::tempdir().unwrap();
        let data = vec![3u8; PIN_FROM as usize];
        let crc = crc32c::crc32c(&data);
        let pin = |n: Addr, path: &std::path::Path| {
            std::fs::write(path, &data).unwrap();
            let file = std::sync::Arc::new(File::open(path).unwrap());
            let identity = FileIdentity::of(&file).unwrap();
            let locked = pinned.lock_and_sum(&file, 0, PIN_FROM).unwrap();
            let was_locked = locked.locked;
            pinned.admit(n, file, identity, (PIN_FROM, crc), locked);
            was_locked
        };
        if !pin(1, &dir.path().join("one")) {
            return;
        }
        std::fs::remove_file(dir.path().join("one")).unwrap();
        pin(2, &dir.path().join("two"));
        let stats = pinned.stats();
        assert_eq!((stats.replicas, stats.bytes), (1, PIN_FROM));
    }

    #[test]
    fn deleted_replicas_are_let_go_by_a_sweep_and_a_forgotten_one_at_once() {
        let pinned = PinnedReplicas::new(8 << 20);
        let dir = tempfile::tempdir().unwrap();
        let data = vec![5u8; PIN_FROM as usize];
        let crc = crc32c::crc32c(&data);
        let mut identities = Vec::new();
        for n in 0..3 {
            let path = dir.path().join(format!("replica-{n}"));
            std::fs::write(&path, &data).unwrap();
            let file = std::sync::Arc::new(File::open(&path).unwrap());
            let identity = FileIdentity::of(&file).unwrap();
            let locked = pinned.lock_and_sum(&file, 0, PIN_FROM).unwrap();
            if !locked.locked {
                return; // may not lock memory here: nothing to test
            }
            pinned.admit(n, file, identity, (PIN_FROM, crc), locked);
            identities.push(identity);
        }
        assert_eq!(pinned.let_go_of_deleted(), 0, "nothing deleted yet");
        std::fs::remove_file(dir.path().join("replica-1")).unwrap();
        assert_eq!(pinned.let_go_of_deleted(), 1);
        pinned.forget(2);
        pinned.forget(7); // never pinned: nothing happens
        let stats = pinned.stats();
        assert_eq!((stats.replicas, stats.bytes), (1, PIN_FROM));
        assert!(pinned.hit(0, identities[0], PIN_FROM, crc));
        assert!(!pinned.hit(1, identities[1], PIN_FROM, crc));
        assert!(!pinned.hit(2, identities[2], PIN_FROM, crc));
    }

    #[test]
    fn a_region_past_the_end_is_an_error() {
        let pinned = PinnedReplicas::new(8 << 20);
        let (_dir, file) = file_of(&[1; 4096]);
        assert!(pinned.lock_and_sum(&file, 0, 3 * 4096 + 1).is_err());
        assert!(pinned.lock_and_sum(&file, u64::MAX, 2).is_err());
    }

    trait WriteAtStart {
        fn write_all_at_start(&self, bytes: &[u8]);
    }

    impl WriteAtStart for File {
        fn write_all_at_start(&self, bytes: &[u8]) {
            use std::os::unix::fs::FileExt;
            self.write_all_at(bytes, 0).expect("writing");
        }
    }
}

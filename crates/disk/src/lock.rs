//! Image locks that QEMU honours, and that honour QEMU's.
//!
//! QEMU (`block/file-posix.c`) guards every image file it opens with
//! open-file-description (OFD) byte-range locks, all of them shared
//! (`F_RDLCK`) locks on single bytes:
//!
//! - byte `100 + bit` for each permission the opener *holds*;
//! - byte `200 + bit` for each permission the opener *does not share*
//!   with other openers.
//!
//! The permission bits are consistent read (0), write (1), unchanged
//! write (2) and resize (3). An opener first takes its bytes, then tests
//! the others' bytes: a permission it holds conflicts with anyone holding
//! the matching "not shared" byte, and a permission it does not share
//! conflicts with anyone holding the matching "held" byte. Taking first
//! and testing after means two openers racing each other cannot both
//! miss the other: at worst both are refused.
//!
//! Observed from QEMU 10 in `/proc/locks`: a writer holds 100, 101, 103
//! and 201, 203 (it shares reads and unchanged writes); a reader and every
//! backing file hold 100 and 201, 203; a reader with `force-share` holds
//! 100 only. Strata takes exactly the same bytes, so QEMU tools and Strata
//! processes refuse each other as QEMU refuses itself.
//!
//! OFD locks belong to an open file description, not to a process: they
//! are dropped by the kernel as soon as the last descriptor closes, kill
//! -9 included. Within one process, two descriptions of one file would
//! lock each other out, so every opener of a file in this process shares
//! one lock description through a registry, which holds the union of
//! their bytes. Openers inside one process are coordinated by the process
//! itself (the volume service's compaction writes layers its disks read);
//! the locks keep *other* processes out.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use parking_lot::Mutex;

use crate::error::{DiskError, Result};

/// QEMU's permission bits, as lock byte offsets from the bases below.
const PERM_CONSISTENT_READ: u8 = 1 << 0;
const PERM_WRITE: u8 = 1 << 1;
const PERM_WRITE_UNCHANGED: u8 = 1 << 2;
const PERM_RESIZE: u8 = 1 << 3;
/// Every permission bit Strata knows; QEMU 10 has no others.
const PERM_ALL: u8 = PERM_CONSISTENT_READ | PERM_WRITE | PERM_WRITE_UNCHANGED | PERM_RESIZE;
/// Number of permission bits.
const PERM_BITS: u8 = 4;

/// First byte of the "permission held" locks.
const HELD_BASE: i64 = 100;
/// First byte of the "permission not shared" locks.
const UNSHARED_BASE: i64 = 200;

/// How an opener uses an image, which decides the bytes it locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Reads and writes, and may grow the file; shares only reads.
    Write,
    /// Reads; other readers are welcome, writers are not (a backing file,
    /// or an image opened read-only).
    Read,
    /// Reads whatever others do to the image (qemu-img's `-U`,
    /// `--force-share`): refuses nobody, and nobody refuses it.
    ForceShare,
}

impl LockMode {
    /// Permissions this mode holds.
    fn held(self) -> u8 {
        match self {
            LockMode::Write => PERM_CONSISTENT_READ | PERM_WRITE | PERM_RESIZE,
            LockMode::Read | LockMode::ForceShare => PERM_CONSISTENT_READ,
        }
    }

    /// Permissions this mode does not share with other openers.
    fn unshared(self) -> u8 {
        match self {
            LockMode::Write | LockMode::Read => PERM_WRITE | PERM_RESIZE,
            LockMode::ForceShare => 0,
        }
    }
}

/// Name of a permission as QEMU's messages spell it.
fn permission_name(bit: u8) -> &'static str {
    match bit {
        0 => "consistent read",
        1 => "write",
        2 => "write unchanged",
        _ => "resize",
    }
}

/// The lock state this process keeps for one file.
struct FileLocks {
    /// The description every opener's locks live on.
    file: File,
    /// Mode of every opener, by opener id.
    openers: HashMap<u64, LockMode>,
    /// Bytes taken now: (held, unshared) permission masks.
    applied: (u8, u8),
}

impl FileLocks {
    /// Union of every opener's permissions.
    fn wanted(&self) -> (u8, u8) {
        self.openers
            .values()
            .fold((0, 0), |(h, u), m| (h | m.held(), u | m.unshared()))
    }
}

/// Files of this process with locks, by (device, inode).
static REGISTRY: LazyLock<Mutex<HashMap<(u64, u64), FileLocks>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Ids of openers.
static NEXT_OPENER: AtomicU64 = AtomicU64::new(1);

/// One opener's hold on a file's locks; released on drop.
#[derive(Debug)]
pub struct ImageLock {
    key: (u64, u64),
    opener: u64,
    path: PathBuf,
}

impl ImageLock {
    /// Takes the locks of `mode` on `file` (opened from `path`), or fails
    /// with [`DiskError::Locked`] when another process holds the image in
    /// a way that `mode` conflicts with. A file system without OFD locks
    /// gets no locks, as in QEMU.
    pub fn acquire(file: &File, path: &Path, mode: LockMode) -> Result<ImageLock> {
        let meta = file
            .metadata()
            .map_err(|e| DiskError::Invalid(format!("{}: stat: {e}", path.display())))?;
        let key = (meta.dev(), meta.ino());
        let opener = NEXT_OPENER.fetch_add(1, Ordering::Relaxed);
        let mut registry = REGISTRY.lock();
        let locks = match registry.entry(key) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                // A duplicate of this opener's descriptor shares its open
                // file description, so the locks are on the very file it
                // opened, even if the path was replaced meanwhile.
                let description = file
                    .try_clone()
                    .map_err(|e| DiskError::Invalid(format!("{}: dup: {e}", path.display())))?;
                entry.insert(FileLocks {
                    file: description,
                    openers: HashMap::new(),
                    applied: (0, 0),
                })
            }
        };
        locks.openers.insert(opener, mode);
        let outcome = apply(locks).and_then(|()| check(&locks.file, mode));
        if let Err(conflict) = outcome {
            locks.openers.remove(&opener);
            // Best effort: give back what this opener added.
            let _ = apply(locks);
            if locks.openers.is_empty() {
                registry.remove(&key);
            }
            return Err(conflict.into_error(path, mode));
        }
        Ok(ImageLock {
            key,
            opener,
            path: path.to_path_buf(),
        })
    }

    /// Changes this opener's mode: a top layer that becomes a backing
    /// file gives up its write permissions. Giving permissions up never
    /// conflicts; taking more is checked as [`ImageLock::acquire`] does.
    pub fn set_mode(&self, mode: LockMode) -> Result<()> {
        let mut registry = REGISTRY.lock();
        let Some(locks) = registry.get_mut(&self.key) else {
            return Ok(());
        };
        let Some(previous) = locks.openers.get(&self.opener).copied() else {
            return Ok(());
        };
        locks.openers.insert(self.opener, mode);
        let outcome = apply(locks).and_then(|()| check(&locks.file, mode));
        if let Err(conflict) = outcome {
            locks.openers.insert(self.opener, previous);
            let _ = apply(locks);
            return Err(conflict.into_error(&self.path, mode));
        }
        Ok(())
    }
}

impl Drop for ImageLock {
    fn drop(&mut self) {
        let mut registry = REGISTRY.lock();
        let Some(locks) = registry.get_mut(&self.key) else {
            return;
        };
        locks.openers.remove(&self.opener);
        // Released explicitly: the description may outlive this registry
        // entry through the opener's own descriptor.
        let _ = apply(locks);
        if locks.openers.is_empty() {
            registry.remove(&self.key);
        }
    }
}

/// Why locks could not be taken.
enum Conflict {
    /// Another process holds a permission this opener does not share, or
    /// does not share one this opener holds.
    Held {
        /// The permission bit.
        bit: u8,
        /// The conflict is on a permission this opener does not share.
        shared: bool,
    },
    /// The lock calls themselves failed.
    System(std::io::Error),
}

impl Conflict {
    fn into_error(self, path: &Path, mode: LockMode) -> DiskError {
        match self {
            Conflict::Held { bit, shared } => DiskError::Locked {
                path: path.to_path_buf(),
                detail: format!(
                    "failed to get {}\"{}\" lock: another process has the image open \
                     (a VM, qemu-nbd, qemu-io, qemu-img or another strata); stop it first{}",
                    if shared { "shared " } else { "" },
                    permission_name(bit),
                    if mode == LockMode::Write {
                        ""
                    } else {
                        ", or pass -U (--force-share) to read the image while it is in use"
                    }
                ),
            },
            Conflict::System(e) => DiskError::Locked {
                path: path.to_path_buf(),
                detail: format!("could not take the image's locks: {e}"),
            },
        }
    }
}

/// Makes the file's lock bytes match the union of its openers' modes.
fn apply(locks: &mut FileLocks) -> std::result::Result<(), Conflict> {
    let (held, unshared) = locks.wanted();
    let (had_held, had_unshared) = locks.applied;
    for bit in 0..PERM_BITS {
        let mask = 1 << bit;
        for (base, want, had) in [
            (HELD_BASE, held, had_held),
            (UNSHARED_BASE, unshared, had_unshared),
        ] {
            let byte = base + i64::from(bit);
            let result = match (want & mask != 0, had & mask != 0) {
                (true, false) => set_lock(&locks.file, byte, libc::F_RDLCK as i16),
                (false, true) => set_lock(&locks.file, byte, libc::F_UNLCK as i16),
                _ => Ok(()),
            };
            match result {
                Ok(()) => {}
                Err(e) if unsupported(&e) => {
                    locks.applied = (held, unshared);
                    return Ok(());
                }
                Err(e) => return Err(Conflict::System(e)),
            }
        }
    }
    locks.applied = (held, unshared);
    debug_assert_eq!(locks.applied.0 & !PERM_ALL, 0);
    Ok(())
}

/// Tests whether another description holds a byte that `mode` conflicts
/// with. Our own description's locks never show up here.
fn check(file: &File, mode: LockMode) -> std::result::Result<(), Conflict> {
    for bit in 0..PERM_BITS {
        let mask = 1 << bit;
        if mode.held() & mask != 0 && locked_by_other(file, UNSHARED_BASE + i64::from(bit))? {
            return Err(Conflict::Held { bit, shared: false });
        }
        if mode.unshared() & mask != 0 && locked_by_other(file, HELD_BASE + i64::from(bit))? {
            return Err(Conflict::Held { bit, shared: true });
        }
    }
    Ok(())
}

/// Whether a description other than `file`'s holds a lock on `byte`.
fn locked_by_other(file: &File, byte: i64) -> std::result::Result<bool, Conflict> {
    let mut query = flock_for(byte, libc::F_WRLCK as i16);
    // SAFETY: `query` is a valid, initialised `struct flock` that lives
    // across the call, and the descriptor is open for as long as `file`.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut query) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return if unsupported(&e) {
            Ok(false)
        } else {
            Err(Conflict::System(e))
        };
    }
    Ok(query.l_type != libc::F_UNLCK as i16)
}

/// Takes (`F_RDLCK`) or releases (`F_UNLCK`) one lock byte, without
/// waiting.
fn set_lock(file: &File, byte: i64, kind: i16) -> std::io::Result<()> {
    let request = flock_for(byte, kind);
    // SAFETY: as in `locked_by_other`; F_OFD_SETLK only reads `request`.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &request) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A one-byte lock request; OFD locks need `l_pid` zero.
fn flock_for(byte: i64, kind: i16) -> libc::flock {
    // SAFETY: `flock` is plain old data; all-zero is a valid value.
    let mut request: libc::flock = unsafe { std::mem::zeroed() };
    request.l_type = kind;
    request.l_whence = libc::SEEK_SET as i16;
    request.l_start = byte;
    request.l_len = 1;
    request
}

/// File systems without OFD locks answer these; QEMU then opens unlocked.
fn unsupported(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) | Some(libc::ENOLCK)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("image");
        std::fs::write(&path, vec![0u8; 4096]).expect("write");
        (dir, path)
    }

    /// Bytes that descriptions other than `probe`'s hold, of 100..104
    /// and 200..204.
    fn bytes_held_by_others(probe: &File) -> Vec<i64> {
        (0..PERM_BITS)
            .flat_map(|b| [HELD_BASE + i64::from(b), UNSHARED_BASE + i64::from(b)])
            .filter(|&byte| locked_by_other(probe, byte).unwrap_or(false))
            .collect()
    }

    #[test]
    fn a_writer_takes_the_bytes_qemu_takes_and_gives_them_back_on_drop() {
        let (_dir, path) = temp_file();
        let file = File::open(&path).expect("open");
        let probe = File::open(&path).expect("open");
        let lock = ImageLock::acquire(&file, &path, LockMode::Write).expect("lock");
        let mut held = bytes_held_by_others(&probe);
        held.sort_unstable();
        assert_eq!(held, vec![100, 101, 103, 201, 203]);
        lock.set_mode(LockMode::Read).expect("downgrade");
        let mut held = bytes_held_by_others(&probe);
        held.sort_unstable();
        assert_eq!(held, vec![100, 201, 203]);
        drop(lock);
        assert!(bytes_held_by_others(&probe).is_empty());
    }

    #[test]
    fn openers_in_one_process_share_one_description() {
        let (_dir, path) = temp_file();
        let first = File::open(&path).expect("open");
        let second = File::open(&path).expect("open");
        let probe = File::open(&path).expect("open");
        let reader = ImageLock::acquire(&first, &path, LockMode::Read).expect("reader");
        let writer = ImageLock::acquire(&second, &path, LockMode::Write).expect("writer");
        drop(writer);
        let mut held = bytes_held_by_others(&probe);
        held.sort_unstable();
        assert_eq!(held, vec![100, 201, 203], "the reader's bytes stay");
        drop(reader);
        assert!(bytes_held_by_others(&probe).is_empty());
    }
}

//! Opening and reading a file only when it costs no wait: every part of
//! its path already in the kernel's lookup cache (`openat2` with
//! `RESOLVE_CACHED`) and its bytes in the page cache (`preadv2` with
//! `RWF_NOWAIT`). Either call answers `WouldBlock` instead of going to
//! the disk.
//!
//! Why: a small Get read on the async worker costs four quick system
//! calls, while handing it to the blocking pool costs two thread wake-ups,
//! which measured as most of the storage node's CPU for 4 KiB Gets. The
//! worker must still never wait on the disk, so whatever is not cached
//! goes to the blocking pool as before (io_uring decides the same way).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Opens `name` in the directory `dir` read-only if every component of
/// it is in the kernel's lookup cache; `WouldBlock` if finding it would
/// read the disk. A cached absence is a real `NotFound`. Relative to a
/// directory held open, the lookup walks one component, not the whole
/// path.
pub fn open_cached(dir: &File, name: &Path) -> io::Result<File> {
    let name = CString::new(name.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    // SAFETY: `open_how` is plain integers, for which zero is valid.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_CACHED;
    // SAFETY: `name` is a NUL-terminated string and `how` a valid
    // `open_how` of the size passed, both alive for the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

/// Reads from `offset` into `buffers` in order, without waiting for the
/// disk: `WouldBlock` if the first byte is not in the page cache. The
/// count read may be short at the end of the file or where the cached
/// bytes stop; the caller, who knows the file's length, tells which.
pub fn read_cached(file: &File, buffers: &mut [&mut [u8]], offset: u64) -> io::Result<usize> {
    let vectors: Vec<libc::iovec> = buffers
        .iter_mut()
        .map(|buffer| libc::iovec {
            iov_base: buffer.as_mut_ptr().cast(),
            iov_len: buffer.len(),
        })
        .collect();
    let offset = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset past off_t"))?;
    // SAFETY: each iovec points into a live, exclusively borrowed buffer
    // of the length it states.
    let read = unsafe {
        libc::preadv2(
            file.as_raw_fd(),
            vectors.as_ptr(),
            vectors.len() as libc::c_int,
            offset,
            libc::RWF_NOWAIT,
        )
    };
    if read < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(read as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_cached_file_is_opened_and_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(b"header-then-data")
            .unwrap();
        // The first open may miss the lookup cache; the second one may not.
        let _ = std::fs::read(&path).unwrap();
        let held = File::open(dir.path()).unwrap();
        let file = open_cached(&held, Path::new("f")).unwrap();
        let mut head = [0u8; 6];
        let mut rest = vec![0u8; 20];
        let read = read_cached(&file, &mut [&mut head, &mut rest], 1).unwrap();
        assert_eq!(read, 15, "the read stops at the end of the file");
        assert_eq!(&head, b"eader-");
        assert_eq!(&rest[..9], b"then-data");
    }

    #[test]
    fn a_cached_absence_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let _ = std::fs::metadata(dir.path().join("missing"));
        let held = File::open(dir.path()).unwrap();
        match open_cached(&held, Path::new("missing")) {
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::WouldBlock
                ),
                "{e}"
            ),
            Ok(_) => panic!("a missing file was opened"),
        }
    }
}

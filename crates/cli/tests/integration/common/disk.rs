//! Small file systems that a test fills, to see what a full disk does.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted by a test, unmounted when dropped.
pub struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Mounts a tmpfs of `size` (mount's syntax: "24m") on the directory
/// `dir`; `None` where the test may not mount (not root).
pub fn mount_tmpfs(dir: &Path, size: &str) -> Option<Mounted> {
    let options = format!("size={size}");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &options, "tmpfs"])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    mounted.then(|| Mounted(dir.to_path_buf()))
}

/// Fills the file system of `dir` with a file until it is full.
pub fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0x5au8; 256 << 10];
    loop {
        if let Err(e) = file.write_all(&chunk) {
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
            break;
        }
    }
    // Fill the last partial page too.
    while file.write_all(&[1u8; 512]).is_ok() {}
    path
}

//! Helpers shared by the engine's integration tests: QEMU as the
//! independent reader and checker of what the engine wrote.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;
use std::process::Command;

/// Guest content of `image` (its chain included) as QEMU reads it.
pub fn qemu_read(image: &Path, dir: &Path) -> Vec<u8> {
    let out = dir.join("view.raw");
    let st = Command::new("qemu-img")
        .args(["convert", "-O", "raw"])
        .arg(image)
        .arg(&out)
        .status()
        .expect("qemu-img");
    assert!(st.success(), "qemu-img convert {}", image.display());
    let data = std::fs::read(&out).expect("read");
    std::fs::remove_file(&out).ok();
    data
}

/// Asserts that `qemu-img check` finds `image` clean.
pub fn qemu_check_clean(image: &Path) {
    let out = Command::new("qemu-img")
        .arg("check")
        .arg(image)
        .output()
        .expect("qemu-img check");
    assert!(
        out.status.success(),
        "qemu-img check {}: {}",
        image.display(),
        String::from_utf8_lossy(&out.stdout)
    );
}

//! Helpers shared by the engine's integration tests: QEMU as the
//! independent reader and checker of what the engine wrote.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::Command;

use strata_disk::layer::Format;
use strata_disk::{create, CreateOptions, Disk, OpenOptions};

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
///
/// With `-U`: tests that stand for a crash with `std::mem::forget` keep
/// this process's image locks, which a real crash would drop.
pub fn qemu_check_clean(image: &Path) {
    let out = Command::new("qemu-img")
        .arg("check")
        .arg("-U")
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

/// A base image of `size` bytes holding `base_data` at offset 0, and an
/// empty top layer on it (`top.qcow2` in `dir`), opened for writing; both
/// layers with extended L2 entries when `extended`.
pub fn top_over_base(dir: &Path, size: u64, base_data: &[u8], extended: bool) -> (PathBuf, Disk) {
    let base = dir.join("base.qcow2");
    let opts = CreateOptions {
        size: Some(size),
        extended_l2: extended,
        ..CreateOptions::default()
    };
    create(&base, &opts).unwrap();
    let d = Disk::open(&base, &OpenOptions::read_write()).unwrap();
    d.write_at(base_data, 0).unwrap();
    d.close().unwrap();
    let top = dir.join("top.qcow2");
    let opts = CreateOptions {
        backing: Some("base.qcow2".into()),
        backing_format: Some(Format::Qcow2),
        extended_l2: extended,
        ..CreateOptions::default()
    };
    create(&top, &opts).unwrap();
    let disk = Disk::open(&top, &OpenOptions::read_write()).unwrap();
    (top, disk)
}

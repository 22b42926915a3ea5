//! The engine's images keep the block-device contract: the conformance
//! suite of `strata-block` on a qcow2 top over a backing layer that holds
//! data (v3, v3 with subclusters, v2 without zero clusters), on a raw
//! image, and on a chain opened read-only. QEMU checks every image the
//! suite wrote.

mod common;

use std::path::{Path, PathBuf};

use strata_block::conformance::{check_device, Subject};
use strata_disk::layer::Format;
use strata_disk::{create, CreateOptions, Disk, OpenOptions};

const SIZE: u64 = 4 << 20;

/// What the base layer holds: data in its first clusters and in the
/// middle, zeros elsewhere.
fn base_content() -> Vec<u8> {
    let mut bytes = vec![0u8; SIZE as usize];
    for (i, b) in bytes[..200_000].iter_mut().enumerate() {
        *b = (i % 253) as u8 | 0x40;
    }
    for (i, b) in bytes[2 << 20..(2 << 20) + 70_000].iter_mut().enumerate() {
        *b = (i % 241) as u8 | 0x80;
    }
    bytes
}

/// A new directory for each device the suite asks for.
struct Dirs {
    root: tempfile::TempDir,
    made: Vec<PathBuf>,
}

impl Dirs {
    fn new() -> Dirs {
        Dirs {
            root: tempfile::tempdir().unwrap(),
            made: Vec::new(),
        }
    }

    fn next(&mut self) -> PathBuf {
        let dir = self.root.path().join(format!("device-{}", self.made.len()));
        std::fs::create_dir(&dir).unwrap();
        self.made.push(dir.clone());
        dir
    }
}

/// A base of `version` holding [`base_content`] and an empty top over it.
fn chain(dir: &Path, version: u32, extended_l2: bool, writable: bool) -> Disk {
    let base = dir.join("base.qcow2");
    let options = CreateOptions {
        size: Some(SIZE),
        version,
        extended_l2,
        ..CreateOptions::default()
    };
    create(&base, &options).unwrap();
    let disk = Disk::open(&base, &OpenOptions::read_write()).unwrap();
    disk.write_at(&base_content(), 0).unwrap();
    disk.close().unwrap();
    let top = dir.join("top.qcow2");
    let options = CreateOptions {
        backing: Some("base.qcow2".into()),
        backing_format: Some(Format::Qcow2),
        ..options
    };
    create(&top, &options).unwrap();
    let open = if writable {
        OpenOptions::read_write()
    } else {
        OpenOptions::read_only()
    };
    Disk::open(&top, &open).unwrap()
}

fn check_chain(version: u32, extended_l2: bool) {
    let mut dirs = Dirs::new();
    check_device(&mut || {
        let disk = chain(&dirs.next(), version, extended_l2, true);
        Subject::holding(Box::new(disk), base_content())
    });
    for dir in &dirs.made {
        common::qemu_check_clean(&dir.join("top.qcow2"));
    }
}

#[test]
fn a_qcow2_v3_top_over_a_backing_layer_keeps_the_contract() {
    check_chain(3, false);
}

#[test]
fn a_qcow2_top_with_subclusters_over_a_backing_layer_keeps_the_contract() {
    check_chain(3, true);
}

#[test]
fn a_qcow2_v2_top_without_zero_clusters_keeps_the_contract() {
    check_chain(2, false);
}

#[test]
fn a_chain_opened_read_only_keeps_the_contract_and_refuses_writes() {
    let mut dirs = Dirs::new();
    check_device(&mut || {
        let disk = chain(&dirs.next(), 3, false, false);
        Subject::holding(Box::new(disk), base_content())
    });
}

#[test]
fn a_raw_image_keeps_the_contract() {
    let mut dirs = Dirs::new();
    check_device(&mut || {
        let path = dirs.next().join("disk.raw");
        let options = CreateOptions {
            format: Format::Raw,
            size: Some(SIZE),
            ..CreateOptions::default()
        };
        create(&path, &options).unwrap();
        Subject::zeroed(Box::new(
            Disk::open(&path, &OpenOptions::read_write()).unwrap(),
        ))
    });
}

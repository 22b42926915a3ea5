//! A live volume keeps the block-device contract: the conformance suite
//! of `strata-block` on a volume over a chain whose base holds data, and
//! on one that took an online snapshot (a new top pushed under it) after
//! its own first writes, so the suite runs across a switched top.

use std::path::{Path, PathBuf};

use strata_block::conformance::{check_device, Subject};
use strata_disk::layer::Format;
use strata_disk::{create, CreateOptions, Disk, OpenOptions};
use strata_volume::Volume;

const SIZE: u64 = 4 << 20;

/// What the base layer holds: data in its first clusters and near the end.
fn base_content() -> Vec<u8> {
    let mut bytes = vec![0u8; SIZE as usize];
    for (i, b) in bytes[..150_000].iter_mut().enumerate() {
        *b = (i % 251) as u8 | 0x20;
    }
    let end = SIZE as usize;
    for (i, b) in bytes[end - 70_000..].iter_mut().enumerate() {
        *b = (i % 239) as u8 | 0x10;
    }
    bytes
}

/// What the volume writes before its snapshot.
const BEFORE_SNAPSHOT: (u64, usize) = (300_000, 100_000);

struct Dirs {
    root: tempfile::TempDir,
    made: usize,
}

impl Dirs {
    fn next(&mut self) -> PathBuf {
        self.made += 1;
        let dir = self.root.path().join(format!("volume-{}", self.made));
        std::fs::create_dir(&dir).unwrap();
        dir
    }
}

fn dirs() -> Dirs {
    Dirs {
        root: tempfile::tempdir().unwrap(),
        made: 0,
    }
}

/// A volume over an empty top on a base holding [`base_content`].
fn volume(dir: &Path) -> Volume {
    let base = dir.join("base.qcow2");
    let options = CreateOptions {
        size: Some(SIZE),
        ..CreateOptions::default()
    };
    create(&base, &options).unwrap();
    let disk = Disk::open(&base, &OpenOptions::read_write()).unwrap();
    disk.write_at(&base_content(), 0).unwrap();
    disk.close().unwrap();
    let top = dir.join("top-1.qcow2");
    let options = CreateOptions {
        backing: Some("base.qcow2".into()),
        backing_format: Some(Format::Qcow2),
        ..options
    };
    create(&top, &options).unwrap();
    Volume::new(
        "contract",
        Disk::open(&top, &OpenOptions::read_write()).unwrap(),
    )
}

#[test]
fn a_volume_over_a_backing_layer_keeps_the_contract() {
    let mut dirs = dirs();
    check_device(&mut || Subject::holding(Box::new(volume(&dirs.next())), base_content()));
}

#[test]
fn a_volume_after_an_online_snapshot_keeps_the_contract() {
    use strata_block::BlockDevice;
    let mut dirs = dirs();
    check_device(&mut || {
        let dir = dirs.next();
        let volume = volume(&dir);
        let mut content = base_content();
        let (offset, len) = BEFORE_SNAPSHOT;
        let data: Vec<u8> = (0..len).map(|i| (i % 247) as u8 | 0x01).collect();
        volume.write_at(&data, offset).unwrap();
        content[offset as usize..offset as usize + len].copy_from_slice(&data);
        let pushed = volume
            .push_top(
                &dir.join("top-2.qcow2"),
                "top-1.qcow2",
                None,
                true,
                None,
                || Ok(()),
            )
            .unwrap();
        assert!(pushed.as_secs() < 60);
        assert_eq!(volume.chain_length(), 3, "the snapshot did not add a layer");
        Subject::holding(Box::new(volume), content)
    });
}

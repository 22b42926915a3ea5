//! Pushing a new top layer under an open disk (online snapshot and grow):
//! the frozen layer holds exactly the earlier writes, the disk goes on
//! writing to the new top, and QEMU reads and checks every layer.

use std::path::Path;

mod common;

use common::{qemu_check_clean, qemu_read};
use strata_disk::{create, CreateOptions, Disk, DiskError, OpenOptions};

const MIB: u64 = 1 << 20;

fn new_disk(dir: &Path, size: u64) -> Disk {
    let base = dir.join("base.qcow2");
    let opts = CreateOptions {
        size: Some(size),
        ..CreateOptions::default()
    };
    create(&base, &opts).expect("create");
    Disk::open(&base, &OpenOptions::read_write()).expect("open")
}

#[test]
fn pushed_top_freezes_earlier_writes_and_takes_later_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut disk = new_disk(dir.path(), 8 * MIB);
    disk.write_at(&vec![0xaa; 3 * 65536 + 100], 4096).unwrap();
    let top2 = dir.path().join("top2.qcow2");
    let mut committed = false;
    let prepared = disk.prepare_top(&top2, "base.qcow2", None).unwrap();
    disk.push_top(prepared, || {
        committed = true;
        Ok(())
    })
    .unwrap();
    assert!(committed, "the commit hook must run before writing");
    assert_eq!(disk.depth(), 2);
    // Overwrite part of the frozen data and write somewhere new.
    disk.write_at(&vec![0xbb; 1000], 8192).unwrap();
    disk.write_at(&vec![0xcc; 65536], 5 * MIB).unwrap();
    let mut buf = vec![0u8; 16384];
    disk.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..4096], &[0u8; 4096][..]);
    assert_eq!(&buf[4096..8192], &[0xaa; 4096][..]);
    assert_eq!(&buf[8192..9192], &[0xbb; 1000][..]);
    assert_eq!(&buf[9192..], &vec![0xaa; 16384 - 9192][..]);
    let mut far = vec![0u8; 65536];
    disk.read_at(&mut far, 5 * MIB).unwrap();
    assert!(
        far.iter().all(|&b| b == 0xcc),
        "engine reads back the new write"
    );
    disk.close().unwrap();

    let base = qemu_read(&dir.path().join("base.qcow2"), dir.path());
    assert!(base[4096..4096 + 3 * 65536 + 100]
        .iter()
        .all(|&b| b == 0xaa));
    assert!(base[5 * MIB as usize..6 * MIB as usize]
        .iter()
        .all(|&b| b == 0));
    let top = qemu_read(&top2, dir.path());
    assert_eq!(&top[8192..9192], &[0xbb; 1000][..]);
    assert!(top[5 * MIB as usize..5 * MIB as usize + 65536]
        .iter()
        .all(|&b| b == 0xcc));
    qemu_check_clean(&dir.path().join("base.qcow2"));
    qemu_check_clean(&top2);
    // The carried index is valid: Strata reopens it without walking.
    let reopened = Disk::open(&top2, &OpenOptions::read_only()).unwrap();
    assert!(matches!(
        reopened.index_state(),
        strata_disk::disk::IndexState::Stored { depth: 2 }
    ));
}

#[test]
fn failed_commit_keeps_writing_to_the_old_top() {
    let dir = tempfile::tempdir().unwrap();
    let mut disk = new_disk(dir.path(), 4 * MIB);
    let top2 = dir.path().join("top2.qcow2");
    let prepared = disk.prepare_top(&top2, "base.qcow2", None).unwrap();
    let err = disk
        .push_top(prepared, || {
            Err(DiskError::Invalid("catalog refused".into()))
        })
        .unwrap_err();
    assert!(err.to_string().contains("catalog refused"));
    assert!(!top2.exists(), "the uncommitted layer must be removed");
    assert_eq!(disk.depth(), 1);
    disk.write_at(&[7u8; 512], 0).unwrap();
    disk.close().unwrap();
    let base = qemu_read(&dir.path().join("base.qcow2"), dir.path());
    assert_eq!(&base[..512], &[7u8; 512][..]);
    qemu_check_clean(&dir.path().join("base.qcow2"));
}

#[test]
fn grown_top_reads_zeros_past_the_smaller_layers() {
    let dir = tempfile::tempdir().unwrap();
    let mut disk = new_disk(dir.path(), 4 * MIB);
    disk.write_at(&vec![0x11; 4 * MIB as usize], 0).unwrap();
    let shrink = disk.prepare_top(&dir.path().join("x.qcow2"), "base.qcow2", Some(MIB));
    assert!(shrink.unwrap_err().to_string().contains("shrink"));
    assert!(!dir.path().join("x.qcow2").exists());
    assert_eq!(disk.size(), 4 * MIB);
    let top2 = dir.path().join("top2.qcow2");
    let prepared = disk
        .prepare_top(&top2, "base.qcow2", Some(10 * MIB))
        .unwrap();
    assert!(prepared.is_fast());
    let report = disk.push_top(prepared, || Ok(())).unwrap();
    assert!(report.fast, "a grown top is pushed fast too");
    assert_eq!(disk.size(), 10 * MIB);
    let mut buf = vec![0u8; 2 * MIB as usize];
    disk.read_at(&mut buf, 3 * MIB).unwrap();
    assert!(buf[..MIB as usize].iter().all(|&b| b == 0x11));
    assert!(buf[MIB as usize..].iter().all(|&b| b == 0));
    // A partial write past the old end copies zeros, not stale data.
    disk.write_at(&[0x22; 100], 9 * MIB + 50).unwrap();
    disk.close().unwrap();
    let top = qemu_read(&top2, dir.path());
    assert_eq!(top.len() as u64, 10 * MIB);
    assert!(top[..4 * MIB as usize].iter().all(|&b| b == 0x11));
    assert!(top[4 * MIB as usize..9 * MIB as usize + 50]
        .iter()
        .all(|&b| b == 0));
    assert_eq!(
        &top[9 * MIB as usize + 50..9 * MIB as usize + 150],
        &[0x22; 100][..]
    );
    qemu_check_clean(&top2);
}

#[test]
fn writes_after_a_snapshot_are_counted_as_allocating_once_per_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let mut disk = new_disk(dir.path(), 8 * MIB);
    // Two fresh 64 KiB clusters allocate; overwriting them does not.
    disk.write_at(&vec![1; 2 * 65536], 0).unwrap();
    let first = disk.write_times();
    assert_eq!((first.allocating, first.in_place), (2, 0));
    disk.write_at(&vec![2; 4096], 4096).unwrap();
    disk.write_at(&vec![2; 4096], 65536).unwrap();
    let before = disk.write_times();
    assert_eq!((before.allocating, before.in_place), (2, 2));
    assert!(before.allocating_time > std::time::Duration::ZERO);

    let prepared = disk
        .prepare_top(&dir.path().join("top2.qcow2"), "base.qcow2", None)
        .unwrap();
    disk.push_top(prepared, || Ok(())).unwrap();
    // After the snapshot both clusters are shared: the first write to
    // each allocates (copying the rest of the cluster), the next does not.
    for _ in 0..2 {
        disk.write_at(&vec![3; 4096], 8192).unwrap();
        disk.write_at(&vec![3; 4096], 65536 + 8192).unwrap();
    }
    let after = disk.write_times();
    assert_eq!(after.allocating - before.allocating, 2);
    assert_eq!(after.in_place - before.in_place, 2);
    let mut buf = vec![0u8; 4096];
    disk.read_at(&mut buf, 65536 + 4096).unwrap();
    assert_eq!(buf, vec![1; 4096], "the copy-on-write kept the rest");
    disk.close().unwrap();
}

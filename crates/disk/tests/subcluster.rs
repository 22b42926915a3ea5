//! Subclusters (extended L2 entries) end copy-on-write amplification: after
//! a snapshot, a small write to a cluster writes that much, not a cluster.

mod common;

use std::path::Path;

const SIZE: u64 = 64 << 20;
const CLUSTER: u64 = 64 << 10;
const WRITES: u64 = 200;

/// Bytes this process has handed to `write`-family system calls so far
/// (`wchar` of /proc/self/io): what the engine wrote, whatever the file
/// system reserves (a new host cluster is preallocated with `fallocate`).
fn bytes_written() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("wchar: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Bytes written for `WRITES` 4 KiB writes to distinct clusters after a
/// snapshot, each over data in the base layer, metadata flush included.
fn growth_after_snapshot(dir: &Path, extended: bool) -> u64 {
    let (_, disk) = common::top_over_base(dir, SIZE, &vec![0x11u8; SIZE as usize], extended);
    // Metadata (L2 tables, refcounts) first, so the growth is data only.
    disk.write_at(&[0x22; 4096], SIZE - 4096).unwrap();
    disk.flush().unwrap();
    let before = bytes_written();
    for i in 0..WRITES {
        let at = i * (SIZE / WRITES / CLUSTER) * CLUSTER + 8192;
        disk.write_at(&[0x33; 4096], at).unwrap();
    }
    disk.flush().unwrap();
    let grown = bytes_written() - before;
    // The data is right: the write, and the base around it.
    let mut buf = vec![0u8; CLUSTER as usize];
    disk.read_at(&mut buf, 0).unwrap();
    assert!(buf[..8192].iter().all(|b| *b == 0x11));
    assert!(buf[8192..12288].iter().all(|b| *b == 0x33));
    assert!(buf[12288..].iter().all(|b| *b == 0x11));
    disk.close().unwrap();
    grown
}

#[test]
fn small_write_after_snapshot_writes_a_subcluster_not_a_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let ext_dir = dir.path().join("ext");
    let std_dir = dir.path().join("std");
    std::fs::create_dir_all(&ext_dir).unwrap();
    std::fs::create_dir_all(&std_dir).unwrap();
    let extended = growth_after_snapshot(&ext_dir, true);
    let standard = growth_after_snapshot(&std_dir, false);
    eprintln!(
        "{WRITES} x 4 KiB after a snapshot: extended L2 {} KiB, standard {} KiB",
        extended >> 10,
        standard >> 10
    );
    // About WRITES x 4 KiB, plus the metadata of the flush ...
    assert!(
        extended <= WRITES * 8192,
        "extended L2 layer: {extended} bytes written for {WRITES} 4 KiB writes"
    );
    // ... where copy-on-write of whole clusters writes WRITES x 64 KiB.
    assert!(
        standard >= WRITES * CLUSTER,
        "standard layer: only {standard} bytes written"
    );
}

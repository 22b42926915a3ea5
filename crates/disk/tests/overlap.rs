//! A damaged qcow2 image never makes the engine write guest data over the
//! image's own metadata, nor hand out a cluster the image still
//! references (QEMU's `overlap-check`).
//!
//! Every image here is made by qemu-img/qemu-io and damaged by raw byte
//! edits. The layout qemu-img gives a fresh 64 MiB image with 64 KiB
//! clusters, once qemu-io wrote guest 0..128 KiB and 1 MiB..+64 KiB:
//! header 0x0, refcount table 0x10000, refcount block 0x20000, L1 table
//! 0x30000, L2 table 0x40000, data 0x50000 and 0x60000 (guest 0 and
//! 64 KiB), 0x70000 (guest 1 MiB); the file ends at 0x80000.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use strata_disk::check::{check, Repair};
use strata_disk::{Disk, DiskError, OpenOptions};

const SIZE: u64 = 64 << 20;
const CLUSTER: u64 = 64 << 10;
const REFCOUNT_TABLE: u64 = 0x10000;
const L1_TABLE: u64 = 0x30000;
const L2_TABLE: u64 = 0x40000;
const COPIED: u64 = 1 << 63;
/// Offset of the incompatible-features field in a v3 header.
const INCOMPAT_AT: usize = 72;
const INCOMPAT_CORRUPT: u64 = 1 << 1;

/// A healthy image with guest data at 0..128 KiB (0x5a) and at 1 MiB
/// (one cluster of 0x6b), laid out as the module doc says.
fn qemu_image(dir: &Path) -> PathBuf {
    qemu_image_of(dir, SIZE, false)
}

/// [`qemu_image`] with a virtual size of `size` bytes (up to 1 GiB: two L1
/// entries, the same layout), with extended L2 entries if `extended`
/// (16-byte entries, the same layout too).
fn qemu_image_of(dir: &Path, size: u64, extended: bool) -> PathBuf {
    let options = format!(
        "cluster_size=65536,extended_l2={}",
        if extended { "on" } else { "off" }
    );
    let path = dir.join("disk.qcow2");
    let st = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-o", &options])
        .arg(&path)
        .arg(size.to_string())
        .status()
        .expect("qemu-img");
    assert!(st.success(), "qemu-img create");
    let out = Command::new("qemu-io")
        .args(["-f", "qcow2"])
        .args(["-c", "write -P 0x5a 0 128k", "-c", "write -P 0x6b 1M 64k"])
        .arg(&path)
        .output()
        .expect("qemu-io");
    assert!(out.status.success(), "qemu-io write");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0x80000);
    assert_eq!(read_u64(&path, L1_TABLE), L2_TABLE | COPIED, "layout");
    path
}

fn read_u64(path: &Path, at: u64) -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut b, at)
        .unwrap();
    u64::from_be_bytes(b)
}

fn write_u64(path: &Path, at: u64, value: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&value.to_be_bytes(), at).unwrap();
}

/// The metadata the damage must not spread to: the header's fixed fields
/// (the incompatible and autoclear features aside, which every writer
/// changes) and every cluster from the refcount table to the L2 table.
fn metadata_bytes(path: &Path) -> (Vec<u8>, u64, Vec<u8>) {
    let file = std::fs::read(path).unwrap();
    let mut fixed = file[..INCOMPAT_AT].to_vec();
    fixed.extend_from_slice(&file[80..88]);
    fixed.extend_from_slice(&file[96..104]);
    let incompat = u64::from_be_bytes(file[INCOMPAT_AT..INCOMPAT_AT + 8].try_into().unwrap());
    let tables = file[REFCOUNT_TABLE as usize..(L2_TABLE + CLUSTER) as usize].to_vec();
    (fixed, incompat, tables)
}

/// The whole guest disk as the engine reads it, opened read-only.
fn guest_read(path: &Path) -> Vec<u8> {
    let disk = Disk::open(path, &OpenOptions::read_only()).unwrap();
    let mut buf = vec![0u8; SIZE as usize];
    disk.read_at(&mut buf, 0).unwrap();
    buf
}

/// Opens `path` for writing and writes one 4 KiB block at `guest`.
fn open_and_write(path: &Path, guest: u64) -> Result<(), DiskError> {
    let disk = Disk::open(path, &OpenOptions::read_write())?;
    let written = disk.write_at(&[0xee; 4096], guest);
    disk.close()?;
    written
}

#[test]
fn a_write_through_an_l2_entry_pointing_at_the_refcount_table_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = qemu_image(dir.path());
    write_u64(&path, L2_TABLE, REFCOUNT_TABLE | COPIED);
    let (fixed, incompat, tables) = metadata_bytes(&path);
    let before = guest_read(&path);

    let disk = Disk::open(&path, &OpenOptions::read_write()).unwrap();
    let err = disk.write_at(&[0xee; 4096], 0x2000).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DiskError::Corrupt { .. }), "{msg}");
    for part in [
        "disk.qcow2",
        "guest write at 0x2000",
        "host cluster 0x10000",
        "the refcount table",
        "refusing to write over metadata",
        "image marked corrupt",
        "strata img check -r all",
    ] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
    // The locked paths refuse too: every later change of this session.
    assert!(disk.write_zeroes(0x2000, 4096).is_err());
    assert!(disk.write_at(&[0xee; 4096], 2 << 20).is_err());
    assert!(disk.discard(0, CLUSTER).is_err());
    disk.close().unwrap();

    let (fixed_after, incompat_after, tables_after) = metadata_bytes(&path);
    assert_eq!(fixed, fixed_after, "header fields changed");
    assert!(tables == tables_after, "metadata clusters changed");
    assert_eq!(incompat_after, incompat | INCOMPAT_CORRUPT);
    assert!(guest_read(&path) == before, "guest content changed");
    let info = Command::new("qemu-img")
        .arg("info")
        .arg(&path)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&info.stdout).contains("corrupt: true"));
    // Marked corrupt, the image is refused for writing until repaired.
    assert!(Disk::open(&path, &OpenOptions::read_write()).is_err());
}

/// With extended L2 entries: the first guest cluster's entry points at the
/// refcount table with subclusters `allocated` (bitmap); a write of 4 KiB
/// at guest 0x2000 (subclusters 4 and 5) is refused and changes nothing.
fn extended_write_over_the_refcount_table_is_refused(allocated: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = qemu_image_of(dir.path(), SIZE, true);
    write_u64(&path, L2_TABLE, REFCOUNT_TABLE | COPIED);
    write_u64(&path, L2_TABLE + 8, allocated);
    let (fixed, incompat, tables) = metadata_bytes(&path);
    let before = guest_read(&path);
    let err = open_and_write(&path, 0x2000).unwrap_err();
    let msg = err.to_string();
    for part in [
        "host cluster 0x10000",
        "the refcount table",
        "image marked corrupt",
    ] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
    let (fixed_after, incompat_after, tables_after) = metadata_bytes(&path);
    assert_eq!(fixed, fixed_after, "header fields changed");
    assert!(tables == tables_after, "metadata clusters changed");
    assert_eq!(incompat_after, incompat | INCOMPAT_CORRUPT);
    assert!(guest_read(&path) == before, "guest content changed");
}

#[test]
fn an_extended_l2_in_place_write_over_metadata_is_refused() {
    // Every subcluster allocated: the unlocked in-place path.
    extended_write_over_the_refcount_table_is_refused(0xffff_ffff);
}

#[test]
fn an_extended_l2_subcluster_fill_over_metadata_is_refused() {
    // Only subcluster 0 allocated: the write allocates subclusters 4 and
    // 5 inside the same host cluster (the subcluster fill path).
    extended_write_over_the_refcount_table_is_refused(0x1);
}

#[test]
fn a_copy_on_write_away_from_metadata_is_refused() {
    // An entry without COPIED names a shared cluster: a write copies it to
    // a new cluster and drops the old reference. Here the old cluster is
    // the L2 table itself: dropping its reference would let its refcount
    // free it, so the write is refused before the entry changes.
    let dir = tempfile::tempdir().unwrap();
    let path = qemu_image(dir.path());
    write_u64(&path, L2_TABLE + 8 * 5, L2_TABLE);
    let (_, _, tables) = metadata_bytes(&path);
    let before = guest_read(&path);
    let err = open_and_write(&path, 5 * CLUSTER + 100).unwrap_err();
    let msg = err.to_string();
    for part in [
        "guest cluster at 0x50000",
        "host cluster 0x40000",
        "an L2 table",
    ] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
    assert!(
        metadata_bytes(&path).2 == tables,
        "metadata clusters changed"
    );
    assert!(guest_read(&path) == before, "guest content changed");
}

#[test]
fn an_l1_entry_pointing_at_the_l1_table_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = qemu_image(dir.path());
    write_u64(&path, L1_TABLE, L1_TABLE | COPIED);
    let file_before = std::fs::read(&path).unwrap();
    let before = guest_read(&path);

    let err = open_and_write(&path, 0).unwrap_err();
    let msg = err.to_string();
    for part in [
        "L2 table of L1 entry 0 at 0x30000 overlaps the L1 table",
        "read-only",
        "strata img check -r all",
    ] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
    assert!(
        std::fs::read(&path).unwrap() == file_before,
        "a refused open changed the file"
    );
    assert!(guest_read(&path) == before, "guest content changed");
    // The check reports it too.
    let report = check(&path, Repair::None).unwrap();
    assert!(report.corruptions > 0);
    assert!(
        report
            .messages
            .iter()
            .any(|m| m.contains("an L2 table at 0x30000 overlaps the L1 table")),
        "{:?}",
        report.messages
    );
}

#[test]
fn an_l2_table_beyond_the_end_of_the_file_is_refused_at_open() {
    // 1 GiB: the L1 table has a second entry, unused so far.
    let dir = tempfile::tempdir().unwrap();
    let path = qemu_image_of(dir.path(), 1 << 30, false);
    write_u64(&path, L1_TABLE + 8, 0x200000 | COPIED);
    let file_before = std::fs::read(&path).unwrap();

    let err = open_and_write(&path, 0).unwrap_err();
    let msg = err.to_string();
    for part in [
        "L2 table of L1 entry 1 at 0x200000",
        "beyond the end of the file (0x80000)",
        "strata img check -r all",
    ] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
    assert!(
        std::fs::read(&path).unwrap() == file_before,
        "a refused open changed the file"
    );
    // Reads of the intact part still work.
    let disk = Disk::open(&path, &OpenOptions::read_only()).unwrap();
    let mut buf = vec![0u8; 4096];
    disk.read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|b| *b == 0x5a));
}

/// Damages the image with `value` at file offset `at`; opening it for
/// writing must fail with a message holding `expected`, and leave every
/// byte of the file as it was.
fn refused_at_open(at: u64, value: u64, expected: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = qemu_image(dir.path());
    write_u64(&path, at, value);
    let file_before = std::fs::read(&path).unwrap();
    let err = open_and_write(&path, 0).unwrap_err();
    let msg = err.to_string();
    for part in [expected, "read-only", "strata img check -r all"] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
    assert!(
        std::fs::read(&path).unwrap() == file_before,
        "a refused open changed the file"
    );
}

#[test]
fn a_refcount_block_beyond_the_end_of_the_file_is_refused_at_open() {
    refused_at_open(
        REFCOUNT_TABLE + 8,
        0x300000,
        "refcount block 1 at 0x300000 lies beyond the end of the file (0x80000)",
    );
}

#[test]
fn a_refcount_block_over_an_l2_table_is_refused_at_open() {
    refused_at_open(
        REFCOUNT_TABLE + 8,
        L2_TABLE,
        "L2 table of L1 entry 0 at 0x40000 overlaps a refcount block",
    );
}

#[test]
fn an_unaligned_l2_table_is_refused_at_open() {
    refused_at_open(L1_TABLE, (L2_TABLE + 0x200) | COPIED, "not cluster aligned");
}

/// Cuts the image at `len`, then writes new clusters: they must land past
/// every cluster the image references (the cut one included), so what
/// the guest read elsewhere is unchanged and QEMU finds no cluster used
/// twice.
fn truncated_image_takes_writes_past_its_references(len: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = qemu_image(dir.path());
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len).unwrap();
    drop(f);
    let before = guest_read(&path);

    let disk = Disk::open(&path, &OpenOptions::read_write()).unwrap();
    let writes = [(2u64 << 20, 0xc1u8), (3 << 20, 0xc2), (5 << 20, 0xc3)];
    for (at, byte) in writes {
        disk.write_at(&vec![byte; CLUSTER as usize], at).unwrap();
    }
    disk.close().unwrap();

    let mut expected = before;
    for (at, byte) in writes {
        expected[at as usize..(at + CLUSTER) as usize].fill(byte);
    }
    assert!(guest_read(&path) == expected, "guest content changed");
    assert!(
        common::qemu_read(&path, dir.path()) == expected,
        "QEMU reads otherwise"
    );
    common::qemu_check_clean(&path);
}

#[test]
fn a_file_cut_at_a_referenced_cluster_gets_no_cluster_it_references() {
    // The data cluster of guest 1 MiB (0x70000) now lies past the end.
    truncated_image_takes_writes_past_its_references(0x70000);
}

#[test]
fn a_file_cut_inside_a_data_cluster_gets_no_cluster_it_references() {
    // Cut inside the data cluster of guest 64 KiB (0x60000): the one of
    // guest 1 MiB (0x70000) is referenced beyond the new end.
    truncated_image_takes_writes_past_its_references(0x68000);
}

#[test]
fn check_reports_and_repairs_a_data_cluster_over_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let path = qemu_image(dir.path());
    write_u64(&path, L2_TABLE, REFCOUNT_TABLE | COPIED);
    // Marked corrupt by a refused write, as a server would leave it.
    assert!(open_and_write(&path, 0).is_err());
    let before = guest_read(&path);

    let report = check(&path, Repair::None).unwrap();
    assert!(report.corruptions > 0);
    assert!(
        report.messages.iter().any(|m| m.contains(
            "data cluster of guest offset 0x0 is host cluster 0x10000, which holds the refcount table"
        )),
        "{:?}",
        report.messages
    );

    let repaired = check(&path, Repair::All).unwrap();
    assert_eq!(repaired.corruptions, 0, "{:?}", repaired.messages);
    assert!(repaired.corruptions_fixed > 0);
    common::qemu_check_clean(&path);
    assert!(
        guest_read(&path) == before,
        "the repair changed guest content"
    );

    // Writable again, and a write now goes to the guest cluster's own copy.
    let (_, _, tables) = metadata_bytes(&path);
    open_and_write(&path, 0x2000).unwrap();
    assert!(
        metadata_bytes(&path).2 == tables,
        "metadata clusters changed"
    );
    let mut expected = before;
    expected[0x2000..0x3000].fill(0xee);
    assert!(guest_read(&path) == expected);
    common::qemu_check_clean(&path);
}

#[test]
fn a_healthy_image_still_takes_writes_and_checks_clean() {
    let dir = tempfile::tempdir().unwrap();
    let path = qemu_image(dir.path());
    let mut expected = guest_read(&path);
    let disk = Disk::open(&path, &OpenOptions::read_write()).unwrap();
    // In place (guest 0x1000 and 1 MiB) and allocating (9 MiB, the last
    // cluster), then a zero write.
    let writes = [
        (0x1000u64, 0x11u8),
        (1 << 20, 0x22),
        (9 << 20, 0x33),
        (SIZE - CLUSTER, 0x44),
    ];
    for (at, byte) in writes {
        disk.write_at(&vec![byte; 8192], at).unwrap();
        expected[at as usize..at as usize + 8192].fill(byte);
    }
    disk.write_zeroes(4 << 20, CLUSTER).unwrap();
    disk.close().unwrap();
    assert!(guest_read(&path) == expected);
    assert!(common::qemu_read(&path, dir.path()) == expected);
    common::qemu_check_clean(&path);
    assert_eq!(check(&path, Repair::None).unwrap().corruptions, 0);
}

#[test]
fn a_healthy_image_grows_new_metadata_and_checks_clean() {
    // 1 GiB: guest 600 MiB needs a second L2 table, and the writer adds a
    // chain index region: both join the metadata map, and later data
    // writes (in place or not) must neither be refused nor land on them.
    let dir = tempfile::tempdir().unwrap();
    let path = qemu_image_of(dir.path(), 1 << 30, false);
    let disk = Disk::open(&path, &OpenOptions::read_write()).unwrap();
    let writes = [(600u64 << 20, 0x44u8), ((1 << 30) - 8192, 0x55), (0, 0x66)];
    for (at, byte) in writes {
        disk.write_at(&vec![byte; 8192], at).unwrap();
    }
    disk.close().unwrap();
    common::qemu_check_clean(&path);
    assert_eq!(check(&path, Repair::None).unwrap().corruptions, 0);
    for (at, byte) in writes {
        let out = Command::new("qemu-io")
            .args(["-f", "qcow2", "-c"])
            .arg(format!("read -P {byte} {at} 8192"))
            .arg(&path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && !text.contains("Pattern verification failed"),
            "QEMU reads otherwise at {at}: {text}"
        );
    }
    // The rest of the first cluster is qemu-io's.
    let disk = Disk::open(&path, &OpenOptions::read_only()).unwrap();
    let mut buf = vec![0u8; 8192];
    disk.read_at(&mut buf, 8192).unwrap();
    assert!(buf.iter().all(|b| *b == 0x5a));
}

/// Offset of the persistent bitmaps' directory, read from the header
/// extensions of a v3 image.
fn bitmap_directory_offset(path: &Path) -> u64 {
    let file = std::fs::read(path).unwrap();
    let header_len = u32::from_be_bytes(file[100..104].try_into().unwrap()) as usize;
    let mut at = header_len;
    loop {
        let kind = u32::from_be_bytes(file[at..at + 4].try_into().unwrap());
        let len = u32::from_be_bytes(file[at + 4..at + 8].try_into().unwrap()) as usize;
        assert_ne!(kind, 0, "no bitmaps extension");
        if kind == 0x2385_2875 {
            return u64::from_be_bytes(file[at + 24..at + 32].try_into().unwrap());
        }
        at += 8 + len.div_ceil(8) * 8;
    }
}

#[test]
fn a_write_through_an_l2_entry_pointing_at_the_bitmap_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = qemu_image(dir.path());
    let st = Command::new("qemu-img")
        .args(["bitmap", "--add"])
        .arg(&path)
        .arg("b0")
        .status()
        .expect("qemu-img bitmap");
    assert!(st.success(), "qemu-img bitmap --add");
    let directory = bitmap_directory_offset(&path);
    assert_eq!(directory % CLUSTER, 0, "directory at 0x{directory:x}");
    write_u64(&path, L2_TABLE, directory | COPIED);
    // The directory is the file's last cluster, and not a whole one.
    let directory_bytes = |path: &Path| std::fs::read(path).unwrap()[directory as usize..].to_vec();
    let directory_before = directory_bytes(&path);

    let err = open_and_write(&path, 0x2000).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DiskError::Corrupt { .. }), "{msg}");
    assert!(msg.contains("the bitmap directory"), "{msg}");
    let directory_after = directory_bytes(&path);
    assert!(
        directory_after.starts_with(&directory_before),
        "the bitmap directory changed"
    );
}

//! Metadata write-back: what a crash leaves on disk.
//!
//! A copy of the top file taken while the disk is open is what a SIGKILL
//! at that moment would leave (the copy reads the page cache, as the next
//! process would). Taken after a flush, it must hold every write; taken
//! between flushes, it must hold every flushed write, and each range
//! written since then must read as either its old or its new content,
//! never anything else. Every copy must open, repair and check clean.

use std::path::{Path, PathBuf};

mod common;

use common::{qemu_check_clean, qemu_read};
use strata_disk::check::{check, Repair};
use strata_disk::{create, CreateOptions, Disk, OpenOptions};

const MIB: u64 = 1 << 20;
const SIZE: u64 = 32 * MIB;

/// A write: `len` bytes of `byte` at `offset`.
#[derive(Clone, Copy)]
struct W {
    offset: u64,
    len: u64,
    byte: u8,
}

fn apply(model: &mut [u8], w: W) {
    model[w.offset as usize..(w.offset + w.len) as usize].fill(w.byte);
}

fn write(disk: &Disk, w: W) {
    disk.write_at(&vec![w.byte; w.len as usize], w.offset)
        .expect("write");
}

/// Copies `path` as a crash at this instant would leave it.
fn crash_copy(path: &Path, name: &str) -> PathBuf {
    let to = path.with_file_name(name);
    std::fs::copy(path, &to).expect("copy");
    to
}

/// Opens a crash copy for writing (which repairs it), closes it, and
/// returns what it reads; both checkers must find it clean.
fn recover(path: &Path, dir: &Path) -> Vec<u8> {
    let disk = Disk::open(path, &OpenOptions::read_write()).expect("open a crash copy");
    let mut data = vec![0u8; SIZE as usize];
    disk.read_at(&mut data, 0).expect("read");
    disk.close().expect("close");
    let report = check(path, Repair::None).expect("check");
    assert_eq!(report.exit_code(), 0, "{report:?}");
    qemu_check_clean(path);
    assert!(qemu_read(path, dir) == data, "QEMU reads it differently");
    data
}

/// Writes spread over the disk: allocating ones, partial clusters, and
/// overwrites of earlier ones.
fn writes(seed: u64, count: usize, byte: u8) -> Vec<W> {
    let mut x = seed | 1;
    (0..count)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = [4096, 512, 65536, 3 * 65536 + 1000][i % 4];
            let offset = (x % (SIZE - len)) & !511;
            W {
                offset,
                len,
                byte: byte.wrapping_add(i as u8 % 7),
            }
        })
        .collect()
}

#[test]
fn a_crash_keeps_every_flushed_write_and_nothing_torn() {
    for (cluster_size, backing) in [(65536, false), (4096, false), (65536, true)] {
        let dir = tempfile::tempdir().unwrap();
        let mut model = vec![0u8; SIZE as usize];
        let base = dir.path().join("base.qcow2");
        create(
            &base,
            &CreateOptions {
                size: Some(SIZE),
                cluster_size,
                ..CreateOptions::default()
            },
        )
        .expect("create");
        let top = if backing {
            let disk = Disk::open(&base, &OpenOptions::read_write()).unwrap();
            for w in writes(99, 40, 0x10) {
                write(&disk, w);
                apply(&mut model, w);
            }
            disk.close().unwrap();
            let top = dir.path().join("top.qcow2");
            create(
                &top,
                &CreateOptions {
                    size: Some(SIZE),
                    cluster_size,
                    backing: Some("base.qcow2".into()),
                    ..CreateOptions::default()
                },
            )
            .expect("create top");
            top
        } else {
            base
        };
        let disk = Disk::open(&top, &OpenOptions::read_write()).expect("open");
        let first = writes(7, 60, 0x40);
        for &w in &first {
            write(&disk, w);
            apply(&mut model, w);
        }
        disk.flush().expect("flush");
        let flushed = model.clone();

        // Between flushes: allocating writes and overwrites.
        let second = writes(1234, 60, 0x80);
        let mut after = model.clone();
        for &w in &second {
            write(&disk, w);
            apply(&mut after, w);
        }
        let torn = crash_copy(&top, "crash-between.qcow2");
        let got = recover(&torn, dir.path());
        for (i, (g, (old, new))) in got.iter().zip(flushed.iter().zip(&after)).enumerate() {
            assert!(
                g == old || g == new,
                "cluster size {cluster_size}, backing {backing}: byte {i} reads {g:#x}, \
                 neither the flushed {old:#x} nor the newer {new:#x}"
            );
        }
        // Ranges written only before the flush read exactly as flushed.
        let mut touched = vec![false; SIZE as usize];
        for w in &second {
            touched[w.offset as usize..(w.offset + w.len) as usize].fill(true);
        }
        assert!(
            (0..SIZE as usize).all(|i| touched[i] || got[i] == flushed[i]),
            "a flushed write was lost"
        );

        // After a flush, a crash keeps everything.
        disk.flush().expect("flush");
        let whole = crash_copy(&top, "crash-after.qcow2");
        assert!(
            recover(&whole, dir.path()) == after,
            "cluster size {cluster_size}: a flushed write was lost"
        );
        disk.close().expect("close");
        let report = check(&top, Repair::None).expect("check");
        assert_eq!(report.exit_code(), 0, "{report:?}");
        assert!(qemu_read(&top, dir.path()) == after);
    }
}

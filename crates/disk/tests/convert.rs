//! `convert` against QEMU: a chain QEMU built (scattered small extents,
//! runs across copy-step boundaries, zero clusters, overlaps between
//! layers) is flattened to raw and qcow2; QEMU must read the same guest
//! content, find the qcow2 clean, and the raw target must stay as sparse as
//! qemu-img's own.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};

mod common;

use common::qemu_check_clean;
use strata_disk::convert::{convert, CHUNK};
use strata_disk::layer::Format;
use strata_disk::{CreateOptions, Disk, OpenOptions};

const MIB: u64 = 1 << 20;
const SIZE: u64 = 64 * MIB;

/// Runs qemu-img with `args`, asserting success.
fn qemu_img(args: &[&str]) {
    let out = Command::new("qemu-img")
        .args(args)
        .output()
        .expect("qemu-img");
    assert!(
        out.status.success(),
        "qemu-img {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Feeds `commands` to one qemu-io on `image`.
fn qemu_io(image: &Path, commands: &[String]) {
    let mut child = Command::new("qemu-io")
        .args(["-f", "qcow2"])
        .arg(image)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("qemu-io");
    let mut stdin = child.stdin.take().expect("stdin");
    for c in commands {
        writeln!(stdin, "{c}").expect("write to qemu-io");
    }
    drop(stdin);
    assert!(child.wait().expect("qemu-io").success());
}

/// base <- mid <- top in `dir`, 64 MiB, written by qemu-io. Returns the top.
fn build_chain(dir: &Path) -> std::path::PathBuf {
    let base = dir.join("base.qcow2");
    let mid = dir.join("mid.qcow2");
    let top = dir.join("top.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", base.to_str().unwrap(), "64M"]);
    for (child, parent) in [(&mid, &base), (&top, &mid)] {
        qemu_img(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            parent.to_str().unwrap(),
            "-F",
            "qcow2",
            child.to_str().unwrap(),
        ]);
    }
    // Base: one 64 KiB cluster every 192 KiB, and a run across a step edge.
    let mut cmds: Vec<String> = (0..SIZE / (192 << 10))
        .map(|i| format!("write -q -P {} {} 64k", i % 200 + 1, i * (192 << 10)))
        .collect();
    cmds.push(format!("write -q -P 7 {} 3M", CHUNK - MIB));
    qemu_io(&base, &cmds);
    // Mid: 4 KiB writes at odd places, a zero cluster over base data.
    let mut cmds: Vec<String> = (0..200)
        .map(|i| {
            format!(
                "write -q -P 0x{:x} {} 4k",
                0x30 + i % 50,
                i * 313 * 1024 + 4096
            )
        })
        .collect();
    cmds.push(format!("write -q -z {} 64k", 192 << 10));
    cmds.push(format!("write -q -P 0 {} 1M", 40 * MIB));
    qemu_io(&mid, &cmds);
    // Top: 1 MiB runs over both.
    let cmds: Vec<String> = (0..8)
        .map(|i| {
            format!(
                "write -q -P 0x{:x} {} 1M",
                0xa0 + i,
                i * 7 * MIB + 512 * 1024
            )
        })
        .collect();
    qemu_io(&top, &cmds);
    top
}

fn convert_to(src: &Path, dst: &Path, format: Format) {
    let disk = Disk::open(src, &OpenOptions::read_only()).expect("open source");
    let target = CreateOptions {
        format,
        ..CreateOptions::default()
    };
    let mut last = 0;
    convert(&disk, dst, &target, &mut |done, total| {
        assert!(
            done >= last && done <= total,
            "progress {done}/{total} after {last}"
        );
        last = done;
    })
    .expect("convert");
    assert_eq!(last, SIZE, "progress ends at the disk size");
}

#[test]
fn convert_a_chain_matches_qemu_and_stays_sparse() {
    let dir = tempfile::tempdir().unwrap();
    let top = build_chain(dir.path());
    let ours_raw = dir.path().join("ours.raw");
    let ours_qcow2 = dir.path().join("ours.qcow2");
    let theirs_raw = dir.path().join("theirs.raw");
    convert_to(&top, &ours_raw, Format::Raw);
    convert_to(&top, &ours_qcow2, Format::Qcow2);
    qemu_img(&[
        "convert",
        "-O",
        "raw",
        top.to_str().unwrap(),
        theirs_raw.to_str().unwrap(),
    ]);
    let expected = std::fs::read(&theirs_raw).unwrap();
    assert_eq!(std::fs::read(&ours_raw).unwrap(), expected, "raw target");
    qemu_check_clean(&ours_qcow2);
    qemu_img(&[
        "compare",
        "-q",
        "-f",
        "qcow2",
        "-F",
        "raw",
        ours_qcow2.to_str().unwrap(),
        theirs_raw.to_str().unwrap(),
    ]);
    // Sparseness: no more blocks than qemu-img's raw (plus one step of
    // slack for where each tool cuts zero runs).
    let ours = std::fs::metadata(&ours_raw).unwrap().blocks() * 512;
    let theirs = std::fs::metadata(&theirs_raw).unwrap().blocks() * 512;
    assert!(
        ours <= theirs + CHUNK,
        "raw target uses {ours} bytes, qemu-img's {theirs}"
    );
    assert!(ours < SIZE / 2, "raw target is not sparse: {ours} bytes");
}

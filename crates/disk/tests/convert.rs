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

/// Guest size of the multi-run chain: past one 512 MiB L2 table of 64 KiB
/// clusters, and not a whole number of clusters (the last one is partial).
const BIG: u64 = 600 * MIB + 12 * 1024;

/// base <- top in `dir`, [`BIG`] bytes, written by qemu-io: data runs
/// longer than one host run of a convert (8 MiB) and across the first L2
/// table's end, compressed clusters, scattered single clusters with holes
/// between them, a zero cluster over base data, unaligned small writes and
/// the partial last cluster. Returns the top.
fn build_big_chain(dir: &Path) -> std::path::PathBuf {
    let base = dir.join("big-base.qcow2");
    let top = dir.join("big-top.qcow2");
    let size = BIG.to_string();
    qemu_img(&["create", "-q", "-f", "qcow2", base.to_str().unwrap(), &size]);
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        base.to_str().unwrap(),
        "-F",
        "qcow2",
        top.to_str().unwrap(),
    ]);
    let mut cmds = vec![
        // 20 MiB across the end of the first L2 table (512 MiB).
        format!("write -q -P 0x11 {} 20M", 504 * MIB),
        // Compressed clusters, then plain data right after them.
        format!("write -q -c -P 0x22 {} 2M", 100 * MIB),
        format!("write -q -P 0x23 {} 1M", 102 * MIB),
        // The partial last cluster.
        format!("write -q -P 0x24 {} 12k", 600 * MIB),
    ];
    // One cluster every 192 KiB over 16 MiB: holes between them.
    cmds.extend((0..16 * MIB / (192 << 10)).map(|i| {
        format!(
            "write -q -P {} {} 64k",
            i % 200 + 1,
            200 * MIB + i * (192 << 10)
        )
    }));
    qemu_io(&base, &cmds);
    let cmds = vec![
        // A run over part of the compressed clusters and past them.
        format!("write -q -P 0x33 {} 3M", 101 * MIB),
        // A zero cluster over base data, and unaligned small writes.
        format!("write -q -z {} 64k", 510 * MIB),
        format!("write -q -P 0x34 {} 4k", 300 * MIB + 4096),
        format!("write -q -P 0x35 {} 100k", 350 * MIB + 512),
        // 9 MiB of data that is all zero bytes: a convert skips it.
        format!("write -q -P 0 {} 9M", 400 * MIB),
    ];
    qemu_io(&top, &cmds);
    top
}

/// Whether the qcow2 header of `image` has the dirty bit set.
fn dirty_bit(image: &Path) -> bool {
    let header = std::fs::read(image).unwrap();
    let incompatible = u64::from_be_bytes(header[72..80].try_into().unwrap());
    incompatible & 1 != 0
}

#[test]
fn convert_to_qcow2_in_runs_matches_qemu() {
    use strata_disk::convert::{convert_with, ConvertOptions};
    let dir = tempfile::tempdir().unwrap();
    let top = build_big_chain(dir.path());
    let src = Disk::open(&top, &OpenOptions::read_only()).expect("open source");
    let targets = [
        ("default", CreateOptions::default(), false),
        ("flushed", CreateOptions::default(), true),
        (
            "4k-clusters",
            CreateOptions {
                cluster_size: 4096,
                ..CreateOptions::default()
            },
            false,
        ),
        (
            "extended-l2",
            CreateOptions {
                extended_l2: true,
                ..CreateOptions::default()
            },
            false,
        ),
    ];
    for (name, options, flush) in targets {
        let out = dir.path().join(format!("{name}.qcow2"));
        let target = CreateOptions {
            format: Format::Qcow2,
            ..options
        };
        let report = convert_with(
            &src,
            &out,
            &target,
            &ConvertOptions { flush },
            &mut |_, _| {},
        )
        .unwrap_or_else(|e| panic!("convert to {name}: {e}"));
        assert_eq!(report.size, BIG, "{name}: size");
        assert!(!dirty_bit(&out), "{name}: target left marked dirty");
        qemu_check_clean(&out);
        qemu_img(&[
            "compare",
            "-q",
            "-f",
            "qcow2",
            "-F",
            "qcow2",
            top.to_str().unwrap(),
            out.to_str().unwrap(),
        ]);
        // Holes stay holes: about 43 MiB of non-zero data in 600 MiB.
        let used = std::fs::metadata(&out).unwrap().blocks() * 512;
        assert!(used < 64 * MIB, "{name}: target uses {used} bytes");
    }
}

#[test]
fn convert_reads_only_the_data_of_a_sparse_raw_source() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("sparse.raw");
    // 256 GiB, almost all hole: reading it whole would take minutes.
    let size = 256u64 << 30;
    let file = std::fs::File::create(&raw).unwrap();
    file.set_len(size).unwrap();
    let extents = [
        (4096u64, 8192usize),
        (3 * MIB + 512, 5 * MIB as usize),
        (100 << 30, 64 << 10),
        (size - 4096, 4096),
    ];
    for (i, &(at, len)) in extents.iter().enumerate() {
        file.write_all_at(&vec![0x41 + i as u8; len], at).unwrap();
    }
    drop(file);
    let src = Disk::open(
        &raw,
        &OpenOptions {
            format: Some(Format::Raw),
            ..OpenOptions::read_only()
        },
    )
    .expect("open raw source");
    let out = dir.path().join("from-raw.qcow2");
    let target = CreateOptions {
        format: Format::Qcow2,
        ..CreateOptions::default()
    };
    let started = std::time::Instant::now();
    let report = convert(&src, &out, &target, &mut |_, _| {}).expect("convert");
    let seconds = started.elapsed().as_secs_f64();
    assert!(
        seconds < 30.0,
        "converting 256 GiB of holes took {seconds:.1} s: the holes were read"
    );
    assert_eq!(report.size, size);
    qemu_check_clean(&out);
    qemu_img(&[
        "compare",
        "-q",
        "-f",
        "raw",
        "-F",
        "qcow2",
        raw.to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
}

//! Hostile input: images QEMU made, then damaged byte by byte. Every case
//! runs the real `strata` binary and asserts that it
//!
//! - fails (non-zero exit; `check` exits 2 for corruption),
//! - says what is wrong (the message names the field or the problem),
//! - does not panic (no "panicked", exit code not 101, not killed by a
//!   signal) and finishes within a watchdog timeout,
//! - leaves the image byte-for-byte unchanged (read-only commands).
//!
//! Byte positions come from parsing the header in the test, not from
//! hard-coded offsets.

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{at, p, qemu_check, qemu_create, qemu_img, qemu_io, tmp};

/// How long any one command may run before the test kills it and fails.
const TIMEOUT: Duration = Duration::from_secs(20);
/// Host offset bits of L1 and standard L2 entries.
const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
const COPIED: u64 = 1 << 63;
const COMPRESSED: u64 = 1 << 62;

// ---------------------------------------------------------------------------
// Running commands under a watchdog

/// What a finished command did.
#[derive(Debug)]
struct Outcome {
    what: String,
    /// Exit code; `None` if killed by a signal.
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
    /// Peak RSS in KiB, when measured with /usr/bin/time.
    max_rss_kib: Option<u64>,
}

impl Outcome {
    fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    fn describe(&self) -> String {
        format!(
            "`{}` exited with {:?} after {:.2?}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.what, self.code, self.elapsed, self.stdout, self.stderr
        )
    }

    /// No panic, no signal, no sanitizer-ish abort.
    fn assert_no_panic(&self) {
        assert!(
            !self.stderr.contains("panicked") && !self.stdout.contains("panicked"),
            "panic:\n{}",
            self.describe()
        );
        assert_ne!(
            self.code,
            Some(101),
            "panic exit code:\n{}",
            self.describe()
        );
        assert!(
            self.code.is_some(),
            "killed by a signal:\n{}",
            self.describe()
        );
    }

    /// The output mentions every needle (case-insensitive).
    fn assert_mentions(&self, needles: &[&str]) {
        let text = self.text().to_lowercase();
        for n in needles {
            assert!(
                text.contains(&n.to_lowercase()),
                "expected the message to mention {n:?}:\n{}",
                self.describe()
            );
        }
    }
}

/// Runs `cmd`, killing it (and failing the test) after [`TIMEOUT`].
fn run_bounded(mut cmd: Command, what: String) -> Outcome {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let mut out = child.stdout.take().expect("stdout pipe");
    let mut err = child.stderr.take().expect("stderr pipe");
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`{what}` did not finish within {TIMEOUT:?}; killed it");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&out_reader.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned();
    Outcome {
        what,
        code: status.code(),
        stdout,
        stderr,
        elapsed,
        max_rss_kib: None,
    }
}

/// Runs `strata ARGS` under the watchdog.
fn strata(args: &[&str]) -> Outcome {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
    cmd.args(args);
    run_bounded(cmd, format!("strata {}", args.join(" ")))
}

/// Runs `strata ARGS` under /usr/bin/time (when installed) to measure its
/// peak RSS, under the watchdog.
fn strata_measured(args: &[&str]) -> Outcome {
    const TIME: &str = "/usr/bin/time";
    const MARK: &str = "STRATA_TEST_MAXRSS_KIB=";
    if !Path::new(TIME).exists() {
        return strata(args);
    }
    let mut cmd = Command::new(TIME);
    cmd.arg("-f")
        .arg(format!("{MARK}%M"))
        .arg(env!("CARGO_BIN_EXE_strata"))
        .args(args);
    let mut o = run_bounded(cmd, format!("strata {}", args.join(" ")));
    let mut kept = Vec::new();
    for line in o.stderr.lines() {
        if let Some(v) = line.strip_prefix(MARK) {
            o.max_rss_kib = v.trim().parse().ok();
        } else if !line.starts_with("Command exited with non-zero status") {
            kept.push(line);
        }
    }
    o.stderr = kept.join("\n");
    assert!(
        o.max_rss_kib.is_some(),
        "no peak RSS from {TIME}:\n{}",
        o.describe()
    );
    o
}

/// Runs `strata ARGS` on files that must not change, and asserts it failed
/// cleanly with a message mentioning every needle.
fn expect_fail(args: &[&str], needles: &[&str], unchanged: &[&Path]) -> Outcome {
    let before: Vec<Vec<u8>> = unchanged.iter().map(|f| read(f)).collect();
    let o = strata(args);
    o.assert_no_panic();
    assert_ne!(o.code, Some(0), "expected a failure:\n{}", o.describe());
    o.assert_mentions(needles);
    for (f, b) in unchanged.iter().zip(&before) {
        assert!(read(f) == *b, "`{}` modified {}", o.what, f.display());
    }
    o
}

/// Runs `strata ARGS` and asserts it succeeded without touching `unchanged`.
fn expect_ok(args: &[&str], unchanged: &[&Path]) -> Outcome {
    let before: Vec<Vec<u8>> = unchanged.iter().map(|f| read(f)).collect();
    let o = strata(args);
    o.assert_no_panic();
    assert_eq!(o.code, Some(0), "expected success:\n{}", o.describe());
    for (f, b) in unchanged.iter().zip(&before) {
        assert!(read(f) == *b, "`{}` modified {}", o.what, f.display());
    }
    o
}

/// `strata img check` must report corruption (exit 2), mention `needles`,
/// and not modify the image.
fn expect_check_corrupt(img: &Path, needles: &[&str]) -> Outcome {
    let before = read(img);
    let o = strata(&["img", "check", &p(img)]);
    o.assert_no_panic();
    assert_eq!(
        o.code,
        Some(2),
        "check should report corruption:\n{}",
        o.describe()
    );
    o.assert_mentions(needles);
    assert!(
        read(img) == before,
        "check without -r modified {}",
        img.display()
    );
    o
}

// ---------------------------------------------------------------------------
// Reading and patching qcow2 files

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn be32(buf: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(buf[at..at + 4].try_into().unwrap())
}

fn be64(buf: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(buf[at..at + 8].try_into().unwrap())
}

fn put(path: &Path, at: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open for patching");
    f.write_all_at(bytes, at).expect("patch");
}

fn put32(path: &Path, at: u64, v: u32) {
    put(path, at, &v.to_be_bytes());
}

fn put64(path: &Path, at: u64, v: u64) {
    put(path, at, &v.to_be_bytes());
}

fn read64(path: &Path, at: u64) -> u64 {
    let mut b = [0u8; 8];
    let f = std::fs::File::open(path).expect("open");
    f.read_exact_at(&mut b, at).expect("read u64");
    u64::from_be_bytes(b)
}

fn truncate(path: &Path, len: u64) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open for truncating");
    f.set_len(len).expect("truncate");
}

/// The header fields the tests need.
#[derive(Debug)]
struct Hdr {
    cluster_bits: u32,
    l1_size: u32,
    l1_table_offset: u64,
    refcount_table_offset: u64,
}

impl Hdr {
    fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }
}

fn header(path: &Path) -> Hdr {
    let b = read(path);
    assert_eq!(be32(&b, 0), 0x5146_49fb, "not a qcow2 image");
    Hdr {
        cluster_bits: be32(&b, 20),
        l1_size: be32(&b, 36),
        l1_table_offset: be64(&b, 40),
        refcount_table_offset: be64(&b, 48),
    }
}

/// Offset of L1 entry `i`.
fn l1_entry_at(path: &Path, i: u64) -> u64 {
    let h = header(path);
    assert!(i < u64::from(h.l1_size), "L1 index {i} out of range");
    h.l1_table_offset + 8 * i
}

/// Offset of the L2 table L1 entry `i` points to (must be allocated).
fn l2_table(path: &Path, i: u64) -> u64 {
    let t = read64(path, l1_entry_at(path, i)) & OFFSET_MASK;
    assert_ne!(t, 0, "L1 entry {i} is unallocated");
    t
}

/// Offset of the L2 entry of guest cluster `c`.
fn l2_entry_at(path: &Path, c: u64) -> u64 {
    let h = header(path);
    let per_table = h.cluster_size() / 8;
    l2_table(path, c / per_table) + 8 * (c % per_table)
}

/// Header field offsets.
mod field {
    pub const VERSION: u64 = 4;
    pub const L1_SIZE: u64 = 36;
    pub const L1_TABLE_OFFSET: u64 = 40;
    pub const REFCOUNT_TABLE_CLUSTERS: u64 = 56;
}

/// A 4 MiB image with 4 KiB clusters (so two L1 entries) and data in both
/// halves: 0x11 at 0..64k, 0x22 at 2M..2M+8k.
fn base_image(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    let img = at(dir, name);
    qemu_create(&img, "cluster_size=4k", "4M");
    qemu_io(&img, &["write -P 0x11 0 64k", "write -P 0x22 2M 8k"]);
    let h = header(&img);
    assert_eq!(h.cluster_bits, 12);
    assert_eq!(h.l1_size, 2);
    img
}

/// The read-only commands that open an image's chain, each with the exit
/// code it uses for "could not open".
fn readers(img: &Path) -> Vec<Vec<String>> {
    let i = p(img);
    vec![
        vec!["img".into(), "info".into(), i.clone()],
        vec![
            "img".into(),
            "info".into(),
            "--backing-chain".into(),
            i.clone(),
        ],
        vec!["img".into(), "map".into(), i.clone()],
        vec![
            "img".into(),
            "convert".into(),
            "-O".into(),
            "raw".into(),
            i.clone(),
            "/dev/null".into(),
        ],
        vec!["img".into(), "compare".into(), i.clone(), i.clone()],
        vec!["img".into(), "bench".into(), "-c".into(), "4".into(), i],
    ]
}

/// Every read-only command fails on `img` with `needles`, and `check`
/// fails too (exit non-zero, 1 when the header is unusable).
fn all_readers_fail(img: &Path, extra_flags: &[&str], needles: &[&str]) {
    for cmd in readers(img) {
        let mut args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        // Format flags go right after the subcommand.
        for (k, f) in extra_flags.iter().enumerate() {
            args.insert(2 + k, f);
        }
        let o = expect_fail(&args, needles, &[img]);
        if cmd[1] == "compare" {
            assert_eq!(o.code, Some(2), "compare errors exit 2:\n{}", o.describe());
        }
    }
    // Check probes the format as qemu-img does: the format flags apply
    // (a file probed as raw is refused with qemu-img's 63, not read).
    let path = p(img);
    let mut args = vec!["img", "check"];
    args.extend_from_slice(extra_flags);
    args.push(&path);
    let o = expect_fail(&args, needles, &[img]);
    assert_eq!(o.code, Some(1), "{}", o.describe());
}

// ---------------------------------------------------------------------------
// Truncated files

#[test]
fn header_cut_at_50_bytes() {
    let dir = tmp();
    let img = base_image(&dir, "cut.qcow2");
    truncate(&img, 50);
    all_readers_fail(&img, &[], &["truncated qcow2 header", "have 50"]);
}

#[test]
fn file_cut_in_the_middle_of_the_l1_table() {
    let dir = tmp();
    let img = base_image(&dir, "cut.qcow2");
    let h = header(&img);
    // Keep the first L1 entry, cut the second in half.
    truncate(&img, h.l1_table_offset + 12);
    all_readers_fail(
        &img,
        &[],
        &["l1_table_offset", "beyond the end of the file"],
    );
}

#[test]
fn empty_file_given_as_qcow2() {
    let dir = tmp();
    let img = at(&dir, "empty.qcow2");
    std::fs::write(&img, b"").unwrap();
    all_readers_fail(&img, &["-f", "qcow2"], &["truncated qcow2 header"]);
    // Probed, an empty file is an empty raw image, as for qemu-img.
    let o = expect_ok(&["img", "info", &p(&img)], &[&img]);
    o.assert_mentions(&["file format: raw"]);
}

// ---------------------------------------------------------------------------
// Header fields

#[test]
fn bad_magic() {
    let dir = tmp();
    let img = base_image(&dir, "magic.qcow2");
    put(&img, 0, b"QFI\xfc");
    all_readers_fail(&img, &["-f", "qcow2"], &["bad magic 0x514649fc"]);
    // Probed, it is not qcow2 but a raw file (like qemu-img): that works.
    let o = expect_ok(&["img", "info", &p(&img)], &[&img]);
    o.assert_mentions(&["file format: raw"]);
}

#[test]
fn unsupported_versions_1_and_4() {
    let dir = tmp();
    for v in [1u32, 4] {
        let img = base_image(&dir, &format!("v{v}.qcow2"));
        put32(&img, field::VERSION, v);
        all_readers_fail(&img, &[], &[&format!("qcow2 version {v}")]);
    }
}

#[test]
fn l1_table_offset_beyond_eof() {
    let dir = tmp();
    let img = base_image(&dir, "l1.qcow2");
    let len = std::fs::metadata(&img).unwrap().len();
    let h = header(&img);
    let beyond = (len / h.cluster_size() + 16) * h.cluster_size();
    put64(&img, field::L1_TABLE_OFFSET, beyond);
    all_readers_fail(
        &img,
        &[],
        &["l1_table_offset", "beyond the end of the file"],
    );
}

#[test]
fn absurd_l1_size_fails_fast_without_allocating() {
    let dir = tmp();
    let img = base_image(&dir, "l1size.qcow2");
    put32(&img, field::L1_SIZE, 0xffff_ffff);
    all_readers_fail(&img, &[], &["l1_size", "4294967295"]);
    assert_fast_and_small(&img, "l1_size");
}

#[test]
fn absurd_refcount_table_clusters_fails_fast_without_allocating() {
    let dir = tmp();
    let img = base_image(&dir, "rtc.qcow2");
    put32(&img, field::REFCOUNT_TABLE_CLUSTERS, 0xffff_ffff);
    all_readers_fail(&img, &[], &["refcount_table_clusters", "4294967295"]);
    assert_fast_and_small(&img, "refcount_table_clusters");
}

/// Opening must be rejected in well under a second and without touching
/// gigabytes of memory (0xffffffff entries would be 32 GiB of L1 table).
fn assert_fast_and_small(img: &Path, needle: &str) {
    for args in [
        vec!["img", "info", "--backing-chain"],
        vec!["img", "check"],
        vec!["img", "convert", "-O", "raw"],
    ] {
        let mut args = args.clone();
        let i = p(img);
        args.push(&i);
        if args[1] == "convert" {
            args.push("/dev/null");
        }
        let o = strata_measured(&args);
        o.assert_no_panic();
        assert_ne!(o.code, Some(0), "{}", o.describe());
        o.assert_mentions(&[needle]);
        assert!(
            o.elapsed < Duration::from_secs(5),
            "took {:?}:\n{}",
            o.elapsed,
            o.describe()
        );
        if let Some(kib) = o.max_rss_kib {
            assert!(kib < 128 * 1024, "peak RSS {kib} KiB:\n{}", o.describe());
        }
    }
}

// ---------------------------------------------------------------------------
// Tables pointing where they must not

#[test]
fn l1_entry_pointing_beyond_eof() {
    let dir = tmp();
    let img = base_image(&dir, "l2eof.qcow2");
    let len = std::fs::metadata(&img).unwrap().len();
    let beyond = 0x100_0000u64;
    assert!(beyond > len);
    put64(&img, l1_entry_at(&img, 0), COPIED | beyond);
    let unchanged = [img.as_path()];
    // The header is fine, so info (which reads no tables) works.
    expect_ok(&["img", "info", &p(&img)], &unchanged);
    // Reading the first half of the disk must fail, naming the table.
    for args in [
        vec!["img", "convert", "-O", "raw", &p(&img), "/dev/null"],
        vec!["img", "map", &p(&img)],
        vec![
            "img",
            "bench",
            "-c",
            "1",
            "-d",
            "1",
            "-s",
            "4k",
            "-o",
            "0",
            &p(&img),
        ],
    ] {
        let args: Vec<&str> = args.iter().map(|s| s.as_ref()).collect();
        expect_fail(&args, &["L2 table", "0x1000000", "beyond"], &unchanged);
    }
    let o = expect_fail(
        &["img", "compare", &p(&img), &p(&img)],
        &["0x1000000", "beyond"],
        &unchanged,
    );
    assert_eq!(o.code, Some(2));
    // The second half (L1 entry 1) still reads.
    expect_ok(
        &[
            "img",
            "bench",
            "-c",
            "1",
            "-d",
            "1",
            "-s",
            "4k",
            "-o",
            "2M",
            &p(&img),
        ],
        &unchanged,
    );
    expect_check_corrupt(
        &img,
        &["L2 table at 0x1000000", "beyond the end of the file"],
    );
    assert_eq!(qemu_check(&img), 2, "qemu-img check agrees");
}

#[test]
fn overlapping_metadata_is_corruption() {
    let dir = tmp();

    // An L2 entry whose data cluster is the refcount table.
    let img = base_image(&dir, "l2-rt.qcow2");
    let h = header(&img);
    let rt_cluster = h.refcount_table_offset / h.cluster_size();
    put64(&img, l2_entry_at(&img, 0), COPIED | h.refcount_table_offset);
    expect_check_corrupt(
        &img,
        &[&format!("cluster {rt_cluster} refcount=1 reference=2")],
    );
    assert_eq!(qemu_check(&img), 2, "qemu-img check agrees");

    // The L1 entry's L2 table is the refcount table.
    let img = base_image(&dir, "l1-rt.qcow2");
    put64(&img, l1_entry_at(&img, 0), COPIED | h.refcount_table_offset);
    expect_check_corrupt(
        &img,
        &[&format!("cluster {rt_cluster} refcount=1 reference=2")],
    );
    assert_eq!(qemu_check(&img), 2, "qemu-img check agrees");

    // The L1 entry's L2 table is the L1 table itself.
    let img = base_image(&dir, "l1-l1.qcow2");
    let l1_cluster = h.l1_table_offset / h.cluster_size();
    put64(&img, l1_entry_at(&img, 0), COPIED | h.l1_table_offset);
    // Referenced as the L1 table, as an L2 table and (entry 0 read as an L2
    // entry) as a data cluster.
    expect_check_corrupt(
        &img,
        &[&format!("cluster {l1_cluster} refcount=1 reference=3")],
    );
    assert_eq!(qemu_check(&img), 2, "qemu-img check agrees");
    // Reading such an image must still terminate cleanly, whatever it yields.
    let o = strata(&["img", "convert", "-O", "raw", &p(&img), "/dev/null"]);
    o.assert_no_panic();

    // A compressed L2 entry whose stream lies in the header cluster
    // (offset 0: the only way an L2 entry can name cluster 0).
    let img = base_image(&dir, "l2-hdr.qcow2");
    put64(&img, l2_entry_at(&img, 0), COMPRESSED);
    expect_check_corrupt(&img, &["cluster 0 refcount=1 reference=2"]);
    assert_eq!(qemu_check(&img), 2, "qemu-img check agrees");
    // The header is not a deflate stream: reading that cluster fails.
    expect_fail(
        &["img", "convert", "-O", "raw", &p(&img), "/dev/null"],
        &["compressed cluster at 0x0"],
        &[&img],
    );
}

#[test]
fn reserved_bits_in_an_l2_entry() {
    let dir = tmp();
    let img = base_image(&dir, "reserved.qcow2");
    let at0 = l2_entry_at(&img, 0);
    let raw = read64(&img, at0);
    assert_ne!(raw & OFFSET_MASK, 0, "cluster 0 is allocated");
    put64(&img, at0, raw | (1 << 57));
    expect_check_corrupt(&img, &["L2 table", "entry 0", "reserved bits"]);
    assert_eq!(qemu_check(&img), 2, "qemu-img check agrees");
    let unchanged = [img.as_path()];
    // Reads of that cluster fail with the reason...
    expect_fail(
        &["img", "convert", "-O", "raw", &p(&img), "/dev/null"],
        &["reserved bits", &format!("0x{:016x}", raw | (1 << 57))],
        &unchanged,
    );
    expect_fail(
        &[
            "img",
            "bench",
            "-c",
            "1",
            "-d",
            "1",
            "-s",
            "4k",
            "-o",
            "0",
            &p(&img),
        ],
        &["reserved bits"],
        &unchanged,
    );
    expect_fail(&["img", "map", &p(&img)], &["reserved bits"], &unchanged);
    // ...but the neighbouring clusters, resolved in the same cache page,
    // still read.
    for off in ["4k", "60k", "64k", "2M"] {
        expect_ok(
            &[
                "img",
                "bench",
                "-c",
                "1",
                "-d",
                "1",
                "-s",
                "4k",
                "-o",
                off,
                &p(&img),
            ],
            &unchanged,
        );
    }
}

#[test]
fn refcount_table_entry_near_2_pow_64() {
    // Regression: check used to overflow computing the block's end.
    let dir = tmp();
    let img = base_image(&dir, "rt-huge.qcow2");
    let h = header(&img);
    let huge = u64::MAX - h.cluster_size() + 1;
    put64(&img, h.refcount_table_offset, huge);
    expect_check_corrupt(
        &img,
        &[
            &format!("refcount block at 0x{huge:x}"),
            "beyond the end of the file",
        ],
    );
    // Reads do not need refcounts; writes must refuse.
    expect_ok(
        &["img", "convert", "-O", "raw", &p(&img), "/dev/null"],
        &[&img],
    );
    let o = strata(&["img", "bench", "-w", "-c", "1", &p(&img)]);
    o.assert_no_panic();
    assert_ne!(o.code, Some(0), "{}", o.describe());
}

// ---------------------------------------------------------------------------
// Backing chains

/// Commands that open the whole chain of `img`.
fn chain_readers(img: &Path) -> Vec<Vec<String>> {
    readers(img)
        .into_iter()
        .filter(|c| !(c[1] == "info" && c.len() == 3))
        .collect()
}

#[test]
fn backing_chain_that_loops() {
    let dir = tmp();
    let a = at(&dir, "a.qcow2");
    let b = at(&dir, "b.qcow2");
    qemu_create(&a, "", "1M");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "a.qcow2",
        "-F",
        "qcow2",
        &p(&b),
    ]);
    qemu_img(&["rebase", "-u", "-b", "b.qcow2", "-F", "qcow2", &p(&a)]);
    for top in [&a, &b] {
        for cmd in chain_readers(top) {
            let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
            expect_fail(&args, &["loops"], &[&a, &b]);
        }
    }
    // Opening for writing must refuse too, before writing anything.
    expect_fail(
        &["img", "bench", "-w", "-c", "1", &p(&b)],
        &["loops"],
        &[&a, &b],
    );
}

#[test]
fn backing_chain_self_loop() {
    let dir = tmp();
    let a = at(&dir, "self.qcow2");
    qemu_create(&a, "", "1M");
    qemu_img(&["rebase", "-u", "-b", "self.qcow2", "-F", "qcow2", &p(&a)]);
    for cmd in chain_readers(&a) {
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        expect_fail(&args, &["loops"], &[&a]);
    }
    expect_fail(
        &["img", "bench", "-w", "-c", "1", &p(&a)],
        &["loops"],
        &[&a],
    );
    expect_fail(&["img", "index", &p(&a)], &["loops"], &[&a]);
}

#[test]
fn missing_backing_file() {
    let dir = tmp();
    let top = at(&dir, "top.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-u",
        "-b",
        "nope.qcow2",
        "-F",
        "qcow2",
        &p(&top),
        "1M",
    ]);
    for cmd in chain_readers(&top) {
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        expect_fail(&args, &["nope.qcow2", "not found"], &[&top]);
    }
    expect_fail(
        &["img", "bench", "-w", "-c", "1", &p(&top)],
        &["not found"],
        &[&top],
    );
    // The image alone is fine: info without the chain works, as in qemu-img.
    let o = expect_ok(&["img", "info", &p(&top)], &[&top]);
    o.assert_mentions(&["backing file: nope.qcow2"]);
}

// ---------------------------------------------------------------------------
// Features Strata does not write or read

/// Offset of the extended (128-bit) L2 entry of guest cluster `c`; its
/// subcluster bitmap is the 8 bytes after it.
fn ext_l2_entry_at(path: &Path, c: u64) -> u64 {
    let h = header(path);
    let per_table = h.cluster_size() / 16;
    l2_table(path, c / per_table) + 16 * (c % per_table)
}

/// An extended L2 image QEMU wrote: 4 KiB of data in cluster 0, a
/// compressed cluster 2, the rest unallocated.
fn extended_image(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    let img = at(dir, name);
    qemu_create(&img, "extended_l2=on", "1M");
    qemu_io(&img, &["write -P 0x42 0 4k", "write -c -P 0x43 128k 64k"]);
    img
}

#[test]
fn extended_l2_images_are_read() {
    let dir = tmp();
    let img = extended_image(&dir, "ext.qcow2");
    let q = at(&dir, "qemu.raw");
    qemu_img(&["convert", "-O", "raw", &p(&img), &p(&q)]);
    expect_ok(&["img", "compare", &p(&img), &p(&q)], &[&img]);
    expect_ok(&["img", "check", &p(&img)], &[&img]);
}

#[test]
fn extended_l2_subcluster_both_allocated_and_zero() {
    let dir = tmp();
    let img = extended_image(&dir, "both.qcow2");
    let at0 = ext_l2_entry_at(&img, 0) + 8;
    let bitmap = read64(&img, at0);
    assert_eq!(bitmap & 0b11, 0b11, "subclusters 0-1 allocated");
    put64(&img, at0, bitmap | (1 << 5) | (1 << 37));
    expect_check_corrupt(&img, &["entry 0", "subcluster 5 both allocated and zero"]);
    assert_ne!(qemu_check(&img), 0, "qemu-img check agrees");
    expect_fail(
        &["img", "convert", "-O", "raw", &p(&img), "/dev/null"],
        &["L2 entry 0", "subcluster 5 both allocated and zero"],
        &[&img],
    );
    expect_fail(&["img", "map", &p(&img)], &["subcluster 5"], &[&img]);
}

#[test]
fn extended_l2_allocated_subcluster_without_offset() {
    let dir = tmp();
    let img = extended_image(&dir, "nohost.qcow2");
    let at5 = ext_l2_entry_at(&img, 5);
    assert_eq!(read64(&img, at5), 0, "cluster 5 unallocated");
    put64(&img, at5 + 8, 1 << 4);
    expect_check_corrupt(&img, &["entry 5", "subcluster 4", "no host offset"]);
    expect_fail(
        &["img", "convert", "-O", "raw", &p(&img), "/dev/null"],
        &["L2 entry 5", "no host offset"],
        &[&img],
    );
}

#[test]
fn extended_l2_compressed_cluster_with_a_bitmap() {
    let dir = tmp();
    let img = extended_image(&dir, "comp.qcow2");
    let at2 = ext_l2_entry_at(&img, 2);
    assert_ne!(read64(&img, at2) & COMPRESSED, 0, "cluster 2 compressed");
    put64(&img, at2 + 8, 1);
    expect_check_corrupt(&img, &["entry 2", "compressed", "bitmap"]);
    expect_fail(
        &["img", "convert", "-O", "raw", &p(&img), "/dev/null"],
        &["L2 entry 2", "compressed", "bitmap"],
        &[&img],
    );
}

#[test]
fn internal_snapshots_read_but_refuse_writes() {
    let dir = tmp();
    let img = at(&dir, "snap.qcow2");
    qemu_create(&img, "cluster_size=4k", "1M");
    qemu_io(&img, &["write -P 0x5a 0 16k"]);
    qemu_img(&["snapshot", "-c", "snap1", &p(&img)]);
    qemu_io(&img, &["write -P 0x6b 8k 16k"]);
    let unchanged = [img.as_path()];
    // Reading sees the active layer, exactly as QEMU does.
    let q = at(&dir, "qemu.raw");
    qemu_img(&["convert", "-O", "raw", &p(&img), &p(&q)]);
    let s = at(&dir, "strata.raw");
    expect_ok(
        &["img", "convert", "-O", "raw", &p(&img), &p(&s)],
        &unchanged,
    );
    assert!(
        read(&q) == read(&s),
        "Strata and QEMU read the snapshotted image differently"
    );
    expect_ok(&["img", "compare", &p(&img), &p(&q)], &unchanged);
    let o = expect_ok(&["img", "info", &p(&img)], &unchanged);
    o.assert_mentions(&["snap1"]);
    let o = expect_ok(&["img", "check", &p(&img)], &unchanged);
    o.assert_mentions(&["No errors"]);
    assert_eq!(qemu_check(&img), 0);
    // Opening for writing is refused before anything is written.
    expect_fail(
        &["img", "bench", "-w", "-c", "1", &p(&img)],
        &["internal snapshots"],
        &unchanged,
    );
    expect_fail(
        &["img", "index", &p(&img)],
        &["internal snapshots"],
        &unchanged,
    );
}

// ---------------------------------------------------------------------------
// Compressed clusters

fn garbage_compressed(compression: &str, reason: &str) {
    let dir = tmp();
    let src = at(&dir, "src.qcow2");
    let img = at(&dir, "c.qcow2");
    qemu_create(&src, "cluster_size=4k", "1M");
    qemu_io(&src, &["write -P 0x61 0 64k", "write -P 0x62 5000 300"]);
    qemu_img(&[
        "convert",
        "-c",
        "-O",
        "qcow2",
        "-o",
        &format!("cluster_size=4k,compression_type={compression}"),
        &p(&src),
        &p(&img),
    ]);
    // Find cluster 0's compressed stream from its descriptor.
    let h = header(&img);
    let raw = read64(&img, l2_entry_at(&img, 0));
    assert_ne!(raw & COMPRESSED, 0, "cluster 0 is compressed");
    let x = 62 - (h.cluster_bits - 8);
    let stream = raw & ((1u64 << x) - 1);
    let sectors = ((raw >> x) & ((1u64 << (62 - x)) - 1)) + 1;
    let len = sectors * 512 - (stream & 511);
    // Sanity: intact, it reads like QEMU reads it.
    crate::common::assert_same_view(&img, dir.path());
    put(&img, stream, &vec![0xff; len as usize]);
    let unchanged = [img.as_path()];
    let o = expect_fail(
        &["img", "convert", "-O", "raw", &p(&img), "/dev/null"],
        &[&format!("compressed cluster at 0x{stream:x}"), reason],
        &unchanged,
    );
    assert_eq!(o.code, Some(1));
    expect_fail(
        &[
            "img",
            "bench",
            "-c",
            "1",
            "-d",
            "1",
            "-s",
            "512",
            "-o",
            "100",
            &p(&img),
        ],
        &["compressed cluster"],
        &unchanged,
    );
    let o = expect_fail(
        &["img", "compare", &p(&img), &p(&src)],
        &["compressed cluster"],
        &unchanged,
    );
    assert_eq!(o.code, Some(2));
    // Check does not decompress (neither does qemu-img check): still clean.
    expect_ok(&["img", "check", &p(&img)], &unchanged);
}

#[test]
fn garbage_zlib_stream() {
    garbage_compressed("zlib", "deflate");
}

#[test]
fn garbage_zstd_stream() {
    garbage_compressed("zstd", "compressed cluster");
}

/// A tiny file may claim a virtual size of petabytes: passes over the disk
/// must skip what no L1 entry maps instead of stepping through it.
#[test]
fn huge_virtual_size_in_a_tiny_file_is_walked_quickly() {
    let dir = tmp();
    let img = at(&dir, "huge.qcow2");
    qemu_create(&img, "cluster_size=2M", "2P");
    qemu_io(&img, &["write -P 7 1P 4k"]);
    let before = read(&img);
    for args in [
        vec!["img", "map", "--output", "json"],
        vec!["img", "convert", "-O", "raw"],
        vec!["img", "compare"],
        vec!["img", "check"],
    ] {
        let mut args: Vec<String> = args.into_iter().map(String::from).collect();
        args.push(p(&img));
        match args[1].as_str() {
            "convert" => args.push("/dev/null".into()),
            "compare" => args.push(p(&img)),
            _ => {}
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = Instant::now();
        let o = expect_ok(&refs, &[&img]);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{} took {:?}",
            o.what,
            started.elapsed()
        );
        if args[1] == "map" {
            assert!(
                o.stdout.contains("\"start\": 1125899906842624"),
                "{}",
                o.stdout
            );
        }
    }
    assert!(read(&img) == before);
}

/// A reader that goes away ends the command quietly, never with a panic.
#[test]
fn closed_output_pipe_is_not_a_panic() {
    let dir = tmp();
    let img = base_image(&dir, "pipe.qcow2");
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["img", "map", "--output", "json", &p(&img)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!err.contains("panicked"), "{err}");
    assert_ne!(status.code(), Some(101), "{err}");
}

//! Helpers shared by the integration tests: run the real `strata` binary
//! and the real QEMU tools.
#![allow(dead_code)]

pub mod disk;
pub mod process;
pub mod store;

pub use process::{Launch, Proc};

/// Held by the tests that use host-wide resources: the default ports
/// (10809, 10880, ...) that more than one test binds, and the documents'
/// examples, which start servers on them. The tests of this binary run in
/// parallel; these take turns.
pub fn host_ports() -> std::sync::MutexGuard<'static, ()> {
    static HOST_PORTS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HOST_PORTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Runs `strata` with `args`.
pub fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .expect("run strata")
}

/// Runs `strata` and fails the test unless it exits 0.
pub fn strata_ok(args: &[&str]) -> String {
    let out = strata(args);
    assert!(
        out.status.success(),
        "strata {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a tool and fails the test unless it exits 0.
pub fn run_ok(tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool).args(args).output().expect("spawn tool");
    assert!(
        out.status.success(),
        "{tool} {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `qemu-img ARGS`.
pub fn qemu_img(args: &[&str]) -> String {
    run_ok("qemu-img", args)
}

/// Runs qemu-io commands on an image.
pub fn qemu_io(image: &Path, cmds: &[&str]) {
    let mut args: Vec<String> = Vec::new();
    for c in cmds {
        args.push("-c".into());
        args.push((*c).into());
    }
    args.push(image.display().to_string());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_ok("qemu-io", &refs);
    assert!(
        !out.contains("failed") && !out.contains("error"),
        "qemu-io reported an error: {out}"
    );
}

/// `qemu-img check` exit code.
pub fn qemu_check(image: &Path) -> i32 {
    let out = Command::new("qemu-img")
        .args(["check", &image.display().to_string()])
        .output()
        .expect("qemu-img check");
    if !out.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    }
    out.status.code().unwrap_or(-1)
}

/// Reads the guest content of `image` with QEMU.
pub fn qemu_raw(image: &Path, dir: &Path) -> Vec<u8> {
    let out = dir.join("qemu-view.raw");
    qemu_img(&["convert", "-O", "raw", &p(image), &p(&out)]);
    let data = std::fs::read(&out).expect("read qemu raw");
    std::fs::remove_file(&out).ok();
    data
}

/// Reads the guest content of `image` with Strata.
pub fn strata_raw(image: &Path, dir: &Path) -> Vec<u8> {
    let out = dir.join("strata-view.raw");
    strata_ok(&["img", "convert", "-O", "raw", &p(image), &p(&out)]);
    let data = std::fs::read(&out).expect("read strata raw");
    std::fs::remove_file(&out).ok();
    data
}

/// Asserts that Strata and QEMU read `image` identically.
pub fn assert_same_view(image: &Path, dir: &Path) {
    let q = qemu_raw(image, dir);
    let s = strata_raw(image, dir);
    assert_eq!(q.len(), s.len(), "sizes differ for {}", image.display());
    if let Some(i) = q.iter().zip(&s).position(|(a, b)| a != b) {
        panic!(
            "{}: Strata and QEMU differ at byte {i} (qemu {:#x}, strata {:#x})",
            image.display(),
            q[i],
            s[i]
        );
    }
}

/// Path as &str-able String.
pub fn p(path: &Path) -> String {
    path.display().to_string()
}

/// A temp dir.
pub fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Path inside a temp dir.
pub fn at(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

/// `qemu-img create -q -f qcow2 [-o OPTS] IMAGE SIZE`.
pub fn qemu_create(image: &Path, opts: &str, size: &str) {
    let path = p(image);
    let mut args = vec!["create", "-q", "-f", "qcow2"];
    if !opts.is_empty() {
        args.extend(["-o", opts]);
    }
    args.extend([path.as_str(), size]);
    qemu_img(&args);
}

/// `qemu-img create -q -f qcow2 -b BACKING -F qcow2 IMAGE [SIZE]`: an
/// overlay on a qcow2 backing file named as the overlay will record it
/// (relative to the overlay's folder), as large as the backing file
/// unless `size` is given.
pub fn qemu_overlay(image: &Path, backing: &str, size: Option<&str>) {
    let path = p(image);
    let mut args = vec!["create", "-q", "-f", "qcow2", "-b", backing, "-F", "qcow2"];
    args.push(&path);
    args.extend(size);
    qemu_img(&args);
}

/// `(start, length, data)` of every extent of a `map --output json`
/// listing, as qemu-img and strata print it.
pub fn map_runs(json: &str) -> Vec<(u64, u64, bool)> {
    let v: serde_json::Value = serde_json::from_str(json).expect("map json");
    v.as_array()
        .expect("map is a list")
        .iter()
        .map(|e| {
            (
                e["start"].as_u64().expect("start"),
                e["length"].as_u64().expect("length"),
                e["data"] == true,
            )
        })
        .collect()
}

/// A Python interpreter that has libnbd's `nbd` module (python3-libnbd
/// installs it for the system Python, which may not be first on PATH).
pub fn nbd_python() -> String {
    for py in ["/usr/bin/python3", "python3"] {
        let ok = Command::new(py)
            .args(["-c", "import nbd"])
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return py.to_string();
        }
    }
    panic!("no python3 with the nbd module (apt-get install python3-libnbd)");
}

/// Deterministic pseudo-random bytes (xorshift), the same for a seed in
/// every test.
pub fn pattern(size: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Runs a tool, returning its output whatever its exit status.
pub fn run_tool(tool: &str, args: &[&str]) -> Output {
    Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("spawn {tool}: {e}"))
}

/// What a process printed, stdout then stderr.
pub fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The image lock bytes (QEMU's OFD locks) any process holds on `path`,
/// from /proc/locks, sorted.
pub fn lock_bytes(path: &Path) -> Vec<u64> {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(path).expect("stat").ino();
    let locks = std::fs::read_to_string("/proc/locks").expect("read /proc/locks");
    let mut bytes: Vec<u64> = locks
        .lines()
        .filter_map(|line| {
            // "1: OFDLCK ADVISORY READ -1 fd:01:1234 100 101": the kernel
            // merges a holder's adjacent bytes into one range.
            let fields: Vec<&str> = line.split_whitespace().collect();
            let inode = fields.get(5)?.rsplit(':').next()?.parse::<u64>().ok()?;
            if inode != ino || fields.get(1) != Some(&"OFDLCK") {
                return None;
            }
            let start = fields.get(6)?.parse::<u64>().ok()?;
            let end = fields.get(7)?.parse::<u64>().ok()?;
            Some(start..=end)
        })
        .flatten()
        .collect();
    bytes.sort_unstable();
    bytes.dedup();
    bytes
}

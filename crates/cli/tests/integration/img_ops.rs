//! `strata img resize | rebase | commit | amend | measure` against
//! qemu-img 10: each operation is done by qemu-img on one copy of a chain
//! and by strata on another, and the results must read the same, pass
//! `qemu-img check` and report the same size and backing file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::common::*;

/// A chain built twice: in `q` for qemu-img, in `s` for strata.
struct Twin {
    root: tempfile::TempDir,
}

impl Twin {
    /// Runs `build` in a directory, then copies every file it made.
    fn new(build: impl Fn(&Path)) -> Twin {
        let root = tmp();
        let (q, s) = (root.path().join("q"), root.path().join("s"));
        std::fs::create_dir(&q).expect("mkdir q");
        std::fs::create_dir(&s).expect("mkdir s");
        build(&q);
        for entry in std::fs::read_dir(&q).expect("read q") {
            let entry = entry.expect("entry");
            std::fs::copy(entry.path(), s.join(entry.file_name())).expect("copy");
        }
        Twin { root }
    }

    fn q(&self, name: &str) -> PathBuf {
        self.root.path().join("q").join(name)
    }

    fn s(&self, name: &str) -> PathBuf {
        self.root.path().join("s").join(name)
    }

    /// Asserts that qemu-img's and strata's `name` are the same image.
    fn assert_same(&self, name: &str) {
        let (q, s) = (self.q(name), self.s(name));
        let cmp = Command::new("qemu-img")
            .args(["compare", &p(&q), &p(&s)])
            .output()
            .expect("qemu-img compare");
        assert!(
            cmp.status.success(),
            "{name}: qemu-img compare says the results differ: {}",
            String::from_utf8_lossy(&cmp.stdout)
        );
        // Guest bytes as raw files, compared in chunks (images are up to
        // 1.2 GiB): QEMU's view of both results, and Strata's of its own (a
        // stale chain index would show there).
        let raw = |name: &str| self.root.path().join(name);
        let (qr, sr, tr) = (raw("q.raw"), raw("s.raw"), raw("t.raw"));
        qemu_img(&["convert", "-O", "raw", &p(&q), &p(&qr)]);
        qemu_img(&["convert", "-O", "raw", &p(&s), &p(&sr)]);
        strata_ok(&["img", "convert", "-O", "raw", &p(&s), &p(&tr)]);
        assert_eq!(
            first_difference(&qr, &sr),
            None,
            "{name}: guest bytes differ"
        );
        assert_eq!(
            first_difference(&sr, &tr),
            None,
            "{name}: strata reads its result differently"
        );
        for f in [qr, sr, tr] {
            std::fs::remove_file(f).ok();
        }
        if is_qcow2(&s) {
            assert_eq!(qemu_check(&s), 0, "{name}: qemu-img check is not clean");
        }
        let (qi, si) = (info(&q), info(&s));
        for key in [
            "virtual-size",
            "backing-filename",
            "backing-filename-format",
        ] {
            assert_eq!(qi[key], si[key], "{name}: {key} differs");
        }
    }
}

/// The first offset where two files differ (a length difference counts).
fn first_difference(a: &Path, b: &Path) -> Option<u64> {
    let open = |f: &Path| std::fs::File::open(f).expect("open raw");
    let (mut fa, mut fb) = (open(a), open(b));
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut at = 0u64;
    loop {
        let (na, nb) = (read_full(&mut fa, &mut ba), read_full(&mut fb, &mut bb));
        let n = na.min(nb);
        // A memcmp first: a byte loop over GiBs is slow in debug builds.
        if ba[..n] == bb[..n] && na == nb {
            if na == 0 {
                return None;
            }
            at += na as u64;
            continue;
        }
        if let Some(i) = ba[..n].iter().zip(&bb[..n]).position(|(x, y)| x != y) {
            return Some(at + i as u64);
        }
        if na != nb {
            return Some(at + n as u64);
        }
        if na == 0 {
            return None;
        }
        at += na as u64;
    }
}

/// Reads until `buf` is full or the file ends.
fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> usize {
    use std::io::Read;
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).expect("read raw") {
            0 => break,
            k => n += k,
        }
    }
    n
}

fn is_qcow2(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|b| b.starts_with(b"QFI\xfb"))
}

fn info(path: &Path) -> serde_json::Value {
    let out = qemu_img(&["info", "--output", "json", "-U", &p(path)]);
    serde_json::from_str(&out).expect("info json")
}

/// The chain most tests use: base (8M) <- mid <- top, with data in each
/// layer, a zero cluster over older data and a partial cluster.
fn chain(dir: &Path) {
    let (b, m, t) = (
        dir.join("base.qcow2"),
        dir.join("mid.qcow2"),
        dir.join("top.qcow2"),
    );
    qemu_create(&b, "", "8M");
    qemu_io(
        &b,
        &["write -P 1 0 1M", "write -P 2 4M 64k", "write -P 6 7M 1M"],
    );
    qemu_overlay(&m, "base.qcow2", None);
    qemu_io(&m, &["write -P 5 2M 128k", "write -z 7M 64k"]);
    qemu_overlay(&t, "mid.qcow2", None);
    qemu_io(
        &t,
        &["write -P 3 512k 1M", "write -P 4 4M 4k", "write -z 2M 64k"],
    );
}

fn run_both(twin: &Twin, qemu: &[&str], strata_args: &[&str], name: &str) {
    let q = p(&twin.q(name));
    let s = p(&twin.s(name));
    let mut qa: Vec<&str> = qemu.to_vec();
    qa.push(&q);
    qemu_img(&qa);
    let mut sa = vec!["img"];
    sa.extend_from_slice(strata_args);
    sa.push(&s);
    strata_ok(&sa);
}

#[test]
fn resize_grows_and_shrinks_qcow2_like_qemu_img() {
    let twin = Twin::new(|d| {
        let a = d.join("a.qcow2");
        qemu_create(&a, "", "100M");
        qemu_io(
            &a,
            &["write -P 7 0 64k", "write -P 8 50M 1M", "write -P 9 99M 1M"],
        );
    });
    let name = "a.qcow2";
    // 100M needs one L1 entry, 1200M three: the L1 table is rewritten.
    let grow = |size: &str| {
        qemu_img(&["resize", "-q", &p(&twin.q(name)), size]);
        strata_ok(&["img", "resize", "-q", &p(&twin.s(name)), size]);
    };
    grow("1200M");
    twin.assert_same(name);
    qemu_img(&["resize", "-q", "--shrink", &p(&twin.q(name)), "40M"]);
    strata_ok(&["img", "resize", "-q", "--shrink", &p(&twin.s(name)), "40M"]);
    twin.assert_same(name);
    // The dropped data must not come back.
    grow("+60M");
    twin.assert_same(name);
    qemu_img(&["resize", "-q", "--shrink", &p(&twin.q(name)), "-36M"]);
    strata_ok(&["img", "resize", "-q", "--shrink", &p(&twin.s(name)), "-36M"]);
    twin.assert_same(name);
}

#[test]
fn resize_with_small_clusters_grows_a_multi_cluster_l1_table() {
    let twin = Twin::new(|d| {
        let a = d.join("a.qcow2");
        qemu_create(&a, "cluster_size=4096", "1M");
        qemu_io(&a, &["write -P 7 0 8k", "write -P 8 1020k 4k"]);
    });
    // 4 KiB clusters: one L1 cluster maps 1 GiB, so 1100M needs two.
    let (q, s) = (p(&twin.q("a.qcow2")), p(&twin.s("a.qcow2")));
    qemu_img(&["resize", "-q", &q, "1100M"]);
    strata_ok(&["img", "resize", "-q", &s, "1100M"]);
    qemu_io(&twin.q("a.qcow2"), &["write -P 1 1090M 64k"]);
    qemu_io(&twin.s("a.qcow2"), &["write -P 1 1090M 64k"]);
    twin.assert_same("a.qcow2");
}

#[test]
fn resize_of_an_overlay_hides_a_longer_backing_file_like_qemu_img() {
    let twin = Twin::new(|d| {
        let (b, t) = (d.join("base.qcow2"), d.join("top.qcow2"));
        qemu_create(&b, "", "8M");
        qemu_io(&b, &["write -P 1 0 8M"]);
        qemu_img(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            "base.qcow2",
            "-F",
            "qcow2",
            &p(&t),
            "4M",
        ]);
        qemu_io(&t, &["write -P 2 1M 64k"]);
    });
    qemu_img(&["resize", "-q", &p(&twin.q("top.qcow2")), "12M"]);
    strata_ok(&["img", "resize", &p(&twin.s("top.qcow2")), "12M"]);
    twin.assert_same("top.qcow2");
}

#[test]
fn resize_of_a_raw_image_truncates_it() {
    let twin = Twin::new(|d| {
        let a = d.join("a.raw");
        std::fs::write(&a, pattern(3 << 20, 11)).expect("write raw");
    });
    let (q, s) = (p(&twin.q("a.raw")), p(&twin.s("a.raw")));
    qemu_img(&["resize", "-q", "-f", "raw", &q, "+1M"]);
    strata_ok(&["img", "resize", "-q", "-f", "raw", &s, "+1M"]);
    twin.assert_same("a.raw");
    qemu_img(&["resize", "-q", "-f", "raw", "--shrink", &q, "-2560k"]);
    strata_ok(&["img", "resize", "-q", "-f", "raw", "--shrink", &s, "-2560k"]);
    assert_eq!(std::fs::read(&q).expect("q"), std::fs::read(&s).expect("s"));
}

#[test]
fn safe_rebase_onto_the_base_and_to_standalone_matches_qemu_img() {
    let twin = Twin::new(chain);
    let rebase = |args: &[&str]| {
        let mut qa = vec!["rebase"];
        qa.extend_from_slice(args);
        let q = p(&twin.q("top.qcow2"));
        qa.push(&q);
        qemu_img(&qa);
        let mut sa = vec!["img", "rebase"];
        sa.extend_from_slice(args);
        let s = p(&twin.s("top.qcow2"));
        sa.push(&s);
        strata_ok(&sa);
    };
    // Skips mid: what mid held must be copied into top.
    rebase(&["-b", "base.qcow2", "-F", "qcow2"]);
    twin.assert_same("top.qcow2");
    assert_eq!(info(&twin.s("top.qcow2"))["backing-filename"], "base.qcow2");
    rebase(&["-p", "-b", ""]);
    twin.assert_same("top.qcow2");
    assert!(info(&twin.s("top.qcow2")).get("backing-filename").is_none());
}

#[test]
fn unsafe_rebase_only_rewrites_the_name() {
    let twin = Twin::new(chain);
    std::fs::copy(twin.q("mid.qcow2"), twin.q("mid-copy.qcow2")).expect("copy");
    std::fs::copy(twin.s("mid.qcow2"), twin.s("mid-copy.qcow2")).expect("copy");
    run_both(
        &twin,
        &["rebase", "-u", "-b", "mid-copy.qcow2", "-F", "qcow2"],
        &["rebase", "-u", "-b", "mid-copy.qcow2", "-F", "qcow2"],
        "top.qcow2",
    );
    twin.assert_same("top.qcow2");
    assert_eq!(
        info(&twin.s("top.qcow2"))["backing-filename"],
        "mid-copy.qcow2"
    );
}

#[test]
fn commit_into_the_backing_file_empties_the_top_like_qemu_img() {
    let twin = Twin::new(chain);
    run_both(&twin, &["commit", "-q"], &["commit", "-q"], "top.qcow2");
    for name in ["mid.qcow2", "top.qcow2", "base.qcow2"] {
        twin.assert_same(name);
    }
    // The top reads entirely through to mid now, in both.
    let map = strata_ok(&["img", "map", "--output", "json", &p(&twin.s("top.qcow2"))]);
    let qmap = qemu_img(&["map", "--output", "json", &p(&twin.q("top.qcow2"))]);
    let depth = |json: &str| -> Vec<u64> {
        let v: serde_json::Value = serde_json::from_str(json).expect("map json");
        v.as_array()
            .expect("list")
            .iter()
            .filter(|e| e["data"] == true)
            .map(|e| e["depth"].as_u64().unwrap_or(0))
            .collect()
    };
    assert!(depth(&qmap).iter().all(|&d| d > 0), "qemu: top not empty");
    assert!(
        depth(&map).iter().all(|&d| d > 0),
        "strata: top not empty: {map}"
    );
}

#[test]
fn commit_to_a_named_base_and_with_d_keeps_the_top_like_qemu_img() {
    let twin = Twin::new(chain);
    run_both(
        &twin,
        &["commit", "-q", "-b", &p(&twin.q("base.qcow2"))],
        &["commit", "-q", "-b", &p(&twin.s("base.qcow2"))],
        "top.qcow2",
    );
    for name in ["base.qcow2", "top.qcow2"] {
        twin.assert_same(name);
    }
    let twin = Twin::new(chain);
    run_both(
        &twin,
        &["commit", "-q", "-d"],
        &["commit", "-q", "-d"],
        "top.qcow2",
    );
    for name in ["base.qcow2", "mid.qcow2", "top.qcow2"] {
        twin.assert_same(name);
    }
}

#[test]
fn commit_into_a_smaller_raw_base_grows_it_like_qemu_img() {
    let twin = Twin::new(|d| {
        let (b, t) = (d.join("base.raw"), d.join("top.qcow2"));
        std::fs::write(&b, pattern(4 << 20, 5)).expect("write raw");
        qemu_img(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            "base.raw",
            "-F",
            "raw",
            &p(&t),
            "8M",
        ]);
        qemu_io(
            &t,
            &["write -P 2 1M 64k", "write -z 2M 1M", "write -P 3 6M 1M"],
        );
    });
    run_both(&twin, &["commit", "-q"], &["commit", "-q"], "top.qcow2");
    twin.assert_same("top.qcow2");
    let (q, s) = (twin.q("base.raw"), twin.s("base.raw"));
    assert!(
        std::fs::read(q).expect("q") == std::fs::read(s).expect("s"),
        "raw bases differ"
    );
}

/// A chain made by strata, whose top carries a valid chain index.
fn strata_chain(dir: &Path) {
    let (b, t) = (p(&dir.join("base.qcow2")), p(&dir.join("top.qcow2")));
    strata_ok(&["img", "create", "-q", "-f", "qcow2", &b, "16M"]);
    let write = |image: &str, offset: &str, byte: &str| {
        let args = ["-c", "4", "-d", "1", "-s", "64k", "-S", "1M", "-o", offset];
        let mut all = vec!["img", "bench", "-w", "--pattern", byte];
        all.extend_from_slice(&args);
        all.push(image);
        strata_ok(&all);
    };
    write(&b, "0", "0x11");
    strata_ok(&["img", "snapshot", "-q", &b, &t]);
    write(&t, "512k", "0x22");
}

#[test]
fn operations_on_a_strata_chain_with_an_index_match_qemu_img() {
    let twin = Twin::new(strata_chain);
    // Autoclear bit 62 (big-endian u64 at byte 88): Strata's index is valid.
    let header = std::fs::read(twin.s("top.qcow2")).expect("read top");
    assert_ne!(header[88] & 0x40, 0, "the strata chain has no valid index");
    let (q, s) = (p(&twin.q("top.qcow2")), p(&twin.s("top.qcow2")));
    qemu_img(&["resize", "-q", &q, "+16M"]);
    strata_ok(&["img", "resize", "-q", &s, "+16M"]);
    twin.assert_same("top.qcow2");
    let twin = Twin::new(strata_chain);
    run_both(
        &twin,
        &["rebase", "-b", ""],
        &["rebase", "-b", ""],
        "top.qcow2",
    );
    twin.assert_same("top.qcow2");
    let twin = Twin::new(strata_chain);
    run_both(&twin, &["commit", "-q"], &["commit", "-q"], "top.qcow2");
    twin.assert_same("base.qcow2");
    twin.assert_same("top.qcow2");
}

#[test]
fn amend_changes_lazy_refcounts_and_refuses_a_new_backing_file_like_qemu_img() {
    let twin = Twin::new(chain);
    let lazy = |path: &Path| info(path)["format-specific"]["data"]["lazy-refcounts"].clone();
    run_both(
        &twin,
        &["amend", "-o", "lazy_refcounts=on"],
        &["amend", "-o", "lazy_refcounts=on"],
        "top.qcow2",
    );
    assert_eq!(lazy(&twin.s("top.qcow2")), true);
    assert_eq!(lazy(&twin.q("top.qcow2")), lazy(&twin.s("top.qcow2")));
    twin.assert_same("top.qcow2");
    // As in qemu-img 10, repeating the backing file is accepted...
    let same = "lazy_refcounts=off,backing_file=mid.qcow2,backing_fmt=qcow2";
    run_both(
        &twin,
        &["amend", "-o", same],
        &["amend", "-o", same],
        "top.qcow2",
    );
    assert_eq!(lazy(&twin.s("top.qcow2")), false);
    twin.assert_same("top.qcow2");
    // ...and changing it is refused by both, leaving the file as it was.
    let change = ["amend", "-o", "backing_file=base.qcow2,backing_fmt=qcow2"];
    let q = Command::new("qemu-img")
        .args(change)
        .arg(twin.q("top.qcow2"))
        .output()
        .expect("qemu-img amend");
    assert!(
        !q.status.success(),
        "qemu-img 10 refuses a new backing file"
    );
    let mut sa = vec!["img"];
    sa.extend_from_slice(&change);
    let s = p(&twin.s("top.qcow2"));
    sa.push(&s);
    refused(&twin.s(""), &sa, "rebase");
}

#[test]
fn measure_prints_qemu_img_figures() {
    let dir = tmp();
    chain(dir.path());
    let sparse = dir.path().join("sparse.raw");
    {
        let f = std::fs::File::create(&sparse).expect("create raw");
        f.set_len(64 << 20).expect("size raw");
        use std::os::unix::fs::FileExt;
        f.write_all_at(&pattern(200 << 10, 3), 10 << 20)
            .expect("write raw");
        f.write_all_at(&pattern(4096, 4), 40 << 20)
            .expect("write raw");
    }
    let top = p(&dir.path().join("top.qcow2"));
    let base = p(&dir.path().join("base.qcow2"));
    let raw = p(&sparse);
    let cases: Vec<Vec<&str>> = vec![
        vec!["-O", "qcow2", "--size", "10G"],
        vec!["-O", "qcow2", "-o", "cluster_size=4k", "--size", "1G"],
        vec![
            "-O",
            "qcow2",
            "-o",
            "refcount_bits=64,cluster_size=512",
            "--size",
            "100M",
        ],
        vec![
            "-O",
            "qcow2",
            "-o",
            "extended_l2=on,cluster_size=128k",
            "--size",
            "5G",
        ],
        vec!["-O", "qcow2", "-o", "preallocation=full", "--size", "300M"],
        vec!["-O", "raw", "--size", "123456789"],
        vec!["-O", "qcow2", &top],
        vec!["-O", "qcow2", "-o", "cluster_size=4k", &top],
        vec!["-O", "qcow2", "-o", "cluster_size=2M", &base],
        vec!["-O", "qcow2", "-o", "backing_file=x.qcow2", &top],
        vec!["-O", "raw", &top],
        vec!["-O", "qcow2", "-f", "raw", &raw],
        vec!["-O", "qcow2", "-o", "compat=0.10", &top],
    ];
    for case in cases {
        let mut qa = vec!["measure", "--output", "json"];
        qa.extend_from_slice(&case);
        let mut sa = vec!["img", "measure", "--output", "json"];
        sa.extend_from_slice(&case);
        let qv: serde_json::Value = serde_json::from_str(&qemu_img(&qa)).expect("qemu json");
        let sv: serde_json::Value = serde_json::from_str(&strata_ok(&sa)).expect("strata json");
        assert_eq!(qv, sv, "measure {case:?}");
    }
    let human = ["-O", "qcow2", top.as_str()];
    let mut qa = vec!["measure"];
    qa.extend_from_slice(&human);
    let mut sa = vec!["img", "measure"];
    sa.extend_from_slice(&human);
    assert_eq!(qemu_img(&qa).trim(), strata_ok(&sa).trim());
}

/// Every file of a directory, by name.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let e = e.expect("entry");
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("read"),
            )
        })
        .collect()
}

/// Runs strata, expects a failure whose message contains `needle`, and
/// checks that no file of `dir` changed.
fn refused(dir: &Path, args: &[&str], needle: &str) {
    let before = snapshot(dir);
    let out = strata(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "strata {args:?} should fail");
    assert!(
        err.contains(needle),
        "strata {args:?}: message {err:?} lacks {needle:?}"
    );
    assert!(before == snapshot(dir), "strata {args:?} changed a file");
}

#[test]
fn bad_input_is_refused_without_changing_a_byte() {
    let dir = tmp();
    chain(dir.path());
    let d = dir.path();
    let top = p(&d.join("top.qcow2"));
    let base = p(&d.join("base.qcow2"));
    refused(d, &["img", "resize", &top, "4M"], "--shrink");
    refused(d, &["img", "resize", &top, "-1M"], "--shrink");
    refused(
        d,
        &["img", "rebase", "-b", "base.qcow2", &top],
        "backing format must be specified",
    );
    refused(
        d,
        &["img", "rebase", "-b", "missing.qcow2", "-F", "qcow2", &top],
        "could not open new backing file",
    );
    refused(d, &["img", "commit", &base], "does not have a backing file");
    refused(d, &["img", "commit", "-b", &top, &top], "did not find");
    refused(
        d,
        &["img", "amend", "-o", "cluster_size=4k", &top],
        "cluster_size",
    );
    refused(d, &["img", "amend", "-o", "compat=0.10", &top], "compat");
    refused(
        d,
        &[
            "img",
            "measure",
            "-O",
            "raw",
            "-o",
            "cluster_size=4k",
            "--size",
            "1G",
        ],
        "cluster_size",
    );
}

/// A qemu-io that holds `image` open for writing until killed.
struct Holder(Child);

impl Holder {
    /// qemu-io with `image` open (`-r`: read-only, as a VM holds a
    /// backing file), once its locks are taken.
    fn new(image: &Path, read_only: bool) -> Holder {
        let mut args = vec!["-c", "sleep 60000"];
        if read_only {
            args.push("-r");
        }
        let path = p(image);
        args.push(&path);
        let child = Command::new("qemu-io")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn qemu-io");
        // Wait until the file's OFD locks show in /proc/locks.
        for _ in 0..200 {
            if !lock_bytes(image).is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        Holder(child)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_image_in_use_is_refused() {
    let dir = tmp();
    chain(dir.path());
    let d = dir.path();
    let top = p(&d.join("top.qcow2"));
    let _holder = Holder::new(&d.join("top.qcow2"), false);
    refused(d, &["img", "resize", &top, "+1M"], "lock");
    refused(
        d,
        &["img", "rebase", "-b", "base.qcow2", "-F", "qcow2", &top],
        "lock",
    );
    refused(
        d,
        &[
            "img",
            "rebase",
            "-u",
            "-b",
            "base.qcow2",
            "-F",
            "qcow2",
            &top,
        ],
        "lock",
    );
    refused(d, &["img", "commit", &top], "lock");
    refused(
        d,
        &["img", "amend", "-o", "lazy_refcounts=on", &top],
        "lock",
    );
    refused(d, &["img", "measure", "-O", "qcow2", &top], "lock");
}

#[test]
fn commit_into_a_base_others_read_is_refused() {
    let dir = tmp();
    chain(dir.path());
    let d = dir.path();
    let _reader = Holder::new(&d.join("mid.qcow2"), true);
    let top = p(&d.join("top.qcow2"));
    refused(d, &["img", "commit", &top], "lock");
}

/// How many fsync/fdatasync calls `strata ARGS` makes, counted by strace.
fn syncs_of(args: &[&str]) -> u64 {
    let out = Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-e",
            "trace=fsync,fdatasync",
            "-o",
            "/dev/stderr",
        ])
        .arg(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .expect("strace is needed for this test (scripts/test.sh installs it)");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "strata {args:?}: {said}");
    said.lines()
        .filter(|l| l.contains("fsync(") || l.contains("fdatasync("))
        .count() as u64
}

/// `convert -t CACHE` as qemu-img's: the default (`unsafe`) does not wait
/// for the disk before the clean header, `writeback` syncs the target
/// before it; both give the same, clean image. A cache mode qemu-img does
/// not know is refused.
#[test]
fn convert_cache_mode_decides_whether_the_target_is_synced() {
    let dir = tmp();
    let src = dir.path().join("src.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &p(&src), "64M"]);
    qemu_io(&src, &["write -P 0x5c 0 3M", "write -P 0xc5 40M 1M"]);
    let fast = dir.path().join("fast.qcow2");
    let durable = dir.path().join("durable.qcow2");
    let unsafe_syncs = syncs_of(&["img", "convert", "-O", "qcow2", &p(&src), &p(&fast)]);
    let durable_syncs = syncs_of(&[
        "img",
        "convert",
        "-O",
        "qcow2",
        "-t",
        "writeback",
        &p(&src),
        &p(&durable),
    ]);
    assert!(
        durable_syncs > unsafe_syncs,
        "-t writeback made {durable_syncs} syncs, the default {unsafe_syncs}"
    );
    for target in [&fast, &durable] {
        qemu_img(&["check", "-q", &p(target)]);
        qemu_img(&["compare", "-q", &p(&src), &p(target)]);
    }
    let bad = strata(&[
        "img",
        "convert",
        "-O",
        "qcow2",
        "-t",
        "fast",
        &p(&src),
        &p(&dir.path().join("x")),
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("writeback"));
    assert!(!dir.path().join("x").exists());
}

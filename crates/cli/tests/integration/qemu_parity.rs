//! `strata img info`, `check` and `map` against qemu-img 10: for a corpus
//! of images made only by qemu-img and qemu-io, both tools run with the
//! same arguments and must print the same thing (JSON as parsed values and
//! in the same key order, human text line for line) and exit with the same
//! code. Strata opens nothing for writing here, so the files stay as QEMU
//! wrote them; each comparison also checks that the file is unchanged.
//!
//! Strata-only output is allowed where a qemu-img parser does not choke on
//! it: the `layer` key of map entries, the `messages` and `chain-index`
//! keys of JSON, and lines starting with "Strata " after qemu-img's.
//!
//! No value is compared loosely: "disk size" / "actual-size" is the file's
//! allocation, the same for both tools as long as nothing writes the file
//! (Strata adds its chain index region only to images it opens for
//! writing, which this test never does).

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output};

use crate::common::*;

/// The invocations compared for every image.
const COMMANDS: &[&[&str]] = &[
    &["info"],
    &["info", "--output", "json"],
    &["info", "--backing-chain"],
    &["info", "--backing-chain", "--output", "json"],
    &["check"],
    &["check", "--output", "json"],
    &["map"],
    &["map", "--output", "json"],
];

/// Runs `qemu-img ARGS IMAGE`.
fn run_qemu(args: &[&str], image: &Path) -> Output {
    Command::new("qemu-img")
        .args(args)
        .arg(image)
        .output()
        .expect("run qemu-img")
}

/// Runs `strata img ARGS IMAGE`.
fn run_strata(args: &[&str], image: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .arg("img")
        .args(args)
        .arg(image)
        .output()
        .expect("run strata")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every command of [`COMMANDS`] prints and exits the same in both tools;
/// returns qemu-img's exit codes (check's is the interesting one).
fn assert_parity(image: &Path) -> Vec<i32> {
    let before = std::fs::read(image).expect("read image");
    let codes = COMMANDS.iter().map(|a| assert_same(a, image)).collect();
    let after = std::fs::read(image).expect("read image");
    assert!(before == after, "{} changed under strata", image.display());
    codes
}

/// One command: same exit code, same stdout (modulo Strata's extras).
fn assert_same(args: &[&str], image: &Path) -> i32 {
    let qemu = run_qemu(args, image);
    let strata = run_strata(args, image);
    let (q_out, s_out) = (text(&qemu.stdout), text(&strata.stdout));
    let what = format!(
        "{args:?} {}\n--- qemu-img ({}):\n{q_out}{}\n--- strata ({}):\n{s_out}{}",
        image.display(),
        qemu.status,
        text(&qemu.stderr),
        strata.status,
        text(&strata.stderr)
    );
    let code = qemu.status.code().expect("qemu-img exit code");
    assert_eq!(
        Some(code),
        strata.status.code(),
        "exit codes differ: {what}"
    );
    if !qemu.status.success() && code != 2 && code != 3 {
        // A failure: both say why on stderr, nothing on stdout.
        assert!(!strata.stderr.is_empty(), "strata failed silently: {what}");
        assert_eq!(q_out.trim(), s_out.trim(), "{what}");
        return code;
    }
    if args.contains(&"json") {
        assert_same_json(args[0], &q_out, &s_out, &what);
    } else {
        let mine: Vec<&str> = s_out
            .lines()
            .filter(|l| !l.starts_with("Strata "))
            .collect();
        let theirs: Vec<&str> = q_out.lines().collect();
        for (i, (a, b)) in theirs.iter().zip(&mine).enumerate() {
            assert_eq!(a, b, "line {} differs: {what}", i + 1);
        }
        assert_eq!(theirs.len(), mine.len(), "line counts differ: {what}");
    }
    code
}

/// JSON: equal as values once Strata's own keys are dropped, and with the
/// keys in qemu-img's order.
fn assert_same_json(command: &str, qemu: &str, strata: &str, what: &str) {
    let theirs: serde_json::Value = serde_json::from_str(qemu).expect("qemu-img json");
    let mut mine: serde_json::Value =
        serde_json::from_str(strata).unwrap_or_else(|e| panic!("strata json: {e}: {what}"));
    strip_strata_keys(&mut mine);
    assert_eq!(theirs, mine, "values differ: {what}");
    if command == "map" {
        // One object per line, as qemu-img prints them.
        let lines: Vec<String> = strata.lines().map(without_layer).collect();
        assert_eq!(qemu.lines().collect::<Vec<_>>(), lines, "layout: {what}");
    } else {
        let keys = |s: &str| -> Vec<String> {
            s.lines()
                .filter_map(|l| l.trim().strip_prefix('"'))
                .filter_map(|l| l.split_once("\": ").map(|(k, _)| k.to_string()))
                .filter(|k| k != "messages" && k != "chain-index")
                .collect()
        };
        assert_eq!(keys(qemu), keys(strata), "key order: {what}");
    }
}

/// Drops the keys only Strata prints.
fn strip_strata_keys(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(o) => {
            for k in ["layer", "messages", "chain-index"] {
                o.remove(k);
            }
            o.values_mut().for_each(strip_strata_keys);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_strata_keys),
        _ => {}
    }
}

/// A map line without Strata's `, "layer": N`.
fn without_layer(line: &str) -> String {
    match line.find(", \"layer\": ") {
        Some(at) => {
            let rest = &line[at + 2..];
            let end = rest.find('}').map_or(line.len(), |e| at + 2 + e);
            format!("{}{}", &line[..at], &line[end..])
        }
        None => line.to_string(),
    }
}

/// `qemu-io -f FMT -c CMD... IMAGE`.
fn qemu_io_fmt(image: &Path, format: &str, cmds: &[&str]) {
    let mut args = vec!["-f", format];
    for c in cmds {
        args.extend(["-c", c]);
    }
    let path = p(image);
    args.push(&path);
    run_ok("qemu-io", &args);
}

/// Writes data, zeros and discards over a qcow2 of cluster size `c`.
fn fill(image: &Path, c: u64) {
    let cmds = [
        format!("write -P 0x11 0 {}", 3 * c),
        format!("write -P 0x22 {} 1000", 5 * c + 17),
        format!("write -z {} {}", 7 * c, 2 * c),
        format!("write -P 0x33 {} {}", 12 * c, 2 * c),
        format!("discard {} {}", c, c),
        format!("write -P 0x44 {} 512", 20 * c + 512),
    ];
    let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
    qemu_io(image, &refs);
}

#[test]
fn plain_images_match_qemu_img() {
    let dir = tmp();
    let cases = [
        ("v3.qcow2", "", 65536u64),
        ("v2.qcow2", "compat=0.10", 65536),
        ("c4k.qcow2", "cluster_size=4k", 4096),
        ("c2m.qcow2", "cluster_size=2M", 2 << 20),
        ("empty.qcow2", "", 0),
    ];
    for (name, opts, cluster) in cases {
        let img = at(&dir, name);
        let size = (32 * cluster.max(65536)).to_string();
        qemu_create(&img, opts, &size);
        if cluster > 0 {
            fill(&img, cluster);
        }
        assert_eq!(assert_parity(&img), vec![0; COMMANDS.len()], "{name}");
    }
}

#[test]
fn compressed_images_match_qemu_img() {
    let dir = tmp();
    let src = at(&dir, "src.raw");
    qemu_img(&["create", "-q", "-f", "raw", &p(&src), "4M"]);
    qemu_io_fmt(
        &src,
        "raw",
        &[
            "write -P 0x61 0 1M",
            "write -P 0x62 2M 100k",
            "write -P 0 3M 64k",
        ],
    );
    for ctype in ["zlib", "zstd"] {
        let img = at(&dir, &format!("{ctype}.qcow2"));
        qemu_img(&[
            "convert",
            "-c",
            "-O",
            "qcow2",
            "-o",
            &format!("compression_type={ctype}"),
            &p(&src),
            &p(&img),
        ]);
        // Uncompressed data between the compressed runs.
        qemu_io(&img, &["write -P 0x70 1M 64k", "write -z 2M 64k"]);
        let codes = assert_parity(&img);
        // Human map cannot show compressed data: both refuse (exit 1).
        assert_eq!(codes[6], 1, "{ctype}");
        assert_eq!(codes[4], 0, "{ctype}");
    }
}

#[test]
fn extended_l2_matches_qemu_img() {
    let dir = tmp();
    let img = at(&dir, "ext.qcow2");
    qemu_create(&img, "extended_l2=on", "4M");
    qemu_io(
        &img,
        &[
            "write -P 5 0 4k",
            "write -P 6 70k 2k",
            "write -z 200k 8k",
            "write -P 1 1M 128k",
            "write -z 1088k 4k",
            "discard 1M 32k",
        ],
    );
    assert_eq!(assert_parity(&img), vec![0; COMMANDS.len()]);
    // Over a backing file: subclusters the top lacks come from below.
    let top = at(&dir, "ext-top.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "extended_l2=on",
        "-b",
        "ext.qcow2",
        "-F",
        "qcow2",
        &p(&top),
    ]);
    qemu_io(&top, &["write -P 9 2k 2k", "write -z 1M 2k"]);
    assert_eq!(assert_parity(&top), vec![0; COMMANDS.len()]);
}

#[test]
fn chains_match_qemu_img() {
    let dir = tmp();
    // A qcow2 over a raw file with holes.
    let raw = at(&dir, "base.raw");
    qemu_img(&["create", "-q", "-f", "raw", &p(&raw), "8M"]);
    qemu_io_fmt(&raw, "raw", &["write -P 1 0 1M", "write -P 2 5M 12k"]);
    let over_raw = at(&dir, "over-raw.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "base.raw",
        "-F",
        "raw",
        &p(&over_raw),
    ]);
    qemu_io(&over_raw, &["write -P 3 512k 64k", "write -z 5M 64k"]);
    assert_eq!(assert_parity(&over_raw), vec![0; COMMANDS.len()]);
    // The raw file alone: check refuses it as qemu-img does (63).
    let codes = assert_parity(&raw);
    assert_eq!(codes[4], 63);
    // Three qcow2 layers, backing names relative.
    let base = at(&dir, "base.qcow2");
    qemu_create(&base, "", "8M");
    qemu_io(&base, &["write -P 0x10 0 4M"]);
    let mid = at(&dir, "mid.qcow2");
    qemu_overlay(&mid, "base.qcow2", None);
    qemu_io(
        &mid,
        &[
            "write -P 0x20 1M 128k",
            "write -z 2M 256k",
            "discard 3M 64k",
        ],
    );
    let top = at(&dir, "top.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "mid.qcow2",
        "-F",
        "qcow2",
        &p(&top),
    ]);
    qemu_io(&top, &["write -P 0x30 1088k 64k", "write -P 0x31 6M 64k"]);
    for img in [&top, &mid, &base] {
        assert_eq!(assert_parity(img), vec![0; COMMANDS.len()], "{}", p(img));
    }
}

#[test]
fn missing_backing_file_fails_like_qemu_img() {
    let dir = tmp();
    let img = at(&dir, "orphan.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-u",
        "-f",
        "qcow2",
        "-b",
        "gone.qcow2",
        "-F",
        "qcow2",
        &p(&img),
        "4M",
    ]);
    // info alone works; the chain, check and map need the backing file.
    assert_eq!(assert_parity(&img), vec![0, 0, 1, 1, 1, 1, 1, 1]);
}

/// Reads a big-endian u64 of `file` at `offset`.
fn read_u64(file: &std::fs::File, offset: u64) -> u64 {
    let mut b = [0u8; 8];
    file.read_exact_at(&mut b, offset).expect("read");
    u64::from_be_bytes(b)
}

/// Offsets in a qcow2 file: (cluster size, L1 table, refcount table).
fn layout(file: &std::fs::File) -> (u64, u64, u64) {
    let mut bits = [0u8; 4];
    file.read_exact_at(&mut bits, 20).expect("read");
    (
        1 << u32::from_be_bytes(bits),
        read_u64(file, 40),
        read_u64(file, 48),
    )
}

const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;

#[test]
fn damaged_images_match_qemu_img() {
    let dir = tmp();
    // A leaked cluster: one more cluster at the end of the file with a
    // refcount of one and nothing referring to it.
    let leak = at(&dir, "leak.qcow2");
    qemu_create(&leak, "", "4M");
    qemu_io(&leak, &["write -P 7 0 128k"]);
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&leak)
            .expect("open");
        let (cs, _, rt) = layout(&f);
        let len = f.metadata().expect("stat").len().div_ceil(cs) * cs;
        f.set_len(len + cs).expect("grow");
        let block = read_u64(&f, rt) & OFFSET_MASK;
        f.write_all_at(&1u16.to_be_bytes(), block + (len / cs) * 2)
            .expect("write refcount");
    }
    let codes = assert_parity(&leak);
    assert_eq!(codes[4], 3, "a leak is exit 3");
    // Repairs, the only writes of this test, each tool on its own copy:
    // the same summary and exit code, and both copies clean afterwards.
    for mode in ["leaks", "all"] {
        let theirs = at(&dir, &format!("leak-qemu-{mode}.qcow2"));
        let mine = at(&dir, &format!("leak-strata-{mode}.qcow2"));
        std::fs::copy(&leak, &theirs).expect("copy");
        std::fs::copy(&leak, &mine).expect("copy");
        let q = run_qemu(&["check", "-r", mode], &theirs);
        let s = run_strata(&["check", "-r", mode], &mine);
        assert_eq!(q.status.code(), s.status.code(), "-r {mode}");
        assert_eq!(text(&q.stdout), text(&s.stdout), "-r {mode}");
        assert!(text(&s.stdout).contains("1 leaked clusters"), "-r {mode}");
        assert_eq!(qemu_check(&mine), 0, "-r {mode}");
    }
    // A refcount past the end of the file: qemu-img does not look there.
    let past = at(&dir, "past-eof.qcow2");
    qemu_create(&past, "", "4M");
    qemu_io(&past, &["write -P 7 0 128k"]);
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&past)
            .expect("open");
        let (cs, _, rt) = layout(&f);
        let beyond = f.metadata().expect("stat").len().div_ceil(cs) + 3;
        let block = read_u64(&f, rt) & OFFSET_MASK;
        f.write_all_at(&1u16.to_be_bytes(), block + beyond * 2)
            .expect("write refcount");
    }
    assert_eq!(assert_parity(&past), vec![0; COMMANDS.len()]);
    // An L2 entry pointing at the refcount table: a corruption (the table
    // is referenced twice) and a leak (the old data cluster).
    let bad = at(&dir, "bad.qcow2");
    qemu_create(&bad, "", "4M");
    qemu_io(&bad, &["write -P 8 0 64k", "write -P 9 1M 64k"]);
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&bad)
            .expect("open");
        let (_, l1, rt) = layout(&f);
        let l2 = read_u64(&f, l1) & OFFSET_MASK;
        f.write_all_at(&(rt | 1 << 63).to_be_bytes(), l2)
            .expect("write L2 entry");
    }
    let codes = assert_parity(&bad);
    assert_eq!(codes[4], 2, "a corruption is exit 2");
    // Its repair is not compared: qemu-img raises the refcount table's
    // refcount to 2 and leaves the data there; Strata moves the data to a
    // cluster of its own, so guest writes cannot overwrite the table (and
    // reports one more leak fixed, with a different image end).
}

#[test]
fn dirty_lazy_refcounts_match_qemu_img() {
    let dir = tmp();
    let img = at(&dir, "lazy.qcow2");
    qemu_create(&img, "lazy_refcounts=on", "4M");
    // `abort` kills qemu-io: the dirty bit stays, refcounts unwritten.
    let out = Command::new("qemu-io")
        .args(["-c", "write -P 0x42 0 1M", "-c", "abort", &p(&img)])
        .output()
        .expect("run qemu-io");
    assert!(!out.status.success(), "abort should kill qemu-io");
    let codes = assert_parity(&img);
    assert_eq!(codes[4], 2, "stale refcounts are corruptions");
    let info = text(&run_strata(&["info"], &img).stdout);
    assert!(info.contains("cleanly shut down: no"), "{info}");
}

#[test]
fn internal_snapshots_match_qemu_img() {
    let dir = tmp();
    let img = at(&dir, "snap.qcow2");
    qemu_create(&img, "", "4M");
    qemu_io(&img, &["write -P 1 0 128k"]);
    qemu_img(&["snapshot", "-c", "first", &p(&img)]);
    qemu_io(&img, &["write -P 2 0 64k", "write -P 3 1M 64k"]);
    qemu_img(&["snapshot", "-c", "second-with-a-long-name", &p(&img)]);
    qemu_io(&img, &["write -P 4 64k 64k"]);
    assert_eq!(assert_parity(&img), vec![0; COMMANDS.len()]);
    let info = text(&run_strata(&["info"], &img).stdout);
    assert!(info.contains("Snapshot list:"), "{info}");
}

#[test]
fn fragmentation_across_l2_tables_and_a_short_backing_file_match_qemu_img() {
    let dir = tmp();
    // 4 KiB clusters: an L2 table covers 2 MiB, so these writes span
    // several tables (qemu measures contiguity within one table), and
    // land out of guest order on the host.
    let wide = at(&dir, "wide.qcow2");
    qemu_create(&wide, "cluster_size=4k", "16M");
    qemu_io(
        &wide,
        &[
            "write -P 1 1M 3M",
            "write -P 2 8M 4k",
            "write -P 3 100k 8k",
            "write -P 4 2044k 8k",
        ],
    );
    assert_eq!(assert_parity(&wide), vec![0; COMMANDS.len()]);
    // A backing file shorter than the image: beyond its end the top's own
    // depth answers, with zeros.
    let short = at(&dir, "short.qcow2");
    qemu_create(&short, "", "2M");
    qemu_io(&short, &["write -P 1 0 2M"]);
    let top = at(&dir, "long.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "short.qcow2",
        "-F",
        "qcow2",
        &p(&top),
        "8M",
    ]);
    qemu_io(&top, &["write -P 5 4M 64k"]);
    assert_eq!(assert_parity(&top), vec![0; COMMANDS.len()]);
    // -U (force-share) as qemu-img takes it.
    assert_same(&["map", "-U", "--output", "json"], &top);
    assert_same(&["info", "-U", "--backing-chain"], &top);
    assert_same(&["check", "-U"], &top);
}

#[test]
fn persistent_bitmaps_match_qemu_img() {
    let dir = tmp();
    let img = at(&dir, "bitmaps.qcow2");
    qemu_create(&img, "", "4M");
    qemu_img(&["bitmap", "--add", &p(&img), "b0"]);
    qemu_img(&[
        "bitmap",
        "--add",
        "-g",
        "128k",
        "--disable",
        &p(&img),
        "second",
    ]);
    qemu_io(&img, &["write -P 1 0 64k"]);
    assert_eq!(assert_parity(&img), vec![0; COMMANDS.len()]);
    let info = text(&run_strata(&["info"], &img).stdout);
    assert!(info.contains("name: second"), "{info}");
    // Killed while the bitmap is in use: qemu lists it with "in-use".
    let out = Command::new("qemu-io")
        .args(["-c", "write -P 2 1M 64k", "-c", "abort", &p(&img)])
        .output()
        .expect("run qemu-io");
    assert!(!out.status.success(), "abort should kill qemu-io");
    assert_parity(&img);
    let info = text(&run_strata(&["info"], &img).stdout);
    assert!(info.contains("in-use"), "{info}");
}

#[test]
fn an_image_in_use_is_refused_without_force_share_like_qemu_img() {
    let dir = tmp();
    let img = at(&dir, "busy.qcow2");
    qemu_create(&img, "", "4M");
    qemu_io(&img, &["write -P 1 0 64k"]);
    // An interactive qemu-io holds the image open for writing (and its
    // locks) until its stdin closes.
    let mut writer = Command::new("qemu-io")
        .arg(&img)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn qemu-io");
    // Wait until qemu-io holds its write lock, read from /proc/locks: a
    // probe that opens the image itself (qemu-img info) would take a read
    // lock and could make qemu-io's own open fail.
    let started = std::time::Instant::now();
    while !lock_bytes(&img).contains(&101) {
        assert!(started.elapsed().as_secs() < 20, "qemu-io never locked");
        if let Ok(Some(status)) = writer.try_wait() {
            panic!("qemu-io exited ({status}) before it locked the image");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for args in [
        &["info"][..],
        &["info", "-U"],
        &["check", "--output", "json"],
        &["check", "-U", "--output", "json"],
        &["map", "--output", "json"],
        &["map", "-U", "--output", "json"],
    ] {
        let code = assert_same(args, &img);
        assert_eq!(code == 0, args.contains(&"-U"), "{args:?}: exit {code}");
    }
    drop(writer.stdin.take());
    writer.wait().expect("qemu-io exits");
}

//! Strata against the real QEMU tools: images QEMU writes read identically
//! in Strata, images Strata writes pass `qemu-img check` and read
//! identically in QEMU, and chains may mix both.

use crate::common::*;

/// Writes a pattern with qemu-io that covers whole, partial, zeroed and
/// discarded clusters.
fn qemu_pattern(image: &std::path::Path, cluster: u64) {
    let c = cluster;
    let cmds = [
        format!("write -P 0x11 0 {}", 3 * c),
        format!("write -P 0x22 {} 1000", 5 * c + 17),
        format!("write -P 0x33 {} {}", 9 * c, 2 * c),
        format!("write -z {} {}", 10 * c, c),
        format!("write -P 0x44 {} 512", 40 * c + 512),
        format!("discard {} {}", c, c),
        format!("write -P 0x55 {} {}", 100 * c - 4096, 8192),
    ];
    let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
    qemu_io(image, &refs);
}

#[test]
fn qemu_images_read_identically_across_geometries() {
    let dir = tmp();
    let cases = [
        ("cluster_size=512", 512u64),
        ("cluster_size=4k", 4096),
        ("cluster_size=64k", 65536),
        ("cluster_size=2M", 2 << 20),
        ("cluster_size=64k,compat=0.10", 65536),
        ("cluster_size=4k,refcount_bits=1", 4096),
        ("cluster_size=64k,refcount_bits=64,lazy_refcounts=on", 65536),
    ];
    for (opts, cs) in cases {
        let img = at(&dir, "img.qcow2");
        let size = (200 * cs).to_string();
        qemu_create(&img, opts, &size);
        qemu_pattern(&img, cs);
        assert_same_view(&img, dir.path());
        std::fs::remove_file(&img).unwrap();
    }
}

#[test]
fn compressed_clusters_zlib_and_zstd() {
    let dir = tmp();
    let src = at(&dir, "src.qcow2");
    qemu_create(&src, "", "8M");
    // Compressible but not uniform data, plus a partial last cluster.
    qemu_io(
        &src,
        &[
            "write -P 0x61 0 1M",
            "write -P 0x62 65000 3000",
            "write -P 0x63 7M 100k",
        ],
    );
    for ctype in ["zlib", "zstd"] {
        let c = at(&dir, &format!("c-{ctype}.qcow2"));
        qemu_img(&[
            "convert",
            "-q",
            "-c",
            "-O",
            "qcow2",
            "-o",
            &format!("compression_type={ctype}"),
            &p(&src),
            &p(&c),
        ]);
        let info = qemu_img(&["info", "--output", "json", &p(&c)]);
        assert!(info.contains(ctype), "{info}");
        assert_same_view(&c, dir.path());
        let map = strata_ok(&["img", "map", "--output", "json", &p(&c)]);
        assert!(
            map.contains("\"compressed\": true"),
            "map shows no compressed range: {map}"
        );
        // Copy-on-write out of a compressed cluster keeps the rest of it.
        let top = at(&dir, &format!("top-{ctype}.qcow2"));
        strata_ok(&["img", "snapshot", "-q", &p(&c), &p(&top)]);
        strata_ok(&[
            "img",
            "bench",
            "-w",
            "-c",
            "3",
            "-d",
            "1",
            "-s",
            "512",
            "-S",
            "70000",
            "-o",
            "1000",
            &p(&top),
        ]);
        assert_eq!(qemu_check(&top), 0);
        assert_same_view(&top, dir.path());
        // And a write into the compressed layer itself releases its refs.
        strata_ok(&[
            "img",
            "bench",
            "-w",
            "-c",
            "20",
            "-d",
            "1",
            "-s",
            "4k",
            "-S",
            "64k",
            &p(&c),
        ]);
        assert_eq!(
            qemu_check(&c),
            0,
            "{ctype}: compressed image after Strata writes"
        );
        assert_same_view(&c, dir.path());
    }
}

#[test]
fn strata_images_pass_qemu_check_and_read_identically() {
    let dir = tmp();
    let opts = [
        "cluster_size=64k",
        "cluster_size=512",
        "cluster_size=4k,refcount_bits=1",
        "cluster_size=2M,refcount_bits=64",
        "compat=0.10,cluster_size=4k",
        "cluster_size=64k,lazy_refcounts=on",
        "cluster_size=64k,extended_l2=on",
        "cluster_size=16k,extended_l2=on,refcount_bits=8",
    ];
    for o in opts {
        let img = at(&dir, "s.qcow2");
        strata_ok(&["img", "create", "-q", "-o", o, &p(&img), "24M"]);
        assert_eq!(qemu_check(&img), 0, "fresh image with {o}");
        // Unaligned writes of odd sizes scattered over the disk.
        strata_ok(&[
            "img",
            "bench",
            "-w",
            "-c",
            "400",
            "-d",
            "4",
            "-s",
            "3000",
            "-S",
            "777777",
            "-o",
            "123",
            "--pattern",
            "0x5a",
            &p(&img),
        ]);
        assert_eq!(qemu_check(&img), 0, "written image with {o}");
        assert_same_view(&img, dir.path());
        let top = at(&dir, "t.qcow2");
        strata_ok(&["img", "snapshot", "-q", &p(&img), &p(&top)]);
        strata_ok(&[
            "img",
            "bench",
            "-w",
            "-c",
            "300",
            "-d",
            "2",
            "-s",
            "5000",
            "-S",
            "999999",
            "-o",
            "77",
            "--pattern",
            "0x3c",
            &p(&top),
        ]);
        assert_eq!(qemu_check(&top), 0, "snapshot layer with {o}");
        assert_eq!(qemu_check(&img), 0, "snapshot base with {o}");
        assert_same_view(&top, dir.path());
        let check = strata_ok(&["img", "check", &p(&top)]);
        assert!(check.contains("matches the chain"), "{check}");
        std::fs::remove_file(&img).unwrap();
        std::fs::remove_file(&top).unwrap();
    }
}

#[test]
fn chains_mixing_strata_and_qemu_layers() {
    let dir = tmp();
    let base = at(&dir, "base.qcow2");
    qemu_create(&base, "cluster_size=4k", "16M");
    qemu_pattern(&base, 4096);
    // Strata layer on a QEMU base (different cluster size on purpose).
    let l2 = at(&dir, "l2.qcow2");
    strata_ok(&[
        "img",
        "create",
        "-q",
        "-b",
        "base.qcow2",
        "-F",
        "qcow2",
        &p(&l2),
    ]);
    strata_ok(&[
        "img",
        "bench",
        "-w",
        "-c",
        "50",
        "-d",
        "2",
        "-s",
        "6000",
        "-S",
        "300000",
        &p(&l2),
    ]);
    // QEMU layer on the Strata layer, with QEMU writes.
    let l3 = at(&dir, "l3.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "cluster_size=128k",
        "-b",
        "l2.qcow2",
        "-F",
        "qcow2",
        &p(&l3),
    ]);
    qemu_io(&l3, &["write -P 0x77 1M 200k", "write -z 4M 128k"]);
    // Strata snapshot on top, then Strata writes.
    let l4 = at(&dir, "l4.qcow2");
    strata_ok(&["img", "snapshot", "-q", &p(&l3), &p(&l4)]);
    strata_ok(&[
        "img",
        "bench",
        "-w",
        "-c",
        "80",
        "-d",
        "3",
        "-s",
        "1500",
        "-S",
        "190000",
        "-o",
        "4000",
        "--pattern",
        "0x99",
        &p(&l4),
    ]);
    for l in [&base, &l2, &l3, &l4] {
        assert_eq!(qemu_check(l), 0, "{}", l.display());
    }
    assert_same_view(&l4, dir.path());
    let chain = strata_ok(&[
        "img",
        "info",
        "--backing-chain",
        "--output",
        "json",
        &p(&l4),
    ]);
    let v: serde_json::Value = serde_json::from_str(&chain).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 4);
}

#[test]
fn qemu_writes_invalidate_the_index_and_strata_stays_correct() {
    let dir = tmp();
    let base = at(&dir, "base.qcow2");
    qemu_create(&base, "", "8M");
    qemu_io(&base, &["write -P 0x10 0 8M"]);
    let top = at(&dir, "top.qcow2");
    strata_ok(&["img", "snapshot", "-q", &p(&base), &p(&top)]);
    let info = strata_ok(&["img", "info", "--backing-chain", &p(&top)]);
    assert!(info.contains("Strata chain index: in use"), "{info}");
    // QEMU writes into the indexed layer: it must clear our autoclear bit.
    qemu_io(&top, &["write -P 0x20 64k 64k", "write -P 0x21 3M 4k"]);
    let info = strata_ok(&["img", "info", "--backing-chain", &p(&top)]);
    assert!(info.contains("stale"), "index not invalidated: {info}");
    assert_same_view(&top, dir.path());
    // Rebuild the index: it is trusted again and matches a chain walk.
    strata_ok(&["img", "index", &p(&top)]);
    let check = strata_ok(&["img", "check", &p(&top)]);
    assert!(check.contains("matches the chain"), "{check}");
    assert_eq!(qemu_check(&top), 0);
    assert_same_view(&top, dir.path());
    // QEMU also writes into a Strata-written chain's lower layer via rebase.
    let mid = at(&dir, "mid.qcow2");
    strata_ok(&["img", "snapshot", "-q", &p(&top), &p(&mid)]);
    qemu_io(&top, &["write -P 0x30 5M 4k"]);
    // mid's index recorded top's identity; top changed, so mid walks.
    let info = strata_ok(&["img", "info", "--backing-chain", &p(&mid)]);
    assert!(info.contains("changed since the index was built"), "{info}");
    assert_same_view(&mid, dir.path());
}

#[test]
fn raw_backing_files() {
    let dir = tmp();
    let raw = at(&dir, "base.raw");
    let mut content = vec![0u8; 3 << 20];
    for (i, b) in content.iter_mut().enumerate() {
        *b = (i / 4096) as u8 ^ 0x5a;
    }
    // A raw base smaller than the overlay: the tail reads as zeros.
    std::fs::write(&raw, &content).unwrap();
    let top = at(&dir, "top.qcow2");
    strata_ok(&[
        "img",
        "create",
        "-q",
        "-b",
        "base.raw",
        "-F",
        "raw",
        &p(&top),
        "4M",
    ]);
    strata_ok(&[
        "img",
        "bench",
        "-w",
        "-c",
        "30",
        "-d",
        "2",
        "-s",
        "3000",
        "-S",
        "150000",
        "-o",
        "100",
        &p(&top),
    ]);
    assert_eq!(qemu_check(&top), 0);
    assert_same_view(&top, dir.path());
    let q = at(&dir, "q.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "base.raw",
        "-F",
        "raw",
        &p(&q),
    ]);
    qemu_io(&q, &["write -P 0x01 1M 10k"]);
    assert_same_view(&q, dir.path());
}

#[test]
fn dirty_lazy_refcount_images_are_read_and_repaired() {
    let dir = tmp();
    let img = at(&dir, "lazy.qcow2");
    qemu_create(&img, "lazy_refcounts=on", "16M");
    // qemu-io's `abort` leaves the image dirty, refcounts not written.
    let out = std::process::Command::new("qemu-io")
        .args(["-c", "write -P 0x42 0 1M", "-c", "abort", &p(&img)])
        .output()
        .unwrap();
    assert!(!out.status.success(), "qemu-io abort should kill qemu-io");
    let info = strata_ok(&["img", "info", "--output", "json", &p(&img)]);
    assert!(info.contains("\"dirty-flag\": true"), "{info}");
    // Reading needs no refcounts.
    assert_same_view(&img, dir.path());
    // Opening for writing repairs them first.
    strata_ok(&[
        "img",
        "bench",
        "-w",
        "-c",
        "4",
        "-d",
        "1",
        "-s",
        "4k",
        "-S",
        "2M",
        &p(&img),
    ]);
    let info = strata_ok(&["img", "info", "--output", "json", &p(&img)]);
    assert!(info.contains("\"dirty-flag\": false"), "{info}");
    assert_eq!(qemu_check(&img), 0);
    assert_same_view(&img, dir.path());
}

#[test]
fn convert_flattens_a_chain_into_one_qcow2() {
    let dir = tmp();
    let base = at(&dir, "base.qcow2");
    qemu_create(&base, "", "8M");
    qemu_io(&base, &["write -P 0x01 0 2M"]);
    let top = at(&dir, "top.qcow2");
    strata_ok(&["img", "snapshot", "-q", &p(&base), &p(&top)]);
    strata_ok(&[
        "img",
        "bench",
        "-w",
        "-c",
        "10",
        "-d",
        "1",
        "-s",
        "64k",
        "-S",
        "640k",
        &p(&top),
    ]);
    let flat = at(&dir, "flat.qcow2");
    strata_ok(&["img", "convert", "-O", "qcow2", &p(&top), &p(&flat)]);
    let info = strata_ok(&["img", "info", "--output", "json", &p(&flat)]);
    assert!(!info.contains("backing-filename"), "{info}");
    assert_eq!(qemu_check(&flat), 0);
    qemu_img(&["compare", &p(&top), &p(&flat)]);
    assert_eq!(
        strata_ok(&["img", "compare", &p(&top), &p(&flat)]).trim(),
        "Images are identical."
    );
}

#[test]
fn compare_reports_the_first_mismatch() {
    let dir = tmp();
    let a = at(&dir, "a.qcow2");
    let b = at(&dir, "b.qcow2");
    for i in [&a, &b] {
        qemu_create(i, "", "4M");
    }
    qemu_io(&a, &["write -P 0x01 0 1M"]);
    qemu_io(&b, &["write -P 0x01 0 1M", "write -P 0x02 700k 1"]);
    let out = strata(&["img", "compare", &p(&a), &p(&b)]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("Content mismatch at offset {}!", 700 * 1024)
    );
    let missing = strata(&["img", "compare", &p(&a), "/nonexistent.qcow2"]);
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn map_names_the_owning_layer() {
    let dir = tmp();
    let base = at(&dir, "base.qcow2");
    qemu_create(&base, "", "1M");
    qemu_io(&base, &["write -P 1 0 128k"]);
    let mid = at(&dir, "mid.qcow2");
    strata_ok(&["img", "snapshot", "-q", &p(&base), &p(&mid)]);
    strata_ok(&[
        "img",
        "bench",
        "-w",
        "-c",
        "1",
        "-d",
        "1",
        "-s",
        "64k",
        "-o",
        "64k",
        &p(&mid),
    ]);
    let top = at(&dir, "top.qcow2");
    strata_ok(&["img", "snapshot", "-q", &p(&mid), &p(&top)]);
    let map = strata_ok(&["img", "map", "--output", "json", &p(&top)]);
    let v: serde_json::Value = serde_json::from_str(&map).unwrap();
    let owners: Vec<(u64, u64, u64)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["start"].as_u64().unwrap(),
                e["length"].as_u64().unwrap(),
                e["layer"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        owners,
        vec![
            (0, 65536, 1),
            (65536, 65536, 2),
            (131072, 1048576 - 131072, 0)
        ]
    );
    // qemu-img map agrees on what is data.
    let q = qemu_img(&["map", "--output", "json", &p(&top)]);
    let qv: serde_json::Value = serde_json::from_str(&q).unwrap();
    let depths: Vec<u64> = qv
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["data"] == true)
        .map(|e| e["depth"].as_u64().unwrap())
        .collect();
    assert_eq!(depths, vec![2, 1]);
}

#[test]
fn convert_raw_to_qcow2_and_back() {
    let dir = tmp();
    let raw = at(&dir, "in.raw");
    let mut content = vec![0u8; 6 << 20];
    for (i, b) in content.iter_mut().enumerate().take(2 << 20) {
        *b = (i % 251) as u8;
    }
    content[5 << 20] = 9; // a lone byte far from the rest
    std::fs::write(&raw, &content).unwrap();
    let q = at(&dir, "out.qcow2");
    strata_ok(&[
        "img",
        "convert",
        "-f",
        "raw",
        "-O",
        "qcow2",
        "-o",
        "cluster_size=4k",
        &p(&raw),
        &p(&q),
    ]);
    assert_eq!(qemu_check(&q), 0);
    qemu_img(&["compare", "-f", "raw", "-F", "qcow2", &p(&raw), &p(&q)]);
    // Zero runs stay unallocated: the qcow2 holds about 2 MiB, not 6.
    let info = strata_ok(&["img", "info", "--output", "json", &p(&q)]);
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert!(v["actual-size"].as_u64().unwrap() < 3 << 20, "{info}");
    let back = at(&dir, "back.raw");
    strata_ok(&["img", "convert", "-O", "raw", &p(&q), &p(&back)]);
    assert!(
        std::fs::read(&back).unwrap() == content,
        "round trip changed the content"
    );
}

/// QEMU writes extended L2 chains at subcluster offsets (partial
/// subclusters, zero subclusters, discards); Strata reads every chain, also
/// mixed with standard layers, exactly as QEMU does, and `check` and
/// `map` understand the 128-bit entries.
#[test]
fn qemu_extended_l2_chains_read_identically() {
    let dir = tmp();
    for (base_opts, mid_opts, top_opts) in [
        ("extended_l2=on", "extended_l2=on", "extended_l2=on"),
        (
            "cluster_size=4k",
            "extended_l2=on,cluster_size=32k",
            "cluster_size=64k",
        ),
        (
            "extended_l2=on,cluster_size=16k",
            "cluster_size=512",
            "extended_l2=on,cluster_size=128k",
        ),
    ] {
        let base = at(&dir, "base.qcow2");
        let mid = at(&dir, "mid.qcow2");
        let top = at(&dir, "top.qcow2");
        qemu_create(&base, base_opts, "8M");
        qemu_io(&base, &["write -P 0x11 0 8M"]);
        qemu_img(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-o",
            mid_opts,
            "-b",
            &p(&base),
            "-F",
            "qcow2",
            &p(&mid),
        ]);
        qemu_io(
            &mid,
            &[
                "write -P 0x22 4k 2k",
                "write -P 0x23 70k 5k",
                "write -P 0x24 1000 3000",
                "write -z 200k 8k",
                "write -z 513k 1k",
                "discard 1M 64k",
                "write -P 0x25 3M 1M",
            ],
        );
        qemu_img(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-o",
            top_opts,
            "-b",
            &p(&mid),
            "-F",
            "qcow2",
            &p(&top),
        ]);
        qemu_io(
            &top,
            &[
                "write -P 0x33 66k 2k",
                "write -P 0x34 3M 3k",
                "write -z 3200k 4k",
            ],
        );
        for img in [&base, &mid, &top] {
            let want = qemu_raw(img, dir.path());
            let raw = at(&dir, "qemu.raw");
            std::fs::write(&raw, &want).unwrap();
            let out = strata_ok(&["img", "compare", &p(img), &p(&raw)]);
            assert!(
                out.contains("identical"),
                "{out} ({base_opts} / {mid_opts} / {top_opts})"
            );
            let mine = at(&dir, "strata.raw");
            strata_ok(&["img", "convert", "-O", "raw", &p(img), &p(&mine)]);
            assert!(
                std::fs::read(&mine).unwrap() == want,
                "convert of {}",
                p(img)
            );
            strata_ok(&["img", "check", &p(img)]);
            strata_ok(&["img", "map", &p(img)]);
        }
        let info = strata_ok(&["img", "info", &p(&mid)]);
        assert_eq!(
            info.contains("extended l2: true"),
            mid_opts.contains("extended_l2=on"),
            "{info}"
        );
        for f in [&base, &mid, &top] {
            std::fs::remove_file(f).unwrap();
        }
    }
}

/// Strata writes into an extended L2 layer on a QEMU chain at subcluster
/// offsets; QEMU reads the result exactly as Strata does and `qemu-img
/// check` finds it clean, also after QEMU wrote into it in turn.
#[test]
fn strata_subcluster_writes_read_identically_in_qemu() {
    let dir = tmp();
    let base = at(&dir, "base.qcow2");
    qemu_create(&base, "extended_l2=on", "8M");
    qemu_io(&base, &["write -P 0x11 0 8M"]);
    let top = at(&dir, "top.qcow2");
    strata_ok(&["img", "snapshot", "-q", &p(&base), &p(&top)]);
    let info = strata_ok(&["img", "info", &p(&top)]);
    assert!(info.contains("extended l2: true"), "{info}");
    strata_ok(&[
        "img",
        "bench",
        "-w",
        "-c",
        "200",
        "-d",
        "4",
        "-s",
        "1500",
        "-S",
        "333333",
        "-o",
        "100",
        "--pattern",
        "0x5a",
        &p(&top),
    ]);
    assert_eq!(qemu_check(&top), 0);
    assert_same_view(&top, dir.path());
    // QEMU writes more into the Strata layer; Strata still agrees.
    qemu_io(&top, &["write -P 0x66 10k 1k", "write -z 64k 32k"]);
    assert_same_view(&top, dir.path());
    assert_eq!(qemu_check(&top), 0);
}

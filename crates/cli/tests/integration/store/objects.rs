//! Objects through `strata obj` and the client: sizes from 0 to 64 MiB,
//! renames (also interrupted), deletes, paginated lists, the load
//! generator, and a killed client's name.

use super::*;

#[test]
fn objects_from_0_bytes_to_64_mib_round_trip_with_checksums() {
    let dir = tmp();
    let store_dir = dir.path().join("cluster");
    let mut store = Store::up(&store_dir, REPLICATED);
    let sizes = [0usize, 1, 2_600, 306_000, 2_300_000, 64 << 20];
    for (i, &size) in sizes.iter().enumerate() {
        let data = pattern(size, i as u64);
        let src = dir.path().join(format!("in-{i}"));
        std::fs::write(&src, &data).unwrap();
        let name = format!("sizes/{size}");
        let put = store.json(&["obj", "put", "-p", &p(&src), &name]);
        // An empty or small object is its record alone: no storage node
        // holds a copy of it.
        let inline = size <= strata_store_protocol::wire::MAX_INLINE;
        let copies = if inline { 0 } else { 3 };
        assert_eq!(put["copies"], copies, "{put}");
        let crc = format!("{:08x}", crc32c::crc32c(&data));
        assert_eq!(put["crc32c"], crc.as_str());
        let stat = store.json(&["obj", "stat", &name]);
        assert_eq!(stat["size"], size as u64);
        assert_eq!(stat["crc32c"], crc.as_str());
        assert_eq!(stat["replicas"].as_array().unwrap().len(), copies);
        assert_eq!(stat["metadata_addresses"].as_array().unwrap().len(), 3);
        let dst = dir.path().join(format!("out-{i}"));
        store.ok(&["obj", "get", &name, &p(&dst)]);
        assert!(std::fs::read(&dst).unwrap() == data, "{name} differs");
    }
    // Three copies of each object above the inline limit, on three
    // different storage nodes.
    assert_eq!(store.replica_files().len(), 3 * 3);

    // A replica damaged on disk is detected on read; the client falls over
    // to another replica and still returns the right bytes.
    let stat = store.json(&["obj", "stat", "sizes/306000"]);
    let first = stat["replicas"][0].as_str().unwrap().to_string();
    let addr: std::net::Ipv6Addr = first.parse().unwrap();
    let file = store
        .replica_files()
        .into_iter()
        .find(|f| f.file_name().unwrap().to_string_lossy() == format!("{:032x}", u128::from(addr)))
        .expect("replica file of the first replica");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[5000] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();
    let dst = dir.path().join("out-damaged");
    store.ok(&["obj", "get", "sizes/306000", &p(&dst)]);
    assert!(std::fs::read(&dst).unwrap() == pattern(306_000, 3));
    // A zero-byte object is read from its metadata alone (it has no
    // replica file). An object with data whose every replica file is gone
    // fails, naming the missing replica. (Not the object damaged above:
    // the client may have reported its bad replica, and a repair copying
    // a good one back could race the removal.)
    let gone = "sizes/67108864";
    let stat = store.json(&["obj", "stat", gone]);
    for r in stat["replicas"].as_array().unwrap() {
        let addr: std::net::Ipv6Addr = r.as_str().unwrap().parse().unwrap();
        let file = format!("{:032x}", u128::from(addr));
        let path = store
            .replica_files()
            .into_iter()
            .find(|f| f.file_name().unwrap().to_string_lossy() == file)
            .expect("replica file");
        std::fs::remove_file(path).unwrap();
    }
    let dst = dir.path().join("out-empty");
    std::fs::write(&dst, b"old content").unwrap();
    store.ok(&["obj", "get", "sizes/0", &p(&dst)]);
    assert_eq!(std::fs::read(&dst).unwrap(), b"");
    let err = store.fails(&["obj", "get", gone, &p(&dir.path().join("out-1b"))]);
    assert!(err.contains("replica"), "{err}");

    // The metadata and data survive a restart of the whole cluster. The
    // table epoch goes on above the one published before (heartbeats
    // moved it past the one stored with the last membership change).
    let epoch = |s: &Store| s.status()["epoch"].as_u64().expect("epoch in the status");
    let before = epoch(&store);
    store.stop();
    let store = Store::up(&store_dir, REPLICATED);
    let after = epoch(&store);
    assert!(
        after > before,
        "epoch {after} after the restart, {before} before"
    );
    let dst = dir.path().join("after-restart");
    store.ok(&["obj", "get", "sizes/2300000", &p(&dst)]);
    assert!(std::fs::read(&dst).unwrap() == pattern(2_300_000, 4));
}

/// `strata obj mv FROM TO` killed with SIGKILL right after `step`.
fn interrupted_mv(store: &Store, from: &str, to: &str, step: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["obj", "mv", from, to, "--cluster", &store.on.to_string()])
        .env("STRATA_FAILPOINT", format!("rename-after-{step}"))
        .env(CREDENTIAL_ENV, store.dir.join(ADMIN_CREDENTIAL_FILE))
        .output()
        .expect("run strata");
    assert!(
        !out.status.success(),
        "mv should have been killed after {step}"
    );
}

#[test]
fn an_interrupted_rename_loses_no_data() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("cluster"), REPLICATED);
    let dst = dir.path().join("out");
    let read = |name: &str| {
        store.ok(&["obj", "get", name, &p(&dst)]);
        std::fs::read(&dst).unwrap()
    };
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        let src = dir.path().join(name);
        std::fs::write(&src, pattern(50_000, i as u64)).unwrap();
        store.ok(&["obj", "put", &p(&src), &format!("r/{name}")]);
    }
    let files = store.replica_files().len();
    // A mapped-mode cluster has no routes to print.
    let err = store.fails(&["store", "routes", "--host", "127.0.0.1"]);
    assert!(err.contains("mapped mode"), "{err}");

    // Stopped after both names exist: deleting the old name keeps the
    // data under the new one.
    interrupted_mv(&store, "r/a", "r/a2", "linked");
    let (old, new) = (
        store.json(&["obj", "stat", "r/a"]),
        store.json(&["obj", "stat", "r/a2"]),
    );
    assert_eq!(old["replicas"], new["replicas"]);
    store.ok(&["obj", "rm", "r/a"]);
    assert!(read("r/a2") == pattern(50_000, 0));

    // ... and deleting the new name keeps it under the old one. Renaming
    // either name elsewhere meanwhile is refused: it would hide the link.
    interrupted_mv(&store, "r/b", "r/b2", "linked");
    let err = store.fails(&["obj", "mv", "r/b", "r/b3"]);
    assert!(err.contains("interrupted"), "{err}");
    store.ok(&["obj", "rm", "r/b2"]);
    assert!(read("r/b") == pattern(50_000, 1));

    // Running the rename again finishes it.
    interrupted_mv(&store, "r/c", "r/c2", "linked");
    store.ok(&["obj", "mv", "r/c", "r/c2"]);
    store.fails(&["obj", "stat", "r/c"]);
    assert!(read("r/c2") == pattern(50_000, 2));
    let done = store.json(&["obj", "stat", "r/c2"]);
    assert!(done["rename"].is_null(), "{done}");

    // Stopped after marking only: the old name is whole, and a delete
    // frees its data (no other name holds it).
    interrupted_mv(&store, "r/d", "r/d2", "marked");
    store.fails(&["obj", "stat", "r/d2"]);
    assert!(read("r/d") == pattern(50_000, 3));
    store.ok(&["obj", "rm", "r/d"]);

    // Stopped after dropping the old name: the new one reads back.
    interrupted_mv(&store, "r/c2", "r/c3", "dropped");
    assert!(read("r/c3") == pattern(50_000, 2));

    // Nothing lost: the three live objects still have all their replicas,
    // and r/d's (deleted for real) are freed in the background.
    let want = files - files / 4;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.replica_files().len() != want {
        assert!(
            std::time::Instant::now() < deadline,
            "{} replica files, want {want}",
            store.replica_files().len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_load_generator_posts_and_reads_its_objects_under_a_prefix() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("cluster"), &[]);
    let bench = |workload: &str, prefix: &str| {
        run_bench(
            &store,
            &["--workload", workload, "--size", "100", "--prefix", prefix],
        )
    };
    for prefix in ["run1", "run2"] {
        let (ok, v) = bench("post", prefix);
        assert!(ok, "{v}");
        assert_eq!(v["ops"], 6, "{v}");
        assert_eq!(v["errors"], 0, "{v}");
        // Each run makes its own objects, 2 clients x 3.
        let listed = store.json(&["obj", "ls", &format!("{prefix}/"), "--all"]);
        assert_eq!(
            listed["objects"].as_array().map(Vec::len),
            Some(6),
            "{listed}"
        );
    }
    let (ok, v) = bench("get", "run2");
    assert!(ok, "{v}");
    assert_eq!(v["ops"], 12, "{v}");
    assert!(v["mb_per_s"].as_f64().unwrap_or(0.0) > 0.0, "{v}");
    // Reading objects nobody posted counts errors and fails the run.
    let (ok, v) = bench("get", "never");
    assert!(!ok, "{v}");
    assert_eq!(v["errors"], 12, "{v}");
}

/// Runs `strata store bench` with 2 clients, 3 objects each, read twice,
/// plus `args`; returns whether it succeeded and its JSON.
fn run_bench(store: &Store, args: &[&str]) -> (bool, serde_json::Value) {
    let mut all = vec![
        "store",
        "bench",
        "--threads",
        "2",
        "--ops",
        "3",
        "--passes",
        "2",
        "--output",
        "json",
    ];
    all.extend_from_slice(args);
    let out = store.run(&all);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| serde_json::json!({ "stderr": String::from_utf8_lossy(&out.stderr) }));
    (out.status.success(), v)
}

#[test]
fn the_batched_load_generator_reads_zero_byte_objects_and_counts_misses() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("cluster"), &["--mn", "3"]);
    let (ok, v) = run_bench(
        &store,
        &["--workload", "post", "--size", "0", "--prefix", "z"],
    );
    assert!(ok && v["ops"] == 6, "{v}");
    let batched = |prefix: &str| {
        run_bench(
            &store,
            &[
                "--workload",
                "get",
                "--size",
                "0",
                "--prefix",
                prefix,
                "--engine",
                "batched",
            ],
        )
    };
    // Every client reads its 3 objects twice, over one socket.
    let (ok, v) = batched("z");
    assert!(ok, "{v}");
    assert_eq!(
        (v["ops"].as_u64(), v["errors"].as_u64()),
        (Some(12), Some(0)),
        "{v}"
    );
    // Names nobody posted are answered "not found": each one is an error.
    let (ok, v) = batched("never");
    assert!(!ok, "{v}");
    assert_eq!(
        (v["ops"].as_u64(), v["errors"].as_u64()),
        (Some(0), Some(12)),
        "{v}"
    );
    // Objects with data need a storage node: the batched engine refuses them.
    let out = store.run(&[
        "store",
        "bench",
        "--workload",
        "get",
        "--size",
        "100",
        "--engine",
        "batched",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("zero-byte Gets only"), "{err}");
    let out = store.run(&[
        "store",
        "bench",
        "--workload",
        "post",
        "--engine",
        "batched",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--workload get only"));
}

#[test]
fn rename_delete_and_paginated_list() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("cluster"), REPLICATED);
    let src = dir.path().join("small");
    std::fs::write(&src, pattern(10_000, 9)).unwrap();
    for i in 0..25 {
        store.ok(&["obj", "put", &p(&src), &format!("ls/{i:02}")]);
    }
    store.ok(&["obj", "put", &p(&src), "other/x"]);

    // Pages of 10 with cursors cover the 25 names exactly once, in order.
    let mut names = Vec::new();
    let mut after = String::new();
    let mut pages = 0;
    loop {
        let page = store.json(&["obj", "ls", "ls/", "--limit", "10", "--after", &after]);
        pages += 1;
        for o in page["objects"].as_array().unwrap() {
            names.push(o["name"].as_str().unwrap().to_string());
        }
        match page["next"].as_str() {
            Some(c) => after = c.to_string(),
            None => break,
        }
    }
    let want: Vec<String> = (0..25).map(|i| format!("ls/{i:02}")).collect();
    assert_eq!(names, want);
    assert_eq!(pages, 3);
    let all = store.json(&["obj", "ls", "--all", "--limit", "7"]);
    assert_eq!(all["objects"].as_array().unwrap().len(), 26);

    // Rename moves metadata only: same replicas, same bytes, old name gone.
    let before = store.json(&["obj", "stat", "ls/03"]);
    let files_before = store.replica_files().len();
    store.ok(&["obj", "mv", "ls/03", "moved/03"]);
    let after_mv = store.json(&["obj", "stat", "moved/03"]);
    assert_eq!(before["replicas"], after_mv["replicas"]);
    assert_eq!(before["crc32c"], after_mv["crc32c"]);
    let err = store.fails(&["obj", "stat", "ls/03"]);
    assert!(err.contains("ls/03"), "{err}");
    let dst = dir.path().join("moved");
    store.ok(&["obj", "get", "moved/03", &p(&dst)]);
    assert!(std::fs::read(&dst).unwrap() == pattern(10_000, 9));
    assert_eq!(store.replica_files().len(), files_before);
    // Renaming onto an existing name is refused.
    let err = store.fails(&["obj", "mv", "ls/04", "ls/05"]);
    assert!(err.contains("already exists"), "{err}");

    // Delete: acknowledged, gone from Get, Stat and List; space freed later.
    store.ok(&["obj", "rm", "moved/03"]);
    let err = store.fails(&["obj", "get", "moved/03", &p(&dst)]);
    assert!(
        err.contains("deleted") || err.contains("no object"),
        "{err}"
    );
    let err = store.fails(&["obj", "rm", "moved/03"]);
    assert!(
        err.contains("no object") || err.contains("deleted"),
        "{err}"
    );
    let listed = store.json(&["obj", "ls", "moved/"]);
    assert_eq!(listed["objects"].as_array().unwrap().len(), 0);
    wait_until("replicas freed", || {
        store.replica_files().len() == files_before - 3
    });

    // A new Post of a deleted name gets a newer version.
    store.ok(&["obj", "put", &p(&src), "moved/03"]);
    let v = store.json(&["obj", "stat", "moved/03"]);
    assert!(v["version"].as_u64().unwrap() > after_mv["version"].as_u64().unwrap());
}

/// A client killed mid-Put (its data connection closed by the kernel)
/// leaves no lock behind: the storage node tells the coordinator, which
/// drops the Post at once, so another Put of the name succeeds within a
/// couple of seconds (not at the data deadline, minutes away for this
/// size).
#[test]
fn a_killed_client_s_name_is_free_for_the_next_put_at_once() {
    let dir = tmp();
    let cluster = dir.path().join("cluster");
    let store = Store::up(&cluster, &[]);
    // 8 GiB, sparse: the client streams it for long enough to be killed
    // in the middle.
    let big = dir.path().join("big");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(8 << 30)
        .unwrap();
    let mut client = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["obj", "put", &p(&big), "locked/name"])
        .args(["--cluster", &store.on.to_string()])
        .env(CREDENTIAL_ENV, cluster.join(ADMIN_CREDENTIAL_FILE))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn strata obj put");
    // The storage node's temporary file holds data: the Put is under way.
    let tmp_dir = cluster.join("sn-0").join("tmp");
    let receiving = || {
        std::fs::read_dir(&tmp_dir).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.metadata().is_ok_and(|m| m.len() > 4096))
        })
    };
    let start = Instant::now();
    while !receiving() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the Put's data never reached the storage node"
        );
        assert!(
            client.try_wait().unwrap().is_none(),
            "the client ended early"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    client.kill().expect("SIGKILL the client");
    client.wait().unwrap();
    let killed = Instant::now();
    let src = dir.path().join("small");
    std::fs::write(&src, pattern(5000, 9)).unwrap();
    loop {
        let out = store.run(&["obj", "put", &p(&src), "locked/name"]);
        if out.status.success() {
            break;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            killed.elapsed() < Duration::from_secs(3),
            "the name is still locked {:?} after the client was killed: {err}",
            killed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("the name was free {:?} after the kill", killed.elapsed());
    let back = dir.path().join("back");
    store.ok(&["obj", "get", "locked/name", &p(&back)]);
    assert!(std::fs::read(&back).unwrap() == pattern(5000, 9));
    // The half-written replica is gone.
    wait_until("the temporary replica removed", || !receiving());
}

/// Attributes a client computes after the data: committed with the
/// record, returned by Get and List, kept by a rename; a refusal from
/// `finish` or oversized attributes store nothing, and the name keeps
/// its object and is free for the next Post at once.
#[test]
fn attributes_come_after_the_data_and_a_refusal_stores_nothing() {
    use strata_store_client::client::Client;
    use strata_store_protocol::wire::MAX_ATTRIBUTES;
    use strata_store_protocol::Error;
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &[]);
    let on = store.on;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let client = Client::connect(on, admin(on)).await.unwrap();
        let data = pattern(700 << 10, 9);
        let streamed = std::sync::atomic::AtomicU64::new(0);
        let put = client
            .put_with_attributes(
                "attrs/a",
                data.len() as u64,
                &mut &data[..],
                &|done| streamed.store(done, std::sync::atomic::Ordering::Relaxed),
                || {
                    // Called once every byte went out.
                    let done = streamed.load(std::sync::atomic::Ordering::Relaxed);
                    Ok(format!("after {done}").into_bytes())
                },
            )
            .await
            .unwrap();
        let want = format!("after {}", data.len()).into_bytes();
        let (record, bytes) = client.get_bytes("attrs/a").await.unwrap();
        assert_eq!(record.attributes, want);
        assert_eq!(record.version, put.version);
        assert!(bytes == data);
        client
            .put_with_attributes("attrs/empty", 0, &mut &b""[..], &|_| {}, || {
                Ok(b"of nothing".to_vec())
            })
            .await
            .unwrap();
        let (listed, _) = client.list("attrs/", "", 10).await.unwrap();
        let found: Vec<_> = listed
            .iter()
            .map(|e| (e.name.as_str(), e.attributes.as_slice(), e.crc))
            .collect();
        let empty_crc = crc32c::crc32c(&[]);
        assert_eq!(
            found,
            [
                ("attrs/a", want.as_slice(), crc32c::crc32c(&data)),
                ("attrs/empty", &b"of nothing"[..], empty_crc)
            ]
        );

        // Refused by `finish` after the data went out: nothing changes.
        let other = pattern(300 << 10, 10);
        let refused = client
            .put_with_attributes(
                "attrs/a",
                other.len() as u64,
                &mut &other[..],
                &|_| {},
                || Err(Error::Peer("the digest does not match".into())),
            )
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("digest"), "{refused}");
        let too_big = client
            .put_with_attributes(
                "attrs/a",
                other.len() as u64,
                &mut &other[..],
                &|_| {},
                || Ok(vec![0; MAX_ATTRIBUTES + 1]),
            )
            .await
            .unwrap_err();
        assert!(
            too_big.report().to_string().contains("2048"),
            "{}",
            too_big.report()
        );
        let (record, bytes) = client.get_bytes("attrs/a").await.unwrap();
        assert_eq!((record.version, &record.attributes), (put.version, &want));
        assert!(bytes == data, "a refused Post changed the object");

        // The name is not locked by the aborted Posts; a rename keeps the
        // attributes.
        client.rename("attrs/a", "attrs/b").await.unwrap();
        assert_eq!(client.stat("attrs/b").await.unwrap().attributes, want);
    });
}

//! Failures under load: kill -9 of nodes, repair after a storage node
//! is lost for good, metadata nodes added, lost for good, or down for a
//! while (stand-ins).

use super::*;

#[test]
fn kill_9_of_a_storage_node_then_a_metadata_node_under_load() {
    let dir = tmp();
    let store = Store::up(
        &dir.path().join("cluster"),
        &[
            "--mn",
            "2",
            "--mn-slots",
            "3",
            "--sn",
            "3",
            "--replication",
            "3,2,3,2",
            "--short-failure-ms",
            "1000",
        ],
    );
    let mut sn = Node::add(&store, &dir.path().join("sn-extra"), "sn");
    let mut mn = Node::add(&store, &dir.path().join("mn-extra"), "mn");
    wait_until("4 storage and 3 metadata nodes", || {
        let s = store.status();
        s["storage_nodes"].as_array().unwrap().len() == 4
            && s["metadata_nodes"].as_array().unwrap().len() == 3
    });
    std::thread::sleep(Duration::from_millis(1200));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let on = store.on;
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || run_load(on, stop))
    };
    let extra_sn_prefix = {
        let s = store.status();
        s["storage_nodes"][3]["prefix"]
            .as_str()
            .unwrap()
            .trim_end_matches("::/64")
            .to_string()
    };

    // Kill -9 the storage node; after the short-failure timer it is down and
    // new objects go elsewhere.
    std::thread::sleep(Duration::from_millis(1500));
    sn.kill9();
    wait_until("the killed storage node marked down", || {
        store.status()["storage_nodes"][3]["state"] == "down"
    });
    std::thread::sleep(Duration::from_millis(1500));
    let recent = store.json(&["obj", "ls", "load/", "--all"]);
    let last = recent["objects"].as_array().unwrap().last().unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    let stat = store.json(&["obj", "stat", &last]);
    for r in stat["replicas"].as_array().unwrap() {
        assert!(
            !r.as_str()
                .unwrap()
                .starts_with(&format!("{extra_sn_prefix}:")),
            "placed on a down node: {stat}"
        );
    }
    // Restart it (same directory, same identity and prefix): back up.
    let _sn = Node::add(&store, &dir.path().join("sn-extra"), "sn");
    wait_until("the storage node up again", || {
        store.status()["storage_nodes"][3]["state"] == "up"
    });

    // Kill -9 a metadata node.
    std::thread::sleep(Duration::from_millis(1000));
    mn.kill9();
    std::thread::sleep(Duration::from_millis(2500));
    let mn = Node::add_with(
        &store,
        &dir.path().join("mn-extra"),
        "mn",
        &["--metrics", "127.0.0.1:0"],
    );
    std::thread::sleep(Duration::from_millis(1500));
    // A metadata node of its own serves its repair counts on /metrics.
    let at =
        mn.1.split("metrics on http://")
            .nth(1)
            .expect("a metrics endpoint");
    let text = super::rs3::metrics(at.trim().trim_end_matches("/metrics"));
    assert!(
        text.lines()
            .any(|l| l.starts_with("strata_repair_copies_started_total{slot=")),
        "no repair counts on the metadata node's /metrics:\n{text}"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let load = load.join().unwrap();
    eprintln!(
        "load: {} acked, {} failed, {} gets",
        load.acked.len(),
        load.failed.len(),
        load.gets
    );
    assert!(
        load.acked.len() > 20,
        "only {} Posts acknowledged",
        load.acked.len()
    );
    assert!(load.gets > 20);
    // Gets never return wrong bytes. Until the down metadata node's groups
    // stand in elsewhere (a second or two after the short timer), a Get
    // whose reachable metadata addresses all sit on it times out
    // (docs/store.md, stand-ins). Any other failure is a defect.
    let unexpected: Vec<&String> = load
        .get_failures
        .iter()
        .filter(|f| !f.contains("did not answer"))
        .collect();
    assert!(
        unexpected.is_empty(),
        "Gets of acknowledged objects failed: {unexpected:?}"
    );
    assert!(
        load.get_failures.len() as u64 * 10 <= load.gets,
        "more than a tenth of the Gets under load failed: {:?}",
        load.get_failures
    );
    // Every acknowledged object is readable and whole; unacknowledged ones
    // are absent or whole.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = strata_store_client::client::Client::connect(on, admin(on))
            .await
            .unwrap();
        for (name, seed) in &load.acked {
            let (_, bytes) = client
                .get_bytes(name)
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                bytes == pattern((seed * 7919) % 200_000, *seed as u64),
                "{name} differs"
            );
        }
        for (name, seed) in &load.failed {
            if let Ok((_, bytes)) = client.get_bytes(name).await {
                assert!(
                    bytes == pattern((seed * 7919) % 200_000, *seed as u64),
                    "{name} is torn"
                );
            }
        }
    });
}

/// Kill -9 a storage node under load (Posts and Gets) and leave it dead
/// past the definitive-failure timer: no Get fails, the metadata nodes
/// copy every replica it held to the other nodes, so each object again has
/// N_d replicas on live nodes, every metadata replica of it names them,
/// and every object reads back whole.
#[test]
fn repair_restores_replicas_after_a_definitive_storage_node_failure() {
    let dir = tmp();
    let store = Store::up(
        &dir.path().join("cluster"),
        &[
            "--mn",
            "3",
            "--sn",
            "3",
            "--replication",
            "3,2,3,2",
            "--short-failure-ms",
            "500",
            "--definitive-failure-ms",
            "2500",
        ],
    );
    let mut sn = Node::add(&store, &dir.path().join("sn-extra"), "sn");
    store.wait_for_nodes("storage", 4);
    // Every metadata node has fetched the table with the new node.
    std::thread::sleep(Duration::from_millis(1200));
    let objects = 16usize;
    let mut expected = Vec::new();
    for i in 0..objects {
        let data = pattern((i * 37_001) % 300_000, i as u64 + 11);
        let src = dir.path().join(format!("obj{i}"));
        std::fs::write(&src, &data).unwrap();
        store.ok(&["obj", "put", &p(&src), &format!("rep/{i:02}")]);
        expected.push(data);
    }
    let dead_prefix = store.status()["storage_nodes"][3]["prefix"]
        .as_str()
        .unwrap()
        .trim_end_matches("::/64")
        .to_string();
    let on_dead = |stat: &serde_json::Value| {
        stat["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r.as_str().unwrap().starts_with(&format!("{dead_prefix}:")))
            .count()
    };
    let held: usize = (0..objects)
        .map(|i| on_dead(&store.json(&["obj", "stat", &format!("rep/{i:02}")])))
        .sum();
    assert!(held > 0, "the node to kill holds no replica");

    // Posts and Gets go on through the failure and the repair.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (stop, on) = (stop.clone(), store.on);
        std::thread::spawn(move || run_load(on, stop))
    };
    std::thread::sleep(Duration::from_millis(500));
    sn.kill9();
    wait_until("the killed storage node marked dead", || {
        store.status()["storage_nodes"][3]["state"] == "dead"
    });
    let start = Instant::now();
    for (i, data) in expected.iter().enumerate() {
        let name = format!("rep/{i:02}");
        // An empty object has no replica to repair.
        let want = if data.is_empty() { 0 } else { 3 };
        loop {
            let stat = store.json(&["obj", "stat", &name]);
            let replicas = stat["replicas"].as_array().unwrap().len();
            if replicas == want && on_dead(&stat) == 0 {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{name} not repaired: {stat}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let load = load.join().unwrap();
    assert!(
        load.get_failures.is_empty(),
        "Gets failed during the repair: {:?}",
        load.get_failures
    );
    assert!(load.acked.len() > 5, "the load made no progress");
    // Objects the load posted before the kill are repaired too.
    for (name, _) in &load.acked {
        loop {
            let stat = store.json(&["obj", "stat", name]);
            // A small object kept inline has no replica to repair.
            let inline = stat["inline"] == true && stat["replicas"].as_array().unwrap().is_empty();
            if inline || (stat["replicas"].as_array().unwrap().len() == 3 && on_dead(&stat) == 0) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(40),
                "{name} not repaired: {stat}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // The dead node comes back: repair re-created its replicas elsewhere,
    // so no record names the ones it holds, and it frees them all.
    let count_files = |d: &Path| std::fs::read_dir(d.join("replicas")).map_or(0, |r| r.count());
    let sn_dir = dir.path().join("sn-extra");
    assert!(
        count_files(&sn_dir) > 0,
        "the dead node held no replica file"
    );
    let gc = ["--gc-interval-ms", "300", "--gc-grace-ms", "1500"];
    let _back = Node::add_with(&store, &sn_dir, "sn", &gc);
    let deadline = Instant::now() + Duration::from_secs(20);
    while count_files(&sn_dir) > 0 {
        assert!(
            Instant::now() < deadline,
            "{} unreferenced replicas left on the returned node",
            count_files(&sn_dir)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Replicas that records do name stay, rounds after their grace ended.
    std::thread::sleep(Duration::from_millis(1200)); // every node has the table
    let mut fresh = Vec::new();
    for i in 0..6 {
        let data = pattern(20_000 + i, 500 + i as u64);
        let src = dir.path().join(format!("fresh{i}"));
        std::fs::write(&src, &data).unwrap();
        store.ok(&["obj", "put", &p(&src), &format!("fresh/{i}")]);
        fresh.push(data);
    }
    let on_returned = count_files(&sn_dir);
    assert!(
        on_returned > 0,
        "no new object was placed on the returned node"
    );
    std::thread::sleep(Duration::from_millis(3000));
    assert_eq!(
        count_files(&sn_dir),
        on_returned,
        "a referenced replica was collected"
    );
    for (i, data) in fresh.iter().enumerate() {
        let out = dir.path().join("fresh.out");
        store.ok(&["obj", "get", &format!("fresh/{i}"), &p(&out)]);
        assert!(std::fs::read(&out).unwrap() == *data);
    }

    // Every metadata replica holds the repaired record, and every replica
    // it names reads back whole.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let on = store.on;
    let mut all: Vec<(String, Vec<u8>)> = expected
        .into_iter()
        .enumerate()
        .map(|(i, data)| (format!("rep/{i:02}"), data))
        .collect();
    all.extend(load.acked.iter().map(|(name, i)| {
        let i = *i;
        (name.clone(), pattern((i * 7919) % 200_000, i as u64))
    }));
    rt.block_on(async move {
        let client = strata_store_client::client::Client::connect(on, admin(on))
            .await
            .unwrap();
        for (name, data) in &all {
            let name = name.clone();
            let (record, bytes) = client.get_bytes(&name).await.unwrap();
            assert_eq!(&bytes, data, "{name} reads back");
            for &meta in &record.meta {
                let call = strata_store_client::client::Call::new(
                    strata_store_client::transport::request_id(),
                    vec![meta],
                    Body::Get { name: name.clone() },
                    5,
                    500,
                );
                match client.run(call).await.unwrap() {
                    Body::Found { record: copy, .. } => {
                        assert_eq!(copy.replicas, record.replicas, "{name}: metadata replica");
                        assert_eq!(copy.version, record.version, "{name}: metadata replica");
                    }
                    other => panic!("{name}: {other:?}"),
                }
            }
        }
    });
    let files = store.replica_files().len();
    assert!(
        files >= objects * 3,
        "{files} replica files for {objects} objects"
    );
}

/// A cluster whose metadata slots are all taken (2 metadata nodes, 64
/// groups, replication 2,2,2,2) gets a storage node and then a third
/// metadata node under a load of Posts and Gets. The new metadata node
/// takes over a third of the groups by copying their metadata: no Get of
/// an acknowledged object fails, no replica moves, new objects land on the
/// new storage node, the new node answers for the moved records itself,
/// and names in moved groups can be posted again (a higher version) and
/// deleted afterwards.
#[test]
fn a_metadata_node_added_beyond_the_slots_takes_over_groups_under_load() {
    let dir = tmp();
    let cluster = dir.path().join("cluster");
    let store = Store::up(
        &cluster,
        &[
            "--mn",
            "2",
            "--mn-slots",
            "2",
            "--sn",
            "3",
            "--replication",
            "2,2,2,2",
            "--mg-bits",
            "6",
        ],
    );
    let on = store.on;
    let (rt, client) = connect_client(on);
    // Objects posted before the handover, with their records.
    let pre: Vec<(String, strata_store_protocol::wire::Record)> = (0..60)
        .map(|i| {
            let name = format!("pre/{i:03}");
            let data = pattern(5000 + i, i as u64);
            rt.block_on(client.put(&name, data.len() as u64, &mut data.as_slice(), &|_| {}))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let rec = rt.block_on(client.stat(&name)).unwrap();
            (name, rec)
        })
        .collect();
    let sn_dirs: Vec<PathBuf> = (0..3).map(|k| cluster.join(format!("sn-{k}"))).collect();
    let before: Vec<_> = sn_dirs.iter().map(|d| replica_names(d)).collect();
    assert_eq!(
        before.iter().map(|s| s.len()).sum::<usize>(),
        120,
        "two replicas of each object"
    );

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || run_load(on, stop))
    };
    // A second client only reads the objects posted before, in a loop.
    let reader = {
        let stop = stop.clone();
        let names: Vec<String> = pre.iter().map(|(n, _)| n.clone()).collect();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let client = strata_store_client::client::Client::connect(on, admin(on))
                    .await
                    .unwrap();
                let (mut gets, mut failures) = (0u64, Vec::new());
                let mut lists = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (i, name) in names.iter().enumerate() {
                        gets += 1;
                        match client.get_bytes(name).await {
                            Ok((_, b)) if b == pattern(5000 + i, i as u64) => {}
                            Ok(_) => failures.push(format!("{name}: wrong bytes")),
                            Err(e) => failures.push(format!("{name}: {e}")),
                        }
                    }
                    // Listed in pages while groups move: each name once.
                    lists += 1;
                    let (mut listed, mut after) = (Vec::new(), String::new());
                    loop {
                        match client.list("pre/", &after, 25).await {
                            Ok((entries, next)) => {
                                listed.extend(entries.into_iter().map(|e| e.name));
                                match next {
                                    Some(c) => after = c,
                                    None => break,
                                }
                            }
                            Err(e) => {
                                failures.push(format!("list: {e}"));
                                break;
                            }
                        }
                    }
                    if listed != names {
                        failures.push(format!("list {lists} saw {} names", listed.len()));
                    }
                }
                eprintln!("reader: {lists} lists");
                (gets, failures)
            })
        })
    };
    std::thread::sleep(Duration::from_millis(1000));
    let _sn = Node::add(&store, &dir.path().join("sn-new"), "sn");
    let _mn = Node::add(&store, &dir.path().join("mn-new"), "mn");
    let start = Instant::now();
    let mut saw_moves = false;
    let status = loop {
        let s = store.status();
        let moves = s["moves"].as_array().unwrap().len();
        saw_moves |= moves > 0;
        let mns = s["metadata_nodes"].as_array().unwrap();
        if mns.len() == 3 && moves == 0 && mns[2]["groups"] == 21 {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the handover did not finish in 60 s: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("handover done in {:?}", start.elapsed());
    assert!(saw_moves, "status never showed the handover under way");
    let mns = status["metadata_nodes"].as_array().unwrap();
    assert_eq!(mns[2]["slot"], 2);
    assert_eq!(
        mns[0]["groups"].as_u64().unwrap() + mns[1]["groups"].as_u64().unwrap(),
        43
    );
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let load = load.join().unwrap();
    eprintln!(
        "load: {} acked, {} failed, {} gets",
        load.acked.len(),
        load.failed.len(),
        load.gets
    );
    let (reads, read_failures) = reader.join().unwrap();
    eprintln!("reader: {reads} gets");
    assert!(
        read_failures.is_empty(),
        "Gets of objects posted before failed: {read_failures:?}"
    );
    assert!(load.acked.len() > 20, "only {} Posts", load.acked.len());
    // Posts retry while their group is frozen: none fails.
    assert!(load.failed.is_empty(), "Posts failed: {:?}", load.failed);
    assert!(
        load.get_failures.is_empty(),
        "Gets of acknowledged objects failed: {:?}",
        load.get_failures
    );

    // Only metadata moved: every replica file is where it was, and every
    // record names the same replicas.
    for (d, had) in sn_dirs.iter().zip(&before) {
        let now = replica_names(d);
        assert!(had.is_subset(&now), "replicas left {}", d.display());
    }
    rt.block_on(client.refresh()).unwrap();
    let table = client.table();
    let new_mn: SocketAddr = mns[2]["endpoint"].as_str().unwrap().parse().unwrap();
    let mut answered_by_new = 0;
    for (name, rec) in &pre {
        let (now, bytes) = rt
            .block_on(client.get_bytes(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(now.replicas, rec.replicas, "{name}");
        assert_eq!(now.version, rec.version, "{name}");
        let i: usize = name[4..].parse().unwrap();
        assert!(bytes == pattern(5000 + i, i as u64), "{name} differs");
        // The new node answers from its own database for moved groups.
        for &addr in &rec.meta {
            if table.mn_for(addr).map(|m| m.slot) != Some(2) {
                continue;
            }
            let q = Msg::new(99, addr, Body::Get { name: name.clone() });
            match udp_ask(new_mn, &as_admin(store.on, &q)).body {
                Body::Found { record, .. } => {
                    assert_eq!(record.version, rec.version);
                    answered_by_new += 1;
                }
                other => panic!("the new metadata node answered {other:?} for {name}"),
            }
        }
    }
    assert!(
        answered_by_new >= 10,
        "only {answered_by_new} moved records"
    );
    // Every acknowledged object reads back whole.
    for (name, seed) in &load.acked {
        let (_, bytes) = rt
            .block_on(client.get_bytes(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            bytes == pattern((seed * 7919) % 200_000, *seed as u64),
            "{name} differs"
        );
    }
    // No metadata copy was lost in the move: with W_m = N_m every
    // acknowledged object is at each of its metadata addresses, asked of
    // the node the table says owns it now.
    let mut asked = 0;
    for (name, _) in &load.acked {
        let rec = rt.block_on(client.stat(name)).unwrap();
        for &addr in &rec.meta {
            let (to, body) = ask_copy(&admin(store.on), &table, addr, name);
            match body {
                Body::Found { record, .. } => assert_eq!(record.version, rec.version, "{name}"),
                other => panic!("{name} at {to}: {other:?}"),
            }
            asked += 1;
        }
    }
    assert_eq!(asked, 2 * load.acked.len());
    // New objects went to the new storage node too.
    let new_sn = replica_names(&dir.path().join("sn-new"));
    assert!(!new_sn.is_empty(), "no replica on the new storage node");

    // Names coordinated in moved groups take new versions and deletes.
    let moved: Vec<&(String, strata_store_protocol::wire::Record)> = pre
        .iter()
        .filter(|(_, r)| table.mn_for(r.meta[0]).map(|m| m.slot) == Some(2))
        .collect();
    assert!(
        moved.len() >= 5,
        "only {} coordinated by the new node",
        moved.len()
    );
    for (name, rec) in moved {
        let data = pattern(77, 5);
        let put = rt
            .block_on(client.put(name, 77, &mut data.as_slice(), &|_| {}))
            .unwrap_or_else(|e| panic!("posting {name} again: {e}"));
        assert!(
            put.version > rec.version,
            "{name}: {} after {}",
            put.version,
            rec.version
        );
        let (r, bytes) = rt.block_on(client.get_bytes(name)).unwrap();
        assert_eq!((r.version, bytes), (put.version, data));
        let deleted = rt.block_on(client.delete(name)).unwrap();
        assert!(deleted >= put.version);
        match rt.block_on(client.stat(name)) {
            Err(strata_store_protocol::Error::Remote { code, .. }) => assert!(
                matches!(
                    code,
                    strata_store_protocol::wire::Code::NotFound
                        | strata_store_protocol::wire::Code::Deleted
                ),
                "{name}: {code:?}"
            ),
            other => panic!("{name} after its delete: {other:?}"),
        }
    }
    let err = store.fails(&["obj", "stat", &pre[0].0.replace("pre/", "never/")]);
    assert!(err.contains("no object"), "{err}");
}

#[test]
fn a_metadata_node_dead_for_good_has_its_groups_restored() {
    let dir = tmp();
    let cluster = dir.path().join("cluster");
    let store = Store::up(
        &cluster,
        &[
            "--mn",
            "2",
            "--mn-slots",
            "3",
            "--sn",
            "3",
            "--replication",
            "3,2,3,2",
            "--short-failure-ms",
            "1000",
            "--definitive-failure-ms",
            "3000",
        ],
    );
    // The third metadata node and the fourth storage node, in their own
    // processes so they can be killed.
    let mut mn = Node::add(&store, &dir.path().join("mn-extra"), "mn");
    let sn_dir = dir.path().join("sn-extra");
    let mut sn = Node::add(&store, &sn_dir, "sn");
    wait_until("3 metadata and 4 storage nodes", || {
        let s = store.status();
        s["metadata_nodes"].as_array().unwrap().len() == 3
            && s["storage_nodes"].as_array().unwrap().len() == 4
    });
    std::thread::sleep(Duration::from_millis(1200)); // every node has the table
    let on = store.on;
    let (rt, client) = connect_client(on);
    let data_of = |i: usize| pattern(5000 + i * 13, i as u64 + 3);
    let pre: Vec<(String, strata_store_protocol::wire::Record)> = (0..60)
        .map(|i| {
            let name = format!("pre/{i:03}");
            let data = data_of(i);
            rt.block_on(client.put(&name, data.len() as u64, &mut data.as_slice(), &|_| {}))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            (name.clone(), rt.block_on(client.stat(&name)).unwrap())
        })
        .collect();
    // A few deleted ones, whose tombstones must be restored too.
    for (name, _) in &pre[50..] {
        rt.block_on(client.delete(name)).unwrap();
    }
    // Replication to the third metadata address finishes in the background.
    std::thread::sleep(Duration::from_millis(500));
    rt.block_on(client.refresh()).unwrap();
    let before = client.table();
    let dead_slot = 2u16;
    let coordinated: Vec<&(String, strata_store_protocol::wire::Record)> = pre[..50]
        .iter()
        .filter(|(_, r)| before.mn_for(r.meta[0]).map(|m| m.slot) == Some(dead_slot))
        .collect();
    // Names whose every metadata address is in a group of the node to kill
    // would lose every copy with it. The first owners are contiguous runs
    // of groups, so with 3 nodes and N_m = 3 there is none.
    let only_there: Vec<usize> = (0..60)
        .filter(|&i| {
            pre[i]
                .1
                .meta
                .iter()
                .all(|&a| before.mn_for(a).map(|m| m.slot) == Some(dead_slot))
        })
        .collect();
    assert!(
        only_there.is_empty(),
        "names with every metadata copy on the node to kill: {only_there:?}"
    );
    let survivors: Vec<usize> = (0..50).filter(|i| !only_there.contains(i)).collect();
    let coordinated: Vec<_> = coordinated
        .into_iter()
        .filter(|(n, _)| !only_there.iter().any(|&i| pre[i].0 == *n))
        .collect();
    assert!(
        coordinated.len() >= 5,
        "only {} names coordinated by the node to kill",
        coordinated.len()
    );

    // A reader goes on through the failure and the restore.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let expected: Vec<(String, Vec<u8>)> = survivors
        .iter()
        .map(|&i| (format!("pre/{i:03}"), pattern(5000 + i * 13, i as u64 + 3)))
        .collect();
    let reader = spawn_reader(on, stop.clone(), expected);
    std::thread::sleep(Duration::from_millis(300));
    mn.kill9();
    let start = Instant::now();
    let mut saw_restoring = false;
    let status = loop {
        let s = store.status();
        let moves = s["moves"].as_array().unwrap();
        saw_restoring |= moves.iter().any(|m| m["phase"] == "restoring");
        let m = &s["metadata_nodes"][dead_slot as usize];
        if m["state"] == "dead" && m["groups"] == 0 && moves.is_empty() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the restore did not finish in 20 s: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("dead and restored {:?} after the kill", start.elapsed());
    assert!(saw_restoring, "status never showed a restore under way");
    let human = store.ok(&["store", "status"]);
    assert!(human.contains(" dead "), "{human}");
    let mns = status["metadata_nodes"].as_array().unwrap();
    assert_eq!(
        mns[0]["groups"].as_u64().unwrap() + mns[1]["groups"].as_u64().unwrap(),
        256
    );
    // Spread evenly over the two that are left.
    assert!(
        mns[0]["groups"].as_u64().unwrap().abs_diff(128) <= 1,
        "{status}"
    );
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (reads, read_failures) = reader.join().unwrap();
    eprintln!("reader: {reads} gets");
    assert!(reads >= 50, "only {reads} Gets");
    assert!(
        read_failures.is_empty(),
        "Gets failed during the repair: {read_failures:?}"
    );

    // Every metadata copy is back: each object (or tombstone) is at each
    // of its metadata addresses, asked of the node the table names.
    rt.block_on(client.refresh()).unwrap();
    let table = client.table();
    let mut restored = 0;
    for (i, (name, rec)) in pre.iter().enumerate() {
        if only_there.contains(&i) {
            continue;
        }
        for &addr in &rec.meta {
            let (to, body) = ask_copy(&admin(store.on), &table, addr, name);
            if before.mn_for(addr).map(|m| m.slot) == Some(dead_slot) {
                restored += 1;
            }
            match body {
                Body::Found { record, .. } if i < 50 => {
                    assert_eq!(record.version, rec.version, "{name} at {to}")
                }
                Body::Error {
                    code: strata_store_protocol::wire::Code::Deleted,
                    ..
                } if i >= 50 => {}
                other => panic!("{name} at {to}: {other:?}"),
            }
        }
    }
    assert!(
        restored >= 20,
        "only {restored} copies were on the dead node"
    );
    for &i in &survivors {
        let name = &pre[i].0;
        let (_, bytes) = rt
            .block_on(client.get_bytes(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(bytes == data_of(i), "{name} differs");
    }
    // Then a storage node dies for good too: the objects the dead metadata
    // node coordinated are repaired by their new coordinators.
    let sn_prefix = store.status()["storage_nodes"][3]["prefix"]
        .as_str()
        .unwrap()
        .trim_end_matches("::/64")
        .to_string();
    let on_sn = |stat: &serde_json::Value| {
        stat["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r.as_str().unwrap().starts_with(&format!("{sn_prefix}:")))
            .count()
    };
    let held = coordinated
        .iter()
        .filter(|(n, _)| on_sn(&store.json(&["obj", "stat", n])) > 0)
        .count();
    assert!(
        held > 0,
        "no object the dead node coordinated is on the storage node"
    );
    sn.kill9();
    wait_until("the killed storage node marked dead", || {
        store.status()["storage_nodes"][3]["state"] == "dead"
    });
    let start = Instant::now();
    for &i in &survivors {
        let name = &pre[i].0;
        loop {
            let stat = store.json(&["obj", "stat", name]);
            if stat["replicas"].as_array().unwrap().len() == 3 && on_sn(&stat) == 0 {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "{name} not repaired: {stat}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    eprintln!("storage node repaired in {:?}", start.elapsed());
    // It comes back: its collection rounds ask the live metadata nodes only
    // (the dead one would block them for good) and free every replica it
    // held, which no record names any more.
    let files = |d: &Path| std::fs::read_dir(d.join("replicas")).map_or(0, |r| r.count());
    assert!(files(&sn_dir) > 0, "the dead storage node held no replica");
    let gc = ["--gc-interval-ms", "300", "--gc-grace-ms", "1500"];
    let _back = Node::add_with(&store, &sn_dir, "sn", &gc);
    let deadline = Instant::now() + Duration::from_secs(15);
    while files(&sn_dir) > 0 {
        assert!(
            Instant::now() < deadline,
            "{} unreferenced replicas left on the returned storage node",
            files(&sn_dir)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for &i in &survivors {
        let (_, bytes) = rt.block_on(client.get_bytes(&pre[i].0)).unwrap();
        assert!(bytes == data_of(i), "{} differs after the repair", pre[i].0);
    }
    // The returned node listens on a new port: every node, and this
    // client, use the table that says so.
    std::thread::sleep(Duration::from_millis(1200));
    rt.block_on(client.refresh()).unwrap();

    // Names the dead node coordinated take new versions and deletes.
    for (name, rec) in &coordinated {
        let data = pattern(99, 7);
        let put = rt
            .block_on(client.put(name, 99, &mut data.as_slice(), &|_| {}))
            .unwrap_or_else(|e| panic!("posting {name} again: {e}"));
        assert!(
            put.version > rec.version,
            "{name}: {} after {}",
            put.version,
            rec.version
        );
        let (r, bytes) = rt.block_on(client.get_bytes(name)).unwrap();
        assert_eq!((r.version, bytes), (put.version, data));
        rt.block_on(client.delete(name))
            .unwrap_or_else(|e| panic!("deleting {name}: {e}"));
        match rt.block_on(client.stat(name)) {
            Err(strata_store_protocol::Error::Remote { code, .. }) => assert!(
                matches!(
                    code,
                    strata_store_protocol::wire::Code::NotFound
                        | strata_store_protocol::wire::Code::Deleted
                ),
                "{name}: {code:?}"
            ),
            other => panic!("{name} after its delete: {other:?}"),
        }
    }
    // A deleted name coordinated there is posted again above its tombstone.
    if let Some((name, rec)) = pre[50..].iter().find(|(n, r)| {
        before.mn_for(r.meta[0]).map(|m| m.slot) == Some(dead_slot)
            && !only_there.iter().any(|&i| pre[i].0 == *n)
    }) {
        let put = rt
            .block_on(client.put(name, 5, &mut &b"again"[..], &|_| {}))
            .unwrap();
        // Above the restored tombstone (at the deleted record's version).
        assert!(put.version > rec.version, "{name}: {}", put.version);
    }

    // The dead node comes back with its old directory: it takes a share
    // of the groups again by handovers (its stale rows dropped first) and
    // answers for them with the rows of today.
    drop(mn);
    let _back = Node::add(&store, &dir.path().join("mn-extra"), "mn");
    let start = Instant::now();
    loop {
        let s = store.status();
        let m = &s["metadata_nodes"][dead_slot as usize];
        if m["state"] == "up" && m["groups"] == 85 && s["moves"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the returned node did not take its share in 20 s: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("returned node took 85 groups in {:?}", start.elapsed());
    std::thread::sleep(Duration::from_millis(1200)); // every node has the table
    rt.block_on(client.refresh()).unwrap();
    let table = client.table();
    let deleted_since: Vec<&String> = coordinated.iter().map(|(n, _)| n).collect();
    let mut answered_there = 0;
    for &i in &survivors {
        let (name, rec) = &pre[i];
        // Repair of the dead storage node gave some records a new version.
        let newest = match deleted_since.contains(&name) {
            true => 0,
            false => rt.block_on(client.stat(name)).unwrap().version,
        };
        for &addr in &rec.meta {
            let (to, body) = ask_copy(&admin(store.on), &table, addr, name);
            answered_there += usize::from(table.mn_for(addr).map(|m| m.slot) == Some(dead_slot));
            match body {
                Body::Found { record, .. } if !deleted_since.contains(&name) => {
                    assert_eq!(record.version, newest, "{name} at {to}")
                }
                Body::Error {
                    code: strata_store_protocol::wire::Code::Deleted,
                    ..
                } if deleted_since.contains(&name) => {}
                other => panic!("{name} at {to} after the node came back: {other:?}"),
            }
        }
        if !deleted_since.contains(&name) {
            let (_, bytes) = rt.block_on(client.get_bytes(name)).unwrap();
            assert!(bytes == data_of(i), "{name} differs after the return");
        }
    }
    assert!(
        answered_there >= 20,
        "only {answered_there} copies asked of the returned node"
    );
}

/// Kill -9 of a metadata node for less than the definitive-failure timer:
/// its groups stand in on the other two (restored there), names it
/// coordinated are posted and deleted while it is down, a reader never
/// fails, and once it is back (same directory) its groups are handed back
/// to it with the newest version of every row.
#[test]
fn a_metadata_node_down_for_a_while_has_stand_ins_then_gets_its_groups_back() {
    let dir = tmp();
    let store = Store::up(
        &dir.path().join("cluster"),
        &[
            "--mn",
            "2",
            "--mn-slots",
            "3",
            "--sn",
            "3",
            "--replication",
            "3,2,3,2",
            "--short-failure-ms",
            "1000",
            "--definitive-failure-ms",
            "600000",
        ],
    );
    let mn_dir = dir.path().join("mn-extra");
    let mut mn = Node::add(&store, &mn_dir, "mn");
    store.wait_for_nodes("metadata", 3);
    std::thread::sleep(Duration::from_millis(1200)); // every node has the table
    let on = store.on;
    let (rt, client) = connect_client(on);
    let data_of = |i: usize| pattern(300 + i * 11, i as u64 + 7);
    let names: Vec<String> = (0..60).map(|i| format!("pre/{i:03}")).collect();
    let mut version: Vec<u64> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let data = data_of(i);
        let put = rt
            .block_on(client.put(name, data.len() as u64, &mut data.as_slice(), &|_| {}))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        version.push(put.version);
    }
    std::thread::sleep(Duration::from_millis(500)); // background replication
    rt.block_on(client.refresh()).unwrap();
    let before = client.table();
    let home = 2u16;
    let home_groups = before.groups_of(home);
    assert!(home_groups > 0);
    let on_home = |t: &strata_store_protocol::table::Table, name: &str| {
        t.mn_for(t.meta_addrs(name)[0]).map(|m| m.slot) == Some(home)
    };
    let coordinated: Vec<usize> = (0..60).filter(|&i| on_home(&before, &names[i])).collect();
    assert!(
        coordinated.len() >= 6,
        "only {} names coordinated by the node to kill",
        coordinated.len()
    );
    let touched: Vec<usize> = coordinated[..6].to_vec();
    let untouched: Vec<usize> = (0..60).filter(|i| !touched.contains(i)).collect();

    // A reader of the untouched objects goes on through it all.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let expected: Vec<(String, Vec<u8>)> = untouched
        .iter()
        .map(|&i| (format!("pre/{i:03}"), pattern(300 + i * 11, i as u64 + 7)))
        .collect();
    let reader = spawn_reader(on, stop.clone(), expected);
    std::thread::sleep(Duration::from_millis(300));
    mn.kill9();
    let killed = Instant::now();
    let mut saw_restoring = false;
    loop {
        let s = store.status();
        let moves = s["moves"].as_array().unwrap();
        saw_restoring |= moves
            .iter()
            .any(|m| m["phase"] == "restoring" && m["home_slot"] == home);
        let stand_ins = s["stand_ins"].as_array().unwrap();
        if s["metadata_nodes"][home as usize]["state"] == "down"
            && stand_ins.len() == home_groups
            && stand_ins.iter().all(|x| x["home_slot"] == home)
            && moves.is_empty()
        {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "no stand-ins in 20 s: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("stand-ins serving {:?} after the kill", killed.elapsed());
    assert!(
        saw_restoring,
        "status never showed a stand-in being restored"
    );
    let human = store.ok(&["store", "status"]);
    assert!(human.contains("stand in on other nodes"), "{human}");

    // While it is down: names it coordinated are posted again or deleted,
    // and new names it would coordinate are posted.
    let mut deleted = Vec::new();
    let mut expect: Vec<(String, Vec<u8>, u64)> = Vec::new();
    for (k, &i) in touched.iter().enumerate() {
        let name = &names[i];
        if k % 2 == 0 {
            let v = rt
                .block_on(client.delete(name))
                .unwrap_or_else(|e| panic!("deleting {name} while its coordinator is down: {e}"));
            assert!(v >= version[i], "{name}: {v}");
            deleted.push(name.clone());
        } else {
            let data = pattern(999 + k, 42);
            let put = rt
                .block_on(client.put(name, data.len() as u64, &mut data.as_slice(), &|_| {}))
                .unwrap_or_else(|e| panic!("posting {name} while its coordinator is down: {e}"));
            assert!(put.version > version[i], "{name}");
            expect.push((name.clone(), data, put.version));
        }
    }
    let mut fresh = 0;
    for j in 0..200 {
        let name = format!("new/{j:03}");
        if fresh == 4 || !on_home(&before, &name) {
            continue;
        }
        let data = pattern(123 + j, 9);
        let put = rt
            .block_on(client.put(&name, data.len() as u64, &mut data.as_slice(), &|_| {}))
            .unwrap_or_else(|e| panic!("posting {name} while its coordinator is down: {e}"));
        expect.push((name, data, put.version));
        fresh += 1;
    }
    assert_eq!(fresh, 4);
    for (i, name) in names.iter().enumerate() {
        if untouched.contains(&i) {
            expect.push((name.clone(), data_of(i), version[i]));
        }
    }
    std::thread::sleep(Duration::from_millis(500)); // background replication
    assert_eq!(
        store.status()["metadata_nodes"][home as usize]["state"],
        "down"
    );

    // Back (same directory): its groups come home.
    let _mn = Node::add(&store, &mn_dir, "mn");
    let back = Instant::now();
    loop {
        let s = store.status();
        let m = &s["metadata_nodes"][home as usize];
        if m["state"] == "up"
            && m["groups"] == home_groups
            && s["stand_ins"].as_array().unwrap().is_empty()
            && s["moves"].as_array().unwrap().is_empty()
        {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(30),
            "its groups did not come back in 30 s: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("groups home {:?} after the restart", back.elapsed());
    std::thread::sleep(Duration::from_millis(1200)); // every node has the table
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (reads, failures) = reader.join().unwrap();
    eprintln!("reader: {reads} gets");
    assert!(reads >= 50, "only {reads} Gets");
    assert!(failures.is_empty(), "Gets failed: {failures:?}");

    // Every row, at each metadata address, on the node the table names
    // (the same groups as before the kill), with the newest version.
    rt.block_on(client.refresh()).unwrap();
    let table = client.table();
    assert_eq!(table.mg_owner, before.mg_owner);
    let mut at_home = 0;
    let mut ask = |name: &str| {
        table
            .meta_addrs(name)
            .into_iter()
            .map(|addr| {
                if table.mn_for(addr).map(|m| m.slot) == Some(home) {
                    at_home += 1;
                }
                ask_copy(&admin(store.on), &table, addr, name)
            })
            .collect::<Vec<_>>()
    };
    for (name, _, v) in &expect {
        for (to, body) in ask(name) {
            match body {
                Body::Found { record, .. } => assert_eq!(record.version, *v, "{name} at {to}"),
                other => panic!("{name} at {to}: {other:?}"),
            }
        }
    }
    for name in &deleted {
        for (to, body) in ask(name) {
            assert!(
                matches!(
                    body,
                    Body::Error {
                        code: strata_store_protocol::wire::Code::Deleted,
                        ..
                    }
                ),
                "{name} at {to}: {body:?}"
            );
        }
    }
    assert!(at_home >= 30, "only {at_home} rows asked of the node back");
    for (name, data, v) in &expect {
        let (r, bytes) = rt
            .block_on(client.get_bytes(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.version, *v, "{name}");
        assert!(bytes == *data, "{name} differs");
    }
    for name in &deleted {
        assert!(
            rt.block_on(client.get_bytes(name)).is_err(),
            "{name} reads after its delete"
        );
    }
}

//! Storage nodes joining, removed (drained, then retired), a forged
//! retire refused, and a cancelled removal.

use super::*;

#[test]
fn a_storage_node_added_to_a_running_cluster_takes_new_objects() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("cluster"), &["--replication", "1,1,1,1"]);
    let src = dir.path().join("o");
    // Over the inline limit, so that it has replicas.
    std::fs::write(&src, pattern(5000, 2)).unwrap();
    store.ok(&["obj", "put", &p(&src), "before"]);
    // The new node declares HDD; objects of 1 MiB and more prefer HDD, so
    // placement must pick it once the table advertises it.
    let mut add = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "store",
            "node",
            "add",
            "--cluster",
            &store.on.to_string(),
            "--device",
            "hdd",
        ])
        .args(["--dir", &p(&dir.path().join("new-sn"))])
        .env("STRATA_CLUSTER_KEY", store.key_path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(add.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _add = Node(add, String::new()); // killed on drop, even if an assertion fails
    assert!(line.contains("prefix index 2"), "{line}");
    wait_until("the new node in the table", || {
        store.status()["storage_nodes"].as_array().unwrap().len() == 2
    });
    std::thread::sleep(Duration::from_millis(1200)); // metadata nodes refresh the table
    let big = dir.path().join("big");
    std::fs::write(&big, pattern(2 << 20, 3)).unwrap();
    store.ok(&["obj", "put", &p(&big), "after"]);
    let stat = store.json(&["obj", "stat", "after"]);
    assert!(
        stat["replicas"][0]
            .as_str()
            .unwrap()
            .starts_with("fd53:7472:6174:2:"),
        "{stat}"
    );
    // Nothing moved: the old object stays where it was and reads back.
    let old = store.json(&["obj", "stat", "before"]);
    assert!(old["replicas"][0]
        .as_str()
        .unwrap()
        .starts_with("fd53:7472:6174:1:"));
    let dst = dir.path().join("back");
    store.ok(&["obj", "get", "before", &p(&dst)]);
    // Retiring the new node drains it (its one replica goes back to the
    // first node); retiring the last one is refused, since no node would
    // be left to hold replicas.
    wait_until("the new node's replica count published", || {
        store.status()["storage_nodes"][1]["replicas"] == 1
    });
    let id = |k: usize| {
        store.status()["storage_nodes"][k]["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (first, new) = (id(0), id(1));
    let out = store.ok(&["store", "node", "remove", &new]);
    assert!(out.contains("retiring"), "{out}");
    let err = store.fails(&["store", "node", "remove", &first]);
    assert!(err.contains("N_d=1"), "{err}");
    wait_until_long("the new node retired", Duration::from_secs(30), || {
        store.status()["storage_nodes"][1]["state"] == "retired"
    });
    let stat = store.json(&["obj", "stat", "after"]);
    assert!(stat["replicas"][0]
        .as_str()
        .unwrap()
        .starts_with("fd53:7472:6174:1:"));
    store.ok(&["obj", "get", "after", &p(&dst)]);
    assert_eq!(std::fs::read(&dst).unwrap(), pattern(2 << 20, 3));
}

/// Control and internal messages need the cluster key: a Retire sent by
/// a raw socket, unsealed or sealed with another key, is refused and the
/// node stays; so is a forged Replicate to a metadata node. The real
/// `strata store node remove` (with the key) retires it.
#[test]
fn a_forged_retire_is_refused_and_the_real_removal_works() {
    use strata_store_protocol::auth::{unix_ms, ClusterKey, KEY_LEN};
    let dir = tmp();
    let store = Store::up(
        &dir.path().join("cluster"),
        &["--sn", "2", "--replication", "1,1,1,1"],
    );
    let key = std::fs::metadata(store.key_path()).expect("up makes the cluster key");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(key.permissions().mode() & 0o777, 0o600);
    assert_eq!(key.len(), KEY_LEN as u64);
    let id = store.status()["storage_nodes"][1]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let uuid = u64::from_str_radix(&id, 16).unwrap();
    let retire = Msg::new(31, 0, Body::Retire { uuid });
    let wrong = ClusterKey::from_bytes(&[7; KEY_LEN]);
    for bytes in [
        retire.encode().unwrap(),
        retire.seal(&wrong, unix_ms()).unwrap(),
    ] {
        let reply = udp_ask(store.on, &bytes);
        assert!(error_text(&reply).contains("cluster key"), "{reply:?}");
    }
    // A forged metadata copy is refused by the metadata node too.
    let mn: SocketAddr = store.status()["metadata_nodes"][0]["endpoint"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let forged = Msg::new(
        32,
        0,
        Body::Unreplicate {
            name: "x".into(),
            version: u64::MAX,
        },
    );
    let reply = udp_ask(mn, &forged.encode().unwrap());
    assert!(
        error_text(&reply).contains("no cluster-key tag"),
        "{reply:?}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(store.status()["storage_nodes"][1]["state"], "up");
    // The command with a wrong key, a damaged key file, or no key fails
    // and says why.
    let wrong_file = dir.path().join("wrong.key");
    std::fs::write(&wrong_file, [7u8; KEY_LEN]).unwrap();
    let err = store.fails(&["store", "node", "remove", "--key", &p(&wrong_file), &id]);
    assert!(err.contains("chmod 600"), "a key others can read: {err}");
    std::fs::set_permissions(&wrong_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let err = store.fails(&["store", "node", "remove", "--key", &p(&wrong_file), &id]);
    assert!(err.contains("does not match"), "{err}");
    std::fs::write(&wrong_file, b"short").unwrap();
    let err = store.fails(&["store", "node", "remove", "--key", &p(&wrong_file), &id]);
    assert!(
        err.contains("5 bytes") && err.contains("wrong.key"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "store",
            "node",
            "remove",
            &id,
            "--cluster",
            &store.on.to_string(),
        ])
        .env_remove("STRATA_CLUSTER_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs the cluster key"), "{err}");
    assert_eq!(store.status()["storage_nodes"][1]["state"], "up");
    // The real command, with the key.
    let out = store.ok(&["store", "node", "remove", &id]);
    assert!(out.contains("retir"), "{out}");
    wait_until_long("the node retired", Duration::from_secs(30), || {
        store.status()["storage_nodes"][1]["state"] == "retired"
    });
}

/// Removing a storage node drains it before it is retired. A cluster of 3
/// metadata and 4 storage nodes (N_m = N_d = 3) holds objects from 0 B to
/// 5 MiB. One storage node is killed (down), then another is removed: the
/// records whose only possible new home is the down node cannot be
/// re-placed, so the drain waits and the status says why; the refusals
/// (too few nodes left, unknown node) are clear, and asking again is
/// harmless. Once the down node is back, the drain ends and the node is
/// retired. Meanwhile a reader Gets every object without one failure;
/// Posts made after the removal never land on the drained node. At the
/// end every object has N_d replicas, none on the retired node, in every
/// metadata copy of its record and as files on the nodes the record
/// names; everything reads back whole, and the retired node holds no
/// replica file.
#[test]
fn a_removed_storage_node_is_drained_then_retired_without_a_failed_read() {
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
        ],
    );
    let extra_dir = dir.path().join("sn-extra");
    let mut extra = Node::add(&store, &extra_dir, "sn");
    store.wait_for_nodes("storage", 4);
    std::thread::sleep(Duration::from_millis(1200)); // metadata nodes see it
    let dirs = sn_dirs(&store, &[&extra_dir]);
    assert_eq!(dirs.len(), 4);
    let (rt, client) = connect_client(store.on);
    let table = rt
        .block_on(strata_store_client::transport::fetch_table(store.on, None))
        .unwrap();
    let index_of = |uuid: u64| table.sns.iter().find(|s| s.uuid == uuid).unwrap().index;
    let extra_index = index_of(strata_store::runtime::node_uuid(&extra_dir).unwrap());
    let gone_uuid = strata_store::runtime::node_uuid(&store.dir.join("sn-0")).unwrap();
    let gone = index_of(gone_uuid);
    let on = |index: u16, r: &strata_store_protocol::wire::Record| {
        r.replicas
            .iter()
            .any(|&a| table.layout.sn_of(a) == Some(index))
    };
    // Objects of every size, until some can only be re-placed on the node
    // that will be down (they name the node to remove and not it).
    let mut objects: Vec<(String, Vec<u8>)> = Vec::new();
    let mut stuck = 0;
    for i in 0..60usize {
        let size = match i {
            0 => 0,
            1 => 1,
            2 => 3 << 20,
            3 => 5 << 20,
            4 => 1 << 20,
            _ => (i * 7_919) % 150_000,
        };
        let name = format!("drain/{i:02}");
        let data = pattern(size, i as u64 + 40);
        rt.block_on(client.put(&name, size as u64, &mut data.as_slice(), &|_| {}))
            .unwrap();
        let (record, _) = rt.block_on(client.get_bytes(&name)).unwrap();
        if on(gone, &record) && !on(extra_index, &record) {
            stuck += 1;
        }
        objects.push((name, data));
        if i >= 20 && stuck > 0 {
            break;
        }
    }
    assert!(stuck > 0, "no object would wait for the down node");

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = spawn_reader(store.on, stop.clone(), objects.clone());
    std::thread::sleep(Duration::from_millis(300));
    extra.kill9();
    wait_until("the killed storage node marked down", || {
        let st = store.status();
        st["storage_nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["state"] == "down")
    });

    // Refusals: an unknown node, a malformed id.
    let err = store.fails(&["store", "node", "remove", "00000000000000ff"]);
    assert!(err.contains("no node 00000000000000ff"), "{err}");
    let err = store.fails(&["store", "node", "remove", "nope"]);
    assert!(err.contains("invalid node id"), "{err}");
    let id = format!("{gone_uuid:016x}");
    let out = store.ok(&["store", "node", "remove", &id]);
    assert!(out.contains(&format!("retiring {id}")), "{out}");
    let removed_at = Instant::now();
    let sn_json = |st: &serde_json::Value| {
        st["storage_nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id.as_str())
            .cloned()
            .unwrap()
    };
    assert_eq!(sn_json(&store.status())["state"], "retiring");
    // Asking again changes nothing; a second node would leave 2 storage
    // nodes (one of them down) for N_d = 3.
    let again = store.json(&["store", "node", "remove", &id]);
    assert_eq!(again["state"], "retiring", "{again}");
    let other = format!(
        "{:016x}",
        strata_store::runtime::node_uuid(&store.dir.join("sn-1")).unwrap()
    );
    let err = store.fails(&["store", "node", "remove", &other]);
    assert!(
        err.contains("N_d=3") && err.contains("add a storage node"),
        "{err}"
    );

    // The drain waits for room, and says so.
    wait_until_long(
        "the drain waiting for room",
        Duration::from_secs(20),
        || {
            let d = &sn_json(&store.status())["drain"];
            d["unplaceable"].as_u64().unwrap_or(0) > 0
                && d["waiting"]
                    .as_str()
                    .is_some_and(|w| w.contains("no other storage node up with room"))
        },
    );
    let text = store.ok(&["store", "status"]);
    assert!(
        text.contains("retiring") && text.contains("draining:") && text.contains("waiting:"),
        "{text}"
    );
    let left = sn_json(&store.status())["drain"]["replicas_left"]
        .as_u64()
        .unwrap();
    assert!(left >= stuck, "{left} replicas left, {stuck} stuck");

    // Posts after the removal (once the metadata nodes have the table)
    // never land on the drained node.
    std::thread::sleep(Duration::from_millis(
        1500u64.saturating_sub(removed_at.elapsed().as_millis() as u64),
    ));
    let mut fresh = Vec::new();
    for i in 0..12usize {
        let name = format!("fresh/{i:02}");
        let data = pattern(i * 10_007 + (i % 3) * (1 << 20), 700 + i as u64);
        rt.block_on(client.put(&name, data.len() as u64, &mut data.as_slice(), &|_| {}))
            .unwrap();
        let (record, _) = rt.block_on(client.get_bytes(&name)).unwrap();
        assert!(!on(gone, &record), "{name} placed on the drained node");
        fresh.push((name, data));
    }
    assert_ne!(sn_json(&store.status())["state"], "retired");

    // The down node is back: the drain ends.
    let _back = Node::add(&store, &extra_dir, "sn");
    wait_until_long("the node retired", Duration::from_secs(60), || {
        sn_json(&store.status())["state"] == "retired"
    });
    assert!(sn_json(&store.status())["drain"].is_null());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (gets, failures) = reader.join().unwrap();
    assert!(
        failures.is_empty(),
        "Gets failed during the drain: {failures:?}"
    );
    assert!(gets > objects.len() as u64, "the reader made no progress");

    // Every object: N_d replicas, none on the retired node, the same in
    // every metadata copy, each a file on the node it names; whole data.
    let gone_dir = &dirs[&gone_uuid];
    wait_until("the retired node's replicas freed", || {
        replica_names(gone_dir).is_empty()
    });
    objects.extend(fresh);
    for (name, data) in &objects {
        // An empty or inline object has no replica; the others N_d.
        let inline = data.len() <= strata_store_protocol::wire::MAX_INLINE;
        let want = if inline { 0 } else { 3 };
        // Fresh objects may still be waiting for their third replica.
        let record = {
            let start = Instant::now();
            loop {
                let (record, bytes) = rt.block_on(client.get_bytes(name)).unwrap();
                assert!(bytes == *data, "{name} reads back wrong");
                if record.replicas.len() == want || start.elapsed() > Duration::from_secs(20) {
                    break record;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        };
        assert_eq!(record.replicas.len(), want, "{name}: {record:?}");
        assert!(!on(gone, &record), "{name} still names the retired node");
        for &a in &record.replicas {
            let index = table.layout.sn_of(a).unwrap();
            let uuid = table.sns.iter().find(|s| s.index == index).unwrap().uuid;
            let file = format!("{a:032x}");
            assert!(
                replica_names(&dirs[&uuid]).contains(&file),
                "{name}: no replica file {file} on node {uuid:016x}"
            );
        }
        for &meta in &record.meta {
            let (_, answer) = ask_copy(client.credential(), &client.table(), meta, name);
            match answer {
                Body::Found { record: copy, .. } => {
                    assert_eq!(copy.replicas, record.replicas, "{name}: metadata copy")
                }
                other => panic!("{name}: {other:?}"),
            }
        }
    }
}

/// A storage node running in its own process (`strata store node add`)
/// exits by itself once it is retired: drained, its replicas freed.
#[test]
fn a_retired_storage_node_process_exits_when_its_drain_ends() {
    let dir = tmp();
    let store = Store::up(
        &dir.path().join("cluster"),
        &["--mn", "1", "--sn", "2", "--replication", "1,1,2,1"],
    );
    let extra_dir = dir.path().join("sn-extra");
    let mut extra = Node::add(&store, &extra_dir, "sn");
    store.wait_for_nodes("storage", 3);
    std::thread::sleep(Duration::from_millis(1200)); // the metadata node sees it
    let (rt, client) = connect_client(store.on);
    let objects: Vec<(String, Vec<u8>)> = (0..24)
        .map(|i| (format!("r/{i}"), pattern(3_000 + i * 7, i as u64)))
        .collect();
    for (name, data) in &objects {
        rt.block_on(client.put(name, data.len() as u64, &mut data.as_slice(), &|_| {}))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert!(
        replica_names(&extra_dir).len() > 2,
        "too few replicas on the node to remove"
    );
    let uuid = strata_store::runtime::node_uuid(&extra_dir).unwrap();
    store.ok(&["store", "node", "remove", &format!("{uuid:016x}")]);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = extra.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the retired node's process is still running: {}",
            store.status()["storage_nodes"]
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status}");
    let st = store.status();
    let sn = st["storage_nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == format!("{uuid:016x}"))
        .unwrap_or_else(|| panic!("no node {uuid:016x} in {st}"));
    assert_eq!(sn["state"], "retired", "{st}");
    assert!(replica_names(&extra_dir).is_empty(), "replicas left behind");
    for (name, data) in &objects {
        let (_, bytes) = rt.block_on(client.get_bytes(name)).unwrap();
        assert!(bytes == *data, "{name} differs after the retirement");
    }
}

/// A removal can be cancelled before it ends. A cluster of 1 metadata and
/// 3 storage nodes (N_d = 2) holds objects on every pair of nodes; one
/// storage node is killed (down) and another removed, so the drain
/// re-places what it can and then waits for room. Cancelled, the node is
/// up again at once in the status, Posts land on it again, every object
/// reads back, the copies the drain made redundant are collected, and
/// refusals and a repeated cancel are clear. Removed again once the down
/// node is back, it is drained and retired normally.
#[test]
fn a_cancelled_removal_puts_the_storage_node_back_and_a_later_one_retires_it() {
    let dir = tmp();
    let store = Store::up(
        &dir.path().join("cluster"),
        &[
            "--mn",
            "1",
            "--sn",
            "2",
            "--replication",
            "1,1,2,1",
            "--short-failure-ms",
            "500",
            // Collect the copies the drain left unreferenced quickly.
            "--gc-interval-ms",
            "500",
            "--gc-grace-ms",
            "1000",
        ],
    );
    let extra_dir = dir.path().join("sn-extra");
    let mut extra = Node::add(&store, &extra_dir, "sn");
    store.wait_for_nodes("storage", 3);
    std::thread::sleep(Duration::from_millis(1200)); // the metadata node sees it
    let (rt, client) = connect_client(store.on);
    let table = rt
        .block_on(strata_store_client::transport::fetch_table(store.on, None))
        .unwrap();
    let index_of = |uuid: u64| table.sns.iter().find(|s| s.uuid == uuid).unwrap().index;
    let gone_uuid = strata_store::runtime::node_uuid(&store.dir.join("sn-0")).unwrap();
    let gone = index_of(gone_uuid);
    let gone_dir = store.dir.join("sn-0");
    let extra_index = index_of(strata_store::runtime::node_uuid(&extra_dir).unwrap());
    let on = |index: u16, r: &strata_store_protocol::wire::Record| {
        r.replicas
            .iter()
            .any(|&a| table.layout.sn_of(a) == Some(index))
    };
    // Objects until some can be re-placed (they name the down node, whose
    // replica still counts) and some cannot (their only new home would be
    // the down node).
    let (mut objects, mut movable, mut stuck) = (Vec::new(), 0, 0);
    for i in 0..60usize {
        let name = format!("keep/{i:02}");
        let data = pattern(1_000 + (i * 7_919) % 60_000, 900 + i as u64);
        rt.block_on(client.put(&name, data.len() as u64, &mut data.as_slice(), &|_| {}))
            .unwrap();
        let (record, _) = rt.block_on(client.get_bytes(&name)).unwrap();
        if on(gone, &record) {
            if on(extra_index, &record) {
                movable += 1;
            } else {
                stuck += 1;
            }
        }
        objects.push((name, data));
        if i >= 12 && movable > 0 && stuck > 0 {
            break;
        }
    }
    assert!(movable > 0 && stuck > 0, "{movable} movable, {stuck} stuck");
    extra.kill9();
    wait_until("the killed storage node marked down", || {
        store.status()["storage_nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["state"] == "down")
    });
    let id = format!("{gone_uuid:016x}");
    let sn_json = |st: &serde_json::Value| {
        st["storage_nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id.as_str())
            .cloned()
            .unwrap()
    };
    store.ok(&["store", "node", "remove", &id]);
    assert_eq!(sn_json(&store.status())["state"], "retiring");
    // The drain re-places what it can, then waits for room.
    wait_until_long(
        "the drain re-placing what it can",
        Duration::from_secs(20),
        || {
            let d = &sn_json(&store.status())["drain"];
            d["replicas_left"].as_u64() == Some(stuck)
                && d["unplaceable"].as_u64() == Some(stuck)
                && d["waiting"]
                    .as_str()
                    .is_some_and(|w| w.contains("no other storage node up with room"))
        },
    );
    let text = store.ok(&["store", "status"]);
    assert!(
        text.contains("retiring") && text.contains("waiting:"),
        "{text}"
    );

    // Refusals: an unknown node, a malformed id. A node that is not being
    // removed is left as it is.
    let err = store.fails(&["store", "node", "remove", "--cancel", "00000000000000ff"]);
    assert!(err.contains("no node 00000000000000ff"), "{err}");
    let err = store.fails(&["store", "node", "remove", "--cancel", "nope"]);
    assert!(err.contains("invalid node id"), "{err}");
    let other = format!(
        "{:016x}",
        strata_store::runtime::node_uuid(&store.dir.join("sn-1")).unwrap()
    );
    let out = store.json(&["store", "node", "remove", "--cancel", &other]);
    assert_eq!(out["cancelled"], false, "{out}");
    assert_eq!(out["state"], "up", "{out}");
    let out = store.ok(&["store", "node", "remove", "--cancel", &other]);
    assert!(out.contains("is not being removed"), "{out}");

    // Cancelled: up at once, no drain; asking again is harmless.
    let out = store.json(&["store", "node", "remove", "--cancel", &id]);
    assert_eq!(out["cancelled"], true, "{out}");
    assert_eq!(out["state"], "up", "{out}");
    let cancelled_at = Instant::now();
    let sn = sn_json(&store.status());
    assert_eq!(sn["state"], "up", "{sn}");
    assert!(sn["drain"].is_null(), "{sn}");
    let out = store.ok(&["store", "node", "remove", "--cancel", &id]);
    assert!(out.contains("is not being removed (up)"), "{out}");
    let text = store.ok(&["store", "status"]);
    assert!(!text.contains("retiring"), "{text}");

    // Posts land on it again (once the metadata node has the table): with
    // the other node down, it is one of the two left.
    std::thread::sleep(Duration::from_millis(
        1200u64.saturating_sub(cancelled_at.elapsed().as_millis() as u64),
    ));
    for i in 0..6usize {
        let name = format!("back/{i}");
        let data = pattern(5_000 + i * 1_001, 950 + i as u64);
        rt.block_on(client.put(&name, data.len() as u64, &mut data.as_slice(), &|_| {}))
            .unwrap();
        let (record, _) = rt.block_on(client.get_bytes(&name)).unwrap();
        assert!(
            on(gone, &record),
            "{name} not placed on the node back: {record:?}"
        );
        objects.push((name, data));
    }
    // Everything reads back; the node holds exactly the replicas records
    // name (the drain's copies made its own redundant, and the collection
    // round frees those).
    let mut named = std::collections::BTreeSet::new();
    for (name, data) in &objects {
        let (record, bytes) = rt.block_on(client.get_bytes(name)).unwrap();
        assert!(bytes == *data, "{name} reads back wrong");
        named.extend(
            record
                .replicas
                .iter()
                .filter(|&&a| table.layout.sn_of(a) == Some(gone))
                .map(|a| format!("{a:032x}")),
        );
    }
    assert_eq!(
        named.len(),
        stuck as usize + 6,
        "records moved after the cancel"
    );
    wait_until("the redundant copies collected", || {
        replica_names(&gone_dir) == named
    });

    // Removed again once the down node is back: drained and retired.
    let _back = Node::add(&store, &extra_dir, "sn");
    wait_until("the killed node back", || {
        store.status()["storage_nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["state"] == "up")
    });
    let out = store.ok(&["store", "node", "remove", &id]);
    assert!(out.contains(&format!("retiring {id}")), "{out}");
    wait_until_long("the node retired", Duration::from_secs(30), || {
        sn_json(&store.status())["state"] == "retired"
    });
    // A retirement cannot be cancelled.
    let err = store.fails(&["store", "node", "remove", "--cancel", &id]);
    assert!(
        err.contains("retired already") && err.contains("add it again as a new node"),
        "{err}"
    );
    wait_until("the retired node's replicas freed", || {
        replica_names(&gone_dir).is_empty()
    });
    for (name, data) in &objects {
        let (record, bytes) = rt.block_on(client.get_bytes(name)).unwrap();
        assert!(
            bytes == *data,
            "{name} reads back wrong after the retirement"
        );
        assert_eq!(record.replicas.len(), 2, "{name}: {record:?}");
        assert!(!on(gone, &record), "{name} still names the retired node");
    }
}

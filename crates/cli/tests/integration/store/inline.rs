//! Small objects kept inside their metadata record: posted and read in
//! one exchange with no storage node, surviving a kill -9 of the whole
//! store and the loss of a metadata node, overwritten by large objects
//! and the reverse; one byte over the limit, or a class the metadata
//! copies cannot hold, still takes the data path.

use super::*;
use strata_store_protocol::class::StorageClass;
use strata_store_protocol::wire::MAX_INLINE;

/// Three metadata copies (all acknowledging) and two data replicas, on
/// five storage nodes (for an `ec(2,3)` object): `replicated(2)` needs
/// two metadata copies to keep its redundancy inline, and three are
/// there.
const INLINE: &[&str] = &["--mn", "3", "--sn", "5", "--replication", "3,3,2,2"];

/// The sizes posted inline: the smallest, odd ones and the largest.
const SIZES: [usize; 5] = [1, 17, 1_000, 4_000, MAX_INLINE];

/// Posts `data` as `name` through the client; what the Post did.
fn put(
    rt: &tokio::runtime::Runtime,
    client: &strata_store_client::client::Client,
    name: &str,
    data: &[u8],
    class: Option<StorageClass>,
) -> strata_store_client::client::PutResult {
    rt.block_on(client.put_in_class(
        name,
        data.len() as u64,
        &mut &data[..],
        &|_| {},
        class,
        || Ok(b"{\"etag\":\"small\"}".to_vec()),
    ))
    .unwrap_or_else(|e| panic!("posting {name}: {e}"))
}

/// Reads `name` through the client and checks it bit-exact.
fn check_read(
    rt: &tokio::runtime::Runtime,
    client: &strata_store_client::client::Client,
    name: &str,
    want: &[u8],
) {
    let (record, bytes) = rt
        .block_on(client.get_bytes(name))
        .unwrap_or_else(|e| panic!("reading {name}: {e}"));
    assert!(
        bytes == want,
        "{name}: read {} bytes, not its own",
        bytes.len()
    );
    assert_eq!(record.attributes, b"{\"etag\":\"small\"}", "{name}");
}

#[test]
fn inline_objects_survive_kill_9_of_the_store_and_larger_ones_take_the_data_path() {
    let dir = tmp();
    let store_dir = dir.path().join("cluster");
    let store = Store::up(&store_dir, INLINE);
    let (rt, client) = connect_client(store.on);
    let objects: Vec<(String, Vec<u8>)> = SIZES
        .iter()
        .enumerate()
        .map(|(i, &size)| (format!("small/{size}"), pattern(size, i as u64 + 1)))
        .collect();
    for (name, data) in &objects {
        let put = put(&rt, &client, name, data, None);
        assert!(put.inline && put.replicas.is_empty(), "{name}: {put:?}");
        check_read(&rt, &client, name, data);
    }
    // One byte over the limit, and a class whose redundancy the three
    // metadata copies cannot hold (ec(2,3) survives three failures),
    // take the data path: replicas, or fragments, on storage nodes.
    let over = pattern(MAX_INLINE + 1, 99);
    let put_over = put(&rt, &client, "small/over", &over, None);
    assert!(!put_over.inline, "{put_over:?}");
    assert_eq!(put_over.replicas.len(), 2, "{put_over:?}");
    let coded = StorageClass::ErasureCoded { data: 2, parity: 3 };
    let small_coded = pattern(100, 7);
    let put_coded = put(&rt, &client, "small/coded", &small_coded, Some(coded));
    assert!(!put_coded.inline, "{put_coded:?}");
    assert_eq!(put_coded.replicas.len(), 5, "{put_coded:?}");
    // Only those two took storage nodes: the inline objects have no file.
    assert_eq!(store.replica_files().len(), 2 + 5);

    // `strata obj` shows and reads an inline object as any other.
    let stat = store.json(&["obj", "stat", "small/17"]);
    assert_eq!(stat["inline"], true, "{stat}");
    assert_eq!(stat["replicas"].as_array().unwrap().len(), 0, "{stat}");
    assert_eq!(stat["metadata_addresses"].as_array().unwrap().len(), 3);
    let stat = store.json(&["obj", "stat", "small/over"]);
    assert_eq!(stat["inline"], false, "{stat}");
    assert_eq!(stat["replicas"].as_array().unwrap().len(), 2, "{stat}");
    let src = dir.path().join("put-in");
    std::fs::write(&src, pattern(333, 5)).unwrap();
    let posted = store.json(&["obj", "put", &p(&src), "small/cli"]);
    assert_eq!(posted["inline"], true, "{posted}");
    assert_eq!(posted["copies"], 0, "{posted}");
    let human = store.ok(&["obj", "put", &p(&src), "small/cli"]);
    assert!(human.contains("inline in its record"), "{human}");
    let dst = dir.path().join("get-out");
    store.ok(&["obj", "get", "small/cli", &p(&dst)]);
    assert!(std::fs::read(&dst).unwrap() == pattern(333, 5));

    // Kill -9 of the whole store: every acknowledged inline object is on
    // disk on its metadata copies, and reads back bit-exact.
    // SAFETY: SIGKILL to our own child, not reaped yet.
    unsafe { libc::kill(store.pid() as i32, libc::SIGKILL) };
    drop(store);
    let store = Store::up(&store_dir, INLINE);
    let (rt, client) = connect_client(store.on);
    for (name, data) in &objects {
        check_read(&rt, &client, name, data);
    }
    // Every storage node back before the large Posts below place on them.
    wait_until("every storage node up again", || {
        let status = store.status();
        let nodes = status["storage_nodes"].as_array().unwrap();
        nodes.len() == 5 && nodes.iter().all(|n| n["state"] == "up")
    });
    std::thread::sleep(Duration::from_millis(1200)); // metadata nodes see it
    check_read(&rt, &client, "small/over", &over);
    check_read(&rt, &client, "small/coded", &small_coded);

    // A large object over an inline one, and an inline one over a large
    // one: each reads back as the last Post, and the replaced large
    // object's replicas are freed.
    let large = pattern(300_000, 11);
    let put_large = put(&rt, &client, "small/1", &large, None);
    assert_eq!(put_large.replicas.len(), 2);
    check_read(&rt, &client, "small/1", &large);
    let small = pattern(10, 12);
    assert!(put(&rt, &client, "small/over", &small, None).inline);
    check_read(&rt, &client, "small/over", &small);
    let over_files: Vec<String> = put_over
        .replicas
        .iter()
        .map(|&a| format!("{a:032x}"))
        .collect();
    wait_until("the replaced object's replicas freed", || {
        let names = store.replica_files();
        !names
            .iter()
            .any(|f| over_files.contains(&f.file_name().unwrap().to_string_lossy().to_string()))
    });
    // Renamed and deleted like any other object.
    rt.block_on(client.rename("small/17", "moved/17")).unwrap();
    check_read(&rt, &client, "moved/17", &objects[1].1);
    assert!(rt.block_on(client.stat("small/17")).is_err());
    rt.block_on(client.delete("moved/17")).unwrap();
    assert!(rt.block_on(client.get_bytes("moved/17")).is_err());
    // Listed without their bytes, with their sizes.
    let listed = store.json(&["obj", "ls", "small/", "--all"]);
    let sizes: Vec<u64> = listed["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["size"].as_u64().unwrap())
        .collect();
    assert!(sizes.contains(&(MAX_INLINE as u64)), "{listed}");
}

#[test]
fn inline_objects_survive_the_loss_of_a_metadata_node() {
    let dir = tmp();
    let store = Store::up(
        &dir.path().join("cluster"),
        &[
            "--mn",
            "2",
            "--mn-slots",
            "3",
            "--sn",
            "2",
            "--replication",
            "3,2,2,2",
            "--short-failure-ms",
            "1000",
        ],
    );
    let mut mn = Node::add(&store, &dir.path().join("mn-extra"), "mn");
    store.wait_for_nodes("metadata", 3);
    std::thread::sleep(Duration::from_millis(1200));
    let (rt, client) = connect_client(store.on);
    let objects: Vec<(String, Vec<u8>)> = (0..24)
        .map(|i| (format!("m/{i}"), pattern(1 + i * 170, i as u64)))
        .collect();
    for (name, data) in &objects {
        assert!(put(&rt, &client, name, data, None).inline, "{name}");
    }
    assert_eq!(store.replica_files().len(), 0);
    mn.kill9();
    // Every object reads back bit-exact from its other metadata copies
    // (once the lost node's groups stand in elsewhere, for names whose
    // reachable copies were all on it).
    let start = Instant::now();
    for (name, data) in &objects {
        loop {
            match rt.block_on(client.get_bytes(name)) {
                Ok((_, bytes)) => {
                    assert!(bytes == *data, "{name} differs");
                    break;
                }
                Err(e) => {
                    assert!(
                        start.elapsed() < Duration::from_secs(20),
                        "{name} unreadable after losing a metadata node: {e}"
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }
    // New inline Posts succeed on the two copies left, and read back.
    wait_until("the lost metadata node marked down", || {
        store.status()["metadata_nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["state"] == "down")
    });
    // (A name coordinated by the lost node waits for its stand-in.)
    let data = pattern(MAX_INLINE, 77);
    let start = Instant::now();
    let name = (0..)
        .map(|i| format!("m/after/{i}"))
        .find(|name| {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no inline Post succeeded with a metadata node down"
            );
            let mut source = &data[..];
            let put = client.put(name, data.len() as u64, &mut source, &|_| {});
            rt.block_on(put).is_ok_and(|r| r.inline)
        })
        .unwrap();
    let (_, bytes) = rt.block_on(client.get_bytes(&name)).unwrap();
    assert!(bytes == data, "{name} differs");
}

//! Erasure-coded storage classes, as real processes: objects of a bucket
//! kept in `ec(4,2)` (and one Post in `ec(2,1)`) read back bit-exact
//! with a fragment damaged on disk and with m storage nodes killed, and
//! the metadata node rebuilds what was lost until every object has its
//! k + m fragments again.

use super::*;

/// The storage-node addresses of `name`'s fragments, in fragment order.
fn fragments_of(store: &Store, name: &str) -> Vec<String> {
    let stat = store.json(&["obj", "stat", name]);
    stat["replicas"]
        .as_array()
        .expect("a fragment list")
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// The file holding the replica or fragment at `addr`, if a storage
/// node under `root` (the cluster's and the added nodes' directories)
/// holds it.
fn file_of(root: &Path, addr: &str) -> Option<PathBuf> {
    let ip: std::net::Ipv6Addr = addr.parse().unwrap();
    let name = format!("{:032x}", u128::from(ip));
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().is_some_and(|n| n == name.as_str()) {
                return Some(path);
            }
        }
    }
    None
}

/// The storage-node prefix (without `::/64`) of node `index` in the
/// status.
fn prefix_of(store: &Store, index: usize) -> String {
    store.status()["storage_nodes"][index]["prefix"]
        .as_str()
        .unwrap()
        .trim_end_matches("::/64")
        .to_string()
}

fn get_is(store: &Store, dir: &Path, name: &str, want: &[u8]) {
    let out = dir.join("got");
    store.ok(&["obj", "get", name, &p(&out)]);
    assert!(
        std::fs::read(&out).unwrap() == want,
        "{name} read back wrong"
    );
}

#[test]
fn erasure_coded_objects_survive_damage_and_m_dead_nodes_and_are_rebuilt() {
    let dir = tmp();
    // Bad classes are refused before anything starts.
    let refused = strata(&[
        "store",
        "up",
        "--dir",
        &p(&dir.path().join("bad")),
        "--bucket-class",
        "x=ec(12,5)",
    ]);
    let text = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && text.contains("out of bounds"),
        "{text}"
    );

    let store = Store::up(
        &dir.path().join("cluster"),
        &[
            "--mn",
            "1",
            "--sn",
            "4",
            "--bucket-class",
            "ec=ec(4,2)",
            "--short-failure-ms",
            "500",
            "--definitive-failure-ms",
            "2500",
        ],
    );
    let mut doomed = [
        Node::add(&store, &dir.path().join("sn-a"), "sn"),
        Node::add(&store, &dir.path().join("sn-b"), "sn"),
    ];
    store.wait_for_nodes("storage", 6);
    std::thread::sleep(Duration::from_millis(1200));

    let sizes = [1usize, 5_000, 300_001, 2_500_000];
    let mut objects = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let data = pattern(size, i as u64 + 3);
        let src = dir.path().join(format!("src{i}"));
        std::fs::write(&src, &data).unwrap();
        let name = format!("ec/{i}");
        store.ok(&["obj", "put", &p(&src), &name]);
        let stat = store.json(&["obj", "stat", &name]);
        assert_eq!(stat["class"], "ec(4,2)", "{stat}");
        assert_eq!(fragments_of(&store, &name).len(), 6, "{stat}");
        assert_eq!(stat["fragment_crc32c"].as_array().unwrap().len(), 6);
        get_is(&store, dir.path(), &name, &data);
        objects.push((name, data));
    }
    // Raw bytes on disk for the largest: about (k+m)/k = 1.5 times.
    let raw: u64 = fragments_of(&store, "ec/3")
        .iter()
        .map(|a| {
            std::fs::metadata(file_of(dir.path(), a).unwrap())
                .unwrap()
                .len()
        })
        .sum();
    assert!(
        raw as f64 <= 1.6 * 2_500_000.0,
        "{raw} raw bytes for 2.5 MB"
    );

    // A class per Post, and one out of bounds refused.
    let src = dir.path().join("src0");
    store.ok(&["obj", "put", "--class", "ec(2,1)", &p(&src), "x/one"]);
    assert_eq!(store.json(&["obj", "stat", "x/one"])["class"], "ec(2,1)");
    let error = store.fails(&["obj", "put", "--class", "ec(12,5)", &p(&src), "x/two"]);
    assert!(error.contains("out of bounds"), "{error}");

    // A damaged fragment is caught by its CRC: the Get decodes without
    // it and is exact, and the fragment is rebuilt under a new address.
    let (name, data) = &objects[3];
    let damaged = fragments_of(&store, name)[0].clone();
    let path = file_of(dir.path(), &damaged).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() - 1000;
    bytes[at] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    get_is(&store, dir.path(), name, data);
    wait_until("the damaged fragment rebuilt", || {
        let now = fragments_of(&store, name);
        now.len() == 6 && now[0] != damaged
    });
    get_is(&store, dir.path(), name, data);

    // kill -9 of m = 2 storage nodes, each holding a fragment of every
    // object: every object reads back at once, from the 4 left.
    let _spares = [
        Node::add(&store, &dir.path().join("sn-c"), "sn"),
        Node::add(&store, &dir.path().join("sn-d"), "sn"),
    ];
    store.wait_for_nodes("storage", 8);
    let dead = [prefix_of(&store, 4), prefix_of(&store, 5)];
    for node in &mut doomed {
        node.kill9();
    }
    for (name, data) in &objects {
        get_is(&store, dir.path(), name, data);
    }
    // Once they are dead, repair rebuilds the lost fragments on the
    // spare nodes: k + m fragments again, none on a dead node.
    let on_dead = |a: &String| dead.iter().any(|d| a.starts_with(&format!("{d}:")));
    wait_until_long(
        "every lost fragment rebuilt",
        Duration::from_secs(40),
        || {
            objects.iter().all(|(name, _)| {
                let now = fragments_of(&store, name);
                now.len() == 6 && !now.iter().any(on_dead)
            })
        },
    );
    for (name, data) in &objects {
        get_is(&store, dir.path(), name, data);
    }
}

//! Erasure-coded storage classes, as real processes: objects of a bucket
//! kept in `ec(4,2)` (and one Post in `ec(2,1)`) read back bit-exact
//! with a fragment damaged on disk and with m storage nodes killed, and
//! the metadata node rebuilds what was lost until every object has its
//! k + m fragments again.

use super::*;

/// The storage-node addresses of `name`'s fragments, in fragment order.
/// The storage-node prefix (without `::/64`) of node `index` in the
/// status.
fn prefix_of(store: &Store, index: usize) -> String {
    store.status()["storage_nodes"][index]["prefix"]
        .as_str()
        .unwrap()
        .trim_end_matches("::/64")
        .to_string()
}

/// The storage process's `/metrics` endpoint, from the readiness line.
fn metrics_at(store: &Store) -> String {
    let at = store
        .line()
        .split("metrics on http://")
        .nth(1)
        .expect("a metrics endpoint");
    let at = at.split([',', ' ']).next().unwrap_or_default();
    at.trim_end_matches("/metrics").to_string()
}

/// The sum of `metric`'s samples over every node in `text`.
fn sum_of(text: &str, metric: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(&format!("{metric}{{")))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
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
            "--metrics",
            "127.0.0.1:0",
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
        assert_eq!(store.addresses_of(&name).len(), 6, "{stat}");
        assert_eq!(stat["fragment_crc32c"].as_array().unwrap().len(), 6);
        get_is(&store, dir.path(), &name, &data);
        objects.push((name, data));
    }
    // Raw bytes on disk for the largest: about (k+m)/k = 1.5 times.
    let raw: u64 = store
        .addresses_of("ec/3")
        .iter()
        .map(|a| {
            std::fs::metadata(file_of_address(dir.path(), a).unwrap())
                .unwrap()
                .len()
        })
        .sum();
    assert!(
        raw as f64 <= 1.6 * 2_500_000.0,
        "{raw} raw bytes for 2.5 MB"
    );

    // The node of fragment 0 serves an object whole, gathered on the
    // first Get; a second Get is a hit of its object cache. (/metrics
    // shows the nodes of `store up`'s process: an object whose fragment
    // 0 is on one of them.)
    let local: Vec<String> = (0..4).map(|i| prefix_of(&store, i)).collect();
    let data = pattern(70_000, 99);
    let probe = dir.path().join("probe");
    std::fs::write(&probe, &data).unwrap();
    let name = (0..40)
        .map(|i| format!("ec/probe{i}"))
        .find(|name| {
            store.ok(&["obj", "put", &p(&probe), name]);
            let first = &store.addresses_of(name)[0];
            local.iter().any(|l| first.starts_with(&format!("{l}:")))
        })
        .expect("an object with fragment 0 on a node of the store's process");
    let hits = || {
        let text = super::rs3::metrics(&metrics_at(&store));
        sum_of(&text, "strata_object_cache_hits_total")
    };
    let before = hits();
    get_is(&store, dir.path(), &name, &data);
    get_is(&store, dir.path(), &name, &data);
    assert!(hits() >= before + 1.0, "no object cache hit on /metrics");

    // A class per Post, and one out of bounds refused.
    let src = dir.path().join("src0");
    store.ok(&["obj", "put", "--class", "ec(2,1)", &p(&src), "x/one"]);
    assert_eq!(store.json(&["obj", "stat", "x/one"])["class"], "ec(2,1)");
    let error = store.fails(&["obj", "put", "--class", "ec(12,5)", &p(&src), "x/two"]);
    assert!(error.contains("out of bounds"), "{error}");

    // A damaged fragment is caught by its CRC: the Get decodes without
    // it and is exact, and the fragment is rebuilt under a new address.
    // (A fresh object: one read before is served from the object cache,
    // which holds it verified, without reading fragments.)
    let data = &pattern(2_000_000, 77);
    let name = &"ec/damaged".to_string();
    std::fs::write(&probe, data).unwrap();
    store.ok(&["obj", "put", &p(&probe), name]);
    let damaged = store.addresses_of(name)[0].clone();
    let path = file_of_address(dir.path(), &damaged).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    // In the data, before the chunk table that follows it.
    let size = u64::from_be_bytes(bytes[8..16].try_into().unwrap()) as usize;
    let at = 20 + size - 1000;
    bytes[at] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    get_is(&store, dir.path(), name, data);
    wait_until("the damaged fragment rebuilt", || {
        let now = store.addresses_of(name);
        now.len() == 6 && now[0] != damaged
    });
    get_is(&store, dir.path(), name, data);

    // Fragments in the wrong place: two swapped (each a whole replica
    // file with a good checksum of its own, at the other's index), and
    // one of another object's length. Each is caught against the
    // record's CRC-32C or the layout's length, never decoded: the Gets
    // are exact from the good fragments, and the bad ones are rebuilt.
    let misplaced = "ec/misplaced".to_string();
    let data = pattern(600_000, 78);
    std::fs::write(&probe, &data).unwrap();
    store.ok(&["obj", "put", &p(&probe), &misplaced]);
    let at = store.addresses_of(&misplaced);
    let (one, two) = (
        file_of_address(dir.path(), &at[1]).unwrap(),
        file_of_address(dir.path(), &at[2]).unwrap(),
    );
    let (bytes_one, bytes_two) = (std::fs::read(&one).unwrap(), std::fs::read(&two).unwrap());
    std::fs::write(&one, &bytes_two).unwrap();
    std::fs::write(&two, &bytes_one).unwrap();
    get_is(&store, dir.path(), &misplaced, &data);
    wait_until("the swapped fragments rebuilt", || {
        let now = store.addresses_of(&misplaced);
        now[1] != at[1] && now[2] != at[2]
    });
    get_is(&store, dir.path(), &misplaced, &data);
    let short = "ec/short".to_string();
    let data = pattern(900_000, 79);
    std::fs::write(&probe, &data).unwrap();
    store.ok(&["obj", "put", &p(&probe), &short]);
    let at = store.addresses_of(&short);
    let other = file_of_address(dir.path(), &store.addresses_of(&misplaced)[3]).unwrap();
    std::fs::copy(&other, file_of_address(dir.path(), &at[3]).unwrap()).unwrap();
    get_is(&store, dir.path(), &short, &data);
    wait_until("the fragment of the wrong length rebuilt", || {
        store.addresses_of(&short)[3] != at[3]
    });

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
                let now = store.addresses_of(name);
                now.len() == 6 && !now.iter().any(on_dead)
            })
        },
    );
    for (name, data) in &objects {
        get_is(&store, dir.path(), name, data);
    }
    // The metadata node's repair counts show on /metrics.
    let text = super::rs3::metrics(&metrics_at(&store));
    let rebuilt = sum_of(&text, "strata_repair_rebuilds_started_total");
    let committed = sum_of(&text, "strata_repair_committed_total");
    assert!(
        rebuilt >= 8.0 && committed >= 8.0,
        "repair counts on /metrics:\n{text}"
    );
    // And in `strata store status --repair` (the helper sets
    // STRATA_CLUSTER_KEY), the same.
    let status = store.ok(&["store", "status", "--repair", "--output", "json"]);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let total = &status["repair"]["total"];
    assert!(
        total["rebuilds_started"].as_f64() == Some(rebuilt)
            && total["committed"].as_f64() >= Some(committed),
        "repair in `strata store status`: {status:#}"
    );
    let human = store.ok(&["store", "status", "--repair"]);
    assert!(
        human.contains("repair on mn slot") && human.contains("fragment rebuilds started"),
        "{human}"
    );
    let plain = store.ok(&["store", "status"]);
    assert!(!plain.contains("repair on mn"), "{plain}");
    let without = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "store",
            "status",
            "--repair",
            "--cluster",
            &store.on.to_string(),
        ])
        .env_remove("STRATA_CLUSTER_KEY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&without.stderr);
    assert!(
        !without.status.success() && err.contains("needs the cluster key"),
        "{err}"
    );
}

/// A Get of the race: when it started, and what it returned (`None`:
/// it failed).
type Seen = (Instant, Option<Vec<u8>>);

/// Eight clients read an erasure-coded object (through the object cache
/// of its fragment-0 node) while it is overwritten, then deleted: no Get
/// that started after the overwrite was acknowledged returns the old
/// bytes, and none that started after the Delete returns any.
#[test]
fn cached_gets_never_return_old_bytes_after_an_overwrite_or_delete() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let dir = tmp();
    let store = Store::up(
        &dir.path().join("cluster"),
        &["--mn", "1", "--sn", "6", "--class", "ec(4,2)"],
    );
    let (old, new) = (pattern(200_000, 1), pattern(200_000, 2));
    let src = |name: &str, data: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, data).unwrap();
        p(&path)
    };
    let (old_src, new_src) = (src("old", &old), src("new", &new));
    store.ok(&["obj", "put", &old_src, "race/obj"]);
    get_is(&store, dir.path(), "race/obj", &old);
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let readers: Vec<_> = (0..8)
        .map(|i| {
            let (stop, seen) = (stop.clone(), seen.clone());
            let out = dir.path().join(format!("out{i}"));
            let mut command = store.quiet_command(&["obj", "get", "race/obj", &p(&out)]);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let ok = command.status().is_ok_and(|s| s.success());
                    let got = ok.then(|| std::fs::read(&out).unwrap_or_default());
                    seen.lock().unwrap().push((started, got));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(400));
    store.ok(&["obj", "put", &new_src, "race/obj"]);
    let overwritten = Instant::now();
    std::thread::sleep(Duration::from_millis(400));
    store.ok(&["obj", "rm", "race/obj"]);
    let deleted = Instant::now();
    std::thread::sleep(Duration::from_millis(400));
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    let after_overwrite = seen.iter().filter(|(at, _)| *at > overwritten).count();
    let after_delete = seen.iter().filter(|(at, _)| *at > deleted).count();
    assert!(
        after_overwrite >= 8 && after_delete >= 8,
        "too few Gets: {}",
        seen.len()
    );
    for (at, got) in seen.iter() {
        if *at > deleted {
            assert!(got.is_none(), "a Get after the Delete returned bytes");
        } else if *at > overwritten {
            assert!(
                got.as_deref() != Some(&old[..]),
                "a Get after the overwrite returned the old bytes"
            );
        }
    }
    assert!(
        seen.iter().any(|(at, got)| *at > overwritten
            && *at < deleted
            && got.as_deref() == Some(&new[..])),
        "no Get read the new bytes"
    );
}

/// Runs `strata obj get NAME` and checks it returns `want` within
/// `limit` (a Get that hangs fails the test instead of holding it).
fn get_within(store: &Store, dir: &Path, name: &str, want: &[u8], limit: Duration) {
    let out = dir.join("got-in-time");
    let _ = std::fs::remove_file(&out);
    let mut get = store.command(&["obj", "get", name, &p(&out)]);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = get.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = get.kill();
            let _ = get.wait();
            panic!("the Get of {name} still runs after {limit:?}: it hangs");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    if let Some(mut e) = get.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(status.success(), "the Get of {name} failed: {err}");
    assert!(
        std::fs::read(&out).unwrap() == want,
        "{name} read back wrong"
    );
}

/// A storage node that stops answering while its connections stay open
/// (SIGSTOP: what its clients see of a network partition, before the
/// orchestrator's timers mark it down): Gets of erasure-coded objects
/// whose fragment 0 it holds, which go to it first, and of objects with
/// a replica on it come back whole and exact, in bounded time, from the
/// other nodes.
#[test]
fn gets_go_around_a_storage_node_that_stops_answering() {
    let dir = tmp();
    let store = Store::up(
        &dir.path().join("cluster"),
        &[
            "--mn",
            "1",
            "--sn",
            "0",
            "--replication",
            "1,1,3,3",
            "--bucket-class",
            "ec=ec(4,2)",
            // The stopped node stays `up` in the table throughout: the
            // clients alone must go around it.
            "--short-failure-ms",
            "300000",
        ],
    );
    let nodes: Vec<Node> = (0..6)
        .map(|i| Node::add(&store, &dir.path().join(format!("sn-{i}")), "sn"))
        .collect();
    wait_until("6 storage nodes up with room", || {
        let status = store.status();
        let sns = status["storage_nodes"].as_array().unwrap();
        sns.len() == 6
            && sns
                .iter()
                .all(|s| s["state"] == "up" && s["free"].as_u64() > Some(1 << 30))
    });
    let mut objects = Vec::new();
    for (i, name) in ["ec/a", "ec/b", "ec/c", "r/a", "r/b"].iter().enumerate() {
        let data = pattern(1 << 20, 90 + i as u64);
        let src = dir.path().join(format!("src-{i}"));
        std::fs::write(&src, &data).unwrap();
        // The metadata node learns of the added nodes with its next
        // table refresh.
        wait_until("a Post placed", || {
            store.run(&["obj", "put", &p(&src), name]).status.success()
        });
        objects.push((name.to_string(), data));
    }
    // The node of ec/a's fragment 0, by its prefix, then its endpoint.
    let first = store.addresses_of("ec/a")[0].clone();
    let status = store.status();
    let endpoint = status["storage_nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| {
            let prefix = s["prefix"].as_str().unwrap().trim_end_matches("::/64");
            first.starts_with(&format!("{prefix}:"))
        })
        .expect("the node of fragment 0")["endpoint"]
        .as_str()
        .unwrap()
        .to_string();
    let stopped = nodes
        .iter()
        .find(|n| n.1.contains(&endpoint))
        .expect("fragment 0 on an added node");
    let pid = stopped.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    for (name, data) in &objects {
        get_within(&store, dir.path(), name, data, Duration::from_secs(30));
    }
    assert_eq!(
        store.status()["storage_nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["state"] == "up")
            .count(),
        6,
        "the stopped node must still be `up` in the table for this test to mean anything"
    );
    assert!(Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap()
        .success());
}

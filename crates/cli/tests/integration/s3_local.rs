//! The gateway of `strata store up` reads the replicas of its own
//! storage nodes from their files, not over loopback TCP
//! (`strata_store_client::client::local`), and `--s3-remote-reads`
//! turns that off.

use crate::common::store::{wait_until, Node, Store};
use crate::common::{p, pattern, tmp};
use crate::s3::{aws, aws_ok, endpoint, tenant};

/// Bytes RS3 sent for tenant `acme`'s Gets, summed over the nodes: what
/// storage nodes sent over TCP (a local read sends nothing).
fn acme_bytes_sent(store: &Store) -> u64 {
    let shown = store.json(&["store", "schedule"]);
    let nodes = shown["nodes"].as_array().expect("nodes").clone();
    nodes
        .iter()
        .map(|node| {
            node["rs3"]["class_stats"]["acme"]["bytes"]
                .as_u64()
                .unwrap_or(0)
        })
        .sum()
}

/// The gateway's `strata_s3_sendfile_bytes_total`: bytes it sent from
/// replica files with `sendfile`.
fn sendfile_bytes(s3: &str) -> u64 {
    gateway_metric(s3, "strata_s3_sendfile_bytes_total")
}

/// The value of the gateway's unlabelled metric `name`.
fn gateway_metric(s3: &str, name: &str) -> u64 {
    let scraped = crate::s3::scrape(s3.trim_start_matches("http://"));
    let sample = format!("{name} ");
    let line = scraped
        .lines()
        .find(|line| line.starts_with(&sample))
        .unwrap_or_else(|| panic!("no {sample} in /metrics:\n{scraped}"));
    line[sample.len()..].trim().parse().unwrap()
}

/// A GET of an object of 1 MiB or more pins its checked local replica:
/// the next GET sends it without reading it (a hit), exact. Rewritten in
/// place on the disk (its change time moves), the pinned replica is let
/// go and checked again, fails, and the other local replica is sent,
/// exact. With `--s3-pinned 0` nothing is pinned.
#[test]
fn a_checked_replica_is_pinned_until_its_file_changes() {
    for (budget, pins) in [(None, true), (Some("0"), false)] {
        let dir = tmp();
        let home = dir.path();
        let mut args = vec!["--sn", "2", "--replication", "1,1,2,2"];
        args.extend(budget.map(|b| ["--s3-pinned", b]).iter().flatten());
        let store = Store::up(&home.join("store"), &args);
        let keys = tenant(&store, "acme");
        let s3 = endpoint(&store);
        aws_ok(&s3, &keys, home, &["s3", "mb", "s3://acme"]);
        let data = pattern(3_000_000, 24);
        let file = home.join("data.bin");
        std::fs::write(&file, &data).unwrap();
        aws_ok(&s3, &keys, home, &["s3", "cp", &p(&file), "s3://acme/hot"]);
        let back = home.join("back.bin");
        for _ in 0..2 {
            aws_ok(&s3, &keys, home, &["s3", "cp", "s3://acme/hot", &p(&back)]);
            assert!(std::fs::read(&back).unwrap() == data, "{budget:?}: content");
        }
        let hits = if pins { 1 } else { 0 };
        let pinned_bytes = if pins { 3_000_000 } else { 0 };
        assert_eq!(gateway_metric(&s3, "strata_s3_pinned_hits_total"), hits);
        assert_eq!(gateway_metric(&s3, "strata_s3_pinned_bytes"), pinned_bytes);
        assert_eq!(
            sendfile_bytes(&s3),
            6_000_000,
            "{budget:?}: both sent whole"
        );

        damage_first_replica(&store, "acme/hot");
        aws_ok(&s3, &keys, home, &["s3", "cp", "s3://acme/hot", &p(&back)]);
        assert!(
            std::fs::read(&back).unwrap() == data,
            "{budget:?}: read around"
        );
        assert_eq!(
            gateway_metric(&s3, "strata_s3_pinned_hits_total"),
            hits,
            "{budget:?}: a changed replica was sent unread"
        );
        assert_eq!(gateway_metric(&s3, "strata_s3_pinned_bytes"), pinned_bytes);
    }
}

/// `strata store up` with two storage nodes in its own process (so two
/// local replicas of each object), tenant `acme`'s keys, the gateway's
/// endpoint, and bucket `acme` made.
fn two_local_replicas(home: &std::path::Path) -> (Store, crate::s3::Keys, String) {
    let store = Store::up(
        &home.join("store"),
        &["--sn", "2", "--replication", "1,1,2,2"],
    );
    let keys = tenant(&store, "acme");
    let s3 = endpoint(&store);
    aws_ok(&s3, &keys, home, &["s3", "mb", "s3://acme"]);
    (store, keys, s3)
}

/// A pinned replica is let go when its object goes: at once for a
/// DELETE through the gateway, and for an overwrite (whose old replicas
/// the store frees on its own) once the sweep sees the file unlinked.
/// The overwritten key then reads back its new bytes.
#[test]
fn pinned_replicas_are_let_go_when_their_objects_go() {
    let dir = tmp();
    let home = dir.path();
    let (_store, keys, s3) = two_local_replicas(home);
    let (old, new) = (pattern(2_000_000, 31), pattern(2_000_000, 32));
    let file = home.join("data.bin");
    std::fs::write(&file, &old).unwrap();
    let back = home.join("back.bin");
    for key in ["gone", "replaced"] {
        let url = format!("s3://acme/{key}");
        aws_ok(&s3, &keys, home, &["s3", "cp", &p(&file), &url]);
        aws_ok(&s3, &keys, home, &["s3", "cp", &url, &p(&back)]);
    }
    let pinned = || gateway_metric(&s3, "strata_s3_pinned_bytes");
    if pinned() == 0 && gateway_metric(&s3, "strata_s3_pinned_total") == 0 {
        // This process may not lock memory: nothing is ever pinned.
        return;
    }
    assert_eq!(pinned(), 4_000_000, "one replica of each pinned");

    aws_ok(&s3, &keys, home, &["s3", "rm", "s3://acme/gone"]);
    assert_eq!(
        pinned(),
        2_000_000,
        "the deleted object's pin outlived its DELETE"
    );

    std::fs::write(&file, &new).unwrap();
    aws_ok(
        &s3,
        &keys,
        home,
        &["s3", "cp", &p(&file), "s3://acme/replaced"],
    );
    wait_until("the overwritten replica's pin to go", || pinned() == 0);
    aws_ok(
        &s3,
        &keys,
        home,
        &["s3", "cp", "s3://acme/replaced", &p(&back)],
    );
    assert!(std::fs::read(&back).unwrap() == new, "the new bytes");
    assert_eq!(pinned(), 2_000_000, "the new replica is pinned in turn");
}

/// With RS3 on, every byte a node sends for a Get is counted in the
/// tenant's class. Through the gateway, an object reads back exact either
/// way, and the nodes sent none of it unless `--s3-remote-reads` is
/// given; otherwise the gateway sent it from the replica file with
/// `sendfile`, a whole GET, not a ranged one.
#[test]
fn the_gateway_reads_its_own_nodes_replicas_from_their_files() {
    let data = pattern(300_000, 21);
    for (extra, sent) in [(None, 0), (Some("--s3-remote-reads"), 300_000)] {
        let dir = tmp();
        let home = dir.path();
        let mut args = vec!["--rs3"];
        args.extend(extra);
        let store = Store::up(&home.join("store"), &args);
        let keys = tenant(&store, "acme");
        let s3 = endpoint(&store);
        let file = home.join("data.bin");
        std::fs::write(&file, &data).unwrap();
        aws_ok(&s3, &keys, home, &["s3", "mb", "s3://acme"]);
        aws_ok(&s3, &keys, home, &["s3", "cp", &p(&file), "s3://acme/d"]);
        let back = home.join("back.bin");
        aws_ok(&s3, &keys, home, &["s3", "cp", "s3://acme/d", &p(&back)]);
        assert!(std::fs::read(&back).unwrap() == data, "{extra:?}: content");
        assert_eq!(
            acme_bytes_sent(&store),
            sent,
            "{extra:?}: bytes sent by nodes"
        );
        assert_eq!(
            sendfile_bytes(&s3),
            300_000 - sent,
            "{extra:?}: bytes the gateway sent from replica files"
        );
        let part = home.join("part.bin");
        let get = ["s3api", "get-object", "--bucket", "acme", "--key", "d"];
        let range = ["--range", "bytes=1000-1999", &p(&part)];
        aws_ok(&s3, &keys, home, &[&get[..], &range[..]].concat());
        assert!(
            std::fs::read(&part).unwrap() == data[1000..2000],
            "{extra:?}: range"
        );
        assert_eq!(sendfile_bytes(&s3), 300_000 - sent, "{extra:?}: a range");
    }
}

/// A replica damaged on the local disk fails its checksum, is reported
/// at once and repaired. A whole GET checks the local replica before it
/// sends a byte, so it sends the other replica (here on the process's
/// second storage node) instead, exact;
/// a streamed read (`--s3-remote-reads`, whose gateway holds back only
/// its last piece until the checksum is known) may be cut short, but
/// never serves the bad byte whole.
#[test]
fn a_damaged_local_replica_is_read_around_and_repaired() {
    let dir = tmp();
    let home = dir.path();
    let (store, keys, s3) = two_local_replicas(home);
    for (key, size) in [("small", 50_000), ("large", 300_000)] {
        let data = pattern(size, 22);
        let file = home.join("data.bin");
        std::fs::write(&file, &data).unwrap();
        let url = format!("s3://acme/{key}");
        aws_ok(&s3, &keys, home, &["s3", "cp", &p(&file), &url]);
        let damaged = damage_first_replica(&store, &format!("acme/{key}"));
        let back = home.join("back.bin");
        aws_ok(&s3, &keys, home, &["s3", "cp", &url, &p(&back)]);
        assert!(std::fs::read(&back).unwrap() == data, "{key}: read around");
        // Reported, then repaired: the record names a good replica in
        // place of the damaged one.
        wait_until("the damaged replica replaced", || {
            let now = store.json(&["obj", "stat", &format!("acme/{key}")]);
            now["replicas"].as_array().is_some_and(|r| {
                r.len() == 2 && r.iter().all(|a| a.as_str() != Some(damaged.as_str()))
            })
        });
        aws_ok(&s3, &keys, home, &["s3", "cp", &url, &p(&back)]);
        assert!(std::fs::read(&back).unwrap() == data, "{key}: after repair");
    }
}

/// Flips a data byte of the first replica the record of `name` lists
/// (the one the gateway reads first); its address.
fn damage_first_replica(store: &Store, name: &str) -> String {
    let record = store.json(&["obj", "stat", name]);
    let first = record["replicas"][0].as_str().unwrap().to_string();
    let replica =
        local_replica_file(store, &first).unwrap_or_else(|| panic!("no replica file for {first}"));
    damage(&replica, 7);
    first
}

/// The file of the replica at `addr` (as a record lists it), if one of
/// the storage nodes of `strata store up`'s own process holds it.
fn local_replica_file(store: &Store, addr: &str) -> Option<std::path::PathBuf> {
    let addr: std::net::Ipv6Addr = addr.parse().unwrap();
    let file_name = format!("{:032x}", u128::from(addr));
    store.replica_files().into_iter().find(|f| {
        f.file_name()
            .is_some_and(|n| n.to_string_lossy() == file_name)
    })
}

/// Flips a data byte of a replica file, `from_end` bytes before the end
/// of its data (the chunk table follows the data).
fn damage(replica: &std::path::Path, from_end: usize) {
    let mut bytes = std::fs::read(replica).unwrap();
    let size = u64::from_be_bytes(bytes[8..16].try_into().unwrap()) as usize;
    bytes[20 + size - from_end] ^= 0x40;
    std::fs::write(replica, &bytes).unwrap();
}

/// One replica on the process's own storage node, the other on a node
/// of another process: with the local one damaged near its end, a GET
/// of an object of several MiB reads each chunk checked from the other,
/// and answers it exact (a whole read would try the damaged replica
/// first, and could fail after its first pieces had gone out); the
/// damaged replica is reported and replaced.
#[test]
fn a_damaged_only_local_replica_is_read_around_chunk_by_chunk() {
    let dir = tmp();
    let home = dir.path();
    let store = Store::up(&home.join("store"), &["--replication", "1,1,2,2"]);
    let _other = Node::add(&store, &home.join("sn-other"), "sn");
    let keys = tenant(&store, "acme");
    let s3 = endpoint(&store);
    // The bucket's two replicas need the new node's free space known.
    wait_until("a bucket of two replicas made", || {
        aws(&s3, &keys, home, &["s3", "mb", "s3://acme"])
            .status
            .success()
    });
    let data = pattern(6_000_000, 23);
    let file = home.join("data.bin");
    std::fs::write(&file, &data).unwrap();
    aws_ok(&s3, &keys, home, &["s3", "cp", &p(&file), "s3://acme/big"]);
    let record = store.json(&["obj", "stat", "acme/big"]);
    let replicas: Vec<String> = record["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    let local: Vec<_> = replicas
        .iter()
        .filter_map(|r| local_replica_file(&store, r).map(|f| (r.clone(), f)))
        .collect();
    assert_eq!(local.len(), 1, "one local replica of {replicas:?}");
    let (damaged, replica) = &local[0];
    damage(replica, 1000);

    let back = home.join("back.bin");
    aws_ok(&s3, &keys, home, &["s3", "cp", "s3://acme/big", &p(&back)]);
    assert!(std::fs::read(&back).unwrap() == data, "read around");
    // In one GET: a cut-short answer makes aws-cli ask again (and the
    // repaired replica may be local by then).
    let scraped = crate::s3::scrape(s3.trim_start_matches("http://"));
    let gets = "strata_s3_requests_total{operation=\"GetObject\",status=\"200\"} ";
    assert!(
        scraped.lines().any(|line| line == format!("{gets}1")),
        "not one GET: {:?}",
        scraped
            .lines()
            .filter(|l| l.contains("GetObject"))
            .collect::<Vec<_>>()
    );
    assert_eq!(sendfile_bytes(&s3), 0, "the damaged replica was sent");
    wait_until("the damaged replica replaced", || {
        let now = store.json(&["obj", "stat", "acme/big"]);
        now["replicas"]
            .as_array()
            .is_some_and(|r| r.len() == 2 && r.iter().all(|a| a.as_str() != Some(damaged.as_str())))
    });
}

/// On a connection that hyper serves (it carried a PUT first), a whole
/// GET of a local replica cannot use `sendfile`: the same checked bytes
/// come from the response's own body, read from the file, exact, and
/// the `sendfile` counter does not move. boto3 keeps one connection.
#[test]
fn a_get_after_a_put_on_one_connection_reads_the_replica_through_its_body() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &[]);
    let keys = tenant(&store, "acme");
    let s3 = endpoint(&store);
    let script = r#"
import sys, hashlib, boto3
from botocore.config import Config
endpoint, access, secret = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access,
                  aws_secret_access_key=secret, region_name="us-east-1",
                  config=Config(max_pool_connections=1, retries={"max_attempts": 1}))
s3.create_bucket(Bucket="acme")
data = bytes(i * 7 % 251 for i in range(700_000))
s3.put_object(Bucket="acme", Key="k", Body=data)
back = s3.get_object(Bucket="acme", Key="k")["Body"].read()
assert back == data, (len(back), hashlib.md5(back).hexdigest())
print("read back", len(back))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, &s3, &keys.access, &keys.secret])
        .output()
        .expect("run python3 (apt-get install python3-boto3)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("read back 700000"), "{text}");
    assert_eq!(sendfile_bytes(&s3), 0, "the GET went through hyper's body");
    // A new connection's GET of the same object goes through sendfile.
    let home = dir.path();
    let back = home.join("back.bin");
    aws_ok(&s3, &keys, home, &["s3", "cp", "s3://acme/k", &p(&back)]);
    assert_eq!(std::fs::read(&back).unwrap().len(), 700_000);
    assert_eq!(sendfile_bytes(&s3), 700_000);
}

/// The gateway of `strata store up` asks its own metadata nodes for an
/// object's record by a direct call, not a datagram, once the record is
/// in the node's read cache (the first GET fills it by datagram): GETs
/// and HEADs read back exact, a missing key is NoSuchKey, another tenant
/// is refused as by datagram (the node's gate runs the same checks), and
/// 40 objects fetched by parallel GETs come back exact whether each call
/// went direct or by datagram. `--s3-remote-reads` turns the direct
/// calls off: no counter is shown.
#[test]
fn the_gateway_asks_its_own_metadata_nodes_by_direct_call() {
    let direct = |s3: &str| gateway_metric(s3, "strata_s3_metadata_direct_total");
    let declined = |s3: &str| gateway_metric(s3, "strata_s3_metadata_direct_declined_total");
    let dir = tmp();
    let home = dir.path();
    let store = Store::up(&home.join("store"), &["--mn", "2"]);
    let (acme, globex) = (tenant(&store, "acme"), tenant(&store, "globex"));
    let s3 = endpoint(&store);
    aws_ok(&s3, &acme, home, &["s3", "mb", "s3://acme"]);
    let data = pattern(200_000, 31);
    let file = home.join("data.bin");
    std::fs::write(&file, &data).unwrap();
    aws_ok(&s3, &acme, home, &["s3", "cp", &p(&file), "s3://acme/d"]);
    let before = direct(&s3);
    let back = home.join("back.bin");
    for _ in 0..5 {
        aws_ok(&s3, &acme, home, &["s3", "cp", "s3://acme/d", &p(&back)]);
        assert!(std::fs::read(&back).unwrap() == data, "content");
    }
    let head = ["s3api", "head-object", "--bucket", "acme", "--key", "d"];
    assert!(aws_ok(&s3, &acme, home, &head).contains("\"ContentLength\": 200000"));
    let answered = direct(&s3) - before;
    assert!(
        answered >= 3,
        "only {answered} of 6 lookups went by direct call ({} declined)",
        declined(&s3)
    );

    let missing = [
        "s3api",
        "head-object",
        "--bucket",
        "acme",
        "--key",
        "nothing",
    ];
    let out = aws(&s3, &acme, home, &missing);
    assert!(!out.status.success());
    assert!(
        crate::common::output_text(&out).contains("404"),
        "missing key"
    );
    let get = ["s3api", "get-object", "--bucket", "acme", "--key", "d"];
    let stolen = home.join("stolen.bin");
    let out = aws(
        &s3,
        &globex,
        home,
        &[&get[..], &[p(&stolen).as_str()]].concat(),
    );
    let text = crate::common::output_text(&out);
    assert!(!out.status.success(), "another tenant read acme's object");
    assert!(text.contains("AccessDenied"), "{text}");
    assert!(!stolen.exists() || std::fs::read(&stolen).unwrap().is_empty());

    // Parallel lookups race for the two nodes: each goes direct or by
    // datagram, and every object comes back exact.
    let tree = home.join("tree");
    std::fs::create_dir(&tree).unwrap();
    for i in 0..40 {
        std::fs::write(
            tree.join(format!("f{i}")),
            pattern(10_000 + i * 777, i as u64),
        )
        .unwrap();
    }
    aws_ok(
        &s3,
        &acme,
        home,
        &["s3", "sync", &p(&tree), "s3://acme/tree"],
    );
    let (direct_before, declined_before) = (direct(&s3), declined(&s3));
    let copy = home.join("copy");
    aws_ok(
        &s3,
        &acme,
        home,
        &["s3", "sync", "s3://acme/tree", &p(&copy)],
    );
    for i in 0..40 {
        let name = format!("f{i}");
        assert!(
            std::fs::read(copy.join(&name)).unwrap() == std::fs::read(tree.join(&name)).unwrap(),
            "{name}"
        );
    }
    let lookups = direct(&s3) - direct_before + declined(&s3) - declined_before;
    assert!(lookups >= 40, "only {lookups} lookups counted for 40 GETs");

    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &["--s3-remote-reads"]);
    let s3 = endpoint(&store);
    let scraped = crate::s3::scrape(s3.trim_start_matches("http://"));
    assert!(!scraped.contains("strata_s3_metadata_direct"), "{scraped}");
}

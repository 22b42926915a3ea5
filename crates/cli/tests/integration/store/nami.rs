//! NAMI's replica choice on real processes: a store of 3 storage nodes
//! with replication 3 runs in a network namespace of its own, where the
//! replies of one storage node are shaped to 20 Mbit/s on the
//! namespace's loopback (`tc` htb, matched on the node's port); the
//! other nodes' are not. `strata store bench` reads the same objects
//! with each replica choice and reports the reads each node took: with
//! NAMI the slow node takes clearly fewer than with uniform choice, and
//! with primary one object's reads all go to its first replica, as
//! before NAMI.
//!
//! Needs root and iproute2 (`ip netns`, `tc`); CI runs as root.

use super::*;
use crate::common::run_ok;

/// A namespace with its loopback up, deleted on drop.
struct Namespace(String);

impl Namespace {
    fn new() -> Namespace {
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("nami{}x{made}", std::process::id() % 100_000);
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run_ok("ip", &["netns", "add", &name]);
        run_ok("ip", &["-n", &name, "link", "set", "lo", "up"]);
        Namespace(name)
    }

    /// Shapes what leaves TCP/UDP port `port` on the loopback to 20
    /// Mbit/s (everything else passes at loopback speed).
    fn slow_port(&self, port: u16) {
        let ns = self.0.as_str();
        let port = port.to_string();
        for args in [
            vec![
                "-n", ns, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default",
                "10",
            ],
            vec![
                "-n", ns, "class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb",
                "rate", "40gbit",
            ],
            vec![
                "-n", ns, "class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb",
                "rate", "20mbit", "ceil", "20mbit", "burst", "64kb",
            ],
            vec![
                "-n", ns, "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio",
                "1", "u32", "match", "ip", "sport", &port, "0xffff", "flowid", "1:20",
            ],
        ] {
            run_ok("tc", &args);
        }
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// A store of 3 metadata and 3 storage nodes, replication 3, in a
/// network namespace of its own (its directory held by the `TempDir`).
fn store_in_namespace() -> (Namespace, tempfile::TempDir, Store) {
    let ns = Namespace::new();
    let dir = tmp();
    let flags = ["--mn", "3", "--sn", "3", "--replication", "3,2,3,2"];
    let store = Store::up_on(
        &dir.path().join("cluster"),
        "127.0.0.1:0",
        Some(&ns.0),
        &flags,
    );
    (ns, dir, store)
}

/// `strata ARGS --output json` against `store`, run in `ns`; its JSON.
fn json_in(ns: &Namespace, store: &Store, args: &[&str]) -> serde_json::Value {
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.0, env!("CARGO_BIN_EXE_strata")])
        .args(args)
        .args(["--output", "json", "--cluster", &store.on.to_string()])
        .env("STRATA_CLUSTER_KEY", store.key_path())
        .env(CREDENTIAL_ENV, store.dir.join(ADMIN_CREDENTIAL_FILE))
        .output()
        .expect("ip netns exec strata");
    assert!(
        out.status.success(),
        "strata {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

/// Reads each storage node took in a bench report, by node id.
fn reads_by_node(report: &serde_json::Value) -> Vec<(String, u64)> {
    report["client"]["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("no client view in {report}"))
        .iter()
        .map(|n| {
            (
                n["id"].as_str().unwrap().to_string(),
                n["reads"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The fraction of a report's reads that went to node `id`.
fn share_of(report: &serde_json::Value, id: &str) -> f64 {
    let reads = reads_by_node(report);
    let total: u64 = reads.iter().map(|(_, r)| r).sum();
    let mine = reads.iter().find(|(n, _)| n == id).map_or(0, |(_, r)| *r);
    mine as f64 / total.max(1) as f64
}

#[test]
fn nami_reads_less_from_a_slow_node_than_uniform_and_primary_keeps_the_order() {
    let (ns, _dir, store) = store_in_namespace();
    let status = json_in(&ns, &store, &["store", "status"]);
    let slow = &status["storage_nodes"][0];
    let slow_id = slow["id"].as_str().unwrap().to_string();
    let slow_port: u16 = slow["endpoint"]
        .as_str()
        .unwrap()
        .parse::<SocketAddr>()
        .unwrap()
        .port();
    let load = ["--threads", "4", "--ops", "25", "--size", "64k"];
    let made = json_in(
        &ns,
        &store,
        &[&["store", "bench", "--workload", "post"][..], &load].concat(),
    );
    assert_eq!(made["errors"], 0, "{made}");
    ns.slow_port(slow_port);

    let read = |choice: &str, extra: &[&str]| {
        let report = json_in(
            &ns,
            &store,
            &[
                &[
                    "store",
                    "bench",
                    "--workload",
                    "get",
                    "--replica-choice",
                    choice,
                ][..],
                extra,
            ]
            .concat(),
        );
        assert_eq!(report["errors"], 0, "{report}");
        assert_eq!(report["client"]["replica_choice"], choice, "{report}");
        report
    };
    let reads = [&load[..], &["--passes", "6"]].concat();
    let nami = read("nami", &reads);
    let uniform = read("uniform", &reads);
    let (nami_share, uniform_share) = (share_of(&nami, &slow_id), share_of(&uniform, &slow_id));
    eprintln!(
        "slow node's share of 600 Gets: nami {nami_share:.3}, uniform {uniform_share:.3}; \
         nami {:.0} ops/s, uniform {:.0} ops/s",
        nami["ops_per_s"].as_f64().unwrap(),
        uniform["ops_per_s"].as_f64().unwrap()
    );
    // Expected: nami 1/5 (the fast nodes tie: weights 2, 2, 1; a little
    // more while the first estimates come in), uniform 1/3; each is 300
    // draws, a standard deviation under 0.03, so the difference of 0.13
    // is about four of them, and the margins below near three.
    assert!(uniform_share > 0.24, "uniform: {uniform}");
    assert!(nami_share < 0.28, "nami: {nami}");
    assert!(
        nami_share < uniform_share - 0.04,
        "nami: {nami}\nuniform: {uniform}"
    );
    // Each fast node took more reads than the slow one.
    let slow_reads = (share_of(&nami, &slow_id) * 600.0).round() as u64;
    for (id, reads) in reads_by_node(&nami) {
        assert!(id == slow_id || reads > slow_reads, "{nami}");
    }

    // Primary: one object read 40 times, every read from its first replica.
    let one = [
        "--threads",
        "1",
        "--ops",
        "1",
        "--size",
        "64k",
        "--passes",
        "40",
    ];
    let primary = read("primary", &one);
    let mut counts: Vec<u64> = reads_by_node(&primary).iter().map(|(_, r)| *r).collect();
    counts.sort_unstable();
    assert_eq!(counts.last(), Some(&40), "{primary}");
    assert_eq!(counts.iter().sum::<u64>(), 40, "{primary}");

    // The client's view on its own: every node probed, shares summing to 1.
    let view = json_in(
        &ns,
        &store,
        &["store", "status", "--client", "--probes", "3"],
    );
    let nodes = view["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 3, "{view}");
    assert!(
        nodes
            .iter()
            .all(|n| n["probes"] == 3 && n["latency_ms"].is_f64()),
        "{view}"
    );
    let shares: f64 = nodes.iter().map(|n| n["share"].as_f64().unwrap()).sum();
    assert!((shares - 1.0).abs() < 1e-6, "{view}");
}

/// Runs `work` on a thread of its own that has entered the network
/// namespace `ns` (`setns`): the sockets it opens live there.
fn in_namespace<T: Send + 'static>(ns: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    use std::os::fd::AsRawFd;
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let handle = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // SAFETY: a namespace descriptor we hold open; this thread alone moves.
        let entered = unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(
            entered,
            0,
            "setns {path}: {}",
            std::io::Error::last_os_error()
        );
        work()
    })
    .join()
    .expect("the thread in the namespace")
}

/// One client's reads of `names` in turn, `count` of them: the reads the
/// node at `port` took among them, as the client's own view counts them.
async fn reads_from(
    client: &strata_store_client::client::Client,
    names: &[String],
    count: usize,
    port: u16,
) -> (u64, u64) {
    let taken = |client: &strata_store_client::client::Client| {
        let view = client.replica_view();
        let all: u64 = view.iter().map(|n| n.reads).sum();
        let slow: u64 = view
            .iter()
            .filter(|n| n.endpoint.port() == port)
            .map(|n| n.reads)
            .sum();
        (slow, all)
    };
    let (slow_before, all_before) = taken(client);
    for i in 0..count {
        let name = &names[i % names.len()];
        client
            .get_bytes(name)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let (slow_after, all_after) = taken(client);
    (slow_after - slow_before, all_after - all_before)
}

/// One client, reading on: while a node is slow it takes a small share
/// of the reads, and once the slowdown is removed, its estimate comes
/// back down and it takes its share again (the "shift back").
#[test]
fn nami_shifts_reads_back_to_a_node_once_it_recovers() {
    let (ns, _dir, store) = store_in_namespace();
    let status = json_in(&ns, &store, &["store", "status"]);
    let slow_port: u16 = status["storage_nodes"][0]["endpoint"]
        .as_str()
        .unwrap()
        .parse::<SocketAddr>()
        .unwrap()
        .port();
    let made = json_in(
        &ns,
        &store,
        &[
            "store",
            "bench",
            "--workload",
            "post",
            "--threads",
            "2",
            "--ops",
            "20",
            "--size",
            "64k",
        ],
    );
    assert_eq!(made["errors"], 0, "{made}");
    let names: Vec<String> = (0..2)
        .flat_map(|t| (0..20).map(move |i| strata_store::bench::object_name("bench", 65_536, t, i)))
        .collect();
    ns.slow_port(slow_port);
    let (on, credential, name) = (store.on, admin(store.on), ns.0.clone());
    let (slow, recovered) = in_namespace(&ns.0, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let client = strata_store_client::client::Client::connect(on, credential)
                .await
                .unwrap();
            let slow = reads_from(&client, &names, 300, slow_port).await;
            run_ok("tc", &["-n", &name, "qdisc", "del", "dev", "lo", "root"]);
            // Reads while its estimate comes back down are not counted:
            // on a loaded machine they can take a few hundred reads, and
            // the shift back is judged on the share it settles at.
            reads_from(&client, &names, 300, slow_port).await;
            let recovered = reads_from(&client, &names, 600, slow_port).await;
            (slow, recovered)
        })
    });
    let share = |(mine, all): (u64, u64)| mine as f64 / all.max(1) as f64;
    let (while_slow, after) = (share(slow), share(recovered));
    eprintln!("the node's share of reads: {while_slow:.3} while slow, {after:.3} after");
    // Expected: 1/5 while slow (weights 2, 2, 1), then 1/3 once its
    // estimate ties with the others' (a dozen samples, at one in five).
    assert!(while_slow < 0.28, "{slow:?}");
    assert!(
        after > 0.24 && after > while_slow + 0.06,
        "{slow:?} then {recovered:?}"
    );
}

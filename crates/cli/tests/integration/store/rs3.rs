//! RS3 on a real storage node whose link is the bottleneck: the store
//! runs in a network namespace whose veth sends at 500 Mbit/s (`tc
//! tbf`), the clients outside it. One tenant streams 64 MB Gets while
//! another issues 4 KiB Gets; with RS3 on, the small Gets' median latency
//! is lower than with it off, on the same data and load.
//!
//! Needs root and iproute2 (`ip netns`, `tc`); CI runs as root.

use super::*;

/// `strata store bench` as `credential`'s tenant; its JSON report.
fn bench(store: &Store, credential: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["store", "bench", "--output", "json"];
    all.extend_from_slice(args);
    let cred = p(credential);
    all.extend_from_slice(&["--credential", &cred]);
    let out = store.run(&all);
    assert!(
        out.status.success(),
        "store bench {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

/// Two namespaces: the node's, and a router between it and this one
/// whose link towards this one sends at 500 Mbit/s with an 8 MB queue
/// (`tc tbf`), as a switch port would. The queue is in a router, not at
/// the node: the node's own TCP stack does not bound it (TCP small
/// queues only bound a sender's local queue). Deleted on drop.
struct ShapedLink {
    node: String,
    router: String,
}

impl ShapedLink {
    /// The node's address.
    const NODE: &'static str = "10.251.77.1";

    fn new() -> ShapedLink {
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("rs3{}x{made}", std::process::id() % 100_000);
        let link = ShapedLink {
            node: format!("{tag}n"),
            router: format!("{tag}r"),
        };
        link.remove();
        let (node, router) = (link.node.as_str(), link.router.as_str());
        let (a_node, a_router) = (format!("{tag}a"), format!("{tag}b"));
        let (b_router, b_host) = (format!("{tag}c"), format!("{tag}d"));
        for args in [
            vec!["netns", "add", node],
            vec!["netns", "add", router],
            vec![
                "link", "add", &a_node, "type", "veth", "peer", "name", &a_router,
            ],
            vec!["link", "set", &a_node, "netns", node],
            vec!["link", "set", &a_router, "netns", router],
            vec![
                "link", "add", &b_host, "type", "veth", "peer", "name", &b_router,
            ],
            vec!["link", "set", &b_router, "netns", router],
            vec!["-n", node, "addr", "add", "10.251.77.1/30", "dev", &a_node],
            vec![
                "-n",
                router,
                "addr",
                "add",
                "10.251.77.2/30",
                "dev",
                &a_router,
            ],
            vec![
                "-n",
                router,
                "addr",
                "add",
                "10.251.78.1/30",
                "dev",
                &b_router,
            ],
            vec!["addr", "add", "10.251.78.2/30", "dev", &b_host],
            vec!["-n", node, "link", "set", &a_node, "up"],
            vec!["-n", node, "link", "set", "lo", "up"],
            vec!["-n", router, "link", "set", &a_router, "up"],
            vec!["-n", router, "link", "set", &b_router, "up"],
            vec!["link", "set", &b_host, "up"],
            vec!["-n", node, "route", "add", "default", "via", "10.251.77.2"],
            vec!["route", "add", "10.251.77.0/30", "via", "10.251.78.1"],
        ] {
            run_ok("ip", &args);
        }
        run_ok(
            "ip",
            &[
                "netns",
                "exec",
                router,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ],
        );
        run_ok(
            "tc",
            &[
                "-n", router, "qdisc", "add", "dev", &b_router, "root", "tbf", "rate", "500mbit",
                "burst", "256kb", "limit", "8mb",
            ],
        );
        link
    }

    fn remove(&self) {
        for name in [&self.node, &self.router] {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
        let _ = Command::new("ip")
            .args(["route", "del", "10.251.77.0/30"])
            .output();
        // The host's end goes with the router's, unless a process still
        // holds that namespace: remove it by name too.
        let host_end = format!("{}d", self.router.trim_end_matches('r'));
        let _ = Command::new("ip").args(["link", "del", &host_end]).output();
    }
}

impl Drop for ShapedLink {
    fn drop(&mut self) {
        self.remove();
    }
}

fn run_ok(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().expect(program);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The median latency (ms) of 4 KiB Gets by tenant `small` while tenant
/// `bulk` streams 64 MB Gets, on a one-node store started with `flags`
/// behind the shaped link.
fn small_median_under_streams(flags: &[&str]) -> f64 {
    let link = ShapedLink::new();
    let dir = tmp();
    let d = dir.path().join("cluster");
    let listen = format!("{}:0", ShapedLink::NODE);
    let store = Store::up_on(&d, &listen, Some(&link.node), flags);
    let dp = p(&d);
    let credential = |tenant: &str| {
        strata_ok(&["store", "tenant", "add", "--dir", &dp, "--tenant", tenant]);
        d.join(format!("{tenant}.credential"))
    };
    let (bulk, small) = (credential("bulk"), credential("small"));
    let streams = [
        "--threads",
        "4",
        "--ops",
        "1",
        "--size",
        "64M",
        "--prefix",
        "bulk/b",
    ];
    bench(
        &store,
        &bulk,
        &[&["--workload", "post"][..], &streams].concat(),
    );
    let reads = [
        "--threads",
        "8",
        "--ops",
        "4",
        "--size",
        "4096",
        "--prefix",
        "small/s",
    ];
    bench(
        &store,
        &small,
        &[&["--workload", "post"][..], &reads].concat(),
    );
    // The streams run all along the small reads.
    let mut streaming = store.command(
        &[
            &["store", "bench", "--output", "json", "--workload", "get"][..],
            &["--passes", "4", "--credential", &p(&bulk)],
            &streams,
        ]
        .concat(),
    );
    // Past their slow start: the router's queue holds their bytes.
    std::thread::sleep(Duration::from_millis(2500));
    let report = bench(
        &store,
        &small,
        &[&["--workload", "get", "--passes", "20"][..], &reads].concat(),
    );
    let still_streaming = streaming.try_wait().unwrap().is_none();
    let _ = streaming.kill();
    let _ = streaming.wait();
    assert!(
        still_streaming,
        "the streams ended before the small reads did"
    );
    assert_eq!(report["errors"], 0, "{report}");
    report["p50_ms"].as_f64().expect("a median")
}

#[test]
fn with_rs3_small_gets_pass_big_streams() {
    let without = small_median_under_streams(&[]);
    let with = small_median_under_streams(&["--rs3", "--rs3-batch", "128K"]);
    eprintln!(
        "4 KiB Get median under 4 streams of 64 MB: {without:.2} ms without RS3, {with:.2} ms with"
    );
    assert!(
        with < without,
        "RS3 did not lower the small Gets' median: {with:.2} ms with it, {without:.2} ms without"
    );
}

/// `GET http://at/metrics`'s body.
pub(super) fn metrics(at: &str) -> String {
    ureq::get(&format!("http://{at}/metrics"))
        .call()
        .expect("GET /metrics")
        .into_string()
        .expect("a text body")
}

/// The value of the first sample of `metric` with `labels` in `text`.
fn sample(text: &str, metric: &str, labels: &str) -> Option<f64> {
    let start = format!("{metric}{{{labels}");
    text.lines()
        .find(|line| line.starts_with(&start))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
}

/// `strata store schedule` turns RS3 on at run time, sets weights and
/// classes, and refuses bad settings with the reason; `/metrics` shows
/// the scrub's progress and RS3's bytes per class; a Schedule request
/// without the cluster key's seal changes nothing; the settings outlive
/// a restart.
#[test]
fn rs3_is_set_at_run_time_and_shown_on_metrics() {
    let dir = tmp();
    let d = dir.path().join("cluster");
    let store = Store::up(
        &d,
        &[
            "--metrics",
            "127.0.0.1:0",
            "--scrub-rate",
            "64M",
            "--scrub-pause-ms",
            "200",
        ],
    );
    let at = store
        .line()
        .split("metrics on http://")
        .nth(1)
        .expect("the metrics endpoint on the readiness line");
    // The S3 gateway's endpoint follows it on the line.
    let at = at.split([',', ' ']).next().unwrap_or_default();
    let at = at.trim_end_matches("/metrics").to_string();
    let dp = p(&d);
    strata_ok(&["store", "tenant", "add", "--dir", &dp, "--tenant", "acme"]);
    let acme = p(&d.join("acme.credential"));
    let src = dir.path().join("src");
    std::fs::write(&src, pattern(300_000, 2)).unwrap();
    store.ok(&["obj", "put", "--credential", &acme, &p(&src), "acme/a"]);

    let before = store.json(&["store", "schedule"]);
    assert_eq!(before["nodes"][0]["rs3"]["enabled"], false, "{before}");
    let set = store.json(&[
        "store", "schedule", "--rs3", "on", "--batch", "128K", "--weight", "acme=3", "--class",
        "bee=acme",
    ]);
    let rs3 = &set["nodes"][0]["rs3"];
    assert_eq!(rs3["enabled"], true, "{set}");
    assert_eq!(rs3["batch"], 131072, "{set}");
    assert_eq!(rs3["weights"]["acme"], 3, "{set}");
    assert_eq!(rs3["tenant_classes"]["bee"], "acme", "{set}");
    let bad = store.fails(&["store", "schedule", "--batch", "1K"]);
    assert!(bad.contains("out of bounds"), "{bad}");
    let bad = store.fails(&["store", "schedule", "--weight", "acme=0"]);
    assert!(bad.contains("out of bounds"), "{bad}");

    // Gets now go through RS3, in acme's class, and come back whole.
    let back = dir.path().join("back");
    for _ in 0..3 {
        store.ok(&["obj", "get", "--credential", &acme, "acme/a", &p(&back)]);
        assert!(std::fs::read(&back).unwrap() == pattern(300_000, 2));
    }
    let shown = store.json(&["store", "schedule"]);
    let acme_bytes = &shown["nodes"][0]["rs3"]["class_stats"]["acme"]["bytes"];
    assert_eq!(acme_bytes, 900_000, "{shown}");
    // The first pass may have ended before the Post: wait for one that saw it.
    wait_until("a scrub pass over the replica on /metrics", || {
        sample(&metrics(&at), "strata_scrub_replicas_total", "node=").is_some_and(|n| n >= 1.0)
    });
    let text = metrics(&at);
    assert_eq!(
        sample(&text, "strata_rs3_enabled", "node="),
        Some(1.0),
        "{text}"
    );
    let class_bytes = sample(&text, "strata_rs3_class_bytes_total", "node=");
    assert_eq!(class_bytes, Some(900_000.0), "{text}");
    assert!(
        sample(&text, "strata_scrub_replicas_total", "node=").is_some_and(|n| n >= 1.0),
        "{text}"
    );

    // Unsealed, the request is refused and changes nothing.
    let sn = first_endpoint(&store, "storage");
    let status = store.status();
    let prefix = status["storage_nodes"][0]["prefix"].as_str().unwrap();
    let addr = u128::from(
        prefix
            .trim_end_matches("/64")
            .parse::<std::net::Ipv6Addr>()
            .unwrap(),
    ) + 1;
    let request = Request::Schedule {
        addr,
        settings: "rs3=off\n".into(),
    };
    let reply = tcp_exchange(sn, &request.encode(Credential::None));
    assert_eq!(reply.first(), Some(&1), "an unsealed Schedule was taken");
    assert!(String::from_utf8_lossy(&reply).contains("not sealed"));
    let after = store.json(&["store", "schedule"]);
    assert_eq!(after["nodes"][0]["rs3"]["enabled"], true, "{after}");

    // The settings outlive a restart on the start flags (RS3 off), and
    // the object still reads back through RS3.
    let mut store = store;
    store.stop();
    let store = Store::up(&d, &[]);
    store.wait_for_nodes("storage", 1);
    let kept = store.json(&["store", "schedule"]);
    let rs3 = &kept["nodes"][0]["rs3"];
    assert_eq!(rs3["enabled"], true, "{kept}");
    assert_eq!(rs3["batch"], 131072, "{kept}");
    assert_eq!(rs3["weights"]["acme"], 3, "{kept}");
    assert_eq!(rs3["tenant_classes"]["bee"], "acme", "{kept}");
    store.ok(&["obj", "get", "--credential", &acme, "acme/a", &p(&back)]);
    assert!(std::fs::read(&back).unwrap() == pattern(300_000, 2));
    let shown = store.json(&["store", "schedule"]);
    let acme_bytes = &shown["nodes"][0]["rs3"]["class_stats"]["acme"]["bytes"];
    assert_eq!(acme_bytes, 300_000, "{shown}");
}

//! F3 with its nodes in network namespaces, as `bench/f3_bench.py` runs
//! it: three nodes `a`, `b` and `c`, each a namespace joined to a bridge
//! in the root namespace by a veth pair shaped with `tc tbf` in both
//! directions. The object store and the F3 service listen on the
//! bridge's address; each agent runs in its node's namespace (entered
//! with `nsenter --net`, so that its FUSE mount stays visible here) and
//! serves transfers on its own address, so every remote read crosses two
//! links. Namespaces, links, the bridge, mounts and processes go when a
//! test ends, even by panic.
//!
//! Needs root, iproute2 (`ip`, `tc`) and nsenter; CI runs as root.

use crate::common::store::{wait_until, wait_until_long};
use crate::common::{p, pattern, run_ok};
use crate::f3::{agent_metric, names, set_xattr, spawn_reader, xattr, F3, LEASE_MS};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The nodes, in the order of their agents in [`F3`].
const NODES: [&str; 3] = ["a", "b", "c"];

/// Each link's rate, both ways.
const RATE: &str = "400mbit";

/// Namespaces on a bridge: deleted (with their links and the bridge) on
/// drop.
struct Net {
    /// The prefix of every name made here (unique in this host).
    tag: String,
    /// The first three bytes of the private /24 (`10.X.Y`).
    subnet: String,
    /// What exists so far, so that a failed setup is cleaned up too.
    bridge: Option<String>,
    namespaces: Vec<String>,
}

impl Net {
    /// A bridge at `SUBNET.1` and one namespace per node at `SUBNET.11`,
    /// `.12`, ..., each on a veth pair shaped to [`RATE`].
    fn new() -> Net {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(root, "these tests need root (network namespaces, tc, FUSE)");
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let mut net = Net {
            tag: format!("f3n{}x{made}", pid % 100_000),
            // Away from the bench's 10.77.0.0/24; another test process
            // collides only with the same pid modulo 150.
            subnet: format!("10.{}.{}", 100 + pid % 150, 1 + made % 250),
            bridge: None,
            namespaces: Vec::new(),
        };
        let bridge = format!("{}br", net.tag);
        let _ = Command::new("ip").args(["link", "del", &bridge]).output();
        run_ok("ip", &["link", "add", &bridge, "type", "bridge"]);
        net.bridge = Some(bridge.clone());
        run_ok(
            "ip",
            &["addr", "add", &format!("{}/24", net.host()), "dev", &bridge],
        );
        run_ok("ip", &["link", "set", &bridge, "up"]);
        for index in 0..NODES.len() {
            net.add_node(index, &bridge);
        }
        net
    }

    fn add_node(&mut self, index: usize, bridge: &str) {
        let (namespace, veth) = (self.namespace(index), self.veth(index));
        let _ = Command::new("ip")
            .args(["netns", "del", &namespace])
            .output();
        run_ok("ip", &["netns", "add", &namespace]);
        self.namespaces.push(namespace.clone());
        run_ok(
            "ip",
            &[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &namespace,
            ],
        );
        let address = format!("{}/24", self.address(index));
        run_ok(
            "ip",
            &["-n", &namespace, "addr", "add", &address, "dev", "eth0"],
        );
        run_ok("ip", &["-n", &namespace, "link", "set", "eth0", "up"]);
        run_ok("ip", &["-n", &namespace, "link", "set", "lo", "up"]);
        run_ok("ip", &["link", "set", &veth, "master", bridge]);
        run_ok("ip", &["link", "set", &veth, "up"]);
        let tbf = [
            "root", "tbf", "rate", RATE, "burst", "256kb", "latency", "50ms",
        ];
        run_ok("tc", &[&["qdisc", "add", "dev", &veth][..], &tbf].concat());
        run_ok(
            "tc",
            &[&["-n", &namespace, "qdisc", "add", "dev", "eth0"][..], &tbf].concat(),
        );
    }

    /// The bridge's address, where the store and the service listen.
    fn host(&self) -> String {
        format!("{}.1", self.subnet)
    }

    /// Node `index`'s address.
    fn address(&self, index: usize) -> String {
        format!("{}.{}", self.subnet, 11 + index)
    }

    fn namespace(&self, index: usize) -> String {
        format!("{}{}", self.tag, NODES[index])
    }

    /// Node `index`'s end of its link in the root namespace.
    fn veth(&self, index: usize) -> String {
        format!("{}h{}", self.tag, NODES[index])
    }

    /// Bytes node `index` sent over its link, and bytes it received.
    fn link_bytes(&self, index: usize) -> (u64, u64) {
        let counter = |name: &str| {
            let path = format!("/sys/class/net/{}/statistics/{name}", self.veth(index));
            std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{path}: {e}"))
                .trim()
                .parse::<u64>()
                .unwrap()
        };
        // Seen from the root namespace: what the node sent arrives here.
        (counter("rx_bytes"), counter("tx_bytes"))
    }

    /// Takes node `index`'s link down (`up` false) or brings it back.
    fn set_link(&self, index: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        run_ok("ip", &["link", "set", &self.veth(index), state]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for (index, namespace) in self.namespaces.iter().enumerate() {
            let _ = Command::new("ip")
                .args(["netns", "del", namespace])
                .output();
            let _ = Command::new("ip")
                .args(["link", "del", &self.veth(index)])
                .output();
        }
        if let Some(bridge) = &self.bridge {
            let _ = Command::new("ip").args(["link", "del", bridge]).output();
        }
    }
}

/// F3 on [`Net`]: the fields drop in order, the agents and mounts before
/// the namespaces they live in.
struct NetF3 {
    f3: F3,
    net: Net,
}

impl NetF3 {
    fn up() -> NetF3 {
        let net = Net::new();
        let mut f3 = F3::serve(&net.host());
        for (index, name) in NODES.iter().enumerate() {
            let listen = format!("{}:0", net.address(index));
            f3.start_agent_in(name, Some(&net.namespace(index)), &["--listen", &listen]);
            assert!(
                f3.transfer(index).starts_with(&net.address(index)),
                "agent {name} serves on {}",
                f3.transfer(index)
            );
        }
        NetF3 { f3, net }
    }
}

/// The names of the extended attributes of `path`, sorted.
fn xattr_names(path: &Path) -> Vec<String> {
    let c_path = std::ffi::CString::new(p(path)).unwrap();
    let mut buffer = vec![0u8; 1024];
    // SAFETY: the buffers outlive the call, which writes at most 1024 bytes.
    let n = unsafe { libc::listxattr(c_path.as_ptr(), buffer.as_mut_ptr().cast(), buffer.len()) };
    assert!(
        n >= 0,
        "listxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    let mut names: Vec<String> = buffer[..n as usize]
        .split(|&b| b == 0)
        .filter(|name| !name.is_empty())
        .map(|name| String::from_utf8_lossy(name).into_owned())
        .collect();
    names.sort();
    names
}

/// The nodes `strata f3 where PATH` names, with their bytes.
fn holders(f3: &F3, path: &str) -> Vec<(String, u64)> {
    let ranked = f3.f3_json(&["where", path]);
    ranked["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("no nodes in {ranked}"))
        .iter()
        .map(|n| {
            (
                n["node"].as_str().unwrap().to_string(),
                n["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Ephemeral files (by suffix, and inheriting a directory's marking),
/// durable files, an empty file and nested directories, each written
/// through a different node's mount, read the same from all three: the
/// same bytes, sizes, listings and xattrs; `where` names each holder, and
/// the remote reads were served by the holder over its link.
#[test]
fn files_agree_from_three_nodes_in_namespaces() {
    let net = NetF3::up();
    let f3 = &net.f3;
    let (a, b, c) = (f3.mount(0), f3.mount(1), f3.mount(2));
    let mib = 1024 * 1024;
    let big = pattern(3 * mib + 17, 31);
    let medium = pattern(mib + 5, 32);
    let report = pattern(2 * mib + 3, 33);
    let part = pattern(100_000, 34);

    std::fs::write(a.join("big.eph"), &big).unwrap();
    set_xattr(&a.join("big.eph"), "user.strata.producer", "genome/split").unwrap();
    std::fs::create_dir_all(b.join("runs/2026")).unwrap();
    std::fs::write(b.join("runs/2026/medium.eph"), &medium).unwrap();
    std::fs::write(c.join("runs/2026/report.bin"), &report).unwrap();
    std::fs::write(c.join("empty.eph"), b"").unwrap();
    std::fs::create_dir(c.join("scratch")).unwrap();
    set_xattr(&c.join("scratch"), "user.strata.ephemeral", "1").unwrap();
    std::fs::create_dir(b.join("scratch/sub")).unwrap();
    std::fs::write(a.join("scratch/sub/part"), &part).unwrap();

    // Before any remote read, each ephemeral file has its writer alone.
    assert_eq!(holders(f3, "/big.eph"), [("a".into(), big.len() as u64)]);
    assert_eq!(
        holders(f3, "/runs/2026/medium.eph"),
        [("b".into(), medium.len() as u64)]
    );
    assert_eq!(
        holders(f3, "/scratch/sub/part"),
        [("a".into(), part.len() as u64)]
    );
    let served_before: Vec<u64> = (0..3)
        .map(|i| agent_metric(f3, i, "strata_f3_served_bytes_total"))
        .collect();
    let sent_before: Vec<u64> = (0..3).map(|i| net.net.link_bytes(i).0).collect();

    let files: [(&str, &[u8], Option<&str>, &str); 5] = [
        ("big.eph", &big, Some("a"), "1"),
        ("runs/2026/medium.eph", &medium, Some("b"), "1"),
        ("runs/2026/report.bin", &report, None, "0"),
        ("empty.eph", b"", Some("c"), "1"),
        ("scratch/sub/part", &part, Some("a"), "1"),
    ];
    for mount in [a, b, c] {
        for (name, content, holder, ephemeral) in files {
            let path = mount.join(name);
            let where_ = format!("{name} through {}", mount.display());
            let read = std::fs::read(&path).unwrap_or_else(|e| panic!("{where_}: {e}"));
            assert!(read == content, "{where_}: other bytes than were written");
            let size = std::fs::metadata(&path).unwrap().len();
            assert_eq!(size, content.len() as u64, "{where_}");
            assert_eq!(xattr(&path, "user.strata.holder").as_deref(), holder);
            assert_eq!(
                xattr(&path, "user.strata.ephemeral").as_deref(),
                Some(ephemeral),
                "{where_}"
            );
        }
        assert_eq!(names(mount), ["big.eph", "empty.eph", "runs", "scratch"]);
        assert_eq!(
            names(&mount.join("runs/2026")),
            ["medium.eph", "report.bin"]
        );
        assert_eq!(names(&mount.join("scratch/sub")), ["part"]);
        assert_eq!(
            xattr(&mount.join("scratch/sub"), "user.strata.ephemeral").as_deref(),
            Some("1")
        );
        assert_eq!(
            xattr(&mount.join("big.eph"), "user.strata.producer").as_deref(),
            Some("genome/split")
        );
        assert_eq!(
            xattr_names(&mount.join("big.eph")),
            [
                "user.strata.ephemeral",
                "user.strata.holder",
                "user.strata.producer"
            ]
        );
        assert_eq!(
            xattr_names(&mount.join("runs/2026/report.bin")),
            ["user.strata.ephemeral"]
        );
    }

    // Each holder served its files to the two other nodes, over its link.
    let served: Vec<u64> = (0..3)
        .map(|i| agent_metric(f3, i, "strata_f3_served_bytes_total") - served_before[i])
        .collect();
    let from_a = 2 * (big.len() + part.len()) as u64;
    let from_b = 2 * medium.len() as u64;
    assert_eq!(served, [from_a, from_b, 0], "bytes served by a, b, c");
    let sent: Vec<u64> = (0..3)
        .map(|i| net.net.link_bytes(i).0 - sent_before[i])
        .collect();
    assert!(sent[0] >= from_a, "node a sent {} bytes", sent[0]);
    assert!(sent[1] >= from_b, "node b sent {} bytes", sent[1]);
    // Node c held no remote reader's bytes: what it sent is requests and
    // the durable file's upload, far less than what a sent.
    assert!(sent[2] < sent[0], "node c sent {sent:?}");
    wait_until("the copies to be reported", || {
        holders(f3, "/big.eph").len() == 3
    });

    let stat = f3.store.json(&["obj", "stat", "f3/runs/2026/report.bin"]);
    assert_eq!(stat["size"].as_u64(), Some(report.len() as u64), "{stat}");
}

/// A writer on node a and readers on b and c: the readers get every
/// byte in order while it writes, wait at the end while it is open, and
/// end when it closes. Then node a's link is cut while readers wait on a
/// file it writes: they get EIO within the lease and some slack, never a
/// hang, and the service records the loss, naming the producer; durable
/// files read on; with the link back, the loss is undone (a `recovered`
/// event) and the file reads whole everywhere.
#[test]
fn read_while_write_and_a_cut_link_across_namespaces() {
    let net = NetF3::up();
    let f3 = &net.f3;
    let chunk = 64 * 1024;
    let data = pattern(24 * chunk, 35);
    let mut writer = std::fs::File::create(f3.mount(0).join("stream.eph")).unwrap();
    writer.write_all(&data[..chunk]).unwrap();
    let readers = [
        spawn_reader(f3.mount(1).join("stream.eph")),
        spawn_reader(f3.mount(2).join("stream.eph")),
    ];
    for piece in data[chunk..].chunks(chunk) {
        std::thread::sleep(Duration::from_millis(40));
        writer.write_all(piece).unwrap();
    }
    std::thread::sleep(Duration::from_millis(700));
    let closed = Instant::now();
    drop(writer);
    crate::f3::assert_streamed(readers, &data, closed);
    assert!(agent_metric(f3, 0, "strata_f3_served_bytes_total") >= 2 * data.len() as u64);
    let none = f3.f3_json(&["events"]);
    assert_eq!(none["events"], serde_json::json!([]), "{none}");

    cut_link_while_readers_wait(&net);
}

/// The second half of [`read_while_write_and_a_cut_link_across_namespaces`].
fn cut_link_while_readers_wait(net: &NetF3) {
    let f3 = &net.f3;
    let data = pattern(300_000, 36);
    let held = f3.mount(0).join("cut.eph");
    let mut writer = std::fs::File::create(&held).unwrap();
    writer.write_all(&data[..100_000]).unwrap();
    set_xattr(&held, "user.strata.producer", "stream/cut").unwrap();
    let durable = pattern(150_000, 37);
    std::fs::write(f3.mount(0).join("kept.bin"), &durable).unwrap();
    let readers = [
        spawn_reader(f3.mount(1).join("cut.eph")),
        spawn_reader(f3.mount(2).join("cut.eph")),
    ];
    std::thread::sleep(Duration::from_millis(500));
    net.net.set_link(0, false);
    let cut = Instant::now();
    // The fetch in flight at the cut gives up after its long poll (1 s)
    // and its patience (the lease, at least 2 s).
    let took = crate::f3::assert_eio_within_the_lease(readers, cut);
    let mut page = serde_json::Value::Null;
    wait_until_long(
        "the loss reported",
        Duration::from_millis(LEASE_MS * 4),
        || {
            page = f3.f3_json(&["events"]);
            page["events"].as_array().is_some_and(|e| e.len() == 2)
        },
    );
    let mut lost: Vec<(String, String, String, String)> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let text = |key: &str| e[key].as_str().unwrap_or_default().to_string();
            (text("kind"), text("path"), text("holder"), text("producer"))
        })
        .collect();
    lost.sort();
    assert_eq!(
        lost,
        [
            (
                "lost".into(),
                "/cut.eph".into(),
                "a".into(),
                "stream/cut".into()
            ),
            (
                "lost".into(),
                "/stream.eph".into(),
                "a".into(),
                String::new()
            )
        ],
        "{page}"
    );
    // Durable files do not depend on their writer's link.
    for index in [1, 2] {
        let read = std::fs::read(f3.mount(index).join("kept.bin")).unwrap();
        assert!(read == durable, "node {index} read other bytes of kept.bin");
    }
    // Written on a while its link is down: the bytes stay there.
    writer.write_all(&data[100_000..]).unwrap();

    net.net.set_link(0, true);
    let restored = Instant::now();
    let after = page["last"].as_u64().unwrap().to_string();
    wait_until_long("the recovery reported", Duration::from_secs(20), || {
        page = f3.f3_json(&["events", "--after", &after]);
        page["events"].as_array().is_some_and(|e| e.len() == 2)
    });
    assert!(
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["kind"] == "recovered" && e["holder"] == "a"),
        "{page}"
    );
    eprintln!(
        "cut link: EIO {took:?} after the cut, recovered {:?} after the link came back",
        restored.elapsed()
    );
    drop(writer);
    for index in [1, 2] {
        let read = std::fs::read(f3.mount(index).join("cut.eph")).unwrap();
        assert!(
            read == data,
            "node {index} read other bytes after the recovery"
        );
    }
    let held_by = holders(f3, "/cut.eph");
    assert!(held_by.iter().any(|(node, _)| node == "a"), "{held_by:?}");
}

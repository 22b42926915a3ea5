//! The object store in routed mode, across real network namespaces: one
//! orchestrator, three metadata nodes and four storage nodes (a fifth
//! joins later), each in its own namespace on a shared bridge. Every node
//! installs its host's IPv6 routes itself and keeps them in step with the
//! table: a route via the owner for every node's prefix (storage nodes)
//! or metadata group (metadata nodes), and local routes for what it owns.
//! The client runs in a ninth namespace, with the routes `strata store
//! routes --apply` installs, where the nodes' own link addresses are
//! prohibited, so every metadata and data message must travel to an
//! object or metadata address and be delivered by the routing table.
//!
//! Needs root and iproute2 (`ip netns`); CI runs as root.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{p, pattern, tmp};
use strata_store_protocol::data::{Credential, Request};
use strata_store_protocol::tenant::{TenantCredential, ADMIN_CREDENTIAL_FILE, CREDENTIAL_ENV};
use strata_store_protocol::wire::{Body, Msg};

const ON_PORT: u16 = 7480;
const MN_PORT: u16 = 7481;
const SN_PORT: u16 = 7482;
/// Namespace 1 is the orchestrator, 2..=4 metadata nodes, 5..=8 storage
/// nodes, 9 the client, 10 a storage node and 11 a metadata node that
/// join later.
const MNS: [usize; 3] = [2, 3, 4];
const SNS: [usize; 4] = [5, 6, 7, 8];
const CLIENT: usize = 9;
const LATE_SN: usize = 10;
const LATE_MN: usize = 11;

/// Namespaces on a bridge; removed (with their processes) on drop.
struct Net {
    tag: String,
    procs: Vec<Child>,
    /// The admin credential `strata store up` wrote (once started).
    credential: Option<std::path::PathBuf>,
}

impl Net {
    /// The cluster's admin credential (metadata requests are sealed with
    /// a tenant's credential).
    fn admin(&self) -> TenantCredential {
        TenantCredential::load(self.credential.as_ref().expect("a started cluster"))
            .expect("the admin credential")
    }

    fn ns(&self, i: usize) -> String {
        format!("{}n{i}", self.tag)
    }

    fn link_addr(i: usize) -> String {
        format!("fd00:99::{i}")
    }

    /// Creates the bridge namespace and eleven host namespaces on it.
    fn new() -> Net {
        let tag = format!("st{}", std::process::id() % 100_000);
        let net = Net {
            tag: tag.clone(),
            procs: Vec::new(),
            credential: None,
        };
        let br = format!("{tag}br");
        ip(&["netns", "add", &br]);
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &br, "link", "set", "br0", "up"]);
        for i in 1..=LATE_MN {
            let ns = net.ns(i);
            let (veth, port) = (format!("{tag}v{i}"), format!("{tag}b{i}"));
            ip(&["netns", "add", &ns]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", &port]);
            ip(&["link", "set", &veth, "netns", &ns]);
            ip(&["link", "set", &port, "netns", &br]);
            ip(&["-n", &br, "link", "set", &port, "master", "br0", "up"]);
            let addr = format!("{}/64", Net::link_addr(i));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", &veth, "nodad"]);
            ip(&["-n", &ns, "link", "set", &veth, "up"]);
        }
        net
    }

    /// Starts `strata ARGS` in namespace `i` and waits for its first line.
    fn spawn(&mut self, i: usize, args: &[&str], log: &Path) -> String {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns(i), env!("CARGO_BIN_EXE_strata")])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).expect("log file"))
            .spawn()
            .expect("spawn strata in a namespace");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout).read_line(&mut line).expect("read");
        self.procs.push(child);
        assert!(
            !line.is_empty(),
            "strata {args:?} in {} exited: {}",
            self.ns(i),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        line
    }

    /// Runs `strata ARGS` in the client namespace.
    fn client(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns(CLIENT),
                env!("CARGO_BIN_EXE_strata"),
            ])
            .args(args)
            .args(["--cluster", &on_endpoint()])
            .envs(self.credential.iter().map(|c| (CREDENTIAL_ENV, c)))
            .output()
            .expect("run strata in the client namespace")
    }

    fn client_ok(&self, args: &[&str]) -> String {
        let out = self.client(args);
        assert!(
            out.status.success(),
            "strata {args:?} failed in the client namespace:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The cluster's routes in namespace `i` (any table, local or not).
    fn routes_in(&self, i: usize) -> Vec<String> {
        let out = Command::new("ip")
            .args(["-6", "-n", &self.ns(i), "route", "show", "table", "all"])
            .output()
            .expect("run ip route show");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("fd53:7472:6174:"))
            .map(str::to_string)
            .collect()
    }

    /// Waits until every node's namespace in `nodes` holds `want` routes of
    /// the cluster (the nodes install them at their next table refresh).
    fn wait_for_routes(&self, nodes: &[usize], want: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for &i in nodes {
            while self.routes_in(i).len() != want {
                assert!(
                    Instant::now() < deadline,
                    "namespace {i} has {} cluster routes, want {want}: {:?}",
                    self.routes_in(i).len(),
                    self.routes_in(i)
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Adds (`op` = "add") or removes ("del") prohibit routes in the
    /// client's namespace for the link addresses of `nodes`.
    fn prohibit_node_links(&self, nodes: &[usize], op: &str) {
        let batch: String = nodes
            .iter()
            .map(|&i| format!("route {op} prohibit {}/128\n", Net::link_addr(i)))
            .collect();
        ip_batch(&self.ns(CLIENT), &batch);
    }

    /// Installs the routes the client's host needs, as a client's
    /// operator does (`strata store routes --apply`); returns how many.
    fn apply_client_routes(&self) -> u64 {
        let out = self.client_ok(&[
            "store",
            "routes",
            "--host",
            &Net::link_addr(CLIENT),
            "--apply",
            "--output",
            "json",
        ]);
        let v: serde_json::Value = serde_json::from_str(&out).expect("routes json");
        v["installed"].as_u64().expect("installed count")
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        for i in 1..=LATE_MN {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(i)])
                .status();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &format!("{}br", self.tag)])
            .status();
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?} failed: {} (this test needs root and iproute2)",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ip_batch(ns: &str, batch: &str) {
    let mut child = Command::new("ip")
        .args(["-6", "-n", ns, "-batch", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ip -batch");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(batch.as_bytes())
        .expect("write batch");
    let out = child.wait_with_output().expect("ip -batch");
    assert!(
        out.status.success(),
        "ip -batch in {ns} failed: {}\n{batch}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn on_endpoint() -> String {
    format!("[{}]:{ON_PORT}", Net::link_addr(1))
}

fn s(v: &serde_json::Value) -> String {
    v.as_str()
        .unwrap_or_else(|| panic!("not a string: {v}"))
        .to_string()
}

fn status(net: &Net) -> serde_json::Value {
    let out = net.client_ok(&["store", "status", "--output", "json"]);
    serde_json::from_str(&out).expect("status json")
}

fn up(v: &serde_json::Value, key: &str) -> usize {
    v[key]
        .as_array()
        .map(|a| a.iter().filter(|n| n["state"] == "up").count())
        .unwrap_or(0)
}

/// Sends raw bytes to `[addr]:port` over TCP from the client namespace and
/// returns what came back.
fn raw_tcp(net: &Net, addr: &str, port: u16, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let script = "import socket,sys\n\
        s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=5)\n\
        s.sendall(bytes.fromhex(sys.argv[3]))\n\
        s.shutdown(socket.SHUT_WR)\n\
        out=b''\n\
        while True:\n\
        \x20   b=s.recv(65536)\n\
        \x20   if not b: break\n\
        \x20   out+=b\n\
        print(out.hex())\n";
    exchange(net, script, addr, port, bytes)
}

/// Sends one datagram to `[addr]:port` from the client namespace and
/// returns the answer.
fn raw_udp(net: &Net, addr: &str, port: u16, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let script = "import socket,sys\n\
        s=socket.socket(socket.AF_INET6,socket.SOCK_DGRAM)\n\
        s.settimeout(5)\n\
        s.sendto(bytes.fromhex(sys.argv[3]),(sys.argv[1],int(sys.argv[2])))\n\
        print(s.recv(65536).hex())\n";
    exchange(net, script, addr, port, bytes)
}

/// Runs a Python `script ADDR PORT HEX` in the client namespace (the test
/// itself runs outside) and decodes the hex it prints.
fn exchange(
    net: &Net,
    script: &str,
    addr: &str,
    port: u16,
    bytes: &[u8],
) -> Result<Vec<u8>, String> {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let out = Command::new("ip")
        .args(["netns", "exec", &net.ns(CLIENT), "python3", "-c", script])
        .args([addr, &port.to_string(), &hex])
        .output()
        .expect("run python3");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let text = text.trim();
    Ok((0..text.len() / 2)
        .filter_map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok())
        .collect())
}

/// `strata store node add` in namespace `i`, listening on its link address.
fn add_node(net: &mut Net, dir: &Path, i: usize, role: &str, port: u16) {
    let node_dir = dir.join(format!("{role}{i}"));
    let listen = format!("[{}]:{port}", Net::link_addr(i));
    net.spawn(
        i,
        &[
            "store",
            "node",
            "add",
            "--role",
            role,
            "--dir",
            &p(&node_dir),
            "--listen",
            &listen,
            "--cluster",
            &on_endpoint(),
            "--key",
            &p(&dir.join("on").join("cluster.key")),
        ],
        &dir.join(format!("{role}{i}.log")),
    );
}

fn start_cluster(net: &mut Net, dir: &Path) {
    let on_dir = dir.join("on");
    let line = net.spawn(
        1,
        &[
            "store",
            "up",
            "--dir",
            &p(&on_dir),
            "--mn",
            "0",
            "--mn-slots",
            "3",
            "--sn",
            "0",
            "--routed",
            "--listen",
            &on_endpoint(),
            "--mg-bits",
            "4",
            "--replication",
            "3,2,3,2",
        ],
        &dir.join("on.log"),
    );
    assert!(line.contains("ready"), "{line}");
    net.credential = Some(on_dir.join(ADMIN_CREDENTIAL_FILE));
    let nodes = MNS.iter().map(|&i| (i, "mn", MN_PORT));
    for (i, role, port) in nodes.chain(SNS.iter().map(|&i| (i, "sn", SN_PORT))) {
        add_node(net, dir, i, role, port);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let st = status(net);
        if up(&st, "metadata_nodes") == 3 && up(&st, "storage_nodes") == 4 {
            assert_eq!(st["network_mode"], "routed");
            break;
        }
        assert!(Instant::now() < deadline, "nodes did not come up: {st}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn routed_cluster_in_network_namespaces_serves_every_operation() {
    let dir = tmp();
    let mut net = Net::new();
    start_cluster(&mut net, dir.path());
    let st = status(&net);
    // Every node keeps its host's routes: 16 metadata groups and 4
    // storage-node prefixes, and nothing was installed by hand.
    let nodes: Vec<usize> = MNS.iter().chain(SNS.iter()).copied().collect();
    net.wait_for_routes(&nodes, 16 + 4);
    // A node's own prefixes are local routes on its host, as `strata store
    // routes` prints them.
    let on_first_sn = net.client_ok(&["store", "routes", "--host", &Net::link_addr(SNS[0])]);
    assert_eq!(on_first_sn.matches(" local ").count(), 1, "{on_first_sn}");
    let local: Vec<String> = net
        .routes_in(SNS[0])
        .into_iter()
        .filter(|r| r.starts_with("local "))
        .collect();
    assert_eq!(local.len(), 1, "{local:?}");
    assert!(
        on_first_sn.contains(local[0].split_whitespace().nth(1).unwrap()),
        "{local:?}"
    );
    let on_first_mn = net.routes_in(MNS[0]);
    assert!(
        on_first_mn
            .iter()
            .filter(|r| r.starts_with("local "))
            .count()
            >= 5,
        "a metadata node's groups are local on its host: {on_first_mn:?}"
    );
    // The client's host is no node: its operator applies the routes.
    assert_eq!(net.apply_client_routes(), 16 + 4);
    assert_eq!(net.routes_in(CLIENT).len(), 16 + 4);
    // From here on the client cannot reach any node by its own address:
    // only routes to object and metadata addresses lead to the nodes.
    net.prohibit_node_links(&nodes, "add");
    let first_sn = Net::link_addr(SNS[0]);
    assert!(
        raw_tcp(&net, &first_sn, SN_PORT, b"").is_err(),
        "the client still reaches a storage node by its link address"
    );

    let sizes: [(usize, &str); 8] = [
        (0, "empty"),
        (1, "one"),
        // Just over the inline limit: the smallest object with replicas.
        (5_000, "small"),
        (306 * 1024, "medium"),
        (2_300_000, "large"),
        (4 * 1024 * 1024 + 17, "odd"),
        (64 << 20, "huge"),
        (2_600, "inline"),
    ];
    // Metadata nodes learn of the storage nodes at their next table
    // refresh (every 500 ms): wait until a Post is placed.
    let probe = dir.path().join("probe");
    std::fs::write(&probe, b"probe").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !net
        .client(&["obj", "put", &p(&probe), "probe"])
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "no Post was placed in 10 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    net.client_ok(&["obj", "rm", "probe"]);
    let sn_prefixes: Vec<String> = st["storage_nodes"]
        .as_array()
        .expect("sns")
        .iter()
        .map(|sn| s(&sn["prefix"]).trim_end_matches("::/64").to_string() + ":")
        .collect();
    let mut small_replica = String::new();
    for (k, (len, name)) in sizes.iter().enumerate() {
        let bytes = pattern(*len, k as u64 + 1);
        let src = dir.path().join(format!("{name}.in"));
        std::fs::write(&src, &bytes).unwrap();
        let obj = format!("b/{name}");
        net.client_ok(&["obj", "put", &p(&src), &obj]);
        let back = dir.path().join(format!("{name}.out"));
        net.client_ok(&["obj", "get", &obj, &p(&back)]);
        assert!(
            std::fs::read(&back).unwrap() == bytes,
            "{obj}: content differs"
        );
        let stat: serde_json::Value =
            serde_json::from_str(&net.client_ok(&["obj", "stat", &obj, "--output", "json"]))
                .expect("stat json");
        assert_eq!(stat["size"], *len as u64, "{stat}");
        assert_eq!(
            stat["crc32c"],
            format!("{:08x}", crc32c::crc32c(&bytes)),
            "{stat}"
        );
        let replicas = stat["replicas"].as_array().expect("replicas");
        // An empty or small object is its record alone, with no replica.
        let inline = *len <= strata_store_protocol::wire::MAX_INLINE;
        let want = if inline { 0 } else { 3 };
        assert_eq!(replicas.len(), want, "{stat}");
        for r in replicas {
            let r = s(r);
            assert!(
                sn_prefixes.iter().any(|pre| r.starts_with(pre.as_str())),
                "replica {r} in no storage node's prefix {sn_prefixes:?}"
            );
            if *name == "small" {
                small_replica = r;
            }
        }
    }
    let listed = net.client_ok(&["obj", "ls", "b/", "--all"]);
    for (_, name) in &sizes {
        assert!(listed.contains(&format!("b/{name}")), "{listed}");
    }

    // Rename is metadata only; the old name is gone.
    net.client_ok(&["obj", "mv", "b/medium", "b/renamed"]);
    let back = dir.path().join("renamed.out");
    net.client_ok(&["obj", "get", "b/renamed", &p(&back)]);
    assert!(std::fs::read(&back).unwrap() == pattern(306 * 1024, 4));
    assert!(!net.client(&["obj", "stat", "b/medium"]).status.success());

    // Delete: the object is gone for every metadata replica.
    net.client_ok(&["obj", "rm", "b/large"]);
    let gone = net.client(&["obj", "get", "b/large", &p(&dir.path().join("x"))]);
    assert!(!gone.status.success());
    let why = String::from_utf8_lossy(&gone.stderr);
    assert!(why.contains("was deleted"), "{why}");

    // A metadata node reads the address each datagram was sent to: a request naming another metadata address than the one it was
    // routed by is refused, and the right one is answered.
    let stat: serde_json::Value =
        serde_json::from_str(&net.client_ok(&["obj", "stat", "b/small", "--output", "json"]))
            .expect("stat json");
    let meta: std::net::Ipv6Addr = s(&stat["metadata_addresses"][0])
        .parse()
        .expect("metadata address");
    let beside = std::net::Ipv6Addr::from(u128::from(meta) ^ 1);
    let ask = Msg::new(
        7,
        u128::from(meta),
        Body::Get {
            name: "b/small".into(),
        },
    )
    .seal_tenant(&net.admin(), strata_store_protocol::auth::unix_ms())
    .expect("encode a Get");
    let reply = raw_udp(&net, &beside.to_string(), MN_PORT, &ask).expect("datagram by route");
    let reply = Msg::decode(&reply).expect("a metadata reply");
    assert!(
        matches!(&reply.body, Body::Error { message, .. }
            if message.contains("sent to metadata address")),
        "wrong metadata address not refused: {reply:?}"
    );
    let reply = raw_udp(&net, &meta.to_string(), MN_PORT, &ask).expect("datagram by route");
    let reply = Msg::decode(&reply).expect("a metadata reply");
    let ticket = match reply.body {
        Body::Found { record, ticket } if record.size == 5_000 => ticket,
        other => panic!("{other:?}"),
    };

    // A storage node, likewise (asked with the Get ticket of that
    // answer), tells which replica was addressed from the address
    // the connection was made to: asking it for another one is refused.
    let replica: std::net::Ipv6Addr = small_replica.parse().expect("replica address");
    let other = std::net::Ipv6Addr::from(u128::from(replica) ^ 1);
    let get = Request::Get {
        addr: u128::from(replica),
    }
    .encode(Credential::Ticket(&ticket));
    let reply = raw_tcp(&net, &other.to_string(), SN_PORT, &get).expect("connect by route");
    let text = String::from_utf8_lossy(&reply);
    assert!(
        text.contains("connection made to replica address"),
        "wrong address not refused: {text:?}"
    );
    // Without the ticket, the right address refuses it.
    let bare = Request::Get {
        addr: u128::from(replica),
    }
    .encode(Credential::None);
    let reply = raw_tcp(&net, &replica.to_string(), SN_PORT, &bare).expect("connect by route");
    let text = String::from_utf8_lossy(&reply);
    assert!(text.contains("unauthenticated Get"), "{text:?}");
    // The same request to the right address is served.
    let reply = raw_tcp(&net, &replica.to_string(), SN_PORT, &get).expect("connect by route");
    assert!(reply.len() > 5_000, "{} bytes", reply.len());
    let expected = pattern(5_000, 3);
    assert!(
        reply.windows(64).any(|w| w == &expected[..64]),
        "the replica's data is not in the reply"
    );

    // A storage node joins: every node adds its route at its next table
    // refresh, with no hand-made route; the client's operator applies the
    // client's again. New objects land on it and read back through it.
    add_node(&mut net, dir.path(), LATE_SN, "sn", SN_PORT);
    let mut all_nodes = nodes.clone();
    all_nodes.push(LATE_SN);
    net.wait_for_routes(&all_nodes, 16 + 5);
    // (A route via a node needs its link address reachable for a moment.)
    net.prohibit_node_links(&nodes, "del");
    assert_eq!(net.apply_client_routes(), 16 + 5);
    net.prohibit_node_links(&all_nodes, "add");
    let late_prefix = loop {
        let st = status(&net);
        let late = st["storage_nodes"].as_array().and_then(|sns| {
            sns.iter()
                .find(|sn| s(&sn["endpoint"]).contains(&Net::link_addr(LATE_SN)))
                .map(|sn| s(&sn["prefix"]).trim_end_matches("::/64").to_string() + ":")
        });
        if let Some(prefix) = late {
            break prefix;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut landed = 0;
    for k in 0..12 {
        let bytes = pattern(5_000, 100 + k);
        let src = dir.path().join(format!("late{k}.in"));
        std::fs::write(&src, &bytes).unwrap();
        let obj = format!("late/{k}");
        net.client_ok(&["obj", "put", &p(&src), &obj]);
        let stat: serde_json::Value =
            serde_json::from_str(&net.client_ok(&["obj", "stat", &obj, "--output", "json"]))
                .expect("stat json");
        let on_late = stat["replicas"]
            .as_array()
            .expect("replicas")
            .iter()
            .any(|r| s(r).starts_with(&late_prefix));
        if on_late {
            landed += 1;
            let back = dir.path().join(format!("late{k}.out"));
            net.client_ok(&["obj", "get", &obj, &p(&back)]);
            assert!(std::fs::read(&back).unwrap() == bytes, "{obj} differs");
        }
    }
    assert!(
        landed > 0,
        "no new object was placed on the new storage node"
    );

    // A metadata node joins beyond the three slots and takes 4 of the 16
    // groups by handover: every node points its routes for them at the new
    // node (local routes on its own host), the client's operator applies
    // the routes again, and every object's metadata, asked by route,
    // comes from wherever the groups now are.
    add_node(&mut net, dir.path(), LATE_MN, "mn", MN_PORT);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = status(&net);
        let mns = st["metadata_nodes"].as_array().expect("mns");
        let late = mns
            .iter()
            .find(|m| s(&m["endpoint"]).contains(&Net::link_addr(LATE_MN)));
        let moves = st["moves"].as_array().map_or(0, Vec::len);
        if late.is_some_and(|m| m["groups"] == 4) && moves == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no handover to the new metadata node: {st}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    all_nodes.push(LATE_MN);
    let via_late = format!("via {} ", Net::link_addr(LATE_MN));
    let deadline = Instant::now() + Duration::from_secs(20);
    for &i in &all_nodes {
        loop {
            let routes = net.routes_in(i);
            let want = |r: &String| {
                if i == LATE_MN {
                    r.starts_with("local ")
                } else {
                    r.contains(&via_late)
                }
            };
            if routes.len() == 16 + 5 && routes.iter().filter(|r| want(r)).count() == 4 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "namespace {i} does not route the 4 moved groups to the new node: {routes:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    net.prohibit_node_links(&all_nodes[..all_nodes.len() - 1], "del");
    assert_eq!(net.apply_client_routes(), 16 + 5);
    net.prohibit_node_links(&all_nodes, "add");
    assert_eq!(
        net.routes_in(CLIENT)
            .iter()
            .filter(|r| r.contains(&via_late))
            .count(),
        4
    );
    // Metadata addresses in the moved groups are routed to the new node,
    // which answers for them from the rows it copied.
    let mut asked_there = 0;
    let small = sizes
        .iter()
        .filter(|(_, name)| !matches!(*name, "medium" | "large" | "huge"))
        .map(|&(len, name)| (len, format!("b/{name}")));
    let late = (0..12).map(|k| (5_000, format!("late/{k}")));
    for (len, obj) in small.chain(late) {
        let stat: serde_json::Value =
            serde_json::from_str(&net.client_ok(&["obj", "stat", &obj, "--output", "json"]))
                .expect("stat json");
        for addr in stat["metadata_addresses"].as_array().expect("addresses") {
            let route = Command::new("ip")
                .args(["-6", "-n", &net.ns(CLIENT), "route", "get", &s(addr)])
                .output()
                .expect("ip route get");
            let route = String::from_utf8_lossy(&route.stdout).into_owned();
            if !route.contains(&via_late) {
                continue;
            }
            let meta: std::net::Ipv6Addr = s(addr).parse().expect("metadata address");
            let ask = Msg::new(8, u128::from(meta), Body::Get { name: obj.clone() })
                .seal_tenant(&net.admin(), strata_store_protocol::auth::unix_ms())
                .expect("encode a Get");
            let reply = raw_udp(&net, &meta.to_string(), MN_PORT, &ask).expect("a reply by route");
            let reply = Msg::decode(&reply).expect("a metadata reply");
            assert!(
                matches!(&reply.body, Body::Found { record, .. } if record.size == len as u64),
                "{obj} at {meta} after the handover: {reply:?}"
            );
            asked_there += 1;
        }
    }
    assert!(asked_there > 0, "no metadata address lies in a moved group");
    for (k, (len, name)) in sizes.iter().enumerate() {
        if matches!(*name, "medium" | "large" | "huge") {
            continue;
        }
        let back = dir.path().join(format!("{name}.moved"));
        net.client_ok(&["obj", "get", &format!("b/{name}"), &p(&back)]);
        assert!(
            std::fs::read(&back).unwrap() == pattern(*len, k as u64 + 1),
            "b/{name} differs after the handover"
        );
    }

    // kill -9 one storage node and one metadata node: their prefixes
    // still route to their namespaces, where nothing listens now. Every
    // Get falls back to another metadata address and another replica.
    for i in [1 + MNS.len(), 1] {
        let node = &mut net.procs[i];
        node.kill().expect("kill a node");
        node.wait().expect("reap a node");
    }
    for (k, (len, name)) in sizes.iter().enumerate() {
        if matches!(*name, "medium" | "large") {
            continue;
        }
        let back = dir.path().join(format!("{name}.again"));
        net.client_ok(&["obj", "get", &format!("b/{name}"), &p(&back)]);
        assert!(
            std::fs::read(&back).unwrap() == pattern(*len, k as u64 + 1),
            "b/{name} differs with a storage and a metadata node down"
        );
    }
}

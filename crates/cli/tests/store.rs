//! The object store run as real processes on loopback (mapped mode):
//! `strata store up` with 3 metadata and 4 storage nodes, driven by the
//! `strata obj` commands and by hand-made hostile UDP and TCP messages.

mod common;

use common::{p, pattern, strata, strata_ok, tmp};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use strata_store::data::{Credential, Request};
use strata_store::tenant::{TenantCredential, ADMIN_CREDENTIAL_FILE, CREDENTIAL_ENV};
use strata_store::wire::{Body, Msg};

/// The directory of each running `strata store up`, by its orchestrator's
/// endpoint: clients in the tests act as its admin tenant.
static STORE_DIRS: std::sync::Mutex<Vec<(SocketAddr, PathBuf)>> = std::sync::Mutex::new(Vec::new());

/// The admin credential `strata store up` wrote for the cluster at `on`.
fn admin(on: SocketAddr) -> TenantCredential {
    let dirs = STORE_DIRS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = dirs
        .iter()
        .rev()
        .find(|(o, _)| *o == on)
        .map(|(_, d)| d.clone())
        .unwrap_or_else(|| panic!("no store at {on}"));
    TenantCredential::load(&dir.join(ADMIN_CREDENTIAL_FILE)).unwrap()
}

/// `msg` sealed as the admin tenant of the cluster at `on`.
fn as_admin(on: SocketAddr, msg: &Msg) -> Vec<u8> {
    msg.seal_tenant(&admin(on), strata_store::auth::unix_ms())
        .unwrap()
}

/// A `strata store up` process, killed on drop.
struct Store {
    child: Option<Child>,
    on: SocketAddr,
    dir: PathBuf,
}

impl Store {
    fn up(dir: &Path, extra: &[&str]) -> Store {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
        cmd.args(["store", "up", "--dir", &p(dir), "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("spawn strata store up");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("readiness line");
        // "strata store: ready on 127.0.0.1:PORT (...)"
        let on = line
            .split_whitespace()
            .nth(4)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no readiness line: {line:?}"));
        STORE_DIRS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((on, dir.to_path_buf()));
        Store {
            child: Some(child),
            on,
            dir: dir.to_path_buf(),
        }
    }

    /// `strata ARGS --cluster ON`, with the cluster key in the
    /// environment (control commands need it).
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(args)
            .args(["--cluster", &self.on.to_string()])
            .env("STRATA_CLUSTER_KEY", self.key_path())
            .env(CREDENTIAL_ENV, self.dir.join(ADMIN_CREDENTIAL_FILE))
            .output()
            .expect("run strata")
    }

    /// The cluster key `strata store up` made.
    fn key_path(&self) -> PathBuf {
        self.dir.join("cluster.key")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "strata {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(!out.status.success(), "strata {args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend(["--output", "json"]);
        serde_json::from_str(&self.ok(&a)).expect("json output")
    }

    /// Waits until the status lists `count` nodes of `kind` ("storage" or
    /// "metadata").
    fn wait_for_nodes(&self, kind: &str, count: usize) {
        wait_until(&format!("{count} {kind} nodes"), || {
            self.status()[format!("{kind}_nodes")]
                .as_array()
                .unwrap()
                .len()
                == count
        });
    }

    fn status(&self) -> serde_json::Value {
        self.json(&["store", "status"])
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: sending SIGTERM to our own child.
            unsafe {
                libc::kill(c.id() as i32, libc::SIGTERM);
            }
            let _ = c.wait();
        }
    }

    /// Every replica file held by the storage nodes.
    fn replica_files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for k in 0..8 {
            let d = self.dir.join(format!("sn-{k}/replicas"));
            if let Ok(rd) = std::fs::read_dir(&d) {
                out.extend(rd.flatten().map(|e| e.path()));
            }
        }
        out
    }

    fn tmp_files(&self) -> usize {
        (0..8)
            .filter_map(|k| std::fs::read_dir(self.dir.join(format!("sn-{k}/tmp"))).ok())
            .map(|rd| rd.count())
            .sum()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_until(what: &str, f: impl FnMut() -> bool) {
    wait_until_long(what, Duration::from_secs(10), f)
}

fn wait_until_long(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

const REPLICATED: &[&str] = &["--mn", "3", "--sn", "4", "--replication", "3,2,3,2"];

/// A client thread that Gets every `(name, bytes)` in turn until `stop`,
/// and returns how many Gets it made and the ones that failed.
fn spawn_reader(
    on: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    objects: Vec<(String, Vec<u8>)>,
) -> std::thread::JoinHandle<(u64, Vec<String>)> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let client = strata_store::client::Client::connect(on, admin(on))
                .await
                .unwrap();
            let (mut gets, mut failures) = (0u64, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (name, want) in &objects {
                    gets += 1;
                    match client.get_bytes(name).await {
                        Ok((_, b)) if b == *want => {}
                        Ok(_) => failures.push(format!("{name}: wrong bytes")),
                        Err(e) => failures.push(format!("{name}: {e}")),
                    }
                }
            }
            (gets, failures)
        })
    })
}

#[test]
fn objects_from_0_bytes_to_64_mib_round_trip_with_checksums() {
    let dir = tmp();
    let store_dir = dir.path().join("cluster");
    let mut store = Store::up(&store_dir, REPLICATED);
    let sizes = [0usize, 1, 2_600, 306_000, 2_300_000, 64 << 20];
    for (i, &size) in sizes.iter().enumerate() {
        let data = pattern(size, i as u64);
        let src = dir.path().join(format!("in-{i}"));
        std::fs::write(&src, &data).unwrap();
        let name = format!("sizes/{size}");
        let put = store.json(&["obj", "put", "-p", &p(&src), &name]);
        assert_eq!(put["copies"], 3, "{put}");
        let crc = format!("{:08x}", crc32c::crc32c(&data));
        assert_eq!(put["crc32c"], crc.as_str());
        let stat = store.json(&["obj", "stat", &name]);
        assert_eq!(stat["size"], size as u64);
        assert_eq!(stat["crc32c"], crc.as_str());
        assert_eq!(stat["replicas"].as_array().unwrap().len(), 3);
        assert_eq!(stat["metadata_addresses"].as_array().unwrap().len(), 3);
        let dst = dir.path().join(format!("out-{i}"));
        store.ok(&["obj", "get", &name, &p(&dst)]);
        assert!(std::fs::read(&dst).unwrap() == data, "{name} differs");
    }
    // Three copies of each object, on three different storage nodes.
    assert_eq!(store.replica_files().len(), sizes.len() * 3);

    // A replica damaged on disk is detected on read; the client falls over
    // to another replica and still returns the right bytes.
    let stat = store.json(&["obj", "stat", "sizes/306000"]);
    let first = stat["replicas"][0].as_str().unwrap().to_string();
    let addr: std::net::Ipv6Addr = first.parse().unwrap();
    let file = store
        .replica_files()
        .into_iter()
        .find(|f| f.file_name().unwrap().to_string_lossy() == format!("{:032x}", u128::from(addr)))
        .expect("replica file of the first replica");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[5000] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();
    let dst = dir.path().join("out-damaged");
    store.ok(&["obj", "get", "sizes/306000", &p(&dst)]);
    assert!(std::fs::read(&dst).unwrap() == pattern(306_000, 3));

    // A zero-byte object is read from its metadata alone: with every one of
    // its replica files gone it still reads back, empty. An object with
    // data in the same state fails, naming the missing replica.
    for name in ["sizes/0", "sizes/1"] {
        let stat = store.json(&["obj", "stat", name]);
        for r in stat["replicas"].as_array().unwrap() {
            let addr: std::net::Ipv6Addr = r.as_str().unwrap().parse().unwrap();
            let file = format!("{:032x}", u128::from(addr));
            let path = store
                .replica_files()
                .into_iter()
                .find(|f| f.file_name().unwrap().to_string_lossy() == file)
                .expect("replica file");
            std::fs::remove_file(path).unwrap();
        }
    }
    let dst = dir.path().join("out-empty");
    std::fs::write(&dst, b"old content").unwrap();
    store.ok(&["obj", "get", "sizes/0", &p(&dst)]);
    assert_eq!(std::fs::read(&dst).unwrap(), b"");
    let err = store.fails(&["obj", "get", "sizes/1", &p(&dir.path().join("out-1b"))]);
    assert!(err.contains("replica"), "{err}");

    // The metadata and data survive a restart of the whole cluster. The
    // table epoch goes on above the one published before (heartbeats
    // moved it past the one stored with the last membership change).
    let epoch = |s: &Store| s.status()["epoch"].as_u64().expect("epoch in the status");
    let before = epoch(&store);
    store.stop();
    let store = Store::up(&store_dir, REPLICATED);
    let after = epoch(&store);
    assert!(
        after > before,
        "epoch {after} after the restart, {before} before"
    );
    let dst = dir.path().join("after-restart");
    store.ok(&["obj", "get", "sizes/2300000", &p(&dst)]);
    assert!(std::fs::read(&dst).unwrap() == pattern(2_300_000, 4));
}

/// `strata obj mv FROM TO` killed with SIGKILL right after `step`.
fn interrupted_mv(store: &Store, from: &str, to: &str, step: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["obj", "mv", from, to, "--cluster", &store.on.to_string()])
        .env("STRATA_FAILPOINT", format!("rename-after-{step}"))
        .env(CREDENTIAL_ENV, store.dir.join(ADMIN_CREDENTIAL_FILE))
        .output()
        .expect("run strata");
    assert!(
        !out.status.success(),
        "mv should have been killed after {step}"
    );
}

#[test]
fn an_interrupted_rename_loses_no_data() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("cluster"), REPLICATED);
    let dst = dir.path().join("out");
    let read = |name: &str| {
        store.ok(&["obj", "get", name, &p(&dst)]);
        std::fs::read(&dst).unwrap()
    };
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        let src = dir.path().join(name);
        std::fs::write(&src, pattern(50_000, i as u64)).unwrap();
        store.ok(&["obj", "put", &p(&src), &format!("r/{name}")]);
    }
    let files = store.replica_files().len();
    // A mapped-mode cluster has no routes to print.
    let err = store.fails(&["store", "routes", "--host", "127.0.0.1"]);
    assert!(err.contains("mapped mode"), "{err}");

    // Stopped after both names exist: deleting the old name keeps the
    // data under the new one.
    interrupted_mv(&store, "r/a", "r/a2", "linked");
    let (old, new) = (
        store.json(&["obj", "stat", "r/a"]),
        store.json(&["obj", "stat", "r/a2"]),
    );
    assert_eq!(old["replicas"], new["replicas"]);
    store.ok(&["obj", "rm", "r/a"]);
    assert!(read("r/a2") == pattern(50_000, 0));

    // ... and deleting the new name keeps it under the old one. Renaming
    // either name elsewhere meanwhile is refused: it would hide the link.
    interrupted_mv(&store, "r/b", "r/b2", "linked");
    let err = store.fails(&["obj", "mv", "r/b", "r/b3"]);
    assert!(err.contains("interrupted"), "{err}");
    store.ok(&["obj", "rm", "r/b2"]);
    assert!(read("r/b") == pattern(50_000, 1));

    // Running the rename again finishes it.
    interrupted_mv(&store, "r/c", "r/c2", "linked");
    store.ok(&["obj", "mv", "r/c", "r/c2"]);
    store.fails(&["obj", "stat", "r/c"]);
    assert!(read("r/c2") == pattern(50_000, 2));
    let done = store.json(&["obj", "stat", "r/c2"]);
    assert!(done["rename"].is_null(), "{done}");

    // Stopped after marking only: the old name is whole, and a delete
    // frees its data (no other name holds it).
    interrupted_mv(&store, "r/d", "r/d2", "marked");
    store.fails(&["obj", "stat", "r/d2"]);
    assert!(read("r/d") == pattern(50_000, 3));
    store.ok(&["obj", "rm", "r/d"]);

    // Stopped after dropping the old name: the new one reads back.
    interrupted_mv(&store, "r/c2", "r/c3", "dropped");
    assert!(read("r/c3") == pattern(50_000, 2));

    // Nothing lost: the three live objects still have all their replicas,
    // and r/d's (deleted for real) are freed in the background.
    let want = files - files / 4;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.replica_files().len() != want {
        assert!(
            std::time::Instant::now() < deadline,
            "{} replica files, want {want}",
            store.replica_files().len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_load_generator_posts_and_reads_its_objects_under_a_prefix() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("cluster"), &[]);
    let bench = |workload: &str, prefix: &str| {
        run_bench(
            &store,
            &["--workload", workload, "--size", "100", "--prefix", prefix],
        )
    };
    for prefix in ["run1", "run2"] {
        let (ok, v) = bench("post", prefix);
        assert!(ok, "{v}");
        assert_eq!(v["ops"], 6, "{v}");
        assert_eq!(v["errors"], 0, "{v}");
        // Each run makes its own objects, 2 clients x 3.
        let listed = store.json(&["obj", "ls", &format!("{prefix}/"), "--all"]);
        assert_eq!(
            listed["objects"].as_array().map(Vec::len),
            Some(6),
            "{listed}"
        );
    }
    let (ok, v) = bench("get", "run2");
    assert!(ok, "{v}");
    assert_eq!(v["ops"], 12, "{v}");
    assert!(v["mb_per_s"].as_f64().unwrap_or(0.0) > 0.0, "{v}");
    // Reading objects nobody posted counts errors and fails the run.
    let (ok, v) = bench("get", "never");
    assert!(!ok, "{v}");
    assert_eq!(v["errors"], 12, "{v}");
}

/// Runs `strata store bench` with 2 clients, 3 objects each, read twice,
/// plus `args`; returns whether it succeeded and its JSON.
fn run_bench(store: &Store, args: &[&str]) -> (bool, serde_json::Value) {
    let mut all = vec![
        "store",
        "bench",
        "--threads",
        "2",
        "--ops",
        "3",
        "--passes",
        "2",
        "--output",
        "json",
    ];
    all.extend_from_slice(args);
    let out = store.run(&all);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| serde_json::json!({ "stderr": String::from_utf8_lossy(&out.stderr) }));
    (out.status.success(), v)
}

#[test]
fn the_batched_load_generator_reads_zero_byte_objects_and_counts_misses() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("cluster"), &["--mn", "3"]);
    let (ok, v) = run_bench(
        &store,
        &["--workload", "post", "--size", "0", "--prefix", "z"],
    );
    assert!(ok && v["ops"] == 6, "{v}");
    let batched = |prefix: &str| {
        run_bench(
            &store,
            &[
                "--workload",
                "get",
                "--size",
                "0",
                "--prefix",
                prefix,
                "--engine",
                "batched",
            ],
        )
    };
    // Every client reads its 3 objects twice, over one socket.
    let (ok, v) = batched("z");
    assert!(ok, "{v}");
    assert_eq!(
        (v["ops"].as_u64(), v["errors"].as_u64()),
        (Some(12), Some(0)),
        "{v}"
    );
    // Names nobody posted are answered "not found": each one is an error.
    let (ok, v) = batched("never");
    assert!(!ok, "{v}");
    assert_eq!(
        (v["ops"].as_u64(), v["errors"].as_u64()),
        (Some(0), Some(12)),
        "{v}"
    );
    // Objects with data need a storage node: the batched engine refuses them.
    let out = store.run(&[
        "store",
        "bench",
        "--workload",
        "get",
        "--size",
        "100",
        "--engine",
        "batched",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("zero-byte Gets only"), "{err}");
    let out = store.run(&[
        "store",
        "bench",
        "--workload",
        "post",
        "--engine",
        "batched",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--workload get only"));
}

#[test]
fn rename_delete_and_paginated_list() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("cluster"), REPLICATED);
    let src = dir.path().join("small");
    std::fs::write(&src, pattern(10_000, 9)).unwrap();
    for i in 0..25 {
        store.ok(&["obj", "put", &p(&src), &format!("ls/{i:02}")]);
    }
    store.ok(&["obj", "put", &p(&src), "other/x"]);

    // Pages of 10 with cursors cover the 25 names exactly once, in order.
    let mut names = Vec::new();
    let mut after = String::new();
    let mut pages = 0;
    loop {
        let page = store.json(&["obj", "ls", "ls/", "--limit", "10", "--after", &after]);
        pages += 1;
        for o in page["objects"].as_array().unwrap() {
            names.push(o["name"].as_str().unwrap().to_string());
        }
        match page["next"].as_str() {
            Some(c) => after = c.to_string(),
            None => break,
        }
    }
    let want: Vec<String> = (0..25).map(|i| format!("ls/{i:02}")).collect();
    assert_eq!(names, want);
    assert_eq!(pages, 3);
    let all = store.json(&["obj", "ls", "--all", "--limit", "7"]);
    assert_eq!(all["objects"].as_array().unwrap().len(), 26);

    // Rename moves metadata only: same replicas, same bytes, old name gone.
    let before = store.json(&["obj", "stat", "ls/03"]);
    let files_before = store.replica_files().len();
    store.ok(&["obj", "mv", "ls/03", "moved/03"]);
    let after_mv = store.json(&["obj", "stat", "moved/03"]);
    assert_eq!(before["replicas"], after_mv["replicas"]);
    assert_eq!(before["crc32c"], after_mv["crc32c"]);
    let err = store.fails(&["obj", "stat", "ls/03"]);
    assert!(err.contains("ls/03"), "{err}");
    let dst = dir.path().join("moved");
    store.ok(&["obj", "get", "moved/03", &p(&dst)]);
    assert!(std::fs::read(&dst).unwrap() == pattern(10_000, 9));
    assert_eq!(store.replica_files().len(), files_before);
    // Renaming onto an existing name is refused.
    let err = store.fails(&["obj", "mv", "ls/04", "ls/05"]);
    assert!(err.contains("already exists"), "{err}");

    // Delete: acknowledged, gone from Get, Stat and List; space freed later.
    store.ok(&["obj", "rm", "moved/03"]);
    let err = store.fails(&["obj", "get", "moved/03", &p(&dst)]);
    assert!(
        err.contains("deleted") || err.contains("no object"),
        "{err}"
    );
    let err = store.fails(&["obj", "rm", "moved/03"]);
    assert!(
        err.contains("no object") || err.contains("deleted"),
        "{err}"
    );
    let listed = store.json(&["obj", "ls", "moved/"]);
    assert_eq!(listed["objects"].as_array().unwrap().len(), 0);
    wait_until("replicas freed", || {
        store.replica_files().len() == files_before - 3
    });

    // A new Post of a deleted name gets a newer version.
    store.ok(&["obj", "put", &p(&src), "moved/03"]);
    let v = store.json(&["obj", "stat", "moved/03"]);
    assert!(v["version"].as_u64().unwrap() > after_mv["version"].as_u64().unwrap());
}

/// A runtime on this thread and a client of the cluster at `on`.
fn connect_client(on: SocketAddr) -> (tokio::runtime::Runtime, strata_store::client::Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt
        .block_on(strata_store::client::Client::connect(on, admin(on)))
        .unwrap();
    (rt, client)
}

/// Asks the node that `table` says owns metadata address `addr` for the
/// copy of `name` kept there; returns that node and its answer.
fn ask_copy(
    credential: &TenantCredential,
    table: &strata_store::table::Table,
    addr: strata_store::addr::Addr,
    name: &str,
) -> (SocketAddr, Body) {
    let to = table.mn_endpoint(addr).expect("an owner for the address");
    let q = Msg::new(96, addr, Body::Get { name: name.into() });
    let bytes = q
        .seal_tenant(credential, strata_store::auth::unix_ms())
        .unwrap();
    (to, udp_ask(to, &bytes).body)
}

/// Seals the datagram `bytes` as `credential`'s tenant, whatever they
/// hold (the tenant flag set in the kind byte, then the tenant id, the
/// credential's generation, the id's length, the clock and the tag): what a tenant could send.
fn seal_raw(credential: &TenantCredential, bytes: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[3] |= 0x40;
    b.extend_from_slice(credential.tenant().as_bytes());
    b.extend_from_slice(&credential.generation().to_be_bytes());
    b.push(credential.tenant().len() as u8);
    b.extend_from_slice(&strata_store::auth::unix_ms().to_be_bytes());
    let tag = credential.tag(&b);
    b.extend_from_slice(&tag);
    b
}

/// Sends `bytes` to `to` and returns the answer; when the node asks for
/// the datagram padded (its answer to an unauthenticated datagram is no
/// longer than the datagram), sends it again padded ([`pad_raw`]), as a
/// client does.
fn udp_ask(to: SocketAddr, bytes: &[u8]) -> Msg {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut bytes = bytes.to_vec();
    let mut buf = vec![0u8; 70_000];
    loop {
        sock.send_to(&bytes, to).unwrap();
        let (n, _) = sock.recv_from(&mut buf).expect("a reply to a bad datagram");
        let reply = Msg::decode(&buf[..n]).expect("a decodable reply");
        match reply.body {
            Body::PadTo { size } if size as usize > bytes.len() => {
                bytes = pad_raw(&bytes, size as usize + 64);
            }
            _ => return reply,
        }
    }
}

/// `bytes` padded with zeros to `size` bytes where a node's decoder skips
/// them: after the body, so before a node's or a tenant's seal (whose tag
/// then no longer matches: only for datagrams refused anyway).
fn pad_raw(bytes: &[u8], size: usize) -> Vec<u8> {
    use strata_store::wire::{SEAL_LEN, TENANT_SEAL_FIXED};
    let Some(extra) = size.checked_sub(bytes.len()) else {
        return bytes.to_vec();
    };
    let kind = bytes.get(3).copied().unwrap_or(0);
    let suffix = if kind & 0x80 != 0 {
        SEAL_LEN
    } else if kind & 0x40 != 0 {
        let id_len = bytes
            .len()
            .checked_sub(TENANT_SEAL_FIXED - 4)
            .and_then(|at| bytes.get(at))
            .map_or(0, |&l| usize::from(l));
        id_len + TENANT_SEAL_FIXED
    } else {
        0
    };
    let at = bytes.len().saturating_sub(suffix);
    let mut padded = bytes[..at].to_vec();
    padded.resize(at + extra, 0);
    padded.extend_from_slice(&bytes[at..]);
    padded
}

fn error_text(m: &Msg) -> String {
    match &m.body {
        Body::Error { message, .. } => message.clone(),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn hostile_messages_get_clear_errors_and_nothing_half_stored() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("cluster"), REPLICATED);
    let status = store.status();
    let mn: SocketAddr = status["metadata_nodes"][0]["endpoint"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let sn: SocketAddr = status["storage_nodes"][0]["endpoint"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let src = dir.path().join("obj");
    std::fs::write(&src, pattern(4096, 1)).unwrap();

    // Malformed and oversized datagrams, to a metadata node and the orchestrator.
    for to in [mn, store.on] {
        // (A datagram shorter than the answer would be gets none: see
        // `no_unauthenticated_datagram_gets_a_longer_answer`.)
        let reply = udp_ask(to, "hello, are you a web server? ".repeat(4).as_bytes());
        assert!(error_text(&reply).contains("malformed"), "{reply:?}");
        let mut truncated = Msg::new(
            42,
            0,
            Body::Get {
                name: "x".repeat(40),
            },
        )
        .encode()
        .unwrap();
        truncated.truncate(truncated.len() - 1);
        // Unsealed, a metadata node refuses it for want of a tenant's
        // credential, the orchestrator for want of the cluster key, both
        // before decoding the body.
        let reply = udp_ask(to, &truncated);
        assert_eq!(reply.req, 42);
        let why = if to == mn {
            "no tenant credential"
        } else {
            "cluster key"
        };
        assert!(error_text(&reply).contains(why), "{reply:?}");
        // Sealed by the tenant as it is, the metadata node finds it cut.
        if to == mn {
            let reply = udp_ask(to, &seal_raw(&admin(store.on), &truncated));
            assert!(error_text(&reply).contains("truncated"), "{reply:?}");
        }
        let reply = udp_ask(to, &vec![0x53; 65_100]);
        assert!(error_text(&reply).contains("exceeds"), "{reply:?}");
    }
    // Names of 0 and 10,000 bytes.
    let long = "n".repeat(10_000);
    let reply = udp_ask(
        mn,
        &as_admin(store.on, &Msg::new(7, 0, Body::Get { name: long.clone() })),
    );
    assert!(error_text(&reply).contains("limit is 4096"), "{reply:?}");
    let reply = udp_ask(
        mn,
        &as_admin(
            store.on,
            &Msg::new(
                7,
                0,
                Body::Get {
                    name: String::new(),
                },
            ),
        ),
    );
    assert!(error_text(&reply).contains("empty"), "{reply:?}");
    assert!(store
        .fails(&["obj", "put", &p(&src), &long])
        .contains("limit is 4096"));
    assert!(store.fails(&["obj", "put", &p(&src), ""]).contains("empty"));

    // A wrong object address: a Get sent to an address that is not one of
    // the name's metadata addresses, and a Post to a non-coordinator one.
    let table = strata_store::table::Table::decode(&match udp_ask(
        store.on,
        &Msg::new(1, 0, Body::GetTable).encode_padded(64).unwrap(),
    )
    .body
    {
        Body::Table { bytes } => bytes,
        b => panic!("{b:?}"),
    })
    .unwrap();
    let addrs = table.meta_addrs("obj/a");
    let owner = table.mn_for(addrs[1]).unwrap().endpoint;
    let reply = udp_ask(
        owner,
        &as_admin(
            store.on,
            &Msg::new(
                8,
                addrs[1] ^ 1,
                Body::Get {
                    name: "obj/a".into(),
                },
            ),
        ),
    );
    assert!(
        error_text(&reply).contains("not a metadata address"),
        "{reply:?}"
    );
    let begin = Body::PostBegin {
        name: "obj/a".into(),
        size: 1,
    };
    let reply = udp_ask(owner, &as_admin(store.on, &Msg::new(9, addrs[1], begin)));
    assert!(
        error_text(&reply).contains("not the coordinator"),
        "{reply:?}"
    );

    // A concurrent Post of the same name fails at once.
    let coord = table.mn_for(addrs[0]).unwrap().endpoint;
    let begin = Body::PostBegin {
        name: "obj/a".into(),
        size: 4096,
    };
    match udp_ask(coord, &as_admin(store.on, &Msg::new(10, addrs[0], begin))).body {
        Body::PostPlan {
            replicas, ticket, ..
        } => {
            assert_eq!(replicas.len(), 3);
            assert!(!ticket.is_empty(), "a plan without a Put ticket");
        }
        b => panic!("{b:?}"),
    }
    let t0 = Instant::now();
    let err = store.fails(&["obj", "put", &p(&src), "obj/a"]);
    assert!(err.contains("in progress"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(3));

    // TCP: garbage, an oversized Put, an address outside the node's prefix
    // (sealed with the cluster key, as a node's: a tenant's is refused
    // before, for want of a ticket).
    let key = strata_store::auth::ClusterKey::load(&store.key_path()).unwrap();
    let sealed = Credential::Seal(&key);
    let tcp_error = |bytes: &[u8]| {
        let mut s = TcpStream::connect(sn).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(bytes).unwrap();
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut reply = Vec::new();
        let _ = s.read_to_end(&mut reply);
        assert_eq!(reply.first(), Some(&1), "expected an error status");
        String::from_utf8_lossy(&reply[3..]).into_owned()
    };
    assert!(tcp_error(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").contains("not a Strata"));
    let mut huge = b"S6D2\x01".to_vec();
    huge.extend_from_slice(&table.layout.replica_addr(1, 5).to_be_bytes());
    huge.extend_from_slice(&u64::MAX.to_be_bytes());
    huge.push(0);
    assert!(tcp_error(&huge).contains("object limit"));
    let foreign = strata_store::data::Request::Get {
        addr: table.layout.replica_addr(3, 5),
    }
    .encode(sealed);
    let first_index = table.sns.iter().find(|s| s.endpoint == sn).unwrap().index;
    if first_index != 3 {
        assert!(tcp_error(&foreign).contains("not in this storage node's prefix"));
    }

    // A client that disconnects mid-stream leaves no replica and no
    // temporary file behind.
    let before = store.replica_files().len();
    {
        let mut s = TcpStream::connect(sn).unwrap();
        let put = strata_store::data::Request::Put {
            addr: table.layout.replica_addr(first_index, 0xdead),
            size: 1 << 20,
            chain: vec![table.layout.replica_addr(first_index % 4 + 1, 0xbeef)],
        };
        s.write_all(&put.encode(sealed)).unwrap();
        s.write_all(&[7u8; 100_000]).unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(store.replica_files().len(), before);
    assert_eq!(store.tmp_files(), 0);
    // A Put whose checksum is wrong is refused and not stored.
    {
        let mut s = TcpStream::connect(sn).unwrap();
        let put = strata_store::data::Request::Put {
            addr: table.layout.replica_addr(first_index, 0xfeed),
            size: 3,
            chain: vec![],
        };
        s.write_all(&put.encode(sealed)).unwrap();
        s.write_all(b"abc\0\0\0\0").unwrap();
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut reply = Vec::new();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.read_to_end(&mut reply);
        assert!(String::from_utf8_lossy(&reply).contains("checksum mismatch"));
    }
    assert_eq!(store.replica_files().len(), before);

    // Every node is still up and serving.
    let status = store.status();
    for n in status["metadata_nodes"]
        .as_array()
        .unwrap()
        .iter()
        .chain(status["storage_nodes"].as_array().unwrap())
    {
        assert_eq!(n["state"], "up", "{n}");
    }
    store.ok(&["obj", "put", &p(&src), "after/bad"]);
    let dst = dir.path().join("after");
    store.ok(&["obj", "get", "after/bad", &p(&dst)]);
    assert!(std::fs::read(&dst).unwrap() == pattern(4096, 1));
}

/// Sends `bytes` to a storage node, closes the writing half, and returns
/// everything it answers.
fn tcp_exchange(sn: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(sn).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    reply
}

/// The data path is authenticated: a storage node takes a Free only
/// sealed with the cluster key, and a Put or Get only sealed or with a
/// valid ticket from a metadata node; anything else is refused and
/// changes nothing.
#[test]
fn unsealed_or_unticketed_data_requests_are_refused_and_change_nothing() {
    use strata_store::auth::{unix_ms, ClusterKey, Ticket, TicketOp, KEY_LEN, WINDOW_MS};
    let dir = tmp();
    let store = Store::up(&dir.path().join("cluster"), REPLICATED);
    let key = ClusterKey::load(&store.key_path()).unwrap();
    let wrong = ClusterKey::from_bytes(&[7; KEY_LEN]);
    let data = pattern(5000, 9);
    let src = dir.path().join("o");
    std::fs::write(&src, &data).unwrap();
    store.ok(&["obj", "put", &p(&src), "keep/a"]);
    store.ok(&["obj", "put", &p(&src), "keep/b"]);
    let (rt, client) = connect_client(store.on);
    let table = client.table();
    let replica = |name: &str| -> u128 {
        let stat = store.json(&["obj", "stat", name]);
        let r: std::net::Ipv6Addr = stat["replicas"][0].as_str().unwrap().parse().unwrap();
        u128::from(r)
    };
    let (a, b) = (replica("keep/a"), replica("keep/b"));
    let sn = table.sn_endpoint(a).unwrap();
    let files = store.replica_files().len();
    let refused = |reply: &[u8], want: &str| {
        assert_eq!(reply.first(), Some(&1), "not refused: {reply:?}");
        let text = String::from_utf8_lossy(reply);
        assert!(
            text.contains("unauthenticated") && text.contains(want),
            "{text:?} lacks {want:?}"
        );
        // Refused before anything was served.
        assert!(!reply.windows(64).any(|w| w == &data[..64]), "data served");
    };

    // The Get ticket a metadata node's answer carries.
    let meta = table.meta_addrs("keep/a");
    let (_, found) = ask_copy(&admin(store.on), &table, meta[0], "keep/a");
    let Body::Found { ticket, .. } = found else {
        panic!("{found:?}")
    };
    assert!(!ticket.is_empty(), "a Get answer without a ticket");

    // Frees: unsealed, sealed with another key, sealed too long ago, or
    // with a ticket instead of a seal.
    let free = Request::Free { addr: a };
    refused(
        &tcp_exchange(sn, &free.encode(Credential::None)),
        "not sealed",
    );
    refused(
        &tcp_exchange(sn, &free.encode(Credential::Seal(&wrong))),
        "does not match",
    );
    let old = free.encode_at(Credential::Seal(&key), unix_ms() - WINDOW_MS - 5_000);
    refused(&tcp_exchange(sn, &old), "a replay");
    refused(
        &tcp_exchange(sn, &free.encode(Credential::Ticket(&ticket))),
        "needs the cluster key's seal",
    );

    // Gets: without a ticket, with a ticket for other replicas, forged,
    // expired.
    let get = Request::Get { addr: a };
    refused(&tcp_exchange(sn, &get.encode(Credential::None)), "neither");
    if table.sn_endpoint(b) == Some(sn) {
        let other = Request::Get { addr: b };
        refused(
            &tcp_exchange(sn, &other.encode(Credential::Ticket(&ticket))),
            "does not cover",
        );
    }
    let mine = |op, expires, size, replicas: Vec<u128>, k: &ClusterKey| {
        Ticket {
            op,
            expires,
            size,
            replicas,
            coordinator: 0,
        }
        .seal(k)
    };
    let forged = mine(TicketOp::Get, unix_ms() + 60_000, 5000, vec![a], &wrong);
    refused(
        &tcp_exchange(sn, &get.encode(Credential::Ticket(&forged))),
        "does not match",
    );
    let expired = mine(TicketOp::Get, unix_ms() - 1_000, 5000, vec![a], &key);
    refused(
        &tcp_exchange(sn, &get.encode(Credential::Ticket(&expired))),
        "expired",
    );
    // With the metadata node's ticket it is served.
    let served = tcp_exchange(sn, &get.encode(Credential::Ticket(&ticket)));
    assert_eq!(served.first(), Some(&0));
    assert!(served.windows(64).any(|w| w == &data[..64]));

    // Puts: without a ticket, with a Get ticket, and with the Put ticket
    // of a real plan but another size or chain; nothing is stored.
    let index = table.sns.iter().find(|s| s.endpoint == sn).unwrap().index;
    let fresh = table.layout.replica_addr(index, 0x5eed);
    let put = |addr, size, chain: Vec<u128>| Request::Put { addr, size, chain };
    let body = |n: usize| {
        let mut v = vec![3u8; n];
        v.extend_from_slice(&crc32c::crc32c(&v[..n]).to_be_bytes());
        v
    };
    let send = |req: Request, cred: Credential, n: usize| {
        let mut bytes = req.encode(cred);
        bytes.extend(body(n));
        tcp_exchange(sn, &bytes)
    };
    refused(&send(put(fresh, 3, vec![]), Credential::None, 3), "neither");
    refused(
        &send(put(a, 3, vec![]), Credential::Ticket(&ticket), 3),
        "for a Get, not a Put",
    );
    let coord = table.mn_endpoint(table.meta_addrs("keep/c")[0]).unwrap();
    let begin = Msg::new(
        77,
        table.meta_addrs("keep/c")[0],
        Body::PostBegin {
            name: "keep/c".into(),
            size: 3,
        },
    );
    let Body::PostPlan {
        replicas,
        ticket: put_ticket,
        ..
    } = udp_ask(coord, &as_admin(store.on, &begin)).body
    else {
        panic!("no plan")
    };
    let first = table.sn_endpoint(replicas[0]).unwrap();
    let send_to = |req: Request, cred: Credential, n: usize| {
        let mut bytes = req.encode(cred);
        bytes.extend(body(n));
        tcp_exchange(first, &bytes)
    };
    let ticketed = Credential::Ticket(&put_ticket);
    refused(
        &send_to(put(replicas[0], 4, replicas[1..].to_vec()), ticketed, 4),
        "of 3 bytes but this one sends 4",
    );
    refused(
        &send_to(put(replicas[0], 3, vec![]), ticketed, 3),
        "but this one writes",
    );
    let expired = mine(TicketOp::Put, unix_ms() - 1, 3, replicas.clone(), &key);
    refused(
        &send_to(
            put(replicas[0], 3, replicas[1..].to_vec()),
            Credential::Ticket(&expired),
            3,
        ),
        "expired",
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        store.replica_files().len(),
        files,
        "a refused request stored or freed a replica"
    );
    assert_eq!(store.tmp_files(), 0);

    // Everything still reads back.
    for name in ["keep/a", "keep/b"] {
        let (_, got) = rt.block_on(client.get_bytes(name)).unwrap();
        assert!(got == data, "{name}");
    }
}

/// Tenants' metadata requests are authenticated and held to a scope: a
/// metadata node refuses requests that are unsealed, forged, sealed with
/// a wrong tenant key or an expired clock, or that name anything outside
/// the tenant's names, with a clear error; none of them changes anything
/// or hands out a ticket.
#[test]
fn unsealed_forged_stale_or_out_of_scope_metadata_requests_are_refused_and_change_nothing() {
    use strata_store::auth::{unix_ms, ClusterKey, KEY_LEN, WINDOW_MS};
    use strata_store::wire::{Record, RenameLink};
    let dir = tmp();
    let store = Store::up(&dir.path().join("cluster"), REPLICATED);
    let src = dir.path().join("o");
    std::fs::write(&src, pattern(3000, 5)).unwrap();
    store.ok(&["obj", "put", &p(&src), "other/x"]);
    store.ok(&["obj", "put", &p(&src), "acme/mine"]);
    let before = store.json(&["obj", "stat", "other/x"]);
    let (rt, client) = connect_client(store.on);
    let table = client.table();
    let key = ClusterKey::load(&store.key_path()).unwrap();
    let acme = TenantCredential::issue(&key, "acme").unwrap();
    let foreign = TenantCredential::issue(&ClusterKey::from_bytes(&[9; KEY_LEN]), "acme").unwrap();
    // acme's secret, claimed for the admin.
    let impostor = TenantCredential::new("*", acme.secret_bytes()).unwrap();
    let coordinator = |name: &str| {
        let addr = table.meta_addrs(name)[0];
        (addr, table.mn_endpoint(addr).unwrap())
    };
    let record: Record = {
        let meta = table.meta_addrs("other/x");
        match ask_copy(&admin(store.on), &table, meta[0], "other/x").1 {
            Body::Found { record, .. } => record,
            b => panic!("{b:?}"),
        }
    };
    // Every kind of tenant request, on other/x (or naming it).
    let requests = |name: &str| -> Vec<Body> {
        vec![
            Body::Get { name: name.into() },
            Body::Delete {
                name: name.into(),
                if_version: 0,
                keep_data: false,
            },
            Body::PostBegin {
                name: name.into(),
                size: 3,
            },
            Body::Update {
                record: Record {
                    rename: Some(RenameLink::To("acme/stolen".into())),
                    ..record.clone()
                },
                if_version: record.version,
            },
        ]
    };
    let refused = |reply: &Msg, want: &str| {
        match &reply.body {
            Body::Error { message, .. } => {
                assert!(message.contains(want), "{message:?} lacks {want:?}")
            }
            other => panic!("not refused ({want}): {other:?}"),
        };
    };
    let now = unix_ms();
    for body in requests("other/x") {
        let (addr, mn) = coordinator("other/x");
        let msg = Msg::new(500, addr, body);
        refused(&udp_ask(mn, &msg.encode().unwrap()), "no tenant credential");
        refused(
            &udp_ask(mn, &msg.seal_tenant(&foreign, now).unwrap()),
            "does not match tenant \"acme\"'s key",
        );
        refused(
            &udp_ask(mn, &msg.seal_tenant(&impostor, now).unwrap()),
            "does not match",
        );
        // Padded from the start: padding it afterwards would break its
        // tag, and the refusal for the clock would not be the one given.
        let stale = msg
            .seal_tenant_padded(&admin(store.on), now - WINDOW_MS - 5_000, 1200)
            .unwrap();
        refused(&udp_ask(mn, &stale), "clocks apart, or a replay");
        let mut forged = msg.seal_tenant(&acme, now).unwrap();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        refused(&udp_ask(mn, &forged), "does not match");
        refused(
            &udp_ask(mn, &msg.seal_tenant(&acme, now).unwrap()),
            "tenant 'acme' may only use names under 'acme/'; 'other/x' refused",
        );
    }
    // A rename out of acme's scope, a Link into it of other/x's replicas,
    // and a List outside it.
    let (addr, mn) = coordinator("acme/stolen");
    let link = Msg::new(
        501,
        addr,
        Body::Link {
            record: Record {
                name: "acme/stolen".into(),
                rename: Some(RenameLink::From("other/x".into())),
                ..record.clone()
            },
            proof: vec![],
        },
    );
    refused(
        &udp_ask(mn, &link.seal_tenant(&acme, now).unwrap()),
        "'other/x' refused",
    );
    let (addr, mn) = coordinator("acme/mine");
    let list = Msg::new(
        502,
        addr,
        Body::List {
            prefix: String::new(),
            after: String::new(),
            limit: 10,
        },
    );
    refused(
        &udp_ask(mn, &list.seal_tenant(&acme, now).unwrap()),
        "List prefix ''",
    );
    // acme's own name is served, with a ticket.
    let (addr, mn) = coordinator("acme/mine");
    let mine = Msg::new(
        503,
        addr,
        Body::Get {
            name: "acme/mine".into(),
        },
    );
    match udp_ask(mn, &mine.seal_tenant(&acme, unix_ms()).unwrap()).body {
        Body::Found { record, ticket } => {
            assert_eq!(record.name, "acme/mine");
            assert!(!ticket.is_empty());
        }
        b => panic!("{b:?}"),
    }
    // Nothing changed: other/x is as it was and reads back; acme/stolen
    // does not exist.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(store.json(&["obj", "stat", "other/x"]), before);
    let (_, got) = rt.block_on(client.get_bytes("other/x")).unwrap();
    assert!(got == pattern(3000, 5));
    let err = store.fails(&["obj", "stat", "acme/stolen"]);
    assert!(err.contains("no object named"), "{err}");
}

/// A rename's `Link` binds existing replicas under a new name, so a
/// tenant's Link must carry a link proof for exactly those replicas,
/// issued to that tenant by a metadata node that answered its
/// `GetLinkProof` of a name in its scope. Tenant bee, which learned
/// acme's replica addresses (here from the admin's lookup), tries to bind
/// them under `bee/stolen` with no proof, a forged one, a genuine proof
/// for its own other replicas, and acme's genuine proof: each is refused
/// as forbidden, saying why; nothing is bound and no ticket handed out. A
/// proved Link (and its resend) and `strata obj mv` within a tenant's
/// scope still work, and the data reads back.
#[test]
fn a_tenant_cannot_link_another_tenants_replicas_under_its_own_names() {
    use strata_store::auth::unix_ms;
    use strata_store::wire::{Code, Record, RenameLink};
    let dir = tmp();
    let d = dir.path().join("cluster");
    let store = Store::up(&d, REPLICATED);
    let dp = p(&d);
    let credential = |tenant: &str| {
        strata_ok(&["store", "tenant", "add", "--dir", &dp, "--tenant", tenant]);
        let file = d.join(format!("{tenant}.credential"));
        (TenantCredential::load(&file).unwrap(), p(&file))
    };
    let (acme, acme_file) = credential("acme");
    let (bee, bee_file) = credential("bee");
    let secret_src = dir.path().join("secret");
    std::fs::write(&secret_src, pattern(5000, 7)).unwrap();
    let own_src = dir.path().join("own");
    std::fs::write(&own_src, pattern(4000, 8)).unwrap();
    let put = |cred: &str, src: &Path, name: &str| {
        store.ok(&["obj", "put", "--credential", cred, &p(src), name]);
    };
    put(&acme_file, &secret_src, "acme/secret");
    put(&bee_file, &own_src, "bee/own");
    let before = store.json(&["obj", "stat", "acme/secret"]);
    let (rt, client) = connect_client(store.on);
    let table = client.table();
    let coordinator = |name: &str| {
        let addr = table.meta_addrs(name)[0];
        (addr, table.mn_endpoint(addr).unwrap())
    };
    // What the admin sees, bee learns: acme's replica addresses.
    let record_of =
        |name: &str| match ask_copy(&admin(store.on), &table, table.meta_addrs(name)[0], name).1 {
            Body::Found { record, .. } => record,
            b => panic!("{name}: {b:?}"),
        };
    let secret = record_of("acme/secret");
    let own = record_of("bee/own");
    assert!(!secret.replicas.is_empty());
    let ask_proof = |cred: &TenantCredential, name: &str| {
        let (addr, mn) = coordinator(name);
        let q = Msg::new(700, addr, Body::GetLinkProof { name: name.into() });
        udp_ask(mn, &q.seal_tenant(cred, unix_ms()).unwrap())
    };
    let proof_of = |cred: &TenantCredential, name: &str| match ask_proof(cred, name).body {
        Body::LinkProof { record, proof } => {
            assert_eq!(record.name, name);
            assert!(!proof.is_empty(), "no proof for {name}");
            proof
        }
        b => panic!("{name}: {b:?}"),
    };
    let acme_proof = proof_of(&acme, "acme/secret");
    let bee_proof = proof_of(&bee, "bee/own");
    // bee cannot ask for a proof of acme's name.
    let err = error_text(&ask_proof(&bee, "acme/secret"));
    assert!(
        err.contains("tenant 'bee' may only use names under 'bee/'"),
        "{err}"
    );
    let mut forged = bee_proof.clone();
    let last = forged.len() - 1;
    forged[last] ^= 1;
    let stolen = Record {
        name: "bee/stolen".into(),
        rename: Some(RenameLink::From("bee/own".into())),
        ..secret.clone()
    };
    let (addr, mn) = coordinator("bee/stolen");
    let attempts = [
        (Vec::new(), "it carries no link proof for its replicas"),
        (
            forged,
            "does not match this cluster's key for tenant \"bee\"",
        ),
        (bee_proof.clone(), "but the Link binds"),
        (acme_proof.clone(), "issued to another tenant"),
    ];
    for (i, (proof, want)) in attempts.into_iter().enumerate() {
        let link = Msg::new(
            710 + i as u64,
            addr,
            Body::Link {
                record: stolen.clone(),
                proof,
            },
        );
        let reply = udp_ask(mn, &link.seal_tenant(&bee, unix_ms()).unwrap());
        match &reply.body {
            Body::Error { code, message } => {
                assert_eq!(*code, Code::Forbidden, "{message}");
                assert!(message.contains(want), "{message:?} lacks {want:?}");
                assert!(
                    message.contains("Link of \"bee/stolen\" refused"),
                    "{message}"
                );
                assert!(message.ends_with("nothing done"), "{message}");
            }
            other => panic!("attempt {i} not refused: {other:?}"),
        }
    }
    // Nothing was bound: no copy of bee/stolen anywhere, so no Get ticket
    // for acme's replicas under it.
    std::thread::sleep(Duration::from_millis(300));
    for meta in table.meta_addrs("bee/stolen") {
        match ask_copy(&bee, &table, meta, "bee/stolen").1 {
            Body::Error { code, .. } => assert_eq!(code, Code::NotFound),
            b => panic!("bee/stolen bound: {b:?}"),
        }
    }
    let err = store.fails(&["obj", "stat", "--credential", &bee_file, "bee/stolen"]);
    assert!(err.contains("no object named"), "{err}");
    // A proved Link works, and its resend (same request, same socket) is
    // answered the same from the reply cache.
    let (addr, mn) = coordinator("acme/alias");
    let alias = Msg::new(
        720,
        addr,
        Body::Link {
            record: Record {
                name: "acme/alias".into(),
                rename: Some(RenameLink::From("acme/secret".into())),
                ..secret.clone()
            },
            proof: acme_proof,
        },
    );
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let bytes = alias.seal_tenant(&acme, unix_ms()).unwrap();
    let mut versions = Vec::new();
    for _ in 0..2 {
        sock.send_to(&bytes, mn).unwrap();
        let mut buf = vec![0u8; 70_000];
        let (n, _) = sock.recv_from(&mut buf).unwrap();
        match Msg::decode(&buf[..n]).unwrap().body {
            Body::Done { version } => versions.push(version),
            b => panic!("a proved Link refused: {b:?}"),
        }
    }
    assert_eq!(versions[0], versions[1]);
    // `strata obj mv` within each tenant's scope, and the data reads back.
    let back = dir.path().join("back");
    store.ok(&[
        "obj",
        "mv",
        "--credential",
        &bee_file,
        "bee/own",
        "bee/moved",
    ]);
    store.ok(&[
        "obj",
        "get",
        "--credential",
        &bee_file,
        "bee/moved",
        &p(&back),
    ]);
    assert!(std::fs::read(&back).unwrap() == pattern(4000, 8));
    assert_eq!(record_of("bee/moved").replicas, own.replicas);
    let err = store.fails(&["obj", "stat", "--credential", &bee_file, "bee/own"]);
    assert!(err.contains("\"bee/own\" was deleted"), "{err}");
    // acme's object is as it was, and reads back.
    assert_eq!(store.json(&["obj", "stat", "acme/secret"]), before);
    let (_, got) = rt.block_on(client.get_bytes("acme/secret")).unwrap();
    assert!(got == pattern(5000, 7));
}

/// `strata store up --dir D` writes an admin credential that `strata obj
/// --dir D` uses; `strata store tenant add` writes a tenant's, which
/// works in its scope and is refused outside it.
#[test]
fn the_admin_credential_works_and_a_tenant_is_held_to_its_names() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp();
    let d = dir.path().join("cluster");
    let store = Store::up(&d, &[]);
    let on = store.on.to_string();
    // No STRATA_CREDENTIAL from the test's Store::run here.
    let obj = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_strata"))
            .arg("obj")
            .args(args)
            .args(["--cluster", &on])
            .env_remove(CREDENTIAL_ENV)
            .output()
            .expect("run strata obj")
    };
    let ok = |args: &[&str]| {
        let out = obj(args);
        assert!(
            out.status.success(),
            "strata obj {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let fails = |args: &[&str]| {
        let out = obj(args);
        assert!(!out.status.success(), "strata obj {args:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let admin_file = d.join(ADMIN_CREDENTIAL_FILE);
    let mode = std::fs::metadata(&admin_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let src = dir.path().join("src");
    std::fs::write(&src, pattern(10_000, 3)).unwrap();
    let back = dir.path().join("back");
    let dp = p(&d);
    ok(&["put", "--dir", &dp, &p(&src), "other/x"]);
    ok(&["get", "--dir", &dp, "other/x", &p(&back)]);
    assert!(std::fs::read(&back).unwrap() == pattern(10_000, 3));
    // Without any credential: refused before sending, with what to do.
    let err = fails(&["stat", "other/x"]);
    assert!(
        err.contains("--credential") && err.contains("store tenant add"),
        "{err}"
    );

    let out = strata_ok(&[
        "store", "tenant", "add", "--dir", &dp, "--tenant", "acme", "--output", "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let cred = PathBuf::from(v["credential"].as_str().unwrap());
    assert_eq!(cred, d.join("acme.credential"));
    assert_eq!(v["scope"], "names under 'acme/'");
    let mode = std::fs::metadata(&cred).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let c = p(&cred);
    ok(&["put", "--credential", &c, &p(&src), "acme/a"]);
    ok(&["get", "--credential", &c, "acme/a", &p(&back)]);
    assert!(std::fs::read(&back).unwrap() == pattern(10_000, 3));
    ok(&["mv", "--credential", &c, "acme/a", "acme/b"]);
    let listed = ok(&["ls", "--credential", &c, "acme/"]);
    assert!(listed.contains("acme/b"), "{listed}");
    let scope = "tenant 'acme' may only use names under 'acme/'";
    for args in [
        vec!["put", "--credential", &c, &p(&src), "other/y"],
        vec!["get", "--credential", &c, "other/x", &p(&back)],
        vec!["stat", "--credential", &c, "other/x"],
        vec!["rm", "--credential", &c, "other/x"],
        vec!["mv", "--credential", &c, "acme/b", "other/b"],
        vec!["ls", "--credential", &c, ""],
    ] {
        let err = fails(&args);
        assert!(err.contains(scope), "{args:?}: {err}");
    }
    // Nothing of that happened: the admin sees other/x unchanged, acme/b
    // still there, and no other/y or other/b.
    let stat = |name: &str| obj(&["stat", "--dir", &dp, name]);
    assert!(stat("other/x").status.success());
    assert!(stat("acme/b").status.success());
    assert!(!stat("other/y").status.success());
    assert!(!stat("other/b").status.success());
    // The environment variable names a credential too.
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["obj", "stat", "other/x", "--cluster", &on])
        .env(CREDENTIAL_ENV, &cred)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains(scope));
    // A bad tenant id is refused with the rule.
    let out = strata(&["store", "tenant", "add", "--dir", &dp, "--tenant", "a/b"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid"));
}

/// `strata store tenant revoke` cuts one tenant's credential off within
/// the table refresh bound, leaves every other tenant alone, lets the
/// next generation in, and survives an orchestrator restart.
#[test]
fn a_revoked_tenant_credential_is_refused_and_the_next_generation_works() {
    let dir = tmp();
    let d = dir.path().join("cluster");
    let mut store = Store::up(&d, &[]);
    let dp = p(&d);
    let src = dir.path().join("src");
    std::fs::write(&src, pattern(5_000, 7)).unwrap();
    let back = dir.path().join("back");
    // Issued by asking the orchestrator (--cluster, added by `run`).
    let issue = |store: &Store, tenant: &str, out: &Path| {
        let v = store.json(&[
            "store",
            "tenant",
            "add",
            "--dir",
            &dp,
            "--tenant",
            tenant,
            "--out",
            &p(out),
        ]);
        v["generation"].as_u64().expect("a generation")
    };
    let acme_old = dir.path().join("acme-old.credential");
    let bee = dir.path().join("bee.credential");
    assert_eq!(issue(&store, "acme", &acme_old), 0);
    assert_eq!(issue(&store, "bee", &bee), 0);
    // Never revoked: its generation-0 credential must work throughout.
    let cat = dir.path().join("cat.credential");
    assert_eq!(issue(&store, "cat", &cat), 0);
    let obj = |store: &Store, cred: &Path, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_strata"))
            .arg("obj")
            .args(args)
            .args(["--cluster", &store.on.to_string(), "--credential", &p(cred)])
            .env_remove(CREDENTIAL_ENV)
            .output()
            .expect("run strata obj")
    };
    let ok = |store: &Store, cred: &Path, args: &[&str]| {
        let out = obj(store, cred, args);
        assert!(
            out.status.success(),
            "strata obj {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ok(&store, &acme_old, &["put", &p(&src), "acme/a"]);
    ok(&store, &acme_old, &["get", "acme/a", &p(&back)]);
    ok(&store, &bee, &["put", &p(&src), "bee/a"]);
    ok(&store, &cat, &["put", &p(&src), "cat/a"]);

    let v = store.json(&["store", "tenant", "revoke", "--tenant", "acme"]);
    assert_eq!(v["revoked_below"], 1, "{v}");
    let bound = v["takes_effect_within_ms"].as_u64().expect("a bound");
    assert_eq!(
        u128::from(bound),
        strata_store::node::REVOCATION_BOUND.as_millis()
    );
    assert_eq!(store.status()["revoked_tenants"], 1);
    let human = store.ok(&[
        "store", "tenant", "revoke", "--tenant", "bee", "--output", "human",
    ]);
    assert!(human.contains("within") && human.contains("ms"), "{human}");
    // bee was revoked too, just above: give it its next generation.
    let bee_new = dir.path().join("bee-new.credential");
    assert_eq!(issue(&store, "bee", &bee_new), 1);
    // The bound, with slack for a loaded machine.
    std::thread::sleep(Duration::from_millis(bound + 500));
    let revoked = "tenant 'acme' credential generation 0 was revoked";
    for args in [
        vec!["get", "acme/a", &p(&back)],
        vec!["put", &p(&src), "acme/new"],
        vec!["rm", "acme/a"],
    ] {
        let out = obj(&store, &acme_old, &args);
        assert!(
            !out.status.success(),
            "{args:?} accepted after the revocation"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(revoked) && err.contains("ask the operator for a new one"),
            "{args:?}: {err}"
        );
    }
    // Nothing of that happened.
    let admin = d.join(ADMIN_CREDENTIAL_FILE);
    ok(&store, &admin, &["stat", "acme/a"]);
    assert!(!obj(&store, &admin, &["stat", "acme/new"]).status.success());
    // The next generation works; the other tenant's new one too, and its
    // old one is refused like acme's.
    let acme_new = dir.path().join("acme-new.credential");
    assert_eq!(issue(&store, "acme", &acme_new), 1);
    let text = std::fs::read_to_string(&acme_new).unwrap();
    assert!(text.contains("generation 1"), "{text}");
    ok(&store, &acme_new, &["get", "acme/a", &p(&back)]);
    assert!(std::fs::read(&back).unwrap() == pattern(5_000, 7));
    ok(&store, &acme_new, &["put", &p(&src), "acme/b"]);
    ok(&store, &bee_new, &["get", "bee/a", &p(&back)]);
    assert!(!obj(&store, &bee, &["stat", "bee/a"]).status.success());
    ok(&store, &cat, &["get", "cat/a", &p(&back)]);
    ok(&store, &cat, &["put", &p(&src), "cat/b"]);
    // The admin tenant cannot be revoked alone.
    let err = store.fails(&["store", "tenant", "revoke", "--tenant", "*"]);
    assert!(err.contains("rotate the cluster key"), "{err}");

    // The revocation survives a restart (the orchestrator stores it with
    // its table).
    store.stop();
    let store = Store::up(&d, &[]);
    let out = obj(&store, &acme_old, &["stat", "acme/a"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(revoked));
    ok(&store, &acme_new, &["stat", "acme/a"]);
    ok(&store, &cat, &["stat", "cat/b"]);
    assert_eq!(
        issue(&store, "acme", &dir.path().join("again.credential")),
        1
    );
}

#[test]
fn a_storage_node_added_to_a_running_cluster_takes_new_objects() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("cluster"), &["--replication", "1,1,1,1"]);
    let src = dir.path().join("o");
    std::fs::write(&src, pattern(1000, 2)).unwrap();
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
    let _add = Node(add); // killed on drop, even if an assertion fails
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
    use strata_store::auth::{unix_ms, ClusterKey, KEY_LEN};
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

/// A `strata store node add` process (a node of its own, so it can be
/// killed with SIGKILL), killed on drop.
struct Node(Child);

impl Node {
    fn add(store: &Store, dir: &Path, role: &str) -> Node {
        Node::add_with(store, dir, role, &[])
    }

    fn add_with(store: &Store, dir: &Path, role: &str, extra: &[&str]) -> Node {
        let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["store", "node", "add", "--cluster", &store.on.to_string()])
            .args(["--role", role, "--dir", &p(dir)])
            .args(extra)
            .env("STRATA_CLUSTER_KEY", store.key_path())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn strata store node add");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("strata store:"), "{line:?}");
        Node(child)
    }

    fn kill9(&mut self) {
        let _ = self.0.kill(); // SIGKILL
        let _ = self.0.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The reader and load threads of a test, and their stop flag.
type Clients = (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<(u64, Vec<String>)>,
    std::thread::JoinHandle<Load>,
);

/// Outcome of the load generator.
#[derive(Default)]
struct Load {
    acked: Vec<(String, usize)>,
    failed: Vec<(String, usize)>,
    gets: u64,
    get_failures: Vec<String>,
}

/// Posts objects and reads back acknowledged ones until `stop` is set.
fn run_load(on: SocketAddr, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Load {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let client = strata_store::client::Client::connect(on, admin(on))
            .await
            .unwrap();
        let mut load = Load::default();
        let mut i = 0usize;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            i += 1;
            let _ = client.refresh().await;
            let name = format!("load/{i:05}");
            let size = (i * 7919) % 200_000;
            let data = pattern(size, i as u64);
            match client
                .put(&name, size as u64, &mut data.as_slice(), &|_| {})
                .await
            {
                Ok(_) => load.acked.push((name, i)),
                Err(_) => load.failed.push((name, i)),
            }
            if let Some((name, seed)) = load.acked.get(i * 31 % load.acked.len().max(1)).cloned() {
                load.gets += 1;
                match client.get_bytes(&name).await {
                    Ok((_, bytes)) if bytes == pattern((seed * 7919) % 200_000, seed as u64) => {}
                    Ok(_) => load.get_failures.push(format!("{name}: wrong bytes")),
                    Err(e) => load.get_failures.push(format!("{name}: {e}")),
                }
            }
        }
        load
    })
}

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
    let _mn = Node::add(&store, &dir.path().join("mn-extra"), "mn");
    std::thread::sleep(Duration::from_millis(1500));
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
        let client = strata_store::client::Client::connect(on, admin(on))
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
    for i in 0..objects {
        let name = format!("rep/{i:02}");
        loop {
            let stat = store.json(&["obj", "stat", &name]);
            let replicas = stat["replicas"].as_array().unwrap().len();
            if replicas == 3 && on_dead(&stat) == 0 {
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
            if stat["replicas"].as_array().unwrap().len() == 3 && on_dead(&stat) == 0 {
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
        let client = strata_store::client::Client::connect(on, admin(on))
            .await
            .unwrap();
        for (name, data) in &all {
            let name = name.clone();
            let (record, bytes) = client.get_bytes(&name).await.unwrap();
            assert_eq!(&bytes, data, "{name} reads back");
            for &meta in &record.meta {
                let call = strata_store::client::Call::new(
                    strata_store::node::request_id(),
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

/// Replica file names held by the storage node stored in `dir`.
fn replica_names(dir: &Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(dir.join("replicas"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
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
    let pre: Vec<(String, strata_store::wire::Record)> = (0..60)
        .map(|i| {
            let name = format!("pre/{i:03}");
            let data = pattern(1000 + i, i as u64);
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
                let client = strata_store::client::Client::connect(on, admin(on))
                    .await
                    .unwrap();
                let (mut gets, mut failures) = (0u64, Vec::new());
                let mut lists = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (i, name) in names.iter().enumerate() {
                        gets += 1;
                        match client.get_bytes(name).await {
                            Ok((_, b)) if b == pattern(1000 + i, i as u64) => {}
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
        assert!(bytes == pattern(1000 + i, i as u64), "{name} differs");
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
    let moved: Vec<&(String, strata_store::wire::Record)> = pre
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
            Err(strata_store::Error::Remote { code, .. }) => assert!(
                matches!(
                    code,
                    strata_store::wire::Code::NotFound | strata_store::wire::Code::Deleted
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
    let data_of = |i: usize| pattern(500 + i * 13, i as u64 + 3);
    let pre: Vec<(String, strata_store::wire::Record)> = (0..60)
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
    let coordinated: Vec<&(String, strata_store::wire::Record)> = pre[..50]
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
        .map(|&i| (format!("pre/{i:03}"), pattern(500 + i * 13, i as u64 + 3)))
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
                    code: strata_store::wire::Code::Deleted,
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
            Err(strata_store::Error::Remote { code, .. }) => assert!(
                matches!(
                    code,
                    strata_store::wire::Code::NotFound | strata_store::wire::Code::Deleted
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
                    code: strata_store::wire::Code::Deleted,
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
    let on_home = |t: &strata_store::table::Table, name: &str| {
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
                        code: strata_store::wire::Code::Deleted,
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

/// The node directories of a cluster's storage nodes by node id: the
/// `sn-K` directories of `strata store up` and any in `extra`.
fn sn_dirs(store: &Store, extra: &[&Path]) -> std::collections::HashMap<u64, PathBuf> {
    (0..8)
        .map(|k| store.dir.join(format!("sn-{k}")))
        .chain(extra.iter().map(|d| d.to_path_buf()))
        .filter_map(|d| {
            let id = std::fs::read_to_string(d.join("node-id")).ok()?;
            Some((u64::from_str_radix(id.trim(), 16).ok()?, d))
        })
        .collect()
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
        .block_on(strata_store::node::fetch_table(store.on, None))
        .unwrap();
    let index_of = |uuid: u64| table.sns.iter().find(|s| s.uuid == uuid).unwrap().index;
    let extra_index = index_of(strata_store::node::node_uuid(&extra_dir).unwrap());
    let gone_uuid = strata_store::node::node_uuid(&store.dir.join("sn-0")).unwrap();
    let gone = index_of(gone_uuid);
    let on = |index: u16, r: &strata_store::wire::Record| {
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
        strata_store::node::node_uuid(&store.dir.join("sn-1")).unwrap()
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
        // Fresh objects may still be waiting for their third replica.
        let record = {
            let start = Instant::now();
            loop {
                let (record, bytes) = rt.block_on(client.get_bytes(name)).unwrap();
                assert!(bytes == *data, "{name} reads back wrong");
                if record.replicas.len() == 3 || start.elapsed() > Duration::from_secs(20) {
                    break record;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        };
        assert_eq!(record.replicas.len(), 3, "{name}: {record:?}");
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
    let uuid = strata_store::node::node_uuid(&extra_dir).unwrap();
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
        .block_on(strata_store::node::fetch_table(store.on, None))
        .unwrap();
    let index_of = |uuid: u64| table.sns.iter().find(|s| s.uuid == uuid).unwrap().index;
    let gone_uuid = strata_store::node::node_uuid(&store.dir.join("sn-0")).unwrap();
    let gone = index_of(gone_uuid);
    let gone_dir = store.dir.join("sn-0");
    let extra_index = index_of(strata_store::node::node_uuid(&extra_dir).unwrap());
    let on = |index: u16, r: &strata_store::wire::Record| {
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
        strata_store::node::node_uuid(&store.dir.join("sn-1")).unwrap()
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

/// Sends a GetTable sealed with `key` to the orchestrator; returns the
/// raw answer. Padded, so that a refusal (of a key the orchestrator does
/// not accept) is the whole refusal, not a request for padding.
fn sealed_table_ask(on: SocketAddr, key: &strata_store::auth::ClusterKey) -> Vec<u8> {
    let q = Msg::new(77, 0, Body::GetTable)
        .seal_padded(key, strata_store::auth::unix_ms(), 1200)
        .unwrap();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    sock.send_to(&q, on).unwrap();
    let mut buf = vec![0u8; 70_000];
    let (n, _) = sock.recv_from(&mut buf).expect("an answer");
    buf.truncate(n);
    buf
}

fn hangup(pid: u32) {
    // SAFETY: sending SIGHUP to our own child.
    unsafe {
        libc::kill(pid as i32, libc::SIGHUP);
    }
}

/// Waits until `strata store status --output json` shows the keyring
/// that `strata store key fingerprint` prints for the key file of `cdir`
/// for the orchestrator and every node, and checks that print against
/// `want` (the active key's fingerprint, then the other accepted one's).
fn every_node_shows_the_keys_of(store: &Store, cdir: &Path, want: (u64, Option<u64>)) {
    let hex = |fp: u64| format!("{fp:016x}");
    let out = strata_ok(&[
        "store",
        "key",
        "fingerprint",
        "--dir",
        &p(cdir),
        "--output",
        "json",
    ]);
    let printed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        printed,
        serde_json::json!({"active": hex(want.0), "other": want.1.map(hex)}),
        "{out}"
    );
    let human = strata_ok(&["store", "key", "fingerprint", "--dir", &p(cdir)]);
    assert!(
        human.contains(&format!("active {}", hex(want.0))),
        "{human}"
    );
    let mut last = serde_json::Value::Null;
    wait_until("every node shows the expected key fingerprints", || {
        last = store.status();
        let nodes = ["metadata_nodes", "storage_nodes"]
            .iter()
            .flat_map(|k| last[*k].as_array().cloned().unwrap_or_default())
            .collect::<Vec<_>>();
        !nodes.is_empty()
            && last["orchestrator_key"] == printed
            && nodes.iter().all(|n| n["key"] == printed)
    });
    let text = store.ok(&["store", "status"]);
    let shown = match want.1 {
        Some(o) => format!("key {}+{}", hex(want.0), hex(o)),
        None => format!("key {}", hex(want.0)),
    };
    assert!(
        text.lines()
            .filter(|l| l.starts_with("mn ") || l.starts_with("sn "))
            .all(|l| l.ends_with(&shown)),
        "{text}"
    );
}

#[test]
fn the_cluster_key_is_rotated_in_three_reloads_under_load_without_a_failed_request() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use strata_store::auth::{open_answer, unix_ms, ClusterKey};
    let dir = tmp();
    let cdir = dir.path().join("cluster");
    let store = Store::up(
        &cdir,
        &["--mn", "2", "--sn", "2", "--replication", "2,2,2,2"],
    );
    // A storage node in a process of its own, with the same key files.
    let node = Node::add(&store, &cdir.join("sn-added"), "sn");
    store.wait_for_nodes("storage", 3);
    let added = store.status()["storage_nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .nth(2)
        .unwrap();
    let pids = [store.child.as_ref().unwrap().id(), node.0.id()];
    let mut before = Vec::new();
    for i in 0..6usize {
        let data = pattern(1000 + i * 50_000, i as u64);
        let src = dir.path().join(format!("in-{i}"));
        std::fs::write(&src, &data).unwrap();
        let name = format!("rot/{i}");
        store.ok(&["obj", "put", &p(&src), &name]);
        before.push((name, data));
    }
    let old_file = dir.path().join("old.key");
    std::fs::copy(store.key_path(), &old_file).unwrap();
    let old = ClusterKey::load(&old_file).unwrap();
    let old_fp = old.fingerprints().active;
    every_node_shows_the_keys_of(&store, &cdir, (old_fp, None));
    // Tenants' credentials are derived from the key: the clients run
    // with the admin credential of the old key until step 3, then with
    // the one `strata store up` issued again on its step-2 reload.
    let old_admin = admin(store.on);
    let start_clients = || {
        let stop = Arc::new(AtomicBool::new(false));
        let reader = spawn_reader(store.on, stop.clone(), before.clone());
        let load = {
            let stop = stop.clone();
            let on = store.on;
            std::thread::spawn(move || run_load(on, stop))
        };
        (stop, reader, load)
    };
    let check_clients = |(stop, reader, load): Clients| {
        stop.store(true, Ordering::Relaxed);
        let load = load.join().unwrap();
        let (gets, failures) = reader.join().unwrap();
        assert!(
            failures.is_empty(),
            "{} of {gets} Gets failed: {failures:?}",
            failures.len()
        );
        assert!(
            load.failed.is_empty() && load.get_failures.is_empty(),
            "{} of {} Puts and {} of {} Gets failed: {:?} {:?}",
            load.failed.len(),
            load.failed.len() + load.acked.len(),
            load.get_failures.len(),
            load.gets,
            load.failed,
            load.get_failures
        );
        assert!(
            load.acked.len() > 5 && gets > 5,
            "{} {gets}",
            load.acked.len()
        );
        load
    };
    let clients = start_clients();
    let under_load = || std::thread::sleep(Duration::from_millis(1500));
    under_load();

    // 1: a new key, accepted everywhere, used nowhere.
    let out = strata_ok(&["store", "key", "new", "--dir", &p(&cdir)]);
    assert!(out.contains("cluster.key.next"), "{out}");
    let new = ClusterKey::load(&cdir.join("cluster.key.next")).unwrap();
    let new_fp = new.fingerprints().active;
    assert_ne!(new_fp, old_fp);
    // A second `new` does not overwrite it.
    let out = strata(&["store", "key", "new", "--dir", &p(&cdir)]);
    assert!(!out.status.success());
    for pid in pids {
        hangup(pid);
    }
    wait_until("the orchestrator accepts the new key", || {
        open_answer(&sealed_table_ask(store.on, &new), None, 0)
            .is_some_and(|m| matches!(m.body, Body::Table { .. }))
    });
    // Still sealing with the old key.
    assert!(open_answer(&sealed_table_ask(store.on, &old), Some(&old), unix_ms()).is_some());
    // Every node says so before the next step.
    every_node_shows_the_keys_of(&store, &cdir, (old_fp, Some(new_fp)));
    under_load();

    // 2: swapped, one process after the other: the added node seals with
    // the new key while the others still seal (and issue tickets) with
    // the old one.
    strata_ok(&["store", "key", "swap", "--dir", &p(&cdir)]);
    assert!(cdir.join("cluster.key.prev").exists() && !cdir.join("cluster.key.next").exists());
    hangup(pids[1]);
    under_load();
    hangup(pids[0]);
    wait_until("the orchestrator seals with the new key", || {
        let answer = sealed_table_ask(store.on, &old);
        open_answer(&answer, Some(&new), unix_ms())
            .is_some_and(|m| matches!(m.body, Body::Table { .. }))
    });
    every_node_shows_the_keys_of(&store, &cdir, (new_fp, Some(old_fp)));
    under_load();
    // The admin credential was issued again with the new key; clients
    // switch to it before step 3 (as every tenant must).
    wait_until("the admin credential issued with the new key", || {
        admin(store.on).secret_bytes() != old_admin.secret_bytes()
    });
    let mut acked = check_clients(clients).acked;
    let clients = start_clients();
    under_load();

    // 3: the old key is gone.
    std::fs::remove_file(cdir.join("cluster.key.prev")).unwrap();
    for pid in pids {
        hangup(pid);
    }
    wait_until("the orchestrator refuses the old key", || {
        let answer = Msg::decode(&sealed_table_ask(store.on, &old)).unwrap();
        matches!(answer.body, Body::Error { .. })
    });
    every_node_shows_the_keys_of(&store, &cdir, (new_fp, None));
    under_load();
    let mut load = check_clients(clients);
    acked.append(&mut load.acked);
    load.acked = acked;
    // A credential of the old key is refused now, saying what to do.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stale = rt
        .block_on(strata_store::client::Client::connect(store.on, old_admin))
        .unwrap();
    let err = rt
        .block_on(stale.get_bytes("rot/0"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("issue it again"), "{err}");
    // Everything reads back.
    let (rt, client) = connect_client(store.on);
    for (name, want) in &before {
        assert_eq!(
            &rt.block_on(client.get_bytes(name)).unwrap().1,
            want,
            "{name}"
        );
    }
    for (name, seed) in &load.acked {
        let want = pattern((seed * 7919) % 200_000, *seed as u64);
        assert_eq!(
            rt.block_on(client.get_bytes(name)).unwrap().1,
            want,
            "{name}"
        );
    }
    // A control request sealed with the old key is refused, clearly; with
    // the new one it works.
    let err = store.fails(&["store", "node", "remove", "--key", &p(&old_file), &added]);
    assert!(err.contains("does not match"), "{err}");
    assert_eq!(store.status()["storage_nodes"][2]["state"], "up");
    let out = store.ok(&["store", "node", "remove", &added]);
    assert!(out.contains("retir"), "{out}");
}

/// The endpoint of the first node of `kind` ("metadata" or "storage")
/// in the status.
fn first_endpoint(store: &Store, kind: &str) -> SocketAddr {
    store.status()[format!("{kind}_nodes")][0]["endpoint"]
        .as_str()
        .expect("an endpoint in the status")
        .parse()
        .expect("a socket address")
}

/// Replies read from `sock` until it has none for a while: each is
/// checked against the length of the request of its request id in
/// `sent` (`(request id, length)`); returns their bodies.
fn drain_replies(sock: &UdpSocket, sent: &[(u64, usize)], wait: Duration) -> Vec<Body> {
    sock.set_read_timeout(Some(wait)).unwrap();
    let mut buf = vec![0u8; 70_000];
    let mut bodies = Vec::new();
    while let Ok((n, _)) = sock.recv_from(&mut buf) {
        let reply = Msg::decode(&buf[..n]).expect("a decodable reply");
        let asked = sent
            .iter()
            .find(|(req, _)| *req == reply.req)
            .unwrap_or_else(|| panic!("a reply to no request: {reply:?}"));
        assert!(
            n <= asked.1,
            "a {}-byte unauthenticated datagram was answered with {n} bytes: {reply:?}",
            asked.1
        );
        bodies.push(reply.body);
    }
    bodies
}

/// No reflection amplification: every request kind, sent unauthenticated
/// (unsealed, with a node's or a tenant's seal that fails, or no message
/// at all) to the orchestrator and to a metadata node, gets an answer no
/// longer than itself, or none. A table request, the one the orchestrator
/// takes unsealed, gets the table once padded to its length.
#[test]
fn no_unauthenticated_datagram_gets_a_longer_answer() {
    use strata_store::auth::{unix_ms, ClusterKey, KEY_LEN};
    use strata_store::wire::HEADER_LEN;
    let dir = tmp();
    let store = Store::up(&dir.path().join("cluster"), REPLICATED);
    let mn = first_endpoint(&store, "metadata");
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();

    // The issue's case: a bare 28-byte table request was answered with the
    // whole table (863 bytes). Now nothing comes back.
    let bare = Msg::new(1, 0, Body::GetTable).encode().unwrap();
    assert_eq!(bare.len(), HEADER_LEN);
    sock.send_to(&bare, store.on).unwrap();
    assert!(drain_replies(&sock, &[(1, bare.len())], Duration::from_millis(500)).is_empty());
    // Padded as the keyless client pads it, the table comes, no longer
    // than the request.
    let table_len = match udp_ask(
        store.on,
        &Msg::new(2, 0, Body::GetTable).encode_padded(64).unwrap(),
    )
    .body
    {
        Body::Table { bytes } => bytes.len(),
        other => panic!("no table: {other:?}"),
    };
    assert!(table_len > 500, "a table of {table_len} bytes");

    // Every kind byte, unsealed and flagged as sealed by a node or by a
    // tenant, with bodies of zeros of several lengths; real requests
    // unsealed and sealed with keys that are not the cluster's.
    let stranger = ClusterKey::from_bytes(&[0x11; KEY_LEN]);
    let forged = TenantCredential::issue(&stranger, "acme").unwrap();
    let mut datagrams = Vec::new();
    for kind in 0u8..64 {
        for flag in [0u8, 0x80, 0x40] {
            for body in [0usize, 8, 40, 300] {
                let mut b = bare.clone();
                b[3] = kind | flag;
                b.resize(HEADER_LEN + body, 0);
                datagrams.push(b);
            }
        }
    }
    let requests = [
        Body::GetTable,
        Body::Get {
            name: "acme/a".into(),
        },
        Body::PostBegin {
            name: "acme/a".into(),
            size: 10,
        },
        Body::List {
            prefix: String::new(),
            after: String::new(),
            limit: 1000,
        },
        Body::Retire { uuid: 1 },
        Body::PutAbandoned { replica: 1 },
    ];
    for body in requests {
        let msg = Msg::new(0, 0, body);
        datagrams.push(msg.encode().unwrap());
        datagrams.push(msg.seal(&stranger, unix_ms()).unwrap());
        datagrams.push(msg.seal_tenant(&forged, unix_ms()).unwrap());
    }
    let mut sent = Vec::new();
    let mut bodies = Vec::new();
    let mut req = 1000u64;
    for to in [store.on, mn] {
        for d in &datagrams {
            // A request id of its own (it is not covered by any valid seal).
            let mut d = d.clone();
            req += 1;
            d[4..12].copy_from_slice(&req.to_be_bytes());
            sock.send_to(&d, to).unwrap();
            sent.push((req, d.len()));
            if sent.len() % 32 == 0 {
                bodies.extend(drain_replies(&sock, &sent, Duration::from_millis(5)));
            }
        }
    }
    bodies.extend(drain_replies(&sock, &sent, Duration::from_millis(1000)));
    let pads = bodies
        .iter()
        .filter(|b| matches!(b, Body::PadTo { .. }))
        .count();
    let refusals = bodies
        .iter()
        .filter(|b| matches!(b, Body::Error { .. }))
        .count();
    assert!(
        pads > 100 && refusals > 50,
        "{} datagrams sent, {} answers: {pads} PadTo, {refusals} errors",
        sent.len(),
        bodies.len()
    );
    // Datagrams that are no message, each on a socket of its own (their
    // request id is whatever their bytes hold).
    for len in [0usize, 1, 3, 4, 12, 27, 28, 31, 32, 40, 200] {
        for to in [store.on, mn] {
            let own = UdpSocket::bind("127.0.0.1:0").unwrap();
            own.send_to(&vec![0xee; len], to).unwrap();
            let req = if len >= 12 {
                u64::from_be_bytes([0xee; 8])
            } else {
                0
            };
            drain_replies(&own, &[(req, len)], Duration::from_millis(100));
        }
    }
    // The nodes still serve.
    let src = dir.path().join("o");
    std::fs::write(&src, pattern(3000, 3)).unwrap();
    store.ok(&["obj", "put", &p(&src), "after"]);
    store.ok(&["obj", "stat", "after"]);
}

/// A client killed mid-Put (its data connection closed by the kernel)
/// leaves no lock behind: the storage node tells the coordinator, which
/// drops the Post at once, so another Put of the name succeeds within a
/// couple of seconds (not at the data deadline, minutes away for this
/// size).
#[test]
fn a_killed_client_s_name_is_free_for_the_next_put_at_once() {
    let dir = tmp();
    let cluster = dir.path().join("cluster");
    let store = Store::up(&cluster, &[]);
    // 8 GiB, sparse: the client streams it for long enough to be killed
    // in the middle.
    let big = dir.path().join("big");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(8 << 30)
        .unwrap();
    let mut client = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["obj", "put", &p(&big), "locked/name"])
        .args(["--cluster", &store.on.to_string()])
        .env(CREDENTIAL_ENV, cluster.join(ADMIN_CREDENTIAL_FILE))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn strata obj put");
    // The storage node's temporary file holds data: the Put is under way.
    let tmp_dir = cluster.join("sn-0").join("tmp");
    let receiving = || {
        std::fs::read_dir(&tmp_dir).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.metadata().is_ok_and(|m| m.len() > 4096))
        })
    };
    let start = Instant::now();
    while !receiving() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the Put's data never reached the storage node"
        );
        assert!(
            client.try_wait().unwrap().is_none(),
            "the client ended early"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    client.kill().expect("SIGKILL the client");
    client.wait().unwrap();
    let killed = Instant::now();
    let src = dir.path().join("small");
    std::fs::write(&src, pattern(5000, 9)).unwrap();
    loop {
        let out = store.run(&["obj", "put", &p(&src), "locked/name"]);
        if out.status.success() {
            break;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            killed.elapsed() < Duration::from_secs(3),
            "the name is still locked {:?} after the client was killed: {err}",
            killed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("the name was free {:?} after the kill", killed.elapsed());
    let back = dir.path().join("back");
    store.ok(&["obj", "get", "locked/name", &p(&back)]);
    assert!(std::fs::read(&back).unwrap() == pattern(5000, 9));
    // The half-written replica is gone.
    wait_until("the temporary replica removed", || !receiving());
}

/// The data port closes a connection that sends part of a request header
/// (or nothing) once the read timeout passes, and keeps no more than its
/// connection cap open: one more is closed at once.
#[test]
fn a_data_connection_that_stalls_is_closed_and_the_port_has_a_cap() {
    let dir = tmp();
    let store = Store::up(
        &dir.path().join("cluster"),
        &["--data-timeout-ms", "700", "--data-max-connections", "2"],
    );
    let sn = first_endpoint(&store, "storage");
    let opened = Instant::now();
    let mut stalled = TcpStream::connect(sn).unwrap();
    stalled.write_all(b"S6").unwrap();
    let mut idle = TcpStream::connect(sn).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // Beyond the cap: closed as soon as accepted.
    let mut third = TcpStream::connect(sn).unwrap();
    third
        .set_read_timeout(Some(Duration::from_millis(400)))
        .unwrap();
    let closed = match third.read(&mut [0u8; 16]) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    };
    assert!(closed, "a connection beyond the cap was kept");
    // The two within the cap are closed at the timeout, not before.
    for (what, s) in [("2 bytes", &mut stalled), ("nothing", &mut idle)] {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = s.read(&mut [0u8; 16]);
        let after = opened.elapsed();
        assert!(
            matches!(n, Ok(0))
                || n.as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "a connection that sent {what} was not closed: {n:?} after {after:?}"
        );
        assert!(
            after >= Duration::from_millis(650) && after < Duration::from_secs(3),
            "a connection that sent {what} was closed after {after:?} (timeout 700 ms)"
        );
    }
    // Their slots are free again: objects go in and out.
    let src = dir.path().join("o");
    std::fs::write(&src, pattern(10_000, 4)).unwrap();
    store.ok(&["obj", "put", &p(&src), "after"]);
    let back = dir.path().join("back");
    store.ok(&["obj", "get", "after", &p(&back)]);
    assert!(std::fs::read(&back).unwrap() == pattern(10_000, 4));
}

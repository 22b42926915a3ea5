//! The object store run as real processes on loopback (mapped mode):
//! `strata store up` with 3 metadata and 4 storage nodes, driven by the
//! `strata obj` commands and by hand-made hostile UDP and TCP messages.
//!
//! The harness (`Store`, `Node`) is in `common::store`; the tests are
//! split by concern into the modules below.

mod erasure;
mod failures;
mod group_commit;
mod hostile;
mod inline;
mod membership;
mod nami;
mod objects;
mod ranges;
mod rs3;
mod scrub;
mod tenants;
mod zero_copy;

use crate::common::store::{
    admin, as_admin, file_of_address, wait_until, wait_until_long, Node, Store,
};
use crate::common::{p, pattern, strata, strata_ok, tmp};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use strata_store_protocol::data::{Credential, Request};
use strata_store_protocol::tenant::{TenantCredential, ADMIN_CREDENTIAL_FILE, CREDENTIAL_ENV};
use strata_store_protocol::wire::{Body, Msg};

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
            let client = strata_store_client::client::Client::connect(on, admin(on))
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

/// A runtime on this thread and a client of the cluster at `on`.
fn connect_client(
    on: SocketAddr,
) -> (tokio::runtime::Runtime, strata_store_client::client::Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt
        .block_on(strata_store_client::client::Client::connect(on, admin(on)))
        .unwrap();
    (rt, client)
}

/// The runtime of a test's concurrent clients: two workers, as the
/// machine has two cores.
fn load_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Asks the node that `table` says owns metadata address `addr` for the
/// copy of `name` kept there; returns that node and its answer.
fn ask_copy(
    credential: &TenantCredential,
    table: &strata_store_protocol::table::Table,
    addr: strata_store_protocol::addr::Addr,
    name: &str,
) -> (SocketAddr, Body) {
    let to = table.mn_endpoint(addr).expect("an owner for the address");
    let q = Msg::new(96, addr, Body::Get { name: name.into() });
    let bytes = q
        .seal_tenant(credential, strata_store_protocol::auth::unix_ms())
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
    b.extend_from_slice(&strata_store_protocol::auth::unix_ms().to_be_bytes());
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
    use strata_store_protocol::wire::{SEAL_LEN, TENANT_SEAL_FIXED};
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
    let rt = load_runtime();
    rt.block_on(async move {
        let client = strata_store_client::client::Client::connect(on, admin(on))
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

/// Sends a GetTable sealed with `key` to the orchestrator; returns the
/// raw answer. Padded, so that a refusal (of a key the orchestrator does
/// not accept) is the whole refusal, not a request for padding.
fn sealed_table_ask(on: SocketAddr, key: &strata_store_protocol::auth::ClusterKey) -> Vec<u8> {
    let q = Msg::new(77, 0, Body::GetTable)
        .seal_padded(key, strata_store_protocol::auth::unix_ms(), 1200)
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

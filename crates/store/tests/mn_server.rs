//! The threads that serve a process's metadata nodes
//! (`strata_store::metadata::server::MnServer`): one leader polls every node's socket,
//! serves Gets in batches across sockets and spins briefly under a steady
//! load; nodes must still answer every request and stop promptly.

use std::collections::HashSet;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_store::bench::{object_name, run, run_batched_gets, BenchConfig, Workload};
use strata_store::cluster::{Cluster, ClusterConfig};
use strata_store_client::client::Client;
use strata_store_protocol::table::{Params, Table};
use strata_store_protocol::tenant::{TenantCredential, ADMIN};
use strata_store_protocol::wire::{Body, Msg};

/// A cluster of three metadata nodes (each name's metadata on all three:
/// Posts make nodes talk to each other) and three storage nodes.
async fn three_nodes(dir: &std::path::Path) -> (Cluster, TenantCredential) {
    let mut cfg = ClusterConfig::embedded(dir.to_path_buf());
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.mns = 3;
    cfg.mn_slots = 3;
    cfg.sns = 3;
    cfg.params = Params {
        n_m: 3,
        w_m: 2,
        n_d: 1,
        w_d: 1,
        data_fragments: 0,
    };
    let cluster = Cluster::start(cfg).await.unwrap();
    let cred = TenantCredential::issue(&cluster.key, ADMIN).unwrap();
    (cluster, cred)
}

fn config(workload: Workload, threads: usize, ops: usize, passes: usize) -> BenchConfig {
    BenchConfig {
        threads,
        ops,
        passes,
        size: 0,
        prefix: "bench".into(),
        workload,
    }
}

/// The metadata node a batched Get of `name` asks (the first address).
fn first_node(table: &Table, name: &str) -> SocketAddr {
    table.mn_endpoint(table.meta_addrs(name)[0]).unwrap()
}

/// Asks `to` for `name` with a sealed Get and returns the answer.
fn get_from(to: SocketAddr, table: &Table, cred: &TenantCredential, name: &str) -> Msg {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let msg = Msg::new(
        7,
        table.meta_addrs(name)[0],
        Body::Get { name: name.into() },
    );
    let mut buf = vec![0u8; 65536];
    for _ in 0..10 {
        let bytes = msg
            .seal_tenant(cred, strata_store_protocol::auth::unix_ms())
            .unwrap();
        sock.send_to(&bytes, to).unwrap();
        if let Ok(n) = sock.recv(&mut buf) {
            return Msg::decode(&buf[..n]).unwrap();
        }
    }
    panic!("{to} did not answer a Get of {name:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_answers_every_batched_get_across_three_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, cred) = three_nodes(dir.path()).await;
    let client = Arc::new(Client::connect(cluster.on, cred.clone()).await.unwrap());
    let posted = run(client.clone(), config(Workload::Post, 25, 12, 1))
        .await
        .unwrap();
    assert_eq!((posted.ops, posted.errors), (300, 0));
    let table = client.table();
    // The requests go to every node: batches span the three sockets.
    let nodes: HashSet<SocketAddr> = (0..25)
        .flat_map(|t| (0..12).map(move |i| (t, i)))
        .map(|(t, i)| first_node(&table, &object_name("bench", 0, t, i)))
        .collect();
    assert_eq!(nodes.len(), 3, "the names should spread over the nodes");
    // 25 clients, one request in flight each, 60,000 Gets: every one must
    // be answered (a lost answer costs a 500 ms resend; five make an
    // error), spin or no spin.
    let cfg = config(Workload::Get, 25, 12, 200);
    let started = Instant::now();
    let got = tokio::task::spawn_blocking(move || run_batched_gets(&table, &cred, &cfg))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((got.ops, got.errors), (60_000, 0));
    // Not one resend: each would have cost 500 ms.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_node_frees_its_port_at_once_and_the_others_keep_answering() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cluster, cred) = three_nodes(dir.path()).await;
    let client = Arc::new(Client::connect(cluster.on, cred.clone()).await.unwrap());
    run(client.clone(), config(Workload::Post, 5, 20, 1))
        .await
        .unwrap();
    let table = client.table();
    let endpoint = cluster.mns.last().unwrap().endpoint;
    // The names the other two nodes answer for.
    let names: Vec<(String, SocketAddr)> = (0..5)
        .flat_map(|t| (0..20).map(move |i| object_name("bench", 0, t, i)))
        .map(|n| {
            let to = first_node(&table, &n);
            (n, to)
        })
        .filter(|(_, to)| *to != endpoint)
        .collect();
    assert!(!names.is_empty());
    // Gets to the others while the node stops: the leader is serving (and
    // spinning) when the stop comes.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (t2, c2, s2) = (table.clone(), cred.clone(), stop.clone());
    let load = std::thread::spawn(move || {
        let mut answered = 0u64;
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            for (name, to) in &names {
                match get_from(*to, &t2, &c2, name).body {
                    Body::Found { record, .. } => assert_eq!(&record.name, name),
                    other => panic!("{name:?}: {other:?}"),
                }
                answered += 1;
            }
        }
        answered
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopped = cluster.mns.pop().unwrap();
    let t0 = Instant::now();
    drop(stopped);
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(500), "stopping took {took:?}");
    // Its socket is closed: the port can be bound again.
    UdpSocket::bind(endpoint).expect("the stopped node's port is free");
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered = tokio::task::spawn_blocking(move || load.join().unwrap())
        .await
        .unwrap();
    assert!(answered > 0);
}

//! A metadata node's serving thread spins only under a steady load: once
//! the requests stop, it sleeps. (A file of its own: it measures the CPU
//! time of the process's metadata threads, which other tests' clusters
//! would share.)

use std::sync::Arc;
use std::time::Duration;
use strata_store::bench::{run, run_batched_gets, BenchConfig, Workload};
use strata_store::cluster::{Cluster, ClusterConfig};
use strata_store_client::client::Client;
use strata_store_protocol::tenant::{TenantCredential, ADMIN};

/// CPU time (user + system, clock ticks) of this process's threads whose
/// name starts with `strata-mn`.
fn mn_ticks() -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("strata-mn") {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        total += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_stops_spinning_when_the_load_stops() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ClusterConfig::embedded(dir.path().to_path_buf());
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.mns = 3;
    cfg.mn_slots = 3;
    cfg.sns = 1;
    let cluster = Cluster::start(cfg).await.unwrap();
    let cred = TenantCredential::issue(&cluster.key, ADMIN).unwrap();
    let client = Arc::new(Client::connect(cluster.on, cred.clone()).await.unwrap());
    let bench = |workload, passes| BenchConfig {
        threads: 10,
        ops: 10,
        passes,
        size: 0,
        prefix: "bench".into(),
        workload,
    };
    run(client.clone(), bench(Workload::Post, 1)).await.unwrap();
    let table = client.table();
    let cfg = bench(Workload::Get, 500);
    let before = mn_ticks();
    let got = tokio::task::spawn_blocking(move || run_batched_gets(&table, &cred, &cfg))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((got.ops, got.errors), (50_000, 0));
    assert!(mn_ticks() > before, "the metadata threads were measured");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Idle for two seconds: ticks and table refreshes only. A thread that
    // kept spinning would use about a core (200 ticks at 100 Hz).
    let idle = mn_ticks();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = mn_ticks() - idle;
    assert!(
        used < 40,
        "the metadata threads used {used} ticks while idle"
    );
}

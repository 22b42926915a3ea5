//! The storage nodes' scrub in a real cluster in this process: a byte
//! flipped in a replica file is found, counted and reported, and the
//! metadata node repairs the record; the counters a node shows say so.

use std::time::Duration;
use strata_store::cluster::{Cluster, ClusterConfig};
use strata_store::storage::scrub::ScrubConfig;
use strata_store_client::client::Client;
use strata_store_protocol::table::Params;
use strata_store_protocol::tenant::{TenantCredential, ADMIN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_replica_is_counted_reported_and_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ClusterConfig::embedded(dir.path().to_path_buf());
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.sns = 3;
    cfg.params = Params {
        n_m: 1,
        w_m: 1,
        n_d: 2,
        w_d: 2,
        data_fragments: 0,
    };
    cfg.scrub = ScrubConfig::at_rate(32 << 20, Duration::from_millis(200));
    let cluster = Cluster::start(cfg).await.unwrap();
    let credential = TenantCredential::issue(&cluster.key, ADMIN).unwrap();
    let client = Client::connect(cluster.on, credential).await.unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    client
        .put("s/obj", data.len() as u64, &mut data.as_slice(), &|_| {})
        .await
        .unwrap();
    let before = client.stat("s/obj").await.unwrap();
    assert_eq!(before.replicas.len(), 2);
    let bad = before.replicas[1];
    let name = format!("{bad:032x}");
    let file = (0..3)
        .map(|k| dir.path().join(format!("sn-{k}/replicas/{name}")))
        .find(|p| p.exists())
        .expect("the replica's file");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[20 + 5_000] ^= 1;
    std::fs::write(&file, bytes).unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let after = loop {
        let record = client.stat("s/obj").await.unwrap();
        if !record.replicas.contains(&bad) && !file.exists() {
            break record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not repaired: {record:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(after.replicas.len(), 2);
    assert_eq!(after.replicas[0], before.replicas[0]);
    assert!(after.version > before.version);
    let (_, got) = client.get_bytes("s/obj").await.unwrap();
    assert_eq!(got, data);
    // The node that held it counted the damage and the report; every
    // node counted its passes.
    let stats: Vec<_> = cluster.sns.iter().map(|s| s.scrub_stats()).collect();
    let found: Vec<_> = stats.iter().filter(|s| s.damaged > 0).collect();
    assert_eq!(found.len(), 1, "{stats:?}");
    assert!(found[0].reports_sent >= 1, "{stats:?}");
    for s in &stats {
        assert!(s.passes >= 1 && s.last_pass_unix_ms.is_some(), "{s:?}");
        assert!(s.total_replicas >= s.pass_replicas, "{s:?}");
    }
    assert!(stats.iter().map(|s| s.total_bytes).sum::<u64>() >= 2 * data.len() as u64);
}

//! The operator's requests of the client crate (`strata_store_client::admin`)
//! against a real cluster: each changes the table the orchestrator
//! publishes, and a request sealed with another key changes nothing.

use strata_store::cluster::{Cluster, ClusterConfig};
use strata_store_client::admin::{cancel_retire, retire, revoke_tenant};
use strata_store_client::transport::fetch_table;
use strata_store_protocol::auth::{ClusterKey, KEY_LEN};
use strata_store_protocol::table::Params;

async fn two_storage_nodes(dir: &std::path::Path) -> Cluster {
    let mut cfg = ClusterConfig::embedded(dir.to_path_buf());
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.sns = 2;
    cfg.params = Params {
        n_m: 1,
        w_m: 1,
        n_d: 1,
        w_d: 1,
        data_fragments: 0,
    };
    Cluster::start(cfg).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retire_cancel_and_revoke_change_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = two_storage_nodes(dir.path()).await;
    let (on, key) = (cluster.on, cluster.key.clone());
    let table = fetch_table(on, Some(&key)).await.unwrap();
    let sn = table.sns[0].clone();
    assert!(!table.retiring(sn.index));

    retire(on, &key, sn.uuid).await.unwrap();
    let table = fetch_table(on, Some(&key)).await.unwrap();
    assert!(table.retiring(sn.index), "retire did not start a drain");
    cancel_retire(on, &key, sn.uuid).await.unwrap();
    let table = fetch_table(on, Some(&key)).await.unwrap();
    assert!(!table.retiring(sn.index), "cancel did not end the drain");
    // Cancelling again is no error: a resent request must not fail.
    cancel_retire(on, &key, sn.uuid).await.unwrap();

    assert_eq!(table.min_generation("acme"), 0);
    assert_eq!(revoke_tenant(on, &key, "acme", 1).await.unwrap(), 1);
    let table = fetch_table(on, Some(&key)).await.unwrap();
    assert_eq!(table.min_generation("acme"), 1);
    // A resend changes nothing; generation 0 is refused with its reason.
    assert_eq!(revoke_tenant(on, &key, "acme", 1).await.unwrap(), 1);
    let err = revoke_tenant(on, &key, "acme", 0).await.unwrap_err();
    assert!(err.to_string().contains("revokes nothing"), "{err}");

    // Sealed with a key that is not the cluster's: refused, no answer
    // taken, nothing changed.
    let stranger = ClusterKey::from_bytes(&[9; KEY_LEN]);
    assert!(revoke_tenant(on, &stranger, "acme", 2).await.is_err());
    assert!(retire(on, &stranger, sn.uuid).await.is_err());
    let table = fetch_table(on, Some(&key)).await.unwrap();
    assert_eq!(table.min_generation("acme"), 1);
    assert!(!table.retiring(sn.index));
}

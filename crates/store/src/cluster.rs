//! A whole cluster in one process (`strata store up`): the orchestrator,
//! `mns` metadata nodes and `sns` storage nodes, each with its own
//! directory under `dir`, in mapped mode on loopback. The cluster key
//! ([`strata_store_protocol::auth`]) is `dir/cluster.key`, made on the first start.

use crate::metadata::server::{start_mn_on, MnHandle, MnServer};
use crate::orchestrator::server::run_on;
use crate::orchestrator::state::OnCore;
use crate::storage::server::{start_sn, SnHandle};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use strata_store_client::transport::fetch_table;
use strata_store_protocol::addr::{Layout, DEFAULT_CLUSTER_PREFIX};
use strata_store_protocol::auth::{ClusterKey, KEY_FILE};
use strata_store_protocol::table::{Device, Params, State, Table};
use strata_store_protocol::Error;
use tokio::net::UdpSocket;

/// How to start a cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Directory holding every node's state.
    pub dir: PathBuf,
    /// The orchestrator's UDP endpoint (clients connect here).
    pub listen: SocketAddr,
    /// Metadata nodes started in this process.
    pub mns: u16,
    /// Metadata slots of a new cluster (at least `mns`; the others are
    /// filled by metadata nodes that join with `strata store node add`).
    pub mn_slots: u16,
    /// Storage nodes started in this process.
    pub sns: u16,
    /// Cluster-wide replication (a new cluster only).
    pub params: Params,
    /// Per-bucket replication overrides (a new cluster only).
    pub buckets: Vec<(String, Params)>,
    /// log2 of the number of metadata groups (a new cluster only).
    pub mg_bits: u8,
    /// Capacity each storage node declares.
    pub sn_capacity: u64,
    /// Device type of the storage nodes.
    pub device: Device,
    /// Short-failure timer (ms).
    pub short_failure_ms: u64,
    /// Definitive-failure timer of storage nodes, in ms: past it their
    /// replicas are re-created elsewhere.
    pub definitive_failure_ms: u64,
    /// Collection of unreferenced replicas on the storage nodes.
    pub gc: crate::storage::replicas::GcConfig,
    /// The storage nodes' background scrub of their replicas.
    pub scrub: crate::storage::scrub::ScrubConfig,
    /// Limits of the storage nodes' data ports.
    pub data_limits: crate::storage::replicas::DataLimits,
    /// RS3 on the storage nodes.
    pub schedule: crate::storage::schedule::config::ScheduleConfig,
    /// Pause between two anti-entropy passes of each metadata node over
    /// the metadata copies of the names it coordinates, in ms (0: none).
    pub metadata_sync_ms: u64,
    /// Routed mode (a new cluster only): messages go to object and
    /// metadata addresses, which the network routes to each node's prefix.
    pub routed: bool,
    /// In routed mode, whether the nodes keep this host's routes in step
    /// with the table (`ip -6 route`, needs `CAP_NET_ADMIN`).
    pub keep_routes: bool,
    /// The cluster key's file (`None`: `dir/cluster.key`); made, with a
    /// new random key, if missing.
    pub key: Option<PathBuf>,
}

impl ClusterConfig {
    /// Defaults for a single-node embedded cluster in `dir`.
    pub fn embedded(dir: PathBuf) -> ClusterConfig {
        ClusterConfig {
            dir,
            listen: SocketAddr::from(([127, 0, 0, 1], 10890)),
            mns: 1,
            mn_slots: 1,
            sns: 1,
            params: Params::default(),
            buckets: Vec::new(),
            mg_bits: 8,
            sn_capacity: 1 << 40,
            device: Device::Ssd,
            short_failure_ms: crate::orchestrator::state::SHORT_FAILURE_MS,
            definitive_failure_ms: crate::orchestrator::state::DEFINITIVE_FAILURE_MS,
            gc: crate::storage::replicas::GcConfig::default(),
            scrub: crate::storage::scrub::ScrubConfig::default(),
            data_limits: crate::storage::replicas::DataLimits::default(),
            schedule: crate::storage::schedule::config::ScheduleConfig::default(),
            metadata_sync_ms: crate::metadata::state::DEFAULT_SYNC_MS,
            routed: false,
            keep_routes: true,
            key: None,
        }
    }
}

/// A running cluster; dropping it stops every node.
pub struct Cluster {
    /// Where the orchestrator listens.
    pub on: SocketAddr,
    /// Metadata nodes.
    pub mns: Vec<MnHandle>,
    /// Storage nodes.
    pub sns: Vec<SnHandle>,
    /// The cluster key.
    pub key: ClusterKey,
    on_task: tokio::task::JoinHandle<()>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.on_task.abort();
    }
}

impl Cluster {
    /// Starts (or restarts, from the state in `cfg.dir`) a cluster and waits
    /// until every node is up in the prefix table.
    pub async fn start(cfg: ClusterConfig) -> Result<Cluster, Error> {
        cfg.params.validate().map_err(Error::config)?;
        for (b, p) in &cfg.buckets {
            p.validate()
                .map_err(|e| Error::config(format!("bucket {b:?}: {e}")))?;
        }
        if cfg.mns.max(cfg.mn_slots) == 0 {
            return Err(Error::config("a cluster needs at least one metadata node"));
        }
        std::fs::create_dir_all(&cfg.dir)
            .map_err(|e| Error::io(format!("creating {}", cfg.dir.display()), e))?;
        let key_path = cfg.key.clone().unwrap_or_else(|| cfg.dir.join(KEY_FILE));
        let key = ClusterKey::load_or_create(&key_path)?;
        let initial = Table {
            routed: cfg.routed,
            buckets: cfg.buckets.clone(),
            ..Table::new(Layout::new(DEFAULT_CLUSTER_PREFIX, cfg.mg_bits), cfg.params)
        };
        let mut core = OnCore::open(
            &cfg.dir.join("orchestrator.redb"),
            initial,
            cfg.mns.max(cfg.mn_slots),
            0,
        )?;
        core.set_short_failure(cfg.short_failure_ms);
        core.set_definitive_failure(cfg.definitive_failure_ms);
        let sock = UdpSocket::bind(cfg.listen)
            .await
            .map_err(|e| Error::io(format!("binding the orchestrator to {}", cfg.listen), e))?;
        let on = sock
            .local_addr()
            .map_err(|e| Error::io("local address", e))?;
        let on_task = tokio::spawn(run_on(sock, core, key.clone()));
        let loopback = SocketAddr::new(on.ip(), 0);
        // Storage nodes first, so metadata nodes start with a table that
        // already lists them all.
        let mut sns = Vec::new();
        for k in 0..cfg.sns {
            let dir = cfg.dir.join(format!("sn-{k}"));
            sns.push(
                start_sn(
                    &dir,
                    loopback,
                    on,
                    cfg.sn_capacity,
                    cfg.device,
                    cfg.gc,
                    cfg.scrub,
                    cfg.data_limits,
                    cfg.keep_routes,
                    &key,
                    cfg.schedule.clone(),
                )
                .await?,
            );
        }
        // One thread serves every metadata node of the process (see
        // `MnServer` for why).
        let server = MnServer::new()?;
        let mut mns = Vec::new();
        for k in 0..cfg.mns {
            let dir = cfg.dir.join(format!("mn-{k}"));
            mns.push(
                start_mn_on(
                    &server,
                    &dir,
                    loopback,
                    on,
                    cfg.keep_routes,
                    &key,
                    cfg.metadata_sync_ms,
                )
                .await?,
            );
        }
        let cluster = Cluster {
            on,
            mns,
            sns,
            key,
            on_task,
        };
        cluster.wait_ready(Duration::from_secs(10)).await?;
        Ok(cluster)
    }

    /// Waits until the table lists all of this process's nodes as up.
    async fn wait_ready(&self, limit: Duration) -> Result<(), Error> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let t = fetch_table(self.on, Some(&self.key)).await?;
            let mns_up = t.mns.iter().filter(|m| m.state == State::Up).count();
            let sns_up = t.sns.iter().filter(|s| s.state == State::Up).count();
            if mns_up >= self.mns.len() && sns_up >= self.sns.len() {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::Timeout(format!(
                    "only {mns_up} metadata and {sns_up} storage nodes came up"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

//! A storage node on its TCP listener: registered with the orchestrator,
//! serving data frames ([`crate::storage::replicas`]), collecting
//! garbage, and refreshing the table.

use crate::runtime::{advertised, bind_address, node_uuid, refresh_loop, register};
use crate::storage::replicas::SnStore;
use crate::storage::schedule::config::ScheduleConfig;
use crate::storage::scheduled::ScheduledSender;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, RwLock};
use strata_store_client::transport::fetch_table;
use strata_store_protocol::auth::ClusterKey;
use strata_store_protocol::table::Device;
use strata_store_protocol::wire::{Body, Role};
use strata_store_protocol::Error;
use tokio::net::TcpListener;

/// A running storage node.
pub struct SnHandle {
    /// Its TCP endpoint.
    pub endpoint: SocketAddr,
    /// Its prefix index.
    pub index: u16,
    /// Its persistent identity.
    pub uuid: u64,
    /// Its replica store: counters and RS3's sender.
    pub store: Arc<SnStore>,
    /// Ends once the orchestrator has retired the node and its replicas
    /// are freed ([`crate::storage::replicas::retire_watch`]).
    retire: tokio::task::JoinHandle<()>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The scrub's counters.
    scrub: crate::storage::scrub::ScrubProgress,
}

impl SnHandle {
    /// What the node's background scrub has done so far
    /// ([`crate::storage::replicas::SnStore::scrub_stats`]).
    pub fn scrub_stats(&self) -> crate::storage::scrub::ScrubStats {
        self.scrub.stats()
    }

    /// Waits until the orchestrator has retired this node (drained, then
    /// retired) and its replicas are freed: a process running only this
    /// node has nothing left to do.
    pub async fn retired(&mut self) {
        if (&mut self.retire).await.is_err() {
            // Cancelled or failed: never call that a retirement.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for SnHandle {
    fn drop(&mut self) {
        self.retire.abort();
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts a storage node stored in `dir` on `bind`, declaring `capacity`
/// bytes of `device`, member of the cluster whose orchestrator is `on`;
/// `gc` paces the collection of replicas no record names, `scrub` the
/// re-reading of replicas ([`crate::storage::scrub`]), and `limits`
/// bound its data port ([`crate::storage::replicas::DataLimits`]);
/// `schedule` sets RS3 ([`crate::storage::scheduled`]). With
/// `keep_routes`, a node of a routed cluster keeps its host's routes in
/// step with the table ([`crate::routes`]).
#[allow(clippy::too_many_arguments)]
pub async fn start_sn(
    dir: &Path,
    bind: SocketAddr,
    on: SocketAddr,
    capacity: u64,
    device: Device,
    gc: crate::storage::replicas::GcConfig,
    scrub: crate::storage::scrub::ScrubConfig,
    limits: crate::storage::replicas::DataLimits,
    keep_routes: bool,
    key: &ClusterKey,
    schedule: ScheduleConfig,
) -> Result<SnHandle, Error> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    // Settings an operator changed at run time outlive a restart.
    let schedule = crate::storage::schedule_file::load(dir, &schedule).map_err(Error::config)?;
    let sender = ScheduledSender::start(schedule)
        .map_err(|e| Error::config(format!("storage node in {}: {e}", dir.display())))?;
    let uuid = node_uuid(dir)?;
    let at = bind_address(on, bind, key).await?;
    let listener = TcpListener::bind(at)
        .await
        .map_err(|e| Error::io(format!("binding {at}"), e))?;
    let endpoint = advertised(bind, listener.local_addr())?;
    // Count what is there before declaring free space.
    let probe = SnStore::open(dir, 0, on, capacity)?;
    let index = register(
        on,
        Body::Register {
            role: Role::Sn,
            uuid,
            endpoint,
            capacity,
            free: probe.free(),
            device: device as u8,
            keys: Some(key.fingerprints()),
        },
        key,
    )
    .await?;
    let store = Arc::new(
        SnStore::open(dir, index, on, capacity)?
            .with_key(key.clone())
            .with_limits(limits)
            .with_schedule(sender),
    );
    let table = Arc::new(RwLock::new(fetch_table(on, Some(key)).await?));
    let stats_store = store.clone();
    let retire = tokio::spawn(crate::storage::replicas::retire_watch(
        store.clone(),
        table.clone(),
        uuid,
    ));
    let (scrub_dir, progress, scrub_key) = store.scrub_parts();
    let scrub_progress = progress.clone();
    let tasks = vec![
        tokio::spawn(crate::storage::scrub::scrub_loop(
            scrub_dir,
            progress,
            table.clone(),
            scrub_key,
            scrub,
        )),
        tokio::spawn(crate::storage::replicas::gc_loop(
            store.clone(),
            table.clone(),
            gc,
        )),
        tokio::spawn(crate::storage::replicas::serve(
            listener,
            store.clone(),
            table.clone(),
        )),
        tokio::spawn(refresh_loop(
            on,
            uuid,
            table,
            None,
            move || Some((stats_store.free(), stats_store.objects())),
            keep_routes.then_some(endpoint.ip()),
            key.clone(),
        )),
    ];
    Ok(SnHandle {
        endpoint,
        index,
        uuid,
        store,
        retire,
        tasks,
        scrub: scrub_progress,
    })
}

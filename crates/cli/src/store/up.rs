//! `strata store up`: a whole cluster in one process, and the nodes
//! `strata store node add` registered with it, stopped with it.

use super::*;

/// Removes a node's registration at its exit (see [`register_added_node`]).
pub(super) fn unregister(file: Option<PathBuf>) {
    if let Some(file) = file {
        let _ = std::fs::remove_file(file);
    }
}

pub(super) fn up(args: UpArgs) -> Result<i32> {
    let mut cfg = ClusterConfig::embedded(args.dir.clone());
    cfg.listen = args.listen;
    cfg.mns = args.mns;
    cfg.sns = args.sns;
    cfg.mn_slots = args.mn_slots.unwrap_or(args.mns);
    cfg.short_failure_ms = args.short_failure_ms;
    if args.definitive_failure_ms <= args.short_failure_ms {
        anyhow::bail!(
            "--definitive-failure-ms ({}) must be longer than --short-failure-ms ({})",
            args.definitive_failure_ms,
            args.short_failure_ms
        );
    }
    cfg.definitive_failure_ms = args.definitive_failure_ms;
    cfg.params = parse_params(&args.replication)?;
    for b in &args.buckets {
        let (name, p) = b
            .split_once('=')
            .with_context(|| format!("invalid --bucket '{b}': expected NAME=N_m,W_m,N_d,W_d"))?;
        cfg.buckets.push((name.to_string(), parse_params(p)?));
    }
    apply_classes(&mut cfg, &args.class, &args.bucket_classes)?;
    cfg.sn_capacity = parse_size(&args.capacity).map_err(anyhow::Error::msg)?;
    cfg.device = device(&args.device);
    cfg.mg_bits = args.mg_bits;
    cfg.routed = args.routed;
    cfg.keep_routes = !args.routes.no_routes;
    cfg.gc = args.gc.config();
    cfg.scrub = args.scrub.config();
    cfg.data_limits = args.data.limits()?;
    cfg.schedule = args.schedule.config()?;
    cfg.metadata_sync_ms = args.sync.metadata_sync_ms;
    cfg.key = args.key.path.clone();
    runtime()?.block_on(async {
        let stop = crate::serve::shutdown_signal();
        let cluster = Cluster::start(cfg)
            .await
            .with_context(|| format!("could not start the cluster in '{}'", args.dir.display()))?;
        // The operator's credential, issued again at every start (and on
        // every reload), so it follows a key rotation.
        let admin = args.dir.join(ADMIN_CREDENTIAL_FILE);
        TenantCredential::issue(&cluster.key, ADMIN)?.save(&admin)?;
        reload_on_hangup(cluster.key.clone(), Some(admin))?;
        let nodes = cluster
            .sns
            .iter()
            .map(|sn| (sn.uuid, sn.store.clone()))
            .collect();
        let mns = cluster
            .mns
            .iter()
            .map(|mn| (mn.slot, mn.repair_stats()))
            .collect();
        let metrics = serve_metrics(args.schedule.metrics, nodes, mns).await?;
        // The gateway reads this process's replicas from their files.
        let local = (!args.s3_remote_reads).then(|| {
            let stores = cluster.sns.iter().map(|sn| sn.store.clone()).collect();
            let replicas = std::sync::Arc::new(strata_store::storage::local::LocalNodes::new(stores));
            let disk = std::sync::Arc::new(strata_store_client::client::local::LocalDisk::new(
                replicas,
                args.s3_pinned.unwrap_or_else(strata_store_client::client::pinned::default_budget),
            ));
            disk.sweep_pins(strata_store_client::client::pinned::SWEEP_PERIOD);
            disk
        });
        // And asks this process's metadata nodes for records directly.
        let metadata = (!args.s3_remote_reads).then(|| {
            std::sync::Arc::new(strata_store::metadata::server::LocalMetadataNodes::new(
                &cluster.mns,
            )) as std::sync::Arc<dyn LocalMetadata>
        });
        let (s3, _s3_task) = start_gateway(
            cluster.on,
            cluster.key.clone(),
            args.s3,
            &args.s3_expiry,
            Local {
                replicas: local,
                metadata,
            },
        )
        .await?;
        let mut out = std::io::stdout().lock();
        // Field 5 is the orchestrator's endpoint (scripts read it there);
        // what was added later goes after the node counts.
        writeln!(
            out,
            "strata store: ready on {} ({} metadata node{}, {} storage node{}){}, s3 on http://{s3}",
            cluster.on,
            cluster.mns.len(),
            if cluster.mns.len() == 1 { "" } else { "s" },
            cluster.sns.len(),
            if cluster.sns.len() == 1 { "" } else { "s" },
            metrics.as_ref().map_or(String::new(), |(at, _)| format!(
                ", metrics on http://{at}/metrics"
            )),
        )?;
        out.flush()?;
        drop(out);
        stop.await;
        stop_added_nodes(&args.dir, cluster.on).await;
        drop(cluster);
        anyhow::Ok(0)
    })
}

/// Starts `/metrics` on `at`, if given, for the storage nodes `nodes`;
/// the bound endpoint and the task (stopped when dropped).
pub(super) async fn serve_metrics(
    at: Option<SocketAddr>,
    nodes: Vec<(
        u64,
        std::sync::Arc<strata_store::storage::replicas::SnStore>,
    )>,
    mns: Vec<(
        u16,
        std::sync::Arc<std::sync::Mutex<strata_store::metadata::state::RepairStats>>,
    )>,
) -> Result<Option<(SocketAddr, AbortOnDrop)>> {
    let Some(at) = at else { return Ok(None) };
    let listener = strata_store::metrics::bind(at).await?;
    let bound = listener.local_addr()?;
    let source = strata_store::metrics::NodeMetrics::source(nodes);
    let mns = strata_store::metrics::mn_source(mns);
    let task = tokio::spawn(strata_store::metrics::serve(listener, source, mns));
    Ok(Some((bound, AbortOnDrop(task))))
}

/// A task stopped when this is dropped.
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Where `strata store node add` processes whose key is the cluster
/// key of a `strata store up` directory register, so that its shutdown
/// stops them too: one file per process, named by its pid.
pub(super) const ADDED_NODES_DIR: &str = "added-nodes";

/// How long `strata store up` waits for the added nodes it stopped.
pub(super) const ADDED_NODES_STOP: std::time::Duration = std::time::Duration::from_secs(10);

/// A node process's registration: the orchestrator it joined and its
/// start time (so a pid reused by another process is never signalled).
pub(super) fn registration_text(on: SocketAddr, start: u64) -> String {
    format!("{on} {start}\n")
}

/// The start time of process `pid` (clock ticks since boot, field 22 of
/// /proc/PID/stat) and whether it is still running (not a zombie).
pub(super) fn process_start(pid: i32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields count from after its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let running = fields
        .first()
        .is_some_and(|state| *state != "Z" && *state != "X");
    Some((fields.get(19)?.parse().ok()?, running))
}

/// Registers this `node add` process in the `strata store up` directory
/// that holds its key file (a directory with the admin credential), so
/// that the cluster's shutdown stops it. Returns the file to remove at
/// exit; none when the key is not in such a directory (a copied key on
/// another host: that node outlives the cluster, and is stopped by its
/// own signal).
pub(super) fn register_added_node(key: &ClusterKey, on: SocketAddr) -> Option<PathBuf> {
    let dir = key.path()?.parent()?;
    if !dir.join(ADMIN_CREDENTIAL_FILE).exists() {
        return None;
    }
    let pid = std::process::id();
    let (start, _) = process_start(pid as i32)?;
    let nodes = dir.join(ADDED_NODES_DIR);
    let file = nodes.join(pid.to_string());
    let written = std::fs::create_dir_all(&nodes)
        .and_then(|()| std::fs::write(&file, registration_text(on, start)));
    match written {
        Ok(()) => Some(file),
        Err(e) => {
            eprintln!(
                "strata store: could not register in {} ({e}): `strata store up` will not \
                 stop this node at its shutdown; stop it with SIGTERM",
                nodes.display()
            );
            None
        }
    }
}

/// At `strata store up`'s shutdown: SIGTERM every `node add` process
/// registered in DIR for this orchestrator, and wait (bounded) until they
/// are gone, so no node of the cluster outlives it.
pub(super) async fn stop_added_nodes(dir: &std::path::Path, on: SocketAddr) {
    let nodes = dir.join(ADDED_NODES_DIR);
    let Ok(entries) = std::fs::read_dir(&nodes) else {
        return;
    };
    let mut stopping = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let pid: Option<i32> = entry.file_name().to_str().and_then(|n| n.parse().ok());
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let _ = std::fs::remove_file(&path);
        let Some(pid) = pid else { continue };
        let Some((start, true)) = process_start(pid) else {
            continue;
        };
        if text != registration_text(on, start) {
            continue;
        }
        // SAFETY: kill(2) on a pid checked to be the registered process.
        if unsafe { libc::kill(pid, libc::SIGTERM) } == 0 {
            stopping.push((pid, start));
        }
    }
    let deadline = tokio::time::Instant::now() + ADDED_NODES_STOP;
    let alive = |&(pid, start): &(i32, u64)| process_start(pid) == Some((start, true));
    while stopping.iter().any(alive) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let left = stopping.iter().filter(|p| alive(p)).count();
    if left > 0 {
        eprintln!(
            "strata store: {left} added node(s) did not stop within {} s of SIGTERM",
            ADDED_NODES_STOP.as_secs()
        );
    }
}

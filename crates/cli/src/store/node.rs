//! `strata store node`: run one node of a cluster, and remove a storage
//! node (drain, then retire) or cancel its removal.

use super::*;

pub(super) fn node(cmd: NodeCommand) -> Result<i32> {
    match cmd {
        NodeCommand::Add {
            cluster,
            dir,
            role,
            listen,
            capacity,
            device: dev,
            gc,
            scrub,
            data,
            schedule,
            sync,
            routes,
            key,
        } => {
            let parent = dir.parent().map(|d| d.join(KEY_FILE));
            let defaults: Vec<PathBuf> =
                std::iter::once(dir.join(KEY_FILE)).chain(parent).collect();
            let key = key.load(&defaults)?;
            let keep_routes = !routes.no_routes;
            let capacity = parse_size(&capacity).map_err(anyhow::Error::msg)?;
            runtime()?.block_on(async {
                let stop = crate::serve::shutdown_signal();
                reload_on_hangup(key.clone(), None)?;
                if role == "mn" {
                    let mn = strata_store::metadata::server::start_mn(
                        &dir,
                        listen,
                        cluster.cluster,
                        keep_routes,
                        &key,
                        sync.metadata_sync_ms,
                    )
                    .await
                    .context("could not add the metadata node")?;
                    let registered = register_added_node(&key, cluster.cluster);
                    let repair = vec![(mn.slot, mn.repair_stats())];
                    let metrics =
                        super::up::serve_metrics(schedule.metrics, Vec::new(), repair).await?;
                    println!(
                        "strata store: metadata node slot {} on {}{}",
                        mn.slot,
                        mn.endpoint,
                        metrics.as_ref().map_or(String::new(), |(at, _)| format!(
                            ", metrics on http://{at}/metrics"
                        )),
                    );
                    std::io::stdout().flush()?;
                    stop.await;
                    unregister(registered);
                    return anyhow::Ok(0);
                }
                let mut sn = strata_store::storage::server::start_sn(
                    &dir,
                    listen,
                    cluster.cluster,
                    capacity,
                    device(&dev),
                    gc.config(),
                    scrub.config(),
                    data.limits()?,
                    keep_routes,
                    &key,
                    schedule.config()?,
                )
                .await
                .context("could not add the storage node")?;
                let registered = register_added_node(&key, cluster.cluster);
                let nodes = vec![(sn.uuid, sn.store.clone())];
                let metrics = super::up::serve_metrics(schedule.metrics, nodes, Vec::new()).await?;
                println!(
                    "strata store: storage node {:016x} (prefix index {}) on {}{}",
                    sn.uuid,
                    sn.index,
                    sn.endpoint,
                    metrics.as_ref().map_or(String::new(), |(at, _)| format!(
                        ", metrics on http://{at}/metrics"
                    )),
                );
                std::io::stdout().flush()?;
                tokio::select! {
                    _ = stop => {}
                    _ = sn.retired() => eprintln!(
                        "strata store: storage node {:016x} retired (its replicas were \
                         re-placed and freed); exiting",
                        sn.uuid
                    ),
                }
                unregister(registered);
                anyhow::Ok(0)
            })
        }
        NodeCommand::Remove {
            cluster,
            cancel: true,
            key,
            id,
        } => cancel_removal(&cluster, &key.load(&[])?, &id),
        NodeCommand::Remove {
            cluster,
            cancel: false,
            key,
            id,
        } => {
            let uuid = parse_node_id(&id)?;
            let key = key.load(&[])?;
            let table = runtime()?.block_on(async {
                admin::retire(cluster.cluster, &key, uuid).await?;
                let t = strata_store_client::transport::fetch_table(cluster.cluster, Some(&key))
                    .await?;
                anyhow::Ok(t)
            })?;
            // Accepted: the node is drained, then retired (or was already).
            let drain = table
                .sns
                .iter()
                .find(|s| s.uuid == uuid)
                .and_then(|s| table.drain_of(s.index));
            match (cluster.output, drain) {
                (Output::Json, Some(d)) => println!(
                    "{}",
                    json!({"id": id, "state": "retiring", "replicas_left": d.left})
                ),
                (Output::Json, None) => println!("{}", json!({"id": id, "state": "retired"})),
                (Output::Human, Some(d)) => println!(
                    "retiring {id}: its {} replicas are being re-placed on other nodes; \
                     `strata store status` shows the progress",
                    d.left
                ),
                (Output::Human, None) => println!("retired {id}"),
            }
            Ok(0)
        }
    }
}

/// A node id as `strata store status` shows it: 16 hex digits.
pub(super) fn parse_node_id(id: &str) -> Result<u64> {
    u64::from_str_radix(id, 16)
        .with_context(|| format!("invalid node id '{id}': expected 16 hex digits"))
}

/// `strata store node remove --cancel ID`: asks the orchestrator to cancel
/// the node's drain, then prints its state from a fresh table.
pub(super) fn cancel_removal(cluster: &ClusterArg, key: &ClusterKey, id: &str) -> Result<i32> {
    let uuid = parse_node_id(id)?;
    let (before, after) = runtime()?.block_on(async {
        // Whether it was being drained decides what to print: the answer
        // is the same either way (a resent request must not fail).
        let before =
            strata_store_client::transport::fetch_table(cluster.cluster, Some(key)).await?;
        admin::cancel_retire(cluster.cluster, key, uuid).await?;
        let after = strata_store_client::transport::fetch_table(cluster.cluster, Some(key)).await?;
        anyhow::Ok((before, after))
    })?;
    let was_draining = before
        .sns
        .iter()
        .any(|s| s.uuid == uuid && before.retiring(s.index));
    let state = after
        .sns
        .iter()
        .find(|s| s.uuid == uuid)
        .map_or("unknown", |s| sn_state(&after, s));
    match cluster.output {
        Output::Json => println!(
            "{}",
            json!({"id": id, "state": state, "cancelled": was_draining})
        ),
        Output::Human if was_draining => {
            let takes = if state == "up" {
                "it is up and takes new objects again".to_string()
            } else {
                format!("it is {state}, and takes new objects again once it is up")
            };
            println!(
                "cancelled the removal of {id}: {takes}; replicas already re-placed \
                 stay on their new nodes"
            )
        }
        Output::Human => println!("{id} is not being removed ({state}): nothing to cancel"),
    }
    Ok(0)
}

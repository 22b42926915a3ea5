//! `strata store status` and `strata store routes`: the prefix table,
//! printed for people or as JSON.

use super::*;
use strata_store_protocol::auth::ClusterKey;
use strata_store_protocol::wire::RepairCounts;

pub(super) fn status(args: &StatusArgs) -> Result<i32> {
    let c = &args.cluster;
    if args.client {
        return client_status(args);
    }
    let rt = runtime()?;
    let table = rt
        .block_on(strata_store_client::transport::fetch_table(c.cluster, None))
        .with_context(|| format!("no orchestrator answered at {}", c.cluster))?;
    // Asked only on request: each metadata node is a round trip, and one
    // that is down costs a timeout.
    let repair = match args.repair {
        true => Some(rt.block_on(repair_counts(&table, &args.key.load(&[])?))),
        false => None,
    };
    match c.output {
        Output::Json => {
            let mut shown = table_json(&table);
            if let Some(repair) = &repair {
                shown["repair"] = repair_json(repair);
            }
            println!("{}", serde_json::to_string_pretty(&shown)?)
        }
        Output::Human => {
            print_table(&table);
            if let Some(repair) = &repair {
                print_repair(repair);
            }
        }
    }
    Ok(0)
}

/// One metadata node's repair counts, or why they could not be read.
type NodeRepair = (u16, SocketAddr, std::result::Result<RepairCounts, String>);

/// Asks every metadata node of `table` that is up for its repair
/// counts, all at once; one that is not up is reported, not asked (it
/// would cost a timeout).
async fn repair_counts(table: &Table, key: &ClusterKey) -> Vec<NodeRepair> {
    let mut asks = tokio::task::JoinSet::new();
    for (position, m) in table.mns.iter().enumerate() {
        let (slot, endpoint, state) = (m.slot, m.endpoint, m.state);
        let key = key.clone();
        asks.spawn(async move {
            let counts = match state {
                strata_store_protocol::table::State::Up => {
                    strata_store_client::admin::repair_counts(endpoint, &key)
                        .await
                        .map_err(|e| e.to_string())
                }
                other => Err(format!("{}: not asked", other.name())),
            };
            (position, (slot, endpoint, counts))
        });
    }
    let mut nodes: Vec<(usize, NodeRepair)> = asks.join_all().await;
    nodes.sort_by_key(|(position, _)| *position);
    nodes.into_iter().map(|(_, node)| node).collect()
}

fn repair_json(nodes: &[NodeRepair]) -> serde_json::Value {
    let total = nodes.iter().filter_map(|(_, _, r)| r.as_ref().ok()).fold(
        RepairCounts::default(),
        |mut sum, r| {
            sum.copies_started += r.copies_started;
            sum.rebuilds_started += r.rebuilds_started;
            sum.committed += r.committed;
            sum.failed += r.failed;
            sum.in_flight += r.in_flight;
            sum.damaged_waiting += r.damaged_waiting;
            sum
        },
    );
    let counts = |r: &RepairCounts| {
        json!({
            "copies_started": r.copies_started,
            "rebuilds_started": r.rebuilds_started,
            "committed": r.committed,
            "failed": r.failed,
            "in_flight": r.in_flight,
            "damaged_waiting": r.damaged_waiting,
        })
    };
    json!({
        "total": counts(&total),
        "metadata_nodes": nodes.iter().map(|(slot, endpoint, r)| match r {
            Ok(r) => json!({"slot": slot, "endpoint": endpoint.to_string(), "counts": counts(r)}),
            Err(e) => json!({"slot": slot, "endpoint": endpoint.to_string(), "error": e}),
        }).collect::<Vec<_>>(),
    })
}

fn print_repair(nodes: &[NodeRepair]) {
    for (slot, endpoint, r) in nodes {
        match r {
            Ok(r) => println!(
                "repair on mn slot {slot}: {} replica copies and {} fragment rebuilds started, \
                 {} committed, {} failed, {} under way, {} damaged replicas waiting",
                r.copies_started,
                r.rebuilds_started,
                r.committed,
                r.failed,
                r.in_flight,
                r.damaged_waiting
            ),
            Err(e) => println!("repair on mn slot {slot} ({endpoint}): no counts ({e})"),
        }
    }
}

/// `strata store status --client`: probes every storage node, then
/// prints what a client makes of them.
fn client_status(args: &StatusArgs) -> Result<i32> {
    let c = &args.cluster;
    let view = runtime()?.block_on(async {
        let credential = args.tenant.load()?;
        let client = Client::connect(c.cluster, credential).await?;
        client.probe_nodes(usize::from(args.probes)).await;
        anyhow::Ok((client.replica_choice(), client.replica_view()))
    })?;
    let (policy, nodes) = view;
    match c.output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&client_view_json(policy, &nodes))?
        ),
        Output::Human => print_client_view(policy, &nodes),
    }
    Ok(0)
}

/// A client's replica choice and its view of each storage node, as JSON
/// (also in `strata store bench`'s report).
pub(super) fn client_view_json(
    policy: strata_store_client::client::ReplicaChoice,
    nodes: &[strata_store_client::client::NodeView],
) -> serde_json::Value {
    json!({
        "replica_choice": policy.name(),
        "nodes": nodes.iter().map(|n| json!({
            "id": format!("{:016x}", n.node),
            "endpoint": n.endpoint.to_string(),
            "latency_ms": n.latency_ms,
            "weight": n.weight,
            "share": n.share,
            "reads": n.reads,
            "read_samples": n.samples,
            "probes": n.probes,
        })).collect::<Vec<_>>(),
    })
}

fn print_client_view(
    policy: strata_store_client::client::ReplicaChoice,
    nodes: &[strata_store_client::client::NodeView],
) {
    println!("replica choice {}", policy.name());
    for n in nodes {
        let latency = n
            .latency_ms
            .map_or_else(|| "-".to_string(), |l| format!("{l:.3} ms"));
        println!(
            "sn {:016x}  {:<22} latency {latency:>12}  weight {:>3}  share {:>5.1}%  reads {}  probes {}",
            n.node,
            n.endpoint,
            n.weight,
            n.share * 100.0,
            n.reads,
            n.probes
        );
    }
}

pub(super) fn routes(args: &RoutesArgs) -> Result<i32> {
    let c = &args.cluster;
    let table = runtime()?
        .block_on(strata_store_client::transport::fetch_table(c.cluster, None))
        .with_context(|| format!("no orchestrator answered at {}", c.cluster))?;
    if !table.routed {
        bail!(
            "the cluster at {} runs in mapped mode: it needs no routes",
            c.cluster
        );
    }
    if args.apply {
        // One-shot: the host's routes now (nodes keep theirs themselves).
        let n = strata_store::routes::RouteKeeper::new()
            .sync(&table, args.host)
            .context("could not install the routes")?;
        match c.output {
            Output::Json => println!("{}", json!({"installed": n})),
            Output::Human => println!("{n} routes installed for host {}", args.host),
        }
        return Ok(0);
    }
    let routes = strata_store::routes::host_routes(&table, args.host);
    if c.output == Output::Json {
        let list: Vec<_> = routes
            .iter()
            .map(|r| match r.via {
                Some(v) => json!({"prefix": r.prefix, "via": v.to_string()}),
                None => json!({"prefix": r.prefix, "local": true}),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    let lead = if args.batch { "" } else { "ip -6 " };
    for r in &routes {
        println!("{lead}{}", r.install_line());
    }
    Ok(0)
}

pub(super) fn table_json(t: &Table) -> serde_json::Value {
    let params = |p: &Params| json!({"n_m": p.n_m, "w_m": p.w_m, "n_d": p.n_d, "w_d": p.w_d});
    json!({
        "epoch": t.epoch,
        "cluster_prefix": format!("{}/48", strata_store_protocol::addr::fmt_addr(t.layout.cluster)),
        "metadata_groups": t.layout.mg_count(),
        "network_mode": if t.routed { "routed" } else { "mapped" },
        "replication": params(&t.params),
        "buckets": t.buckets.iter().map(|(b, p)| json!({"bucket": b, "replication": params(p)})).collect::<Vec<_>>(),
        "orchestrator_key": t.on_keys.map(prints_json),
        // Tenants with a revoked credential generation (listed by hash).
        "revoked_tenants": t.revoked.len(),
        "metadata_nodes": t.mns.iter().map(|m| json!({
            "id": format!("{:016x}", m.uuid),
            "key": t.keys_of(m.uuid).map(prints_json),
            "slot": m.slot,
            "endpoint": m.endpoint.to_string(),
            "state": m.state.name(),
            "groups": t.groups_of(m.slot),
            "groups_incoming": t.moves.iter().filter(|mv| mv.to == m.slot).count(),
            "group_prefixes": t.mg_owner.iter().enumerate().filter(|(_, &s)| s == m.slot).map(|(mg, _)| {
                let (prefix, len) = t.layout.mg_prefix(mg as u32);
                format!("{}/{len}", strata_store_protocol::addr::fmt_addr(prefix))
            }).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "moves": t.moves.iter().map(|mv| json!({
            "group": mv.group,
            "from_slot": if mv.phase == strata_store_protocol::table::MovePhase::Restoring {
                // The previous owner is dead; the table names the new one.
                None
            } else {
                t.mg_owner.get(mv.group as usize)
            },
            "to_slot": mv.to,
            "phase": move_phase(mv.phase),
            // The down node the group goes back to, if it stands in for one.
            "home_slot": t.home_of(mv.group),
        })).collect::<Vec<_>>(),
        "stand_ins": t.stand_ins.iter().map(|s| json!({
            "group": s.group,
            "slot": t.mg_owner.get(s.group as usize),
            "home_slot": s.home,
        })).collect::<Vec<_>>(),
        "storage_nodes": t.sns.iter().map(|s| json!({
            "id": format!("{:016x}", s.uuid),
            "key": t.keys_of(s.uuid).map(prints_json),
            "prefix": format!("{}/64", strata_store_protocol::addr::fmt_addr(t.layout.sn_prefix(s.index))),
            "endpoint": s.endpoint.to_string(),
            "state": sn_state(t, s),
            "device": s.device.name(),
            "capacity": s.capacity,
            "free": s.free,
            "replicas": s.objects,
            "drain": t.drain_of(s.index).map(|d| json!({
                "replicas_left": d.left,
                "metadata_copies_left": d.copies,
                "unplaceable": d.unplaceable,
                "unreported_metadata_nodes": d.unreported,
                "waiting": drain_waiting(d),
            })),
        })).collect::<Vec<_>>(),
    })
}

/// A storage node's state as shown: "retiring" while it is drained and up
/// (a drained node that is down or dead shows that, as it matters more).
pub(super) fn sn_state(t: &Table, s: &strata_store_protocol::table::SnEntry) -> &'static str {
    if t.retiring(s.index) && s.state == strata_store_protocol::table::State::Up {
        "retiring"
    } else {
        s.state.name()
    }
}

/// Why a drain is not progressing, if it is waiting for something.
pub(super) fn drain_waiting(d: &strata_store_protocol::table::Drain) -> Option<String> {
    if d.unplaceable > 0 {
        Some(format!(
            "{} objects have no other storage node up with room for a new replica: add storage nodes or free space",
            d.unplaceable
        ))
    } else if d.unreported > 0 {
        Some(format!(
            "{} metadata nodes have not reported yet (they report after each scan; a down one holds the drain)",
            d.unreported
        ))
    } else {
        None
    }
}

pub(super) fn move_phase(p: strata_store_protocol::table::MovePhase) -> &'static str {
    use strata_store_protocol::table::MovePhase;
    match p {
        MovePhase::Copying => "copying",
        MovePhase::Copied => "copied",
        MovePhase::Frozen => "frozen",
        MovePhase::Restoring => "restoring",
    }
}

pub(super) fn print_table(t: &Table) {
    let p = t.params;
    println!(
        "cluster {}/48, {} metadata groups, replication N_m={} W_m={} N_d={} W_d={}",
        strata_store_protocol::addr::fmt_addr(t.layout.cluster),
        t.layout.mg_count(),
        p.n_m,
        p.w_m,
        p.n_d,
        p.w_d
    );
    if let Some(k) = t.on_keys {
        println!("orchestrator key {k}");
    }
    for (b, p) in &t.buckets {
        println!(
            "bucket {b}: N_m={} W_m={} N_d={} W_d={}",
            p.n_m, p.w_m, p.n_d, p.w_d
        );
    }
    for m in &t.mns {
        let groups = t.groups_of(m.slot);
        let incoming = t.moves.iter().filter(|mv| mv.to == m.slot).count();
        let incoming = if incoming > 0 {
            format!(", {incoming} being handed over to it or restored on it")
        } else {
            String::new()
        };
        println!(
            "mn {:016x}  {:<22} {:<7} slot {} {groups} groups{incoming}  key {}",
            m.uuid,
            m.endpoint,
            m.state.name(),
            m.slot,
            node_keys(t, m.uuid)
        );
    }
    if !t.moves.is_empty() {
        let count = |p| t.moves.iter().filter(|mv| mv.phase == p).count();
        use strata_store_protocol::table::MovePhase;
        println!(
            "handover of {} metadata groups under way: {} copying, {} copied, {} frozen, {} restoring (owner dead)",
            t.moves.len(),
            count(MovePhase::Copying),
            count(MovePhase::Copied),
            count(MovePhase::Frozen),
            count(MovePhase::Restoring)
        );
    }
    if !t.stand_ins.is_empty() {
        let mut homes: Vec<u16> = t.stand_ins.iter().map(|s| s.home).collect();
        homes.sort_unstable();
        homes.dedup();
        for h in homes {
            let n = t.stand_ins.iter().filter(|s| s.home == h).count();
            println!("{n} metadata groups of slot {h} stand in on other nodes until it is back");
        }
    }
    for s in &t.sns {
        println!(
            "sn {:016x}  {:<22} {:<8} {} {}/64  {} free of {}, {} replicas  key {}",
            s.uuid,
            s.endpoint,
            sn_state(t, s),
            s.device.name(),
            strata_store_protocol::addr::fmt_addr(t.layout.sn_prefix(s.index)),
            human(s.free),
            human(s.capacity),
            s.objects,
            node_keys(t, s.uuid)
        );
        if let Some(d) = t.drain_of(s.index) {
            let waiting = drain_waiting(d)
                .map(|w| format!("; waiting: {w}"))
                .unwrap_or_default();
            println!(
                "   draining: {} replicas left to re-place, {} metadata copies left to update{waiting}",
                d.left, d.copies
            );
        }
    }
}

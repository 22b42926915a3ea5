//! `strata store schedule`: show or change RS3's settings on the running
//! storage nodes (docs/design/rs3.md), as `--rs3*` set them at start.

use super::*;

/// `strata store schedule` arguments.
#[derive(Args)]
pub struct ScheduleCommandArgs {
    #[command(flatten)]
    pub(super) cluster: ClusterArg,
    #[command(flatten)]
    pub(super) key: KeyArg,
    /// Only the storage node with this id (hex uuid, as `strata store
    /// status` shows it); default: every storage node that is up.
    #[arg(long, value_name = "ID")]
    pub(super) node: Option<String>,
    /// Turn scheduling on or off.
    #[arg(long, value_parser = ["on", "off"])]
    pub(super) rs3: Option<String>,
    /// The batch budget (64K to 1G).
    #[arg(long)]
    pub(super) batch: Option<String>,
    /// A class's weight, CLASS=W. Repeatable.
    #[arg(long, value_name = "CLASS=W")]
    pub(super) weight: Vec<String>,
    /// Give CLASS the default weight again. Repeatable.
    #[arg(long, value_name = "CLASS")]
    pub(super) unweight: Vec<String>,
    /// Put tenant TENANT's reads in class CLASS, TENANT=CLASS. Repeatable.
    #[arg(long, value_name = "TENANT=CLASS")]
    pub(super) class: Vec<String>,
    /// Put tenant TENANT's reads back in its own class. Repeatable.
    #[arg(long, value_name = "TENANT")]
    pub(super) unclass: Vec<String>,
}

impl ScheduleCommandArgs {
    /// The settings text the nodes take (empty: show only).
    fn settings(&self) -> Result<String> {
        let mut text = String::new();
        if let Some(on) = &self.rs3 {
            text.push_str(&format!("rs3={on}\n"));
        }
        if let Some(batch) = &self.batch {
            let bytes = crate::units::parse_size(batch)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("invalid --batch '{batch}'"))?;
            text.push_str(&format!("batch={bytes}\n"));
        }
        for (flag, pairs, key) in [
            ("--weight", &self.weight, "weight"),
            ("--class", &self.class, "class"),
        ] {
            for pair in pairs {
                let (name, value) = pair
                    .split_once('=')
                    .with_context(|| format!("invalid {flag} '{pair}': expected NAME=VALUE"))?;
                text.push_str(&format!("{key}={name}:{value}\n"));
            }
        }
        for class in &self.unweight {
            text.push_str(&format!("unweight={class}\n"));
        }
        for tenant in &self.unclass {
            text.push_str(&format!("unclass={tenant}\n"));
        }
        Ok(text)
    }
}

/// One node's answer as JSON: its settings and per-class counters.
fn answer_json(text: &str) -> serde_json::Value {
    let mut weights = serde_json::Map::new();
    let mut classes = serde_json::Map::new();
    let mut stats = serde_json::Map::new();
    let mut out = serde_json::Map::new();
    for (key, value) in text.lines().filter_map(|l| l.split_once('=')) {
        match key {
            "weight" | "class" => {
                if let Some((name, v)) = value.split_once(':') {
                    let map = if key == "weight" {
                        &mut weights
                    } else {
                        &mut classes
                    };
                    let v = v.parse::<u64>().map_or_else(|_| json!(v), |n| json!(n));
                    map.insert(name.to_string(), v);
                }
            }
            "class-stats" => {
                if let Some((name, fields)) = value.split_once(':') {
                    let mut entry = serde_json::Map::new();
                    for (field, n) in fields.split(',').filter_map(|f| f.split_once('=')) {
                        entry.insert(field.to_string(), json!(n.parse::<u64>().unwrap_or(0)));
                    }
                    stats.insert(name.to_string(), entry.into());
                }
            }
            "rs3" => {
                out.insert("enabled".into(), json!(value == "on"));
            }
            other => {
                out.insert(other.into(), json!(value.parse::<u64>().unwrap_or(0)));
            }
        }
    }
    out.insert("weights".into(), weights.into());
    out.insert("tenant_classes".into(), classes.into());
    out.insert("class_stats".into(), stats.into());
    out.into()
}

pub(super) fn schedule(args: ScheduleCommandArgs) -> Result<i32> {
    let settings = args.settings()?;
    let key = args.key.load(&[])?;
    let c = &args.cluster;
    let wanted = args.node.as_deref().map(parse_node_id).transpose()?;
    let answers = runtime()?.block_on(async {
        let table = strata_store_client::transport::fetch_table(c.cluster, Some(&key))
            .await
            .with_context(|| format!("no orchestrator answered at {}", c.cluster))?;
        let nodes: Vec<_> = table
            .sns
            .iter()
            .filter(|s| {
                wanted.map_or(s.state == strata_store_protocol::table::State::Up, |id| {
                    s.uuid == id
                })
            })
            .collect();
        if nodes.is_empty() {
            bail!("no storage node to ask: none is up, or --node names none");
        }
        let mut answers = Vec::new();
        for sn in nodes {
            // Any replica address of the node: it checks the prefix.
            let addr = table.layout.replica_addr(sn.index, 1);
            let answer =
                strata_store_client::admin::schedule(sn.endpoint, addr, &key, &settings).await;
            answers.push((sn.uuid, sn.endpoint, answer));
        }
        anyhow::Ok(answers)
    })?;
    let failed = answers.iter().filter(|(_, _, a)| a.is_err()).count();
    match c.output {
        Output::Json => {
            let nodes: Vec<serde_json::Value> = answers
                .iter()
                .map(|(uuid, endpoint, answer)| match answer {
                    Ok(text) => json!({"node": format!("{uuid:016x}"), "endpoint": endpoint.to_string(), "rs3": answer_json(text)}),
                    Err(e) => json!({"node": format!("{uuid:016x}"), "endpoint": endpoint.to_string(), "error": e.report().to_string()}),
                })
                .collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({ "nodes": nodes }))?
            );
        }
        Output::Human => {
            for (uuid, endpoint, answer) in &answers {
                match answer {
                    Ok(text) => {
                        println!("storage node {uuid:016x} ({endpoint}):");
                        for line in text.lines() {
                            println!("  {line}");
                        }
                    }
                    Err(e) => eprintln!("storage node {uuid:016x} ({endpoint}): {}", e.report()),
                }
            }
        }
    }
    if failed > 0 {
        bail!(
            "{failed} of {} storage nodes did not take the settings",
            answers.len()
        );
    }
    Ok(0)
}

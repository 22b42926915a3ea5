//! `/metrics` of a storage process: every storage node it runs, in the
//! Prometheus text format. Per node (label `node`, its uuid in hex): the
//! scrub's progress and the damaged replicas it found
//! ([`crate::storage::scrub`]), and RS3's per-class bytes, queue depth
//! and latency histogram ([`crate::storage::scheduled`]), and the
//! whole-object cache's hits, misses, evictions and size
//! ([`crate::storage::object_cache`]); per metadata node of the process
//! (label `slot`), its repair's copies and rebuilds
//! ([`crate::metadata::state::RepairStats`]).

use crate::metadata::state::RepairStats;
use crate::storage::object_cache::CacheStats;
use crate::storage::replicas::SnStore;
use crate::storage::scheduled::{ClassStats, ScheduleStats, LATENCY_BUCKETS_US};
use crate::storage::scrub::ScrubStats;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use strata_store_protocol::Error;

/// What one storage node shows on `/metrics`.
pub struct NodeMetrics {
    /// The node's uuid.
    pub uuid: u64,
    /// Its scrub's counters.
    pub scrub: ScrubStats,
    /// Its RS3 sender's counters (`None`: the node has none).
    pub schedule: Option<ScheduleStats>,
    /// Its whole-object cache's counters.
    pub object_cache: CacheStats,
    /// What its reads sent: replica data bytes (Gets and ranged reads),
    /// and ranged reads served from a chunk table.
    pub reads: ReadCounts,
}

/// What a storage node's reads sent, at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadCounts {
    /// Replica data bytes sent by Gets and ranged reads.
    pub bytes_sent: u64,
    /// Ranged reads served from a chunk table.
    pub ranges: u64,
}

impl NodeMetrics {
    /// The counters now of the storage node `uuid`, whose store is `store`.
    pub fn of(uuid: u64, store: &SnStore) -> NodeMetrics {
        NodeMetrics {
            uuid,
            scrub: store.scrub_stats(),
            schedule: store.schedule().map(|sender| sender.stats()),
            object_cache: store.object_cache().stats(),
            reads: ReadCounts {
                bytes_sent: store.reads.bytes_sent.load(Ordering::Relaxed),
                ranges: store.reads.ranges.load(Ordering::Relaxed),
            },
        }
    }

    /// What every node of `nodes` (uuid and store) shows now: the source
    /// [`serve`] takes.
    pub fn source(
        nodes: Vec<(u64, Arc<SnStore>)>,
    ) -> Arc<dyn Fn() -> Vec<NodeMetrics> + Send + Sync> {
        Arc::new(move || {
            nodes
                .iter()
                .map(|(uuid, store)| NodeMetrics::of(*uuid, store))
                .collect()
        })
    }
}

/// One metric family's header.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A family of samples read from a `T`: name, type, help, and the field.
type Family<T> = (&'static str, &'static str, &'static str, fn(&T) -> u64);

/// Writes each of `families`, its header then one sample per row of
/// `rows` (the row's labels, and what the family reads from it).
fn families<T>(out: &mut String, families: &[Family<T>], rows: &[(String, &T)]) {
    for (name, kind, help, field) in families {
        family(out, name, kind, help);
        for (labels, row) in rows {
            let _ = writeln!(out, "{name}{{{labels}}} {}", field(row));
        }
    }
}

/// What one metadata node of the process shows on `/metrics`: its
/// repair counters.
pub struct MnMetrics {
    /// The node's slot.
    pub slot: u16,
    /// Its repair since it started.
    pub repair: RepairStats,
}

/// The metadata nodes `nodes` (slot, and where each publishes its
/// repair counters) as a source for [`serve`].
pub fn mn_source(
    nodes: Vec<(u16, Arc<std::sync::Mutex<RepairStats>>)>,
) -> Arc<dyn Fn() -> Vec<MnMetrics> + Send + Sync> {
    Arc::new(move || {
        nodes
            .iter()
            .map(|(slot, stats)| MnMetrics {
                slot: *slot,
                repair: *stats.lock().unwrap_or_else(|e| e.into_inner()),
            })
            .collect()
    })
}

/// Renders `nodes` and `mns` in the Prometheus text format.
pub fn render(nodes: &[NodeMetrics], mns: &[MnMetrics]) -> String {
    let mut out = String::new();
    render_scrub(&mut out, nodes);
    render_schedule(&mut out, nodes);
    render_object_cache(&mut out, nodes);
    render_reads(&mut out, nodes);
    render_repair(&mut out, mns);
    out
}

fn render_repair(out: &mut String, mns: &[MnMetrics]) {
    if mns.is_empty() {
        return;
    }
    let repair: [Family<RepairStats>; 6] = [
        (
            "strata_repair_copies_started_total",
            "counter",
            "Replica copies a metadata node's repair started.",
            |r| r.copies_started,
        ),
        (
            "strata_repair_rebuilds_started_total",
            "counter",
            "Erasure-coded fragment rebuilds a metadata node's repair started.",
            |r| r.rebuilds_started,
        ),
        (
            "strata_repair_committed_total",
            "counter",
            "Copies and rebuilds committed into their record.",
            |r| r.committed,
        ),
        (
            "strata_repair_failed_total",
            "counter",
            "Copies and rebuilds that failed or were overtaken.",
            |r| r.failed,
        ),
        (
            "strata_repair_in_flight",
            "gauge",
            "Copies and rebuilds under way.",
            |r| r.in_flight,
        ),
        (
            "strata_repair_damaged_waiting",
            "gauge",
            "Replica addresses reported damaged and not repaired yet.",
            |r| r.damaged_waiting,
        ),
    ];
    let rows: Vec<(String, &RepairStats)> = mns
        .iter()
        .map(|m| (format!("slot=\"{}\"", m.slot), &m.repair))
        .collect();
    families(out, &repair, &rows);
}

fn render_object_cache(out: &mut String, nodes: &[NodeMetrics]) {
    let cache: [Family<CacheStats>; 6] = [
        (
            "strata_object_cache_hits_total",
            "counter",
            "Whole erasure-coded objects served from the object cache.",
            |c| c.hits,
        ),
        (
            "strata_object_cache_misses_total",
            "counter",
            "Whole-object reads that gathered the fragments (or found the object too large).",
            |c| c.misses,
        ),
        (
            "strata_object_cache_evictions_total",
            "counter",
            "Objects evicted by the Clock-PRO policy to make room.",
            |c| c.evictions,
        ),
        (
            "strata_object_cache_bytes",
            "gauge",
            "Bytes the object cache holds.",
            |c| c.bytes,
        ),
        (
            "strata_object_cache_objects",
            "gauge",
            "Objects the object cache holds.",
            |c| c.entries,
        ),
        (
            "strata_object_cache_budget_bytes",
            "gauge",
            "The object cache's byte budget.",
            |c| c.budget,
        ),
    ];
    let rows: Vec<(String, &CacheStats)> = nodes
        .iter()
        .map(|node| (format!("node=\"{:016x}\"", node.uuid), &node.object_cache))
        .collect();
    families(out, &cache, &rows);
}

fn render_reads(out: &mut String, nodes: &[NodeMetrics]) {
    let reads: [Family<ReadCounts>; 2] = [
        (
            "strata_read_bytes_total",
            "counter",
            "Replica data bytes sent by Gets and ranged reads.",
            |r| r.bytes_sent,
        ),
        (
            "strata_range_reads_total",
            "counter",
            "Ranged reads served from a replica's chunk table.",
            |r| r.ranges,
        ),
    ];
    let rows: Vec<(String, &ReadCounts)> = nodes
        .iter()
        .map(|node| (format!("node=\"{:016x}\"", node.uuid), &node.reads))
        .collect();
    families(out, &reads, &rows);
}

fn render_scrub(out: &mut String, nodes: &[NodeMetrics]) {
    let scrub: [Family<ScrubStats>; 7] = [
        (
            "strata_scrub_passes_total",
            "counter",
            "Scrub passes over every replica finished.",
            |s| s.passes,
        ),
        (
            "strata_scrub_pass_replicas",
            "gauge",
            "Replicas re-read in the pass under way.",
            |s| s.pass_replicas,
        ),
        (
            "strata_scrub_pass_bytes",
            "gauge",
            "Bytes re-read in the pass under way.",
            |s| s.pass_bytes,
        ),
        (
            "strata_scrub_replicas_total",
            "counter",
            "Replicas re-read since the node started.",
            |s| s.total_replicas,
        ),
        (
            "strata_scrub_bytes_total",
            "counter",
            "Bytes re-read since the node started.",
            |s| s.total_bytes,
        ),
        (
            "strata_scrub_damaged_total",
            "counter",
            "Damaged replicas the scrub found.",
            |s| s.damaged,
        ),
        (
            "strata_scrub_reports_total",
            "counter",
            "Damaged-replica reports a metadata node acknowledged.",
            |s| s.reports_sent,
        ),
    ];
    let rows: Vec<(String, &ScrubStats)> = nodes
        .iter()
        .map(|node| (format!("node=\"{:016x}\"", node.uuid), &node.scrub))
        .collect();
    families(out, &scrub, &rows);
    family(
        out,
        "strata_scrub_last_pass_seconds",
        "gauge",
        "When the last scrub pass finished (Unix time; absent before the first).",
    );
    for node in nodes {
        if let Some(ms) = node.scrub.last_pass_unix_ms {
            let _ = writeln!(
                out,
                "strata_scrub_last_pass_seconds{{node=\"{:016x}\"}} {}.{:03}",
                node.uuid,
                ms / 1000,
                ms % 1000
            );
        }
    }
}

fn render_schedule(out: &mut String, nodes: &[NodeMetrics]) {
    let scheduled: Vec<(String, &ScheduleStats)> = nodes
        .iter()
        .filter_map(|node| {
            Some((
                format!("node=\"{:016x}\"", node.uuid),
                node.schedule.as_ref()?,
            ))
        })
        .collect();
    let per_node: [Family<ScheduleStats>; 3] = [
        (
            "strata_rs3_enabled",
            "gauge",
            "1 when Gets are scheduled by RS3.",
            |s| u64::from(s.enabled),
        ),
        (
            "strata_rs3_batch_bytes",
            "gauge",
            "The RS3 batch budget in force.",
            |s| s.batch_bytes,
        ),
        (
            "strata_rs3_batches_total",
            "counter",
            "RS3 batches cut.",
            |s| s.batches,
        ),
    ];
    families(out, &per_node, &scheduled);
    // Every sample of a family follows its header, as the format asks.
    let classes: Vec<(String, &ClassStats)> = scheduled
        .iter()
        .flat_map(|(node, stats)| {
            stats
                .classes
                .iter()
                .map(move |(class, c)| (format!("{node},class=\"{class}\""), c))
        })
        .collect();
    let per_class: [Family<ClassStats>; 2] = [
        (
            "strata_rs3_class_bytes_total",
            "counter",
            "Get body bytes sent, by class.",
            |c| c.bytes_sent,
        ),
        (
            "strata_rs3_class_queued",
            "gauge",
            "Gets waiting or being sent, by class.",
            |c| c.queued,
        ),
    ];
    families(out, &per_class, &classes);
    let name = "strata_rs3_class_latency_seconds";
    family(
        out,
        name,
        "histogram",
        "Time from a Get's hand-off to RS3 to its last byte, by class.",
    );
    for (labels, c) in &classes {
        for (bound, count) in LATENCY_BUCKETS_US.iter().zip(&c.latency_buckets) {
            let le = *bound as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels},le=\"+Inf\"}} {}",
            c.reads_done
        );
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {}",
            c.latency_sum_us as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", c.reads_done);
    }
}

/// Serves `GET /metrics` (and nothing else) on `listener` with what
/// `nodes` gives at each request, until the task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    nodes: Arc<dyn Fn() -> Vec<NodeMetrics> + Send + Sync>,
    mns: Arc<dyn Fn() -> Vec<MnMetrics> + Send + Sync>,
) {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::{Response, StatusCode};
    let handler = move |request: hyper::Request<hyper::body::Incoming>| {
        let nodes = nodes.clone();
        let mns = mns.clone();
        async move {
            let found =
                request.method() == hyper::Method::GET && request.uri().path() == "/metrics";
            let (status, body) = if found {
                (StatusCode::OK, render(&nodes(), &mns()))
            } else {
                (
                    StatusCode::NOT_FOUND,
                    "only GET /metrics is served here\n".to_string(),
                )
            };
            let mut response = Response::new(Full::new(Bytes::from(body)));
            *response.status_mut() = status;
            if let Ok(kind) = "text/plain; version=0.0.4".parse() {
                response
                    .headers_mut()
                    .insert(hyper::header::CONTENT_TYPE, kind);
            }
            response
        }
    };
    strata_http::serve(
        strata_http::Listener::Tcp(listener),
        strata_http::Limits::default(),
        handler,
        std::future::pending::<()>(),
        std::time::Duration::ZERO,
    )
    .await;
}

/// Binds `/metrics`'s listener on `at`.
pub async fn bind(at: SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    tokio::net::TcpListener::bind(at)
        .await
        .map_err(|e| Error::io(format!("binding the metrics endpoint {at}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_and_class_is_rendered_with_its_labels() {
        let mut schedule = ScheduleStats {
            enabled: true,
            batch_bytes: 65536,
            batches: 9,
            ..ScheduleStats::default()
        };
        schedule.classes.insert(
            "acme".into(),
            ClassStats {
                bytes_sent: 4096,
                reads_done: 2,
                queued: 1,
                latency_sum_us: 1500,
                latency_buckets: [0, 1, 2, 2, 2, 2, 2, 2, 2, 2],
            },
        );
        let text = render(
            &[NodeMetrics {
                uuid: 0xab,
                scrub: ScrubStats {
                    passes: 3,
                    damaged: 1,
                    last_pass_unix_ms: Some(1_700_000_000_250),
                    ..ScrubStats::default()
                },
                schedule: Some(schedule),
                object_cache: crate::storage::object_cache::CacheStats {
                    hits: 5,
                    budget: 1 << 20,
                    ..Default::default()
                },
                reads: ReadCounts {
                    bytes_sent: 7,
                    ranges: 2,
                },
            }],
            &[MnMetrics {
                slot: 2,
                repair: RepairStats {
                    rebuilds_started: 4,
                    committed: 3,
                    ..RepairStats::default()
                },
            }],
        );
        for line in [
            "strata_read_bytes_total{node=\"00000000000000ab\"} 7",
            "strata_range_reads_total{node=\"00000000000000ab\"} 2",
            "strata_scrub_passes_total{node=\"00000000000000ab\"} 3",
            "strata_scrub_damaged_total{node=\"00000000000000ab\"} 1",
            "strata_scrub_last_pass_seconds{node=\"00000000000000ab\"} 1700000000.250",
            "strata_rs3_enabled{node=\"00000000000000ab\"} 1",
            "strata_rs3_class_bytes_total{node=\"00000000000000ab\",class=\"acme\"} 4096",
            "strata_rs3_class_queued{node=\"00000000000000ab\",class=\"acme\"} 1",
            "strata_rs3_class_latency_seconds_bucket{node=\"00000000000000ab\",class=\"acme\",le=\"0.001\"} 1",
            "strata_rs3_class_latency_seconds_bucket{node=\"00000000000000ab\",class=\"acme\",le=\"+Inf\"} 2",
            "strata_rs3_class_latency_seconds_count{node=\"00000000000000ab\",class=\"acme\"} 2",
            "strata_object_cache_hits_total{node=\"00000000000000ab\"} 5",
            "strata_object_cache_budget_bytes{node=\"00000000000000ab\"} 1048576",
            "strata_repair_rebuilds_started_total{slot=\"2\"} 4",
            "strata_repair_committed_total{slot=\"2\"} 3",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        // Each family's samples follow its own header, none after another's.
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                current = rest.split(' ').next().unwrap_or_default().to_string();
            } else if !line.starts_with('#') {
                assert!(
                    line.starts_with(&current),
                    "{line:?} outside its family {current}"
                );
            }
        }
    }
}

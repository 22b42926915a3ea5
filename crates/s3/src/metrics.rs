//! The gateway's `/metrics`, in the Prometheus text format: requests by
//! operation and status, bytes received and sent by operation, and a
//! latency histogram by operation (from a request's arrival to its
//! response's last byte). Served on the S3 port itself, to an unsigned
//! `GET /metrics` (a signed one is S3's: a bucket may be named
//! `metrics`).
//!
//! Each request carries an [`Operation`] slot in its extensions; the
//! access check ([`crate::presigned::Access`]) fills it with the name
//! s3s routed it to, and the response body records the request when it
//! is dropped: sent whole, or cut short by a client that went away.

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use s3s::service::S3Service;
use s3s::{HttpError, HttpResponse};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Instant;
use strata_store_client::client::local_metadata::LocalMetadata;

/// Upper bounds of the latency buckets, in seconds.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

/// The operation label of a request s3s refused before routing it (a bad
/// signature, a malformed request).
const UNROUTED: &str = "unrouted";

/// The S3 operation a request was routed to, filled in by the access
/// check.
#[derive(Clone, Default)]
pub(crate) struct Operation(Arc<Mutex<Option<String>>>);

impl Operation {
    /// Records the operation's name.
    pub fn set(&self, name: &str) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(name.to_string());
    }

    fn name(&self) -> String {
        let name = self.0.lock().unwrap_or_else(|e| e.into_inner());
        name.clone().unwrap_or_else(|| UNROUTED.to_string())
    }
}

/// Counters of one operation.
#[derive(Default)]
struct PerOperation {
    bytes_in: u64,
    bytes_out: u64,
    buckets: [u64; LATENCY_BUCKETS.len()],
    seconds: f64,
    count: u64,
}

/// The gateway's counters. Their labels are bounded: operations are
/// s3s's names (or [`UNROUTED`]), statuses HTTP's.
#[derive(Default)]
pub struct Metrics {
    counters: Mutex<Counters>,
    /// Response body bytes sent with `sendfile` from a local replica.
    sendfile_bytes: AtomicU64,
    /// The gateway's store clients, whose replica choice (NAMI's
    /// latencies and weights) is shown too.
    clients: Option<crate::Clients>,
    /// The local replicas, whose pinned ones are shown.
    local: Option<std::sync::Arc<strata_store_client::client::local::LocalDisk>>,
    /// This process's metadata nodes, whose direct calls are counted.
    local_metadata: Option<std::sync::Arc<dyn LocalMetadata>>,
}

impl Metrics {
    /// Counters that also show the replica choice of `clients`, the
    /// pinned replicas of `local` and the direct calls to
    /// `local_metadata`.
    pub(crate) fn with_clients(
        clients: crate::Clients,
        local: Option<std::sync::Arc<strata_store_client::client::local::LocalDisk>>,
        local_metadata: Option<std::sync::Arc<dyn LocalMetadata>>,
    ) -> Metrics {
        Metrics {
            clients: Some(clients),
            local,
            local_metadata,
            ..Metrics::default()
        }
    }

    /// The records asked of this process's metadata nodes by a direct
    /// call, answered or declined (the node busy: asked by datagram).
    fn render_direct_calls(&self, out: &mut String) {
        let Some(nodes) = &self.local_metadata else {
            return;
        };
        let counts = nodes.counts();
        let rows = [
            (
                "strata_s3_metadata_direct_total",
                "Records of objects asked of this process's metadata nodes by a direct call \
                 and answered that way.",
                counts.answered,
            ),
            (
                "strata_s3_metadata_direct_declined_total",
                "Records of objects asked of this process's metadata nodes by datagram: the node \
                 was busy, or would have read the record from its disk.",
                counts.declined,
            ),
        ];
        for (name, help, value) in rows {
            family(out, name, "counter", help);
            let _ = writeln!(out, "{name} {value}");
        }
    }

    /// The local replicas pinned in memory once checked.
    fn render_pinned(&self, out: &mut String) {
        let Some(local) = &self.local else { return };
        let stats = local.pinned.stats();
        let rows = [
            (
                "strata_s3_pinned_bytes",
                "gauge",
                "Bytes of local replicas locked in memory once checked.",
                stats.bytes,
            ),
            (
                "strata_s3_pinned_replicas",
                "gauge",
                "Local replicas locked in memory once checked.",
                stats.replicas,
            ),
            (
                "strata_s3_pinned_hits_total",
                "counter",
                "Whole GETs sent from a pinned replica without reading it again.",
                stats.hits,
            ),
            (
                "strata_s3_pinned_total",
                "counter",
                "Local replicas pinned since the start.",
                stats.pinned_total,
            ),
        ];
        for (name, kind, help, value) in rows {
            family(out, name, kind, help);
            let _ = writeln!(out, "{name} {value}");
        }
    }

    /// Per store client (label `tenant`, its access key's tenant) and
    /// storage node (label `node`): NAMI's latency estimate, weight,
    /// share of the draws and reads sent.
    fn render_choice(&self, out: &mut String) {
        let Some(clients) = &self.clients else { return };
        let clients: Vec<(String, std::sync::Arc<strata_store_client::client::Client>)> = clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(key, client)| (key.clone(), client.clone()))
            .collect();
        let mut rows = Vec::new();
        for (key, client) in &clients {
            let tenant = key.split('~').next().unwrap_or_default();
            for node in client.replica_view() {
                let labels = format!("tenant=\"{tenant}\",node=\"{:016x}\"", node.node);
                rows.push((labels, node));
            }
        }
        type Field = fn(&strata_store_client::client::NodeView) -> Option<f64>;
        let families: [(&str, &str, &str, Field); 4] = [
            (
                "strata_s3_store_node_latency_seconds",
                "gauge",
                "The store client's latency estimate of a storage node (NAMI's EWMA).",
                |n| n.latency_ms.map(|ms| ms / 1000.0),
            ),
            (
                "strata_s3_store_node_weight",
                "gauge",
                "The node's weight in the replica choice (NAMI's ranking).",
                |n| Some(f64::from(n.weight)),
            ),
            (
                "strata_s3_store_node_share",
                "gauge",
                "The node's chance of being drawn first for a read.",
                |n| Some(n.share),
            ),
            (
                "strata_s3_store_node_reads_total",
                "counter",
                "Reads the client sent the node.",
                |n| Some(n.reads as f64),
            ),
        ];
        for (name, kind, help, field) in families {
            family(out, name, kind, help);
            for (labels, node) in &rows {
                if let Some(value) = field(node) {
                    let _ = writeln!(out, "{name}{{{labels}}} {value}");
                }
            }
        }
    }
}

#[derive(Default)]
struct Counters {
    requests: BTreeMap<(String, u16), u64>,
    operations: BTreeMap<String, PerOperation>,
}

/// One request, as its response ends.
struct Done {
    operation: String,
    status: u16,
    bytes_in: u64,
    bytes_out: u64,
    seconds: f64,
}

impl Metrics {
    fn record(&self, done: Done) {
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        *counters
            .requests
            .entry((done.operation.clone(), done.status))
            .or_default() += 1;
        let per = counters.operations.entry(done.operation).or_default();
        per.bytes_in += done.bytes_in;
        per.bytes_out += done.bytes_out;
        per.seconds += done.seconds;
        per.count += 1;
        for (bucket, bound) in per.buckets.iter_mut().zip(LATENCY_BUCKETS) {
            if done.seconds <= bound {
                *bucket += 1;
            }
        }
    }

    /// The counters in the Prometheus text format.
    pub fn render(&self) -> String {
        let counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        family(
            &mut out,
            "strata_s3_requests_total",
            "counter",
            "S3 requests answered, by operation and HTTP status.",
        );
        for ((operation, status), count) in &counters.requests {
            let _ = writeln!(
                out,
                "strata_s3_requests_total{{operation=\"{operation}\",status=\"{status}\"}} {count}"
            );
        }
        let bytes: [ByteFamily; 2] = [
            (
                "strata_s3_received_bytes_total",
                "Request body bytes received, by operation.",
                |per| per.bytes_in,
            ),
            (
                "strata_s3_sent_bytes_total",
                "Response body bytes sent, by operation.",
                |per| per.bytes_out,
            ),
        ];
        for (name, help, field) in bytes {
            family(&mut out, name, "counter", help);
            for (operation, per) in &counters.operations {
                let _ = writeln!(out, "{name}{{operation=\"{operation}\"}} {}", field(per));
            }
        }
        let name = "strata_s3_request_duration_seconds";
        family(
            &mut out,
            name,
            "histogram",
            "Time from a request's arrival to its response's last byte, by operation.",
        );
        for (operation, per) in &counters.operations {
            let labels = format!("operation=\"{operation}\"");
            for (bound, count) in LATENCY_BUCKETS.iter().zip(&per.buckets) {
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {count}");
            }
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", per.count);
            let _ = writeln!(out, "{name}_sum{{{labels}}} {}", per.seconds);
            let _ = writeln!(out, "{name}_count{{{labels}}} {}", per.count);
        }
        drop(counters);
        let name = "strata_s3_sendfile_bytes_total";
        family(
            &mut out,
            name,
            "counter",
            "Response body bytes sent with sendfile from a replica file on this process's disk \
             (counted in strata_s3_sent_bytes_total too).",
        );
        let sent = self.sendfile_bytes.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name} {sent}");
        self.render_pinned(&mut out);
        self.render_direct_calls(&mut out);
        self.render_choice(&mut out);
        out
    }
}

/// A family of byte counters: name, help, and the field it reads.
type ByteFamily = (&'static str, &'static str, fn(&PerOperation) -> u64);

/// One metric family's header.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Whether `request` asks for the metrics: an unsigned `GET /metrics`.
fn is_scrape<B>(request: &hyper::Request<B>) -> bool {
    let signed_query = request
        .uri()
        .query()
        .is_some_and(|query| query.contains("X-Amz-Signature"));
    request.method() == hyper::Method::GET
        && request.uri().path() == "/metrics"
        && !request.headers().contains_key(hyper::header::AUTHORIZATION)
        && !signed_query
}

/// Serves one HTTP request: the metrics to a scrape, else S3 through
/// `service`, measured.
pub(crate) async fn handle<B>(
    service: S3Service,
    metrics: Arc<Metrics>,
    mut request: hyper::Request<B>,
) -> Result<HttpResponse<Measured>, HttpError>
where
    B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    if is_scrape(&request) {
        let mut response = HttpResponse::new(Measured {
            body: s3s::Body::from(metrics.render()),
            record: None,
        });
        if let Ok(kind) = "text/plain; version=0.0.4".parse() {
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, kind);
        }
        return Ok(response);
    }
    let started = Instant::now();
    let operation = Operation::default();
    request.extensions_mut().insert(operation.clone());
    let received = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicBool::new(request.body().is_end_stream()));
    let (count, end) = (received.clone(), finished.clone());
    let request = request.map(move |body| s3s::Body::http_body(Counted { body, count, end }));
    let mut response = service.call(request).await?;
    if !finished.load(Ordering::Relaxed) {
        // Answered before its body was read (a refusal): the rest of the
        // body must not be taken for the next request on the connection,
        // which hyper otherwise sometimes does (a bare 400 to the next).
        response.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
    }
    let status = response.status().as_u16();
    Ok(response.map(|body| Measured {
        body,
        record: Some(Record {
            metrics,
            operation,
            status,
            received,
            sent: 0,
            started,
        }),
    }))
}

/// A request body that counts the bytes it gives, and tells when it
/// was read to its end.
struct Counted<B> {
    body: B,
    count: Arc<AtomicU64>,
    end: Arc<AtomicBool>,
}

impl<B: Body<Data = Bytes> + Unpin> Body for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    self.count.fetch_add(data.len() as u64, Ordering::Relaxed);
                }
            }
            Some(Err(_)) => {}
            None => self.end.store(true, Ordering::Relaxed),
        }
        if self.body.is_end_stream() {
            self.end.store(true, Ordering::Relaxed);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// What a measured response records when it ends.
struct Record {
    metrics: Arc<Metrics>,
    operation: Operation,
    status: u16,
    received: Arc<AtomicU64>,
    sent: u64,
    started: Instant,
}

/// A response body that records its request in the metrics once it is
/// dropped (sent whole or abandoned).
pub(crate) struct Measured {
    body: s3s::Body,
    record: Option<Record>,
}

impl Measured {
    /// Counts `bytes` of the response sent by the connection itself
    /// (with `sendfile`) in place of this body's.
    pub(crate) fn sent_directly(&mut self, bytes: u64) {
        if let Some(record) = self.record.as_mut() {
            record.sent += bytes;
            record
                .metrics
                .sendfile_bytes
                .fetch_add(bytes, Ordering::Relaxed);
        }
    }
}

impl Body for Measured {
    type Data = Bytes;
    type Error = s3s::StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, s3s::StdError>>> {
        let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
        if let Some(Ok(frame)) = &frame {
            let length = frame.data_ref().map_or(0, |data| data.len() as u64);
            if let Some(record) = self.record.as_mut() {
                record.sent += length;
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Measured {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            record.metrics.record(Done {
                operation: record.operation.name(),
                status: record.status,
                bytes_in: record.received.load(Ordering::Relaxed),
                bytes_out: record.sent,
                seconds: record.started.elapsed().as_secs_f64(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_rendered_by_operation_status_and_latency() {
        let metrics = Metrics::default();
        for (operation, status, seconds) in [("GetObject", 200, 0.003), ("GetObject", 404, 2.0)] {
            metrics.record(Done {
                operation: operation.into(),
                status,
                bytes_in: 0,
                bytes_out: 100,
                seconds,
            });
        }
        let text = metrics.render();
        for line in [
            "strata_s3_requests_total{operation=\"GetObject\",status=\"200\"} 1",
            "strata_s3_requests_total{operation=\"GetObject\",status=\"404\"} 1",
            "strata_s3_sent_bytes_total{operation=\"GetObject\"} 200",
            "strata_s3_request_duration_seconds_bucket{operation=\"GetObject\",le=\"0.0025\"} 0",
            "strata_s3_request_duration_seconds_bucket{operation=\"GetObject\",le=\"0.005\"} 1",
            "strata_s3_request_duration_seconds_bucket{operation=\"GetObject\",le=\"5\"} 2",
            "strata_s3_request_duration_seconds_bucket{operation=\"GetObject\",le=\"+Inf\"} 2",
            "strata_s3_request_duration_seconds_count{operation=\"GetObject\"} 2",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}

//! One client of a run: a keep-alive HTTP/1.1 connection (made again after
//! a transport error), requests in a closed loop, and its tally.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use super::request::Plan;
use super::{Operation, MAX_ERROR_SAMPLES};
use crate::error::{Error, Result};

/// How much of an error answer's body is read to find its S3 code; a
/// longer body closes the connection instead.
const ERROR_BODY_LIMIT_BYTES: usize = 4096;
/// The pause after a failed connect, so a refused port does not spin.
const RECONNECT_PAUSE: Duration = Duration::from_millis(10);
/// The slowest latency a histogram records (an hour, in microseconds).
const LATENCY_LIMIT_MICROSECONDS: u64 = 3_600_000_000;

/// What one client (or, merged, the run) counted.
pub struct ClientTally {
    pub requests: u64,
    pub errors: u64,
    pub bytes: u64,
    pub latency: Histogram<u64>,
    pub statuses: BTreeMap<u16, u64>,
    pub error_samples: Vec<String>,
    /// When its last answer arrived.
    pub finished: Option<Instant>,
}

impl ClientTally {
    pub fn new() -> ClientTally {
        ClientTally {
            requests: 0,
            errors: 0,
            bytes: 0,
            latency: Histogram::new_with_bounds(1, LATENCY_LIMIT_MICROSECONDS, 3)
                .expect("constant histogram bounds are valid"),
            statuses: BTreeMap::new(),
            error_samples: Vec::new(),
            finished: None,
        }
    }

    fn error(&mut self, status: u16, text: String) {
        self.errors += 1;
        *self.statuses.entry(status).or_default() += 1;
        if self.error_samples.len() < MAX_ERROR_SAMPLES && !self.error_samples.contains(&text) {
            self.error_samples.push(text);
        }
    }

    pub fn merge(&mut self, other: ClientTally) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.bytes += other.bytes;
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = self.latency.add(&other.latency);
        for (status, count) in other.statuses {
            *self.statuses.entry(status).or_default() += count;
        }
        for sample in other.error_samples {
            if self.error_samples.len() < MAX_ERROR_SAMPLES && !self.error_samples.contains(&sample)
            {
                self.error_samples.push(sample);
            }
        }
        self.finished = self.finished.max(other.finished);
    }
}

/// What one request came to.
enum Outcome {
    /// A 2xx answer with the expected body; the payload bytes moved.
    Success { status: u16, bytes: u64 },
    /// Anything else: the status (0 for a transport error), what it was,
    /// and whether the connection can carry the next request.
    Failure {
        status: u16,
        text: String,
        reusable: bool,
    },
}

/// Sends requests in a closed loop until `deadline`; client `client` of
/// `clients` uses objects `client`, `client + clients`, ... in turn.
pub async fn run_client(
    plan: Arc<Plan>,
    address: SocketAddr,
    client: usize,
    clients: usize,
    deadline: Instant,
) -> ClientTally {
    let mut tally = ClientTally::new();
    let mut connection: Option<SendRequest<Full<Bytes>>> = None;
    let mut turn = 0usize;
    while Instant::now() < deadline {
        let index = client.wrapping_add(turn.wrapping_mul(clients)) % plan.objects;
        turn = turn.wrapping_add(1);
        // A server may close a keep-alive connection between answers
        // (HTTP/1.0 servers after each one): connect anew without
        // counting an error, since no request was lost.
        if let Some(sender) = &mut connection {
            if sender.ready().await.is_err() {
                connection = None;
            }
        }
        let sender = match &mut connection {
            Some(sender) => sender,
            None => match connect(address).await {
                Ok(sender) => connection.insert(sender),
                Err(text) => {
                    tally.error(0, text);
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                    continue;
                }
            },
        };
        let request = match plan.request(plan.operation, index) {
            Ok(request) => request,
            Err(text) => {
                tally.error(0, text);
                continue;
            }
        };
        let started = Instant::now();
        match exchange(sender, request, plan.operation, plan.size_bytes).await {
            Outcome::Success { status, bytes } => {
                let micros = started.elapsed().as_micros() as u64;
                tally.requests += 1;
                tally.bytes += bytes;
                *tally.statuses.entry(status).or_default() += 1;
                let _ = tally
                    .latency
                    .record(micros.clamp(1, LATENCY_LIMIT_MICROSECONDS));
            }
            Outcome::Failure {
                status,
                text,
                reusable,
            } => {
                tally.error(status, text);
                if !reusable {
                    connection = None;
                }
            }
        }
        tally.finished = Some(Instant::now());
    }
    tally
}

/// PUTs every object once, spread over `clients` connections, before a
/// GET run's clock starts; the first failure ends the run with its cause.
pub async fn prepare(plan: &Arc<Plan>, address: SocketAddr, clients: usize) -> Result<()> {
    let workers = clients.min(plan.objects);
    let mut tasks = Vec::with_capacity(workers);
    for worker in 0..workers {
        let plan = Arc::clone(plan);
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(address).await?;
            for index in (worker..plan.objects).step_by(workers) {
                let request = plan.request(Operation::Put, index)?;
                match exchange(&mut sender, request, Operation::Put, plan.size_bytes).await {
                    Outcome::Success { .. } => {}
                    Outcome::Failure { text, .. } => {
                        return Err(format!("the PUT of object {index} failed: {text}"))
                    }
                }
            }
            Ok::<(), String>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|source| Error::Load(format!("a preparing task failed: {source}")))?
            .map_err(|text| {
                Error::Load(format!(
                    "--prepare could not write the objects: {text}; check the endpoint, the bucket and the keys"
                ))
            })?;
    }
    Ok(())
}

async fn connect(address: SocketAddr) -> std::result::Result<SendRequest<Full<Bytes>>, String> {
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|error| format!("cannot connect to {address}: {error}"))?;
    // Requests are small and latency-bound: never wait for Nagle.
    let _ = stream.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| format!("HTTP handshake with {address} failed: {error}"))?;
    // The connection's own task; its errors surface on the next send.
    tokio::spawn(connection);
    Ok(sender)
}

/// Sends one request and reads its whole answer.
async fn exchange(
    sender: &mut SendRequest<Full<Bytes>>,
    request: http::Request<Full<Bytes>>,
    operation: Operation,
    size_bytes: u64,
) -> Outcome {
    let transport = |text: String| Outcome::Failure {
        status: 0,
        text,
        reusable: false,
    };
    if let Err(error) = sender.ready().await {
        return transport(format!("the connection closed: {error}"));
    }
    let response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(error) => return transport(format!("the request failed: {error}")),
    };
    let status = response.status().as_u16();
    let mut body = response.into_body();
    if !(200..300).contains(&status) {
        let mut text = Vec::new();
        let mut reusable = true;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Some(data) = frame.data_ref() {
                        text.extend_from_slice(data);
                    }
                    if text.len() > ERROR_BODY_LIMIT_BYTES {
                        reusable = false;
                        break;
                    }
                }
                Err(_) => {
                    reusable = false;
                    break;
                }
            }
        }
        return Outcome::Failure {
            status,
            text: format!("{status} {}", error_code(&text)),
            reusable,
        };
    }
    let mut received = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    received += data.len() as u64;
                }
            }
            Err(error) => return transport(format!("the answer's body broke off: {error}")),
        }
    }
    match operation {
        Operation::Get if received != size_bytes => Outcome::Failure {
            status,
            text: format!("{status} with {received} bytes instead of {size_bytes}"),
            reusable: true,
        },
        Operation::Get => Outcome::Success {
            status,
            bytes: received,
        },
        Operation::Put => Outcome::Success {
            status,
            bytes: size_bytes,
        },
    }
}

/// The `<Code>` and `<Message>` of an S3 error body (the message cut
/// at 160 characters), or a note that there was no code.
fn error_code(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let element = |name: &str| {
        let open = format!("<{name}>");
        let close = format!("</{name}>");
        let start = text.find(&open)? + open.len();
        let end = start + text[start..].find(&close)?;
        Some(text[start..end].to_string())
    };
    match (element("Code"), element("Message")) {
        (Some(code), Some(message)) => {
            format!("{code}: {}", message.chars().take(160).collect::<String>())
        }
        (Some(code), None) => code,
        _ => "(no S3 error code)".to_string(),
    }
}

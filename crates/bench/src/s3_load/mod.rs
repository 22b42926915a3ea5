//! `strata bench s3`: a closed-loop load generator for S3 endpoints (and
//! plain HTTP servers such as nginx), many clients from one process.
//!
//! Each client holds one keep-alive HTTP/1.1 connection and sends its next
//! request as soon as the previous answer's last byte arrived, for the
//! run's duration. Requests are signed with AWS Signature V4 by the
//! `aws-sigv4` crate the AWS SDKs use, as aws-cli signs them over plain
//! HTTP: the headers `host`, `x-amz-content-sha256` (the payload's SHA-256,
//! computed once since every PUT sends the same bytes) and `x-amz-date`.
//! Unsigned runs GET the same paths (`/BUCKET/KEY`) from any HTTP server,
//! so nginx can serve the very files an S3 run reads.
//!
//! An answer counts as a success only when its status is 2xx and, for a
//! GET, its body has exactly the object's size; anything else (a refused
//! signature, a missing key, a short body, a broken connection) counts as
//! an error, with the first few kept as samples. Never prints.

mod client;
mod request;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

pub use request::Credentials;

/// The most clients one run may have: each holds a socket and a task.
pub const MAX_CLIENTS: usize = 4096;
/// The largest object: the PUT body is held in memory once.
pub const MAX_OBJECT_BYTES: u64 = 1 << 30;
/// The most distinct keys a run cycles over.
pub const MAX_OBJECTS: usize = 1 << 20;
/// The longest run.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);
/// How many error samples a report keeps (distinct texts).
pub const MAX_ERROR_SAMPLES: usize = 8;

/// What each request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// GetObject (or a plain GET of the same path).
    Get,
    /// PutObject of `size_bytes` bytes.
    Put,
}

impl Operation {
    /// The HTTP method.
    pub fn method(self) -> &'static str {
        match self {
            Operation::Get => "GET",
            Operation::Put => "PUT",
        }
    }
}

/// What a run does and against what.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// `http://HOST:PORT` of the server (no path; TLS is not supported).
    pub endpoint: String,
    /// The key pair to sign with; `None` sends unsigned requests.
    pub credentials: Option<Credentials>,
    /// The bucket: the first segment of every path.
    pub bucket: String,
    /// Keys are this prefix followed by the object's index.
    pub key_prefix: String,
    /// GET or PUT.
    pub operation: Operation,
    /// Each object's size.
    pub size_bytes: u64,
    /// Concurrent clients, each with its own connection.
    pub clients: usize,
    /// Distinct keys, used in turn by the clients.
    pub objects: usize,
    /// How long requests are sent.
    pub duration: Duration,
    /// For a GET run: PUT every object once before the clock starts.
    pub prepare: bool,
    /// The runtime's worker threads.
    pub threads: usize,
}

/// One key of a run: the prefix and the index.
pub fn object_key(prefix: &str, index: usize) -> String {
    format!("{prefix}{index}")
}

/// The byte at `offset` of every object a run writes (so files written
/// by other tools for an unsigned run can hold the same bytes).
pub fn object_byte(offset: u64) -> u8 {
    // A pattern that is neither zero nor periodic on page boundaries, so
    // no layer can store it as a hole or deduplicate it trivially.
    (offset.wrapping_mul(2_654_435_761) >> 13) as u8
}

/// The measured outcome of a run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LoadReport {
    /// GET or PUT.
    pub operation: String,
    /// Each object's size.
    pub size_bytes: u64,
    /// The clients.
    pub clients: usize,
    /// Requests answered with success.
    pub requests: u64,
    /// Requests that failed (any status other than 2xx, a wrong body size,
    /// a transport error).
    pub errors: u64,
    /// Payload bytes moved by successful requests.
    pub bytes: u64,
    /// From the first request to the last answer.
    pub seconds: f64,
    /// Successful requests per second.
    pub requests_per_second: f64,
    /// Payload megabytes (10^6 bytes) per second.
    pub megabytes_per_second: f64,
    /// Latency percentiles of successful requests, in microseconds.
    pub latency_p50_microseconds: u64,
    /// The 99th percentile.
    pub latency_p99_microseconds: u64,
    /// The slowest.
    pub latency_max_microseconds: u64,
    /// Answers by HTTP status (0 for a transport error).
    pub statuses: BTreeMap<u16, u64>,
    /// The first distinct error texts.
    pub error_samples: Vec<String>,
}

impl LoadOptions {
    /// Checks every bound, so a run never starts with a value it would
    /// misuse; each error names the option and what to give instead.
    pub fn check(&self) -> Result<()> {
        let refuse = |message: String| Err(Error::Argument(message));
        if self.clients == 0 || self.clients > MAX_CLIENTS {
            return refuse(format!(
                "--clients {}: give 1 to {MAX_CLIENTS}",
                self.clients
            ));
        }
        if self.objects == 0 || self.objects > MAX_OBJECTS {
            return refuse(format!(
                "--objects {}: give 1 to {MAX_OBJECTS}",
                self.objects
            ));
        }
        if self.size_bytes > MAX_OBJECT_BYTES {
            return refuse(format!(
                "--size {} bytes: at most {MAX_OBJECT_BYTES} (1 GiB); the PUT body is held in memory",
                self.size_bytes
            ));
        }
        if self.duration.is_zero() || self.duration > MAX_DURATION {
            return refuse(format!(
                "--duration {:?}: give more than zero and at most an hour",
                self.duration
            ));
        }
        if self.threads == 0 || self.threads > 256 {
            return refuse(format!("--threads {}: give 1 to 256", self.threads));
        }
        check_bucket(&self.bucket)?;
        check_key_prefix(&self.key_prefix)?;
        if self.credentials.is_none() && self.operation == Operation::Put {
            return refuse(
                "--op put needs --access-key and --secret-key: an unsigned run only GETs".into(),
            );
        }
        if self.credentials.is_none() && self.prepare {
            return refuse(
                "--prepare PUTs the objects first and needs --access-key and --secret-key".into(),
            );
        }
        if self.prepare && self.operation == Operation::Put {
            return refuse("--prepare applies to --op get only".into());
        }
        request::Endpoint::parse(&self.endpoint)?;
        Ok(())
    }
}

/// S3's bucket naming rules (3 to 63 of `a-z 0-9 . -`), which also keep
/// the path free of characters to escape.
fn check_bucket(bucket: &str) -> Result<()> {
    let valid = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(Error::Argument(format!(
            "--bucket {bucket:?}: give 3 to 63 characters of a-z, 0-9, '.' and '-'"
        )))
    }
}

/// Key prefixes of unreserved characters only, so the path is the same
/// escaped or not (what the signature and every server agree on).
fn check_key_prefix(prefix: &str) -> Result<()> {
    let valid = prefix.len() <= 512
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/' | b'~'));
    if valid && !prefix.starts_with('/') {
        Ok(())
    } else {
        Err(Error::Argument(format!(
            "--key-prefix {prefix:?}: give at most 512 characters of A-Z, a-z, 0-9, '-', '_', '.', '~' and '/', not starting with '/'"
        )))
    }
}

/// Runs the load described by `options` (checked first) and measures it.
/// Fails only when the run cannot start: a bad option, an endpoint that
/// does not resolve, or a `prepare` PUT refused; failures during the
/// measured part are counted in the report.
pub fn run(options: &LoadOptions) -> Result<LoadReport> {
    options.check()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.threads)
        .enable_all()
        .build()
        .map_err(|source| Error::Load(format!("cannot start the load's runtime: {source}")))?;
    runtime.block_on(run_async(options))
}

async fn run_async(options: &LoadOptions) -> Result<LoadReport> {
    let endpoint = request::Endpoint::parse(&options.endpoint)?;
    let address = resolve(&endpoint).await?;
    let plan = Arc::new(request::Plan::new(options, endpoint));
    if options.prepare {
        client::prepare(&plan, address, options.clients).await?;
    }
    let started = Instant::now();
    let deadline = started + options.duration;
    let mut tasks = Vec::with_capacity(options.clients);
    for index in 0..options.clients {
        let plan = Arc::clone(&plan);
        tasks.push(tokio::spawn(client::run_client(
            plan,
            address,
            index,
            options.clients,
            deadline,
        )));
    }
    let mut total = client::ClientTally::new();
    for task in tasks {
        let tally = task
            .await
            .map_err(|source| Error::Load(format!("a client task failed: {source}")))?;
        total.merge(tally);
    }
    let seconds = total
        .finished
        .map_or(options.duration, |at| at.saturating_duration_since(started))
        .as_secs_f64()
        .max(1e-9);
    Ok(LoadReport {
        operation: options.operation.method().to_string(),
        size_bytes: options.size_bytes,
        clients: options.clients,
        requests: total.requests,
        errors: total.errors,
        bytes: total.bytes,
        seconds,
        requests_per_second: total.requests as f64 / seconds,
        megabytes_per_second: total.bytes as f64 / seconds / 1e6,
        latency_p50_microseconds: total.latency.value_at_quantile(0.50),
        latency_p99_microseconds: total.latency.value_at_quantile(0.99),
        latency_max_microseconds: total.latency.max(),
        statuses: total.statuses,
        error_samples: total.error_samples,
    })
}

async fn resolve(endpoint: &request::Endpoint) -> Result<SocketAddr> {
    let authority = format!("{}:{}", endpoint.host, endpoint.port);
    let mut addresses = tokio::net::lookup_host(authority.as_str())
        .await
        .map_err(|source| {
            Error::Load(format!("cannot resolve the endpoint {authority}: {source}"))
        })?;
    addresses
        .next()
        .ok_or_else(|| Error::Load(format!("the endpoint {authority} resolves to no address")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> LoadOptions {
        LoadOptions {
            endpoint: "http://127.0.0.1:9000".into(),
            credentials: Some(Credentials {
                access_key: "a".into(),
                secret_key: "s".into(),
                region: "us-east-1".into(),
            }),
            bucket: "bench".into(),
            key_prefix: "obj-".into(),
            operation: Operation::Get,
            size_bytes: 4096,
            clients: 4,
            objects: 4,
            duration: Duration::from_secs(1),
            prepare: true,
            threads: 2,
        }
    }

    #[test]
    fn good_options_pass_and_each_bad_one_is_named() {
        options().check().unwrap();
        type Change = Box<dyn Fn(&mut LoadOptions)>;
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|o| o.clients = 0), "--clients"),
            (Box::new(|o| o.objects = 0), "--objects"),
            (Box::new(|o| o.size_bytes = MAX_OBJECT_BYTES + 1), "--size"),
            (Box::new(|o| o.duration = Duration::ZERO), "--duration"),
            (Box::new(|o| o.bucket = "B!".into()), "--bucket"),
            (Box::new(|o| o.key_prefix = "a b".into()), "--key-prefix"),
            (Box::new(|o| o.endpoint = "https://x:1".into()), "http://"),
            (Box::new(|o| o.endpoint = "http://x".into()), "port"),
            (Box::new(|o| o.endpoint = "http://x:1/path".into()), "path"),
            (
                Box::new(|o| {
                    o.credentials = None;
                    o.prepare = false;
                    o.operation = Operation::Put;
                }),
                "--op put",
            ),
        ];
        for (change, named) in cases {
            let mut bad = options();
            change(&mut bad);
            let message = bad.check().unwrap_err().to_string();
            assert!(message.contains(named), "{message:?} should name {named}");
        }
    }

    #[test]
    fn the_object_pattern_is_not_periodic_on_pages() {
        assert_ne!(
            (0..4096).map(object_byte).collect::<Vec<_>>(),
            (4096..8192).map(object_byte).collect::<Vec<_>>()
        );
    }
}

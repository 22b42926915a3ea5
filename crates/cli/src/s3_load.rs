//! `strata bench s3`: parse the load's options, run it (strata-bench's
//! `s3_load`), render its report.

use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use strata_bench::s3_load::{self, Credentials, LoadOptions, LoadReport, Operation};

use crate::volume::Output;

/// The operation each request does.
#[derive(Clone, Copy, ValueEnum)]
pub enum OperationName {
    /// GetObject (or a plain GET with --unsigned).
    Get,
    /// PutObject.
    Put,
}

/// `strata bench s3` options.
#[derive(Args)]
pub struct S3LoadArgs {
    /// The server: http://HOST:PORT (an S3 gateway, or any HTTP server
    /// with --unsigned).
    #[arg(long)]
    endpoint: String,
    /// The S3 access key id to sign with.
    #[arg(long = "access-key", env = "AWS_ACCESS_KEY_ID")]
    access_key: Option<String>,
    /// The S3 secret key to sign with.
    #[arg(
        long = "secret-key",
        env = "AWS_SECRET_ACCESS_KEY",
        hide_env_values = true
    )]
    secret_key: Option<String>,
    /// The region in the signature's scope.
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// Send unsigned GETs (to nginx or another plain HTTP server serving
    /// BUCKET/KEY files).
    #[arg(long, conflicts_with_all = ["access_key", "secret_key", "prepare"])]
    unsigned: bool,
    /// The bucket (the first segment of every path).
    #[arg(long)]
    bucket: String,
    /// Keys are this prefix followed by the object's index (0, 1, ...).
    #[arg(long = "key-prefix", default_value = "bench-")]
    key_prefix: String,
    /// GET or PUT.
    #[arg(long = "op", value_enum)]
    operation: OperationName,
    /// Each object's size: bytes, or with a binary suffix (4KiB, 1MiB, 64M).
    #[arg(long, value_parser = parse_object_size)]
    size: u64,
    /// Concurrent clients, each with its own keep-alive connection.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Distinct keys, used in turn (default: one per client).
    #[arg(long)]
    objects: Option<usize>,
    /// How long to send requests (10s, 1m).
    #[arg(long, default_value = "10s", value_parser = crate::units::parse_duration)]
    duration: Duration,
    /// For --op get: PUT every object once before the clock starts.
    #[arg(long)]
    prepare: bool,
    /// The load generator's threads (default: the CPUs this process may use).
    #[arg(long)]
    threads: Option<usize>,
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    output: Output,
}

/// Sizes as S3 tools write them: `4KiB`, `1MiB` as well as `4k`, `64M`.
fn parse_object_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let plain = trimmed.strip_suffix("iB").unwrap_or(trimmed);
    crate::units::parse_size(plain).map_err(|error| format!("{error} (such as 0, 4KiB, 1MiB)"))
}

/// Runs `strata bench s3`: exit status 0 when every request succeeded,
/// 3 when the run finished but some requests failed (the report says
/// which).
pub fn run(args: S3LoadArgs) -> Result<i32> {
    let credentials = match (args.unsigned, args.access_key, args.secret_key) {
        (true, _, _) => None,
        (false, Some(access_key), Some(secret_key)) => Some(Credentials {
            access_key,
            secret_key,
            region: args.region,
        }),
        (false, _, _) => bail!(
            "give --access-key and --secret-key (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) to sign, or --unsigned for a plain HTTP server"
        ),
    };
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let options = LoadOptions {
        endpoint: args.endpoint,
        credentials,
        bucket: args.bucket,
        key_prefix: args.key_prefix,
        operation: match args.operation {
            OperationName::Get => Operation::Get,
            OperationName::Put => Operation::Put,
        },
        size_bytes: args.size,
        clients: args.clients,
        objects: args.objects.unwrap_or(args.clients),
        duration: args.duration,
        prepare: args.prepare,
        threads,
    };
    // A server that closes a connection while a request is being written
    // must cost that request, counted as an error, not the whole run:
    // hyper's vectored writes would otherwise raise SIGPIPE, which
    // `strata` leaves at its default (exit) for its text output.
    // SAFETY: setting a signal's disposition to ignore runs no handler.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let report = s3_load::run(&options)?;
    render(&report, args.output);
    Ok(if report.errors == 0 { 0 } else { 3 })
}

fn render(report: &LoadReport, output: Output) {
    if output == Output::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).unwrap_or_default()
        );
        return;
    }
    println!(
        "{} {} B x {} clients: {} requests in {:.2} s, {:.0} requests/s, {:.1} MB/s, {} errors",
        report.operation,
        report.size_bytes,
        report.clients,
        report.requests,
        report.seconds,
        report.requests_per_second,
        report.megabytes_per_second,
        report.errors,
    );
    println!(
        "latency: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        report.latency_p50_microseconds as f64 / 1000.0,
        report.latency_p99_microseconds as f64 / 1000.0,
        report.latency_max_microseconds as f64 / 1000.0,
    );
    let statuses: Vec<String> = report
        .statuses
        .iter()
        .map(|(status, count)| format!("{status}: {count}"))
        .collect();
    println!("statuses: {}", statuses.join(", "));
    for sample in &report.error_samples {
        println!("error: {sample}");
    }
}

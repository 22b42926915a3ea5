//! `strata mirror`: run a mirror of a remote image and export it over
//! NBD; `digest`, `repo-serve` and `stats` are its tools.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use strata_mirror::chunk::PolicyConfig;
use strata_mirror::digest::{self, Manifest};
use strata_mirror::repo_server::{RepoServer, RepoServerConfig, ServeLimits};
use strata_mirror::{repo, Mirror, MirrorConfig, MirrorStats};
use strata_nbd::{Export, Server, ServerConfig};

use crate::img::{print_json, progress_bar, Output};
use crate::serve::{init_logging, seconds, shutdown_signal};
use crate::units::{human, parse_size};

/// Default NBD port of a mirror: after `strata serve`'s 10809 and the
/// daemon's 10810, so all three run side by side with their defaults.
pub const DEFAULT_NBD_PORT: u16 = 10811;

/// Default HTTP port of `strata mirror repo-serve`.
pub const DEFAULT_REPO_PORT: u16 = 10881;

/// `strata mirror`: a subcommand, or (without one) run a mirror.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct MirrorCmd {
    #[command(subcommand)]
    tool: Option<Tool>,
    #[command(flatten)]
    run: RunArgs,
}

/// Tools around mirrors.
#[derive(Subcommand)]
enum Tool {
    /// Write the chunk manifest IMAGE.digest that mirrors check every chunk against.
    Digest {
        /// Chunk size (power of two, 4k to 4M).
        #[arg(long = "chunk-size", default_value = "32k")]
        chunk_size: String,
        /// Output format.
        #[arg(long = "output", value_enum, default_value = "human")]
        output: Output,
        /// Show a progress bar.
        #[arg(short = 'p')]
        progress: bool,
        /// The image (raw).
        #[arg(value_parser = crate::stdio::image())]
        image: PathBuf,
    },
    /// Serve an image over HTTP with range reads and a bandwidth cap (tests, benchmarks).
    RepoServe {
        /// Address to listen on.
        #[arg(short = 'b', long = "bind", default_value = "127.0.0.1")]
        bind: String,
        /// Port (0 picks a free one, shown on the readiness line).
        #[arg(short = 'p', long = "port", default_value_t = DEFAULT_REPO_PORT)]
        port: u16,
        /// Cap in bytes per second shared by all clients (e.g. 125M); none by default.
        #[arg(long = "rate")]
        rate: Option<String>,
        /// Delay before each image read is answered, in milliseconds (a
        /// remote repository's round trip, for experiments on loopback).
        #[arg(long = "latency-ms", default_value_t = 0)]
        latency_ms: u64,
        /// Connections open at once; a new one pushes out the oldest idle
        /// one, or waits in the listen queue while all are answering.
        #[arg(long = "max-connections", default_value_t = 256)]
        max_connections: usize,
        /// Milliseconds a client may take to send a request's head.
        #[arg(long = "header-timeout-ms", default_value_t = 10_000)]
        header_timeout_ms: u64,
        /// Milliseconds a client may take to send a PUT or POST body.
        #[arg(long = "body-timeout-ms", default_value_t = 10_000)]
        body_timeout_ms: u64,
        /// The image.
        #[arg(value_parser = crate::stdio::image())]
        image: PathBuf,
    },
    /// Store an image in the object store for mirrors to read as
    /// store://CLUSTER/NAME (parts, layout and chunk manifest). The
    /// store's tenant credential comes from STRATA_CREDENTIAL=FILE.
    Publish {
        /// The store's orchestrator (as printed by `strata store up`).
        #[arg(
            long = "cluster",
            env = "STRATA_CLUSTER",
            default_value = "127.0.0.1:10890"
        )]
        cluster: String,
        /// Part size: the unit stored and fetched (4k to 64M).
        #[arg(long = "part-size", default_value = "256k")]
        part_size: String,
        /// Chunk size of the manifest (power of two, 4k to 4M).
        #[arg(long = "chunk-size", default_value = "32k")]
        chunk_size: String,
        /// Output format.
        #[arg(long = "output", value_enum, default_value = "human")]
        output: Output,
        /// Show a progress bar.
        #[arg(short = 'p')]
        progress: bool,
        /// The image (raw).
        #[arg(value_parser = crate::stdio::image())]
        image: PathBuf,
        /// Its name in the store.
        name: String,
    },
    /// Show the counters of a mirror (running or stopped) from its directory.
    Stats {
        /// Output format.
        #[arg(long = "output", value_enum, default_value = "human")]
        output: Output,
        /// The mirror's directory.
        #[arg(value_parser = crate::stdio::directory())]
        dir: PathBuf,
    },
}

/// Arguments of a running mirror.
#[derive(Args)]
struct RunArgs {
    /// The image: an http:// URL (range reads), store://CLUSTER/NAME (an
    /// image stored with `strata mirror publish`; the store's tenant
    /// credential comes from STRATA_CREDENTIAL=FILE) or a file path. Its
    /// manifest (IMAGE.digest) must be next to it.
    #[arg(long = "repo")]
    repo: Option<String>,
    /// Directory for the mirror file (image.raw) and its chunk-state map.
    #[arg(long = "dir", value_parser = crate::stdio::directory())]
    dir: Option<PathBuf>,
    /// Peer mirrors as IP:PORT (comma-separated or repeated).
    #[arg(long = "peers", value_delimiter = ',')]
    peers: Vec<String>,
    /// Find peers through the repository's rendezvous list.
    #[arg(long = "rendezvous")]
    rendezvous: bool,
    /// Peers to link to, drawn at random from the candidates.
    #[arg(long = "fanout", default_value_t = 4)]
    fanout: usize,
    /// Address to accept peer links on (port 0 picks one).
    #[arg(long = "peer-listen", default_value = "127.0.0.1:0")]
    peer_listen: String,
    /// No peers at all: on demand from the repository only.
    #[arg(long = "no-peers")]
    no_peers: bool,
    /// Chunk size the manifest must use.
    #[arg(long = "chunk-size")]
    chunk_size: Option<String>,
    /// Unread prefetched chunks that stop prefetching (0: never prefetch; "unlimited").
    #[arg(long = "unmatched", default_value = "512")]
    unmatched: String,
    /// Declined chunks later read from peers that resume prefetching.
    #[arg(long = "resume-hits", default_value_t = 16)]
    resume_hits: u32,
    /// Prefetch along the access trace stored next to the image.
    #[arg(long = "trace")]
    trace: bool,
    /// Chunks ahead of the reads that trace prefetch may go.
    #[arg(long = "trace-window", default_value_t = 64)]
    trace_window: u32,
    /// Store this mirror's first-read trace next to the image at shutdown.
    #[arg(long = "record-trace")]
    record_trace: bool,
    /// Fetch every remaining chunk in the background (the mirror file becomes a complete base).
    #[arg(long = "fill")]
    fill: bool,
    /// Cap on bytes per second sent to peers (e.g. 125M).
    #[arg(long = "peer-rate")]
    peer_rate: Option<String>,
    /// Seconds an on-demand request waits for a peer before the repository.
    #[arg(long = "demand-timeout", default_value_t = 2.0)]
    demand_timeout: f64,
    /// Seconds a prefetch waits for a peer before the repository.
    #[arg(long = "prefetch-timeout", default_value_t = 5.0)]
    prefetch_timeout: f64,
    /// Prefetch threads.
    #[arg(long = "prefetch-threads", default_value_t = 2)]
    prefetch_threads: usize,
    /// NBD address to listen on.
    #[arg(short = 'b', long = "bind", default_value = "127.0.0.1")]
    bind: String,
    /// NBD port (0 picks a free one, shown on the readiness line).
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_NBD_PORT)]
    port: u16,
    /// NBD export name.
    #[arg(short = 'x', long = "export-name", default_value = "")]
    export_name: String,
    /// Most NBD clients served at once.
    #[arg(short = 'e', long = "max-connections", default_value_t = 16)]
    max_connections: usize,
}

/// Runs `strata mirror ...`; returns the exit code.
pub fn run(cmd: MirrorCmd) -> Result<i32> {
    match cmd.tool {
        Some(Tool::Digest {
            chunk_size,
            output,
            progress,
            image,
        }) => digest_image(&image, &chunk_size, output, progress),
        Some(Tool::RepoServe {
            bind,
            port,
            rate,
            latency_ms,
            max_connections,
            header_timeout_ms,
            body_timeout_ms,
            image,
        }) => {
            let limits = ServeLimits {
                max_connections: max_connections.max(1),
                header_timeout: Duration::from_millis(header_timeout_ms.max(1)),
                body_timeout: Duration::from_millis(body_timeout_ms.max(1)),
            };
            repo_serve(&image, &bind, port, rate.as_deref(), latency_ms, limits)
        }
        Some(Tool::Publish {
            cluster,
            part_size,
            chunk_size,
            output,
            progress,
            image,
            name,
        }) => publish(
            &image,
            &cluster,
            &name,
            &part_size,
            &chunk_size,
            output,
            progress,
        ),
        Some(Tool::Stats { output, dir }) => show_stats(&dir, output),
        None => run_mirror(cmd.run),
    }
}

fn publish(
    image: &Path,
    cluster: &str,
    name: &str,
    part_size: &str,
    chunk_size: &str,
    output: Output,
    progress: bool,
) -> Result<i32> {
    let part_size = parse_size(part_size).map_err(anyhow::Error::msg)?;
    let cs = parse_size(chunk_size).map_err(anyhow::Error::msg)?;
    let cs = digest::check_chunk_size(cs)?;
    let size = std::fs::metadata(image)
        .with_context(|| format!("cannot stat '{}'", image.display()))?
        .len();
    let spec = format!("{}{cluster}/{name}", strata_mirror::repo::store::SCHEME);
    let bar = progress_bar(progress, size);
    let report = strata_mirror::repo::store::publish(image, &spec, part_size, cs, |done| {
        bar.set_position(done)
    })?;
    bar.finish_and_clear();
    match output {
        Output::Json => print_json(&serde_json::to_value(&report)?)?,
        Output::Human => println!(
            "{}: {} ({}) in {} parts of {}, {} chunks in the manifest",
            report.repo,
            image.display(),
            human(report.size),
            report.parts,
            human(report.part_size),
            report.chunks
        ),
    }
    Ok(0)
}

fn digest_image(image: &Path, chunk_size: &str, output: Output, progress: bool) -> Result<i32> {
    let cs = parse_size(chunk_size).map_err(anyhow::Error::msg)?;
    let cs = digest::check_chunk_size(cs)?;
    let size = std::fs::metadata(image)
        .with_context(|| format!("cannot stat '{}'", image.display()))?
        .len();
    let bar = progress_bar(progress, size);
    let manifest = Manifest::compute(image, cs, |done| bar.set_position(done))?;
    bar.finish_and_clear();
    let mut path = image.as_os_str().to_owned();
    path.push(digest::SUFFIX);
    let path = PathBuf::from(path);
    std::fs::write(&path, manifest.encode())
        .with_context(|| format!("cannot write '{}'", path.display()))?;
    let id = digest::hex(&manifest.id());
    match output {
        Output::Json => print_json(&serde_json::json!({
            "manifest": path.display().to_string(),
            "image-size": manifest.image_size,
            "chunk-size": manifest.chunk_size,
            "chunks": manifest.chunks(),
            "id": id,
        }))?,
        Output::Human => println!(
            "{}: {} chunks of {} for {} ({}), id {id}",
            path.display(),
            manifest.chunks(),
            human(manifest.chunk_size as u64),
            image.display(),
            human(manifest.image_size)
        ),
    }
    Ok(0)
}

fn repo_serve(
    image: &Path,
    bind: &str,
    port: u16,
    rate: Option<&str>,
    latency_ms: u64,
    limits: ServeLimits,
) -> Result<i32> {
    init_logging();
    let rate = rate
        .map(|r| parse_size(r).map_err(anyhow::Error::msg))
        .transpose()?;
    let server = RepoServer::bind(&RepoServerConfig {
        image: image.to_path_buf(),
        bind: format!("{bind}:{port}"),
        rate,
        latency: Duration::from_millis(latency_ms),
        limits,
    })?;
    let stop = server.stopper();
    // The handlers are installed here, before the readiness line below,
    // so that a stop sent as soon as it is read ends the server cleanly.
    let (signals, signal) = crate::serve::signal_on_own_runtime()?;
    std::thread::spawn(move || {
        signals.block_on(signal);
        stop();
    });
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "strata: repository serving {} at {} (rate {})",
        image.display(),
        server.url(),
        rate.map(|r| format!("{}/s", human(r)))
            .unwrap_or_else(|| "uncapped".into())
    )?;
    out.flush()?;
    drop(out);
    server.run();
    Ok(0)
}

fn stats_path(dir: &Path) -> PathBuf {
    dir.join("stats.json")
}

fn show_stats(dir: &Path, output: Output) -> Result<i32> {
    let path = stats_path(dir);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read '{}': is '{}' a mirror directory?",
            path.display(),
            dir.display()
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("'{}' is not valid", path.display()))?;
    match output {
        Output::Json => print_json(&v)?,
        Output::Human => {
            if let Some(map) = v.as_object() {
                for (k, val) in map {
                    println!("{k}: {val}");
                }
            }
        }
    }
    Ok(0)
}

fn write_stats(dir: &Path, stats: &MirrorStats) {
    let path = stats_path(dir);
    let tmp = dir.join("stats.json.tmp");
    if let Ok(text) = serde_json::to_string_pretty(stats) {
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
}

fn parse_rate(v: Option<&str>, flag: &str) -> Result<Option<u64>> {
    v.map(|r| {
        parse_size(r)
            .map_err(|e| anyhow::anyhow!("{flag}: {e}"))
            .and_then(|n| {
                if n == 0 {
                    bail!("{flag} must be above 0")
                } else {
                    Ok(n)
                }
            })
    })
    .transpose()
}

fn mirror_config(args: &RunArgs, dir: &Path) -> Result<MirrorConfig> {
    let unmatched = match args.unmatched.as_str() {
        "unlimited" | "none" => None,
        n => Some(n.parse::<u32>().with_context(|| {
            format!("--unmatched '{n}': give a count of chunks, or 'unlimited'")
        })?),
    };
    let mut c = MirrorConfig::new(dir.to_path_buf());
    c.expect_chunk_size = args
        .chunk_size
        .as_deref()
        .map(|s| {
            parse_size(s)
                .map_err(anyhow::Error::msg)
                .and_then(|n| Ok(digest::check_chunk_size(n)?))
        })
        .transpose()?;
    c.policy = PolicyConfig {
        unmatched_threshold: unmatched,
        resume_hits: args.resume_hits,
        trace_window: args.trace_window,
    };
    c.listen = (!args.no_peers).then(|| args.peer_listen.clone());
    c.peers = if args.no_peers {
        Vec::new()
    } else {
        args.peers.clone()
    };
    c.rendezvous = args.rendezvous && !args.no_peers;
    c.fanout = args.fanout;
    c.demand_timeout = seconds(args.demand_timeout, "--demand-timeout")?;
    c.prefetch_timeout = seconds(args.prefetch_timeout, "--prefetch-timeout")?;
    c.prefetch_threads = args.prefetch_threads.clamp(1, 64);
    c.peer_rate = parse_rate(args.peer_rate.as_deref(), "--peer-rate")?;
    c.use_trace = args.trace;
    c.record_trace = args.record_trace;
    c.fill = args.fill;
    Ok(c)
}

fn run_mirror(args: RunArgs) -> Result<i32> {
    // SAFETY: setting a signal disposition to SIG_IGN (a peer or NBD client
    // going away must cost an EPIPE on that socket only).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    init_logging();
    let (Some(spec), Some(dir)) = (args.repo.as_deref(), args.dir.as_deref()) else {
        bail!("give the image with --repo URL|PATH and the mirror directory with --dir DIR");
    };
    crate::stdio::refuse_dash("mirror --repo", spec, crate::stdio::IMAGE_WHY)?;
    let config = mirror_config(&args, dir)?;
    let repository = repo::open(spec)?;
    let mirror = Mirror::open(repository, config)
        .with_context(|| format!("cannot start the mirror of '{spec}' in '{}'", dir.display()))?;
    let export = Export::new(&args.export_name, Arc::new(mirror.clone()), false)?;
    let server_config = ServerConfig {
        tcp: Some((args.bind.clone(), args.port)),
        unix: None,
        max_connections: args.max_connections,
        handshake_timeout: Duration::from_secs(30),
        shutdown_timeout: Duration::from_secs(30),
        ..ServerConfig::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("strata-mirror")
        .build()
        .context("could not start the async runtime")?;
    let stats_dir = dir.to_path_buf();
    let reporter = mirror.clone();
    let served = runtime.block_on(async {
        let server = Server::bind(vec![export], server_config).await?;
        let nbd = server.tcp_addr().map(|a| a.to_string()).unwrap_or_default();
        let stop = shutdown_signal();
        let m = mirror.manifest();
        let s = mirror.stats();
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "strata: mirror serving nbd://{nbd} {} ({} chunks of {}, {} held) from {spec}",
            mirror.peer_addr().map_or_else(
                || "without peers".into(),
                |a| format!("with peer listen address {a}")
            ),
            m.chunks(),
            human(m.chunk_size as u64),
            s.recovered
        )?;
        out.flush()?;
        drop(out);
        tokio::spawn(async move {
            loop {
                write_stats(&stats_dir, &reporter.stats());
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        crate::serve::run_until_signal(server, stop).await
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    let closed = mirror.shutdown();
    write_stats(dir, &mirror.stats());
    served?;
    closed?;
    Ok(0)
}

//! `strata daemon`: the volume service. Serves every volume of a pool over
//! NBD and the HTTP control API until SIGTERM or SIGINT.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use strata_nbd::{ExportSet, Server, ServerConfig};
use strata_volume::service::DEFAULT_DURABLE_WITHIN;
use strata_volume::{Service, ServiceConfig};

use crate::serve::{idle_seconds, init_logging, seconds, shutdown_signal};
use crate::units::parse_size;

mod api;
mod compaction;

pub use api::DEFAULT_API;

/// Default NBD port of the daemon: next to `strata serve`'s 10809, so both
/// run side by side with their defaults.
pub const DEFAULT_NBD_PORT: u16 = 10810;

/// Arguments of `strata daemon`.
#[derive(Args)]
pub struct DaemonArgs {
    /// Pool directory (catalog and layer files); created if missing.
    #[arg(long, default_value = "strata-pool", value_parser = crate::stdio::directory())]
    pool: PathBuf,
    /// The HTTP API's address, token and limits.
    #[command(flatten)]
    api: api::ApiArgs,
    /// Address the NBD server listens on.
    #[arg(long = "nbd-bind", default_value = "127.0.0.1")]
    nbd_bind: String,
    /// NBD port (0 picks a free one).
    #[arg(long = "nbd-port", default_value_t = DEFAULT_NBD_PORT)]
    nbd_port: u16,
    /// NBD over TLS (--tls-creds, --tls-verify-peer, --allow-plaintext).
    #[command(flatten)]
    tls: crate::tls::TlsArgs,
    /// Most NBD clients served at once, over all volumes.
    #[arg(long = "max-connections", default_value_t = 256)]
    max_connections: usize,
    /// Memory for the data of NBD requests in flight, over all clients
    /// (at least 32M); a client whose request does not fit waits.
    #[arg(long = "buffer-budget", default_value = "256M")]
    buffer_budget: String,
    /// Seconds after which an NBD client that sends no request (with none
    /// running) or reads no reply is disconnected; 0: never.
    #[arg(long = "idle-timeout", default_value_t = 0.0)]
    idle_timeout: f64,
    /// Metadata cache bound of each volume [default: 32M, 8M with
    /// `--extended-l2 off`]. Layers with extended L2 entries resolve
    /// lookups per 2 KiB subcluster instead of per 64 KiB cluster, so the
    /// same bound covers 32 times less of the disk: 32 MiB covers about
    /// 2.6 GiB of such a volume (it is a bound: a volume only takes what
    /// its lookups filled).
    #[arg(long = "cache-size")]
    cache_size: Option<String>,
    /// Cluster size of new volumes (512 to 2M): smaller clusters copy less
    /// on the first write after a snapshot, at the cost of more metadata.
    #[arg(long = "cluster-size", default_value = "64k")]
    cluster_size: String,
    /// Extended L2 entries (32 subclusters per cluster) in new volumes'
    /// layers: a small first write after a snapshot writes a subcluster,
    /// not a whole cluster (about 2.5 times the writes per second with a
    /// snapshot every second). `off` gives standard entries, which older
    /// readers (QEMU before 5.2) need. Clusters under 16 KiB never get
    /// them.
    #[arg(long = "extended-l2", default_value = "on", value_parser = ["on", "off"])]
    extended_l2: String,
    /// Keep the next snapshot's top file prepared ahead for volumes whose
    /// chain index is at least this big (`off`: never). The index is 2
    /// bytes per 2 KiB of volume with extended L2 entries (4 MiB for a
    /// 4 GiB volume), per cluster without; the file reserves room for it,
    /// and making and syncing it is most of a big volume's snapshot call.
    #[arg(long = "standby-min-index", default_value = "4M")]
    standby_min_index: String,
    /// Seconds a layer a snapshot froze may wait for the volume's next
    /// flush before the daemon syncs it (a snapshot's pause does not sync;
    /// its writes become durable with the client's flush, as they would
    /// have without the snapshot). `0`: every snapshot call syncs its
    /// layer before it returns (after the pause, while I/O goes on), as a
    /// per-call `"sync": true` does.
    #[arg(long = "durable-within", default_value_t = DEFAULT_DURABLE_WITHIN.as_secs_f64())]
    durable_within: f64,
    /// What happens to a snapshot's layer in the kernel's page cache once
    /// it is durable. `keep` leaves its pages to the kernel. `drop`
    /// releases them, so memory does not grow with every snapshot and the
    /// next writes reuse it: on a virtual machine where fresh memory
    /// faults in the host, writes with frequent snapshots go faster, and
    /// reads of data only a sealed layer holds come from the file system.
    /// Pair it with a short `--durable-within` (1 s).
    #[arg(long = "sealed-layer-cache", default_value = "keep", value_parser = ["keep", "drop"])]
    sealed_layer_cache: String,
    /// Seconds in-flight requests get to finish at shutdown.
    #[arg(long = "shutdown-timeout", default_value_t = 30.0)]
    shutdown_timeout: f64,
    /// When volumes are compacted without being asked.
    #[command(flatten)]
    auto_compact: compaction::AutoCompactArgs,
}

/// `--standby-min-index`: a size, or `off`.
fn parse_standby_min(arg: &str) -> Result<Option<u64>> {
    if arg == "off" {
        return Ok(None);
    }
    parse_size(arg)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("--standby-min-index {arg}: {e} (or `off`)"))
}

/// `--durable-within`: seconds, 0 allowed.
fn durable_within(v: f64) -> Result<std::time::Duration> {
    if v == 0.0 {
        return Ok(std::time::Duration::ZERO);
    }
    seconds(v, "--durable-within").map_err(|_| {
        anyhow::anyhow!("--durable-within {v}: give a number of seconds from 0 to 1e9")
    })
}

/// Runs the daemon until a signal; returns the exit code.
pub fn run(args: DaemonArgs) -> Result<i32> {
    // A client that goes away mid-reply costs an EPIPE on its connection.
    // SAFETY: setting a signal disposition to SIG_IGN.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    init_logging();
    args.api.check()?;
    let shutdown_timeout = seconds(args.shutdown_timeout, "--shutdown-timeout")?;
    let default_cache = if args.extended_l2 == "on" {
        "32M"
    } else {
        "8M"
    };
    let cache_size = args.cache_size.as_deref().unwrap_or(default_cache);
    let cache_bytes = parse_size(cache_size).map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("strata-daemon")
        .build()
        .context("could not start the async runtime")?;
    let service = runtime.block_on(serve(&args, cache_bytes, shutdown_timeout))?;
    drop(runtime);
    if let Some(service) = service {
        service.close().context("could not close every volume")?;
    }
    Ok(0)
}

/// Opens the pool, serves until a signal, returns the service to close.
async fn serve(
    args: &DaemonArgs,
    cache_bytes: u64,
    shutdown_timeout: std::time::Duration,
) -> Result<Option<Service>> {
    let exports = Arc::new(ExportSet::default());
    let cluster_size = parse_size(&args.cluster_size).map_err(anyhow::Error::msg)?;
    if !cluster_size.is_power_of_two() || !(512..=2 << 20).contains(&cluster_size) {
        anyhow::bail!(
            "--cluster-size {cluster_size}: must be a power of two from 512 bytes to 2 MiB"
        );
    }
    let config = ServiceConfig {
        pool: args.pool.clone(),
        cache_bytes,
        cluster_size,
        extended_l2: args.extended_l2 == "on",
        standby_min_index: parse_standby_min(&args.standby_min_index)?,
        durable_within: durable_within(args.durable_within)?,
        drop_sealed_cache: args.sealed_layer_cache == "drop",
        auto_compact: args.auto_compact.policy()?,
    };
    let (service, report) = Service::open(config, exports.clone())
        .with_context(|| format!("could not open pool '{}'", args.pool.display()))?;
    for layer in &report.rebased {
        eprintln!(
            "strata: rebased layer file {layer} onto the parent the catalog records \
             (left by an interrupted compaction)"
        );
    }
    for layer in &report.repaired {
        eprintln!(
            "strata: repaired layer file {layer}, left dirty by a crash before its snapshot              was durable (writes not flushed before the crash may be lost, as without it)"
        );
    }
    for orphan in &report.orphans_removed {
        eprintln!("strata: removed orphan layer file {orphan} (left by an interrupted change)");
    }
    for problem in &report.problems {
        eprintln!("strata: {problem}");
    }
    let service = Arc::new(service);
    Service::start_standby_keeper(&service);
    let buffer_budget =
        parse_size(&args.buffer_budget).map_err(|e| anyhow::anyhow!("--buffer-budget: {e}"))?;
    // NBD clients and API requests share the process's descriptors.
    if let Err(e) = strata_nbd::raise_open_file_limit() {
        tracing::warn!("could not raise the open file limit: {e}");
    }
    let tls = args.tls.credentials(Some(&args.nbd_bind), "--nbd-bind")?;
    let scheme = if tls.is_some() { "nbds" } else { "nbd" };
    let nbd = Server::bind_set(
        exports,
        ServerConfig {
            tcp: Some((args.nbd_bind.clone(), args.nbd_port)),
            unix: None,
            max_connections: args.max_connections,
            handshake_timeout: std::time::Duration::from_secs(30),
            shutdown_timeout,
            buffer_budget,
            idle_timeout: idle_seconds(args.idle_timeout)?,
            stall_timeout: strata_nbd::server::DEFAULT_STALL_TIMEOUT,
            tls,
        },
    )
    .await?;
    if let Some(addr) = nbd.tcp_addr() {
        service.set_nbd_base(format!("{scheme}://{addr}"));
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let api = api::start(
        &args.api,
        &args.pool,
        service.clone(),
        stop_rx,
        shutdown_timeout,
    )
    .await?;
    let api_addr = api.addr;
    let nbd_addr = nbd.tcp_addr().map(|a| a.to_string()).unwrap_or_default();
    // Install the signal handlers before the readiness line: a SIGTERM
    // right after it must stop the daemon cleanly, not kill it.
    let signal = shutdown_signal();
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "strata: daemon serving {} volume{} over NBD on {nbd_addr}, API on http://{api_addr}, pool {}",
            report.volumes,
            if report.volumes == 1 { "" } else { "s" },
            args.pool.display()
        )?;
        out.flush()?;
    }
    let nbd_stop = nbd.shutdown_handle();
    tokio::spawn(async move {
        signal.await;
        nbd_stop.shutdown();
        let _ = stop_tx.send(true);
    });
    let served = nbd.run().await;
    let api_result = api.wait().await;
    served?;
    api_result?;
    // Compaction threads hold the service: stop them first.
    service.stop_compactions();
    service.stop_standby_keeper();
    Ok(Arc::try_unwrap(service).ok())
}

//! `strata serve`: export images over NBD (qemu-nbd's flags where they
//! exist; always persistent).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use strata_disk::layer::Format;
use strata_disk::{Disk, DiskError, OpenOptions};
use strata_nbd::server::DEFAULT_PORT;
use strata_nbd::{Export, Server, ServerConfig};

use crate::stdio;
use crate::units::parse_size;

/// Arguments of `strata serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on (TCP). Default 127.0.0.1 unless only --socket is given.
    #[arg(short = 'b', long = "bind")]
    bind: Option<String>,
    /// TCP port (0 picks a free one, shown on the readiness line).
    #[arg(short = 'p', long = "port")]
    port: Option<u16>,
    /// Unix socket to listen on (alone, or with TCP if --bind/--port is given).
    #[arg(short = 'k', long = "socket", value_parser = stdio::file(stdio::SOCKET_WHY))]
    socket: Option<PathBuf>,
    /// Export name of a single image (default "", the default export).
    #[arg(short = 'x', long = "export-name")]
    export_name: Option<String>,
    /// Serve read-only: images are opened read-only and writes refused.
    #[arg(short = 'r', long = "read-only")]
    read_only: bool,
    /// Most clients served at once; more wait in the listen queue.
    #[arg(
        short = 'e',
        long = "max-connections",
        alias = "shared",
        default_value_t = 16
    )]
    max_connections: usize,
    /// Write the server's pid to FILE once listening (removed on exit).
    #[arg(long = "pid-file", value_parser = stdio::file(stdio::PID_FILE_WHY))]
    pid_file: Option<PathBuf>,
    /// Format of the images (probed if absent).
    #[arg(short = 'f', long = "format")]
    format: Option<String>,
    /// Metadata cache bound per image.
    #[arg(long = "cache-size", default_value = "32M")]
    cache_size: String,
    /// Seconds a client has to finish the handshake.
    #[arg(long = "handshake-timeout", default_value_t = 30.0)]
    handshake_timeout: f64,
    /// Seconds in-flight requests get to finish at shutdown.
    #[arg(long = "shutdown-timeout", default_value_t = 30.0)]
    shutdown_timeout: f64,
    /// Memory for the data of requests in flight, over all clients (at
    /// least 32M); a client whose request does not fit waits.
    #[arg(long = "buffer-budget", default_value = "256M")]
    buffer_budget: String,
    /// Seconds after which a client that sends no request (with none
    /// running) or reads no reply is disconnected; 0: never.
    #[arg(long = "idle-timeout", default_value_t = 0.0)]
    idle_timeout: f64,
    /// Serve images that another process may be writing (needs
    /// --read-only), as qemu-nbd's --force-share; clients may then read
    /// inconsistent data.
    #[arg(short = 'U', long = "force-share")]
    force_share: bool,
    /// Accepted for qemu-nbd compatibility: the server is always persistent.
    #[arg(short = 't', long = "persistent")]
    persistent: bool,
    /// TLS (--tls-creds, --tls-verify-peer, --allow-plaintext).
    #[command(flatten)]
    tls: crate::tls::TlsArgs,
    /// The image to serve. Alone, it is the default export `""` (as with
    /// qemu-nbd: nbd://HOST:PORT); name it with NAME=IMAGE or -x.
    image: String,
    /// More images, as NAME=IMAGE (or IMAGE: with several images, each
    /// plain one is named after its file stem).
    more: Vec<String>,
}

/// Opens one export's image; returns it and whether it is read-only.
///
/// An image that fails the writer's checks at open (metadata beyond the
/// end of the file or overlapping, or marked corrupt) is served read-only
/// rather than not at all, with a warning that says how to repair it:
/// its data stays readable and nothing can make it worse.
fn open_export(path: &Path, options: &OpenOptions) -> Result<(Disk, bool)> {
    let context = || format!("could not open '{}'", path.display());
    match Disk::open(path, options) {
        Ok(disk) => Ok((disk, !options.writable)),
        Err(e @ DiskError::Corrupt { .. }) if options.writable => {
            eprintln!(
                "strata: warning: {e}\nstrata: serving '{}' read-only; repair it with \
                 `strata img check -r all {}` and serve it again to write",
                path.display(),
                path.display()
            );
            let read_only = OpenOptions {
                writable: false,
                ..options.clone()
            };
            let disk = Disk::open(path, &read_only).with_context(context)?;
            Ok((disk, true))
        }
        Err(e) => Err(e).with_context(context),
    }
}

/// Runs the server until SIGTERM or SIGINT; returns the exit code.
pub fn run(args: ServeArgs) -> Result<i32> {
    // A client that goes away mid-reply must cost an EPIPE on that
    // connection, not the whole server (main restores SIGPIPE's default
    // disposition for the filter-style `img` commands).
    // SAFETY: setting a signal disposition to SIG_IGN.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    init_logging();
    let _ = args.persistent;
    let handshake_timeout = seconds(args.handshake_timeout, "--handshake-timeout")?;
    let shutdown_timeout = seconds(args.shutdown_timeout, "--shutdown-timeout")?;
    let cache_bytes = parse_size(&args.cache_size).map_err(anyhow::Error::msg)?;
    let buffer_budget =
        parse_size(&args.buffer_budget).map_err(|e| anyhow::anyhow!("--buffer-budget: {e}"))?;
    let idle_timeout = idle_seconds(args.idle_timeout)?;
    let format = args.format.as_deref().map(Format::parse).transpose()?;
    let specs = export_specs(&args)?;
    if args.force_share && !args.read_only {
        bail!("--force-share needs --read-only: a writer must have its images alone");
    }
    // Checked before any image is opened: a refusal touches nothing.
    let tls = args.tls.credentials(tcp_host(&args), "--bind")?;

    let mut disks = Vec::new();
    let mut exports = Vec::new();
    for (name, path) in &specs {
        let options = OpenOptions {
            writable: !args.read_only,
            cache_bytes,
            format,
            ignore_index: false,
            force_share: args.force_share,
        };
        let (disk, read_only) = open_export(path, &options)?;
        let disk = Arc::new(disk);
        exports.push(Export::new(name, disk.clone(), read_only)?);
        disks.push((path.clone(), disk));
    }

    let tcp = tcp_host(&args).map(|host| (host.to_string(), args.port.unwrap_or(DEFAULT_PORT)));
    let config = ServerConfig {
        tcp,
        unix: args.socket.clone(),
        max_connections: args.max_connections,
        handshake_timeout,
        shutdown_timeout,
        buffer_budget,
        idle_timeout,
        stall_timeout: strata_nbd::server::DEFAULT_STALL_TIMEOUT,
        tls,
    };
    // Descriptors are what every client costs: take all the system allows.
    if let Err(e) = strata_nbd::raise_open_file_limit() {
        tracing::warn!("could not raise the open file limit: {e}");
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("strata-nbd")
        .build()
        .context("could not start the async runtime")?;
    let served = runtime.block_on(async {
        let server = Server::bind(exports, config).await?;
        let mut places = Vec::new();
        if let Some(a) = server.tcp_addr() {
            places.push(a.to_string());
        }
        if let Some(p) = server.unix_path() {
            places.push(format!("unix:{}", p.display()));
        }
        if let Some(pid_file) = &args.pid_file {
            std::fs::write(pid_file, format!("{}\n", std::process::id()))
                .with_context(|| format!("could not write '{}'", pid_file.display()))?;
        }
        let stop = shutdown_signal();
        let n = specs.len();
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "strata: serving {n} export{} on {}",
            if n == 1 { "" } else { "s" },
            places.join(" and ")
        )?;
        out.flush()?;
        drop(out);

        run_until_signal(server, stop).await
    });
    drop(runtime);
    if let Some(pid_file) = &args.pid_file {
        let _ = std::fs::remove_file(pid_file);
    }
    // Close even if serving failed: close stores the chain index and
    // marks each image clean.
    let mut closed = Ok(());
    for (path, disk) in disks {
        let result = match Arc::try_unwrap(disk) {
            Ok(disk) => disk.close(),
            // Still referenced (a request outlived the shutdown timeout):
            // dropping closes it when the last user lets go.
            Err(disk) => disk.flush(),
        };
        if let Err(e) = result {
            if closed.is_ok() {
                closed =
                    Err(anyhow::Error::new(e)
                        .context(format!("could not close '{}'", path.display())));
            }
        }
    }
    served?;
    closed?;
    Ok(0)
}

/// The TCP address to listen on, if any: 127.0.0.1 unless --bind says
/// otherwise, none if only --socket is given.
fn tcp_host(args: &ServeArgs) -> Option<&str> {
    let tcp = args.bind.is_some() || args.port.is_some() || args.socket.is_none();
    tcp.then(|| args.bind.as_deref().unwrap_or("127.0.0.1"))
}

/// (export name, image path) for each image argument.
fn export_specs(args: &ServeArgs) -> Result<Vec<(String, PathBuf)>> {
    for arg in std::iter::once(&args.image).chain(&args.more) {
        let (_, path) = split_spec(arg);
        stdio::refuse_dash("serve <IMAGE>", &path.to_string_lossy(), stdio::IMAGE_WHY)?;
    }
    if args.more.is_empty() {
        let (name, path) = split_spec(&args.image);
        let name = match (name, &args.export_name) {
            (Some(_), Some(_)) => {
                bail!("give the export name either as NAME=IMAGE or --export-name, not both")
            }
            (Some(n), None) => n,
            (None, Some(n)) => n.clone(),
            (None, None) => String::new(),
        };
        return Ok(vec![(name, path)]);
    }
    if args.export_name.is_some() {
        bail!("with several images, name each one as NAME=IMAGE instead of --export-name");
    }
    let mut specs = Vec::new();
    for arg in std::iter::once(&args.image).chain(&args.more) {
        let (name, path) = split_spec(arg);
        let name = match name {
            Some(n) => n,
            None => path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        if specs.iter().any(|(n, _): &(String, PathBuf)| *n == name) {
            bail!("two images would be exported as '{name}': name them with NAME=IMAGE");
        }
        specs.push((name, path));
    }
    if !args.read_only {
        // Two writers on one file would corrupt it.
        let mut seen: Vec<PathBuf> = Vec::new();
        for (_, path) in &specs {
            if let Ok(canon) = path.canonicalize() {
                if seen.contains(&canon) {
                    bail!(
                        "'{}' is given twice: a writable image can be exported once",
                        path.display()
                    );
                }
                seen.push(canon);
            }
        }
    }
    Ok(specs)
}

/// `NAME=PATH` → (Some(NAME), PATH); a plain path (or an existing file
/// whose name contains '=') → (None, PATH).
fn split_spec(arg: &str) -> (Option<String>, PathBuf) {
    if !Path::new(arg).exists() {
        if let Some((name, path)) = arg.split_once('=') {
            return (Some(name.to_string()), PathBuf::from(path));
        }
    }
    (None, PathBuf::from(arg))
}

pub(crate) fn seconds(v: f64, flag: &str) -> Result<Duration> {
    if !v.is_finite() || v <= 0.0 || v > 1e9 {
        bail!("{flag} must be a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(v))
}

/// `--idle-timeout`: 0 turns it off.
pub(crate) fn idle_seconds(v: f64) -> Result<Option<Duration>> {
    if v == 0.0 {
        return Ok(None);
    }
    seconds(v, "--idle-timeout").map(Some)
}

/// Logs go to stderr, filtered by `STRATA_LOG` (default: warnings).
pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("STRATA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(colour_on_stderr())
        .with_env_filter(filter)
        .try_init();
}

/// Whether stderr may carry colour: only a terminal does, and never with
/// NO_COLOR set to anything non-empty (https://no-color.org).
pub(crate) fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stderr().is_terminal()
}

/// Serves until `stop` ends (the future of [`shutdown_signal`], taken
/// before the readiness line), then lets the server finish its in-flight
/// requests, flush and return.
pub(crate) async fn run_until_signal(
    server: Server,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let handle = server.shutdown_handle();
    tokio::spawn(async move {
        stop.await;
        handle.shutdown();
    });
    server.run().await?;
    Ok(())
}

/// For a command without an async runtime of its own: SIGTERM and
/// SIGINT caught from this call on (see [`shutdown_signal`]), and the
/// small runtime to wait for them on (`runtime.block_on(signal)`).
pub(crate) fn signal_on_own_runtime() -> Result<(
    tokio::runtime::Runtime,
    impl std::future::Future<Output = ()> + Send + 'static,
)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("could not start the async runtime")?;
    let signal = {
        let _entered = runtime.enter();
        shutdown_signal()
    };
    Ok((runtime, signal))
}

/// SIGTERM and SIGINT, caught from this call on (it must run on the
/// runtime): call it before a readiness line, so that a stop sent as soon
/// as the line is read ends the process cleanly instead of killing it.
/// The returned future ends when either arrives.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                // Without signal handlers the process still dies on
                // SIGTERM, only less gracefully; keep serving.
                tracing::warn!("could not install signal handlers");
                std::future::pending::<()>().await
            }
        }
        tracing::info!("shutting down");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        assert_eq!(
            split_spec("a=b.qcow2"),
            (Some("a".into()), PathBuf::from("b.qcow2"))
        );
        assert_eq!(
            split_spec("/x/y.qcow2"),
            (None, PathBuf::from("/x/y.qcow2"))
        );
        assert!(seconds(0.0, "x").is_err());
        assert!(seconds(f64::NAN, "x").is_err());
        assert_eq!(seconds(0.5, "x").unwrap(), Duration::from_millis(500));
        assert_eq!(idle_seconds(0.0).unwrap(), None);
        assert_eq!(idle_seconds(2.0).unwrap(), Some(Duration::from_secs(2)));
        assert!(idle_seconds(-1.0).is_err());
    }
}

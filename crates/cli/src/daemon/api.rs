//! The daemon's HTTP API listeners: the token, the loopback rule of
//! `--insecure-local`, the connection limits, and the optional Unix socket.

use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use strata_volume::auth::{ApiToken, TokenOrigin};
use strata_volume::http::{ApiConfig, DEFAULT_BODY_TIMEOUT};
use strata_volume::server::{Limits, Listener, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS};
use strata_volume::Service;
use tokio::sync::watch;

use crate::serve::seconds;

/// Default address of the HTTP API.
pub const DEFAULT_API: &str = "127.0.0.1:10880";

/// The API's options of `strata daemon`.
#[derive(Args)]
pub struct ApiArgs {
    /// Address of the HTTP API (port 0 picks a free one). Every request
    /// needs the token in POOL/api.token (made at the first start), so an
    /// address beyond loopback may be given (with `--insecure-local` it is
    /// refused); the API has no TLS, so cross untrusted networks through a
    /// TLS proxy or a tunnel.
    #[arg(long, default_value = DEFAULT_API)]
    listen: String,
    /// Also serve the API on this Unix socket, mode 0600 (the token is
    /// still needed unless `--insecure-local`).
    #[arg(long = "api-socket", value_parser = crate::stdio::file(crate::stdio::SOCKET_WHY))]
    api_socket: Option<PathBuf>,
    /// Serve the API without its token check, to anyone who can reach a
    /// loopback `--listen` address (any local user). Refused with an
    /// address beyond loopback.
    #[arg(long = "insecure-local")]
    insecure_local: bool,
    /// Most API connections open at once. When all are taken, a new one
    /// closes the oldest without a request in progress (such as a client
    /// that sent part of a request and stopped).
    #[arg(long = "api-max-connections", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    api_max_connections: usize,
    /// Seconds an API client may take to send a request's head (from the
    /// connection's opening, or from its previous answer) before its
    /// connection is closed.
    #[arg(long = "api-header-timeout", default_value_t = DEFAULT_HEADER_TIMEOUT.as_secs_f64())]
    api_header_timeout: f64,
    /// Seconds an API client may take to send a request's body (408 after).
    #[arg(long = "api-body-timeout", default_value_t = DEFAULT_BODY_TIMEOUT.as_secs_f64())]
    api_body_timeout: f64,
}

impl ApiArgs {
    /// Checks the options that need no pool: the loopback rule and the
    /// limits. Run before anything is opened.
    pub fn check(&self) -> Result<()> {
        if self.api_max_connections == 0 {
            bail!("--api-max-connections 0: give at least 1 (default {DEFAULT_MAX_CONNECTIONS})");
        }
        seconds(self.api_header_timeout, "--api-header-timeout")?;
        seconds(self.api_body_timeout, "--api-body-timeout")?;
        if self.insecure_local {
            let addresses: Vec<SocketAddr> = self
                .listen
                .to_socket_addrs()
                .with_context(|| format!("--listen {}: not an address", self.listen))?
                .collect();
            if addresses.is_empty() || !addresses.iter().all(|a| a.ip().is_loopback()) {
                bail!(
                    "--insecure-local serves the API without its token, so it only listens on \
                     loopback (127.0.0.1 or [::1]); --listen {} reaches beyond this host: drop \
                     --insecure-local (clients then send the token in POOL/api.token)",
                    self.listen
                );
            }
        }
        Ok(())
    }
}

/// The API being served.
pub struct RunningApi {
    /// The TCP address it listens on.
    pub addr: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RunningApi {
    /// Waits for every listener to stop (after `stop` turned true).
    pub async fn wait(self) -> Result<()> {
        for task in self.tasks {
            task.await.context("API server task failed")?;
        }
        Ok(())
    }
}

/// Loads or makes the token (unless `--insecure-local`), binds the
/// listeners and serves `service` until `stop` turns true; then requests
/// in progress get `drain` to finish.
pub async fn start(
    args: &ApiArgs,
    pool: &Path,
    service: Arc<Service>,
    stop: watch::Receiver<bool>,
    drain: Duration,
) -> Result<RunningApi> {
    let token = load_token(args, pool)?;
    let config = ApiConfig {
        token,
        body_timeout: seconds(args.api_body_timeout, "--api-body-timeout")?,
    };
    let limits = Limits {
        max_connections: args.api_max_connections,
        header_timeout: seconds(args.api_header_timeout, "--api-header-timeout")?,
    };
    let tcp = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = tcp.local_addr()?;
    if args.insecure_local {
        if !addr.ip().is_loopback() {
            bail!("--insecure-local: the API bound {addr}, which is not a loopback address");
        }
        eprintln!(
            "strata: the API's token check is off (--insecure-local): any local user can \
             change volumes through {addr}"
        );
    }
    let mut listeners = vec![Listener::Tcp(tcp)];
    if let Some(path) = &args.api_socket {
        listeners.push(bind_private_socket(path)?);
    }
    let router = strata_volume::http::router(service, config);
    let tasks = listeners
        .into_iter()
        .map(|listener| {
            let mut stop = stop.clone();
            let shutdown = async move {
                let _ = stop.wait_for(|stop| *stop).await;
            };
            tokio::spawn(strata_volume::server::serve(
                listener,
                router.clone(),
                limits,
                shutdown,
                drain,
            ))
        })
        .collect();
    Ok(RunningApi { addr, tasks })
}

/// The pool's token, made at the first start; `None` with
/// `--insecure-local`.
fn load_token(args: &ApiArgs, pool: &Path) -> Result<Option<ApiToken>> {
    let path = ApiToken::path(pool);
    if args.insecure_local {
        return Ok(None);
    }
    let (token, origin) = ApiToken::load_or_create(pool)
        .with_context(|| format!("cannot set up the API token of pool '{}'", pool.display()))?;
    if origin == TokenOrigin::Created {
        eprintln!(
            "strata: made the API token {} (mode 0600); clients send it as \
             `Authorization: Bearer TOKEN`",
            path.display()
        );
    }
    Ok(Some(token))
}

/// Binds a Unix socket at `path` that only the daemon's user can connect
/// to: it is made under a temporary name, given mode 0600, and only then
/// renamed into place.
fn bind_private_socket(path: &Path) -> Result<Listener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            bail!(
                "--api-socket {}: a file that is not a socket is there; give another path",
                path.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!(
                "--api-socket {}: another process listens there (another daemon?)",
                path.display()
            );
        }
        // Left by a daemon that did not stop cleanly.
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
    }
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".{}.tmp", std::process::id()));
    let temporary = PathBuf::from(temporary);
    let _ = std::fs::remove_file(&temporary);
    let listener = tokio::net::UnixListener::bind(&temporary)
        .with_context(|| format!("--api-socket: cannot bind {}", temporary.display()))?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&temporary);
            anyhow::anyhow!("--api-socket {}: {e}", path.display())
        })?;
    Ok(Listener::Unix(listener, path.to_path_buf()))
}

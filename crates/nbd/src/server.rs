//! The server: listeners, connection limits, per-connection tasks and
//! graceful shutdown.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::budget::{Budget, DEFAULT_BUFFER_BUDGET};
use crate::command::MAX_PAYLOAD;
use crate::export::Export;
use crate::exports::ExportSet;
use crate::handshake::{self, handshake, Negotiated};
use crate::relay;
use crate::tls::TlsCredentials;
use crate::transmission::{self, Limits, Socket};
use crate::ServerError;

/// Default TCP port (IANA-assigned to NBD, qemu-nbd's): `strata serve`'s. The
/// daemon (10810) and mirrors (10811) default to ports of their own, so
/// all three run side by side.
pub const DEFAULT_PORT: u16 = 10809;

/// How a server listens and limits its clients.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// TCP address to listen on (host, port); `None` for no TCP.
    pub tcp: Option<(String, u16)>,
    /// Unix socket to listen on; `None` for none.
    pub unix: Option<PathBuf>,
    /// Most clients served at once, in handshake or transmission.
    ///
    /// Like qemu-nbd (`--shared`), the server simply stops accepting while
    /// it is full: further clients wait in the kernel's listen queue and
    /// are served, in order, as slots free up. Nobody is refused, and a
    /// waiting client costs the server nothing.
    pub max_connections: usize,
    /// Time a client has to finish the handshake before it is dropped,
    /// so a client that connects and stalls cannot keep a slot.
    pub handshake_timeout: Duration,
    /// On shutdown, how long in-flight requests and their replies may take
    /// before their connections are cut.
    pub shutdown_timeout: Duration,
    /// Most bytes of read and write buffers of requests in flight, over
    /// all connections. A connection whose request does not fit waits,
    /// without reading its socket, until it does. At least the largest
    /// request ([`MAX_PAYLOAD`], 32 MiB).
    pub buffer_budget: u64,
    /// Close a connection that sends nothing while none of its requests
    /// is running, or reads none of its replies, for this long. `None`
    /// (the default, as in qemu-nbd): never.
    pub idle_timeout: Option<Duration>,
    /// Drop a connection that holds part of the buffer budget without
    /// making progress for this long: it stopped sending in the middle of
    /// a write's payload, or reads none of its replies. Without it, a few
    /// such clients could pin the whole budget and stall every other
    /// client. Capped by the idle timeout when one is set.
    pub stall_timeout: Duration,
    /// TLS credentials. With them the server requires TLS (the protocol's
    /// FORCEDTLS mode): clients must send `NBD_OPT_STARTTLS` before
    /// anything else. `None` (the default): no TLS, STARTTLS is refused.
    pub tls: Option<TlsCredentials>,
}

/// Default [`ServerConfig::stall_timeout`].
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            tcp: Some(("127.0.0.1".into(), DEFAULT_PORT)),
            unix: None,
            max_connections: 16,
            handshake_timeout: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(30),
            buffer_budget: DEFAULT_BUFFER_BUDGET,
            idle_timeout: None,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            tls: None,
        }
    }
}

/// Asks a running server to shut down. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    tx: Arc<watch::Sender<bool>>,
}

impl ShutdownHandle {
    /// Stops accepting clients; [`Server::run`] then finishes in-flight
    /// requests, flushes every export and returns.
    pub fn shutdown(&self) {
        self.tx.send_replace(true);
    }
}

/// A bound NBD server, ready to [`run`](Server::run).
#[derive(Debug)]
pub struct Server {
    exports: Arc<ExportSet>,
    tcp: Option<TcpListener>,
    unix: Option<(UnixListener, PathBuf)>,
    config: ServerConfig,
    shutdown: Arc<watch::Sender<bool>>,
}

impl Server {
    /// Binds the listeners of `config` for `exports`. Listening starts
    /// here, so a caller can announce readiness as soon as this returns.
    pub async fn bind(exports: Vec<Export>, config: ServerConfig) -> Result<Server, ServerError> {
        if exports.is_empty() {
            return Err(ServerError::Config("no exports".into()));
        }
        Server::bind_set(Arc::new(ExportSet::new(exports)?), config).await
    }

    /// Binds the listeners of `config` for a set of exports that may
    /// change while the server runs (it may start empty).
    pub async fn bind_set(
        exports: Arc<ExportSet>,
        config: ServerConfig,
    ) -> Result<Server, ServerError> {
        if config.tcp.is_none() && config.unix.is_none() {
            return Err(ServerError::Config("nothing to listen on".into()));
        }
        if config.max_connections == 0 {
            return Err(ServerError::Config(
                "max connections must be at least 1".into(),
            ));
        }
        if config.buffer_budget < u64::from(MAX_PAYLOAD) {
            return Err(ServerError::Config(format!(
                "a buffer budget of {} bytes cannot hold one request of the largest \
                 size: give at least {MAX_PAYLOAD} bytes (32 MiB)",
                config.buffer_budget
            )));
        }
        if config.idle_timeout.is_some_and(|t| t.is_zero()) {
            return Err(ServerError::Config(
                "an idle timeout must be longer than zero (None turns it off)".into(),
            ));
        }
        if config.stall_timeout.is_zero() {
            return Err(ServerError::Config(
                "the stall timeout must be longer than zero".into(),
            ));
        }
        let tcp = match &config.tcp {
            Some((host, port)) => Some(
                TcpListener::bind((host.as_str(), *port))
                    .await
                    .map_err(|e| ServerError::Bind(format!("{host}:{port}"), e))?,
            ),
            None => None,
        };
        let unix = match &config.unix {
            Some(path) => {
                remove_stale_socket(path)?;
                let l = UnixListener::bind(path)
                    .map_err(|e| ServerError::Bind(path.display().to_string(), e))?;
                Some((l, path.clone()))
            }
            None => None,
        };
        let (tx, _) = watch::channel(false);
        Ok(Server {
            exports,
            tcp,
            unix,
            config,
            shutdown: Arc::new(tx),
        })
    }

    /// The bound TCP address (with the real port when 0 was asked).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The Unix socket path.
    pub fn unix_path(&self) -> Option<&Path> {
        self.unix.as_ref().map(|(_, p)| p.as_path())
    }

    /// The server's exports; changes show to clients that connect later.
    pub fn exports(&self) -> Arc<ExportSet> {
        self.exports.clone()
    }

    /// A handle that stops the server.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            tx: self.shutdown.clone(),
        }
    }

    /// Serves until shut down, then finishes in-flight requests (within
    /// the shutdown timeout), flushes every export and returns. When it
    /// returns, nothing of the server references the disks any more.
    pub async fn run(self) -> Result<(), ServerError> {
        let Server {
            exports,
            tcp,
            unix,
            config,
            shutdown,
        } = self;
        let slots = Arc::new(Semaphore::new(config.max_connections));
        let limits = Limits {
            budget: Budget::new(config.buffer_budget),
            idle: config.idle_timeout,
            stall: config.stall_timeout,
        };
        let mut failures = AcceptFailures::default();
        let mut conns = JoinSet::new();
        let mut stop = shutdown.subscribe();
        loop {
            tokio::select! {
                biased;
                // (mapped to (): the guard it returns is not Send)
                _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                accepted = accept(&tcp, &unix, &slots) => match accepted {
                    Ok((slot, stream, peer)) => {
                        conns.spawn(connection(
                            stream,
                            peer,
                            exports.clone(),
                            config.clone(),
                            shutdown.subscribe(),
                            slot,
                            limits.clone(),
                        ));
                    }
                    Err(e) => {
                        // Usually out of descriptors: back off instead of
                        // spinning, and keep serving the clients we have;
                        // the refused client waits in the listen queue.
                        failures.note(&e);
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                },
            }
        }
        drop(tcp);
        if let Some((l, path)) = unix {
            drop(l);
            let _ = std::fs::remove_file(&path);
        }
        let drained = tokio::time::timeout(config.shutdown_timeout, async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                "{} connection(s) still busy after {:?}: closing them",
                conns.len(),
                config.shutdown_timeout
            );
            conns.abort_all();
            while conns.join_next().await.is_some() {}
        }
        // Requests already handed to blocking threads finish on their own
        // (disk calls cannot be cancelled); wait for them to let go.
        let deadline = tokio::time::Instant::now() + config.shutdown_timeout;
        // The set lets go too, so that a count of one means unused.
        let exports = exports.take_all();
        while exports.iter().any(|e| Arc::strong_count(e) > 1)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut first_error = None;
        for e in exports.iter() {
            let export = e.clone();
            let flushed = tokio::task::spawn_blocking(move || export.disk().flush()).await;
            let err = match flushed {
                Ok(Ok(())) => continue,
                Ok(Err(err)) => ServerError::Flush(e.name().to_string(), err.to_string()),
                Err(join) => ServerError::Flush(e.name().to_string(), join.to_string()),
            };
            tracing::error!("{err}");
            first_error.get_or_insert(err);
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// A Unix socket left by an earlier run is replaced (as QEMU does); any
/// other kind of file is an error, never deleted.
fn remove_stale_socket(path: &Path) -> Result<(), ServerError> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|e| ServerError::Bind(path.display().to_string(), e))
        }
        Ok(_) => Err(ServerError::Config(format!(
            "{} exists and is not a socket",
            path.display()
        ))),
        Err(_) => Ok(()),
    }
}

/// Pause after a failed accept before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Least time between two log lines about failed accepts, so that a long
/// shortage of descriptors does not fill the log.
const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(10);

/// Counts failed accepts and logs them at a bounded rate.
#[derive(Default)]
struct AcceptFailures {
    /// Failures since the last log line.
    unlogged: u64,
    last_logged: Option<Instant>,
}

impl AcceptFailures {
    fn note(&mut self, e: &std::io::Error) {
        self.unlogged += 1;
        if self
            .last_logged
            .is_some_and(|t| t.elapsed() < ACCEPT_LOG_EVERY)
        {
            return;
        }
        let hint = match e.raw_os_error() {
            Some(libc::EMFILE) | Some(libc::ENFILE) => {
                ": out of file descriptors (raise `ulimit -n`); clients wait until some close"
            }
            _ => "",
        };
        tracing::warn!(
            "accepting a client failed {} time(s) since the last report, last: {e}{hint}; \
             retrying every {ACCEPT_BACKOFF:?}",
            self.unlogged
        );
        self.unlogged = 0;
        self.last_logged = Some(Instant::now());
    }
}

/// Raises the soft limit on open files to the hard limit, so that a burst
/// of clients on one surface of the process (the HTTP API, say) does not
/// leave NBD unable to accept. Returns the soft limit now in force.
pub fn raise_open_file_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit from a struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        limit.rlim_cur = limit.rlim_max;
    }
    Ok(limit.rlim_cur)
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// Waits for a free slot, then for a client on any listener.
async fn accept(
    tcp: &Option<TcpListener>,
    unix: &Option<(UnixListener, PathBuf)>,
    slots: &Arc<Semaphore>,
) -> std::io::Result<(OwnedSemaphorePermit, Stream, String)> {
    let slot = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| std::io::Error::other("connection limit closed"))?;
    let tcp_accept = async {
        match tcp {
            Some(l) => l.accept().await,
            None => std::future::pending().await,
        }
    };
    let unix_accept = async {
        match unix {
            Some((l, _)) => l.accept().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = tcp_accept => {
            let (s, addr) = r?;
            Ok((slot, Stream::Tcp(s), addr.to_string()))
        }
        r = unix_accept => {
            let (s, _) = r?;
            Ok((slot, Stream::Unix(s), "unix".to_string()))
        }
    }
}

async fn connection(
    stream: Stream,
    peer: String,
    exports: Arc<ExportSet>,
    config: ServerConfig,
    shutdown: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
    limits: Limits,
) {
    tracing::debug!(peer, "client connected");
    let client = Client {
        peer,
        exports,
        config,
        shutdown,
        limits,
    };
    match stream {
        Stream::Tcp(s) => {
            // Replies are written whole; do not let Nagle hold them back.
            let _ = s.set_nodelay(true);
            client.serve(s).await
        }
        Stream::Unix(s) => client.serve(s).await,
    }
}

/// What a connection's task needs besides its stream.
struct Client {
    peer: String,
    exports: Arc<ExportSet>,
    config: ServerConfig,
    shutdown: watch::Receiver<bool>,
    limits: Limits,
}

/// An accepted stream the blocking transmission phase can take over.
trait IntoSocket: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The same connection as a blocking std socket.
    fn into_socket(self) -> std::io::Result<Socket>;
}

impl IntoSocket for TcpStream {
    fn into_socket(self) -> std::io::Result<Socket> {
        let s = self.into_std()?;
        s.set_nonblocking(false)?;
        Ok(Socket::Tcp(s))
    }
}

impl IntoSocket for UnixStream {
    fn into_socket(self) -> std::io::Result<Socket> {
        let s = self.into_std()?;
        s.set_nonblocking(false)?;
        Ok(Socket::Unix(s))
    }
}

impl Client {
    /// Runs the handshake, then the transmission phase, on `s`.
    async fn serve<S: IntoSocket>(mut self, s: S) {
        let Some((neg, stream)) = self.negotiate(s).await else {
            return;
        };
        let Client {
            peer,
            shutdown,
            limits,
            ..
        } = self;
        tracing::debug!(
            peer,
            export = neg.export.name(),
            structured = neg.structured,
            block_status = neg.block_status,
            tls = matches!(stream, handshake::Stream::Tls(_)),
            "transmission"
        );
        match stream {
            handshake::Stream::Plain(s) => {
                // The transmission phase runs on threads doing blocking I/O.
                let socket = match s.into_socket() {
                    Ok(socket) => socket,
                    Err(e) => {
                        tracing::warn!(peer, "cannot hand the connection over: {e}");
                        return;
                    }
                };
                transmission::serve(socket, neg, shutdown, peer, limits).await;
            }
            handshake::Stream::Tls(s) => relay::serve(s, neg, shutdown, peer, limits).await,
        }
    }

    /// The handshake, bounded by the handshake timeout and cut short by a
    /// shutdown. `None` when the client does not reach transmission.
    async fn negotiate<S>(&mut self, s: S) -> Option<(Negotiated, handshake::Stream<S>)>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let peer = self.peer.as_str();
        let timeout = self.config.handshake_timeout;
        let negotiated = tokio::select! {
            biased;
            _ = self.shutdown.wait_for(|s| *s) => return None,
            r = tokio::time::timeout(
                timeout,
                handshake(s, &self.exports, self.config.tls.as_ref()),
            ) => r,
        };
        match negotiated {
            Ok(Ok(Some(done))) => Some(done),
            Ok(Ok(None)) => {
                tracing::debug!(peer, "client ended the handshake");
                None
            }
            Ok(Err(e)) => {
                tracing::info!(peer, "handshake failed: {e}");
                None
            }
            Err(_) => {
                tracing::info!(peer, "handshake timed out after {timeout:?}");
                None
            }
        }
    }
}

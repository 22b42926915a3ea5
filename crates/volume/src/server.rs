//! Serves the HTTP API with bounded resources, so no client can starve the
//! daemon: at most `max_connections` connections are open at once (each
//! costs a file descriptor, which NBD clients need too), a connection that
//! does not send a request's head within `header_timeout` is closed, and
//! when every slot is taken a new connection pushes out the oldest one
//! that has no request in progress (a half-open connection that sent part
//! of a head and nothing more is such a one). Only when every connection
//! is busy with a request does accepting wait, leaving new ones in the
//! kernel's backlog.
//!
//! Bodies are bounded by the router ([`crate::http`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Notify};

/// Default of [`Limits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// Default of [`Limits::header_timeout`].
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection that finished a request this recently is not pushed out:
/// its answer may still be on its way out.
const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// Pause after an accept error (out of file descriptors), so the loop
/// does not spin while the condition lasts.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Largest request head, and read buffer, of a connection.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// What bounds the API's connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Longest time a connection may take to send a request's head,
    /// counted from its opening or from its previous answer.
    pub header_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
        }
    }
}

/// Where the API listens.
#[derive(Debug)]
pub enum Listener {
    /// A TCP address.
    Tcp(TcpListener),
    /// A Unix socket (the file is removed when the server stops).
    Unix(UnixListener, PathBuf),
}

/// An accepted connection.
enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

impl Listener {
    async fn accept(&self) -> std::io::Result<Stream> {
        match self {
            Listener::Tcp(l) => l.accept().await.map(|(s, _)| Stream::Tcp(s)),
            Listener::Unix(l, _) => l.accept().await.map(|(s, _)| Stream::Unix(s)),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// One open connection, as the accept loop sees it.
#[derive(Debug, Default)]
struct Connection {
    /// Requests in progress (0 or 1 with HTTP/1.1 without pipelining).
    requests: AtomicUsize,
    /// When its last request finished, in ms since the server started
    /// (0: none yet).
    answered_at: AtomicU64,
    /// Told when the connection is pushed out.
    close: Notify,
}

/// Every open connection, by age (ids grow).
#[derive(Debug)]
struct Connections {
    open: Mutex<BTreeMap<u64, Arc<Connection>>>,
    /// Told when a connection closes or a request ends.
    changed: Notify,
    started: Instant,
}

impl Connections {
    fn now_ms(&self) -> u64 {
        // At least 1: 0 means "never".
        (self.started.elapsed().as_millis() as u64).max(1)
    }

    fn count(&self) -> usize {
        self.open.lock().len()
    }

    fn remove(&self, id: u64) {
        self.open.lock().remove(&id);
        self.changed.notify_waiters();
    }

    /// Pushes out the oldest connection with no request in progress and
    /// no answer in the last [`ANSWER_GRACE`]; false if there is none.
    fn push_out_idle(&self) -> bool {
        let now = self.now_ms();
        let grace = ANSWER_GRACE.as_millis() as u64;
        let mut open = self.open.lock();
        let idle = open.iter().find_map(|(id, c)| {
            let answered = c.answered_at.load(Ordering::Acquire);
            let quiet = answered == 0 || now.saturating_sub(answered) >= grace;
            (c.requests.load(Ordering::Acquire) == 0 && quiet).then_some(*id)
        });
        match idle.and_then(|id| open.remove(&id)) {
            Some(connection) => {
                connection.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` completes; then lets
/// requests in progress finish for up to `drain_timeout`.
pub async fn serve(
    listener: Listener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
    drain_timeout: Duration,
) {
    let connections = Arc::new(Connections {
        open: Mutex::new(BTreeMap::new()),
        changed: Notify::new(),
        started: Instant::now(),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let service = TowerToHyperService::new(router);
    let max = limits.max_connections.max(1);
    tokio::pin!(shutdown);
    let mut next_id = 0u64;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!("API: cannot accept a connection: {e}");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        if !make_room(&connections, max, &mut shutdown).await {
            break;
        }
        next_id += 1;
        let connection = Arc::new(Connection::default());
        connections.open.lock().insert(next_id, connection.clone());
        let task = ConnectionTask {
            id: next_id,
            connection,
            connections: connections.clone(),
            service: service.clone(),
            limits,
            stop: stop_rx.clone(),
        };
        match stream {
            Stream::Tcp(s) => tokio::spawn(task.run(s)),
            Stream::Unix(s) => tokio::spawn(task.run(s)),
        };
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(drain_timeout, async {
        loop {
            let changed = connections.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if connections.count() == 0 {
                return;
            }
            changed.await;
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            "API: {} connection(s) still open after {} s at shutdown; closing them",
            connections.count(),
            drain_timeout.as_secs_f64()
        );
    }
}

/// Waits until a new connection fits under `max`, pushing out an idle
/// one if needed; false if `shutdown` came first.
async fn make_room(
    connections: &Connections,
    max: usize,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> bool {
    loop {
        let changed = connections.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if connections.count() < max || connections.push_out_idle() {
            return true;
        }
        // Every connection is busy: wait for one to finish or close (or
        // for an answer's grace to pass).
        tokio::select! {
            () = &mut changed => {}
            () = tokio::time::sleep(ANSWER_GRACE) => {}
            () = shutdown.as_mut() => return false,
        }
    }
}

/// What a connection's task needs.
struct ConnectionTask {
    id: u64,
    connection: Arc<Connection>,
    connections: Arc<Connections>,
    service: TowerToHyperService<Router>,
    limits: Limits,
    stop: watch::Receiver<bool>,
}

impl ConnectionTask {
    /// Serves one connection until it closes, is pushed out, or the
    /// server stops.
    async fn run<IO>(self, io: IO)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let ConnectionTask {
            id,
            connection,
            connections,
            service,
            limits,
            mut stop,
        } = self;
        // Frees the slot however the task ends (a panic included).
        let _slot = Slot {
            id,
            connections: connections.clone(),
        };
        let tracked = connection.clone();
        let counted = connections.clone();
        let handler = hyper::service::service_fn(move |request: Request<Incoming>| {
            tracked.requests.fetch_add(1, Ordering::AcqRel);
            let tracked = tracked.clone();
            let connections = counted.clone();
            let answer = hyper::service::Service::call(&service, request);
            async move {
                let response = answer.await;
                tracked
                    .answered_at
                    .store(connections.now_ms(), Ordering::Release);
                tracked.requests.fetch_sub(1, Ordering::AcqRel);
                connections.changed.notify_waiters();
                response
            }
        });
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(MAX_HEAD_BYTES);
        let served = builder.serve_connection(TokioIo::new(io), handler);
        tokio::pin!(served);
        tokio::select! {
            result = served.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("API connection closed: {e}");
                }
            }
            () = connection.close.notified() => {
                tracing::debug!("API connection pushed out for a new one (all slots taken)");
            }
            () = async { let _ = stop.wait_for(|stop| *stop).await; } => {
                // An idle connection just closes; one with a request in
                // progress gets its answer first.
                if connection.requests.load(Ordering::Acquire) > 0 {
                    served.as_mut().graceful_shutdown();
                    let _ = served.await;
                }
            }
        }
    }
}

/// A connection's place in [`Connections`], given back when dropped.
struct Slot {
    id: u64,
    connections: Arc<Connections>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connections.remove(self.id);
    }
}

//! A bounded HTTP/1 accept loop, so that no client can starve a server:
//! at most [`Limits::max_connections`] connections are open at once (each
//! costs a file descriptor and a task), a connection that does not send a
//! request's head within [`Limits::header_timeout`] is closed, and when
//! every slot is taken a new connection pushes out the oldest one with no
//! answer in progress (a half-open connection that sent part of a head
//! and nothing more is such a one). Only when every connection is busy
//! with an answer (its body not yet all sent) does accepting wait,
//! leaving new connections in the kernel's backlog.
//!
//! Request bodies are the handler's to bound (a size and a deadline): the
//! loop cannot know what a route accepts.
//!
//! Shared by the volume daemon's API (`strata-volume`) and the mirror's
//! repository server (`strata-mirror`), which do not depend on each other.
//! Messages are logged with `tracing`, in the caller's span.

mod body;
mod connections;

use std::convert::Infallible;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tracing::Instrument;

use body::HeldBody;
use connections::{Busy, Connection, Connections, Slot, ANSWER_GRACE};

/// Default of [`Limits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// Default of [`Limits::header_timeout`].
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause after an accept error (out of file descriptors), so the loop
/// does not spin while the condition lasts.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Largest request head, and read buffer, of a connection.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// What bounds a server's connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once (0 counts as 1); a new one pushes out the
    /// oldest idle one, or waits in the backlog while every one has an
    /// answer in progress.
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

/// Where a server listens.
#[derive(Debug)]
pub enum Listener {
    /// A TCP address.
    Tcp(TcpListener),
    /// A Unix socket (the file is removed when the listener is dropped).
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

/// Serves `handler`'s answers on `listener` until `shutdown` completes.
/// Then the listener is closed, idle connections close, and connections
/// with an answer in progress send it and close; the call waits for them
/// up to `drain_timeout` (zero: it returns at once, and they finish on
/// the runtime while it runs).
pub async fn serve<H, F, B>(
    listener: Listener,
    limits: Limits,
    handler: H,
    shutdown: impl Future<Output = ()> + Send,
    drain_timeout: Duration,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let connections = Arc::new(Connections::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let max = limits.max_connections.max(1);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!("cannot accept a connection: {e}");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        if !make_room(&connections, max, &mut shutdown).await {
            break;
        }
        let (connection, slot) = connections.open();
        let task = ConnectionTask {
            connection,
            connections: connections.clone(),
            _slot: slot,
            limits,
            stop: stop_rx.clone(),
        };
        let span = tracing::Span::current();
        match stream {
            Stream::Tcp(stream) => {
                // The head and body of an answer may go out in separate
                // writes; with Nagle's algorithm the body would wait for
                // the client's delayed ACK (40 ms) on a kept-alive
                // connection.
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!("TCP_NODELAY not set: {e}");
                }
                tokio::spawn(task.run(stream, handler.clone()).instrument(span))
            }
            Stream::Unix(stream) => {
                tokio::spawn(task.run(stream, handler.clone()).instrument(span))
            }
        };
    }
    drop(listener);
    let _ = stop_tx.send(true);
    if !drain_timeout.is_zero() {
        drain(&connections, drain_timeout).await;
    }
}

/// Waits up to `timeout` for every connection to close.
async fn drain(connections: &Connections, timeout: Duration) {
    let drained = tokio::time::timeout(timeout, async {
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
            "{} connection(s) still open after {} s at shutdown; closing them",
            connections.count(),
            timeout.as_secs_f64()
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
    connection: Arc<Connection>,
    connections: Arc<Connections>,
    /// Frees the connection's place when the task ends.
    _slot: Slot,
    limits: Limits,
    stop: watch::Receiver<bool>,
}

impl ConnectionTask {
    /// Serves one connection until it closes, is pushed out, or the
    /// server stops.
    async fn run<IO, H, F, B>(self, io: IO, handler: H)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Response<B>> + Send + 'static,
        B: Body + Unpin + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let ConnectionTask {
            connection,
            connections,
            _slot,
            limits,
            mut stop,
        } = self;
        let tracked = connection.clone();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let busy = Busy::start(&tracked, &connections);
            let answer = handler(request);
            async move {
                let response = answer.await.map(|body| HeldBody::new(body, busy));
                Ok::<_, Infallible>(response)
            }
        });
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(MAX_HEAD_BYTES);
        let served = builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(served);
        tokio::select! {
            result = served.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("connection closed: {e}");
                }
            }
            () = connection.close.notified() => {
                tracing::debug!("connection pushed out for a new one (all slots taken)");
            }
            () = async { let _ = stop.wait_for(|stop| *stop).await; } => {
                // An idle connection just closes; one with an answer in
                // progress sends it first.
                if connection.is_busy() {
                    served.as_mut().graceful_shutdown();
                    let _ = served.await;
                }
            }
        }
    }
}

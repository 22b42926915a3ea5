//! The repository server's bounded accept loop: at most
//! `max_connections` connections are open at once (each costs a file
//! descriptor and a task), a connection that does
//! not send a request's head within `header_timeout` is closed, and when
//! every slot is taken a new connection pushes out the oldest one with no
//! request in progress (a half-open connection that sent part of a head
//! and nothing more is such a one). Only when every connection is busy
//! with a request (its answer's body not yet all sent) does accepting
//! wait, leaving new connections in the kernel's backlog.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

use super::{ReplyBody, ServeLimits};

/// A connection that finished an answer this recently is not pushed out:
/// its last bytes may still be on their way out.
const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// Pause after an accept error (out of file descriptors), so the loop
/// does not spin while the condition lasts.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Largest request head, and read buffer, of a connection.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// One open connection, as the accept loop sees it.
#[derive(Debug, Default)]
struct Connection {
    /// Answers in progress, counted until their body is all sent.
    requests: AtomicUsize,
    /// When its last answer finished, in ms since the server started
    /// (0: none yet).
    answered_at: AtomicU64,
    /// Told when the connection is pushed out.
    close: Notify,
}

/// Every open connection, by age (ids grow).
#[derive(Debug)]
struct Connections {
    open: Mutex<BTreeMap<u64, Arc<Connection>>>,
    /// Told when a connection closes or an answer ends.
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

    /// Pushes out the oldest connection with no answer in progress and
    /// none finished in the last [`ANSWER_GRACE`]; false if there is none.
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

/// Marks an answer in progress on its connection until dropped, which
/// happens when its body has been sent (or the connection died).
pub(super) struct Busy {
    connection: Arc<Connection>,
    connections: Arc<Connections>,
}

impl Busy {
    fn start(connection: &Arc<Connection>, connections: &Arc<Connections>) -> Busy {
        connection.requests.fetch_add(1, Ordering::AcqRel);
        Busy {
            connection: connection.clone(),
            connections: connections.clone(),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.connection
            .answered_at
            .store(self.connections.now_ms(), Ordering::Release);
        self.connection.requests.fetch_sub(1, Ordering::AcqRel);
        self.connections.changed.notify_waiters();
    }
}

/// Serves `handler` on `listener` until `stop` turns true; connections
/// open then close once their answer in progress, if any, is sent.
pub(super) async fn serve<H, F>(
    listener: TcpListener,
    limits: ServeLimits,
    mut stop: watch::Receiver<bool>,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ReplyBody>> + Send + 'static,
{
    let connections = Arc::new(Connections {
        open: Mutex::new(BTreeMap::new()),
        changed: Notify::new(),
        started: Instant::now(),
    });
    let max = limits.max_connections.max(1);
    let mut next_id = 0u64;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = async { let _ = stop.wait_for(|stop| *stop).await; } => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!("repo-serve: cannot accept a connection: {e}");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        // The head and body of an answer may go out in separate writes;
        // with Nagle's algorithm the body would wait for the client's
        // delayed ACK (40 ms) on a kept-alive connection.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("repo-serve: TCP_NODELAY not set: {e}");
        }
        if !make_room(&connections, max, &mut stop).await {
            break;
        }
        next_id += 1;
        let connection = Arc::new(Connection::default());
        connections.open.lock().insert(next_id, connection.clone());
        let task = ConnectionTask {
            id: next_id,
            connection,
            connections: connections.clone(),
            limits,
            stop: stop.clone(),
        };
        tokio::spawn(task.run(stream, handler.clone()));
    }
}

/// Waits until a new connection fits under `max`, pushing out an idle
/// one if needed; false if the server stopped first.
async fn make_room(
    connections: &Connections,
    max: usize,
    stop: &mut watch::Receiver<bool>,
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
            () = async { let _ = stop.wait_for(|stop| *stop).await; } => return false,
        }
    }
}

/// What a connection's task needs.
struct ConnectionTask {
    id: u64,
    connection: Arc<Connection>,
    connections: Arc<Connections>,
    limits: ServeLimits,
    stop: watch::Receiver<bool>,
}

impl ConnectionTask {
    /// Serves one connection until it closes, is pushed out, or the
    /// server stops.
    async fn run<H, F>(self, stream: tokio::net::TcpStream, handler: H)
    where
        H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Response<ReplyBody>> + Send + 'static,
    {
        let ConnectionTask {
            id,
            connection,
            connections,
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
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let busy = Busy::start(&tracked, &counted);
            let answer = handler(request);
            async move { Ok::<_, Infallible>(answer.await.map(|body| body.hold(busy))) }
        });
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(MAX_HEAD_BYTES);
        let served = builder.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(served);
        tokio::select! {
            result = served.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("repo-serve: connection closed: {e}");
                }
            }
            () = connection.close.notified() => {
                tracing::debug!("repo-serve: connection pushed out for a new one (all slots taken)");
            }
            () = async { let _ = stop.wait_for(|stop| *stop).await; } => {
                // An idle connection just closes; one with an answer in
                // progress sends it first.
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

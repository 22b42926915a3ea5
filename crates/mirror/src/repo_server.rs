//! A small HTTP repository server for tests and benchmarks
//! (`strata mirror repo-serve`): serves one image with range reads, its
//! side files, and a rendezvous list, through one token bucket shared by
//! every client (the repository's bandwidth cap).
//!
//! Routes, for an image file named `NAME`:
//! - `GET /NAME` with an optional single `Range: bytes=A-B` (206) or
//!   without one (200, whole image);
//! - `GET /NAME.digest`, `GET|PUT /NAME.trace` (files next to the image);
//! - `POST /NAME.peers` with an address: records it, answers the list.
//!
//! No client can hold the server's resources: connections are capped, a
//! request's head and a PUT or POST body each have a deadline (see
//! [`ServeLimits`]; the accept loop is `strata-http`'s).

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, ACCEPT_RANGES, CONTENT_RANGE, CONTENT_TYPE, RANGE};
use hyper::{Method, Request, Response, StatusCode};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use crate::digest;
use crate::rate::TokenBucket;
use crate::repo::{parse_peer_list, MAX_ADDR_LEN, MAX_PEERS, TRACE_SUFFIX};
use crate::{io_err, MirrorError, Result};

/// Largest trace accepted by PUT.
const MAX_TRACE: u64 = 4 * digest::MAX_CHUNKS + 16;
/// Bytes sent between two takes from the bucket.
const SLICE: usize = 16 * 1024;
/// Slices read ahead of the socket for one answer.
const SLICES_AHEAD: usize = 4;
/// How long [`RepoServer`]'s drop waits for bodies still being read.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);

/// Default of [`ServeLimits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = strata_http::DEFAULT_MAX_CONNECTIONS;
/// Default of [`ServeLimits::header_timeout`].
pub const DEFAULT_HEADER_TIMEOUT: Duration = strata_http::DEFAULT_HEADER_TIMEOUT;
/// Default of [`ServeLimits::body_timeout`].
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// What bounds the server's connections, so that no client can hold its
/// threads or file descriptors.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// Connections open at once; a new one pushes out the oldest idle
    /// one, or waits in the backlog while every one has an answer in
    /// progress.
    pub max_connections: usize,
    /// Longest time a connection may take to send a request's head.
    pub header_timeout: Duration,
    /// Longest time a PUT or POST may take to send its body (408 after).
    pub body_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
        }
    }
}

/// What the server serves and how fast.
#[derive(Debug, Clone)]
pub struct RepoServerConfig {
    /// The image file.
    pub image: PathBuf,
    /// Address to listen on, e.g. `127.0.0.1:0`.
    pub bind: String,
    /// Cap in bytes per second shared by all clients; `None` for none.
    pub rate: Option<u64>,
    /// Delay before each image read is answered, standing for the round
    /// trip to a remote repository (zero on loopback otherwise).
    pub latency: Duration,
    /// Connection cap and timeouts.
    pub limits: ServeLimits,
}

/// A running repository server.
pub struct RepoServer {
    /// Always `Some` until dropped.
    runtime: Option<tokio::runtime::Runtime>,
    /// Taken by [`RepoServer::run`].
    listener: Mutex<Option<tokio::net::TcpListener>>,
    stop: Arc<watch::Sender<bool>>,
    limits: ServeLimits,
    shared: Arc<Shared>,
    addr: SocketAddr,
}

struct Shared {
    image: PathBuf,
    name: String,
    size: u64,
    bucket: Option<TokenBucket>,
    latency: Duration,
    body_timeout: Duration,
    peers: Mutex<Vec<String>>,
    bytes_sent: AtomicU64,
}

impl RepoServer {
    /// Binds the listener.
    pub fn bind(config: &RepoServerConfig) -> Result<Self> {
        let shown = config.image.display().to_string();
        let size = std::fs::metadata(&config.image)
            .map_err(io_err(format!("cannot stat '{shown}'")))?
            .len();
        let name = config
            .image
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| MirrorError::Config(format!("'{shown}' has no file name")))?;
        let listener = std::net::TcpListener::bind(&config.bind)
            .map_err(io_err(format!("cannot listen on {}", config.bind)))?;
        listener
            .set_nonblocking(true)
            .map_err(io_err(format!("cannot listen on {}", config.bind)))?;
        let addr = listener
            .local_addr()
            .map_err(io_err(format!("cannot listen on {}", config.bind)))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("repo-serve")
            .enable_all()
            .build()
            .map_err(io_err("cannot start the repository server's runtime"))?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener)
                .map_err(io_err(format!("cannot serve on {}", config.bind)))?
        };
        Ok(RepoServer {
            runtime: Some(runtime),
            listener: Mutex::new(Some(listener)),
            stop: Arc::new(watch::channel(false).0),
            limits: config.limits,
            shared: Arc::new(Shared {
                image: config.image.clone(),
                name,
                size,
                bucket: config
                    .rate
                    .map(|r| TokenBucket::new(r, (r / 20).max(SLICE as u64))),
                latency: config.latency,
                body_timeout: config.limits.body_timeout,
                peers: Mutex::new(Vec::new()),
                bytes_sent: AtomicU64::new(0),
            }),
            addr,
        })
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The image's URL.
    pub fn url(&self) -> String {
        format!("http://{}/{}", self.addr, self.shared.name)
    }

    /// Bytes of bodies sent so far.
    pub fn bytes_sent(&self) -> u64 {
        self.shared.bytes_sent.load(Ordering::Relaxed)
    }

    /// A handle that stops [`RepoServer::run`].
    pub fn stopper(&self) -> impl Fn() + Send + Sync + 'static {
        let stop = self.stop.clone();
        move || {
            stop.send_replace(true);
        }
    }

    /// Serves until stopped (returns at once if it already ran).
    pub fn run(&self) {
        let (Some(runtime), Some(listener)) = (&self.runtime, self.listener.lock().take()) else {
            return;
        };
        let shared = self.shared.clone();
        let handler = move |request| shared.clone().answer(request);
        let limits = strata_http::Limits {
            max_connections: self.limits.max_connections,
            header_timeout: self.limits.header_timeout,
        };
        let mut stop = self.stop.subscribe();
        let stopped = async move {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        // No drain here: answers in progress finish on the runtime, which
        // the drop gives `SHUTDOWN_WAIT`.
        let serving = strata_http::serve(
            strata_http::Listener::Tcp(listener),
            limits,
            handler,
            stopped,
            Duration::ZERO,
        );
        runtime.block_on(serving.instrument(tracing::info_span!("repo-serve")));
    }
}

impl Drop for RepoServer {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        if let Some(runtime) = self.runtime.take() {
            // Blocking readers end when their answer's connection is
            // gone, or after one slice of the bucket's wait.
            runtime.shutdown_timeout(SHUTDOWN_WAIT);
        }
    }
}

/// An answer's body: bytes at hand, or slices read (and paid for from
/// the bucket) by a blocking thread.
pub(crate) struct ReplyBody {
    data: Option<Bytes>,
    slices: Option<mpsc::Receiver<std::io::Result<Bytes>>>,
    remaining: u64,
}

impl ReplyBody {
    fn empty() -> Self {
        ReplyBody {
            data: None,
            slices: None,
            remaining: 0,
        }
    }

    fn bytes(data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        ReplyBody {
            remaining: data.len() as u64,
            data: (!data.is_empty()).then_some(data),
            slices: None,
        }
    }
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::io::Result<Frame<Bytes>>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            this.remaining = 0;
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        let Some(slices) = &mut this.slices else {
            return Poll::Ready(None);
        };
        match slices.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(slice))) => {
                this.remaining = this.remaining.saturating_sub(slice.len() as u64);
                Poll::Ready(Some(Ok(Frame::data(slice))))
            }
            Poll::Ready(Some(Err(e))) => {
                this.slices = None;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.slices = None;
                if this.remaining > 0 {
                    let short = std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the image ended before the answer's length",
                    );
                    return Poll::Ready(Some(Err(short)));
                }
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.slices.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

fn status(code: StatusCode) -> Response<ReplyBody> {
    let mut response = Response::new(ReplyBody::empty());
    *response.status_mut() = code;
    response
}

/// `GET /health`: 200 `{"status":"ok"}` while the server answers.
fn health_response() -> Response<ReplyBody> {
    let mut response = Response::new(ReplyBody::bytes(&br#"{"status":"ok"}"#[..]));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Parses a single `bytes=A-B` or `bytes=A-` range within `size`.
fn parse_range(value: &str, size: u64) -> Option<(u64, u64)> {
    let spec = value.trim().strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let start: u64 = a.trim().parse().ok()?;
    let end: u64 = if b.trim().is_empty() {
        size.checked_sub(1)?
    } else {
        b.trim().parse().ok()?
    };
    (start <= end && end < size).then_some((start, end))
}

/// Why a request's body was not read.
enum BodyError {
    /// Longer than allowed (carries nothing: the caller knows the limit).
    TooLarge,
    /// The client broke off or sent a malformed body.
    Broken,
    /// Not all sent within the body timeout.
    Late,
}

/// Reads a body of at most `limit` bytes within `timeout`.
async fn read_body(
    mut body: Incoming,
    limit: u64,
    timeout: Duration,
) -> std::result::Result<Vec<u8>, BodyError> {
    let read = async {
        let mut data = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            let frame = frame.map_err(|_| BodyError::Broken)?;
            if let Ok(chunk) = frame.into_data() {
                data.extend_from_slice(&chunk);
                if data.len() as u64 > limit {
                    return Err(BodyError::TooLarge);
                }
            }
        }
        Ok(data)
    };
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or(Err(BodyError::Late))
}

/// Sends `len` bytes of `source` as slices, taking each from the bucket
/// first; stops when the answer's connection is gone.
fn send_slices(
    shared: &Shared,
    mut source: impl Read,
    len: u64,
    slices: &mpsc::Sender<std::io::Result<Bytes>>,
) {
    let mut left = len;
    while left > 0 {
        let mut slice = vec![0u8; left.min(SLICE as u64) as usize];
        let n = match source.read(&mut slice) {
            Ok(0) => return, // the body reports the short length
            Ok(n) => n,
            Err(e) => {
                let _ = slices.blocking_send(Err(e));
                return;
            }
        };
        slice.truncate(n);
        if let Some(b) = &shared.bucket {
            b.take(n as u64);
        }
        shared.bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
        left -= n as u64;
        if slices.blocking_send(Ok(slice.into())).is_err() {
            return;
        }
    }
}

impl Shared {
    async fn answer(self: Arc<Self>, request: Request<Incoming>) -> Response<ReplyBody> {
        let path = request
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
            .trim_start_matches('/')
            .to_string();
        // An image named `health` keeps its own URL.
        if path == "health" && self.name != "health" {
            return match *request.method() {
                Method::GET => health_response(),
                _ => status(StatusCode::METHOD_NOT_ALLOWED),
            };
        }
        let method = request.method().clone();
        match (method, path.strip_prefix(self.name.as_str())) {
            (Method::GET, Some("")) => self.get_image(&request).await,
            (Method::GET, Some(suffix)) if suffix == digest::SUFFIX || suffix == TRACE_SUFFIX => {
                self.get_file(suffix).await
            }
            (Method::PUT, Some(TRACE_SUFFIX)) => self.put_trace(request.into_body()).await,
            (Method::POST, Some(crate::repo::PEERS_SUFFIX)) => {
                self.register(request.into_body()).await
            }
            _ => status(StatusCode::NOT_FOUND),
        }
    }

    /// A body of `len` bytes read from `source` by a blocking thread,
    /// through the bucket.
    fn sliced(self: &Arc<Self>, source: impl Read + Send + 'static, len: u64) -> ReplyBody {
        let (sender, receiver) = mpsc::channel(SLICES_AHEAD);
        let shared = self.clone();
        tokio::task::spawn_blocking(move || send_slices(&shared, source, len, &sender));
        ReplyBody {
            data: None,
            slices: (len > 0).then_some(receiver),
            remaining: len,
        }
    }

    async fn get_image(self: &Arc<Self>, request: &Request<Incoming>) -> Response<ReplyBody> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        // A value that is not text is no range we can serve: 416.
        let range = request
            .headers()
            .get(RANGE)
            .map(|v| v.to_str().unwrap_or(""));
        let (code, start, end) = match range {
            None if self.size == 0 => return status(StatusCode::OK),
            None => (StatusCode::OK, 0, self.size - 1),
            Some(v) => match parse_range(v, self.size) {
                Some((a, b)) => (StatusCode::PARTIAL_CONTENT, a, b),
                None => {
                    let mut r = status(StatusCode::RANGE_NOT_SATISFIABLE);
                    if let Ok(h) = HeaderValue::from_str(&format!("bytes */{}", self.size)) {
                        r.headers_mut().insert(CONTENT_RANGE, h);
                    }
                    return r;
                }
            },
        };
        let opened = std::fs::File::open(&self.image).and_then(|mut file| {
            std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(start))?;
            Ok(file)
        });
        let file = match opened {
            Ok(file) => file,
            Err(e) => {
                tracing::warn!("repo-serve: cannot read '{}': {e}", self.image.display());
                return status(StatusCode::INTERNAL_SERVER_ERROR);
            }
        };
        let len = end - start + 1;
        let mut response = Response::new(self.sliced(file.take(len), len));
        *response.status_mut() = code;
        let headers = response.headers_mut();
        headers.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        if code == StatusCode::PARTIAL_CONTENT {
            if let Ok(h) = HeaderValue::from_str(&format!("bytes {start}-{end}/{}", self.size)) {
                headers.insert(CONTENT_RANGE, h);
            }
        }
        response
    }

    fn side_path(&self, suffix: &str) -> PathBuf {
        let mut s = self.image.clone().into_os_string();
        s.push(suffix);
        PathBuf::from(s)
    }

    async fn get_file(self: &Arc<Self>, suffix: &str) -> Response<ReplyBody> {
        let path = self.side_path(suffix);
        match tokio::task::spawn_blocking(move || std::fs::read(path)).await {
            Ok(Ok(data)) => {
                let len = data.len() as u64;
                Response::new(self.sliced(std::io::Cursor::new(data), len))
            }
            _ => status(StatusCode::NOT_FOUND),
        }
    }

    async fn put_trace(self: &Arc<Self>, body: Incoming) -> Response<ReplyBody> {
        let data = match read_body(body, MAX_TRACE, self.body_timeout).await {
            Ok(data) => data,
            Err(e) => return body_error(e, StatusCode::PAYLOAD_TOO_LARGE),
        };
        let path = self.side_path(TRACE_SUFFIX);
        let tmp = self.side_path(&format!("{TRACE_SUFFIX}.tmp{}", std::process::id()));
        let stored = tokio::task::spawn_blocking(move || {
            std::fs::write(&tmp, &data)?;
            std::fs::rename(&tmp, &path)
        })
        .await;
        match stored {
            Ok(Ok(())) => status(StatusCode::NO_CONTENT),
            Ok(Err(e)) => {
                tracing::warn!("repo-serve: cannot store the trace: {e}");
                status(StatusCode::INTERNAL_SERVER_ERROR)
            }
            Err(_) => status(StatusCode::INTERNAL_SERVER_ERROR),
        }
    }

    async fn register(self: &Arc<Self>, body: Incoming) -> Response<ReplyBody> {
        let body = match read_body(body, MAX_ADDR_LEN as u64, self.body_timeout).await {
            Ok(body) => body,
            Err(e) => return body_error(e, StatusCode::BAD_REQUEST),
        };
        let text = String::from_utf8_lossy(&body);
        let me = parse_peer_list(&text);
        let mut peers = self.peers.lock();
        match me.first() {
            Some(addr) if me.len() == 1 => {
                if !peers.contains(addr) && peers.len() < MAX_PEERS {
                    peers.push(addr.clone());
                }
            }
            _ => return status(StatusCode::BAD_REQUEST),
        }
        Response::new(ReplyBody::bytes(peers.join("\n")))
    }
}

/// The answer to a body not read: `too_large` if it was too long.
fn body_error(e: BodyError, too_large: StatusCode) -> Response<ReplyBody> {
    match e {
        BodyError::TooLarge => status(too_large),
        BodyError::Broken => status(StatusCode::BAD_REQUEST),
        BodyError::Late => status(StatusCode::REQUEST_TIMEOUT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9", 100), Some((0, 9)));
        assert_eq!(parse_range("bytes=90-", 100), Some((90, 99)));
        assert_eq!(parse_range("bytes=90-100", 100), None);
        assert_eq!(parse_range("bytes=9-1", 100), None);
        assert_eq!(parse_range("bytes=a-1", 100), None);
        assert_eq!(parse_range("items=0-1", 100), None);
        assert_eq!(parse_range("bytes=0-", 0), None);
    }
}

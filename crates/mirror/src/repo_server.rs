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

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tiny_http::{Header, Method, Request, Response, StatusCode};

use crate::digest;
use crate::rate::TokenBucket;
use crate::repo::{parse_peer_list, MAX_ADDR_LEN, MAX_PEERS, TRACE_SUFFIX};
use crate::{io_err, MirrorError, Result};

/// Most requests answered at once; more get 503.
const MAX_ACTIVE: usize = 4096;
/// Largest trace accepted by PUT.
const MAX_TRACE: u64 = 4 * digest::MAX_CHUNKS + 16;
/// Bytes sent between two takes from the bucket.
const SLICE: usize = 16 * 1024;

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
}

/// A running repository server.
pub struct RepoServer {
    http: Arc<tiny_http::Server>,
    shared: Arc<Shared>,
    addr: SocketAddr,
}

struct Shared {
    image: PathBuf,
    name: String,
    size: u64,
    bucket: Option<TokenBucket>,
    latency: Duration,
    peers: Mutex<Vec<String>>,
    active: AtomicUsize,
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
        set_nodelay(&listener);
        let http = tiny_http::Server::from_listener(listener, None)
            .map_err(|e| MirrorError::Config(format!("cannot serve on {}: {e}", config.bind)))?;
        let addr = http
            .server_addr()
            .to_ip()
            .ok_or_else(|| MirrorError::Config(format!("{} is not a TCP address", config.bind)))?;
        Ok(RepoServer {
            http: Arc::new(http),
            shared: Arc::new(Shared {
                image: config.image.clone(),
                name,
                size,
                bucket: config
                    .rate
                    .map(|r| TokenBucket::new(r, (r / 20).max(SLICE as u64))),
                latency: config.latency,
                peers: Mutex::new(Vec::new()),
                active: AtomicUsize::new(0),
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
        let http = self.http.clone();
        move || http.unblock()
    }

    /// Serves until stopped; one thread per request in flight.
    pub fn run(&self) {
        while let Ok(req) = self.http.recv() {
            let shared = self.shared.clone();
            if shared.active.fetch_add(1, Ordering::SeqCst) >= MAX_ACTIVE {
                shared.active.fetch_sub(1, Ordering::SeqCst);
                let _ = req.respond(Response::empty(503));
                continue;
            }
            std::thread::spawn(move || {
                shared.handle(req);
                shared.active.fetch_sub(1, Ordering::SeqCst);
            });
        }
    }
}

/// Sets TCP_NODELAY on the listener; Linux passes it on to accepted
/// sockets. tiny_http writes a response's head and body separately, and
/// with Nagle's algorithm the body of every response after the first on a
/// kept-alive connection would wait for the client's delayed ACK (40 ms).
fn set_nodelay(listener: &std::net::TcpListener) {
    use std::os::fd::AsRawFd;
    let one: libc::c_int = 1;
    // SAFETY: setsockopt on a socket we own, with a pointer to a live int.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(
            "repo-serve: TCP_NODELAY not set: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// A reader that takes its bytes from the bucket as it goes.
struct Capped<R> {
    inner: R,
    shared: Arc<Shared>,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let len = buf.len().min(SLICE);
        let n = self.inner.read(&mut buf[..len])?;
        if let Some(b) = &self.shared.bucket {
            b.take(n as u64);
        }
        self.shared
            .bytes_sent
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// `GET /health`: 200 `{"status":"ok"}` while the server answers.
fn health_response() -> Response<std::io::Cursor<Vec<u8>>> {
    let mut response = Response::from_data(br#"{"status":"ok"}"#.to_vec());
    if let Some(h) = header("Content-Type", "application/json") {
        response.add_header(h);
    }
    response
}

fn header(name: &str, value: &str) -> Option<Header> {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).ok()
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

impl Shared {
    fn handle(self: &Arc<Self>, mut req: Request) {
        let path = req.url().trim_start_matches('/').to_string();
        // An image named `health` keeps its own URL.
        if path == "health" && self.name != "health" {
            let result = match req.method() {
                Method::Get => req.respond(health_response()),
                _ => req.respond(Response::empty(405)),
            };
            if let Err(e) = result {
                tracing::debug!("repo-serve: reply failed: {e}");
            }
            return;
        }
        let result = match (req.method().clone(), path.strip_prefix(self.name.as_str())) {
            (Method::Get, Some("")) => self.get_image(req),
            (Method::Get, Some(suffix)) if suffix == digest::SUFFIX || suffix == TRACE_SUFFIX => {
                self.get_file(req, suffix)
            }
            (Method::Put, Some(TRACE_SUFFIX)) => {
                self.put_trace(&mut req).and_then(|r| req.respond(r))
            }
            (Method::Post, Some(crate::repo::PEERS_SUFFIX)) => {
                let r = self.register(&mut req);
                req.respond(r)
            }
            _ => req.respond(Response::empty(404)),
        };
        if let Err(e) = result {
            tracing::debug!("repo-serve: reply failed: {e}");
        }
    }

    fn get_image(self: &Arc<Self>, req: Request) -> std::io::Result<()> {
        if !self.latency.is_zero() {
            std::thread::sleep(self.latency);
        }
        let range = req
            .headers()
            .iter()
            .find(|h| h.field.equiv("Range"))
            .map(|h| h.value.as_str().to_string());
        let (status, start, end) = match range {
            None if self.size == 0 => return req.respond(Response::empty(200)),
            None => (200, 0, self.size - 1),
            Some(v) => match parse_range(&v, self.size) {
                Some((a, b)) => (206, a, b),
                None => {
                    let mut r = Response::empty(416);
                    if let Some(h) = header("Content-Range", &format!("bytes */{}", self.size)) {
                        r.add_header(h);
                    }
                    return req.respond(r);
                }
            },
        };
        let mut file = std::fs::File::open(&self.image)?;
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(start))?;
        let len = end - start + 1;
        let body = Capped {
            inner: file.take(len),
            shared: self.clone(),
        };
        let mut headers: Vec<Header> = header("Accept-Ranges", "bytes").into_iter().collect();
        if status == 206 {
            headers.extend(header(
                "Content-Range",
                &format!("bytes {start}-{end}/{}", self.size),
            ));
        }
        req.respond(Response::new(
            StatusCode(status),
            headers,
            body,
            Some(len as usize),
            None,
        ))
    }

    fn side_path(&self, suffix: &str) -> PathBuf {
        let mut s = self.image.clone().into_os_string();
        s.push(suffix);
        PathBuf::from(s)
    }

    fn get_file(self: &Arc<Self>, req: Request, suffix: &str) -> std::io::Result<()> {
        match std::fs::read(self.side_path(suffix)) {
            Ok(data) => {
                let len = data.len();
                let body = Capped {
                    inner: std::io::Cursor::new(data),
                    shared: self.clone(),
                };
                req.respond(Response::new(
                    StatusCode(200),
                    vec![],
                    body,
                    Some(len),
                    None,
                ))
            }
            Err(_) => req.respond(Response::empty(404)),
        }
    }

    fn put_trace(&self, req: &mut Request) -> std::io::Result<Response<std::io::Empty>> {
        let mut data = Vec::new();
        req.as_reader().take(MAX_TRACE + 1).read_to_end(&mut data)?;
        if data.len() as u64 > MAX_TRACE {
            return Ok(Response::empty(413));
        }
        let path = self.side_path(TRACE_SUFFIX);
        let tmp = self.side_path(&format!("{TRACE_SUFFIX}.tmp{}", std::process::id()));
        std::fs::write(&tmp, &data)?;
        std::fs::rename(&tmp, &path)?;
        Ok(Response::empty(204))
    }

    fn register(&self, req: &mut Request) -> Response<std::io::Cursor<Vec<u8>>> {
        let mut body = Vec::new();
        if req
            .as_reader()
            .take(MAX_ADDR_LEN as u64 + 1)
            .read_to_end(&mut body)
            .is_err()
        {
            return Response::from_data(Vec::new()).with_status_code(400);
        }
        let text = String::from_utf8_lossy(&body);
        let me = parse_peer_list(&text);
        let mut peers = self.peers.lock();
        match me.first() {
            Some(addr) if body.len() <= MAX_ADDR_LEN && me.len() == 1 => {
                if !peers.contains(addr) && peers.len() < MAX_PEERS {
                    peers.push(addr.clone());
                }
            }
            _ => return Response::from_data(Vec::new()).with_status_code(400),
        }
        Response::from_data(peers.join("\n").into_bytes())
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

//! A load generator in the style of the 6Stor evaluation: `threads`
//! concurrent clients doing Posts or Gets of fixed-size objects, or HTTP
//! GETs of the same objects from a reference web server (nginx).

use crate::mmsg;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_store_client::client::{meta_over_ipv6, Client};
use strata_store_protocol::table::Table;
use strata_store_protocol::tenant::TenantCredential;
use strata_store_protocol::wire::{Body, Msg, MAX_DATAGRAM};
use strata_store_protocol::Error;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// What the clients do.
#[derive(Clone, Debug)]
pub enum Workload {
    /// Post objects `bench/<thread>/<i>`.
    Post,
    /// Get the objects a Post run created.
    Get,
    /// GET `/<thread>/<i>` over HTTP/1.1 keep-alive from this server.
    HttpGet(SocketAddr),
}

/// Load parameters.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Concurrent clients.
    pub threads: usize,
    /// Operations per client.
    pub ops: usize,
    /// Reads of each object per client (Get and HTTP workloads; Posts
    /// always make `ops` objects once).
    pub passes: usize,
    /// Object size in bytes.
    pub size: u64,
    /// First component of every object name (runs with different prefixes
    /// make different objects).
    pub prefix: String,
    /// What to do.
    pub workload: Workload,
}

/// Results of one run.
#[derive(Clone, Debug)]
pub struct BenchResult {
    /// Operations completed.
    pub ops: u64,
    /// Operations that failed.
    pub errors: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Median latency.
    pub p50: Duration,
    /// 99th-percentile latency.
    pub p99: Duration,
    /// Object bytes moved.
    pub bytes: u64,
}

/// The object name client `t` uses for its `i`th operation on objects of
/// `size` bytes, under `prefix`.
pub fn object_name(prefix: &str, size: u64, t: usize, i: usize) -> String {
    format!("{prefix}/{size}/{t}/{i}")
}

/// Runs the load and measures it.
pub async fn run(client: Arc<Client>, cfg: BenchConfig) -> Result<BenchResult, Error> {
    let data: Arc<Vec<u8>> = Arc::new((0..cfg.size).map(|i| (i * 31 % 251) as u8).collect());
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..cfg.threads {
        let (client, data, cfg) = (client.clone(), data.clone(), cfg.clone());
        tasks.spawn(async move { worker(&client, &data, &cfg, t).await });
    }
    let mut lat = Vec::new();
    let mut errors = 0;
    while let Some(r) = tasks.join_next().await {
        let (l, e) = r.map_err(|e| Error::Task {
            context: "a load task of the bench".into(),
            source: Some(Box::new(e)),
        })?;
        lat.extend(l);
        errors += e;
    }
    Ok(summarize(lat, errors, start.elapsed(), cfg.size))
}

/// Percentiles and totals of a run's latencies.
fn summarize(mut lat: Vec<Duration>, errors: u64, elapsed: Duration, size: u64) -> BenchResult {
    lat.sort_unstable();
    let pick = |q: f64| {
        lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    BenchResult {
        ops: lat.len() as u64,
        errors,
        elapsed,
        p50: pick(0.5),
        p99: pick(0.99),
        bytes: lat.len() as u64 * size,
    }
}

async fn worker(client: &Client, data: &[u8], cfg: &BenchConfig, t: usize) -> (Vec<Duration>, u64) {
    let passes = match cfg.workload {
        Workload::Post => 1,
        _ => cfg.passes.max(1),
    };
    let mut lat = Vec::with_capacity(cfg.ops * passes);
    let mut errors = 0;
    let mut http: Option<BufReader<TcpStream>> = None;
    for i in (0..passes).flat_map(|_| 0..cfg.ops) {
        let name = object_name(&cfg.prefix, cfg.size, t, i);
        let t0 = Instant::now();
        let ok = match &cfg.workload {
            Workload::Post => {
                let mut src = data;
                client.put(&name, cfg.size, &mut src, &|_| {}).await.is_ok()
            }
            Workload::Get => {
                // Read and dropped, as the HTTP generator drops nginx's
                // bodies; the client still checks the CRC end to end.
                let mut out = Discard::default();
                client.get(&name, &mut out, &|_| {}).await.is_ok() && out.bytes == cfg.size
            }
            Workload::HttpGet(server) => {
                http_get(&mut http, *server, &name, cfg.size).await.is_ok()
            }
        };
        if ok {
            lat.push(t0.elapsed());
        } else {
            errors += 1;
            http = None;
        }
    }
    (lat, errors)
}

/// A Get's output that keeps only a count of the bytes written since the
/// last rewind (a Get rewinds when it retries another replica).
#[derive(Default)]
struct Discard {
    bytes: u64,
}

impl tokio::io::AsyncWrite for Discard {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.bytes += buf.len() as u64;
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncSeek for Discard {
    fn start_seek(
        mut self: std::pin::Pin<&mut Self>,
        position: std::io::SeekFrom,
    ) -> std::io::Result<()> {
        match position {
            std::io::SeekFrom::Start(at) => {
                self.bytes = at;
                Ok(())
            }
            _ => Err(std::io::Error::other("a discarded Get output only rewinds")),
        }
    }

    fn poll_complete(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<u64>> {
        std::task::Poll::Ready(Ok(self.bytes))
    }
}

/// One keep-alive HTTP/1.1 GET; checks the status and the body length.
async fn http_get(
    conn: &mut Option<BufReader<TcpStream>>,
    server: SocketAddr,
    name: &str,
    size: u64,
) -> std::io::Result<()> {
    if conn.is_none() {
        let s = TcpStream::connect(server).await?;
        s.set_nodelay(true)?;
        *conn = Some(BufReader::new(s));
    }
    let Some(c) = conn.as_mut() else {
        return Err(std::io::Error::other("no connection"));
    };
    let req = format!("GET /{name} HTTP/1.1\r\nHost: bench\r\n\r\n");
    c.get_mut().write_all(req.as_bytes()).await?;
    let mut line = String::new();
    c.read_line(&mut line).await?;
    if !line.contains(" 200 ") {
        return Err(std::io::Error::other(format!("HTTP answer {line:?}")));
    }
    let mut len = None;
    loop {
        line.clear();
        c.read_line(&mut line).await?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((key, value)) = line.split_once(':') {
            if key.eq_ignore_ascii_case("content-length") {
                len = value.trim().parse::<u64>().ok();
            }
        }
    }
    let len = len.ok_or_else(|| std::io::Error::other("no Content-Length"))?;
    if len != size {
        return Err(std::io::Error::other("wrong length"));
    }
    let mut left = len;
    // Sized to the body: an empty one needs no buffer at all.
    let mut buf = vec![0u8; len.min(256 * 1024) as usize];
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        let n = c.read(&mut buf[..want]).await?;
        if n == 0 {
            return Err(std::io::Error::other("connection closed"));
        }
        left -= n as u64;
    }
    Ok(())
}

/// How long a batched Get waits for its answer before asking again.
const BATCHED_RETRY: Duration = Duration::from_millis(500);
/// Sends of one batched Get before it counts as an error.
const BATCHED_ATTEMPTS: u32 = 5;

/// One client of [`run_batched_gets`]: its next operation and the request
/// in flight.
struct BatchedClient {
    /// Operations done (both passes counted).
    done: usize,
    name: String,
    req: u64,
    started: Instant,
    sent: Instant,
    attempts: u32,
}

/// Runs zero-byte Gets the way a load generator on machines of its own
/// would: one thread and one UDP socket drive `cfg.threads` clients,
/// each with one request in flight, and the requests and answers of all
/// of them go out and come in batches (`sendmmsg`, `recvmmsg`). The
/// per-request cost is then mostly the kernel's per-datagram work, not
/// one system call and one task wake-up per request, so on a shared
/// machine the generator leaves the CPU to the server it measures.
///
/// Only zero-byte objects: their Get is one metadata round trip, with
/// nothing to fetch from a storage node. Each client asks the first
/// metadata address of each name, as the design's generator did. Every
/// request is sealed with the tenant's `credential`, as a real client's.
pub fn run_batched_gets(
    table: &Table,
    credential: &TenantCredential,
    cfg: &BenchConfig,
) -> Result<BenchResult, Error> {
    if cfg.size != 0 {
        return Err(Error::config(format!(
            "the batched engine runs zero-byte Gets only (one metadata round trip each); \
             --size {} needs the default engine",
            cfg.size
        )));
    }
    let any = if meta_over_ipv6(table) {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    };
    let sock = std::net::UdpSocket::bind(any).map_err(|e| Error::io("binding a UDP socket", e))?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .map_err(|e| Error::io("setting a receive timeout", e))?;
    let total = cfg.ops * cfg.passes.max(1);
    let start = Instant::now();
    let mut clients: Vec<BatchedClient> = (0..cfg.threads)
        .map(|t| BatchedClient {
            done: 0,
            name: object_name(&cfg.prefix, 0, t, 0),
            req: 0,
            started: start,
            sent: start,
            attempts: 0,
        })
        .collect();
    let mut out = Vec::with_capacity(cfg.threads);
    for (t, c) in clients.iter_mut().enumerate() {
        out.push(send_get(table, credential, c, t, 1)?);
    }
    mmsg::send_batch(&sock, &out);
    let mut lat = Vec::with_capacity(total * cfg.threads);
    let mut errors = 0u64;
    let mut live = clients.len();
    let mut batch = mmsg::RecvBatch::new(MAX_DATAGRAM + 1);
    while live > 0 {
        out.clear();
        let got = match batch.recv(&sock) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => 0,
            Err(e) => return Err(Error::io("receiving metadata answers", e)),
        };
        for i in 0..got {
            let Some((_, bytes)) = batch.get(i) else {
                continue;
            };
            let Ok(msg) = Msg::decode(bytes) else {
                continue;
            };
            let t = (msg.req >> 32) as usize;
            let Some(c) = clients
                .get_mut(t)
                .filter(|c| c.req == msg.req && c.done < total)
            else {
                continue; // an answer to a request asked again, or not ours
            };
            match msg.body {
                Body::Found { record, .. } if record.name == c.name && record.size == 0 => {
                    lat.push(c.started.elapsed());
                }
                _ => errors += 1,
            }
            if next_get(table, credential, cfg, c, t, total, &mut out)? {
                live -= 1;
            }
        }
        // Requests whose answer is late: ask again, or give up on them.
        let now = Instant::now();
        for (t, c) in clients.iter_mut().enumerate() {
            if c.done >= total || now.duration_since(c.sent) < BATCHED_RETRY {
                continue;
            }
            if c.attempts < BATCHED_ATTEMPTS {
                let attempts = c.attempts + 1;
                out.push(send_get(table, credential, c, t, attempts)?);
            } else {
                errors += 1;
                if next_get(table, credential, cfg, c, t, total, &mut out)? {
                    live -= 1;
                }
            }
        }
        mmsg::send_batch(&sock, &out);
    }
    Ok(summarize(lat, errors, start.elapsed(), 0))
}

/// Moves client `t` to its next Get, queuing the request in `out`;
/// `true` when it has done all `total`.
fn next_get(
    table: &Table,
    credential: &TenantCredential,
    cfg: &BenchConfig,
    c: &mut BatchedClient,
    t: usize,
    total: usize,
    out: &mut Vec<(Vec<u8>, SocketAddr)>,
) -> Result<bool, Error> {
    c.done += 1;
    if c.done >= total {
        return Ok(true);
    }
    c.name = object_name(&cfg.prefix, 0, t, c.done % cfg.ops);
    c.started = Instant::now();
    out.push(send_get(table, credential, c, t, 1)?);
    Ok(false)
}

/// The datagram asking for client `t`'s current name, and where it goes.
/// The request id carries the client in its high half.
fn send_get(
    table: &Table,
    credential: &TenantCredential,
    c: &mut BatchedClient,
    t: usize,
    attempts: u32,
) -> Result<(Vec<u8>, SocketAddr), Error> {
    let target = table.meta_addrs(&c.name)[0];
    let endpoint = table.mn_endpoint(target).ok_or_else(|| {
        Error::Table(format!(
            "the prefix table has no metadata node for {:?} (address {}); \
                 wait for its metadata node to come up",
            c.name,
            strata_store_protocol::addr::fmt_addr(target)
        ))
    })?;
    c.req = ((t as u64) << 32) | (c.req.wrapping_add(1) & 0xffff_ffff);
    c.attempts = attempts;
    c.sent = Instant::now();
    let bytes = Msg::new(
        c.req,
        target,
        Body::Get {
            name: c.name.clone(),
        },
    )
    .seal_tenant(credential, strata_store_protocol::auth::unix_ms())
    .map_err(|e| Error::malformed(format!("encoding a Get of {:?}", c.name), e))?;
    Ok((bytes, endpoint))
}

//! A load generator in the style of the 6Stor evaluation: `threads`
//! concurrent clients doing Posts or Gets of fixed-size objects, or HTTP
//! GETs of the same objects from a reference web server (nginx).

use crate::client::Client;
use crate::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
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
        let (l, e) = r.map_err(|e| Error::Invalid(format!("load task failed: {e}")))?;
        lat.extend(l);
        errors += e;
    }
    let elapsed = start.elapsed();
    lat.sort_unstable();
    let pick = |q: f64| {
        lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Ok(BenchResult {
        ops: lat.len() as u64,
        errors,
        elapsed,
        p50: pick(0.5),
        p99: pick(0.99),
        bytes: lat.len() as u64 * cfg.size,
    })
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
                matches!(client.get_bytes(&name).await, Ok((_, b)) if b.len() as u64 == cfg.size)
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

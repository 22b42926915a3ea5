//! The transport a client (and every node) calls others with: over UDP,
//! one request, resent until its answer comes, sealed with the cluster
//! key when the caller holds it, and the prefix table fetched from the
//! orchestrator; over TCP, a data connection to a storage node.

use std::net::SocketAddr;
use std::time::Duration;
use strata_store_protocol::auth::ClusterKey;
use strata_store_protocol::table::Table;
use strata_store_protocol::wire::{Body, Msg, MAX_DATAGRAM};
use strata_store_protocol::Error;
use tokio::net::{TcpStream, UdpSocket};

/// Sends `msg` to `to` and waits for the reply with the same request id,
/// resending up to `attempts` times. With `key`, the request is sealed
/// (again for each attempt: a resend is not a replay) and only a sealed
/// answer is taken ([`strata_store_protocol::auth::open_answer`]).
pub async fn udp_call(
    to: SocketAddr,
    msg: &Msg,
    timeout: Duration,
    attempts: u32,
    key: Option<&ClusterKey>,
) -> Result<Msg, Error> {
    Ok(udp_call_padded(to, msg, timeout, attempts, key, 0).await?.0)
}

/// [`udp_call`] with the request padded to at least `pad` bytes, and
/// padded again as a [`Body::PadTo`] answer asks (an unauthenticated
/// request gets no answer longer than itself). Returns the answer and the
/// padding that got it.
pub async fn udp_call_padded(
    to: SocketAddr,
    msg: &Msg,
    timeout: Duration,
    attempts: u32,
    key: Option<&ClusterKey>,
    mut pad: usize,
) -> Result<(Msg, usize), Error> {
    let bind: SocketAddr = if to.is_ipv4() {
        "0.0.0.0:0"
            .parse()
            .unwrap_or_else(|_| strata_store_protocol::wire::no_endpoint())
    } else {
        "[::]:0"
            .parse()
            .unwrap_or_else(|_| strata_store_protocol::wire::no_endpoint())
    };
    let sock = UdpSocket::bind(bind)
        .await
        .map_err(|e| Error::io("binding a UDP socket", e))?;
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    let mut attempt = 0;
    while attempt < attempts.max(1) {
        attempt += 1;
        let bytes = strata_store_protocol::auth::encode_padded(
            msg,
            key,
            strata_store_protocol::auth::unix_ms(),
            pad,
        )
        .map_err(|e| Error::malformed(format!("encoding a request to {to}"), e))?;
        sock.send_to(&bytes, to)
            .await
            .map_err(|e| Error::io(format!("sending to {to}"), e))?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, sock.recv_from(&mut buf)).await {
                Err(_) => break,
                Ok(Err(_)) => break, // ICMP unreachable and the like: resend
                Ok(Ok((n, _))) => {
                    let now = strata_store_protocol::auth::unix_ms();
                    let Some(reply) = strata_store_protocol::auth::open_answer(&buf[..n], key, now)
                    else {
                        continue;
                    };
                    if reply.req != msg.req {
                        continue;
                    }
                    match reply.body {
                        // Only a growing size is taken, so this ends.
                        Body::PadTo { size } if (size as usize) > pad => {
                            pad = (size as usize + strata_store_protocol::auth::PAD_SLACK)
                                .min(MAX_DATAGRAM);
                            // A padded resend is no extra attempt.
                            attempt -= 1;
                            break;
                        }
                        Body::PadTo { .. } => continue,
                        _ => return Ok((reply, pad)),
                    }
                }
            }
        }
    }
    Err(Error::Timeout(format!(
        "{to} did not answer after {attempts} attempts"
    )))
}

/// Fails with the remote error if `reply` is an error message.
pub fn ok_body(reply: Msg) -> Result<Body, Error> {
    match reply.body {
        Body::Error { code, message } => Err(Error::Remote { code, message }),
        b => Ok(b),
    }
}

/// A fresh request id.
pub fn request_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    // Drawn once per process: `getpid` is a system call, and two of them
    // per metadata call showed in the load generator's profile.
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = *BASE.get_or_init(|| std::process::id() as u64 ^ nanos());
    strata_store_protocol::addr::splitmix64(base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)))
        & !(1 << 63)
}

fn nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Fetches the prefix table from the orchestrator. Nodes pass the
/// cluster key, and take only a table sealed with it; tenants pass none.
pub async fn fetch_table(on: SocketAddr, key: Option<&ClusterKey>) -> Result<Table, Error> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // The padding that got the last table, unsealed: the orchestrator
    // answers an unsealed request only when the table is no longer than
    // it, so a table request without a key is padded from the start
    // (QUIC's 1200 bytes at first), and to what it took since.
    static TABLE_PAD: AtomicUsize = AtomicUsize::new(1200);
    let pad = if key.is_some() {
        0
    } else {
        TABLE_PAD.load(Ordering::Relaxed)
    };
    let msg = Msg::new(request_id(), 0, Body::GetTable);
    let timeout = Duration::from_millis(300);
    let (reply, used) = udp_call_padded(on, &msg, timeout, 5, key, pad).await?;
    if key.is_none() {
        TABLE_PAD.store(used, Ordering::Relaxed);
    }
    match ok_body(reply)? {
        Body::Table { bytes } => Table::decode(&bytes).map_err(|e| {
            Error::malformed(format!("the prefix table the orchestrator at {on} sent"), e)
        }),
        other => Err(Error::Peer(format!(
            "the orchestrator at {on} answered {other:?} to a table request"
        ))),
    }
}

/// Opens a data connection to the storage node at `endpoint` (an
/// endpoint the prefix table gave), with Nagle's delay off: requests and
/// replies are small, and each waits for the other.
pub async fn connect_data(endpoint: SocketAddr) -> Result<TcpStream, Error> {
    let io = |e| Error::io(format!("connecting to storage node {endpoint}"), e);
    // A node cut off by a partition drops the SYN: without a bound the
    // kernel retries for about two minutes.
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(endpoint))
        .await
        .map_err(|_| io(std::io::ErrorKind::TimedOut.into()))?
        .map_err(io)?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Longest a data connection to a storage node may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest a reader of a storage node's reply waits for its next byte
/// when another replica or fragment could serve instead: then it gives
/// that node up. A node that stops answering, stopped or cut off by a
/// partition while its connections stay open, would otherwise hold a
/// Get forever.
pub const REPLY_STALL: Duration = Duration::from_secs(5);

/// The same wait for the last replica left to try: a node that is only
/// slow (its link shaped, its Gets queued behind big streams by RS3)
/// gets the time to answer, since failing gains nothing.
pub const LAST_REPLY_STALL: Duration = Duration::from_secs(120);

/// A reply stream that fails with `TimedOut` once no byte has come for
/// its stall limit.
pub type Guarded<R> = std::pin::Pin<Box<tokio_io_timeout::TimeoutReader<R>>>;

/// Guards `reader` with the stall limit `stall` (see [`Guarded`]).
pub fn guarded<R: tokio::io::AsyncRead>(reader: R, stall: Duration) -> Guarded<R> {
    let mut reader = tokio_io_timeout::TimeoutReader::new(reader);
    reader.set_timeout(Some(stall));
    Box::pin(reader)
}

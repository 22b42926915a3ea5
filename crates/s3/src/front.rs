//! The gateway's HTTP/1.1 connections. Requests without a body (GETs and
//! HEADs) are read and answered here, so that a whole object a storage
//! node of this process holds goes from its replica file to the client's
//! socket with `sendfile`, never through user space: a response body
//! that hyper writes is read into memory, then copied into the socket.
//! The first request of any other kind hands the connection, with the
//! bytes already read, to hyper for the rest of its life, so uploads
//! (`Expect: 100-continue`, chunked bodies) stay hyper's.
//!
//! Bounds: a request head is at most [`MAX_HEAD`] bytes and
//! [`MAX_HEADERS`] fields; a connection has [`IDLE`] to send its next
//! head whole, and a client that stops reading an answer is given up
//! after [`STALL`].

use crate::metrics::{self, Measured, Metrics};
use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, DATE, EXPECT, TRANSFER_ENCODING};
use hyper::{Request, StatusCode, Version};
use s3s::service::S3Service;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use strata_store_client::client::local::CheckedRegion;
use strata_store_client::sendfile::{send_file, set_cork};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// Most bytes of a request head (S3 allows 8 KiB of headers).
pub const MAX_HEAD: usize = 64 << 10;

/// Most header fields of a request.
pub const MAX_HEADERS: usize = 128;

/// How long a connection may wait for its next request head.
pub const IDLE: Duration = Duration::from_secs(120);

/// How long a client may take nothing of an answer before it is given up.
pub const STALL: Duration = Duration::from_secs(60);

/// A response extension: the whole body is this checked region of a
/// local replica file, for the connection to `sendfile`; the response's
/// own body reads the same bytes, for a connection that cannot.
#[derive(Clone)]
pub(crate) struct SendFile(pub CheckedRegion);

/// Serves one client connection until it closes, errs or idles out.
pub(crate) async fn serve_connection(
    stream: TcpStream,
    service: S3Service,
    metrics: Arc<Metrics>,
) -> Result<(), String> {
    serve_connection_within(stream, service, metrics, IDLE).await
}

/// [`serve_connection`], each head due within `idle`.
async fn serve_connection_within(
    mut stream: TcpStream,
    service: S3Service,
    metrics: Arc<Metrics>,
    idle: Duration,
) -> Result<(), String> {
    let mut buffer = BytesMut::with_capacity(8 << 10);
    loop {
        let head = match read_head(&mut stream, &mut buffer, idle).await {
            Ok(Some(head)) => head,
            Ok(None) => return Ok(()),
            Err(refusal) => {
                let _ = write(&mut stream, refusal.answer().as_bytes()).await;
                close_after_answer(stream).await;
                return Err(refusal.to_string());
            }
        };
        let Head::Bodiless {
            request,
            length,
            keep_alive,
        } = head
        else {
            return hand_to_hyper(stream, buffer.freeze(), service, metrics).await;
        };
        buffer.advance(length);
        let wanted = Answering {
            keep_alive,
            head_only: request.method() == hyper::Method::HEAD,
            version: request.version(),
        };
        let response = metrics::handle(service.clone(), metrics.clone(), *request)
            .await
            .map_err(|e| format!("the S3 service failed: {e:?}"))?;
        if !answer(&mut stream, response, wanted).await? {
            return Ok(());
        }
    }
}

/// A request head read off the connection.
enum Head {
    /// A GET or HEAD without a body, answered here: the request, the
    /// bytes its head took, and whether the client keeps the connection.
    Bodiless {
        request: Box<Request<NoBody>>,
        length: usize,
        keep_alive: bool,
    },
    /// Anything else: hyper's to serve.
    Other,
}

/// Why a request head is refused before it reaches S3.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("a request head over {MAX_HEAD} bytes or {MAX_HEADERS} fields")]
    TooLarge,
    #[error("a malformed request head: {0}")]
    Malformed(String),
    #[error("a request head not sent whole in time")]
    Late,
}

impl Refusal {
    /// The bare HTTP answer, after which the connection is closed.
    fn answer(&self) -> String {
        let status = match self {
            Refusal::TooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Refusal::Malformed(_) => StatusCode::BAD_REQUEST,
            Refusal::Late => StatusCode::REQUEST_TIMEOUT,
        };
        format!(
            "HTTP/1.1 {} {}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or_default()
        )
    }
}

/// Reads until `buffer` starts with a whole request head: `None` when the
/// client closed (or idled out) between requests. The wait for a head
/// and its bytes is bounded as a whole, so a client that sends a byte
/// at a time holds its connection no longer than an idle one.
async fn read_head(
    stream: &mut TcpStream,
    buffer: &mut BytesMut,
    idle: Duration,
) -> Result<Option<Head>, Refusal> {
    let deadline = tokio::time::Instant::now() + idle;
    loop {
        if !buffer.is_empty() {
            if let Some(head) = parse(buffer)? {
                return Ok(Some(head));
            }
            if buffer.len() >= MAX_HEAD {
                return Err(Refusal::TooLarge);
            }
        }
        if buffer.capacity() - buffer.len() < 1024 {
            buffer.reserve(8 << 10);
        }
        match tokio::time::timeout_at(deadline, stream.read_buf(buffer)).await {
            Err(_) if buffer.is_empty() => return Ok(None),
            Err(_) => return Err(Refusal::Late),
            // Closed or reset, between requests or within a head: there
            // is no one to answer.
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
            Ok(Ok(_)) => {}
        }
    }
}

/// Most bytes read and dropped after a refusal, and for how long.
const LINGER: (usize, Duration) = (1 << 20, Duration::from_secs(2));

/// Closes `stream` after a refusal: its sending side first, then what the
/// client still sends is read and dropped for a while, as web servers
/// do, since closing with unread bytes resets the connection, and a
/// reset can destroy the answer before the client reads it.
async fn close_after_answer(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let mut scratch = vec![0u8; 16 << 10];
    let mut dropped = 0;
    let _ = tokio::time::timeout(LINGER.1, async {
        while dropped < LINGER.0 {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => dropped += n,
            }
        }
    })
    .await;
}

/// The request head at the start of `bytes`, if it is whole.
fn parse(bytes: &[u8]) -> Result<Option<Head>, Refusal> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut fields);
    let length = match parsed.parse(bytes) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Refusal::TooLarge),
        Err(e) => return Err(Refusal::Malformed(e.to_string())),
    };
    let method = parsed.method.unwrap_or_default();
    let version = match parsed.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let mut request = Request::builder()
        .method(method)
        .uri(parsed.path.unwrap_or("/"))
        .version(version);
    let mut close = version == Version::HTTP_10;
    for field in parsed.headers.iter() {
        let name = field.name;
        let bodiless = if name.eq_ignore_ascii_case(CONTENT_LENGTH.as_str()) {
            field.value.iter().all(|&b| b == b'0') && !field.value.is_empty()
        } else {
            !name.eq_ignore_ascii_case(TRANSFER_ENCODING.as_str())
                && !name.eq_ignore_ascii_case(EXPECT.as_str())
        };
        if !bodiless {
            return Ok(Some(Head::Other));
        }
        if name.eq_ignore_ascii_case(CONNECTION.as_str()) {
            for token in String::from_utf8_lossy(field.value).split(',') {
                match token.trim().to_ascii_lowercase().as_str() {
                    "close" => close = true,
                    "keep-alive" => close = false,
                    "upgrade" => return Ok(Some(Head::Other)),
                    _ => {}
                }
            }
        }
        request = request.header(name, field.value);
    }
    if method != "GET" && method != "HEAD" {
        return Ok(Some(Head::Other));
    }
    let request = request
        .body(NoBody)
        .map_err(|e| Refusal::Malformed(e.to_string()))?;
    Ok(Some(Head::Bodiless {
        request: Box::new(request),
        length,
        keep_alive: !close,
    }))
}

/// What the request asked of its answer.
struct Answering {
    keep_alive: bool,
    head_only: bool,
    version: Version,
}

/// Writes `response` on `stream`: a [`SendFile`] body with `sendfile`,
/// any other body as it comes (chunked when its length is unknown).
/// Whether the connection goes on.
async fn answer(
    stream: &mut TcpStream,
    response: hyper::Response<Measured>,
    wanted: Answering,
) -> Result<bool, String> {
    let (parts, mut body) = response.into_parts();
    let status = parts.status;
    let no_body = wanted.head_only
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let declared: Option<u64> = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse().ok());
    let length = match declared {
        Some(length) => Some(length),
        None if no_body => None,
        None => body.size_hint().exact(),
    };
    let region = parts
        .extensions
        .get::<SendFile>()
        .map(|sent| sent.0.clone())
        .filter(|region| !no_body && status == StatusCode::OK && length == Some(region.length));
    let chunked = length.is_none() && !no_body && wanted.version == Version::HTTP_11;
    let asked_close = parts
        .headers
        .get_all(CONNECTION)
        .iter()
        .any(|value| value.as_bytes().eq_ignore_ascii_case(b"close"));
    // A body of unknown length on HTTP/1.0 ends with the connection.
    let close = !wanted.keep_alive || asked_close || (length.is_none() && !no_body && !chunked);

    let mut head = Vec::with_capacity(1024);
    head.extend_from_slice(
        format!(
            "HTTP/1.1 {} {}\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or_default()
        )
        .as_bytes(),
    );
    for (name, value) in &parts.headers {
        if name != CONNECTION && name != TRANSFER_ENCODING {
            field(&mut head, name.as_str(), value);
        }
    }
    if !parts.headers.contains_key(DATE) {
        let now = httpdate::fmt_http_date(std::time::SystemTime::now());
        field(
            &mut head,
            "date",
            &HeaderValue::from_str(&now).unwrap_or(HeaderValue::from_static("")),
        );
    }
    if declared.is_none() && !no_body {
        if let Some(length) = length {
            field(&mut head, "content-length", &HeaderValue::from(length));
        }
    }
    if chunked {
        field(
            &mut head,
            "transfer-encoding",
            &HeaderValue::from_static("chunked"),
        );
    }
    if close {
        field(&mut head, "connection", &HeaderValue::from_static("close"));
    } else if wanted.version == Version::HTTP_10 {
        field(
            &mut head,
            "connection",
            &HeaderValue::from_static("keep-alive"),
        );
    }
    head.extend_from_slice(b"\r\n");

    if let Some(region) = region {
        // The head and the body's first bytes leave in full segments.
        set_cork(stream, true);
        write(stream, &head).await?;
        let sent = send_file(stream, &region.file, region.offset, region.length, STALL).await;
        set_cork(stream, false);
        let sent = sent.map_err(|e| format!("sending a replica file: {e:?}"))?;
        body.sent_directly(sent);
        // A file cut short under us: the answer is short, so it must end
        // the connection for the client to see it.
        return Ok(!close && sent == region.length);
    }
    write(stream, &head).await?;
    if no_body {
        return Ok(!close);
    }
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        // A body that fails (a store read cut short) ends the connection:
        // the client sees a short answer.
        let Ok(frame) = frame else { return Ok(false) };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        if chunked {
            write(stream, format!("{:x}\r\n", data.len()).as_bytes()).await?;
            write(stream, &data).await?;
            write(stream, b"\r\n").await?;
        } else {
            write(stream, &data).await?;
        }
    }
    if chunked {
        write(stream, b"0\r\n\r\n").await?;
    }
    Ok(!close)
}

/// Appends one header field to a response head.
fn field(head: &mut Vec<u8>, name: &str, value: &HeaderValue) {
    head.extend_from_slice(name.as_bytes());
    head.extend_from_slice(b": ");
    head.extend_from_slice(value.as_bytes());
    head.extend_from_slice(b"\r\n");
}

/// Writes `bytes` whole, giving up on a client that takes none for
/// [`STALL`].
async fn write(stream: &mut TcpStream, bytes: &[u8]) -> Result<(), String> {
    match tokio::time::timeout(STALL, stream.write_all(bytes)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("writing an answer: {e}")),
        Err(_) => Err(format!("the client took nothing for {} s", STALL.as_secs())),
    }
}

/// Serves the rest of the connection with hyper, the bytes already read
/// (`read`) first.
async fn hand_to_hyper(
    stream: TcpStream,
    read: Bytes,
    service: S3Service,
    metrics: Arc<Metrics>,
) -> Result<(), String> {
    let io = hyper_util::rt::TokioIo::new(Prefixed { read, stream });
    let handler = hyper::service::service_fn(move |request| {
        metrics::handle(service.clone(), metrics.clone(), request)
    });
    hyper::server::conn::http1::Builder::new()
        .serve_connection(io, handler)
        .await
        .map_err(|e| e.to_string())
}

/// A connection whose first bytes were already read into `read`.
struct Prefixed {
    read: Bytes,
    stream: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.read.is_empty() {
            return Pin::new(&mut self.stream).poll_read(cx, out);
        }
        let count = self.read.len().min(out.remaining());
        out.put_slice(&self.read[..count]);
        self.read.advance(count);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, bytes)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pieces: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, pieces)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The body of a request that has none.
pub(crate) struct NoBody;

impl Body for NoBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        true
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use strata_store_protocol::key::ClusterKey;

    /// A gateway (to a cluster that is not there: these requests are the
    /// metrics scrape and anonymous ones, refused before the store) on a
    /// loopback port, each connection served by [`serve_connection`] on a
    /// runtime of its own thread; the port.
    fn gateway() -> std::net::SocketAddr {
        gateway_within(IDLE)
    }

    /// [`gateway`], each head due within `idle`.
    fn gateway_within(idle: Duration) -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                listener.set_nonblocking(true).expect("non-blocking");
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let cluster = "127.0.0.1:9".parse().expect("an address");
                let gateway = crate::Gateway::new(cluster, ClusterKey::from_bytes(&[7; 32]));
                let (service, metrics) = crate::service(gateway);
                while let Ok((stream, _)) = listener.accept().await {
                    let (service, metrics) = (service.clone(), metrics.clone());
                    tokio::spawn(serve_connection_within(stream, service, metrics, idle));
                }
            });
        });
        address
    }

    /// Sends `request` on a new connection and reads until the gateway
    /// closes it.
    fn exchange(request: &[u8]) -> String {
        let mut stream = std::net::TcpStream::connect(gateway()).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        stream.write_all(request).expect("send");
        let mut answer = Vec::new();
        stream
            .read_to_end(&mut answer)
            .expect("the gateway closes the connection");
        String::from_utf8_lossy(&answer).into_owned()
    }

    fn statuses(answer: &str) -> Vec<&str> {
        answer
            .match_indices("HTTP/1.1 ")
            .map(|(at, _)| &answer[at + 9..at + 12])
            .collect()
    }

    #[test]
    fn pipelined_gets_are_answered_in_order_and_close_ends_the_connection() {
        let answer = exchange(
            b"GET /metrics HTTP/1.1\r\nHost: s3\r\n\r\n\
              HEAD /bucket/k HTTP/1.1\r\nHost: s3\r\n\r\n\
              GET /metrics HTTP/1.1\r\nHost: s3\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(statuses(&answer), ["200", "403", "200"], "{answer}");
        // The HEAD's answer has a head only: the next answer follows it.
        let head_answer = answer.split("HTTP/1.1 403").nth(1).expect("the 403");
        let (_, after) = head_answer.split_once("\r\n\r\n").expect("its head");
        assert!(after.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            answer.contains("strata_s3_sendfile_bytes_total 0"),
            "{answer}"
        );
        assert!(
            answer.to_ascii_lowercase().contains("\r\ndate: "),
            "{answer}"
        );
    }

    #[test]
    fn an_http_1_0_request_is_answered_then_the_connection_closes() {
        let answer = exchange(b"GET /metrics HTTP/1.0\r\n\r\n");
        assert_eq!(statuses(&answer), ["200"], "{answer}");
        assert!(answer.contains("connection: close"), "{answer}");
    }

    #[test]
    fn a_request_with_a_body_hands_the_connection_to_hyper_with_its_bytes() {
        // A DELETE (no body) goes to hyper, which serves what follows.
        let answer = exchange(
            b"GET /metrics HTTP/1.1\r\nHost: s3\r\n\r\n\
              DELETE /bucket/k HTTP/1.1\r\nHost: s3\r\n\r\n\
              GET /metrics HTTP/1.1\r\nHost: s3\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(statuses(&answer), ["200", "403", "200"], "{answer}");
        assert!(answer.contains("<Code>AccessDenied</Code>"), "{answer}");
        assert!(answer.contains("operation=\"DeleteObject\",status=\"403\""));
        // A body sent with the head reaches hyper whole.
        let answer = exchange(
            b"GET /metrics HTTP/1.1\r\nHost: s3\r\n\r\n\
              PUT /bucket/k HTTP/1.1\r\nHost: s3\r\nContent-Length: 3\r\n\
              Connection: close\r\n\r\nabc",
        );
        assert_eq!(statuses(&answer), ["200", "403"], "{answer}");
        assert!(answer.contains("<Code>AccessDenied</Code>"), "{answer}");
    }

    #[test]
    fn oversized_malformed_and_unfinished_heads_get_a_bare_error_and_a_close() {
        let huge = format!(
            "GET / HTTP/1.1\r\nHost: s3\r\nx-amz-meta-a: {}\r\n\r\n",
            "a".repeat(MAX_HEAD)
        );
        let answer = exchange(huge.as_bytes());
        assert_eq!(statuses(&answer), ["431"], "{answer}");
        let fields: String = (0..=MAX_HEADERS)
            .map(|i| format!("x-f{i}: 1\r\n"))
            .collect();
        let many = format!("GET / HTTP/1.1\r\n{fields}\r\n");
        assert_eq!(statuses(&exchange(many.as_bytes())), ["431"]);
        let answer = exchange(b"GET / HTTP/1.1\r\nHost s3\r\n\r\n");
        assert_eq!(statuses(&answer), ["400"], "{answer}");
        let answer = exchange(b"\x00\x01\x02 garbage\r\n\r\n");
        assert_eq!(statuses(&answer), ["400"], "{answer}");
        // Half a head, then the client closes its side: nothing to answer.
        let mut stream = std::net::TcpStream::connect(gateway()).expect("connect");
        stream.write_all(b"GET /metr").expect("send");
        stream
            .shutdown(std::net::Shutdown::Write)
            .expect("shutdown");
        let mut rest = Vec::new();
        stream.read_to_end(&mut rest).expect("closed");
        assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    }

    #[test]
    fn a_head_sent_a_byte_at_a_time_is_cut_off_at_the_deadline() {
        let idle = Duration::from_millis(600);
        let mut stream = std::net::TcpStream::connect(gateway_within(idle)).expect("connect");
        // Cut off at the deadline, then closed once the lingering read
        // of what the client still sends ends.
        let bound = idle + LINGER.1 + Duration::from_secs(5);
        let started = std::time::Instant::now();
        let mut sent = 0;
        for byte in b"GET /metrics HTTP/1.1\r\nx-slow: ".iter().cycle() {
            if stream.write_all(&[*byte]).is_err() || started.elapsed() > bound {
                break;
            }
            sent += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        let waited = started.elapsed();
        assert!(waited < bound, "still open after {waited:?} ({sent} bytes)");
        assert!(waited >= idle, "closed after {waited:?}");
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
            "{answer}"
        );
        // An idle connection (nothing sent) is closed without an answer.
        let mut quiet = std::net::TcpStream::connect(gateway_within(idle)).expect("connect");
        let mut nothing = Vec::new();
        quiet.read_to_end(&mut nothing).expect("closed");
        assert!(nothing.is_empty());
    }
}

//! The accept loop with real sockets: a request is answered, a client
//! that sends no head is closed after the header timeout, a connection
//! beyond the cap waits while every slot is busy and pushes out an idle
//! one otherwise, and shutdown lets an answer in progress finish.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Request, Response};
use strata_http::{serve, Limits, Listener};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

/// Longest any step of a test may take before it counts as hung.
const PATIENCE: Duration = Duration::from_secs(20);

/// What the test handler shares with its test: `/slow` tells `entered`
/// and waits for a permit of `release`; any other path answers at once.
#[derive(Clone)]
struct Handler {
    entered: mpsc::UnboundedSender<()>,
    release: Arc<Semaphore>,
}

impl Handler {
    async fn answer(self, request: Request<Incoming>) -> Response<String> {
        let path = request.uri().path().to_string();
        if path == "/slow" {
            let _ = self.entered.send(());
            if let Ok(permit) = self.release.acquire().await {
                permit.forget();
            }
        }
        Response::new(format!("answer to {path}"))
    }
}

/// A server under test on a loopback port.
struct Server {
    addr: std::net::SocketAddr,
    entered: mpsc::UnboundedReceiver<()>,
    release: Arc<Semaphore>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

async fn start(limits: Limits, drain_timeout: Duration) -> Server {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let (entered_tx, entered) = mpsc::unbounded_channel();
    let release = Arc::new(Semaphore::new(0));
    let handler = Handler {
        entered: entered_tx,
        release: release.clone(),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let task = tokio::spawn(serve(
        Listener::Tcp(tcp),
        limits,
        move |request| handler.clone().answer(request),
        shutdown,
        drain_timeout,
    ));
    Server {
        addr,
        entered,
        release,
        stop: Some(stop),
        task,
    }
}

fn limits(max_connections: usize, header_timeout: Duration) -> Limits {
    Limits {
        max_connections,
        header_timeout,
    }
}

/// Sends a GET of `path` that closes the connection after its answer.
async fn send_get<S: AsyncWriteExt + Unpin>(stream: &mut S, path: &str) {
    let head = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
}

/// Everything the server sends until it closes the connection.
async fn read_to_close<S: AsyncReadExt + Unpin>(stream: &mut S) -> String {
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut answer))
        .await
        .expect("the server neither answered nor closed")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// Whether the server closed `stream` (end of file or reset) within `wait`.
async fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut byte = [0u8; 1];
    match tokio::time::timeout(wait, stream.read(&mut byte)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) => panic!("the server sent bytes to a client that asked nothing"),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_normal_request_is_served() {
    let server = start(Limits::default(), Duration::ZERO).await;
    let mut client = TcpStream::connect(server.addr).await.unwrap();
    send_get(&mut client, "/hello").await;
    let answer = read_to_close(&mut client).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with("answer to /hello"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_is_served_and_its_file_removed_at_shutdown() {
    let dir = std::env::temp_dir().join(format!("strata-http-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("api.sock");
    let _ = std::fs::remove_file(&path);
    let unix = tokio::net::UnixListener::bind(&path).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(
        Listener::Unix(unix, path.clone()),
        Limits::default(),
        |request: Request<Incoming>| async move {
            Response::new(format!("answer to {}", request.uri().path()))
        },
        async move {
            let _ = stopped.await;
        },
        Duration::from_secs(5),
    ));
    let mut client = UnixStream::connect(&path).await.unwrap();
    send_get(&mut client, "/over-unix").await;
    let answer = read_to_close(&mut client).await;
    assert!(answer.ends_with("answer to /over-unix"), "{answer}");
    stop.send(()).unwrap();
    tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
    assert!(!path.exists(), "the socket file outlived the server");
    let _ = std::fs::remove_dir(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_no_head_is_closed_after_the_header_timeout() {
    let timeout = Duration::from_millis(300);
    let server = start(limits(8, timeout), Duration::ZERO).await;
    let opened = Instant::now();
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    assert!(closed_within(&mut silent, PATIENCE).await);
    let waited = opened.elapsed();
    assert!(
        waited >= timeout - Duration::from_millis(50),
        "closed after {waited:?}"
    );
    // One that sent half a head is closed the same way.
    let mut half = TcpStream::connect(server.addr).await.unwrap();
    half.write_all(b"GET / HTTP/1.1\r\nHost: te").await.unwrap();
    assert!(closed_within(&mut half, PATIENCE).await);
    // And the server still answers.
    let mut client = TcpStream::connect(server.addr).await.unwrap();
    send_get(&mut client, "/after").await;
    assert!(read_to_close(&mut client)
        .await
        .ends_with("answer to /after"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_beyond_the_cap_waits_while_every_one_is_busy() {
    let mut server = start(limits(1, Duration::from_secs(30)), Duration::ZERO).await;
    let mut busy = TcpStream::connect(server.addr).await.unwrap();
    send_get(&mut busy, "/slow").await;
    tokio::time::timeout(PATIENCE, server.entered.recv())
        .await
        .unwrap();
    // The only slot is busy: the next connection waits in the backlog,
    // unanswered, for longer than an answer's grace.
    let mut waiting = TcpStream::connect(server.addr).await.unwrap();
    send_get(&mut waiting, "/fast").await;
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(1500), waiting.read(&mut byte)).await;
    assert!(early.is_err(), "a connection beyond the cap was answered");
    // Once the busy answer is sent, the waiting one is served.
    server.release.add_permits(1);
    assert!(read_to_close(&mut busy).await.ends_with("answer to /slow"));
    let answer = read_to_close(&mut waiting).await;
    assert!(answer.ends_with("answer to /fast"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_pushes_out_the_oldest_idle_one() {
    let server = start(limits(2, Duration::from_secs(30)), Duration::ZERO).await;
    let mut oldest = TcpStream::connect(server.addr).await.unwrap();
    oldest.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let mut second = TcpStream::connect(server.addr).await.unwrap();
    second.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    // Both half-open connections fill the cap; let them be accepted.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut client = TcpStream::connect(server.addr).await.unwrap();
    send_get(&mut client, "/new").await;
    let answer = read_to_close(&mut client).await;
    assert!(answer.ends_with("answer to /new"), "{answer}");
    assert!(
        closed_within(&mut oldest, PATIENCE).await,
        "the oldest idle connection was not pushed out"
    );
    assert!(
        !closed_within(&mut second, Duration::from_millis(300)).await,
        "a younger idle connection was pushed out too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_an_answer_in_progress_finish() {
    let mut server = start(Limits::default(), Duration::from_secs(10)).await;
    let mut busy = TcpStream::connect(server.addr).await.unwrap();
    send_get(&mut busy, "/slow").await;
    let mut idle = TcpStream::connect(server.addr).await.unwrap();
    tokio::time::timeout(PATIENCE, server.entered.recv())
        .await
        .unwrap();
    server.stop.take().unwrap().send(()).unwrap();
    assert!(
        closed_within(&mut idle, PATIENCE).await,
        "an idle connection outlived shutdown"
    );
    assert!(
        !server.task.is_finished(),
        "shutdown did not wait for the answer"
    );
    server.release.add_permits(1);
    assert!(read_to_close(&mut busy).await.ends_with("answer to /slow"));
    tokio::time::timeout(PATIENCE, server.task)
        .await
        .expect("shutdown did not end once the answer was sent")
        .unwrap();
    assert!(TcpStream::connect(server.addr).await.is_err());
}

//! The transmission phase of one connection, on a small pool of threads
//! of its own (leader/followers).
//!
//! Whichever thread holds the read side is the leader: it reads one
//! request (header and payload), hands the read side to the next thread,
//! runs the request against the disk and writes the reply itself. So a
//! request goes from socket to disk to socket on one thread, with no
//! hand-off on its path, while up to [`MAX_IN_FLIGHT`] requests run at
//! once and complete in any order. The pool grows only when no thread is
//! free to read the next request, so a client at queue depth 1 costs two
//! threads and one at depth 64 with slow I/O costs 64.
//!
//! Why threads and not tasks: every disk call is blocking file I/O, and on
//! an async runtime each request would pay two cross-thread wake-ups (to a
//! blocking pool and back); measured on 4 KiB reads, that halved IOPS.
//! The async runtime still owns accepting, the handshake and its timeout,
//! and shutdown.
//!
//! Memory is bounded per connection: one request per thread, and at most
//! [`MAX_IN_FLIGHT_BYTES`] of read and write buffers at once; and per
//! server, by the [`Budget`] every connection takes its buffers from.
//!
//! With an idle timeout, a connection that sends nothing while none of its
//! requests is running for that long is closed. Whatever the idle timeout,
//! a connection that holds part of the budget without making progress
//! (stops in the middle of a write's payload, or reads none of its
//! replies) for the stall timeout is dropped, so that a few stalled clients
//! cannot pin the budget every other client needs.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tokio::sync::{oneshot, watch};

use crate::budget::{Budget, Grant};
use crate::command::{self, Op, Session, MAX_PAYLOAD};
use crate::export::{Export, Scratch};
use crate::handshake::Negotiated;
use crate::proto::{self, REQUEST_LEN};
use crate::reply::Reply;

/// Most requests of one connection in flight (and threads serving it),
/// whatever the device asks for with `BlockDevice::parallel_requests`.
pub const MAX_IN_FLIGHT: usize = 64;

/// Most bytes of read and write buffers one connection holds at once.
/// Two maximum-size requests fit, so one large request never stalls.
pub const MAX_IN_FLIGHT_BYTES: u64 = 2 * MAX_PAYLOAD as u64;

/// Read buffer: several small requests per syscall.
const READ_BUF: usize = 128 * 1024;

/// Stack of a connection thread; the engine's paths are shallow.
const THREAD_STACK: usize = 1024 * 1024;

/// How long, after refusing input it will not read, the server keeps
/// reading and dropping what the client still sends before closing, so
/// the client sees the error reply and an orderly end, not a reset.
const LINGER: Duration = Duration::from_secs(2);
/// Replies up to this size are queued and written in batches (see
/// [`Conn::send`]); larger ones (read data) go straight to the socket.
const BATCHED_REPLY: usize = 512;

/// What a server allows each connection, shared by all of them.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// The server's budget of request buffers.
    pub(crate) budget: Arc<Budget>,
    /// Close a connection idle for this long; `None`: never.
    pub(crate) idle: Option<Duration>,
    /// Drop a connection that makes no progress in a request for this long.
    pub(crate) stall: Duration,
}

/// How often a waiting read wakes up to check the timeouts: a quarter of
/// the shorter one (so a connection closes within 1.25 times it), at most
/// once a second.
fn tick(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// A connected socket in blocking mode.
pub(crate) enum Socket {
    /// TCP.
    Tcp(std::net::TcpStream),
    /// Unix domain.
    Unix(UnixStream),
}

impl Socket {
    fn try_clone(&self) -> std::io::Result<Socket> {
        Ok(match self {
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
        })
    }

    fn fd(&self) -> RawFd {
        match self {
            Socket::Tcp(s) => s.as_raw_fd(),
            Socket::Unix(s) => s.as_raw_fd(),
        }
    }

    fn set_read_timeout(&self, t: Option<Duration>) {
        let _ = match self {
            Socket::Tcp(s) => s.set_read_timeout(t),
            Socket::Unix(s) => s.set_read_timeout(t),
        };
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_write_timeout(t),
            Socket::Unix(s) => s.set_write_timeout(t),
        }
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.read(buf),
            Socket::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.write(buf),
            Socket::Unix(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.write_vectored(bufs),
            Socket::Unix(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How the connection ends.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// NBD_CMD_DISC, or the client closed between requests.
    Client,
    /// The server is shutting down.
    Shutdown,
    /// The stream cannot be followed any more: finish what is in flight,
    /// then close after a short linger.
    Broken(String),
    /// Replies cannot be written: the client is gone.
    Gone(String),
    /// The client sent nothing for the idle timeout.
    Idle(Duration),
    /// The client stopped in the middle of a request's payload.
    Stalled(Duration),
}

/// Why a read of the request stream stopped.
enum Stall {
    /// The idle timeout passed with nothing received and nothing running.
    Idle(Duration),
    /// A payload stopped coming for the stall timeout.
    Stalled(Duration),
    /// The socket failed or ended.
    Io(std::io::Error),
}

struct State {
    /// Threads alive.
    threads: usize,
    /// Bytes of buffers held by requests in flight.
    bytes: u64,
    /// Requests read and not yet answered.
    running: usize,
    /// Set once: no request is read after it.
    end: Option<End>,
    /// Told when the last thread has closed the connection.
    done: Option<oneshot::Sender<()>>,
}

struct Conn {
    /// The socket's descriptor, for lock-free shutdown.
    fd: RawFd,
    export: Arc<Export>,
    session: Session,
    peer: String,
    /// The read side; its holder is the leader. A std mutex, not
    /// parking_lot's: every idle thread of the connection queues here, and
    /// parking_lot spins with `sched_yield` before it sleeps, which cost
    /// the daemon up to 8% of its CPU with 16 requests in flight on 2 cores.
    reader: std::sync::Mutex<BufReader<Socket>>,
    /// Serializes replies on the socket.
    writer: Mutex<Socket>,
    /// Small replies waiting for the socket, written by whichever thread
    /// holds `writer` next.
    queued: Mutex<Vec<u8>>,
    /// Threads waiting to become the leader.
    waiting: AtomicUsize,
    /// Most threads (requests running at once) for this connection.
    max_threads: usize,
    state: Mutex<State>,
    /// Signalled when buffer bytes are released or the connection ends.
    space: Condvar,
    /// The server's buffer budget.
    budget: Arc<Budget>,
    /// The idle timeout, if any.
    idle: Option<Duration>,
    /// The stall timeout (never longer than the idle timeout).
    stall: Duration,
    /// When the connection entered transmission.
    started: Instant,
    /// Milliseconds after `started` when a byte last came in or a reply
    /// last went out (kept only with an idle timeout).
    last_active: AtomicU64,
}

/// One unit of work read by the leader.
enum Next {
    /// Run it.
    /// (A write's payload is in the thread's scratch buffer.)
    Run {
        op: Op,
        handle: u64,
        bytes: u64,
        /// The request's share of the server's budget.
        grant: Grant,
    },
    /// Reply without touching the disk (refused request).
    Reply(Reply<'static>),
    /// Stop reading (maybe after sending a last reply).
    End(End, Option<Reply<'static>>),
}

/// Serves the transmission phase on `socket` until the client leaves,
/// breaks the protocol, or the server shuts down. In-flight requests
/// always complete and get their replies before the connection closes.
/// If this future is dropped (shutdown timeout), the socket is shut down
/// so that stuck threads fail out.
pub(crate) async fn serve(
    socket: Socket,
    neg: Negotiated,
    mut shutdown: watch::Receiver<bool>,
    peer: String,
    limits: Limits,
) {
    let (done_tx, mut done_rx) = oneshot::channel();
    let conn = match Conn::new(socket, neg, peer, done_tx, limits) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("cannot serve connection: {e}");
            return;
        }
    };
    let mut guard = KillOnDrop(Some(conn.clone()));
    if let Err(e) = spawn_worker(&conn) {
        tracing::warn!(peer = conn.peer, "cannot start a connection thread: {e}");
        conn.stop(End::Gone("no thread".into()));
        // No thread ever ran: close here.
        conn.finish();
    }
    let stopping = tokio::select! {
        _ = &mut done_rx => false,
        _ = shutdown.wait_for(|s| *s) => true,
    };
    if stopping {
        conn.stop(End::Shutdown);
        let _ = done_rx.await;
    }
    guard.0 = None;
}

/// Shuts the socket down if the connection's async side is abandoned.
struct KillOnDrop(Option<Arc<Conn>>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            conn.stop(End::Shutdown);
            // Unblocks threads stuck writing to a client that does not read.
            conn.shutdown_socket(Shutdown::Both);
        }
    }
}

fn spawn_worker(conn: &Arc<Conn>) -> std::io::Result<()> {
    conn.state.lock().threads += 1;
    let c = conn.clone();
    let spawned = std::thread::Builder::new()
        .name("strata-nbd-conn".into())
        .stack_size(THREAD_STACK)
        .spawn(move || worker(c));
    if let Err(e) = spawned {
        conn.state.lock().threads -= 1;
        return Err(e);
    }
    Ok(())
}

fn worker(conn: Arc<Conn>) {
    let _exit = ExitGuard(conn.clone());
    let mut buffer = ThreadBuffer {
        scratch: Scratch::new(),
        kept: 0,
        budget: conn.budget.clone(),
    };
    loop {
        conn.waiting.fetch_add(1, Ordering::SeqCst);
        let mut reader = conn.lock_reader();
        conn.waiting.fetch_sub(1, Ordering::SeqCst);
        if conn.state.lock().end.is_some() {
            return;
        }
        let next = conn.next(&mut reader, &mut buffer.scratch);
        match next {
            Next::Run {
                op,
                handle,
                bytes,
                grant,
            } => {
                // Keep a thread ready to read the next request while this
                // one runs: that is what lets requests overlap.
                if conn.waiting.load(Ordering::SeqCst) == 0
                    && conn.state.lock().threads < conn.max_threads
                {
                    if let Err(e) = spawn_worker(&conn) {
                        tracing::debug!(peer = conn.peer, "no extra thread: {e}");
                    }
                }
                drop(reader);
                let reply =
                    conn.export
                        .execute(op, handle, &mut buffer.scratch, conn.session.structured);
                conn.send(&reply);
                drop(reply);
                conn.release(bytes);
                drop(grant);
                conn.finished_request();
                buffer.settle();
            }
            Next::Reply(reply) => {
                drop(reader);
                conn.send(&reply);
            }
            Next::End(end, reply) => {
                conn.stop(end);
                drop(reader);
                if let Some(r) = reply {
                    conn.send(&r);
                }
                return;
            }
        }
    }
}

/// A thread's I/O buffer, with the bytes of it counted as kept.
struct ThreadBuffer {
    scratch: Scratch,
    kept: u64,
    budget: Arc<Budget>,
}

impl ThreadBuffer {
    /// After a request: keeps the buffer for the next one if it is not
    /// huge and the server's bound on kept buffers allows, else frees it.
    fn settle(&mut self) {
        self.scratch.trim();
        let capacity = self.scratch.capacity() as u64;
        if capacity == self.kept {
            return;
        }
        if self.budget.keep(self.kept, capacity) {
            self.kept = capacity;
        } else {
            self.scratch.clear();
            self.budget.keep(self.kept, 0);
            self.kept = 0;
        }
    }
}

impl Drop for ThreadBuffer {
    fn drop(&mut self) {
        self.budget.keep(self.kept, 0);
    }
}

/// The last thread to leave closes the connection.
struct ExitGuard(Arc<Conn>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let last = {
            let mut st = self.0.state.lock();
            st.threads -= 1;
            st.threads == 0
        };
        if last {
            self.0.finish();
        }
    }
}

impl Conn {
    /// Becomes the leader. Poisoning is ignored, as parking_lot's mutex
    /// did: a panic mid-read leaves the stream where it was, and the next
    /// request's magic check catches a stream out of step.
    fn lock_reader(&self) -> std::sync::MutexGuard<'_, BufReader<Socket>> {
        self.reader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn new(
        socket: Socket,
        neg: Negotiated,
        peer: String,
        done: oneshot::Sender<()>,
        limits: Limits,
    ) -> std::io::Result<Arc<Conn>> {
        let reader = socket.try_clone()?;
        let stall = limits.idle.map_or(limits.stall, |i| i.min(limits.stall));
        // Socket options are shared by both descriptors: reads wake up to
        // check the timeouts, and a reply nobody reads for the whole stall
        // timeout fails.
        reader.set_read_timeout(Some(tick(stall)));
        socket.set_write_timeout(Some(stall))?;
        let session = Session {
            size: neg.export.size(),
            read_only: neg.export.read_only(),
            structured: neg.structured,
            block_status: neg.block_status,
        };
        let max_threads = neg
            .export
            .disk()
            .parallel_requests()
            .clamp(1, MAX_IN_FLIGHT);
        Ok(Arc::new(Conn {
            fd: socket.fd(),
            max_threads,
            export: neg.export,
            session,
            peer,
            reader: std::sync::Mutex::new(BufReader::with_capacity(READ_BUF, reader)),
            writer: Mutex::new(socket),
            queued: Mutex::new(Vec::new()),
            waiting: AtomicUsize::new(0),
            state: Mutex::new(State {
                threads: 0,
                bytes: 0,
                running: 0,
                end: None,
                done: Some(done),
            }),
            space: Condvar::new(),
            budget: limits.budget,
            idle: limits.idle,
            stall,
            started: Instant::now(),
            last_active: AtomicU64::new(0),
        }))
    }

    /// Records how the connection ends (the first reason wins) and wakes
    /// whoever waits for buffer space or for a request.
    fn stop(&self, end: End) {
        {
            let mut st = self.state.lock();
            if st.end.is_none() {
                st.end = Some(end.clone());
            }
        }
        self.space.notify_all();
        // A leader waiting for the server's budget gives up.
        self.budget.wake();
        if end == End::Shutdown {
            // Wakes the leader out of its blocking read (it sees EOF).
            self.shutdown_socket(Shutdown::Read);
        }
    }

    /// Shuts the socket down without taking any lock: the read side may
    /// be held by a thread blocked in read(), the write side by one
    /// blocked in write(), and this is what unblocks them.
    fn shutdown_socket(&self, how: Shutdown) {
        let how = match how {
            Shutdown::Read => libc::SHUT_RD,
            Shutdown::Write => libc::SHUT_WR,
            Shutdown::Both => libc::SHUT_RDWR,
        };
        // SAFETY: shutdown(2) on a descriptor owned by `self` (open as long
        // as `self` is); it does not close the descriptor.
        unsafe {
            libc::shutdown(self.fd, how);
        }
    }

    /// Reads the next request and decides what to do with it.
    fn next(&self, r: &mut BufReader<Socket>, scratch: &mut Scratch) -> Next {
        let mut hdr = [0u8; REQUEST_LEN];
        match self.read_full(r, &mut hdr, false) {
            Ok(()) => {}
            Err(Stall::Idle(t)) => return Next::End(End::Idle(t), None),
            Err(Stall::Stalled(t)) => return Next::End(End::Stalled(t), None),
            Err(Stall::Io(e)) => {
                return Next::End(
                    match e.kind() {
                        std::io::ErrorKind::UnexpectedEof => End::Client,
                        _ => End::Broken(format!("read failed: {e}")),
                    },
                    None,
                );
            }
        }
        let req = match proto::parse_request(&hdr) {
            Ok(r) => r,
            Err(e) => return Next::End(End::Broken(format!("bad request: {e}")), None),
        };
        let op = match command::check(&req, &self.session) {
            Ok(op) => op,
            Err(refusal) => {
                tracing::debug!(peer = self.peer, "request refused: {}", refusal.message);
                // A structured session must answer READ with a structured
                // reply; other errors go structured there too, to carry
                // the message.
                let reply = Reply::error(
                    req.handle,
                    refusal.error,
                    &refusal.message,
                    self.session.structured,
                );
                if req.command == proto::CMD_WRITE {
                    if req.length > MAX_PAYLOAD {
                        // Too big to read: the stream cannot continue.
                        return Next::End(End::Broken(refusal.message), Some(reply));
                    }
                    if let Err(stall) = self.discard(r, u64::from(req.length)) {
                        return Next::End(stall.end("write payload"), None);
                    }
                }
                return Next::Reply(reply);
            }
        };
        let bytes = match op {
            Op::Disc => return Next::End(End::Client, None),
            Op::Read { len, .. } | Op::Write { len, .. } => u64::from(len),
            _ => 0,
        };
        if !self.reserve(bytes) {
            return Next::End(End::Shutdown, None);
        }
        // Until the server's budget has room, the payload stays unread in
        // the socket: that is the back-pressure on the client.
        let Some(grant) = self
            .budget
            .acquire(bytes, || self.state.lock().end.is_some())
        else {
            self.release(bytes);
            return Next::End(End::Shutdown, None);
        };
        if let Op::Write { len, .. } = op {
            if let Err(stall) = self.read_full(r, scratch.get(len as usize), true) {
                self.release(bytes);
                return Next::End(stall.end("write payload"), None);
            }
        }
        self.state.lock().running += 1;
        Next::Run {
            op,
            handle: req.handle,
            bytes,
            grant,
        }
    }

    /// Fills `buf` from the request stream, as `read_exact`, except that
    /// reads wake up every tick to check the timeouts: the stream ends once
    /// the connection has been idle for the idle timeout, or, in a
    /// `payload`, once no byte came for the stall timeout.
    fn read_full(
        &self,
        r: &mut BufReader<Socket>,
        buf: &mut [u8],
        payload: bool,
    ) -> Result<(), Stall> {
        let mut filled = 0;
        let mut last_byte = Instant::now();
        while filled < buf.len() {
            match r.read(&mut buf[filled..]) {
                Ok(0) => return Err(Stall::Io(std::io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => {
                    filled += n;
                    last_byte = Instant::now();
                    self.touch();
                }
                Err(e) => self.stalled(e, payload.then_some(last_byte))?,
            }
        }
        Ok(())
    }

    /// Reads and drops `n` bytes of the request stream without
    /// allocating them.
    fn discard(&self, r: &mut BufReader<Socket>, mut n: u64) -> Result<(), Stall> {
        let mut last_byte = Instant::now();
        while n > 0 {
            let available = match r.fill_buf() {
                Ok([]) => return Err(Stall::Io(std::io::ErrorKind::UnexpectedEof.into())),
                Ok(b) => b.len(),
                Err(e) => {
                    self.stalled(e, Some(last_byte))?;
                    continue;
                }
            };
            let taken = (available as u64).min(n);
            r.consume(taken as usize);
            n -= taken;
            last_byte = Instant::now();
            self.touch();
        }
        Ok(())
    }

    /// Decides whether a failed read ends the stream: `Ok` to read again.
    /// `payload`: when the last byte of the payload being read came.
    fn stalled(&self, e: std::io::Error, payload: Option<Instant>) -> Result<(), Stall> {
        match e.kind() {
            std::io::ErrorKind::Interrupted => Ok(()),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                if payload.is_some_and(|last| last.elapsed() >= self.stall) {
                    return Err(Stall::Stalled(self.stall));
                }
                match self.idle {
                    Some(idle) if self.is_idle(idle) => Err(Stall::Idle(idle)),
                    _ => Ok(()),
                }
            }
            _ => Err(Stall::Io(e)),
        }
    }

    /// Idle: nothing running, and nothing received or answered for `idle`.
    fn is_idle(&self, idle: Duration) -> bool {
        if self.state.lock().running > 0 {
            return false;
        }
        let now = self.started.elapsed().as_millis() as u64;
        let last = self.last_active.load(Ordering::Relaxed);
        now.saturating_sub(last) >= idle.as_millis() as u64
    }

    /// Notes activity, for the idle timeout.
    fn touch(&self) {
        if self.idle.is_some() {
            let now = self.started.elapsed().as_millis() as u64;
            self.last_active.store(now, Ordering::Relaxed);
        }
    }

    /// A request's reply has been sent.
    fn finished_request(&self) {
        self.state.lock().running -= 1;
        self.touch();
    }

    /// Waits until `bytes` more buffer bytes fit (one request always
    /// fits). False if the connection ended meanwhile.
    fn reserve(&self, bytes: u64) -> bool {
        let mut st = self.state.lock();
        while st.bytes > 0 && st.bytes + bytes > MAX_IN_FLIGHT_BYTES {
            if st.end.is_some() {
                return false;
            }
            self.space.wait(&mut st);
        }
        st.bytes += bytes;
        true
    }

    fn release(&self, bytes: u64) {
        if bytes > 0 {
            self.state.lock().bytes -= bytes;
            self.space.notify_all();
        }
    }

    /// Sends one reply. Small replies (write, flush, trim acknowledgements)
    /// are queued, and the thread that holds the socket writes every queued
    /// one in a single system call: on loopback each `writev` costs a trip
    /// through the TCP stack, and threads used to spin waiting for the
    /// socket while another wrote 16 bytes.
    fn send(&self, reply: &Reply) {
        if reply.len() <= BATCHED_REPLY {
            reply.append_to(&mut self.queued.lock());
        } else {
            let mut w = self.writer.lock();
            let sent = reply.write_to(&mut *w);
            drop(w);
            if let Err(e) = sent {
                self.write_failed(e);
                return;
            }
        }
        self.send_queued();
    }

    /// Writes queued replies while nobody else holds the socket.
    ///
    /// Every thread checks the queue again after releasing the socket, so a
    /// reply queued by a thread that found the socket taken is always
    /// written: by the holder, or by a later one.
    fn send_queued(&self) {
        loop {
            if self.queued.lock().is_empty() {
                return;
            }
            let Some(mut w) = self.writer.try_lock() else {
                return;
            };
            let batch = std::mem::take(&mut *self.queued.lock());
            let sent = w.write_all(&batch);
            drop(w);
            if let Err(e) = sent {
                self.write_failed(e);
                return;
            }
        }
    }

    fn write_failed(&self, e: std::io::Error) {
        tracing::debug!(peer = self.peer, "writing a reply failed: {e}");
        let why = match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                format!("it read no reply for {:?}", self.stall)
            }
            _ => e.to_string(),
        };
        self.stop(End::Gone(why));
        // Wake the leader: nobody will read the replies.
        self.shutdown_socket(Shutdown::Read);
    }

    /// Closes the connection after the last thread is done.
    fn finish(&self) {
        let (end, done) = {
            let mut st = self.state.lock();
            (st.end.clone(), st.done.take())
        };
        match &end {
            Some(End::Client) | None => tracing::debug!(peer = self.peer, "client disconnected"),
            Some(End::Shutdown) => tracing::debug!(peer = self.peer, "closed for shutdown"),
            Some(End::Gone(why)) => tracing::debug!(peer = self.peer, "client gone: {why}"),
            Some(End::Broken(why)) => tracing::info!(peer = self.peer, "dropping client: {why}"),
            Some(End::Idle(t)) => {
                tracing::info!(peer = self.peer, "closing a client idle for {t:?}")
            }
            Some(End::Stalled(t)) => tracing::info!(
                peer = self.peer,
                "dropping a client that sent no byte of its request for {t:?}"
            ),
        }
        self.shutdown_socket(Shutdown::Write);
        if matches!(end, Some(End::Broken(_))) {
            // Drain what the client still sends for a moment, so that the
            // kernel does not answer it with a reset that could destroy
            // replies it has not read yet.
            let mut r = self.lock_reader();
            let deadline = Instant::now() + LINGER;
            let mut sink = [0u8; 64 * 1024];
            r.get_ref()
                .set_read_timeout(Some(Duration::from_millis(100)));
            let buffered = r.buffer().len();
            r.consume(buffered);
            while Instant::now() < deadline {
                match r.get_mut().read(&mut sink) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        }
        if let Some(d) = done {
            let _ = d.send(());
        }
    }
}

impl Stall {
    /// How the connection ends when reading `what` stalled.
    fn end(self, what: &str) -> End {
        match self {
            Stall::Idle(t) => End::Idle(t),
            Stall::Stalled(t) => End::Stalled(t),
            Stall::Io(e) => End::Broken(format!("{what}: {e}")),
        }
    }
}

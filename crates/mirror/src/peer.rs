//! Links between mirrors over TCP: one reader and one writer thread per
//! link. The writer sends control frames and on-demand replies before any
//! prefetch reply, and takes the mirror's upload cap for chunk data.
//! A peer that breaks the protocol is disconnected; the mirror carries on.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::digest::Hash;
use crate::rate::TokenBucket;
use crate::wire::{self, Limits, Msg};

/// What a link needs from its mirror.
pub trait PeerHandler: Send + Sync + 'static {
    /// The peer holds these chunks (validated against the image).
    fn on_have(&self, link: &Arc<Link>, chunks: &[u32]);
    /// The peer announced it is fetching these chunks from the repository.
    fn on_coming(&self, _link: &Arc<Link>, _chunks: &[u32]) {}
    /// The peer wants chunk `c`: its data if this mirror serves it.
    fn serve(&self, c: u32) -> Option<Vec<u8>>;
    /// The link is gone; `malformed` if the peer broke the protocol.
    fn on_close(&self, link: &Arc<Link>, malformed: bool);
}

/// How a request to a peer ended without data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerMiss {
    /// No reply in time.
    Timeout,
    /// The peer does not hold it, or the link closed.
    Unavailable,
    /// The peer holds it but its upload queue is full.
    Busy,
}

/// Chunk replies queued for sending, across all links of one mirror, past
/// which requests are answered `BUSY`: a mirror that just got a chunk
/// first is not asked for it by every peer at once; they spread to the
/// peers that got it from that mirror.
pub const BUSY_QUEUE: usize = 8;

#[derive(Default)]
struct Outbox {
    high: VecDeque<Vec<u8>>,
    low: VecDeque<Vec<u8>>,
}

/// A reply to a request: data, not held, or busy.
enum Reply {
    Data(Vec<u8>),
    Missing,
    Busy,
}

type Waiter = mpsc::SyncSender<Reply>;

/// One link to a peer mirror.
pub struct Link {
    /// The peer's listening address, from its `HELLO`.
    pub remote: String,
    stream: TcpStream,
    limits: Limits,
    has: Mutex<Vec<u64>>,
    coming: Mutex<Vec<u64>>,
    out: Mutex<Outbox>,
    out_ready: Condvar,
    pending: Mutex<HashMap<u64, (u32, Waiter)>>,
    next_req: AtomicU64,
    queued: Arc<AtomicUsize>,
    closed: AtomicBool,
    suspect: AtomicBool,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Link({})", self.remote)
    }
}

/// What both ends must agree on.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Manifest digest.
    pub image_id: Hash,
    /// Chunk size and count.
    pub limits: Limits,
    /// This mirror's peer address.
    pub listen: String,
}

/// Exchanges `HELLO`s on `stream` and starts the link's threads.
pub fn start(
    stream: TcpStream,
    me: &Identity,
    handler: Arc<dyn PeerHandler>,
    upload: Option<Arc<TokenBucket>>,
    queued: Arc<AtomicUsize>,
) -> Result<Arc<Link>, String> {
    let hello = wire::encode(&Msg::Hello {
        image_id: me.image_id,
        chunk_size: me.limits.chunk_size,
        chunks: me.limits.chunks,
        listen: me.listen.clone(),
    });
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let setup = || -> std::io::Result<Vec<u8>> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        (&stream).write_all(&hello)?;
        let body = wire::read_frame(&mut &stream, 1 + 8 + 32 + 8 + 1 + wire::MAX_ADDR)?;
        stream.set_read_timeout(None)?;
        Ok(body)
    };
    let body = setup().map_err(|e| format!("handshake with {peer}: {e}"))?;
    let refuse = |why: String| {
        let _ = stream.shutdown(Shutdown::Both);
        Err(format!("peer {peer}: {why}"))
    };
    let remote = match wire::decode_hello(&body) {
        Ok(Msg::Hello {
            image_id,
            chunk_size,
            chunks,
            listen,
        }) => {
            if image_id != me.image_id
                || chunk_size != me.limits.chunk_size
                || chunks != me.limits.chunks
            {
                return refuse("mirrors a different image (manifest differs)".into());
            }
            if listen == me.listen {
                return refuse("is this mirror itself".into());
            }
            listen
        }
        Ok(_) => return refuse("sent no HELLO".into()),
        Err(e) => return refuse(e.to_string()),
    };
    let words = (me.limits.chunks as usize).div_ceil(64);
    let link = Arc::new(Link {
        remote,
        stream,
        limits: me.limits,
        has: Mutex::new(vec![0; words]),
        coming: Mutex::new(vec![0; words]),
        out: Mutex::new(Outbox::default()),
        out_ready: Condvar::new(),
        pending: Mutex::new(HashMap::new()),
        next_req: AtomicU64::new(1),
        queued,
        closed: AtomicBool::new(false),
        suspect: AtomicBool::new(false),
    });
    let writer = link.clone();
    let reader = link.clone();
    let h = handler.clone();
    std::thread::Builder::new()
        .name("mirror-peer-tx".into())
        .spawn(move || writer.write_loop(upload, h))
        .map_err(|e| format!("cannot start a peer thread: {e}"))?;
    std::thread::Builder::new()
        .name("mirror-peer-rx".into())
        .spawn(move || reader.read_loop(handler))
        .map_err(|e| format!("cannot start a peer thread: {e}"))?;
    Ok(link)
}

impl Link {
    /// Whether the peer advertised chunk `c`.
    pub fn holds(&self, c: u32) -> bool {
        self.has.lock()[c as usize / 64] & (1 << (c % 64)) != 0
    }

    /// Whether the peer said it is fetching chunk `c` from the repository.
    pub fn is_fetching(&self, c: u32) -> bool {
        self.coming.lock()[c as usize / 64] & (1 << (c % 64)) != 0
    }

    fn set_holds(&self, c: u32, on: bool) {
        set_bit(&self.has, c, on);
        set_bit(&self.coming, c, false);
    }

    /// Requests in flight: the link's load.
    pub fn load(&self) -> usize {
        self.pending.lock().len()
    }

    /// Whether the link still works and the peer never lied.
    pub fn usable(&self) -> bool {
        !self.closed.load(Ordering::Relaxed) && !self.suspect.load(Ordering::Relaxed)
    }

    /// Stops asking this peer for anything: it sent data that failed its digest.
    pub fn mark_suspect(&self) {
        self.suspect.store(true, Ordering::Relaxed);
    }

    /// Queues a frame; `high` frames go before every `low` one.
    fn send(&self, frame: Vec<u8>, high: bool) {
        let mut out = self.out.lock();
        if high {
            out.high.push_back(frame);
        } else {
            out.low.push_back(frame);
        }
        self.out_ready.notify_one();
    }

    /// Advertises chunks, in the given order.
    pub fn advertise(&self, chunks: &[u32]) {
        for part in chunks.chunks(wire::MAX_HAVE) {
            self.send(wire::encode(&Msg::Have(part.to_vec())), true);
        }
    }

    /// Tells the peer this mirror is fetching chunk `c` from the repository.
    pub fn announce_fetch(&self, c: u32) {
        self.send(wire::encode(&Msg::Coming(vec![c])), true);
    }

    /// Asks the peer for chunk `c` and waits up to `timeout` for its data
    /// (unchecked: the caller verifies it).
    pub fn request(&self, c: u32, demand: bool, timeout: Duration) -> Result<Vec<u8>, PeerMiss> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(PeerMiss::Unavailable);
        }
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::sync_channel(1);
        self.pending.lock().insert(req, (c, tx));
        self.send(
            wire::encode(&Msg::Want {
                req,
                chunk: c,
                demand,
            }),
            true,
        );
        let got = rx.recv_timeout(timeout);
        self.pending.lock().remove(&req);
        match got {
            Ok(Reply::Data(data)) => Ok(data),
            Ok(Reply::Busy) => Err(PeerMiss::Busy),
            Ok(Reply::Missing) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(PeerMiss::Unavailable)
            }
            Err(mpsc::RecvTimeoutError::Timeout) => Err(PeerMiss::Timeout),
        }
    }

    /// Whether the link has closed. It is marked closed before the
    /// handler's `on_close` runs.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Closes the link (both threads end).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        let _ = self.stream.shutdown(Shutdown::Both);
        self.out_ready.notify_all();
        // Dropping the waiters wakes every request with "unavailable".
        self.pending.lock().clear();
    }

    fn write_loop(
        self: Arc<Self>,
        upload: Option<Arc<TokenBucket>>,
        handler: Arc<dyn PeerHandler>,
    ) {
        loop {
            let frame = {
                let mut out = self.out.lock();
                loop {
                    if self.closed.load(Ordering::Relaxed) {
                        return;
                    }
                    if let Some(f) = out.high.pop_front().or_else(|| out.low.pop_front()) {
                        break f;
                    }
                    self.out_ready.wait(&mut out);
                }
            };
            if let (Some(b), Some(4)) = (&upload, frame.get(4)) {
                b.take(frame.len() as u64);
            }
            let is_data = frame.get(4) == Some(&4);
            let written = (&self.stream).write_all(&frame);
            if is_data {
                self.queued.fetch_sub(1, Ordering::Relaxed);
            }
            if written.is_err() {
                self.close();
                handler.on_close(&self, false);
                return;
            }
        }
    }

    fn read_loop(self: Arc<Self>, handler: Arc<dyn PeerHandler>) {
        let max = self.limits.max_frame();
        let malformed = loop {
            let body = match wire::read_frame(&mut &self.stream, max) {
                Ok(b) => b,
                Err(e) => break e.kind() == std::io::ErrorKind::InvalidData,
            };
            let msg = match wire::decode(&body, &self.limits) {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!("peer {}: {e}; disconnecting", self.remote);
                    break true;
                }
            };
            if !self.dispatch(msg, &handler) {
                tracing::warn!(
                    "peer {}: reply to a different chunk; disconnecting",
                    self.remote
                );
                break true;
            }
        };
        self.close();
        handler.on_close(&self, malformed);
    }

    /// Handles one message; `false` if the peer broke the protocol.
    fn dispatch(self: &Arc<Self>, msg: Msg, handler: &Arc<dyn PeerHandler>) -> bool {
        match msg {
            Msg::Have(list) => {
                for c in &list {
                    self.set_holds(*c, true);
                }
                handler.on_have(self, &list);
            }
            Msg::Coming(list) => {
                for &c in &list {
                    set_bit(&self.coming, c, true);
                }
                handler.on_coming(self, &list);
            }
            Msg::Want { req, chunk, demand } => {
                if self.queued.load(Ordering::Relaxed) >= BUSY_QUEUE {
                    self.send(wire::encode(&Msg::Busy { req, chunk }), true);
                    return true;
                }
                let reply = match handler.serve(chunk) {
                    Some(data) => {
                        self.queued.fetch_add(1, Ordering::Relaxed);
                        Msg::Data { req, chunk, data }
                    }
                    None => Msg::Missing { req, chunk },
                };
                self.send(wire::encode(&reply), demand);
            }
            Msg::Data { req, chunk, data } => return self.answer(req, chunk, Reply::Data(data)),
            Msg::Missing { req, chunk } => {
                self.set_holds(chunk, false);
                return self.answer(req, chunk, Reply::Missing);
            }
            Msg::Busy { req, chunk } => return self.answer(req, chunk, Reply::Busy),
            Msg::Hello { .. } => return false,
        }
        true
    }

    fn answer(&self, req: u64, chunk: u32, data: Reply) -> bool {
        match self.pending.lock().remove(&req) {
            Some((want, tx)) if want == chunk => {
                let _ = tx.try_send(data);
                true
            }
            Some(_) => false,
            // Late reply to a request that timed out: harmless.
            None => true,
        }
    }
}

fn set_bit(bits: &Mutex<Vec<u64>>, c: u32, on: bool) {
    let mut b = bits.lock();
    if on {
        b[c as usize / 64] |= 1 << (c % 64);
    } else {
        b[c as usize / 64] &= !(1 << (c % 64));
    }
}

//! [`Mirror`]: the local mirror of one remote image. It fetches chunks on
//! first reference (from the least-loaded peer that advertised them, else
//! from the repository), checks each against the manifest, advertises what
//! it holds, prefetches what peers advertise while the adaptive policy
//! allows (and along a recorded trace), keeps local writes local, and
//! implements [`BlockDevice`] so the NBD server can export it.

use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use strata_block::{BlockDevice, BlockStatus};
use strata_disk::error::Place;
use strata_disk::DiskError;

use crate::chunk::{Access, ChunkState, ChunkTable, PolicyConfig, PolicyCounters, PrefetchKind};
use crate::digest::{self, Manifest};
use crate::peer::{self, Identity, Link, PeerHandler, PeerMiss};
use crate::rate::TokenBucket;
use crate::repo::{Repository, TRACE_SUFFIX};
use crate::state::Store;
use crate::topology::{self, Rng};
use crate::wire::Limits;
use crate::{io_err, MirrorError, Result};

/// Magic of a stored trace.
const TRACE_MAGIC: &[u8; 8] = b"STRTRAC1";
/// Name of the trace in the mirror directory.
pub const TRACE_FILE: &str = "trace";
/// Most chunks fetched at once for one read request.
const PARALLEL_FETCHES: usize = 8;
/// Most repository reads in flight from one mirror.
const REPO_READS: usize = 16;
/// How long a mirror that is not first in line for a chunk waits for the
/// first one to announce its repository fetch before fetching it itself.
const REPO_DEFER: Duration = Duration::from_millis(50);
/// Chunks either side of a wanted one: a peer holding or fetching one of
/// them is reading the same region, so it may well fetch this one too.
const NEARBY: u32 = 8;

/// A counting semaphore: bounds this mirror's load on the repository.
#[derive(Default)]
struct Gate {
    used: Mutex<usize>,
    freed: Condvar,
}

impl Gate {
    fn acquire(&self, limit: usize) {
        let mut used = self.used.lock();
        while *used >= limit {
            self.freed.wait(&mut used);
        }
        *used += 1;
    }

    fn release(&self) {
        *self.used.lock() -= 1;
        self.freed.notify_one();
    }
}

/// How a mirror runs.
#[derive(Debug, Clone)]
pub struct MirrorConfig {
    /// Directory of the mirror file and state map.
    pub dir: PathBuf,
    /// Chunk size the manifest must have, if the user gave one.
    pub expect_chunk_size: Option<u32>,
    /// Prefetch policy.
    pub policy: PolicyConfig,
    /// Address to accept peer links on (`None`: peers off).
    pub listen: Option<String>,
    /// Candidate peers (static list).
    pub peers: Vec<String>,
    /// Also find peers through the repository's rendezvous list.
    pub rendezvous: bool,
    /// Peers to link to (random sample of the candidates).
    pub fanout: usize,
    /// How long an on-demand request waits for a peer before the repository.
    pub demand_timeout: Duration,
    /// How long a prefetch waits for a peer before the repository.
    pub prefetch_timeout: Duration,
    /// Prefetch threads.
    pub prefetch_threads: usize,
    /// Cap on bytes per second sent to peers.
    pub peer_rate: Option<u64>,
    /// Prefetch along the trace stored in the repository, if there is one.
    pub use_trace: bool,
    /// Store this mirror's first-read trace in the repository at shutdown.
    pub record_trace: bool,
    /// Fetch every remaining chunk in the background (for a complete base file).
    pub fill: bool,
}

impl MirrorConfig {
    /// Defaults for a mirror in `dir`: peers off, 32-KiB-chunk manifest
    /// expected from the repository as is, threshold 512.
    pub fn new(dir: PathBuf) -> Self {
        MirrorConfig {
            dir,
            expect_chunk_size: None,
            policy: PolicyConfig::default(),
            listen: None,
            peers: Vec::new(),
            rendezvous: false,
            fanout: 4,
            demand_timeout: Duration::from_secs(2),
            prefetch_timeout: Duration::from_secs(5),
            prefetch_threads: 2,
            peer_rate: None,
            use_trace: false,
            record_trace: false,
            fill: false,
        }
    }
}

/// Counters and state of a mirror.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct MirrorStats {
    /// Chunk size in bytes.
    pub chunk_size: u32,
    /// Chunks in the image.
    pub chunks: u32,
    /// Chunks found valid in the directory at start (not refetched).
    pub recovered: u64,
    /// Chunks fetched from the repository for reads or partial writes.
    pub repo_demand: u64,
    /// Chunks fetched from the repository by prefetch (trace, fill, or a
    /// peer prefetch that timed out).
    pub repo_prefetch: u64,
    /// Chunks fetched from peers for reads or partial writes.
    pub peer_demand: u64,
    /// Chunks fetched from peers by prefetch.
    pub peer_prefetch: u64,
    /// Chunks prefetched along the trace (from either source).
    pub trace_prefetch: u64,
    /// Peer requests that timed out (then retried elsewhere).
    pub peer_timeouts: u64,
    /// Peer requests answered "not held" or cut by a closed link.
    pub peer_unavailable: u64,
    /// Peer requests answered "busy" (asked again, or elsewhere).
    pub peer_busy: u64,
    /// Repository fetches held back for a peer first in line for the chunk.
    pub repo_deferred: u64,
    /// Chunks from peers that failed their digest (discarded; peer dropped).
    pub corrupt_from_peers: u64,
    /// Peer links closed because the peer broke the protocol.
    pub malformed_links: u64,
    /// Chunks served to peers.
    pub served: u64,
    /// Peer requests refused because the chunk was written here or is missing.
    pub refused: u64,
    /// Chunks not here.
    pub remote: u64,
    /// Prefetched chunks not read (yet).
    pub local_unread: u64,
    /// Chunks read here.
    pub read: u64,
    /// Chunks written here.
    pub written: u64,
    /// Bytes fetched (by prefetch) and never read.
    pub unread_bytes: u64,
    /// Live peer links.
    pub links: usize,
    /// Whether every chunk is here (the mirror file is a complete base).
    pub complete: bool,
    /// Adaptive prefetch state.
    pub policy: PolicyCounters,
    /// Seconds since start.
    pub uptime: f64,
}

#[derive(Default)]
struct Counters {
    recovered: AtomicU64,
    repo_demand: AtomicU64,
    repo_prefetch: AtomicU64,
    peer_demand: AtomicU64,
    peer_prefetch: AtomicU64,
    trace_prefetch: AtomicU64,
    peer_timeouts: AtomicU64,
    peer_unavailable: AtomicU64,
    peer_busy: AtomicU64,
    repo_deferred: AtomicU64,
    corrupt_from_peers: AtomicU64,
    malformed_links: AtomicU64,
    served: AtomicU64,
    refused: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Links, and the chunks held in acquisition order (for new links'
/// first advertisement), under one lock so no advertisement is missed.
/// Whoever needs both locks takes the chunk table's first.
#[derive(Default)]
struct Peers {
    links: Vec<Arc<Link>>,
    /// Links this mirror dialed, by the address it dialed (which may
    /// differ from the address the peer announces, e.g. behind NAT).
    dialed: Vec<(String, Arc<Link>)>,
    acquired: Vec<u32>,
}

struct Inner {
    config: MirrorConfig,
    manifest: Manifest,
    image_id: digest::Hash,
    repo: Box<dyn Repository>,
    store: Store,
    table: Mutex<ChunkTable>,
    changed: Condvar,
    peers: Mutex<Peers>,
    identity: Option<Identity>,
    upload: Option<Arc<TokenBucket>>,
    /// Chunk replies queued on all links (see [`peer::BUSY_QUEUE`]).
    queued_replies: Arc<std::sync::atomic::AtomicUsize>,
    counters: Counters,
    repo_gate: Gate,
    stopping: AtomicBool,
    started: Instant,
}

/// A running mirror. Cloning shares it.
#[derive(Clone)]
pub struct Mirror {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mirror({})", self.inner.repo.describe())
    }
}

/// Where fetched data came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Peer,
    Repo,
}

impl Mirror {
    /// Opens the mirror of the image in `repo`: reads its manifest,
    /// recovers the directory, and starts the peer and prefetch threads.
    /// Returns once peer links can be accepted (see [`Mirror::peer_addr`]).
    pub fn open(repo: Box<dyn Repository>, mut config: MirrorConfig) -> Result<Mirror> {
        let bytes = repo
            .get_sidecar(digest::SUFFIX, Manifest::max_encoded_len())?
            .ok_or_else(|| MirrorError::Repo {
                repo: repo.describe(),
                detail: format!(
                    "no chunk manifest ({}{}); make one with `strata mirror digest IMAGE`",
                    repo.describe(),
                    digest::SUFFIX
                ),
            })?;
        let manifest = Manifest::decode(&bytes, &format!("{}{}", repo.describe(), digest::SUFFIX))?;
        if let Some(cs) = config.expect_chunk_size {
            if cs != manifest.chunk_size {
                return Err(MirrorError::Config(format!(
                    "--chunk-size {cs} but the image's manifest uses {}-byte chunks; remake it with `strata mirror digest --chunk-size {cs}`",
                    manifest.chunk_size
                )));
            }
        }
        let (store, states) = Store::open(&config.dir, &manifest)?;
        let (states, recovered) = verify_recovered(&store, &manifest, states)?;
        let mut table = ChunkTable::new(states, config.policy);
        if config.use_trace {
            if let Some(t) = repo.get_sidecar(TRACE_SUFFIX, 48 + 4 * manifest.chunks() as u64)? {
                table.set_trace(decode_trace(&t, &manifest.id(), manifest.chunks())?);
            }
        }
        let image_id = manifest.id();
        let listener = match &config.listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .map_err(io_err(format!("cannot listen for peers on {addr}")))?,
            ),
            None => None,
        };
        let identity = match &listener {
            Some(l) => {
                let local = l.local_addr().map_err(io_err("peer listener address"))?;
                config.listen = Some(local.to_string());
                Some(Identity {
                    image_id,
                    limits: Limits {
                        chunks: manifest.chunks(),
                        chunk_size: manifest.chunk_size,
                    },
                    listen: local.to_string(),
                })
            }
            None => None,
        };
        let upload = config.peer_rate.map(|r| {
            Arc::new(TokenBucket::new(
                r,
                (r / 20).max(manifest.chunk_size as u64 * 2),
            ))
        });
        let acquired = (0..manifest.chunks())
            .filter(|c| table.state(*c).holds_image_data())
            .collect();
        let inner = Arc::new(Inner {
            manifest,
            image_id,
            repo,
            store,
            table: Mutex::new(table),
            changed: Condvar::new(),
            peers: Mutex::new(Peers {
                links: Vec::new(),
                dialed: Vec::new(),
                acquired,
            }),
            identity,
            upload,
            queued_replies: Arc::default(),
            counters: Counters::default(),
            repo_gate: Gate::default(),
            stopping: AtomicBool::new(false),
            started: Instant::now(),
            config,
        });
        inner.counters.recovered.store(recovered, Ordering::Relaxed);
        if let Some(l) = listener {
            let i = inner.clone();
            spawn("mirror-accept", move || i.accept_loop(l))?;
            let i = inner.clone();
            spawn("mirror-dial", move || i.dial_loop())?;
        }
        for _ in 0..inner.config.prefetch_threads {
            let i = inner.clone();
            spawn("mirror-prefetch", move || i.prefetch_loop())?;
        }
        Ok(Mirror { inner })
    }

    /// The address peers link to, if peers are on.
    pub fn peer_addr(&self) -> Option<String> {
        self.inner.identity.as_ref().map(|i| i.listen.clone())
    }

    /// The image's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.inner.manifest
    }

    /// The mirror file (a raw image; a complete base once `stats().complete`).
    pub fn image_path(&self) -> PathBuf {
        self.inner.store.image_path.clone()
    }

    /// Current counters.
    pub fn stats(&self) -> MirrorStats {
        self.inner.stats()
    }

    /// Stops the threads, syncs, and stores the first-read trace (in the
    /// directory, and in the repository if configured).
    pub fn shutdown(&self) -> Result<()> {
        let inner = &self.inner;
        inner.stopping.store(true, Ordering::SeqCst);
        inner.changed.notify_all();
        inner.peers.lock().dialed.clear();
        for l in std::mem::take(&mut inner.peers.lock().links) {
            l.close();
        }
        inner.store.sync()?;
        let trace = {
            let t = inner.table.lock();
            encode_trace(&inner.image_id, t.first_reads())
        };
        let path = inner.config.dir.join(TRACE_FILE);
        std::fs::write(&path, &trace)
            .map_err(io_err(format!("cannot write '{}'", path.display())))?;
        if inner.config.record_trace {
            inner.repo.put_sidecar(TRACE_SUFFIX, &trace)?;
        }
        Ok(())
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(|_| ())
        .map_err(io_err(format!("cannot start thread {name}")))
}

/// Checks every image chunk the state map lists as held; those that fail
/// are fetched again. Returns the states and how many chunks were kept.
fn verify_recovered(
    store: &Store,
    manifest: &Manifest,
    mut states: Vec<ChunkState>,
) -> Result<(Vec<ChunkState>, u64)> {
    let mut kept = 0;
    let mut buf = vec![0u8; manifest.chunk_size as usize];
    for (c, s) in states.iter_mut().enumerate() {
        if *s == ChunkState::Written {
            kept += 1;
        } else if s.holds_image_data() {
            let (off, len) = manifest.extent(c as u32);
            let ok = store.image.read_exact_at(&mut buf[..len], off).is_ok()
                && manifest.verify(c as u32, &buf[..len]);
            if ok {
                kept += 1;
            } else {
                *s = ChunkState::Remote;
                store.set(c as u32, ChunkState::Remote)?;
            }
        }
    }
    Ok((states, kept))
}

/// A mirror's rank for chunk `c` (lower goes first): FNV-1a of its
/// peer address and the chunk number, so every mirror computes the same
/// order without talking.
fn rank(addr: &str, c: u32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in addr.bytes().chain(c.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A trace as stored: magic, image id, count, chunk numbers.
pub fn encode_trace(image_id: &digest::Hash, order: &[u32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(44 + 4 * order.len());
    b.extend_from_slice(TRACE_MAGIC);
    b.extend_from_slice(image_id);
    b.extend_from_slice(&(order.len() as u32).to_be_bytes());
    for c in order {
        b.extend_from_slice(&c.to_be_bytes());
    }
    b
}

/// Parses a stored trace of the image `image_id` with `chunks` chunks.
pub fn decode_trace(b: &[u8], image_id: &digest::Hash, chunks: u32) -> Result<Vec<u32>> {
    let bad =
        |why: &str| MirrorError::Invalid(format!("the image's access trace is unusable: {why}"));
    if b.len() < 44 || &b[..8] != TRACE_MAGIC {
        return Err(bad("wrong magic or too short"));
    }
    if &b[8..40] != image_id {
        return Err(bad("it was recorded for another image"));
    }
    let n = u32::from_be_bytes(b[40..44].try_into().expect("4 bytes")) as usize;
    if n > chunks as usize || b.len() != 44 + 4 * n {
        return Err(bad("wrong length"));
    }
    Ok(b[44..]
        .chunks_exact(4)
        .map(|x| u32::from_be_bytes(x.try_into().expect("4 bytes")))
        .filter(|c| *c < chunks)
        .collect())
}

impl Inner {
    fn stats(&self) -> MirrorStats {
        let (policy, counts, complete) = {
            let t = self.table.lock();
            let mut counts = [0u64; 4];
            for s in t.states() {
                match s {
                    ChunkState::Local { .. } => counts[1] += 1,
                    ChunkState::Read => counts[2] += 1,
                    ChunkState::Written => counts[3] += 1,
                    _ => counts[0] += 1,
                }
            }
            (t.counters(), counts, t.complete())
        };
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MirrorStats {
            chunk_size: self.manifest.chunk_size,
            chunks: self.manifest.chunks(),
            recovered: get(&c.recovered),
            repo_demand: get(&c.repo_demand),
            repo_prefetch: get(&c.repo_prefetch),
            peer_demand: get(&c.peer_demand),
            peer_prefetch: get(&c.peer_prefetch),
            trace_prefetch: get(&c.trace_prefetch),
            peer_timeouts: get(&c.peer_timeouts),
            peer_unavailable: get(&c.peer_unavailable),
            peer_busy: get(&c.peer_busy),
            repo_deferred: get(&c.repo_deferred),
            corrupt_from_peers: get(&c.corrupt_from_peers),
            malformed_links: get(&c.malformed_links),
            served: get(&c.served),
            refused: get(&c.refused),
            remote: counts[0],
            local_unread: counts[1],
            read: counts[2],
            written: counts[3],
            unread_bytes: counts[1] * self.manifest.chunk_size as u64,
            links: self.peers.lock().links.len(),
            complete,
            policy,
            uptime: self.started.elapsed().as_secs_f64(),
        }
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    // ---- peers -------------------------------------------------------

    fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        let _ = listener.set_nonblocking(true);
        while !self.stopping() {
            match listener.accept() {
                Ok((stream, _)) => {
                    let _ = stream.set_nonblocking(false);
                    let me = self.clone();
                    // The handshake may stall: never in the accept loop.
                    let _ = spawn("mirror-hello", move || me.link_up(stream, None));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn link_up(self: Arc<Self>, stream: TcpStream, dialed: Option<String>) {
        let Some(me) = &self.identity else { return };
        let handler: Arc<dyn PeerHandler> = self.clone();
        match peer::start(
            stream,
            me,
            handler,
            self.upload.clone(),
            self.queued_replies.clone(),
        ) {
            Ok(link) => {
                // Lock order: table, then peers (as in `land`).
                let t = self.table.lock();
                let mut p = self.peers.lock();
                if self.stopping() {
                    link.close();
                    return;
                }
                // A peer that broke the protocol at once may have closed the
                // link already, and `on_close` (which takes the peers lock)
                // found nothing to remove: registering it now would leave a
                // dead link counted forever.
                if link.is_closed() {
                    return;
                }
                let held: Vec<u32> = p
                    .acquired
                    .iter()
                    .copied()
                    .filter(|c| t.state(*c).holds_image_data())
                    .collect();
                drop(t);
                tracing::info!("linked to peer {}", link.remote);
                link.advertise(&held);
                if let Some(addr) = dialed {
                    p.dialed.push((addr, link.clone()));
                }
                p.links.push(link);
            }
            Err(e) => tracing::info!("{e}"),
        }
    }

    fn dial_loop(self: Arc<Self>) {
        let Some(me) = self.identity.as_ref().map(|i| i.listen.clone()) else {
            return;
        };
        let mut rng = Rng::from_os();
        let mut rendezvous_done = false;
        let mut candidates = self.config.peers.clone();
        while !self.stopping() {
            if self.config.rendezvous && !rendezvous_done {
                match self.repo.rendezvous(&me) {
                    Ok(list) => {
                        for a in list {
                            if !candidates.contains(&a) {
                                candidates.push(a);
                            }
                        }
                    }
                    Err(e) => tracing::warn!("rendezvous failed: {e}"),
                }
                rendezvous_done = true;
            } else if self.config.rendezvous {
                // Later rounds only read the list (registering once is enough).
                if let Ok(list) = self.repo.rendezvous(&me) {
                    for a in list {
                        if !candidates.contains(&a) {
                            candidates.push(a);
                        }
                    }
                }
            }
            let (have, linked) = {
                let p = self.peers.lock();
                let mut have: Vec<String> = p.links.iter().map(|l| l.remote.clone()).collect();
                have.extend(p.dialed.iter().map(|(a, _)| a.clone()));
                (have, p.links.len())
            };
            let want = self.config.fanout.saturating_sub(linked);
            for addr in topology::sample(&candidates, &me, &have, want, &mut rng) {
                let Ok(sock) = addr.parse() else {
                    tracing::warn!("peer address '{addr}' is not IP:PORT; ignored");
                    continue;
                };
                if let Ok(stream) = TcpStream::connect_timeout(&sock, Duration::from_secs(1)) {
                    self.clone().link_up(stream, Some(addr));
                }
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The least-loaded usable links that advertised `c`, best first.
    fn holders(&self, c: u32) -> Vec<Arc<Link>> {
        let mut l: Vec<(usize, Arc<Link>)> = self
            .peers
            .lock()
            .links
            .iter()
            .filter(|l| l.usable() && l.holds(c))
            .map(|l| (l.load(), l.clone()))
            .collect();
        l.sort_by_key(|(load, _)| *load);
        l.into_iter().map(|(_, l)| l).take(2).collect()
    }

    // ---- fetching ----------------------------------------------------

    /// Fetches and checks chunk `c`: peers first (up to two), then the
    /// repository. A peer that advertises the chunk while this fetch
    /// waits for a repository slot is asked instead: mirrors reading the
    /// same region at once then share one repository read.
    fn fetch(&self, c: u32, demand: bool) -> Result<(Vec<u8>, Source)> {
        let timeout = if demand {
            self.config.demand_timeout
        } else {
            self.config.prefetch_timeout
        };
        let mut asked = 0;
        let mut waited = false;
        let mut deferred = false;
        let busy_until = Instant::now() + timeout;
        loop {
            let mut busy = false;
            for link in self.holders(c) {
                asked += 1;
                match link.request(c, demand, timeout) {
                    Ok(data) if self.manifest.verify(c, &data) => return Ok((data, Source::Peer)),
                    Ok(_) => {
                        tracing::warn!(
                            "peer {} sent chunk {c} that fails its digest; ignoring that peer",
                            link.remote
                        );
                        bump(&self.counters.corrupt_from_peers);
                        link.mark_suspect();
                    }
                    Err(PeerMiss::Timeout) => bump(&self.counters.peer_timeouts),
                    Err(PeerMiss::Unavailable) => bump(&self.counters.peer_unavailable),
                    Err(PeerMiss::Busy) => {
                        bump(&self.counters.peer_busy);
                        busy = true;
                    }
                }
            }
            if busy && Instant::now() < busy_until {
                // Holders are saturated: more will hold it soon.
                let mut t = self.table.lock();
                self.changed.wait_for(&mut t, Duration::from_millis(20));
                continue;
            }
            if !waited && self.wait_for_coming(c, timeout) {
                waited = true;
                continue;
            }
            if !deferred {
                deferred = true;
                if self.defer_to_peers(c) {
                    continue;
                }
            }
            self.repo_gate.acquire(REPO_READS);
            if asked == 0 && !self.holders(c).is_empty() {
                self.repo_gate.release();
                continue;
            }
            for l in self.peers.lock().links.iter() {
                l.announce_fetch(c);
            }
            let data = self.read_repo_gated(c);
            self.repo_gate.release();
            return Ok((data?, Source::Repo));
        }
    }

    /// Mirrors reading the same region at once would each fetch a chunk
    /// nobody holds yet from the repository. So a mirror goes first only
    /// if it ranks first for the chunk among itself and its peers (a hash
    /// of chunk and address); otherwise, when a peer reads nearby, it
    /// waits up to [`REPO_DEFER`] for an announcement or an advertisement.
    /// Returns `true` if it waited.
    fn defer_to_peers(&self, c: u32) -> bool {
        let Some(me) = self.identity.as_ref().map(|i| i.listen.as_str()) else {
            return false;
        };
        let mine = rank(me, c);
        let lo = c.saturating_sub(NEARBY);
        let hi = c
            .saturating_add(NEARBY)
            .min(self.manifest.chunks().saturating_sub(1));
        let (outranked, nearby) = {
            let p = self.peers.lock();
            let usable = || p.links.iter().filter(|l| l.usable());
            let outranked = usable().any(|l| (rank(&l.remote, c), l.remote.as_str()) < (mine, me));
            let nearby =
                usable().any(|l| (lo..=hi).any(|n| n != c && (l.holds(n) || l.is_fetching(n))));
            (outranked, nearby)
        };
        if !outranked || !nearby {
            return false;
        }
        let arrived = |i: &Self| {
            let p = i.peers.lock();
            p.links
                .iter()
                .any(|l| l.usable() && (l.holds(c) || l.is_fetching(c)))
        };
        let deadline = Instant::now() + REPO_DEFER;
        let mut t = self.table.lock();
        while !arrived(self) && !self.stopping() {
            if self.changed.wait_until(&mut t, deadline).timed_out() {
                break;
            }
        }
        bump(&self.counters.repo_deferred);
        true
    }

    /// If a peer announced it is fetching `c` from the repository, waits
    /// (up to `timeout`) for its advertisement; `true` if it waited.
    fn wait_for_coming(&self, c: u32, timeout: Duration) -> bool {
        let coming = |i: &Self| {
            let p = i.peers.lock();
            let fetching = p.links.iter().any(|l| l.usable() && l.is_fetching(c));
            let held = p.links.iter().any(|l| l.usable() && l.holds(c));
            fetching && !held
        };
        let mut t = self.table.lock();
        if !coming(self) {
            return false;
        }
        let deadline = Instant::now() + timeout;
        while coming(self) && !self.stopping() {
            if self.changed.wait_until(&mut t, deadline).timed_out() {
                break;
            }
        }
        true
    }

    /// Reads and checks chunk `c` from the repository, waiting for a slot.
    fn read_repo(&self, c: u32) -> Result<Vec<u8>> {
        self.repo_gate.acquire(REPO_READS);
        let data = self.read_repo_gated(c);
        self.repo_gate.release();
        data
    }

    /// Reads and checks chunk `c` from the repository (slot held).
    fn read_repo_gated(&self, c: u32) -> Result<Vec<u8>> {
        let (off, len) = self.manifest.extent(c);
        let mut data = vec![0u8; len];
        self.repo.read(off, &mut data)?;
        if !self.manifest.verify(c, &data) {
            return Err(MirrorError::Repo {
                repo: self.repo.describe(),
                detail: format!(
                    "chunk {c} (offset {off}) does not match the manifest: the image changed since `strata mirror digest`"
                ),
            });
        }
        Ok(data)
    }

    /// Stores fetched data if the chunk still wants it; wakes waiters.
    fn land(&self, c: u32, data: &[u8]) -> Result<()> {
        let mut t = self.table.lock();
        if t.may_land(c) {
            let (off, _) = self.manifest.extent(c);
            self.store
                .image
                .write_all_at(data, off)
                .map_err(io_err(format!(
                    "cannot write '{}'",
                    self.store.image_path.display()
                )))?;
            let new = t.landed(c);
            self.store.set(c, new)?;
            if new.holds_image_data() {
                let mut p = self.peers.lock();
                p.acquired.push(c);
                for l in &p.links {
                    l.advertise(&[c]);
                }
            }
        }
        drop(t);
        self.changed.notify_all();
        Ok(())
    }

    /// Runs an on-demand fetch this thread owns.
    fn fetch_owned(&self, c: u32) -> Result<()> {
        match self.fetch(c, true) {
            Ok((data, source)) => {
                match source {
                    Source::Peer => {
                        bump(&self.counters.peer_demand);
                        self.table.lock().demand_from_peer(c);
                    }
                    Source::Repo => bump(&self.counters.repo_demand),
                }
                self.land(c, &data)
            }
            Err(e) => {
                self.table.lock().fetch_failed(c);
                self.changed.notify_all();
                Err(e)
            }
        }
    }

    /// Waits for someone else's fetch of `c`; past the demand timeout,
    /// takes it over from the repository.
    fn wait_for(&self, c: u32) -> Result<()> {
        let deadline = Instant::now() + self.config.demand_timeout + self.config.prefetch_timeout;
        let mut t = self.table.lock();
        loop {
            match t.state(c) {
                ChunkState::Fetching | ChunkState::Prefetch { .. } => {}
                _ => return Ok(()),
            }
            if self.changed.wait_until(&mut t, deadline).timed_out() {
                drop(t);
                let data = self.read_repo(c)?;
                bump(&self.counters.repo_demand);
                return self.land(c, &data);
            }
        }
    }

    /// Makes chunks `first..=last` readable.
    fn ensure_read(&self, first: u32, last: u32) -> Result<()> {
        let mut owned = Vec::new();
        let mut waits = Vec::new();
        {
            let mut t = self.table.lock();
            for c in first..=last {
                match t.begin_read(c) {
                    Access::Ready => {}
                    Access::Fetch => owned.push(c),
                    Access::Wait => waits.push(c),
                }
            }
        }
        if !owned.is_empty() {
            self.changed.notify_all();
        }
        // A random order: mirrors reading the same request at once fetch
        // different chunks from the repository first, then trade them.
        let mut rng =
            Rng::new(Instant::now().duration_since(self.started).as_nanos() as u64 ^ first as u64);
        for i in (1..owned.len()).rev() {
            owned.swap(i, rng.below(i + 1));
        }
        let result = std::thread::scope(|s| {
            let mut results = Vec::new();
            for group in owned.chunks(owned.len().div_ceil(PARALLEL_FETCHES).max(1)) {
                results.push(s.spawn(move || group.iter().try_for_each(|c| self.fetch_owned(*c))));
            }
            results
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(MirrorError::Invalid("fetch thread panicked".into()))
                    })
                })
                .collect::<Result<Vec<()>>>()
        });
        result?;
        for c in waits {
            self.wait_for(c)?;
            // The other fetch may have failed: ask again.
            self.ensure_read(c, c)?;
        }
        Ok(())
    }

    /// Makes chunk `c` writable (`whole`: the write covers it all).
    fn ensure_write(&self, c: u32, whole: bool) -> Result<()> {
        loop {
            let access = self.table.lock().begin_write(c, whole);
            match access {
                Access::Ready => return Ok(()),
                Access::Fetch => self.fetch_owned(c)?,
                Access::Wait => self.wait_for(c)?,
            }
        }
    }

    // ---- prefetch ----------------------------------------------------

    fn next_job(&self) -> Option<(u32, Option<PrefetchKind>)> {
        let mut t = self.table.lock();
        loop {
            if self.stopping() {
                return None;
            }
            if let Some((c, k)) = t.next_prefetch() {
                return Some((c, Some(k)));
            }
            if self.config.fill {
                if let Some(c) = (0..t.len()).find(|c| t.state(*c) == ChunkState::Remote) {
                    // Claimed as a trace-like prefetch: not counted as unmatched.
                    t.claim_fill(c);
                    return Some((c, None));
                }
            }
            self.changed.wait_for(&mut t, Duration::from_millis(200));
        }
    }

    fn prefetch_loop(self: Arc<Self>) {
        while let Some((c, kind)) = self.next_job() {
            match self.fetch(c, false) {
                Ok((data, source)) => {
                    match source {
                        Source::Peer => bump(&self.counters.peer_prefetch),
                        Source::Repo => bump(&self.counters.repo_prefetch),
                    }
                    if kind == Some(PrefetchKind::Trace) {
                        bump(&self.counters.trace_prefetch);
                    }
                    if let Err(e) = self.land(c, &data) {
                        tracing::warn!("prefetch of chunk {c}: {e}");
                    }
                }
                Err(e) => {
                    tracing::warn!("prefetch of chunk {c} failed: {e}");
                    self.table.lock().prefetch_failed(c);
                    self.changed.notify_all();
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    fn to_disk_error(&self, e: MirrorError) -> DiskError {
        DiskError::Io {
            place: Place {
                depth: 0,
                path: self.store.image_path.clone(),
            },
            op: "mirror fetch",
            error: std::io::Error::other(e.to_string()),
        }
    }
}

impl PeerHandler for Inner {
    fn on_coming(&self, _link: &Arc<Link>, _chunks: &[u32]) {
        // Wakes fetches deferring to the announcing peer.
        let _t = self.table.lock();
        self.changed.notify_all();
    }

    fn on_have(&self, _link: &Arc<Link>, chunks: &[u32]) {
        let mut t = self.table.lock();
        for c in chunks {
            t.on_advert(*c);
        }
        drop(t);
        self.changed.notify_all();
    }

    fn serve(&self, c: u32) -> Option<Vec<u8>> {
        let held = self.table.lock().state(c).holds_image_data();
        let (off, len) = self.manifest.extent(c);
        let mut data = vec![0u8; len];
        // Checked again after reading: a write may have landed meanwhile,
        // and written data is never served.
        let ok = held
            && self.store.image.read_exact_at(&mut data, off).is_ok()
            && self.table.lock().state(c).holds_image_data();
        if ok {
            bump(&self.counters.served);
            Some(data)
        } else {
            bump(&self.counters.refused);
            None
        }
    }

    fn on_close(&self, link: &Arc<Link>, malformed: bool) {
        if malformed {
            bump(&self.counters.malformed_links);
        }
        tracing::info!("link to peer {} closed", link.remote);
        let mut p = self.peers.lock();
        p.links.retain(|l| !Arc::ptr_eq(l, link));
        p.dialed.retain(|(_, l)| !Arc::ptr_eq(l, link));
    }
}

impl BlockDevice for Mirror {
    fn size(&self) -> u64 {
        self.inner.manifest.image_size
    }

    /// Reads may wait on peers or the repository: run many at once so a
    /// client's queue depth becomes parallel chunk fetches.
    fn parallel_requests(&self) -> usize {
        64
    }

    fn is_writable(&self) -> bool {
        true
    }

    fn unit_size(&self) -> u64 {
        self.inner.manifest.chunk_size as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> strata_block::Result<()> {
        let Some((first, last)) = self.chunk_span(offset, buf.len() as u64)? else {
            return Ok(());
        };
        let i = &self.inner;
        i.ensure_read(first, last).map_err(|e| i.to_disk_error(e))?;
        i.store
            .image
            .read_exact_at(buf, offset)
            .map_err(|e| DiskError::Io {
                place: Place {
                    depth: 0,
                    path: i.store.image_path.clone(),
                },
                op: "read",
                error: e,
            })?;
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> strata_block::Result<()> {
        let Some((first, last)) = self.chunk_span(offset, buf.len() as u64)? else {
            return Ok(());
        };
        let i = &self.inner;
        let end = offset + buf.len() as u64;
        for c in first..=last {
            let (start, len) = i.manifest.extent(c);
            let whole = offset <= start && end >= start + len as u64;
            i.ensure_write(c, whole).map_err(|e| i.to_disk_error(e))?;
        }
        let io = |op, e| DiskError::Io {
            place: Place {
                depth: 0,
                path: i.store.image_path.clone(),
            },
            op,
            error: e,
        };
        i.store
            .image
            .write_all_at(buf, offset)
            .map_err(|e| io("write", e))?;
        for c in first..=last {
            i.store
                .set(c, ChunkState::Written)
                .map_err(|e| i.to_disk_error(e))?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> strata_block::Result<()> {
        let zeros = vec![0u8; (1 << 20).min(len as usize)];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.write_at(&zeros[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> strata_block::Result<()> {
        self.write_zeroes(offset, len)
    }

    fn flush(&self) -> strata_block::Result<()> {
        self.inner
            .store
            .sync()
            .map_err(|e| self.inner.to_disk_error(e))?;
        Ok(())
    }

    fn reads_as_zero(&self, offset: u64, len: u64) -> strata_block::Result<bool> {
        // No allocation map to ask: "not known to be zero", within range.
        self.chunk_span(offset, len)?;
        Ok(false)
    }

    fn block_status(
        &self,
        offset: u64,
        len: u64,
        _max_runs: usize,
    ) -> strata_block::Result<Vec<BlockStatus>> {
        self.chunk_span(offset, len)?;
        Ok(vec![BlockStatus {
            length: len,
            hole: false,
            zero: false,
        }])
    }
}

impl Mirror {
    /// First and last chunk of a request, checked against the size.
    fn chunk_span(&self, offset: u64, len: u64) -> strata_disk::Result<Option<(u32, u32)>> {
        let size = self.size();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(DiskError::OutOfRange { offset, len, size });
        }
        if len == 0 {
            return Ok(None);
        }
        let cs = self.inner.manifest.chunk_size as u64;
        Ok(Some((
            (offset / cs) as u32,
            ((offset + len - 1) / cs) as u32,
        )))
    }
}

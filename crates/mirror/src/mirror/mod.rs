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

mod device;
mod fetch;
mod peers;
mod prefetch;
mod trace;

use fetch::Gate;
pub use trace::{decode_trace, encode_trace, TRACE_FILE};

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
}

//! The storage node's I/O shell: one file per replica, named by its
//! address, with a header holding the size and CRC-32C of the data
//! ([`crate::storage::file`]). What to do is decided by the core
//! ([`crate::storage::core::StorageCore`], one Put by its
//! [`PutMachine`]); this executes it on real files and sockets. A Put is
//! written to a temporary file while it is forwarded to the next replica,
//! checked against the sender's checksum, fsynced and renamed into place
//! before it is acknowledged, so a replica is either whole or absent.
//! A Get sends the data with its stored checksum, which the client checks
//! end to end ([`crate::storage::reader`]).

use crate::runtime::SharedTable;
use crate::storage::core::{AfterRefusal, Refusal, StorageCore};
use crate::storage::file::{file_name, parse_name, CHECKSUM_OFFSET};
use crate::storage::group_sync::GroupSync;
pub use crate::storage::limits::{DataLimits, DATA_MAX_CONNECTIONS, DATA_READ_TIMEOUT};
use crate::storage::object_cache::{ObjectCache, DEFAULT_OBJECT_CACHE};
use crate::storage::put::{PutAction, PutEvent, PutMachine, PutPhase, PutReply};
use crate::storage::range::{get_range, read_route};
use crate::storage::reader::{get, reply_err, ReadStats, ReplicaDir, CHUNK};
use crate::storage::scheduled::ScheduledSender;
use crate::storage::scrub::{ScrubProgress, ScrubStats};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use strata_store_client::stream::{read_request, read_status, write_error};
use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::auth::ClusterKey;
use strata_store_protocol::data::{Authority, Credential, Request};
use strata_store_protocol::wire::{Body, Msg};
use strata_store_protocol::Error;
use tokio::fs::File;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};

/// A storage node's replica directory and its core.
pub struct SnStore {
    dir: PathBuf,
    on: std::net::SocketAddr,
    /// The node's decisions and counters.
    core: Mutex<StorageCore>,
    tmp_seq: AtomicU64,
    /// The cluster key: seals the node's requests to metadata nodes and
    /// the orchestrator (none in tests that run no cluster).
    key: Option<strata_store_protocol::auth::ClusterKey>,
    /// Limits of the data port.
    limits: DataLimits,
    /// Data connections open now.
    connections: std::sync::atomic::AtomicUsize,
    /// RS3's sender, when the node has one ([`SnStore::with_schedule`]).
    schedule: Option<ScheduledSender>,
    /// The scrub's counters ([`crate::storage::scrub`]).
    scrub: ScrubProgress,
    /// Syncs of `replicas/`, shared by the Puts installed meanwhile.
    replicas_sync: GroupSync,
    /// `replicas/`, held open for the Gets' lookups.
    replicas: ReplicaDir,
    /// Whole erasure-coded objects whose fragment 0 this node holds
    /// ([`crate::storage::object_cache`]).
    object_cache: ObjectCache,
    /// What the node's reads sent (shown on `/metrics`).
    pub(crate) reads: ReadStats,
}

impl SnStore {
    /// Opens the replica directory (creating it), removes temporary files
    /// left by an interrupted Put, and counts what it holds.
    /// `on` is the orchestrator, asked for the table when a forward target
    /// is not in ours yet.
    pub fn open(
        dir: &Path,
        index: u16,
        on: std::net::SocketAddr,
        capacity: u64,
    ) -> Result<SnStore, Error> {
        let objects_dir = dir.join("replicas");
        let tmp = dir.join("tmp");
        for d in [&objects_dir, &tmp] {
            std::fs::create_dir_all(d)
                .map_err(|e| Error::io(format!("creating {}", d.display()), e))?;
        }
        // Temporary files are Puts that were never acknowledged.
        if let Ok(entries) = std::fs::read_dir(&tmp) {
            for e in entries.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let replicas = ReplicaDir {
            handle: std::fs::File::open(&objects_dir)
                .map_err(|e| Error::io(format!("opening {}", objects_dir.display()), e))?,
            path: objects_dir.clone(),
        };
        let (mut used, mut objects) = (0, 0);
        let entries = std::fs::read_dir(&objects_dir)
            .map_err(|e| Error::io(format!("reading {}", objects_dir.display()), e))?;
        for e in entries.flatten() {
            if let Ok(m) = e.metadata() {
                used += m.len();
                objects += 1;
            }
        }
        Ok(SnStore {
            dir: dir.to_path_buf(),
            on,
            core: Mutex::new(StorageCore::new(index, capacity, used, objects)),
            tmp_seq: AtomicU64::new(0),
            key: None,
            limits: DataLimits::default(),
            connections: std::sync::atomic::AtomicUsize::new(0),
            schedule: None,
            scrub: ScrubProgress::default(),
            replicas_sync: GroupSync::directory(objects_dir),
            replicas,
            object_cache: ObjectCache::new(DEFAULT_OBJECT_CACHE),
            reads: ReadStats::default(),
        })
    }

    /// The whole-object cache.
    pub fn object_cache(&self) -> &ObjectCache {
        &self.object_cache
    }

    /// The store, with the data port's `limits`.
    pub fn with_limits(mut self, limits: DataLimits) -> SnStore {
        self.limits = limits;
        self.object_cache = ObjectCache::new(limits.object_cache);
        self
    }

    /// The store, with RS3's `sender`: Gets go through it while its
    /// settings have scheduling on.
    pub fn with_schedule(mut self, sender: ScheduledSender) -> SnStore {
        self.schedule = Some(sender);
        self
    }

    /// RS3's sender, if the node has one.
    pub fn schedule(&self) -> Option<&ScheduledSender> {
        self.schedule.as_ref()
    }

    /// Data connections open now.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// The store, sealing its requests with the cluster's `key`.
    pub fn with_key(mut self, key: strata_store_protocol::auth::ClusterKey) -> SnStore {
        self.key = Some(key);
        self
    }

    /// What the background scrub has done so far: passes, replicas and
    /// bytes re-read, damaged replicas found and reported
    /// ([`crate::storage::scrub`]).
    pub fn scrub_stats(&self) -> ScrubStats {
        self.scrub.stats()
    }

    /// The scrub's counters, for its task; with the node's directory and
    /// the key it seals reports with.
    pub(super) fn scrub_parts(&self) -> (PathBuf, ScrubProgress, Option<ClusterKey>) {
        (self.dir.clone(), self.scrub.clone(), self.key.clone())
    }

    /// The core, locked for one decision (never across an await).
    fn core(&self) -> MutexGuard<'_, StorageCore> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes still free: the configured capacity minus what is stored,
    /// and never more than the file system has.
    pub fn free(&self) -> u64 {
        let disk_free = fs_free(&self.dir).unwrap_or(u64::MAX);
        self.core().free(disk_free)
    }

    /// Replicas held.
    pub fn objects(&self) -> u64 {
        self.core().objects()
    }

    /// Configured capacity.
    pub fn capacity(&self) -> u64 {
        self.core().capacity()
    }

    /// Whether the node has been retired (see [`SnStore::retire`]).
    pub fn is_retired(&self) -> bool {
        self.core().is_retired()
    }

    /// Retirement: the orchestrator marked this node retired after its
    /// drain, so no record names any replica it holds. Refuses Puts from
    /// now on and frees every replica; returns how many were freed.
    /// Gets are still answered (a client holding a record read before
    /// the drain ended is told the replica is gone, and tries the next).
    pub fn retire(&self) -> usize {
        self.core().retire();
        let Ok(entries) = std::fs::read_dir(self.dir.join("replicas")) else {
            return 0;
        };
        let addrs: Vec<Addr> = entries
            .flatten()
            .filter_map(|e| u128::from_str_radix(e.file_name().to_str()?, 16).ok())
            .collect();
        addrs
            .into_iter()
            .filter(|&a| self.remove_replica(a))
            .count()
    }

    pub(crate) fn path(&self, addr: Addr) -> PathBuf {
        self.replicas.path.join(file_name(addr))
    }

    /// The replica address a connection was made to (`getsockname`), if
    /// it lies in this node's prefix: in routed mode the address itself
    /// says which replica is wanted.
    fn addressed(&self, table: &SharedTable, stream: &TcpStream) -> Option<Addr> {
        let std::net::IpAddr::V6(ip) = stream.local_addr().ok()?.ip() else {
            return None;
        };
        let addr = u128::from(ip);
        let layout = crate::runtime::read_table(table).layout;
        (layout.sn_of(addr) == Some(self.core().index())).then_some(addr)
    }

    /// Replica files with their age in ms, from their names and
    /// modification times (a file dated in the future is left out).
    fn replica_ages(&self) -> Vec<(Addr, u64)> {
        let Ok(entries) = std::fs::read_dir(self.dir.join("replicas")) else {
            return Vec::new();
        };
        let now = std::time::SystemTime::now();
        entries
            .flatten()
            .filter_map(|e| {
                let modified = e.metadata().and_then(|m| m.modified()).ok()?;
                let age = now.duration_since(modified).ok()?;
                let addr = parse_name(e.file_name().to_str()?)?;
                Some((addr, age.as_millis().min(u64::MAX as u128) as u64))
            })
            .collect()
    }

    /// Removes one replica file and counts it out.
    fn remove_replica(&self, addr: Addr) -> bool {
        let path = self.path(addr);
        let Ok(m) = std::fs::metadata(&path) else {
            return false;
        };
        if std::fs::remove_file(&path).is_err() {
            return false;
        }
        self.core().removed(m.len());
        true
    }
}

fn fs_free(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct we own.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return None;
    }
    Some(s.f_bavail as u64 * s.f_frsize as u64)
}

/// Serves data frames on `listener` until the task is dropped, at most
/// [`DataLimits::max_connections`] connections at once.
pub async fn serve(listener: TcpListener, store: Arc<SnStore>, table: SharedTable) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let Some(slot) = ConnectionSlot::take(&store) else {
            tracing::warn!(
                "refused a data connection from {peer}: {} are open, the limit",
                store.limits.max_connections
            );
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let table = table.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(stream, &slot.0, &table).await {
                tracing::debug!("storage node connection ended: {}", e.report());
            }
        });
    }
}

/// One of the data port's connections, given back when dropped.
struct ConnectionSlot(Arc<SnStore>);

impl ConnectionSlot {
    fn take(store: &Arc<SnStore>) -> Option<ConnectionSlot> {
        let limit = store.limits.max_connections;
        store
            .connections
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()?;
        Some(ConnectionSlot(store.clone()))
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn connection(stream: TcpStream, store: &SnStore, table: &SharedTable) -> Result<(), Error> {
    let addressed = store.addressed(table, &stream);
    let (r, w) = stream.into_split();
    let mut r = BufReader::with_capacity(CHUNK, r);
    let mut writer = Some(BufWriter::with_capacity(CHUNK, w));
    let limit = store.limits.read_timeout;
    loop {
        // Back from the last Get, which lent it to the body's sender.
        let Some(w) = writer.as_mut() else {
            return Err(Error::Task {
                context: "a data connection lost its writer".into(),
                source: None,
            });
        };
        // A peer that sends a partial header (or nothing) is not waited
        // for past the limit: it would hold the connection forever.
        let Ok(read) = tokio::time::timeout(limit, read_request(&mut r)).await else {
            return Err(Error::Timeout(format!(
                "no whole data request within {} ms; connection closed",
                limit.as_millis()
            )));
        };
        let incoming = match read {
            Ok(Some(req)) => req,
            Ok(None) => return Ok(()),
            Err(e) => {
                // Tell the peer why, then close: the stream is out of sync.
                let _ = write_error(w, &e.report().to_string()).await;
                return Err(e);
            }
        };
        // Nothing is read, stored, served or freed before this check.
        let authority =
            match incoming.authorize(store.key.as_ref(), strata_store_protocol::auth::unix_ms()) {
                Ok(a) => a,
                Err(msg) => {
                    tracing::info!("refused a data request: {msg}");
                    reply_err(w, &msg).await?;
                    // A refused Put's data would follow, and a peer without
                    // credentials gets nothing more from this connection.
                    return Ok(());
                }
            };
        let req = incoming.req;
        let layout = crate::runtime::read_table(table).layout;
        let checked = store.core().check_request(&layout, &req, addressed);
        if let Err(refusal) = checked {
            match refused(&mut r, w, refusal).await? {
                AfterRefusal::Close => return Ok(()),
                _ => continue,
            }
        }
        match req {
            Request::Put { addr, size, chain } => {
                let coordinator = match authority {
                    Authority::Tenant { coordinator, .. } => Some(coordinator),
                    Authority::Node => None,
                };
                put(&mut r, w, store, table, addr, size, chain, coordinator).await?
            }
            Request::Get { addr } => {
                let route = read_route(store.schedule.as_ref(), &authority);
                if let Some(lent) = writer.take() {
                    let dir = &store.replicas;
                    writer = Some(get(lent, dir, addr, limit, route, &store.reads).await?);
                }
            }
            Request::GetRange {
                addr,
                offset,
                length,
            } => {
                let route = read_route(store.schedule.as_ref(), &authority);
                if let Some(lent) = writer.take() {
                    let (dir, asked) = (&store.replicas, (addr, offset, length));
                    let served = get_range(lent, dir, asked, limit, route, &store.reads);
                    writer = Some(served.await?);
                }
            }
            Request::Schedule { settings, .. } => {
                let answer = match store.schedule.as_ref() {
                    Some(sender) => sender.apply_settings(&settings, |config| {
                        crate::storage::schedule_file::save(&store.dir, config).map_err(|e| {
                            format!(
                                "keeping the RS3 settings in {}: {e}; nothing changed",
                                store.dir.display()
                            )
                        })
                    }),
                    None => Err("this storage node runs no RS3 sender".to_string()),
                };
                match answer {
                    Ok(text) => {
                        let io = |e| Error::io("replying", e);
                        w.write_all(&[0]).await.map_err(io)?;
                        w.write_all(&(text.len() as u32).to_be_bytes())
                            .await
                            .map_err(io)?;
                        w.write_all(text.as_bytes()).await.map_err(io)?;
                        w.flush().await.map_err(io)?;
                    }
                    Err(why) => reply_err(w, &why).await?,
                }
            }
            Request::GetObject { addr, object } => {
                let (cache, key) = (&store.object_cache, store.key.as_ref());
                let held = store.path(addr);
                let asked = (addr, object, held.as_path());
                crate::storage::whole::get_object(w, cache, key, table, asked).await?
            }
            Request::Free { addr } => {
                let path = store.path(addr);
                if let Ok(m) = tokio::fs::metadata(&path).await {
                    if tokio::fs::remove_file(&path).await.is_ok() {
                        store.core().removed(m.len());
                    }
                }
                // An entry of the object cache goes with its fragment 0,
                // once the fragment is gone: a gathering for a miss that
                // began before then is refused its entry, one after finds
                // no fragment 0 (see the object cache's module).
                store.object_cache.remove(addr);
                w.write_all(&[0])
                    .await
                    .map_err(|e| Error::io("replying", e))?;
                w.flush().await.map_err(|e| Error::io("replying", e))?;
            }
        }
    }
}

/// Sends a refusal, first reading and dropping what the core says to
/// drain (a refused Put's data) so the reply is in step; returns what the
/// connection does next.
async fn refused<R, W>(r: &mut R, w: &mut W, refusal: Refusal) -> Result<AfterRefusal, Error>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    if let AfterRefusal::Drain(bytes) = refusal.after {
        tokio::io::copy(&mut r.take(bytes), &mut tokio::io::sink())
            .await
            .map_err(|e| Error::io("draining a refused Put", e))?;
    }
    reply_err(w, &refusal.message).await?;
    Ok(refusal.after)
}

/// Tells the coordinator of a tenant's Put that its client is gone
/// ([`Body::PutAbandoned`]), so the name is unlocked at once; in the
/// background, sealed, resent a few times (the data deadline still
/// unlocks it if every datagram is lost).
fn report_abandoned(store: &SnStore, table: &SharedTable, coordinator: Addr, replica: Addr) {
    let Some(key) = store.key.clone() else { return };
    let known = crate::runtime::read_table(table).mn_endpoint(coordinator);
    let on = store.on;
    let msg = Msg::new(
        strata_store_client::transport::request_id(),
        coordinator,
        Body::PutAbandoned { replica },
    );
    tokio::spawn(async move {
        // A node that started with the cluster may hold a table from
        // before the metadata nodes joined: ask the orchestrator then.
        let endpoint = match known {
            Some(e) => Some(e),
            None => strata_store_client::transport::fetch_table(on, Some(&key))
                .await
                .ok()
                .and_then(|t| t.mn_endpoint(coordinator)),
        };
        let Some(endpoint) = endpoint else {
            tracing::info!(
                "the Put of {} was abandoned, but no metadata node holds its coordinator's address {}",
                fmt_addr(replica),
                fmt_addr(coordinator)
            );
            return;
        };
        let timeout = std::time::Duration::from_millis(300);
        match strata_store_client::transport::udp_call(endpoint, &msg, timeout, 4, Some(&key)).await
        {
            Ok(_) => tracing::debug!(
                "told {endpoint} that the Put of {} was abandoned",
                fmt_addr(replica)
            ),
            Err(e) => tracing::info!(
                "could not tell {endpoint} that the Put of {} was abandoned: {}",
                fmt_addr(replica),
                e.report()
            ),
        }
    });
}

/// Opens the next replica of a chain, `next`, sending it the header of a
/// Put of `size` bytes whose own chain is `chain`.
async fn open_downstream(
    store: &SnStore,
    table: &SharedTable,
    next: Addr,
    size: u64,
    chain: Vec<Addr>,
) -> Option<BufWriter<TcpStream>> {
    let known = crate::runtime::read_table(table).sn_endpoint(next);
    let endpoint = match known {
        Some(e) => e,
        None => {
            // A node that joined after our last refresh: ask the orchestrator now.
            let fresh = strata_store_client::transport::fetch_table(store.on, store.key.as_ref())
                .await
                .ok()?;
            let e = fresh.sn_endpoint(next)?;
            *table.write().unwrap_or_else(|e| e.into_inner()) = fresh;
            e
        }
    };
    let stream = TcpStream::connect(endpoint).await.ok()?;
    let _ = stream.set_nodelay(true);
    let mut w = BufWriter::with_capacity(CHUNK, stream);
    // The next node takes the Put on this node's seal (the tenant's
    // ticket was checked here).
    let cred = match &store.key {
        Some(k) => Credential::Seal(k),
        None => Credential::None,
    };
    let header = Request::Put {
        addr: next,
        size,
        chain,
    }
    .encode(cred);
    w.write_all(&header).await.ok()?;
    Some(w)
}

/// The number of durable copies the rest of the chain reports (`None` if
/// it failed: the client then decides with W_d).
async fn downstream_copies(down: Option<BufWriter<TcpStream>>) -> Option<u8> {
    let mut s = down?.into_inner();
    let reply = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        read_status(&mut s, "next replica").await.ok()?;
        s.read_u8().await.ok()
    })
    .await;
    reply.ok().flatten()
}

/// Runs one Put: asks the core to admit it, then executes its machine's
/// actions on the temporary file, the next replica's connection and the
/// sender's, reading the data as the machine takes it.
#[allow(clippy::too_many_arguments)]
async fn put<R, W>(
    r: &mut R,
    w: &mut W,
    store: &SnStore,
    table: &SharedTable,
    addr: Addr,
    size: u64,
    chain: Vec<Addr>,
    coordinator: Option<Addr>,
) -> Result<(), Error>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let exists = tokio::fs::try_exists(store.path(addr))
        .await
        .unwrap_or(false);
    let disk_free = fs_free(&store.dir).unwrap_or(u64::MAX);
    let admitted = store
        .core()
        .admit_put(addr, size, chain, coordinator, exists, disk_free);
    let (machine, first) = match admitted {
        Ok(admitted) => admitted,
        Err(refusal) => {
            let replied = refused(r, w, refusal).await.map(|_| ());
            if let (Err(_), Some(coordinator)) = (&replied, coordinator) {
                // The tenant's connection broke while its refused data was
                // drained: its client is gone all the same.
                report_abandoned(store, table, coordinator, addr);
            }
            return replied;
        }
    };
    let seq = store.tmp_seq.fetch_add(1, Ordering::Relaxed);
    let mut run = PutRun {
        store,
        table,
        tmp: store.dir.join("tmp").join(format!("{addr:032x}.{seq}")),
        machine,
        file: None,
        down: None,
    };
    let outcome = run.drive(r, w, first).await;
    if outcome.is_err() {
        let actions = run.machine.handle(PutEvent::Broken);
        // Only removal and the report follow a broken Put: they cannot fail.
        let _ = run.execute(w, actions, &[]).await;
    }
    outcome
}

/// A Put being executed; dropping it ends the Put in the core.
struct PutRun<'a> {
    store: &'a SnStore,
    table: &'a SharedTable,
    tmp: PathBuf,
    machine: PutMachine,
    file: Option<File>,
    down: Option<BufWriter<TcpStream>>,
}

impl Drop for PutRun<'_> {
    fn drop(&mut self) {
        self.store.core().end_put(&self.machine);
    }
}

/// What executing one action found, fed back to the machine.
enum Outcome {
    /// Nothing to report.
    Done,
    /// Writing the temporary file failed, for this reason.
    WriteFailed(String),
    /// The next replica is gone.
    ForwardFailed,
    /// The temporary file is synced.
    Synced,
    /// The file is in place.
    Installed,
    /// The next replica's answer.
    Answer(Option<u8>),
}

impl PutRun<'_> {
    /// Reads the data and the checksum while the machine takes them,
    /// executing its actions.
    async fn drive<R, W>(
        &mut self,
        r: &mut R,
        w: &mut W,
        first: Vec<PutAction>,
    ) -> Result<(), Error>
    where
        R: tokio::io::AsyncRead + Unpin,
        W: tokio::io::AsyncWrite + Unpin,
    {
        self.execute(w, first, &[]).await?;
        let (size, limit) = (self.machine.size(), self.store.limits.read_timeout);
        let mut buf = vec![0u8; CHUNK];
        while self.machine.phase() == PutPhase::Receiving && self.machine.left() > 0 {
            let left = self.machine.left();
            let want = left.min(CHUNK as u64) as usize;
            let n = tokio::time::timeout(limit, r.read(&mut buf[..want]))
                .await
                .map_err(|_| {
                    Error::Timeout(format!(
                        "the sender sent nothing for {} ms with {left} of {size} bytes still to send",
                        limit.as_millis()
                    ))
                })?
                .map_err(|e| Error::io("receiving replica data", e))?;
            if n == 0 {
                return Err(Error::Peer(format!(
                    "sender disconnected with {left} of {size} bytes still to send"
                )));
            }
            let actions = self.machine.handle(PutEvent::Data(&buf[..n]));
            self.execute(w, actions, &buf[..n]).await?;
        }
        if self.machine.phase() != PutPhase::Receiving {
            return Ok(());
        }
        let sent_crc = tokio::time::timeout(limit, r.read_u32())
            .await
            .map_err(|_| Error::Timeout("the sender never sent the checksum".into()))?
            .map_err(|e| Error::io("receiving the checksum", e))?;
        let actions = self.machine.handle(PutEvent::Checksum(sent_crc));
        self.execute(w, actions, &[]).await
    }

    /// Executes `actions` in order, `chunk` being the data just received,
    /// feeding each outcome back to the machine and executing what it
    /// answers first. An outcome that ends the Put drops what was left of
    /// the batch (the forward of a chunk that could not be written).
    async fn execute<W>(
        &mut self,
        w: &mut W,
        actions: Vec<PutAction>,
        chunk: &[u8],
    ) -> Result<(), Error>
    where
        W: tokio::io::AsyncWrite + Unpin,
    {
        let mut queue: VecDeque<PutAction> = actions.into();
        while let Some(action) = queue.pop_front() {
            let was_done = self.machine.phase() == PutPhase::Done;
            let more = match self.perform(w, action, chunk).await? {
                Outcome::Done => continue,
                Outcome::WriteFailed(why) => self.machine.handle(PutEvent::WriteFailed(&why)),
                Outcome::ForwardFailed => self.machine.handle(PutEvent::ForwardFailed),
                Outcome::Synced => self.machine.handle(PutEvent::Synced),
                Outcome::Installed => self.store.core().installed(&mut self.machine),
                Outcome::Answer(copies) => self.machine.handle(PutEvent::ForwardAnswer(copies)),
            };
            if !was_done && self.machine.phase() == PutPhase::Done {
                queue.clear();
            }
            for action in more.into_iter().rev() {
                queue.push_front(action);
            }
        }
        Ok(())
    }

    /// Executes one action.
    async fn perform<W>(
        &mut self,
        w: &mut W,
        action: PutAction,
        chunk: &[u8],
    ) -> Result<Outcome, Error>
    where
        W: tokio::io::AsyncWrite + Unpin,
    {
        let failed = |what: &str, e: std::io::Error| Outcome::WriteFailed(format!("{what}: {e}"));
        Ok(match action {
            PutAction::CreateTemp { header } => match File::create(&self.tmp).await {
                Err(e) => failed("creating the replica file", e),
                Ok(mut file) => {
                    let written = file.write_all(&header).await;
                    self.file = Some(file);
                    match written {
                        Err(e) => failed("writing the replica", e),
                        Ok(()) => Outcome::Done,
                    }
                }
            },
            PutAction::OpenForward { next, chain, size } => {
                self.down = open_downstream(self.store, self.table, next, size, chain).await;
                if self.down.is_some() {
                    Outcome::Done
                } else {
                    Outcome::ForwardFailed
                }
            }
            PutAction::Write => match self.write_temp(chunk).await {
                Err(e) => failed("writing the replica", e),
                Ok(()) => Outcome::Done,
            },
            PutAction::Forward => self.forward(chunk, false).await,
            PutAction::ForwardChecksum { crc } => self.forward(&crc.to_be_bytes(), true).await,
            PutAction::WriteChecksum { crc, table } => match self.write_end(crc, &table).await {
                Err(e) => failed("writing the replica", e),
                Ok(()) => Outcome::Done,
            },
            PutAction::Sync => {
                let file = self.file.take();
                let synced = match &file {
                    // The data and what finds it (size, blocks): the
                    // name becomes durable with the directory's sync.
                    Some(f) => f.sync_data().await,
                    None => Err(std::io::Error::other("the temporary file is not open")),
                };
                synced.map_err(|e| Error::io(format!("fsync {}", self.tmp.display()), e))?;
                Outcome::Synced
            }
            PutAction::Install => {
                let addr = self.machine.addr();
                tokio::fs::rename(&self.tmp, self.store.path(addr))
                    .await
                    .map_err(|e| Error::io(format!("renaming {}", self.tmp.display()), e))?;
                // Shared with the Puts installed meanwhile: one sync of
                // replicas/ makes every rename before it durable.
                self.store.replicas_sync.sync().await.map_err(|why| {
                    Error::io(
                        format!("fsync {}", self.store.dir.join("replicas").display()),
                        std::io::Error::other(why),
                    )
                })?;
                Outcome::Installed
            }
            PutAction::AwaitForward => Outcome::Answer(downstream_copies(self.down.take()).await),
            PutAction::Reply(PutReply::Ack { copies }) => {
                w.write_all(&[0, copies])
                    .await
                    .map_err(|e| Error::io("replying", e))?;
                w.flush().await.map_err(|e| Error::io("replying", e))?;
                Outcome::Done
            }
            PutAction::Reply(PutReply::Error(msg)) => {
                reply_err(w, &msg).await?;
                Outcome::Done
            }
            PutAction::RemoveTemp => {
                self.file = None;
                let _ = tokio::fs::remove_file(&self.tmp).await;
                Outcome::Done
            }
            PutAction::ReportAbandoned {
                coordinator,
                replica,
            } => {
                report_abandoned(self.store, self.table, coordinator, replica);
                Outcome::Done
            }
        })
    }

    async fn write_temp(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self.file.as_mut() {
            Some(f) => f.write_all(bytes).await,
            None => Err(std::io::Error::other("the temporary file is not open")),
        }
    }

    /// Appends the chunk table after the data, then writes the checksum.
    async fn write_end(&mut self, crc: u32, table: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncSeekExt;
        let Some(file) = self.file.as_mut() else {
            return Err(std::io::Error::other("the temporary file is not open"));
        };
        file.write_all(table).await?;
        file.flush().await?;
        file.seek(std::io::SeekFrom::Start(CHECKSUM_OFFSET)).await?;
        file.write_all(&crc.to_be_bytes()).await?;
        file.flush().await
    }

    /// Sends `bytes` to the next replica (and flushes with `flush`).
    async fn forward(&mut self, bytes: &[u8], flush: bool) -> Outcome {
        let Some(d) = self.down.as_mut() else {
            return Outcome::ForwardFailed;
        };
        let mut sent = d.write_all(bytes).await.is_ok();
        if sent && flush {
            sent = d.flush().await.is_ok();
        }
        if sent {
            Outcome::Done
        } else {
            self.down = None;
            Outcome::ForwardFailed
        }
    }
}

/// Garbage collection of replicas no record names any more: those of a
/// node that came back after it was declared dead (repair re-created them
/// elsewhere), or of a Post whose client vanished after the data was
/// written.
#[derive(Clone, Copy, Debug)]
pub struct GcConfig {
    /// Time between rounds.
    pub interval: std::time::Duration,
    /// Replicas younger than this are never collected: a Post or a repair
    /// copy may still be on its way to its metadata commit.
    pub grace: std::time::Duration,
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig {
            interval: std::time::Duration::from_secs(600),
            grace: std::time::Duration::from_secs(600),
        }
    }
}

/// What one collection round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Replicas old enough to be looked up.
    pub checked: usize,
    /// Of those, freed because no metadata node named them.
    pub freed: usize,
    /// `false` when the round was skipped: a metadata node was not up or
    /// did not answer, so a replica only it names could look unreferenced.
    pub complete: bool,
}

/// One collection round: asks every metadata node which of this node's
/// aged replicas its records name, and frees those none names. Skipped
/// (nothing freed) unless every metadata node is up and answers (a dead
/// one whose groups were all restored elsewhere is not asked); which
/// replicas are looked up and which may go is the core's decision
/// ([`crate::storage::collect`]).
pub async fn collect_garbage(
    store: &SnStore,
    table: &strata_store_protocol::table::Table,
    grace: std::time::Duration,
) -> GcReport {
    use strata_store_protocol::wire::MAX_REFERENCED;
    let mut report = GcReport::default();
    let Some(asked) = crate::storage::collect::asked(table) else {
        return report;
    };
    let files = store.replica_ages();
    let grace_ms = grace.as_millis().min(u64::MAX as u128) as u64;
    let (round, aged) = store.core().begin_collection(files, grace_ms);
    report.checked = aged.len();
    let mut named = std::collections::HashSet::new();
    for batch in aged.chunks(MAX_REFERENCED) {
        for mn in &asked {
            let ask = Msg::new(
                strata_store_client::transport::request_id(),
                0,
                Body::Referenced {
                    addrs: batch.to_vec(),
                },
            );
            let timeout = std::time::Duration::from_secs(2);
            let key = store.key.as_ref();
            let reply =
                strata_store_client::transport::udp_call(mn.endpoint, &ask, timeout, 3, key).await;
            match reply.map(|m| m.body) {
                Ok(Body::ReferencedBy { addrs }) => named.extend(addrs),
                _ => {
                    store.core().cancel_collection(round);
                    return report;
                }
            }
        }
    }
    let unreferenced = store.core().finish_collection(round, &named);
    for addr in unreferenced {
        if store.remove_replica(addr) {
            report.freed += 1;
            tracing::info!(
                "freed replica {}: no metadata node names it",
                fmt_addr(addr)
            );
        }
    }
    report.complete = true;
    report
}

/// Watches the table until the task is dropped; once it shows the node
/// `uuid` retired, retires the store ([`SnStore::retire`]) and stops.
pub async fn retire_watch(store: std::sync::Arc<SnStore>, table: SharedTable, uuid: u64) {
    let mut tick = tokio::time::interval(crate::runtime::REFRESH);
    loop {
        tick.tick().await;
        let retired = crate::runtime::read_table(&table)
            .sns
            .iter()
            .any(|s| s.uuid == uuid && s.state == strata_store_protocol::table::State::Retired);
        if retired {
            let freed = store.retire();
            tracing::info!("storage node retired: {freed} replicas freed");
            return;
        }
    }
}

/// Runs [`collect_garbage`] every `cfg.interval` until the task is dropped.
pub async fn gc_loop(store: std::sync::Arc<SnStore>, table: SharedTable, cfg: GcConfig) {
    let mut tick = tokio::time::interval(cfg.interval);
    tick.tick().await; // the first tick is immediate: wait a full interval
    loop {
        tick.tick().await;
        let t = crate::runtime::read_table(&table);
        let r = collect_garbage(&store, &t, cfg.grace).await;
        if r.freed > 0 || !r.complete {
            tracing::info!(
                "replica collection: {} checked, {} freed{}",
                r.checked,
                r.freed,
                if r.complete {
                    ""
                } else {
                    " (skipped: not every metadata node answered)"
                }
            );
        }
    }
}

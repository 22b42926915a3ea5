//! The storage node: one file per replica, named by its address, with a
//! header holding the size and CRC-32C of the data. A Put is written to a
//! temporary file while it is forwarded to the next replica, checked
//! against the sender's checksum, fsynced and renamed into place before it
//! is acknowledged, so a replica is either whole or absent. Every read
//! verifies the checksum and reports the result in the reply's trailer.

use crate::runtime::SharedTable;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use strata_store_client::stream::{read_request, read_status, write_error};
use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::data::{Authority, Credential, Request};
use strata_store_protocol::wire::{Body, Msg};
use strata_store_protocol::Error;
use tokio::fs::File;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};

const FILE_MAGIC: [u8; 4] = *b"S6RP";
/// Replica file header: magic, version, 3 reserved bytes, size, CRC-32C.
const FILE_HEADER: usize = 20;
const CHUNK: usize = 256 * 1024;

/// A storage node's replica directory and counters.
pub struct SnStore {
    dir: PathBuf,
    index: u16,
    on: std::net::SocketAddr,
    capacity: u64,
    used: AtomicU64,
    objects: AtomicU64,
    tmp_seq: AtomicU64,
    /// Set once the orchestrator has retired this node: its replicas are
    /// freed and Puts refused.
    retired: std::sync::atomic::AtomicBool,
    /// The cluster key: seals the node's requests to metadata nodes and
    /// the orchestrator (none in tests that run no cluster).
    key: Option<strata_store_protocol::auth::ClusterKey>,
    /// Limits of the data port.
    limits: DataLimits,
    /// Data connections open now.
    connections: std::sync::atomic::AtomicUsize,
}

/// Limits of a storage node's data port, so that peers that connect and
/// send little or nothing cannot hold its connections forever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataLimits {
    /// How long a connection may take to send a whole request header,
    /// counted from when the node starts waiting for it (so an idle
    /// connection between requests is closed after it too), and how long
    /// one read of a Put's data may wait. Past it the connection is
    /// closed.
    pub read_timeout: std::time::Duration,
    /// Most data connections open at once; one more is closed as soon as
    /// it is accepted.
    pub max_connections: usize,
}

/// Default of [`DataLimits::read_timeout`]: 10 s.
pub const DATA_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Default of [`DataLimits::max_connections`].
pub const DATA_MAX_CONNECTIONS: usize = 1024;

impl Default for DataLimits {
    fn default() -> Self {
        DataLimits {
            read_timeout: DATA_READ_TIMEOUT,
            max_connections: DATA_MAX_CONNECTIONS,
        }
    }
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
            index,
            on,
            capacity,
            used: AtomicU64::new(used),
            objects: AtomicU64::new(objects),
            tmp_seq: AtomicU64::new(0),
            retired: std::sync::atomic::AtomicBool::new(false),
            key: None,
            limits: DataLimits::default(),
            connections: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// The store, with the data port's `limits`.
    pub fn with_limits(mut self, limits: DataLimits) -> SnStore {
        self.limits = limits;
        self
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

    /// Bytes still free: the configured capacity minus what is stored,
    /// and never more than the file system has.
    pub fn free(&self) -> u64 {
        let by_capacity = self
            .capacity
            .saturating_sub(self.used.load(Ordering::Relaxed));
        by_capacity.min(fs_free(&self.dir).unwrap_or(u64::MAX))
    }

    /// Replicas held.
    pub fn objects(&self) -> u64 {
        self.objects.load(Ordering::Relaxed)
    }

    /// Configured capacity.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Whether the node has been retired (see [`SnStore::retire`]).
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }

    /// Retirement: the orchestrator marked this node retired after its
    /// drain, so no record names any replica it holds. Refuses Puts from
    /// now on and frees every replica; returns how many were freed.
    /// Gets are still answered (a client holding a record read before
    /// the drain ended is told the replica is gone, and tries the next).
    pub fn retire(&self) -> usize {
        self.retired.store(true, Ordering::Relaxed);
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

    fn path(&self, addr: Addr) -> PathBuf {
        self.dir.join("replicas").join(format!("{addr:032x}"))
    }

    /// Checks that a request for `addr` belongs here. `addressed` is the
    /// address the connection was made to, when it lies in this node's
    /// prefix (routed mode): then the request must name that very address.
    fn check_addr(
        &self,
        table: &SharedTable,
        addr: Addr,
        addressed: Option<Addr>,
    ) -> Result<(), String> {
        let layout = crate::runtime::read_table(table).layout;
        if layout.sn_of(addr) != Some(self.index) || addr as u64 == 0 {
            return Err(format!(
                "replica address {} is not in this storage node's prefix {}/64",
                fmt_addr(addr),
                fmt_addr(layout.sn_prefix(self.index))
            ));
        }
        match addressed {
            Some(a) if a != addr => Err(format!(
                "connection made to replica address {} but the request names {}",
                fmt_addr(a),
                fmt_addr(addr)
            )),
            _ => Ok(()),
        }
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
        (layout.sn_of(addr) == Some(self.index)).then_some(addr)
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
                tracing::debug!("storage node connection ended: {e}");
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
    let mut w = BufWriter::with_capacity(CHUNK, w);
    let limit = store.limits.read_timeout;
    loop {
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
                let _ = write_error(&mut w, &e.to_string()).await;
                return Err(e);
            }
        };
        // Nothing is read, stored, served or freed before this check.
        let authority =
            match incoming.authorize(store.key.as_ref(), strata_store_protocol::auth::unix_ms()) {
                Ok(a) => a,
                Err(msg) => {
                    tracing::info!("refused a data request: {msg}");
                    write_error(&mut w, &msg)
                        .await
                        .map_err(|e| Error::io("replying", e))?;
                    // A refused Put's data would follow, and a peer without
                    // credentials gets nothing more from this connection.
                    return Ok(());
                }
            };
        let req = incoming.req;
        let addr = req.addr();
        if let Err(msg) = store.check_addr(table, addr, addressed) {
            write_error(&mut w, &msg)
                .await
                .map_err(|e| Error::io("replying", e))?;
            // A refused Put's data would follow: the stream cannot continue.
            if matches!(req, Request::Put { .. }) {
                return Ok(());
            }
            continue;
        }
        match req {
            Request::Put { .. } if store.is_retired() => {
                write_error(&mut w, "this storage node is retired: it takes no replica")
                    .await
                    .map_err(|e| Error::io("replying", e))?;
                // The refused Put's data would follow.
                return Ok(());
            }
            Request::Put { addr, size, chain } => {
                let stored = put(&mut r, &mut w, store, table, addr, size, chain).await;
                if let (Err(_), Authority::Tenant { coordinator }) = (&stored, authority) {
                    // The tenant's connection broke mid-Put: its client
                    // is gone (a client never resends on another one).
                    report_abandoned(store, table, coordinator, addr);
                }
                stored?
            }
            Request::Get { addr } => get(&mut w, store, addr).await?,
            Request::Free { addr } => {
                let path = store.path(addr);
                if let Ok(m) = tokio::fs::metadata(&path).await {
                    if tokio::fs::remove_file(&path).await.is_ok() {
                        store.used.fetch_sub(m.len(), Ordering::Relaxed);
                        store.objects.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                w.write_all(&[0])
                    .await
                    .map_err(|e| Error::io("replying", e))?;
                w.flush().await.map_err(|e| Error::io("replying", e))?;
            }
        }
    }
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
                "could not tell {endpoint} that the Put of {} was abandoned: {e}",
                fmt_addr(replica)
            ),
        }
    });
}

/// Opens the next replica of a chain, sending it the Put header.
async fn open_downstream(
    store: &SnStore,
    table: &SharedTable,
    size: u64,
    chain: &[Addr],
) -> Option<BufWriter<TcpStream>> {
    let (&next, rest) = chain.split_first()?;
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
        chain: rest.to_vec(),
    }
    .encode(cred);
    w.write_all(&header).await.ok()?;
    Some(w)
}

#[allow(clippy::too_many_arguments)]
async fn put<R, W>(
    r: &mut R,
    w: &mut W,
    store: &SnStore,
    table: &SharedTable,
    addr: Addr,
    size: u64,
    chain: Vec<Addr>,
) -> Result<(), Error>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let final_path = store.path(addr);
    if tokio::fs::try_exists(&final_path).await.unwrap_or(false) {
        // Read and drop the data so the reply is in sync, then refuse.
        tokio::io::copy(&mut r.take(size + 4), &mut tokio::io::sink())
            .await
            .map_err(|e| Error::io("draining a refused Put", e))?;
        return reply_err(w, &format!("replica {} already exists", fmt_addr(addr))).await;
    }
    if size > store.free() {
        tokio::io::copy(&mut r.take(size + 4), &mut tokio::io::sink())
            .await
            .map_err(|e| Error::io("draining a refused Put", e))?;
        return reply_err(
            w,
            &format!("no room for {size} bytes ({} free)", store.free()),
        )
        .await;
    }
    let seq = store.tmp_seq.fetch_add(1, Ordering::Relaxed);
    let tmp = store.dir.join("tmp").join(format!("{addr:032x}.{seq}"));
    let result = receive(r, store, table, &tmp, size, &chain).await;
    match result {
        Ok((downstream, file)) => {
            // Durable before anyone is told so.
            file.sync_all()
                .await
                .map_err(|e| Error::io(format!("fsync {}", tmp.display()), e))?;
            drop(file);
            tokio::fs::rename(&tmp, &final_path)
                .await
                .map_err(|e| Error::io(format!("renaming {}", tmp.display()), e))?;
            sync_dir(&store.dir.join("replicas")).await;
            store
                .used
                .fetch_add(size + FILE_HEADER as u64, Ordering::Relaxed);
            store.objects.fetch_add(1, Ordering::Relaxed);
            let copies = 1 + downstream_copies(downstream).await;
            w.write_all(&[0, copies])
                .await
                .map_err(|e| Error::io("replying", e))?;
            w.flush().await.map_err(|e| Error::io("replying", e))
        }
        Err(PutError::Refuse(msg)) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            reply_err(w, &msg).await
        }
        Err(PutError::Broken(e)) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            Err(e)
        }
    }
}

enum PutError {
    /// The Put was read entirely but is refused (bad checksum, disk error).
    Refuse(String),
    /// The sender went away: nothing to reply to.
    Broken(Error),
}

/// Receives the data into `tmp`, forwarding it down the chain, and checks
/// the sender's CRC-32C.
async fn receive<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    store: &SnStore,
    table: &SharedTable,
    tmp: &Path,
    size: u64,
    chain: &[Addr],
) -> Result<(Option<BufWriter<TcpStream>>, File), PutError> {
    let refuse = |what: &str, e: std::io::Error| PutError::Refuse(format!("{what}: {e}"));
    let mut file = File::create(tmp)
        .await
        .map_err(|e| refuse("creating the replica file", e))?;
    let mut header = [0u8; FILE_HEADER];
    header[..4].copy_from_slice(&FILE_MAGIC);
    header[4] = 1;
    header[8..16].copy_from_slice(&size.to_be_bytes());
    file.write_all(&header)
        .await
        .map_err(|e| refuse("writing the replica", e))?;
    let mut down = open_downstream(store, table, size, chain).await;
    let mut buf = vec![0u8; CHUNK];
    let mut left = size;
    let mut crc = 0u32;
    while left > 0 {
        let want = left.min(CHUNK as u64) as usize;
        let limit = store.limits.read_timeout;
        let n = tokio::time::timeout(limit, r.read(&mut buf[..want]))
            .await
            .map_err(|_| {
                PutError::Broken(Error::Timeout(format!(
                    "the sender sent nothing for {} ms with {left} of {size} bytes still to send",
                    limit.as_millis()
                )))
            })?
            .map_err(|e| PutError::Broken(Error::io("receiving replica data", e)))?;
        if n == 0 {
            return Err(PutError::Broken(Error::Invalid(format!(
                "sender disconnected with {left} of {size} bytes still to send"
            ))));
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        file.write_all(&buf[..n])
            .await
            .map_err(|e| refuse("writing the replica", e))?;
        if let Some(d) = down.as_mut() {
            if d.write_all(&buf[..n]).await.is_err() {
                down = None;
            }
        }
        left -= n as u64;
    }
    let sent_crc = tokio::time::timeout(store.limits.read_timeout, r.read_u32())
        .await
        .map_err(|_| PutError::Broken(Error::Timeout("the sender never sent the checksum".into())))?
        .map_err(|e| PutError::Broken(Error::io("receiving the checksum", e)))?;
    if let Some(d) = down.as_mut() {
        if d.write_all(&sent_crc.to_be_bytes()).await.is_err() || d.flush().await.is_err() {
            down = None;
        }
    }
    if sent_crc != crc {
        return Err(PutError::Refuse(format!(
            "checksum mismatch: the sender says {sent_crc:08x}, the data has {crc:08x}"
        )));
    }
    file.flush()
        .await
        .map_err(|e| refuse("writing the replica", e))?;
    use tokio::io::AsyncSeekExt;
    file.seek(std::io::SeekFrom::Start(16))
        .await
        .map_err(|e| refuse("writing the replica", e))?;
    file.write_all(&crc.to_be_bytes())
        .await
        .map_err(|e| refuse("writing the replica", e))?;
    file.flush()
        .await
        .map_err(|e| refuse("writing the replica", e))?;
    Ok((down, file))
}

/// The number of durable copies the rest of the chain reports (0 if it
/// failed: the client then decides with W_d).
async fn downstream_copies(down: Option<BufWriter<TcpStream>>) -> u8 {
    let Some(d) = down else { return 0 };
    let mut s = d.into_inner();
    let reply = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        read_status(&mut s, "next replica").await.ok()?;
        s.read_u8().await.ok()
    })
    .await;
    reply.ok().flatten().unwrap_or(0)
}

async fn reply_err<W: tokio::io::AsyncWrite + Unpin>(w: &mut W, msg: &str) -> Result<(), Error> {
    write_error(w, msg)
        .await
        .map_err(|e| Error::io("replying", e))
}

async fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir).await {
        let _ = d.sync_all().await;
    }
}

/// Replicas up to this size are read whole in one blocking call: a Get of
/// a small object then costs one hand-off to the blocking pool instead of
/// one per file operation.
const SMALL_REPLICA: u64 = 1 << 20;

/// What opening a replica file found.
enum Opened {
    Missing,
    Damaged,
    /// A small replica read whole (shorter than `size` if it was cut short
    /// under us).
    Small {
        size: u64,
        stored_crc: u32,
        data: Vec<u8>,
    },
    /// A large replica, positioned after its header.
    Large {
        size: u64,
        stored_crc: u32,
        file: std::fs::File,
    },
}

/// Opens a replica file and checks its header (blocking).
fn open_replica(path: &Path) -> Opened {
    use std::io::Read;
    let Ok(mut file) = std::fs::File::open(path) else {
        return Opened::Missing;
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut header = [0u8; FILE_HEADER];
    let header_ok = file.read_exact(&mut header).is_ok() && header[..4] == FILE_MAGIC;
    let size = u64::from_be_bytes(header[8..16].try_into().unwrap_or([0; 8]));
    let stored_crc = u32::from_be_bytes(header[16..20].try_into().unwrap_or([0; 4]));
    if !header_ok || len != size.saturating_add(FILE_HEADER as u64) {
        return Opened::Damaged;
    }
    if size > SMALL_REPLICA {
        return Opened::Large {
            size,
            stored_crc,
            file,
        };
    }
    // Bounded by SMALL_REPLICA, checked above.
    let mut data = Vec::with_capacity(size as usize);
    let _ = file.take(size).read_to_end(&mut data);
    Opened::Small {
        size,
        stored_crc,
        data,
    }
}

/// Sends a replica, verifying its checksum as it goes.
async fn get<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    store: &SnStore,
    addr: Addr,
) -> Result<(), Error> {
    let path = store.path(addr);
    let opened = tokio::task::spawn_blocking(move || open_replica(&path))
        .await
        .map_err(|e| Error::Invalid(format!("reading a replica: {e}")))?;
    let io = |e| Error::io("sending a replica", e);
    let (size, stored_crc, crc, sent) = match opened {
        Opened::Missing => {
            return reply_err(w, &format!("no replica at {}", fmt_addr(addr))).await;
        }
        Opened::Damaged => {
            return reply_err(
                w,
                &format!(
                    "replica {} is damaged (bad header or length); it must be repaired from another copy",
                    fmt_addr(addr)
                ),
            )
            .await;
        }
        Opened::Small {
            size,
            stored_crc,
            data,
        } => {
            w.write_all(&[0]).await.map_err(io)?;
            w.write_all(&size.to_be_bytes()).await.map_err(io)?;
            w.write_all(&data).await.map_err(io)?;
            let crc = crc32c::crc32c(&data);
            (size, stored_crc, crc, data.len() as u64)
        }
        Opened::Large {
            size,
            stored_crc,
            file,
        } => {
            w.write_all(&[0]).await.map_err(io)?;
            w.write_all(&size.to_be_bytes()).await.map_err(io)?;
            let mut file = File::from_std(file);
            let (crc, sent) = stream_body(w, &mut file, size).await?;
            (size, stored_crc, crc, sent)
        }
    };
    let truncated = sent < size;
    if truncated {
        // Keep the framing: pad, and let the trailer say it is bad.
        let zeros = vec![0u8; CHUNK];
        let mut left = size - sent;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            w.write_all(&zeros[..n]).await.map_err(io)?;
            left -= n as u64;
        }
    }
    let verified = crc == stored_crc && !truncated;
    w.write_all(&[if verified { 0 } else { 1 }])
        .await
        .map_err(io)?;
    w.write_all(&crc.to_be_bytes()).await.map_err(io)?;
    w.flush().await.map_err(io)?;
    if !verified {
        tracing::warn!("replica {} failed its checksum", fmt_addr(addr));
    }
    Ok(())
}

/// Streams up to `size` bytes of `file`; returns their CRC-32C and how
/// many there were (fewer if the file was cut short under us).
async fn stream_body<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    file: &mut File,
    size: u64,
) -> Result<(u32, u64), Error> {
    let io = |e| Error::io("sending a replica", e);
    let mut buf = vec![0u8; CHUNK];
    let mut sent = 0u64;
    let mut crc = 0u32;
    while sent < size {
        let want = (size - sent).min(CHUNK as u64) as usize;
        let n = file.read(&mut buf[..want]).await.map_err(io)?;
        if n == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        w.write_all(&buf[..n]).await.map_err(io)?;
        sent += n as u64;
    }
    Ok((crc, sent))
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

impl SnStore {
    /// Replica addresses older than `grace`, from the file names.
    fn aged_replicas(&self, grace: std::time::Duration) -> Vec<Addr> {
        let Ok(entries) = std::fs::read_dir(self.dir.join("replicas")) else {
            return Vec::new();
        };
        let now = std::time::SystemTime::now();
        entries
            .flatten()
            .filter(|e| {
                e.metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| now.duration_since(t).is_ok_and(|age| age >= grace))
            })
            .filter_map(|e| {
                let name = e.file_name();
                let name = name.to_str()?;
                (name.len() == 32)
                    .then(|| u128::from_str_radix(name, 16).ok())
                    .flatten()
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
        self.used.fetch_sub(m.len(), Ordering::Relaxed);
        self.objects.fetch_sub(1, Ordering::Relaxed);
        true
    }
}

/// One collection round: asks every metadata node which of this node's
/// aged replicas its records name, and frees those none names. Skipped
/// (nothing freed) unless every metadata node is up and answers (a dead
/// one whose groups were all restored elsewhere is not asked).
pub async fn collect_garbage(
    store: &SnStore,
    table: &strata_store_protocol::table::Table,
    grace: std::time::Duration,
) -> GcReport {
    use strata_store_protocol::wire::{Body, Msg, MAX_REFERENCED};
    let mut report = GcReport::default();
    // A dead metadata node that owns nothing any more is not asked: its
    // groups were restored on the others (otherwise it would block every
    // round for good). Every other one must be up and answer.
    let asked: Vec<_> = table.gc_mns().collect();
    if asked.is_empty()
        || asked
            .iter()
            .any(|m| m.state != strata_store_protocol::table::State::Up)
    {
        return report;
    }
    let aged = store.aged_replicas(grace);
    report.checked = aged.len();
    let mut unreferenced = Vec::new();
    for batch in aged.chunks(MAX_REFERENCED) {
        let mut named = std::collections::HashSet::new();
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
                _ => return report,
            }
        }
        unreferenced.extend(batch.iter().copied().filter(|a| !named.contains(a)));
    }
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

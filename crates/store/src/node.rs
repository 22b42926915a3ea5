//! Runtimes that put the roles on sockets: the orchestrator and metadata
//! nodes on UDP, storage nodes on TCP, each refreshing the prefix table
//! from the orchestrator and sending heartbeats.
//!
//! A metadata or replica address is turned into a socket address by the
//! prefix table ([`Table::mn_endpoint`], [`Table::sn_endpoint`]): the owning
//! node's endpoint in mapped mode, the address itself in routed mode. The
//! address also travels in every message, so both modes share one path.

use crate::auth::{ClusterKey, Gate, Receiver, Verdict};
use crate::mn::{MnCore, Out};
use crate::on::OnCore;
use crate::sn::SnStore;
use crate::table::{Device, Table};
use crate::wire::{Body, Code, Msg, Role, MAX_DATAGRAM};
use crate::Error;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::watch;

/// The prefix table shared by a node's tasks.
pub type SharedTable = Arc<RwLock<Table>>;

/// A copy of the shared table (it is small: a few KiB).
pub fn read_table(t: &SharedTable) -> Table {
    t.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// How often nodes refresh the table and send heartbeats.
pub const REFRESH: Duration = Duration::from_millis(500);

/// How soon, at most, a metadata node refuses a credential generation
/// the orchestrator revoked, while the orchestrator is reachable: a table
/// refresh period ([`REFRESH`]), the heartbeat sent before the fetch
/// (its 200 ms timeout), one table request (300 ms), and one tick of the
/// node's loop, which takes the new table in.
pub const REVOCATION_BOUND: Duration = Duration::from_millis(500 + 200 + 300 + 20);

/// Sends `msg` to `to` and waits for the reply with the same request id,
/// resending up to `attempts` times. With `key`, the request is sealed
/// (again for each attempt: a resend is not a replay) and only a sealed
/// answer is taken ([`crate::auth::open_answer`]).
pub async fn udp_call(
    to: SocketAddr,
    msg: &Msg,
    timeout: Duration,
    attempts: u32,
    key: Option<&ClusterKey>,
) -> Result<Msg, Error> {
    let bind: SocketAddr = if to.is_ipv4() {
        "0.0.0.0:0"
            .parse()
            .unwrap_or_else(|_| crate::wire::no_endpoint())
    } else {
        "[::]:0"
            .parse()
            .unwrap_or_else(|_| crate::wire::no_endpoint())
    };
    let sock = UdpSocket::bind(bind)
        .await
        .map_err(|e| Error::io("binding a UDP socket", e))?;
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    for _ in 0..attempts.max(1) {
        let bytes = crate::auth::encode(msg, key, crate::auth::unix_ms())?;
        sock.send_to(&bytes, to)
            .await
            .map_err(|e| Error::io(format!("sending to {to}"), e))?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, sock.recv_from(&mut buf)).await {
                Err(_) => break,
                Ok(Err(_)) => break, // ICMP unreachable and the like: resend
                Ok(Ok((n, _))) => {
                    let now = crate::auth::unix_ms();
                    if let Some(reply) = crate::auth::open_answer(&buf[..n], key, now) {
                        if reply.req == msg.req {
                            return Ok(reply);
                        }
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
    crate::addr::splitmix64(base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed))) & !(1 << 63)
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
    let msg = Msg::new(request_id(), 0, Body::GetTable);
    match ok_body(udp_call(on, &msg, Duration::from_millis(300), 5, key).await?)? {
        Body::Table { bytes } => Ok(Table::decode(&bytes)?),
        other => Err(Error::Invalid(format!(
            "the orchestrator at {on} answered {other:?} to a table request"
        ))),
    }
}

/// The persistent identity of the node stored in `dir` (created once).
pub fn node_uuid(dir: &Path) -> Result<u64, Error> {
    let path = dir.join("node-id");
    if let Ok(s) = std::fs::read_to_string(&path) {
        return u64::from_str_radix(s.trim(), 16).map_err(|_| {
            Error::Invalid(format!(
                "{} does not hold a node identity (16 hex digits)",
                path.display()
            ))
        });
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let uuid = crate::addr::splitmix64(nanos() ^ (std::process::id() as u64) << 32) | 1;
    std::fs::write(&path, format!("{uuid:016x}\n"))
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    Ok(uuid)
}

async fn register(on: SocketAddr, body: Body, key: &ClusterKey) -> Result<u16, Error> {
    let msg = Msg::new(request_id(), 0, body);
    match ok_body(udp_call(on, &msg, Duration::from_millis(300), 10, Some(key)).await?)? {
        Body::Registered { index } => Ok(index),
        other => Err(Error::Invalid(format!(
            "the orchestrator answered {other:?} to a registration"
        ))),
    }
}

/// Keeps `table` fresh and sends heartbeats until the task is dropped. With
/// `routes_of` (a host address), it also keeps that host's routes in step
/// with the table when the cluster is routed.
async fn refresh_loop(
    on: SocketAddr,
    uuid: u64,
    table: SharedTable,
    tx: Option<watch::Sender<Table>>,
    stats: impl Fn() -> (u64, u64),
    routes_of: Option<IpAddr>,
    key: ClusterKey,
) {
    let mut interval = tokio::time::interval(REFRESH);
    let mut keeper = crate::routes::RouteKeeper::new();
    loop {
        interval.tick().await;
        let (free, objects) = stats();
        let hb = Msg::new(
            request_id(),
            0,
            Body::Heartbeat {
                uuid,
                free,
                objects,
                keys: Some(key.fingerprints()),
            },
        );
        let _ = udp_call(on, &hb, Duration::from_millis(200), 1, Some(&key)).await;
        if let Ok(t) = fetch_table(on, Some(&key)).await {
            if let (true, Some(host)) = (t.routed, routes_of) {
                // Runs `ip` only when the routes change (a node joined, a
                // group moved), so it may block this task briefly.
                match keeper.sync(&t, host) {
                    Ok(0) => {}
                    Ok(n) => tracing::info!("{n} routes of host {host} installed or changed"),
                    Err(e) => tracing::warn!("{e}"),
                }
            }
            *table.write().unwrap_or_else(|e| e.into_inner()) = t.clone();
            if let Some(tx) = &tx {
                let _ = tx.send(t);
            }
        }
    }
}

/// Serves the orchestrator on `sock` until the task is dropped; `key` is
/// the cluster's.
pub async fn run_on(sock: UdpSocket, mut core: OnCore, key: ClusterKey) {
    let start = Instant::now();
    let mut gate = Gate::new(key, Receiver::On);
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    core.set_own_keys(gate.key().fingerprints());
    loop {
        tokio::select! {
            r = sock.recv_from(&mut buf) => {
                let Ok((n, from)) = r else { continue };
                let now = start.elapsed().as_millis() as u64;
                let wall = crate::auth::unix_ms();
                if let Some(bytes) = on_receive(&mut core, &mut gate, wall, now, &buf[..n]) {
                    let _ = sock.send_to(&bytes, from).await;
                }
            }
            _ = tick.tick() => {
                // As reloaded on SIGHUP, for `strata store status`.
                core.set_own_keys(gate.key().fingerprints());
                if let Err(e) = core.tick(start.elapsed().as_millis() as u64) {
                    tracing::warn!("orchestrator: {e}");
                }
            }
        }
    }
}

/// Handles one datagram at the orchestrator, received at wall-clock time
/// `wall` (ms since the Unix epoch) and core time `now`: the gate first,
/// then the core. Returns the answer to send, sealed if the request was.
pub fn on_receive(
    core: &mut OnCore,
    gate: &mut Gate,
    wall: u64,
    now: u64,
    bytes: &[u8],
) -> Option<Vec<u8>> {
    match gate.admit(bytes, wall) {
        Verdict::Accept { msg, sealed, .. } => {
            let key = sealed.then_some(gate.key());
            crate::auth::encode(&core.handle(now, &msg), key, wall).ok()
        }
        Verdict::Refuse(reply) => reply.encode().ok(),
        Verdict::Drop => None,
    }
}

/// Handles one datagram at a metadata node, received at wall-clock time
/// `wall` and core time `now` from `from`, sent to `to` (routed mode): the
/// gate first, then the core. Each output comes with whether to seal it:
/// everything but the direct answer to an unsealed (tenant's) request,
/// so that a zero-byte Get and its answer pay for no HMAC. The direct
/// answer to a tenant's `GetLinkProof` gets its link proof for that
/// tenant here ([`crate::auth::issue_link_proof`]): only the gate knows
/// who asked.
pub fn mn_receive<P: Copy + Eq + std::hash::Hash>(
    core: &mut MnCore<P>,
    gate: &mut Gate,
    wall: u64,
    now: u64,
    from: P,
    to: Option<Ipv6Addr>,
    bytes: &[u8],
) -> Vec<(Out<P>, bool)> {
    // Revocations in a table the node took since the last datagram apply
    // from this one on.
    gate.follow_table(core.table());
    let (msg, sealed, tenant) = match gate.admit(bytes, wall) {
        Verdict::Accept {
            msg,
            sealed,
            tenant,
        } => (msg, sealed, tenant),
        Verdict::Refuse(reply) => return vec![(Out::Reply(from, reply), false)],
        Verdict::Drop => return Vec::new(),
    };
    if let Some(refusal) = misaddressed(core.table(), to, &msg) {
        return vec![(Out::Reply(from, refusal), sealed)];
    }
    let req = msg.req;
    core.handle(now, from, msg)
        .into_iter()
        .map(|mut out| {
            let direct = matches!(&out, Out::Reply(p, m) if *p == from && m.req == req);
            if let (true, Some(tenant), Out::Reply(_, m)) = (direct, &tenant, &mut out) {
                crate::auth::issue_link_proof(&mut m.body, gate.key(), tenant, wall);
            }
            let seal = sealed || !direct;
            (out, seal)
        })
        .collect()
}

/// The error reply to an undecodable datagram (with its request id when
/// the header got that far).
pub fn malformed(bytes: &[u8], e: &crate::wire::WireError) -> Msg {
    let req = bytes
        .get(4..12)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0);
    Msg::new(
        req,
        0,
        Body::Error {
            code: Code::BadRequest,
            message: format!("malformed message: {e}"),
        },
    )
}

/// Where a node listening at `listen` binds its socket. In routed mode it
/// binds the wildcard address at that port: the host's local routes for
/// the node's prefix (or metadata groups) deliver every object or metadata
/// address to it. In mapped mode it binds `listen` itself.
async fn bind_address(
    on: SocketAddr,
    listen: SocketAddr,
    key: &ClusterKey,
) -> Result<SocketAddr, Error> {
    if fetch_table(on, Some(key)).await?.routed {
        Ok(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), listen.port()))
    } else {
        Ok(listen)
    }
}

/// The endpoint a node registers: `listen`'s address (a wildcard bind has
/// none of its own) with the port the socket got.
fn advertised(listen: SocketAddr, bound: std::io::Result<SocketAddr>) -> Result<SocketAddr, Error> {
    let bound = bound.map_err(|e| Error::io("local address", e))?;
    Ok(SocketAddr::new(listen.ip(), bound.port()))
}

/// A running metadata node.
pub struct MnHandle {
    /// Its UDP endpoint.
    pub endpoint: SocketAddr,
    /// Its slot.
    pub slot: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    refresher: tokio::task::JoinHandle<()>,
}

impl Drop for MnHandle {
    fn drop(&mut self) {
        self.refresher.abort();
        self.stop.store(true, Ordering::Relaxed);
        // The loop notices within one tick; joining frees the socket, so
        // a node restarted in the same process can bind its port again.
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How often the metadata node's state machine gets a tick (repair steps,
/// resends) and checks for a new table or a stop request.
const MN_TICK: Duration = Duration::from_millis(20);

/// Starts a metadata node stored in `dir`, listening on `bind`, member of
/// the cluster whose orchestrator is `on`.
///
/// The node's loop runs on a thread of its own with a blocking socket:
/// a metadata request is one datagram in and one out, and a blocking
/// receive serves it without the readiness polling and task wake-ups of an
/// async socket (the profile of zero-byte Gets was mostly those). Copies
/// and frees still run as tasks on the caller's runtime.
///
/// With `keep_routes`, a node of a routed cluster keeps its host's routes
/// in step with the table ([`crate::routes`]). `sync_ms` is the pause
/// between two anti-entropy passes over the metadata copies of the names
/// the node coordinates (0: none; see [`MnCore::set_sync_interval`]).
pub async fn start_mn(
    dir: &Path,
    bind: SocketAddr,
    on: SocketAddr,
    keep_routes: bool,
    key: &ClusterKey,
    sync_ms: u64,
) -> Result<MnHandle, Error> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let uuid = node_uuid(dir)?;
    let db = crate::metadb::MetaDb::open(&dir.join("meta.redb"))?;
    let at = bind_address(on, bind, key).await?;
    let sock = std::net::UdpSocket::bind(at).map_err(|e| Error::io(format!("binding {at}"), e))?;
    sock.set_read_timeout(Some(MN_TICK))
        .map_err(|e| Error::io(format!("setting a receive timeout on {at}"), e))?;
    want_destinations(&sock)
        .map_err(|e| Error::io(format!("asking for datagram destinations on {at}"), e))?;
    let endpoint = advertised(bind, sock.local_addr())?;
    let slot = register(
        on,
        Body::Register {
            role: Role::Mn,
            uuid,
            endpoint,
            capacity: 0,
            free: 0,
            device: 0,
            keys: Some(key.fingerprints()),
        },
        key,
    )
    .await?;
    let table = fetch_table(on, Some(key)).await?;
    let mut core = MnCore::new(db, table.clone(), slot, nanos() ^ uuid);
    core.set_sync_interval(sync_ms);
    let shared = Arc::new(RwLock::new(table.clone()));
    let (tx, rx) = watch::channel(table);
    let routes_of = keep_routes.then_some(endpoint.ip());
    let refresher = tokio::spawn(refresh_loop(
        on,
        uuid,
        shared,
        Some(tx),
        || (0, 0),
        routes_of,
        key.clone(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let runtime = tokio::runtime::Handle::current();
    let stopped = stop.clone();
    let gate = Gate::new(key.clone(), Receiver::Mn);
    let thread = std::thread::Builder::new()
        .name(format!("strata-mn-{slot}"))
        .spawn(move || mn_loop(sock, core, gate, rx, on, runtime, &stopped))
        .map_err(|e| Error::io("starting the metadata node's thread", e))?;
    Ok(MnHandle {
        endpoint,
        slot,
        stop,
        thread: Some(thread),
        refresher,
    })
}

/// The metadata node's loop: a datagram in, its answers out; a tick every
/// [`MN_TICK`]; table changes and copy reports between datagrams.
fn mn_loop(
    sock: std::net::UdpSocket,
    mut core: MnCore<SocketAddr>,
    mut gate: Gate,
    mut tables: watch::Receiver<Table>,
    on: SocketAddr,
    runtime: tokio::runtime::Handle,
    stop: &AtomicBool,
) {
    let start = Instant::now();
    let now = || start.elapsed().as_millis() as u64;
    let mut batch = crate::mmsg::RecvBatch::new(MAX_DATAGRAM + 1);
    let mut outgoing: Vec<(Vec<u8>, SocketAddr)> = Vec::new();
    let mut next_tick = Instant::now() + MN_TICK;
    let (copies, copied) = std::sync::mpsc::channel::<CopyReport>();
    while !stop.load(Ordering::Relaxed) {
        // A timeout (no datagram for a tick) or an ICMP error from an
        // earlier send leaves nothing to handle.
        let received = batch.recv(&sock).unwrap_or(0);
        let mut outs = Vec::new();
        for i in 0..received {
            let Some((r, bytes)) = batch.get(i) else {
                continue;
            };
            let wall = crate::auth::unix_ms();
            outs.extend(mn_receive(
                &mut core,
                &mut gate,
                wall,
                now(),
                r.from,
                r.to,
                bytes,
            ));
        }
        if Instant::now() >= next_tick {
            next_tick = Instant::now() + MN_TICK;
            // Outputs not answering a request are sealed.
            outs.extend(core.tick(now()).into_iter().map(|o| (o, true)));
            while let Ok(done) = copied.try_recv() {
                let outs_done =
                    core.copy_done(now(), &done.name, done.version, done.targets, done.result);
                outs.extend(outs_done.into_iter().map(|o| (o, true)));
            }
            match tables.has_changed() {
                Ok(true) => {
                    // Epochs only go up (across orchestrator restarts
                    // too): an older table is one fetched before the
                    // table an orchestrator's answer gave the node.
                    let t = tables.borrow_and_update().clone();
                    if t.epoch > core.table().epoch {
                        core.set_table(t);
                    }
                }
                Ok(false) => {}
                Err(_) => return,
            }
        }
        let wall = crate::auth::unix_ms();
        for (out, seal) in outs {
            let key = seal.then_some(gate.key());
            let table = core.table();
            let work = Work {
                key: gate.key(),
                copies: &copies,
                runtime: &runtime,
            };
            dispatch(table, out, key, wall, &mut outgoing, &work, on);
        }
        crate::mmsg::send_batch(&sock, &outgoing);
        outgoing.clear();
    }
}

/// The refusal of a request that arrived at one metadata address but
/// names another. In routed mode the address a datagram was sent to is the
/// one the routes delivered it for, so it must be the one the request
/// names (as storage nodes check the address a connection was made to).
/// Replies between nodes (`Done`, `Error`) and datagrams sent to a node's
/// own address are not checked.
fn misaddressed(table: &Table, to: Option<Ipv6Addr>, msg: &Msg) -> Option<Msg> {
    let to = u128::from(to?);
    if !table.routed
        || table.layout.mg_of(to).is_none()
        || to == msg.target
        || matches!(msg.body, Body::Done { .. } | Body::Error { .. })
    {
        return None;
    }
    Some(msg.error(
        Code::WrongAddress,
        format!(
            "datagram sent to metadata address {} but the request names {}",
            crate::addr::fmt_addr(to),
            crate::addr::fmt_addr(msg.target)
        ),
    ))
}

/// Asks the kernel for the destination address of every datagram on an
/// IPv6 socket (a no-op on IPv4, where mapped mode needs no check).
fn want_destinations(sock: &std::net::UdpSocket) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    if !sock.local_addr()?.is_ipv6() {
        return Ok(());
    }
    let on: libc::c_int = 1;
    // SAFETY: a valid socket and an int option value of the right size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVPKTINFO,
            std::ptr::addr_of!(on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// How a repair copy ended, sent back to the metadata node's loop.
struct CopyReport {
    name: String,
    version: u64,
    targets: Vec<crate::addr::Addr>,
    result: Result<u8, String>,
}

/// What a metadata node's runtime needs to start data-path work: the
/// cluster key (work on storage nodes is sealed with it, and tickets are
/// issued with it), where copies report, and the runtime to spawn on.
struct Work<'a> {
    key: &'a ClusterKey,
    copies: &'a std::sync::mpsc::Sender<CopyReport>,
    runtime: &'a tokio::runtime::Handle,
}

/// Carries out one of the core's outputs: datagrams go to `outgoing`
/// (sent together after the batch), sealed with `key` if given at `wall`;
/// a `PostPlan` or `Found` answer gets its ticket
/// ([`crate::auth::issue_ticket`]); copies and frees become tasks.
fn dispatch(
    table: &Table,
    out: Out<SocketAddr>,
    key: Option<&ClusterKey>,
    wall: u64,
    outgoing: &mut Vec<(Vec<u8>, SocketAddr)>,
    work: &Work,
    on: SocketAddr,
) {
    let (mut msg, to) = match out {
        // From the node's own socket: the answer comes back to the core.
        Out::ToOn(msg) => (msg, on),
        Out::Reply(to, msg) => (msg, to),
        Out::ToMeta(msg) => match table.mn_endpoint(msg.target) {
            Some(endpoint) => (msg, endpoint),
            None => return,
        },
        other => return spawn_work(table, other, work),
    };
    crate::auth::issue_ticket(&mut msg.body, work.key, wall);
    if let Ok(bytes) = crate::auth::encode(&msg, key, wall) {
        outgoing.push((bytes, to));
    }
}

/// Starts a core output that is work rather than a datagram: freeing a
/// replica or copying one for repair.
fn spawn_work(table: &Table, out: Out<SocketAddr>, work: &Work) {
    match out {
        Out::Free(addr) => {
            if let Some(endpoint) = table.sn_endpoint(addr) {
                let key = work.key.clone();
                work.runtime.spawn(async move {
                    let _ = crate::client::free_replica(endpoint, addr, &key).await;
                });
            }
        }
        Out::Copy {
            name,
            version,
            sources,
            targets,
            size,
            crc,
        } => {
            let table = table.clone();
            let report = work.copies.clone();
            let key = work.key.clone();
            work.runtime.spawn(async move {
                let result =
                    crate::client::copy_replica(&table, &key, &sources, &targets, size, crc)
                        .await
                        .map_err(|e| e.to_string());
                if let Err(e) = &result {
                    tracing::warn!("repair copy of {name:?} failed: {e}");
                }
                let _ = report.send(CopyReport {
                    name,
                    version,
                    targets,
                    result,
                });
            });
        }
        // Datagrams are sent by `dispatch`.
        Out::ToOn(_) | Out::Reply(..) | Out::ToMeta(_) => {}
    }
}

/// A running storage node.
pub struct SnHandle {
    /// Its TCP endpoint.
    pub endpoint: SocketAddr,
    /// Its prefix index.
    pub index: u16,
    /// Its persistent identity.
    pub uuid: u64,
    /// Ends once the orchestrator has retired the node and its replicas
    /// are freed ([`crate::sn::retire_watch`]).
    retire: tokio::task::JoinHandle<()>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl SnHandle {
    /// Waits until the orchestrator has retired this node (drained, then
    /// retired) and its replicas are freed: a process running only this
    /// node has nothing left to do.
    pub async fn retired(&mut self) {
        if (&mut self.retire).await.is_err() {
            // Cancelled or failed: never call that a retirement.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for SnHandle {
    fn drop(&mut self) {
        self.retire.abort();
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts a storage node stored in `dir` on `bind`, declaring `capacity`
/// bytes of `device`, member of the cluster whose orchestrator is `on`;
/// `gc` paces the collection of replicas no record names. With
/// `keep_routes`, a node of a routed cluster keeps its host's routes in
/// step with the table ([`crate::routes`]).
#[allow(clippy::too_many_arguments)]
pub async fn start_sn(
    dir: &Path,
    bind: SocketAddr,
    on: SocketAddr,
    capacity: u64,
    device: Device,
    gc: crate::sn::GcConfig,
    keep_routes: bool,
    key: &ClusterKey,
) -> Result<SnHandle, Error> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let uuid = node_uuid(dir)?;
    let at = bind_address(on, bind, key).await?;
    let listener = TcpListener::bind(at)
        .await
        .map_err(|e| Error::io(format!("binding {at}"), e))?;
    let endpoint = advertised(bind, listener.local_addr())?;
    // Count what is there before declaring free space.
    let probe = SnStore::open(dir, 0, on, capacity)?;
    let index = register(
        on,
        Body::Register {
            role: Role::Sn,
            uuid,
            endpoint,
            capacity,
            free: probe.free(),
            device: device as u8,
            keys: Some(key.fingerprints()),
        },
        key,
    )
    .await?;
    let store = Arc::new(SnStore::open(dir, index, on, capacity)?.with_key(key.clone()));
    let table = Arc::new(RwLock::new(fetch_table(on, Some(key)).await?));
    let stats_store = store.clone();
    let retire = tokio::spawn(crate::sn::retire_watch(store.clone(), table.clone(), uuid));
    let tasks = vec![
        tokio::spawn(crate::sn::gc_loop(store.clone(), table.clone(), gc)),
        tokio::spawn(crate::sn::serve(listener, store, table.clone())),
        tokio::spawn(refresh_loop(
            on,
            uuid,
            table,
            None,
            move || (stats_store.free(), stats_store.objects()),
            keep_routes.then_some(endpoint.ip()),
            key.clone(),
        )),
    ];
    Ok(SnHandle {
        endpoint,
        index,
        uuid,
        retire,
        tasks,
    })
}

//! Metadata nodes on their UDP sockets: the threads that serve every
//! metadata node of a process, each datagram through the gate then the
//! core ([`crate::metadata::state::MnCore`]), and the work the core hands
//! out (replica copies and frees) spawned on the runtime.

use crate::metadata::state::{MnCore, Out, RepairStats};
use crate::metadata::work::{CopyReport, Work};
use crate::runtime::{advertised, bind_address, nanos, node_uuid, refresh_loop, register};
use std::net::{Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use strata_store_client::transport::fetch_table;
use strata_store_protocol::auth::{within, ClusterKey, Gate, Receiver, Verdict};
use strata_store_protocol::table::Table;
use strata_store_protocol::wire::{Body, Code, Msg, Role, MAX_DATAGRAM};
use strata_store_protocol::Error;
use tokio::sync::watch;

mod local;
pub use local::LocalMetadataNodes;

/// Handles one datagram at a metadata node, received at wall-clock time
/// `wall` and core time `now` from `from`, sent to `to` (routed mode): the
/// gate first, then the core. Each output comes with whether to seal it:
/// everything but the direct answer to an unsealed (tenant's) request,
/// so that a zero-byte Get and its answer pay for no HMAC. The direct
/// answer to a tenant's `GetLinkProof` gets its link proof for that
/// tenant here ([`strata_store_protocol::auth::issue_link_proof`]): only the gate knows
/// who asked. A refusal of an unauthenticated datagram is no longer than
/// the datagram ([`within`]).
pub fn mn_receive<P: Copy + Eq + std::hash::Hash>(
    core: &mut MnCore<P>,
    gate: &mut Gate,
    wall: u64,
    now: u64,
    from: P,
    to: Option<Ipv6Addr>,
    bytes: &[u8],
) -> Vec<(Out<P>, bool)> {
    mn_receive_with(core, gate, wall, now, from, to, bytes, &mut |_, _| true)
}

/// A request handled in a round of a metadata node: told the error if
/// the round's group commit fails ([`failed_round`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Waiter<P> {
    from: P,
    req: u64,
    target: strata_store_protocol::addr::Addr,
    /// Whether its answer is sealed (as a direct answer: when the
    /// request came sealed).
    seal: bool,
}

/// [`mn_receive`], calling `before` with each admitted request and its
/// body before the core handles it: the serving thread lets the lead go
/// before any request but a Get (it may commit to the database, and the
/// round then waits for a disk flush), and counts the request a waiter
/// of the round's group commit. A request `before` answers `false` for
/// is not handled, and nothing is sent for it.
#[allow(clippy::too_many_arguments)]
fn mn_receive_with<P: Copy + Eq + std::hash::Hash>(
    core: &mut MnCore<P>,
    gate: &mut Gate,
    wall: u64,
    now: u64,
    from: P,
    to: Option<Ipv6Addr>,
    bytes: &[u8],
    before: &mut dyn FnMut(Waiter<P>, &Body) -> bool,
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
        Verdict::Refuse(reply) => {
            return within(reply, bytes.len())
                .map(|reply| (Out::Reply(from, reply), false))
                .into_iter()
                .collect();
        }
        Verdict::Deny(reply) => return vec![(Out::Reply(from, reply), false)],
        Verdict::Drop => return Vec::new(),
    };
    if let Some(refusal) = misaddressed(core.table(), to, &msg) {
        return vec![(Out::Reply(from, refusal), sealed)];
    }
    let req = msg.req;
    let waiter = Waiter {
        from,
        req,
        target: msg.target,
        seal: sealed,
    };
    if !before(waiter, &msg.body) {
        return Vec::new();
    }
    let outs = core.handle(now, from, msg);
    debug_check(core, "a message");
    outs.into_iter()
        .map(|mut out| {
            let direct = matches!(&out, Out::Reply(p, m) if *p == from && m.req == req);
            if let (true, Some(tenant), Out::Reply(_, m)) = (direct, &tenant, &mut out) {
                // The ticket names the tenant: storage nodes schedule by it.
                let target = m.target;
                strata_store_protocol::auth::issue_ticket(
                    &mut m.body,
                    target,
                    tenant,
                    gate.key(),
                    wall,
                );
                strata_store_protocol::auth::issue_link_proof(
                    &mut m.body,
                    gate.key(),
                    tenant,
                    wall,
                );
            }
            let seal = sealed || !direct;
            (out, seal)
        })
        .collect()
}

/// Datagrams one round of a metadata node takes at most before its group
/// commit: the writes they make share one disk flush.
const GROUP_DATAGRAMS: usize = 4 * crate::mmsg::BATCH;
/// Bytes of datagrams one round takes at most (each receive may bring
/// [`crate::mmsg::BATCH`] datagrams of up to [`MAX_DATAGRAM`] bytes).
const GROUP_BYTES: usize = 4 << 20;
const _: () = assert!(GROUP_DATAGRAMS >= crate::mmsg::BATCH);
const _: () = assert!(GROUP_BYTES >= crate::mmsg::BATCH * (MAX_DATAGRAM + 1));

/// Whether a round that took `datagrams` of `bytes` in all, the last
/// receive a full batch, may receive once more within the group's bounds
/// ([`GROUP_DATAGRAMS`], [`GROUP_BYTES`]), whatever that receive brings.
fn group_has_room(datagrams: usize, bytes: usize) -> bool {
    datagrams + crate::mmsg::BATCH <= GROUP_DATAGRAMS
        && bytes + crate::mmsg::BATCH * (MAX_DATAGRAM + 1) <= GROUP_BYTES
}

/// Takes a round's datagrams from `sock`: one receive, then more while
/// the last one filled the batch (more were waiting: they arrived while
/// the previous group commit ran) and the group has room
/// ([`group_has_room`]); `handle` gets each. Returns how many came.
fn take_group(
    sock: &std::net::UdpSocket,
    batch: &mut crate::mmsg::RecvBatch,
    handle: &mut dyn FnMut(crate::mmsg::Received, &[u8]),
) -> usize {
    let (mut datagrams, mut bytes) = (0, 0);
    loop {
        // Nothing (a spurious wake-up) or an ICMP error from an earlier
        // send ends the round.
        let got = batch.recv(sock).unwrap_or(0);
        for i in 0..got {
            let Some((r, data)) = batch.get(i) else {
                continue;
            };
            bytes += data.len();
            handle(r, data);
        }
        datagrams += got;
        if got < crate::mmsg::BATCH || !group_has_room(datagrams, bytes) {
            return datagrams;
        }
    }
}

/// The answers of a round whose group commit failed (`why`): the writes
/// may be lost, so no answer that depends on them may leave. Every
/// request of the round (`waiters`) and every peer an answer was for is
/// told the error once instead; nothing else is sent (no replication, no
/// freeing of replicas an unflushed record replaced, no copy).
fn failed_round<P: Copy + Eq + std::hash::Hash>(
    outs: Vec<(Out<P>, bool)>,
    waiters: &[Waiter<P>],
    why: &str,
) -> Vec<(Out<P>, bool)> {
    let mut told = std::collections::HashSet::new();
    let mut errors = Vec::new();
    let answers = outs.into_iter().filter_map(|(out, seal)| match out {
        Out::Reply(to, m) => Some(Waiter {
            from: to,
            req: m.req,
            target: m.target,
            seal,
        }),
        _ => None,
    });
    for w in waiters.iter().copied().chain(answers) {
        if told.insert((w.from, w.req)) {
            let msg = Msg::new(
                w.req,
                w.target,
                Body::Error {
                    code: Code::Unavailable,
                    message: format!(
                        "the metadata node could not make its writes durable ({why}); \
                     nothing of this request is acknowledged: retry on another node \
                     once it is repaired or restarted"
                    ),
                },
            );
            errors.push((Out::Reply(w.from, msg), w.seal));
        }
    }
    errors
}

/// In builds with debug assertions (the tests' build, `scripts/cargo-checked`), stops
/// the node at the first broken invariant of its core, naming it.
fn debug_check<P: Clone + Eq + std::hash::Hash>(core: &MnCore<P>, after: &str) {
    if cfg!(debug_assertions) {
        if let Err(e) = core.check_invariants() {
            panic!("metadata node after {after}: {e}");
        }
    }
}

/// A running metadata node.
pub struct MnHandle {
    /// Its UDP endpoint.
    pub endpoint: SocketAddr,
    /// Its slot.
    pub slot: u16,
    stop: Arc<AtomicBool>,
    /// Disconnected once the serving thread has dropped the node (and
    /// with it the node's socket).
    gone: std::sync::mpsc::Receiver<()>,
    refresher: tokio::task::JoinHandle<()>,
    /// The node's repair counters, as its serving thread last published
    /// them.
    repair: Arc<std::sync::Mutex<RepairStats>>,
    /// The node, for direct calls from this process
    /// ([`LocalMetadataNodes`]). Weak: the handle's drop waits until the
    /// serving thread has dropped the node.
    local: std::sync::Weak<Slot>,
    /// Keeps the serving thread alive while the node runs.
    _server: MnServer,
}

impl MnHandle {
    /// Where the node publishes its repair counters (after each tick),
    /// for `/metrics`.
    pub fn repair_stats(&self) -> Arc<std::sync::Mutex<RepairStats>> {
        self.repair.clone()
    }
}

impl Drop for MnHandle {
    fn drop(&mut self) {
        self.refresher.abort();
        self.stop.store(true, Ordering::Relaxed);
        // The serving thread notices within one tick; waiting for it frees
        // the socket, so a node restarted in the same process can bind its
        // port again. A thread that ended (or panicked) has dropped every
        // node it held, which also ends the wait.
        let _ = self.gone.recv();
    }
}

/// How often the metadata node's state machine gets a tick (repair steps,
/// resends) and checks for a new table or a stop request.
const MN_TICK: Duration = Duration::from_millis(20);

/// The threads that serve metadata nodes: every node of a process started
/// on the same `MnServer` shares them ([`start_mn_on`]).
///
/// There is one thread per node, but at any time only one of them, the
/// leader, waits for datagrams, on every node's socket at once, and serves
/// the reads it finds itself; the others sleep until the leader hands its
/// role over. A zero-byte Get costs a node little more than the kernel's
/// work to wake a sleeping thread, deliver the datagram and answer it: with
/// a thread per socket, a client's batch of requests to three nodes woke
/// three threads, and their answers came back in three sends that woke the
/// client up to three times. The leader takes whatever waits on any socket
/// after one wake-up and answers it straight away.
///
/// Before it handles anything that may commit to a node's database (any
/// request but a Get, a tick), the leader hands the role to a sleeping
/// thread: a commit waits for its disk flush, and the other nodes must not
/// wait with it (Posts to three nodes flush in parallel, as with a thread
/// per node). A node is served by one thread at a time; the nodes stay
/// separate state machines with separate sockets and databases.
#[derive(Clone)]
pub struct MnServer {
    add: std::sync::mpsc::Sender<Arc<Slot>>,
    shared: Arc<Pool>,
}

/// What an [`MnServer`]'s threads share.
struct Pool {
    /// Held by the leader; the other threads sleep on it.
    lead: std::sync::Mutex<Lead>,
    /// Threads started and not yet ended.
    threads: std::sync::atomic::AtomicUsize,
    /// Written when a node comes back from a thread that served it without
    /// the lead, so that the leader polls its socket again.
    wake: std::os::fd::OwnedFd,
}

/// The leader's state.
struct Lead {
    nodes: Vec<Arc<Slot>>,
    added: std::sync::mpsc::Receiver<Arc<Slot>>,
    /// No node will be added any more (every sender is gone).
    closed: bool,
    fds: Vec<libc::pollfd>,
    /// When the last round that served datagrams ended.
    served: Instant,
    /// Until when the leader polls without sleeping ([`MN_SPIN`]).
    spin_until: Option<Instant>,
}

/// How long the leader keeps polling its sockets without sleeping after
/// serving datagrams, when the previous request came within that time.
///
/// Under a steady stream of requests the next one is usually a few
/// microseconds away (the client's turnaround), and a thread that sleeps
/// in between pays a wake-up (scheduler, context switch) for every few
/// requests: that was a large part of a zero-byte Get's cost. The leader
/// spins only while the gaps between rounds stay shorter than this, so a
/// quiet or lightly loaded node sleeps as before (after at most one
/// spin), and it yields the CPU between polls so that a client sharing
/// the core can run.
const MN_SPIN: Duration = Duration::from_micros(50);

/// One node in an [`MnServer`].
struct Slot {
    /// Its socket's descriptor, for the leader's poll (the socket itself
    /// is in `node`, which only the thread serving it holds).
    fd: std::os::fd::RawFd,
    /// A thread is serving the node (the leader leaves it out of its poll).
    busy: AtomicBool,
    /// Set by the handle, or when the node's table refresher is gone.
    stop: Arc<AtomicBool>,
    node: std::sync::Mutex<Served>,
}

impl MnServer {
    /// A server with no node and no thread yet: each node started on it
    /// adds one thread. Its threads end once every clone of the server
    /// and every node started on it is dropped.
    pub fn new() -> Result<MnServer, Error> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a
        // new descriptor that only this OwnedFd closes.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(Error::io(
                "creating the metadata nodes' wake-up descriptor",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        let wake = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let (add, added) = std::sync::mpsc::channel();
        Ok(MnServer {
            add,
            shared: Arc::new(Pool {
                lead: std::sync::Mutex::new(Lead {
                    nodes: Vec::new(),
                    added,
                    closed: false,
                    fds: Vec::new(),
                    served: Instant::now(),
                    spin_until: None,
                }),
                threads: std::sync::atomic::AtomicUsize::new(0),
                wake,
            }),
        })
    }

    /// Adds `node` and a thread to serve it.
    fn add(&self, slot: Arc<Slot>, name: String) -> Result<(), Error> {
        self.add.send(slot).map_err(|_| Error::Task {
            context: "adding a metadata node: the metadata nodes' threads have ended".into(),
            source: None,
        })?;
        let pool = self.shared.clone();
        pool.threads.fetch_add(1, Ordering::SeqCst);
        // Interrupts the leader's poll, so that it polls the new socket too.
        pool.notify();
        let counted = self.shared.clone();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || serve_mns(&pool))
            .map(|_| ())
            .map_err(|e| {
                counted.threads.fetch_sub(1, Ordering::SeqCst);
                Error::io("starting a metadata node's thread", e)
            })
    }
}

impl Pool {
    /// Wakes the leader from its poll.
    fn notify(&self) {
        use std::os::fd::AsRawFd;
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd. A full
        // counter (EAGAIN) already means "wake up".
        let _ = unsafe { libc::write(self.wake.as_raw_fd(), std::ptr::addr_of!(one).cast(), 8) };
    }

    /// Resets the wake-up counter after the leader saw it.
    fn drain(&self) {
        use std::os::fd::AsRawFd;
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our eventfd.
        let _ = unsafe { libc::read(self.wake.as_raw_fd(), std::ptr::addr_of_mut!(v).cast(), 8) };
    }
}

/// One metadata node as its serving thread holds it.
struct Served {
    // Dropped first: the socket is closed before `_gone` tells the handle.
    sock: std::net::UdpSocket,
    core: MnCore<SocketAddr>,
    gate: Gate,
    tables: watch::Receiver<Table>,
    on: SocketAddr,
    runtime: tokio::runtime::Handle,
    start: Instant,
    next_tick: Instant,
    copies: std::sync::mpsc::Sender<CopyReport>,
    copied: std::sync::mpsc::Receiver<CopyReport>,
    /// Where the repair counters are published ([`MnHandle::repair_stats`]).
    repair: Arc<std::sync::Mutex<RepairStats>>,
    /// Why the node's group commit failed: from then on it answers
    /// nothing (its writes may not be durable) until it is restarted.
    failed: Option<String>,
    /// Set with `failed`: the refresher then stops the heartbeats, and
    /// the orchestrator fails the node over.
    fenced: Arc<AtomicBool>,
    _gone: std::sync::mpsc::Sender<()>,
}

/// Starts a metadata node stored in `dir`, listening on `bind`, member of
/// the cluster whose orchestrator is `on`, with a serving thread of its
/// own (see [`start_mn_on`]).
pub async fn start_mn(
    dir: &Path,
    bind: SocketAddr,
    on: SocketAddr,
    keep_routes: bool,
    key: &ClusterKey,
    sync_ms: u64,
) -> Result<MnHandle, Error> {
    start_mn_on(&MnServer::new()?, dir, bind, on, keep_routes, key, sync_ms).await
}

/// Starts a metadata node stored in `dir`, listening on `bind`, member of
/// the cluster whose orchestrator is `on`, served by `server`'s threads.
///
/// The node is served from plain threads with a non-blocking socket
/// (`poll`, then `recvmmsg` of whatever waits), not a tokio task: a
/// metadata request is one datagram in and one out, and the readiness
/// polling and task wake-ups of an async socket were most of the cost of
/// a zero-byte Get. Copies and frees still run as tasks on the caller's
/// runtime.
///
/// With `keep_routes`, a node of a routed cluster keeps its host's routes
/// in step with the table ([`crate::routes`]). `sync_ms` is the pause
/// between two anti-entropy passes over the metadata copies of the names
/// the node coordinates (0: none; see [`MnCore::set_sync_interval`]).
pub async fn start_mn_on(
    server: &MnServer,
    dir: &Path,
    bind: SocketAddr,
    on: SocketAddr,
    keep_routes: bool,
    key: &ClusterKey,
    sync_ms: u64,
) -> Result<MnHandle, Error> {
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let uuid = node_uuid(dir)?;
    let db = crate::metadata::database::MetaDb::open(&dir.join("meta.redb"))?;
    // Writes share disk flushes: each round of the serving thread ends
    // with one durable commit before its answers leave (`serve_node`).
    db.set_grouped(true)?;
    let at = bind_address(on, bind, key).await?;
    let sock = std::net::UdpSocket::bind(at).map_err(|e| Error::io(format!("binding {at}"), e))?;
    sock.set_nonblocking(true)
        .map_err(|e| Error::io(format!("making {at} non-blocking"), e))?;
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
    let fenced = Arc::new(AtomicBool::new(false));
    let heartbeat_fenced = fenced.clone();
    let refresher = tokio::spawn(refresh_loop(
        on,
        uuid,
        shared,
        Some(tx),
        move || (!heartbeat_fenced.load(Ordering::Relaxed)).then_some((0, 0)),
        routes_of,
        key.clone(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let (gone_tx, gone) = std::sync::mpsc::channel();
    let (copies, copied) = std::sync::mpsc::channel();
    let start = Instant::now();
    let fd = sock.as_raw_fd();
    let repair = Arc::new(std::sync::Mutex::new(core.repair_stats()));
    let node = Served {
        sock,
        core,
        gate: Gate::new(key.clone(), Receiver::Mn),
        tables: rx,
        on,
        runtime: tokio::runtime::Handle::current(),
        start,
        next_tick: start + MN_TICK,
        copies,
        copied,
        repair: repair.clone(),
        failed: None,
        fenced,
        _gone: gone_tx,
    };
    let served = Arc::new(Slot {
        fd,
        busy: AtomicBool::new(false),
        stop: stop.clone(),
        node: std::sync::Mutex::new(node),
    });
    let local = Arc::downgrade(&served);
    let added = server.add(served, format!("strata-mn-{slot}"));
    if let Err(e) = added {
        refresher.abort();
        return Err(e);
    }
    Ok(MnHandle {
        endpoint,
        slot,
        stop,
        gone,
        refresher,
        repair,
        local,
        _server: server.clone(),
    })
}

/// A serving thread of an [`MnServer`]. As leader (holding `pool.lead`)
/// it waits until a socket of a node no other thread serves is readable,
/// or a tick is due, then serves what waits node by node; it takes new
/// nodes and drops stopped ones between rounds. It ends when there are
/// more threads than nodes, or no node is left and none can be added.
fn serve_mns(pool: &Pool) {
    use std::os::fd::AsRawFd;
    use std::sync::mpsc::TryRecvError;
    let mut batch = crate::mmsg::RecvBatch::new(MAX_DATAGRAM + 1);
    let mut outgoing: Vec<(Vec<u8>, SocketAddr)> = Vec::new();
    'follow: loop {
        let mut lead = Some(pool.lead.lock().unwrap_or_else(|e| e.into_inner()));
        loop {
            let Some(guard) = lead.as_mut() else {
                continue 'follow;
            };
            // Through the guard once, so that fields borrow apart.
            let l: &mut Lead = guard;
            while !l.closed {
                match l.added.try_recv() {
                    Ok(node) => l.nodes.push(node),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => l.closed = true,
                }
            }
            // A stopped node is dropped (its socket closed, its handle
            // released) by whichever thread lets its last reference go.
            l.nodes.retain(|n| !n.stop.load(Ordering::Relaxed));
            let threads = pool.threads.load(Ordering::SeqCst);
            if (l.closed && l.nodes.is_empty()) || threads > l.nodes.len().max(1) {
                pool.threads.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            let now = Instant::now();
            let mut wait = MN_TICK;
            l.fds.clear();
            for n in &l.nodes {
                if n.busy.load(Ordering::Acquire) {
                    l.fds.push(libc::pollfd {
                        fd: -1, // ignored by poll: another thread serves it
                        events: 0,
                        revents: 0,
                    });
                    continue;
                }
                if let Ok(node) = n.node.try_lock() {
                    wait = wait.min(node.next_tick.saturating_duration_since(now));
                }
                l.fds.push(libc::pollfd {
                    fd: n.fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            l.fds.push(libc::pollfd {
                fd: pool.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            let spinning = l.spin_until.is_some_and(|until| now < until);
            // Rounded up: a zero timeout would spin until the tick is due.
            let ms = if spinning {
                0
            } else {
                wait.as_micros().div_ceil(1000) as libc::c_int
            };
            // SAFETY: `fds` holds `fds.len()` initialised pollfds, alive
            // for the call.
            let ready = unsafe { libc::poll(l.fds.as_mut_ptr(), l.fds.len() as libc::nfds_t, ms) };
            if ready < 0 {
                continue; // EINTR: look again
            }
            if ready == 0 && spinning {
                // SAFETY: no arguments; lets a thread waiting for this
                // CPU (the client, on a small machine) run first.
                unsafe { libc::sched_yield() };
                continue;
            }
            // Spin after this round only if the datagrams came soon after
            // the previous round: the stream is steady.
            let steady = ready > 0 && l.served.elapsed() <= MN_SPIN;
            if l.fds.last().is_some_and(|f| f.revents != 0) {
                pool.drain();
            }
            let round: Vec<(Arc<Slot>, bool)> = l
                .nodes
                .iter()
                .zip(&l.fds)
                .filter(|(n, _)| !n.busy.load(Ordering::Acquire))
                .map(|(n, f)| (n.clone(), f.fd >= 0 && f.revents != 0))
                .collect();
            l.spin_until = None;
            let mut served = 0;
            for (slot, readable) in round {
                if slot.busy.swap(true, Ordering::AcqRel) {
                    continue;
                }
                {
                    let mut node = slot.node.lock().unwrap_or_else(|e| e.into_inner());
                    served += serve_node(
                        &mut node,
                        &slot.stop,
                        readable,
                        &mut batch,
                        &mut outgoing,
                        &mut lead,
                    );
                }
                slot.busy.store(false, Ordering::Release);
                if lead.is_none() {
                    // Served without the lead: the leader left this node
                    // out of its poll; have it look again.
                    pool.notify();
                    continue 'follow;
                }
            }
            if let (Some(l), true) = (lead.as_mut(), served > 0) {
                let end = Instant::now();
                l.served = end;
                l.spin_until = steady.then_some(end + MN_SPIN);
            }
        }
    }
}

/// One round of one node: the datagrams waiting in its socket (when
/// `readable`, up to a group's bounds: [`take_group`]), a tick when due
/// (with copy reports and a new table), one group commit making every
/// write of the round durable, and then the answers sent together. The
/// lead (when held) is let go before anything that may wait for the
/// disk. A node whose group commit failed is fenced: it answers the
/// round's requests with the error, and nothing after. Returns how many
/// datagrams came.
fn serve_node(
    node: &mut Served,
    stop: &AtomicBool,
    readable: bool,
    batch: &mut crate::mmsg::RecvBatch,
    outgoing: &mut Vec<(Vec<u8>, SocketAddr)>,
    lead: &mut Option<std::sync::MutexGuard<'_, Lead>>,
) -> usize {
    let start = node.start;
    let now = || start.elapsed().as_millis() as u64;
    let mut outs = Vec::new();
    let mut waiters = Vec::new();
    let mut received = 0;
    if let Some(why) = &node.failed {
        // Fenced: nothing this node answers could be trusted durable.
        if readable {
            let dropped = take_group(&node.sock, batch, &mut |_, _| {});
            tracing::debug!("dropped {dropped} datagrams: the node is fenced ({why})");
        }
        return 0;
    }
    // Answers that depend on no write waiting for the group commit leave
    // before it (see `answers_early`).
    let mut early = Vec::new();
    if readable {
        let core = &mut node.core;
        let gate = &mut node.gate;
        received = take_group(&node.sock, batch, &mut |r, bytes| {
            let wall = strata_store_protocol::auth::unix_ms();
            let (writes, clean) = (core.db().writes(), !core.db().has_unflushed());
            let (mut waiter, mut plan) = (None, false);
            let handled = mn_receive_with(
                core,
                gate,
                wall,
                now(),
                r.from,
                r.to,
                bytes,
                &mut |w, body| {
                    waiter = Some(w);
                    plan = matches!(body, Body::PostBegin { .. });
                    if !matches!(body, Body::Get { .. }) {
                        drop(lead.take());
                    }
                    true
                },
            );
            let wrote = core.db().writes() != writes;
            if answers_early(wrote, clean, plan) {
                early.extend(handled);
            } else {
                waiters.extend(waiter);
                outs.extend(handled);
            }
        });
    }
    send_outs(node, early, outgoing);
    if Instant::now() >= node.next_tick {
        // Ticks run repairs, anti-entropy and table changes, which commit.
        drop(lead.take());
        node.next_tick = Instant::now() + MN_TICK;
        // Outputs not answering a request are sealed.
        outs.extend(node.core.tick(now()).into_iter().map(|o| (o, true)));
        debug_check(&node.core, "a tick");
        while let Ok(done) = node.copied.try_recv() {
            let outs_done =
                node.core
                    .copy_done(now(), &done.name, done.version, done.targets, done.result);
            outs.extend(outs_done.into_iter().map(|o| (o, true)));
        }
        *node.repair.lock().unwrap_or_else(|e| e.into_inner()) = node.core.repair_stats();
        match node.tables.has_changed() {
            Ok(true) => {
                // Epochs only go up (across orchestrator restarts
                // too): an older table is one fetched before the
                // table an orchestrator's answer gave the node.
                let t = node.tables.borrow_and_update().clone();
                if t.epoch > node.core.table().epoch {
                    node.core.set_table(t);
                    debug_check(&node.core, "a new table");
                }
            }
            Ok(false) => {}
            // The refresher is gone: the handle is being dropped.
            Err(_) => stop.store(true, Ordering::Relaxed),
        }
    }
    if node.core.db().has_unflushed() {
        drop(lead.take());
    }
    let outs = group_commit(node, outs, &waiters);
    send_outs(node, outs, outgoing);
    received
}

/// The group commit of a round whose answers are `outs` and whose
/// requests are `waiters`: every write of the round becomes durable with
/// one disk flush before any answer leaves. If the flush fails, the node
/// is fenced, and the answers become the error ([`failed_round`]).
fn group_commit(
    node: &mut Served,
    outs: Vec<(Out<SocketAddr>, bool)>,
    waiters: &[Waiter<SocketAddr>],
) -> Vec<(Out<SocketAddr>, bool)> {
    if !node.core.db().has_unflushed() {
        return outs;
    }
    match node.core.db().flush() {
        Ok(()) => outs,
        Err(e) => {
            let why = e.report().to_string();
            tracing::error!(
                "metadata node fenced: its group commit failed ({why}); it answers nothing \
                 until it is restarted"
            );
            node.failed = Some(why.clone());
            node.fenced.store(true, Ordering::Relaxed);
            failed_round(outs, waiters, &why)
        }
    }
}

/// Whether the answers to a request may leave before the round's group
/// commit: it `wrote` nothing, and either nothing was waiting for the
/// commit when it was handled (`clean`: all it read is durable), or it is
/// a Post's begin (`plan`), whose plan reveals no stored row, only the
/// next version and fresh replica addresses, and is void if this node
/// crashes before the commit (its name lock goes with it).
fn answers_early(wrote: bool, clean: bool, plan: bool) -> bool {
    !wrote && (clean || plan)
}

/// Sends `outs` from the node's socket (datagrams together, work
/// spawned).
fn send_outs(
    node: &Served,
    outs: Vec<(Out<SocketAddr>, bool)>,
    outgoing: &mut Vec<(Vec<u8>, SocketAddr)>,
) {
    if outs.is_empty() {
        return;
    }
    encode_outs(node, outs, outgoing);
    crate::mmsg::send_batch(&node.sock, outgoing);
    outgoing.clear();
}

/// Carries out `outs` ([`dispatch`]): their datagrams go to `outgoing`,
/// work is spawned.
fn encode_outs(
    node: &Served,
    outs: Vec<(Out<SocketAddr>, bool)>,
    outgoing: &mut Vec<(Vec<u8>, SocketAddr)>,
) {
    let wall = strata_store_protocol::auth::unix_ms();
    for (out, seal) in outs {
        let key = seal.then_some(node.gate.key());
        let work = Work {
            key: node.gate.key(),
            copies: &node.copies,
            runtime: &node.runtime,
        };
        dispatch(node.core.table(), out, key, wall, outgoing, &work, node.on);
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
            strata_store_protocol::addr::fmt_addr(to),
            strata_store_protocol::addr::fmt_addr(msg.target)
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

/// Carries out one of the core's outputs: datagrams go to `outgoing`
/// (sent together after the batch), sealed with `key` if given at `wall`;
/// a `PostPlan` or `Found` answer gets its ticket
/// ([`strata_store_protocol::auth::issue_ticket`]); copies and frees become tasks.
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
        other => return super::work::spawn_work(table, other, work),
    };
    // A tenant's direct answer got its ticket in `mn_receive`; the
    // others (answers to nodes) are issued to no tenant.
    strata_store_protocol::auth::issue_ticket(&mut msg.body, msg.target, "", work.key, wall);
    if let Ok(bytes) = strata_store_protocol::auth::encode(&msg, key, wall) {
        outgoing.push((bytes, to));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_store_protocol::auth::KEY_LEN;

    /// A metadata node's core and gate (of cluster key `key`), its
    /// database in `dir`, for a table of one node.
    fn node_in(dir: &Path, key: &ClusterKey) -> (MnCore<u32>, Gate) {
        let db = crate::metadata::database::MetaDb::open(&dir.join("m.redb")).unwrap();
        let layout = strata_store_protocol::addr::Layout::new(
            strata_store_protocol::addr::DEFAULT_CLUSTER_PREFIX,
            4,
        );
        let table = Table::new(layout, strata_store_protocol::table::Params::default());
        (
            MnCore::new(db, table, 0, 1),
            Gate::new(key.clone(), Receiver::Mn),
        )
    }

    /// Whether the core handling `msg` (sealed with `key`) was announced
    /// as a possible write.
    fn announced(key: &ClusterKey, sealed_with: &ClusterKey, body: Body) -> bool {
        let dir = tempfile::tempdir().unwrap();
        let (mut core, mut gate) = node_in(dir.path(), key);
        let wall = strata_store_protocol::auth::unix_ms();
        let bytes = Msg::new(1, 0, body).seal(sealed_with, wall).unwrap();
        let mut called = false;
        mn_receive_with(
            &mut core,
            &mut gate,
            wall,
            1,
            9,
            None,
            &bytes,
            &mut |_, body| {
                called |= !matches!(body, Body::Get { .. });
                true
            },
        );
        called
    }

    // The serving thread lets another thread lead before anything that
    // may wait for the disk: a write announced as a read would hold every
    // node of the process behind its flush.
    #[test]
    fn only_gets_are_served_without_handing_the_lead_over() {
        let key = ClusterKey::from_bytes(&[7; KEY_LEN]);
        let get = Body::Get { name: "a/b".into() };
        assert!(!announced(&key, &key, get.clone()));
        let delete = Body::Delete {
            name: "a/b".into(),
            if_version: 0,
            keep_data: false,
        };
        assert!(announced(&key, &key, delete.clone()));
        // A refused datagram never reaches the core.
        let other = ClusterKey::from_bytes(&[8; KEY_LEN]);
        assert!(!announced(&key, &other, delete));
    }

    // A direct call lets the core handle only Gets: a request that
    // `before` refuses gets no answer and changes nothing; let through,
    // the same request is answered.
    #[test]
    fn a_request_refused_before_the_core_is_neither_handled_nor_answered() {
        let key = ClusterKey::from_bytes(&[7; KEY_LEN]);
        let delete = Body::Delete {
            name: "a/b".into(),
            if_version: 0,
            keep_data: false,
        };
        for allowed in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let (mut core, mut gate) = node_in(dir.path(), &key);
            let wall = strata_store_protocol::auth::unix_ms();
            let bytes = Msg::new(1, 0, delete.clone()).seal(&key, wall).unwrap();
            let writes = core.db().writes();
            let outs = mn_receive_with(
                &mut core,
                &mut gate,
                wall,
                1,
                9,
                None,
                &bytes,
                &mut |_, _| allowed,
            );
            assert_eq!(!outs.is_empty(), allowed, "answers: {outs:?}");
            if !allowed {
                assert_eq!(core.db().writes(), writes, "a refused request wrote");
                assert!(!core.db().has_unflushed());
            }
        }
    }

    // A failed group commit may have lost every write of its round: each
    // request of the round, and each peer an answer was for, hears the
    // error, once; no answer, replication, free or copy leaves.
    #[test]
    fn a_failed_group_commit_answers_every_waiter_with_the_error_and_nothing_else() {
        let waiter = |from: u32, req: u64, seal: bool| Waiter {
            from,
            req,
            target: 77,
            seal,
        };
        // Three requests in the round: a commit answered Done, a commit
        // waiting for its metadata copies, and a Get answered unsealed.
        let waiters = [
            waiter(1, 10, false),
            waiter(2, 20, true),
            waiter(3, 30, false),
        ];
        let done = Body::Done { version: 4 };
        let outs: Vec<(Out<u32>, bool)> = vec![
            (Out::Reply(1, Msg::new(10, 77, done.clone())), false),
            (Out::ToMeta(Msg::new(5, 88, done.clone())), true),
            (Out::Free(0xabc), true),
            (Out::Reply(3, Msg::new(30, 77, done.clone())), false),
            // The answer to a request of an earlier round (a commit whose
            // copies acknowledged in this one).
            (Out::Reply(4, Msg::new(40, 77, done)), true),
        ];
        let errors = failed_round(outs, &waiters, "disk gone");
        let mut told: Vec<(u32, u64, bool)> = errors
            .iter()
            .map(|(out, seal)| match out {
                Out::Reply(to, m) => {
                    let Body::Error { code, message } = &m.body else {
                        panic!("not an error: {m:?}");
                    };
                    assert_eq!(*code, Code::Unavailable);
                    assert!(message.contains("disk gone"), "{message}");
                    assert_eq!(m.target, 77);
                    (*to, m.req, *seal)
                }
                other => panic!("sent after a failed group commit: {other:?}"),
            })
            .collect();
        told.sort();
        assert_eq!(
            told,
            [(1, 10, false), (2, 20, true), (3, 30, false), (4, 40, true)]
        );
    }

    // A round takes what waits in the socket up to the group's bound; the
    // rest waits for the next round (and its own group commit).
    #[test]
    fn a_round_takes_at_most_a_group_of_datagrams_and_leaves_the_rest() {
        let node = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        node.set_nonblocking(true).unwrap();
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let waiting = GROUP_DATAGRAMS + GROUP_DATAGRAMS / 2;
        for i in 0..waiting as u32 {
            client
                .send_to(&i.to_be_bytes(), node.local_addr().unwrap())
                .unwrap();
        }
        let mut batch = crate::mmsg::RecvBatch::new(MAX_DATAGRAM + 1);
        let mut seen = Vec::new();
        let mut take = |seen: &mut Vec<u32>| {
            take_group(&node, &mut batch, &mut |r, data| {
                assert_eq!(r.from, client.local_addr().unwrap());
                seen.push(u32::from_be_bytes(data.try_into().unwrap()));
            })
        };
        assert_eq!(take(&mut seen), GROUP_DATAGRAMS);
        assert_eq!(take(&mut seen), waiting - GROUP_DATAGRAMS);
        assert_eq!(take(&mut seen), 0);
        assert_eq!(seen, (0..waiting as u32).collect::<Vec<_>>());
        // The byte bound holds whatever a receive brings.
        assert!(group_has_room(0, 0));
        assert!(!group_has_room(
            0,
            GROUP_BYTES - crate::mmsg::BATCH * MAX_DATAGRAM
        ));
    }

    // A Get or any request handled with nothing waiting for the group
    // commit read only durable rows; a Post's begin reveals none. Anything
    // that wrote waits for the commit.
    #[test]
    fn only_answers_that_depend_on_no_unflushed_write_leave_before_the_group_commit() {
        // (wrote, clean, plan) -> early
        assert!(answers_early(false, true, false));
        assert!(answers_early(false, false, true));
        assert!(!answers_early(false, false, false));
        assert!(!answers_early(true, true, false));
        assert!(!answers_early(true, false, true));
    }
}

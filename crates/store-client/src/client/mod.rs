//! The client: metadata calls over UDP (as deterministic state machines,
//! [`Call`], so the simulation drives the same logic) and data over TCP.
//!
//! # A Get, step by step
//!
//! Each step hands its result to the next; none goes back:
//! 1. [`Client::get`] asks for the name's record: `look_up` checks the
//!    name (`wire::check_name`), takes its metadata addresses from the
//!    prefix table (`Table::meta_addrs`) and runs a [`Call`] over UDP
//!    ([`Client::run`]), which seals, sends and decodes the messages
//!    (`wire`). The answer is the record and a Get ticket.
//! 2. For each of the record's replicas, one table lookup
//!    (`Replica::locate`, `Table::sn_endpoint`) gives its endpoint,
//!    kept with the address in a `Replica`; the replica choice
//!    (`choice`, NAMI by default) orders them, and they are tried in
//!    turn.
//! 3. The client's idle connections to that endpoint give one
//!    (`Connections::take`), or the transport opens one
//!    (`transport::connect_data`).
//! 4. `read_replica` sends the Get frame with the ticket, and the
//!    data-frame code reads the status (`stream::read_status`) and the
//!    body, checked against the record (`stream::read_get_body`).
//! 5. The connection goes back to the idle ones under the same endpoint
//!    (`Connections::keep`).
//!
//! A Put goes the same way: the coordinator's plan (`PostBegin`), one
//! lookup for the first replica, a new connection, the body written by
//! `stream::write_put_body`, then `PostCommit` (or `PostAbort`).
//!
//! Modules, each using only those listed before it (and this one):
//! - `calls`: [`Call`] and [`Step`], with no I/O.
//! - `choice`: which replica a Get reads first (NAMI, primary, uniform),
//!   with no I/O.
//! - `local_metadata`: the process's own metadata nodes, asked for Gets
//!   by a direct call.
//! - `udp`: running calls over UDP ([`Client::run`], [`run_call`]), or
//!   a Get by a direct call to a node of this process.
//! - `replica`: a replica's endpoint, found once, and the idle data
//!   connections.
//! - `repair`: the metadata nodes' copy and free of replicas.
//! - `report`: telling a coordinator a replica failed its CRC.
//! - `nami`: the client's side of the choice: its setting, its view and
//!   the probes of idle nodes.
//! - `get`, `put`, `names` (delete and rename), `list`: the object calls.

mod calls;
pub mod choice;
mod get;
mod list;
pub mod local;
pub mod local_metadata;
mod names;
mod nami;
pub mod pinned;
mod put;
mod range;
mod range_ec;
mod repair;
mod replica;
mod report;
mod udp;

pub use self::calls::{Call, Step};
pub use self::choice::{NodeView, ReplicaChoice};
pub use self::get::Opened;
pub use self::names::RenameStep;
pub use self::put::PutResult;
pub use self::repair::{copy_replica, free_replica, rebuild_fragments};
pub use self::report::MAX_REPORTS;
pub use self::udp::{meta_over_ipv6, run_call};

use self::replica::Connections;
use crate::transport::fetch_table;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use strata_store_protocol::addr::Addr;
use strata_store_protocol::table::Table;
use strata_store_protocol::tenant::TenantCredential;
use strata_store_protocol::wire::{check_name, WireError};
use strata_store_protocol::Error;
use tokio::net::UdpSocket;

/// A client of one cluster.
pub struct Client {
    on: SocketAddr,
    table: RwLock<Arc<Table>>,
    /// Idle UDP sockets for metadata calls: a call takes one and gives it
    /// back, so a busy client does not bind a socket per request (a late
    /// reply to an earlier call is told apart by its request id). Each
    /// keeps its receive buffer: zeroing a fresh 64 KiB one took a tenth of
    /// a zero-byte Get's client time.
    sockets: Mutex<Vec<(UdpSocket, Vec<u8>)>>,
    /// Idle data connections by storage node endpoint.
    connections: Connections,
    /// The tenant's credential: every metadata request is sealed with it
    /// ([`strata_store_protocol::tenant`]).
    credential: TenantCredential,
    /// Bad-replica reports under way (at most [`MAX_REPORTS`]).
    reports: Arc<std::sync::atomic::AtomicUsize>,
    /// Which replica a Get reads first, and each node's latency estimate
    /// (shared with the task that probes idle nodes).
    choice: self::nami::SharedChoice,
    /// An erasure-coded Get's hedge delay, in microseconds
    /// ([`NO_HEDGE`]: none).
    hedge_micros: std::sync::atomic::AtomicU64,
    /// Largest erasure-coded object a Get asks the node of its fragment
    /// 0 for whole ([`Client::set_whole_object_reads`]).
    whole_object_max: std::sync::atomic::AtomicU64,
    /// Idle connections of erasure-coded Gets' fragment reads.
    fragment_pool: Arc<crate::erasure::StreamPool>,
    /// The replicas this process's own storage nodes hold, read from
    /// disk rather than over TCP ([`Client::set_local_replicas`]).
    local: std::sync::OnceLock<Arc<self::local::LocalDisk>>,
    /// This process's own metadata nodes, asked for Gets by a direct
    /// call rather than a datagram ([`Client::set_local_metadata`]).
    local_metadata: std::sync::OnceLock<Arc<dyn self::local_metadata::LocalMetadata>>,
}

/// By default a Get asks the node of fragment 0 for erasure-coded
/// objects of up to 8 MiB whole: what a storage node's default object
/// cache takes (an eighth of its 64 MiB).
pub const DEFAULT_WHOLE_OBJECT_READS: u64 = 8 << 20;

/// [`Client::set_hedge`] with no delay given: no hedged reads.
const NO_HEDGE: u64 = u64::MAX;

/// The default hedge delay of an erasure-coded Get: one more fragment is
/// asked for if the first stripe has not come within this.
pub const DEFAULT_HEDGE: std::time::Duration = std::time::Duration::from_millis(50);

/// Idle UDP sockets a client keeps.
const IDLE_SOCKETS: usize = 64;

const META_TIMEOUT_MS: u64 = 400;
/// How long a call is retried while the table moves under it (a metadata
/// group handed over between nodes, or given to a stand-in while its node
/// is down: each retry refreshes the table).
const MOVING_RETRY_MS: u64 = 20_000;
const META_ATTEMPTS: u32 = 5;
/// A commit waits for W_m acknowledgements: give it longer.
const COMMIT_ATTEMPTS: u32 = 20;

impl Client {
    /// Connects to the cluster whose orchestrator listens on `on`, as the
    /// tenant of `credential` (which seals every metadata request).
    pub async fn connect(on: SocketAddr, credential: TenantCredential) -> Result<Client, Error> {
        let table = fetch_table(on, None).await.map_err(|e| match e {
            Error::Timeout(_) => Error::Timeout(format!(
                "no orchestrator answered at {on}; is `strata store up` running there?"
            )),
            e => e,
        })?;
        let choice = self::nami::new_choice(ReplicaChoice::default());
        self::nami::spawn_probes(&choice);
        Ok(Client {
            on,
            table: RwLock::new(Arc::new(table)),
            sockets: Mutex::new(Vec::new()),
            connections: Connections::default(),
            credential,
            reports: Arc::default(),
            choice,
            hedge_micros: std::sync::atomic::AtomicU64::new(DEFAULT_HEDGE.as_micros() as u64),
            whole_object_max: std::sync::atomic::AtomicU64::new(DEFAULT_WHOLE_OBJECT_READS),
            fragment_pool: Arc::default(),
            local: std::sync::OnceLock::new(),
            local_metadata: std::sync::OnceLock::new(),
        })
    }

    /// Reads the replicas that `local` holds from this process's disk
    /// rather than over the network ([`self::local`]): for a client that
    /// runs beside storage nodes in one process. Set once; later calls
    /// change nothing.
    pub fn set_local_replicas(&self, local: Arc<self::local::LocalDisk>) {
        let _ = self.local.set(local);
    }

    /// Asks `nodes` (metadata nodes of this process) for Gets by a
    /// direct call rather than over UDP ([`self::local_metadata`]). Set
    /// once; later calls change nothing.
    pub fn set_local_metadata(&self, nodes: Arc<dyn self::local_metadata::LocalMetadata>) {
        let _ = self.local_metadata.set(nodes);
    }

    /// Sets the largest erasure-coded object a Get asks the node of its
    /// fragment 0 for whole, served from that node's object cache or
    /// gathered there ([`DEFAULT_WHOLE_OBJECT_READS`] unless set; 0: a
    /// Get always reads the fragments itself).
    pub fn set_whole_object_reads(&self, max: u64) {
        self.whole_object_max
            .store(max, std::sync::atomic::Ordering::Relaxed);
    }

    /// [`Client::set_whole_object_reads`]'s setting.
    pub fn whole_object_reads(&self) -> u64 {
        self.whole_object_max
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets the hedge of erasure-coded Gets: with `Some(delay)`, a Get
    /// whose first stripe has not come from its `k` fragments within
    /// `delay` asks for one more fragment and keeps the first `k` to
    /// answer ([`DEFAULT_HEDGE`] unless set); `None` for no hedge.
    pub fn set_hedge(&self, delay: Option<std::time::Duration>) {
        let micros = delay.map_or(NO_HEDGE, |d| {
            u64::try_from(d.as_micros()).unwrap_or(NO_HEDGE - 1)
        });
        self.hedge_micros
            .store(micros, std::sync::atomic::Ordering::Relaxed);
    }

    /// The hedge delay of erasure-coded Gets ([`Client::set_hedge`]).
    pub fn hedge(&self) -> Option<std::time::Duration> {
        match self.hedge_micros.load(std::sync::atomic::Ordering::Relaxed) {
            NO_HEDGE => None,
            micros => Some(std::time::Duration::from_micros(micros)),
        }
    }

    /// The tenant this client acts as.
    pub fn credential(&self) -> &TenantCredential {
        &self.credential
    }

    /// The prefix table in use.
    pub fn table(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Fetches the table again (after a node joined or moved).
    pub async fn refresh(&self) -> Result<(), Error> {
        let t = fetch_table(self.on, None).await?;
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(t);
        Ok(())
    }

    /// The coordinator of `name`: its first metadata address.
    fn coordinator(&self, name: &str) -> Result<Addr, Error> {
        checked_name(name, "the object name")?;
        Ok(self.table().meta_addrs(name)[0])
    }
}

/// Checks a name the caller gave (`what` says which): one no request can
/// carry is [`Error::Malformed`], with the codec's reason as its source.
fn checked_name(name: &str, what: &str) -> Result<(), Error> {
    check_name(name).map_err(|why| Error::malformed(what, WireError::Invalid(why)))
}

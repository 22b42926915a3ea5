//! What the runtimes of every role share: the prefix table a node's tasks
//! read, its refresh with heartbeats from the orchestrator, registration,
//! the node's identity and the address its socket binds. The runtimes
//! themselves put the roles on sockets: the orchestrator and metadata
//! nodes on UDP ([`crate::orchestrator::server`],
//! [`crate::metadata::server`]), storage nodes on TCP
//! ([`crate::storage::server`]).
//!
//! A metadata or replica address is turned into a socket address by the
//! prefix table ([`Table::mn_endpoint`], [`Table::sn_endpoint`]): the owning
//! node's endpoint in mapped mode, the address itself in routed mode. The
//! address also travels in every message, so both modes share one path.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use strata_store_protocol::auth::ClusterKey;
use strata_store_protocol::table::Table;
use strata_store_protocol::wire::{Body, Msg};
use strata_store_protocol::Error;
use tokio::sync::watch;

use strata_store_client::transport::{fetch_table, ok_body, request_id, udp_call};

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

pub(crate) fn nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The persistent identity of the node stored in `dir` (created once).
pub fn node_uuid(dir: &Path) -> Result<u64, Error> {
    let path = dir.join("node-id");
    if let Ok(s) = std::fs::read_to_string(&path) {
        return u64::from_str_radix(s.trim(), 16).map_err(|e| Error::State {
            context: format!(
                "{} does not hold a node identity (16 hex digits); remove it to give \
                 the node a new identity, or restore the node's own",
                path.display()
            ),
            source: Some(Box::new(e)),
        });
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let uuid =
        strata_store_protocol::addr::splitmix64(nanos() ^ (std::process::id() as u64) << 32) | 1;
    std::fs::write(&path, format!("{uuid:016x}\n"))
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    Ok(uuid)
}

pub(crate) async fn register(on: SocketAddr, body: Body, key: &ClusterKey) -> Result<u16, Error> {
    let msg = Msg::new(request_id(), 0, body);
    match ok_body(udp_call(on, &msg, Duration::from_millis(300), 10, Some(key)).await?)? {
        Body::Registered { index } => Ok(index),
        other => Err(Error::Peer(format!(
            "the orchestrator answered {other:?} to a registration"
        ))),
    }
}

/// Keeps `table` fresh and sends heartbeats until the task is dropped.
/// `stats` gives the heartbeat's free bytes and object count, or `None`
/// once the node is fenced: it then sends no heartbeat, so that the
/// orchestrator declares it failed and moves its work to the others
/// instead of routing to a node that answers nothing. With `routes_of` (a
/// host address), it also keeps that host's routes in step with the table
/// when the cluster is routed.
pub(crate) async fn refresh_loop(
    on: SocketAddr,
    uuid: u64,
    table: SharedTable,
    tx: Option<watch::Sender<Table>>,
    stats: impl Fn() -> Option<(u64, u64)>,
    routes_of: Option<IpAddr>,
    key: ClusterKey,
) {
    let mut interval = tokio::time::interval(REFRESH);
    let mut keeper = crate::routes::RouteKeeper::new();
    loop {
        interval.tick().await;
        if let Some((free, objects)) = stats() {
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
        }
        if let Ok(t) = fetch_table(on, Some(&key)).await {
            if let (true, Some(host)) = (t.routed, routes_of) {
                // Runs `ip` only when the routes change (a node joined, a
                // group moved), so it may block this task briefly.
                match keeper.sync(&t, host) {
                    Ok(0) => {}
                    Ok(n) => tracing::info!("{n} routes of host {host} installed or changed"),
                    Err(e) => tracing::warn!("{}", e.report()),
                }
            }
            *table.write().unwrap_or_else(|e| e.into_inner()) = t.clone();
            if let Some(tx) = &tx {
                let _ = tx.send(t);
            }
        }
    }
}

/// Where a node listening at `listen` binds its socket. In routed mode it
/// binds the wildcard address at that port: the host's local routes for
/// the node's prefix (or metadata groups) deliver every object or metadata
/// address to it. In mapped mode it binds `listen` itself.
pub(crate) async fn bind_address(
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
pub(crate) fn advertised(
    listen: SocketAddr,
    bound: std::io::Result<SocketAddr>,
) -> Result<SocketAddr, Error> {
    let bound = bound.map_err(|e| Error::io("local address", e))?;
    Ok(SocketAddr::new(listen.ip(), bound.port()))
}

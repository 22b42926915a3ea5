//! Where a replica is served, found once: a [`Replica`] keeps the
//! endpoint the prefix table gave for its address, and every later step
//! (taking an idle connection, connecting, keeping the connection) uses
//! that endpoint instead of asking the table again. [`Connections`] are
//! the client's idle data connections, by endpoint.

use super::choice::Candidate;
use crate::transport::connect_data;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::table::Table;
use strata_store_protocol::Error;
use tokio::net::TcpStream;

/// Idle data connections a client keeps per storage node.
const IDLE_CONNS_PER_NODE: usize = 32;
/// Idle data connections a client keeps in all.
const IDLE_CONNS_TOTAL: usize = 256;

/// A replica address and the endpoint that serves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Replica {
    /// The replica's address.
    pub(crate) addr: Addr,
    /// Where to connect for it: the owning storage node's endpoint
    /// (mapped), or `addr` at that node's port (routed).
    pub(crate) endpoint: SocketAddr,
    /// The owning storage node's identity (its latency is the node's,
    /// whichever of its replicas is read).
    pub(crate) node: u64,
}

impl Replica {
    /// Finds replica `addr`'s endpoint in `table`: the one table lookup
    /// for this replica.
    pub(crate) fn locate(table: &Table, addr: Addr) -> Result<Replica, Error> {
        let missing = || {
            Error::Table(format!(
                "replica address {} is in no storage node's prefix",
                fmt_addr(addr)
            ))
        };
        let node = table.sn_for(addr).ok_or_else(missing)?.uuid;
        let endpoint = table.sn_endpoint(addr).ok_or_else(missing)?;
        Ok(Replica {
            addr,
            endpoint,
            node,
        })
    }

    /// The replica's node, as the replica choice knows it.
    pub(crate) fn candidate(&self) -> Candidate {
        Candidate {
            node: self.node,
            endpoint: self.endpoint,
        }
    }

    /// Opens a new data connection to the replica's storage node.
    pub(crate) async fn connect(&self) -> Result<TcpStream, Error> {
        connect_data(self.endpoint).await
    }
}

/// Idle data connections by storage node endpoint, each at a request
/// boundary (the storage node serves requests one after another).
#[derive(Default)]
pub(super) struct Connections {
    idle: Mutex<HashMap<SocketAddr, Vec<TcpStream>>>,
}

impl Connections {
    /// An idle connection to `replica`'s endpoint, or a new one; `true`
    /// when it was idle (and so may have been closed meanwhile).
    pub(super) async fn take(&self, replica: &Replica) -> Result<(TcpStream, bool), Error> {
        if let Some(stream) = self.take_idle(replica.endpoint) {
            return Ok((stream, true));
        }
        Ok((replica.connect().await?, false))
    }

    fn take_idle(&self, endpoint: SocketAddr) -> Option<TcpStream> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let stream = idle.get_mut(&endpoint).and_then(Vec::pop);
        // Routed mode keys connections by replica address: drop empty
        // entries so the map does not grow with every object read.
        if idle.get(&endpoint).is_some_and(Vec::is_empty) {
            idle.remove(&endpoint);
        }
        stream
    }

    /// Drops every idle connection to `replica`'s endpoint: one found
    /// closed by the node means the others, idle as long or longer, were
    /// most likely closed too (the node closes connections idle past its
    /// data timeout), and trying them one by one would fail as many reads.
    pub(super) fn forget_idle(&self, replica: &Replica) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.remove(&replica.endpoint);
    }

    /// Keeps a connection to `replica` that is at a request boundary,
    /// within the bounds per node and in all.
    pub(super) fn keep(&self, replica: &Replica, stream: TcpStream) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.values().map(Vec::len).sum::<usize>() >= IDLE_CONNS_TOTAL {
            return;
        }
        let for_node = idle.entry(replica.endpoint).or_default();
        if for_node.len() < IDLE_CONNS_PER_NODE {
            for_node.push(stream);
        }
    }
}

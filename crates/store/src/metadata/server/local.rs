//! Gets answered by a direct call from this process
//! ([`strata_store_client::client::local_metadata`]): the S3 gateway that
//! `strata store up` starts beside its metadata nodes hands a Get's
//! sealed datagram to the node's gate and core on its own thread, and
//! takes the answer's bytes, instead of a UDP round trip to the node's
//! serving thread.
//!
//! The call takes the node only if no thread holds it (`try_lock`): a
//! node busy with datagrams or waiting for its disk is asked by datagram
//! as before, so a direct call never waits. While the call holds the node
//! (the microseconds of one Get), the serving thread skips it or waits as
//! it would for another serving thread. Only a Get whose record is in the
//! node's read cache is answered this way: the caller is an async worker,
//! which must not wait for a disk read (the first Get of a record goes by
//! datagram and fills the cache). A Get writes nothing, so its answer
//! needs no group commit; the commit still runs if the core wrote anyway,
//! as a round would.

use super::{encode_outs, group_commit, mn_receive_with, MnHandle, Served, Slot};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Weak;
use strata_store_client::client::local_metadata::{DirectCalls, LocalMetadata};
use strata_store_protocol::wire::Body;

/// The peer a direct call's request comes from, as the node's core sees
/// it. The unspecified address with port 0 is no socket's, so nothing is
/// ever sent there: the answer addressed to it is handed back instead.
const DIRECT_CALLER: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));

/// The metadata nodes of this process, by endpoint, for direct calls.
pub struct LocalMetadataNodes {
    nodes: Vec<(SocketAddr, Weak<Slot>)>,
    /// Gets answered by a direct call.
    answered: AtomicU64,
    /// Gets sent by datagram instead: their node was busy, or their
    /// record not in its read cache.
    declined: AtomicU64,
}

impl LocalMetadataNodes {
    /// The nodes of `handles`. They are held weakly: a node stopped (its
    /// handle dropped) is asked by datagram, which then finds no one.
    pub fn new<'a>(handles: impl IntoIterator<Item = &'a MnHandle>) -> LocalMetadataNodes {
        LocalMetadataNodes {
            nodes: handles
                .into_iter()
                .map(|h| (h.endpoint, h.local.clone()))
                .collect(),
            answered: AtomicU64::new(0),
            declined: AtomicU64::new(0),
        }
    }
}

impl LocalMetadata for LocalMetadataNodes {
    fn get(&self, endpoint: SocketAddr, request: &[u8]) -> Option<Vec<u8>> {
        let (_, weak) = self.nodes.iter().find(|(at, _)| *at == endpoint)?;
        let slot = weak.upgrade()?;
        if slot.stop.load(Ordering::Relaxed) {
            return None;
        }
        let answer = match slot.node.try_lock() {
            Ok(mut node) if !slot.busy.load(Ordering::Acquire) => answer_get(&mut node, request),
            _ => None,
        };
        let counter = match answer {
            Some(_) => &self.answered,
            None => &self.declined,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        answer
    }

    fn counts(&self) -> DirectCalls {
        DirectCalls {
            answered: self.answered.load(Ordering::Relaxed),
            declined: self.declined.load(Ordering::Relaxed),
        }
    }
}

/// The node's answer to the sealed request `request` if it is a Get
/// whose record is in the node's read cache (or the gate's refusal of
/// it), as the bytes its datagram would carry; `None` for a fenced node,
/// another kind of request, or a record the node would read from its
/// disk, which are then not handled. Anything else the core sends leaves
/// by the node's socket.
fn answer_get(node: &mut Served, request: &[u8]) -> Option<Vec<u8>> {
    if node.failed.is_some() || !cached_get(node, request) {
        return None;
    }
    let wall = strata_store_protocol::auth::unix_ms();
    let now = node.start.elapsed().as_millis() as u64;
    let mut waiter = None;
    let outs = mn_receive_with(
        &mut node.core,
        &mut node.gate,
        wall,
        now,
        DIRECT_CALLER,
        None,
        request,
        &mut |w, body| {
            waiter = Some(w);
            matches!(body, Body::Get { .. })
        },
    );
    let waiters: Vec<_> = waiter.into_iter().collect();
    let outs = group_commit(node, outs, &waiters);
    let mut outgoing = Vec::new();
    encode_outs(node, outs, &mut outgoing);
    let mut answer = None;
    outgoing.retain_mut(|(bytes, to)| {
        if *to != DIRECT_CALLER {
            return true;
        }
        answer = Some(std::mem::take(bytes));
        false
    });
    if !outgoing.is_empty() {
        crate::mmsg::send_batch(&node.sock, &outgoing);
    }
    answer
}

/// Whether `request` decodes as a Get whose record the node holds in
/// memory. The gate decodes it again once its seal is checked: this
/// look only decides which path serves it.
fn cached_get(node: &Served, request: &[u8]) -> bool {
    match strata_store_protocol::wire::Msg::decode(request) {
        Ok(msg) => match &msg.body {
            Body::Get { name } => node.core.get_is_cached(msg.target, name),
            _ => false,
        },
        Err(_) => false,
    }
}

//! Telling a name's coordinator that one of its replicas served bytes
//! that failed the record's CRC-32C, or was refused as damaged by its
//! storage node ([`Body::BadReplica`]), so that the metadata node repairs
//! it from a replica that verifies. Fire and forget: the report never
//! delays or fails the Get that found the damage, and a client has at most
//! [`MAX_REPORTS`] under way.

use super::calls::Call;
use super::udp::{meta_over_ipv6, run_call};
use super::Client;
use crate::transport::request_id;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::auth::unix_ms;
use strata_store_protocol::wire::{Body, Msg};
use strata_store_protocol::Error;

/// Most bad-replica reports one client has under way; more are dropped
/// (the storage node's scrub finds the damage too).
pub const MAX_REPORTS: usize = 8;

/// Resends of a report after its first datagram, and the wait for an
/// answer to each.
const REPORT_ATTEMPTS: u32 = 3;
const REPORT_TIMEOUT_MS: u64 = 300;

/// Whether the storage node's refusal of a Get says its replica is
/// damaged (its header or length is wrong): the node's reply format has
/// no code for it, only this wording
/// (`strata_store::storage::reader`).
pub(super) fn refused_as_damaged(e: &Error) -> bool {
    matches!(e, Error::Remote { message, .. } if message.contains("is damaged"))
}

/// A report slot, given back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(count: &Arc<AtomicUsize>) -> Option<Slot> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_REPORTS).then_some(n + 1)
            })
            .ok()?;
        Some(Slot(count.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Client {
    /// Reports that `replica` of `name` is damaged to `name`'s
    /// coordinator: one datagram at once (so a process that exits right
    /// after its Get still sends it), then, on a Tokio runtime, a few
    /// resends in the background until the coordinator answers. Dropped
    /// when [`MAX_REPORTS`] are under way.
    pub(super) fn report_bad_replica(&self, name: &str, replica: Addr) {
        let Some(slot) = Slot::take(&self.reports) else {
            tracing::debug!(
                "not reporting replica {} of {name:?}: {MAX_REPORTS} reports under way",
                fmt_addr(replica)
            );
            return;
        };
        let table = self.table();
        let Some(&coordinator) = table.meta_addrs(name).first() else {
            return;
        };
        let body = Body::BadReplica {
            name: name.to_string(),
            replica,
        };
        let first = Msg::new(request_id(), coordinator, body.clone());
        if let Err(e) = send_once(&table, &self.credential, &first) {
            tracing::debug!("reporting replica {}: {}", fmt_addr(replica), e.report());
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let credential = self.credential.clone();
        runtime.spawn(async move {
            let _slot = slot;
            let call = Call::new(
                request_id(),
                vec![coordinator],
                body,
                REPORT_ATTEMPTS,
                REPORT_TIMEOUT_MS,
            );
            match run_call(&table, &credential, call).await {
                Ok(_) => tracing::debug!("reported damaged replica {}", fmt_addr(replica)),
                Err(e) => tracing::debug!(
                    "reporting damaged replica {}: {}",
                    fmt_addr(replica),
                    e.report()
                ),
            }
        });
    }
}

/// Sends `msg`, sealed with `credential`, once to the metadata node the
/// table gives for its target, without waiting for anything.
fn send_once(
    table: &strata_store_protocol::table::Table,
    credential: &strata_store_protocol::tenant::TenantCredential,
    msg: &Msg,
) -> Result<(), Error> {
    let endpoint = table.mn_endpoint(msg.target).ok_or_else(|| {
        Error::Table(format!(
            "no metadata node owns {} in the prefix table",
            fmt_addr(msg.target)
        ))
    })?;
    let bytes = msg
        .seal_tenant(credential, unix_ms())
        .map_err(|e| Error::malformed("a bad-replica report", e))?;
    let any = if meta_over_ipv6(table) {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    };
    let sock = std::net::UdpSocket::bind(any).map_err(|e| Error::io("binding a UDP socket", e))?;
    sock.set_nonblocking(true)
        .map_err(|e| Error::io("setting a UDP socket non-blocking", e))?;
    sock.send_to(&bytes, endpoint)
        .map_err(|e| Error::io(format!("sending a bad-replica report to {endpoint}"), e))?;
    Ok(())
}

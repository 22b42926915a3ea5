//! Running metadata calls over UDP: [`Client::run`] on the client's idle
//! sockets (refreshing the table when the address's group moved), and
//! [`run_call`] on a fresh socket. Each send is sealed with the tenant's
//! credential and goes to the endpoint the table gives for its target,
//! or, for a Get to a metadata node of this process, to the node's code
//! by a direct call ([`super::local_metadata`]).

use super::calls::{Call, Step};
use super::local_metadata::LocalMetadata;
use super::{Client, IDLE_SOCKETS, MOVING_RETRY_MS};
use crate::transport::request_id;
use std::time::Duration;
use strata_store_protocol::auth::unix_ms;
use strata_store_protocol::table::Table;
use strata_store_protocol::tenant::TenantCredential;
use strata_store_protocol::wire::{Body, Code, Msg, MAX_DATAGRAM};
use strata_store_protocol::Error;
use tokio::net::UdpSocket;

impl Client {
    /// Runs a call over UDP, on an idle socket of this client's. An answer
    /// that the address's group is elsewhere or being handed over (nothing
    /// was done) makes it refresh the table and try again, for a while.
    pub async fn run(&self, call: Call) -> Result<Body, Error> {
        let start = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(50);
        let mut call = call;
        loop {
            let next = call.again(request_id());
            match self.run_once(call).await {
                Err(Error::Remote {
                    code: Code::WrongAddress | Code::Moving,
                    message,
                }) if start.elapsed() < Duration::from_millis(MOVING_RETRY_MS) => {
                    tracing::debug!("retrying after a refreshed table: {message}");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                    let _ = self.refresh().await;
                    call = next;
                }
                // A node that does not answer may have been replaced by a
                // stand-in (its groups given to another node while it is
                // down): ask again if the table now sends elsewhere.
                Err(Error::Timeout(message))
                    if start.elapsed() < Duration::from_millis(MOVING_RETRY_MS) =>
                {
                    let old = self.table();
                    let _ = self.refresh().await;
                    let new = self.table();
                    let moved = next
                        .targets()
                        .iter()
                        .any(|&a| old.mn_endpoint(a) != new.mn_endpoint(a));
                    if !moved {
                        return Err(Error::Timeout(message));
                    }
                    tracing::debug!("retrying on a refreshed table: {message}");
                    call = next;
                }
                other => return other,
            }
        }
    }

    /// One run of `call` on an idle socket (or a new one), with the table
    /// as it is now.
    async fn run_once(&self, call: Call) -> Result<Body, Error> {
        let table = self.table();
        let idle = self.sockets.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let (sock, mut buf) = match idle {
            Some(s) => s,
            None => (
                bind_udp(meta_over_ipv6(&table)).await?,
                vec![0u8; MAX_DATAGRAM + 1],
            ),
        };
        let local = self.local_metadata.get().map(|nodes| nodes.as_ref());
        let result = run_call_on(&sock, &mut buf, &table, &self.credential, local, call).await;
        // The reply was taken, so the socket is most likely empty now:
        // forget its readiness, or the next call's first receive would be
        // a system call that finds nothing. (A datagram still queued is a
        // stale one; the next call's own reply wakes it again.)
        let _ = sock.try_io(tokio::io::Interest::READABLE, || {
            Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
        });
        let mut idle = self.sockets.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < IDLE_SOCKETS {
            idle.push((sock, buf));
        }
        result
    }
}

/// Runs one metadata call on a fresh UDP socket, sealed with `credential`.
pub async fn run_call(
    table: &Table,
    credential: &TenantCredential,
    call: Call,
) -> Result<Body, Error> {
    let sock = bind_udp(meta_over_ipv6(table)).await?;
    run_call_on(
        &sock,
        &mut vec![0u8; MAX_DATAGRAM + 1],
        table,
        credential,
        None,
        call,
    )
    .await
}

/// Whether metadata messages go to IPv6 socket addresses.
pub fn meta_over_ipv6(table: &Table) -> bool {
    table.routed || table.mns.iter().any(|m| m.endpoint.is_ipv6())
}

/// A UDP socket for metadata calls: IPv6 when the metadata nodes are
/// reached over IPv6 (routed mode sends to metadata addresses).
async fn bind_udp(ipv6: bool) -> Result<UdpSocket, Error> {
    let any = if ipv6 { "[::]:0" } else { "0.0.0.0:0" };
    UdpSocket::bind(any)
        .await
        .map_err(|e| Error::io("binding a UDP socket", e))
}

/// Runs `call` on `sock`, receiving into `buf` (at least a datagram and a
/// byte long), ignoring replies to other calls. Each send is sealed anew
/// with `credential` (a resend carries a fresh clock). A Get goes to
/// `local`'s node by a direct call when it listens at the endpoint and
/// answers; otherwise, and for every other call, by datagram.
async fn run_call_on(
    sock: &UdpSocket,
    buf: &mut [u8],
    table: &Table,
    credential: &TenantCredential,
    local: Option<&dyn LocalMetadata>,
    mut call: Call,
) -> Result<Body, Error> {
    let local = local.filter(|_| call.is_get());
    let start = tokio::time::Instant::now();
    let now = || start.elapsed().as_millis() as u64;
    let mut step = call.start(now());
    loop {
        let (msg, deadline) = match step {
            Step::Done(r) => return r,
            Step::Send(msg, deadline) => (msg, deadline),
        };
        let endpoint = table.mn_endpoint(msg.target);
        let bytes = msg.seal_tenant_padded(credential, unix_ms(), call.pad());
        if let (Some(ep), Ok(bytes)) = (endpoint, bytes) {
            let answer = local.and_then(|nodes| nodes.get(ep, &bytes));
            let reply = answer.and_then(|a| Msg::decode(&a).ok());
            if let Some(next) = reply.and_then(|r| call.on_reply(now(), r)) {
                step = next;
                continue;
            }
            let _ = sock.send_to(&bytes, ep).await;
        }
        step = loop {
            let until = start + Duration::from_millis(deadline);
            match tokio::time::timeout_at(until, sock.recv_from(buf)).await {
                Err(_) | Ok(Err(_)) => break call.on_timeout(now()),
                Ok(Ok((n, _))) => {
                    if let Ok(reply) = Msg::decode(&buf[..n]) {
                        if let Some(s) = call.on_reply(now(), reply) {
                            break s;
                        }
                    }
                }
            }
        };
    }
}

//! The operator's requests to the orchestrator, sealed with the cluster
//! key: retiring a storage node, cancelling that, revoking a tenant's
//! credentials; and to the storage nodes, for RS3's settings.

use crate::transport::{ok_body, request_id, udp_call};
use std::net::SocketAddr;
use std::time::Duration;
use strata_store_protocol::auth::ClusterKey;
use strata_store_protocol::wire::{Body, Msg, RepairCounts};
use strata_store_protocol::Error;

/// How long the orchestrator has to answer one attempt.
const TIMEOUT: Duration = Duration::from_millis(500);
/// Attempts before giving up (every request here is safe to resend).
const ATTEMPTS: u32 = 4;

/// Sends `body` to the orchestrator at `cluster`, sealed with `key`, and
/// returns the answer's body (an error answer becomes
/// [`Error::Remote`]).
pub async fn ask_orchestrator(
    cluster: SocketAddr,
    key: &ClusterKey,
    body: Body,
) -> Result<Body, Error> {
    let msg = Msg::new(request_id(), 0, body);
    ok_body(udp_call(cluster, &msg, TIMEOUT, ATTEMPTS, Some(key)).await?)
}

/// Asks the orchestrator to drain and retire the storage node `uuid`.
pub async fn retire(cluster: SocketAddr, key: &ClusterKey, uuid: u64) -> Result<(), Error> {
    ask_orchestrator(cluster, key, Body::Retire { uuid }).await?;
    Ok(())
}

/// Asks the orchestrator to cancel the drain of the storage node `uuid`
/// (done also when it was not being drained: a resent request must not
/// fail).
pub async fn cancel_retire(cluster: SocketAddr, key: &ClusterKey, uuid: u64) -> Result<(), Error> {
    ask_orchestrator(cluster, key, Body::CancelRetire { uuid }).await?;
    Ok(())
}

/// Asks the orchestrator to refuse tenant `tenant`'s credentials of a
/// generation below `below`; returns the lowest generation now valid
/// (the orchestrator never lowers it, so it may be above `below`).
pub async fn revoke_tenant(
    cluster: SocketAddr,
    key: &ClusterKey,
    tenant: &str,
    below: u32,
) -> Result<u64, Error> {
    let body = Body::RevokeTenant {
        tenant: tenant.to_string(),
        below,
    };
    match ask_orchestrator(cluster, key, body).await? {
        Body::Done { version } => Ok(version),
        other => Err(Error::Peer(format!(
            "the orchestrator at {cluster} answered {other:?} to the revocation of tenant \
             '{tenant}'; expected Done"
        ))),
    }
}

/// How long a storage node has to answer a Schedule request.
const SCHEDULE_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends RS3 `settings` (empty: change nothing) to the storage node at
/// `endpoint`, whose prefix holds `addr`, sealed with `key`; returns the
/// node's settings and counters as text, one `key=value` per line.
pub async fn schedule(
    endpoint: SocketAddr,
    addr: strata_store_protocol::addr::Addr,
    key: &ClusterKey,
    settings: &str,
) -> Result<String, Error> {
    use strata_store_protocol::data::{Credential, Request, MAX_SCHEDULE_REPLY};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(endpoint)
            .await
            .map_err(|e| Error::io(format!("connecting to storage node {endpoint}"), e))?;
        let request = Request::Schedule {
            addr,
            settings: settings.to_string(),
        };
        s.write_all(&request.encode(Credential::Seal(key)))
            .await
            .map_err(|e| Error::io("sending Schedule", e))?;
        crate::stream::read_status(&mut s, "changing RS3's settings").await?;
        let n = s
            .read_u32()
            .await
            .map_err(|e| Error::io("reading RS3's settings", e))? as usize;
        if n > MAX_SCHEDULE_REPLY {
            return Err(Error::Peer(format!(
                "storage node {endpoint} answered {n} bytes of settings; the limit is {MAX_SCHEDULE_REPLY}"
            )));
        }
        let mut text = vec![0u8; n];
        s.read_exact(&mut text)
            .await
            .map_err(|e| Error::io("reading RS3's settings", e))?;
        String::from_utf8(text).map_err(|_| {
            Error::Peer(format!(
                "storage node {endpoint} answered settings that are not UTF-8"
            ))
        })
    };
    tokio::time::timeout(SCHEDULE_TIMEOUT, exchange)
        .await
        .map_err(|_| {
            Error::Timeout(format!(
                "storage node {endpoint} did not answer the Schedule request within {} s",
                SCHEDULE_TIMEOUT.as_secs()
            ))
        })?
}

/// Asks the metadata node at `endpoint` for its repair counters, sealed
/// with the cluster `key`.
pub async fn repair_counts(endpoint: SocketAddr, key: &ClusterKey) -> Result<RepairCounts, Error> {
    let msg = Msg::new(request_id(), 0, Body::GetRepairCounts);
    match ok_body(udp_call(endpoint, &msg, TIMEOUT, ATTEMPTS, Some(key)).await?)? {
        Body::RepairCounts(counts) => Ok(counts),
        other => Err(Error::Peer(format!(
            "the metadata node at {endpoint} answered {other:?} to a request for its repair \
             counts; expected RepairCounts (is it an older version?)"
        ))),
    }
}

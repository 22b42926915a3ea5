//! What metadata nodes ask of storage nodes, sealed with the cluster key:
//! copying a replica for repair, and freeing one.

use super::replica::Replica;
use crate::stream::{read_get_body, read_status};
use std::net::SocketAddr;
use std::time::Duration;
use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::auth::ClusterKey;
use strata_store_protocol::data::{Credential, Request};
use strata_store_protocol::table::Table;
use strata_store_protocol::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Copies an object for repair: reads it from the first of `sources` that
/// serves all `size` bytes with the CRC-32C `crc` (and the node's own
/// checksum verified), streaming it to `targets[0]`, which forwards it to
/// the other targets. A source that fails its checksum is not committed:
/// the connection to the target is dropped before the CRC trailer, so the
/// target discards what it got. Returns the number of copies written.
/// Both requests are sealed with the cluster `key` (a repair copy is a
/// metadata node's).
pub async fn copy_replica(
    table: &Table,
    key: &ClusterKey,
    sources: &[Addr],
    targets: &[Addr],
    size: u64,
    crc: u32,
) -> Result<u8, Error> {
    let Some((&first, chain)) = targets.split_first() else {
        return Err(Error::Table(
            "a repair copy needs a storage node to copy to; the prefix table gave none".into(),
        ));
    };
    let limit = Duration::from_millis(30_000 + size / (16 << 20) * 1000);
    let mut last = None;
    for &source in sources {
        let copy = copy_from(table, key, source, (first, chain), size, crc);
        match tokio::time::timeout(limit, copy).await {
            Ok(Ok(copies)) => return Ok(copies),
            Ok(Err(e)) => last = Some(e),
            Err(_) => {
                last = Some(Error::Timeout(format!(
                    "copying from {} took longer than {limit:?}",
                    fmt_addr(source)
                )))
            }
        }
    }
    Err(last.unwrap_or_else(|| {
        Error::Table("no replica to copy from: the prefix table marks none of its nodes up".into())
    }))
}

/// One try of [`copy_replica`]: a Get from `source` piped into a Put to
/// the first target, which forwards it along `chain`.
async fn copy_from(
    table: &Table,
    key: &ClusterKey,
    source: Addr,
    (first, chain): (Addr, &[Addr]),
    size: u64,
    crc: u32,
) -> Result<u8, Error> {
    let io = |e| Error::io("copying a replica", e);
    let mut from = Replica::locate(table, source)?.connect().await?;
    from.write_all(&Request::Get { addr: source }.encode(Credential::Seal(key)))
        .await
        .map_err(io)?;
    read_status(&mut from, "reading the replica to copy").await?;
    let mut to = Replica::locate(table, first)?.connect().await?;
    let header = Request::Put {
        addr: first,
        size,
        chain: chain.to_vec(),
    };
    to.write_all(&header.encode(Credential::Seal(key)))
        .await
        .map_err(io)?;
    // On any error `to` is dropped before the CRC trailer: the target
    // discards what it received.
    read_get_body(&mut from, source, size, crc, &mut to, &|_| {}).await?;
    to.write_all(&crc.to_be_bytes()).await.map_err(io)?;
    to.flush().await.map_err(io)?;
    read_status(&mut to, "storing the copy").await?;
    to.read_u8().await.map_err(io)
}

/// Asks a storage node to free a replica (sealed with the cluster `key`:
/// only nodes free replicas).
pub async fn free_replica(endpoint: SocketAddr, addr: Addr, key: &ClusterKey) -> Result<(), Error> {
    let mut s = TcpStream::connect(endpoint)
        .await
        .map_err(|e| Error::io(format!("connecting to {endpoint}"), e))?;
    s.write_all(&Request::Free { addr }.encode(Credential::Seal(key)))
        .await
        .map_err(|e| Error::io("sending Free", e))?;
    read_status(&mut s, "freeing a replica").await
}

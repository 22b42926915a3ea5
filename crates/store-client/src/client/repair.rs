//! What metadata nodes ask of storage nodes, sealed with the cluster key:
//! copying a replica for repair, and freeing one.

use super::replica::Replica;
use crate::erasure::{FragmentReader, FragmentSource, StripeCoder};
use crate::stream::{read_get_body, read_status};
use std::net::SocketAddr;
use std::time::Duration;
use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::auth::ClusterKey;
use strata_store_protocol::data::{Credential, Request};
use strata_store_protocol::table::Table;
use strata_store_protocol::wire::Record;
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

/// Rebuilds fragments `slots` of the erasure-coded `record` from any k
/// of its other fragments (read sealed with `key`), and writes fragment
/// `slots[i]` to the new address `targets[i]`: the metadata nodes'
/// repair. Every fragment read is checked against its CRC-32C before it
/// is decoded, and every rebuilt one against the record's before it is
/// kept: a target's Put gets its trailer only then, so a storage node
/// never keeps a fragment that does not match. Returns how many were
/// written (all of them), or the error.
pub async fn rebuild_fragments(
    table: &Table,
    key: &ClusterKey,
    record: &Record,
    slots: &[usize],
    targets: &[Addr],
) -> Result<u8, Error> {
    let limit = Duration::from_millis(30_000 + record.size / (16 << 20) * 1000);
    let job = Rebuild {
        table,
        key,
        record,
        slots,
        targets,
    };
    let attempts = async {
        // A source fragment that fails (damaged too, unreported so far)
        // is left out of the next attempt, while k are left.
        let mut excluded = Vec::new();
        loop {
            match job.attempt(&excluded).await {
                Ok(written) => return Ok(written),
                Err((e, failed)) => {
                    let fresh: Vec<usize> = failed
                        .into_iter()
                        .filter(|i| !excluded.contains(i))
                        .collect();
                    if fresh.is_empty() {
                        return Err(e);
                    }
                    excluded.extend(fresh);
                }
            }
        }
    };
    match tokio::time::timeout(limit, attempts).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout(format!(
            "rebuilding fragments of {:?} took longer than {limit:?}",
            record.name
        ))),
    }
}

/// What a [`rebuild_fragments`] call rebuilds: the fragments `slots` of
/// `record`, onto `targets`, read and written sealed with `key`.
struct Rebuild<'a> {
    table: &'a Table,
    key: &'a ClusterKey,
    record: &'a Record,
    slots: &'a [usize],
    targets: &'a [Addr],
}

impl Rebuild<'_> {
    /// One attempt, reading no fragment of `excluded`; an error comes
    /// with the fragments that failed in it.
    async fn attempt(&self, excluded: &[usize]) -> Result<u8, (Error, Vec<usize>)> {
        let mut reader = None;
        let result = self.run(excluded, &mut reader).await;
        result.map_err(|e| {
            let failed = reader.map_or_else(Vec::new, |r: FragmentReader| {
                r.failures.iter().map(|f| f.index).collect()
            });
            (e, failed)
        })
    }

    /// The attempt itself; the reader it makes is left in `reader_out`,
    /// so the caller sees which fragments failed.
    async fn run(
        &self,
        excluded: &[usize],
        reader_out: &mut Option<FragmentReader>,
    ) -> Result<u8, Error> {
        let Rebuild {
            table,
            key,
            record,
            slots,
            targets,
        } = *self;
        let Some(fragments) = &record.fragments else {
            return Err(Error::Table(format!(
                "{:?} is not erasure-coded: copy its replicas instead",
                record.name
            )));
        };
        if slots.len() != targets.len() || slots.iter().any(|&s| s >= record.replicas.len()) {
            return Err(Error::Table(format!(
                "a rebuild of {:?} names {} fragments for {} targets",
                record.name,
                slots.len(),
                targets.len()
            )));
        }
        let sources: Vec<FragmentSource> = record
            .replicas
            .iter()
            .enumerate()
            .filter(|(index, _)| !slots.contains(index) && !excluded.contains(index))
            .filter_map(|(index, &addr)| {
                let endpoint = Replica::locate(table, addr).ok()?.endpoint;
                Some(FragmentSource {
                    index,
                    addr,
                    endpoint,
                    request: Request::Get { addr }.encode(Credential::Seal(key)),
                    pool: None,
                })
            })
            .collect();
        let reader = reader_out.insert(FragmentReader::new(
            record.size,
            fragments,
            sources,
            None,
            false,
        )?);
        let layout = reader.layout();
        let mut coder = StripeCoder::new(layout)?;
        let io = |e| Error::io("writing a rebuilt fragment", e);
        let mut streams = Vec::with_capacity(targets.len());
        for &target in targets {
            let mut to = Replica::locate(table, target)?.connect().await?;
            let header = Request::Put {
                addr: target,
                size: layout.fragment_len(),
                chain: Vec::new(),
            };
            to.write_all(&header.encode(Credential::Seal(key)))
                .await
                .map_err(io)?;
            streams.push(to);
        }
        let mut crcs = vec![0u32; slots.len()];
        let parity_needed = slots.iter().any(|&slot| slot >= layout.data);
        while let Some(stripe) = reader.next_stripe().await {
            let data = stripe?;
            let parity = match parity_needed {
                true => coder.encode(&data.concat())?,
                false => Vec::new(),
            };
            for (i, &slot) in slots.iter().enumerate() {
                let shard = match slot < layout.data {
                    true => &data[slot],
                    false => &parity[slot - layout.data],
                };
                crcs[i] = crc32c::crc32c_append(crcs[i], shard);
                streams[i].write_all(shard).await.map_err(io)?;
            }
        }
        // The object's own checksum is not computed here: the rebuilt
        // fragments' are checked below. A pass with a fragment that
        // failed its check is not read again (its shards are already
        // written): the attempt fails, and the next one leaves it out.
        if !reader.finish(true).await? {
            return Err(Error::Corrupt(format!(
                "a fragment read to rebuild {:?} failed its checksum; rebuild again without it",
                record.name
            )));
        }
        for (i, &slot) in slots.iter().enumerate() {
            if fragments.crcs.get(slot) != Some(&crcs[i]) {
                // Dropped before its trailer: the target discards it.
                return Err(Error::Corrupt(format!(
                    "the rebuilt fragment {slot} of {:?} does not match its checksum",
                    record.name
                )));
            }
        }
        for (stream, crc) in streams.iter_mut().zip(&crcs) {
            stream.write_all(&crc.to_be_bytes()).await.map_err(io)?;
            stream.flush().await.map_err(io)?;
            read_status(stream, "storing a rebuilt fragment").await?;
            stream.read_u8().await.map_err(io)?;
        }
        Ok(targets.len() as u8)
    }
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

//! Writing: a Post's plan from the name's coordinator, the data streamed
//! to the first replica (which forwards it along the others), then the
//! commit, or an abort when too few copies were written.

use super::calls::{unexpected, Call};
use super::replica::Replica;
use super::{Client, COMMIT_ATTEMPTS, META_ATTEMPTS, META_TIMEOUT_MS};
use crate::erasure::StripeCoder;
use crate::stream::{read_status, write_put_body};
use crate::transport::request_id;
use strata_store_protocol::addr::Addr;
use strata_store_protocol::class::{StorageClass, StripeLayout};
use strata_store_protocol::data::{Credential, Request};
use strata_store_protocol::table::Table;
use strata_store_protocol::wire::{Body, Code, WireError, MAX_ATTRIBUTES, MAX_INLINE};
use strata_store_protocol::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a Post did.
#[derive(Clone, Debug)]
pub struct PutResult {
    /// The version created.
    pub version: u64,
    /// CRC-32C of the data.
    pub crc: u32,
    /// Durable data copies when acknowledged (0 for an empty object);
    /// for an erasure-coded object, durable fragments.
    pub copies: u8,
    /// Data fragments (k) of an erasure-coded object; 0 for replicas.
    pub data_fragments: u8,
    /// Replica addresses: none for an empty or inline object, whose
    /// record, durable on the metadata copies, holds all of it.
    pub replicas: Vec<Addr>,
    /// Whether the object's bytes are kept inside its record (at most
    /// [`MAX_INLINE`] bytes, where its class allows:
    /// [`StorageClass::may_inline`]).
    pub inline: bool,
}

impl Client {
    /// Posts an object of `size` bytes read from `data`; `progress` is told
    /// how many bytes went out so far. The record has no attributes.
    pub async fn put<R: AsyncRead + Unpin>(
        &self,
        name: &str,
        size: u64,
        data: &mut R,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<PutResult, Error> {
        self.put_with_attributes(name, size, data, progress, || Ok(Vec::new()))
            .await
    }

    /// Posts an object as [`Client::put`] does, with the attributes
    /// `finish` gives once the data has streamed (and before the commit):
    /// a writer computes them from the data (a digest, say) and may
    /// refuse it there. An error from `finish`, or attributes over
    /// [`MAX_ATTRIBUTES`] bytes, aborts the Post: nothing is stored, and
    /// the name keeps the object it held.
    pub async fn put_with_attributes<R: AsyncRead + Unpin>(
        &self,
        name: &str,
        size: u64,
        data: &mut R,
        progress: &(dyn Fn(u64) + Sync),
        finish: impl FnOnce() -> Result<Vec<u8>, Error>,
    ) -> Result<PutResult, Error> {
        self.put_in_class(name, size, data, progress, None, finish)
            .await
    }

    /// Posts an object as [`Client::put_with_attributes`] does, kept in
    /// `class` (`None`: its bucket's class, or the cluster's). An
    /// erasure-coded object is encoded here, a stripe at a time, and
    /// each fragment streamed to its own storage node. An object of at
    /// most [`MAX_INLINE`] bytes whose class the name's metadata copies
    /// can hold without losing redundancy ([`StorageClass::may_inline`])
    /// is sent in one request and kept inside its record instead.
    pub async fn put_in_class<R: AsyncRead + Unpin>(
        &self,
        name: &str,
        size: u64,
        data: &mut R,
        progress: &(dyn Fn(u64) + Sync),
        class: Option<StorageClass>,
        finish: impl FnOnce() -> Result<Vec<u8>, Error>,
    ) -> Result<PutResult, Error> {
        let coord = self.coordinator(name)?;
        let params = match class {
            Some(class) => self.table().params_for(name).with_class(class),
            None => self.table().params_for(name),
        };
        if params.inlines(size) {
            let data = read_inline(name, size, data).await?;
            progress(size);
            let attributes = checked_attributes(name, finish()?)?;
            return self.put_inline(coord, name, class, data, attributes).await;
        }
        let begin = Call::new(
            request_id(),
            vec![coord],
            Body::PostBegin {
                name: name.to_string(),
                size,
                class,
            },
            META_ATTEMPTS,
            META_TIMEOUT_MS,
        );
        let (version, replicas, ticket, data_fragments) = match self.run(begin).await? {
            Body::PostPlan {
                version,
                replicas,
                ticket,
                data_fragments,
                ..
            } if !replicas.is_empty() => (version, replicas, ticket, data_fragments),
            other => return Err(unexpected("PostBegin", &other)),
        };
        let w_d = match data_fragments {
            0 => self.table().params_for(name).w_d.min(replicas.len() as u8),
            // Every fragment: a Post that lost one survives a failure less.
            _ => replicas.len() as u8,
        };
        let sent = match data_fragments {
            0 => self
                .send_data(&replicas, &ticket, size, data, progress)
                .await
                .map(|(crc, copies)| (crc, copies, Vec::new())),
            k => {
                self.send_fragments(&replicas, &ticket, size, k, data, progress)
                    .await
            }
        };
        let sent = match sent {
            Ok((crc, copies, fragment_crcs)) if copies >= w_d => finish()
                .and_then(|a| checked_attributes(name, a))
                .map(|a| (crc, copies, a, fragment_crcs)),
            Ok((_, copies, _)) => Err(Error::Remote {
                code: Code::Unavailable,
                message: format!(
                    "only {copies} of the W_d={w_d} data replicas were written; the Post was dropped"
                ),
            }),
            Err(e) => Err(e),
        };
        let (crc, copies, attributes, fragment_crcs) = match sent {
            Ok(sent) => sent,
            Err(e) => {
                let abort = Call::new(
                    request_id(),
                    vec![coord],
                    Body::PostAbort {
                        name: name.to_string(),
                        version,
                    },
                    2,
                    META_TIMEOUT_MS,
                );
                let _ = self.run(abort).await;
                return Err(e);
            }
        };
        let commit = Call::new(
            request_id(),
            vec![coord],
            Body::PostCommit {
                name: name.to_string(),
                version,
                crc,
                attributes,
                fragment_crcs,
            },
            COMMIT_ATTEMPTS,
            META_TIMEOUT_MS,
        );
        match self.run(commit).await? {
            Body::Done { .. } => Ok(PutResult {
                version,
                crc,
                copies,
                data_fragments,
                replicas,
                inline: false,
            }),
            other => Err(unexpected("PostCommit", &other)),
        }
    }

    /// Posts a small object (`data`, perhaps empty) with one request to
    /// its coordinator `coord`: its record holds it all (see
    /// [`PutResult::inline`]), durable on the metadata copies once the
    /// answer comes.
    async fn put_inline(
        &self,
        coord: Addr,
        name: &str,
        class: Option<StorageClass>,
        data: Vec<u8>,
        attributes: Vec<u8>,
    ) -> Result<PutResult, Error> {
        let crc = crc32c::crc32c(&data);
        let inline = !data.is_empty();
        let post = Call::new(
            request_id(),
            vec![coord],
            Body::PostInline {
                name: name.to_string(),
                class,
                crc,
                data,
                attributes,
            },
            COMMIT_ATTEMPTS,
            META_TIMEOUT_MS,
        );
        match self.run(post).await? {
            Body::Done { version } => Ok(PutResult {
                version,
                crc,
                copies: 0,
                data_fragments: 0,
                replicas: Vec::new(),
                inline,
            }),
            other => Err(unexpected("PostInline", &other)),
        }
    }

    /// Streams the data to the first replica, which forwards it along the
    /// chain; returns the CRC-32C and the number of durable copies.
    async fn send_data<R: AsyncRead + Unpin>(
        &self,
        replicas: &[Addr],
        ticket: &[u8],
        size: u64,
        data: &mut R,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(u32, u8), Error> {
        let Some((&first, chain)) = replicas.split_first() else {
            return Err(Error::Peer(
                "the coordinator's Post plan names no replica".into(),
            ));
        };
        let mut s = Replica::locate(&self.table(), first)?.connect().await?;
        let header = Request::Put {
            addr: first,
            size,
            chain: chain.to_vec(),
        }
        .encode(Credential::Ticket(ticket));
        s.write_all(&header)
            .await
            .map_err(|e| Error::io("sending object data", e))?;
        let crc = write_put_body(&mut s, size, data, progress).await?;
        read_status(&mut s, "storing the object").await?;
        let copies = s
            .read_u8()
            .await
            .map_err(|e| Error::io("reading the Put reply", e))?;
        Ok((crc, copies))
    }
}

impl Client {
    /// Encodes the object read from `data` into the `replicas.len()`
    /// fragments of `ec(k, replicas.len() - k)`, a stripe at a time, and
    /// streams fragment `i` to `replicas[i]`, each with its own CRC-32C
    /// trailer. A fragment whose node fails is dropped and the others
    /// go on; returns the object's CRC-32C, the fragments durably
    /// stored, and each fragment's CRC-32C.
    async fn send_fragments<R: AsyncRead + Unpin>(
        &self,
        replicas: &[Addr],
        ticket: &[u8],
        size: u64,
        k: u8,
        data: &mut R,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(u32, u8, Vec<u32>), Error> {
        let parity = (replicas.len() as u8).saturating_sub(k);
        let layout = StripeLayout::new(size, k, parity);
        let mut coder = StripeCoder::new(layout)?;
        let table = self.table();
        let mut streams: Vec<Option<TcpStream>> = Vec::with_capacity(replicas.len());
        for &addr in replicas {
            streams.push(
                open_fragment_put(&table, addr, ticket, layout.fragment_len())
                    .await
                    .ok(),
            );
        }
        let mut crcs = vec![0u32; replicas.len()];
        let mut object_crc = 0u32;
        let mut stripe = vec![0u8; layout.stripe_data()];
        let mut done = 0u64;
        for _ in 0..layout.stripes {
            let want = (size - done).min(stripe.len() as u64) as usize;
            data.read_exact(&mut stripe[..want]).await.map_err(|e| {
                Error::io(format!("reading the input after {done} of {size} bytes"), e)
            })?;
            stripe[want..].fill(0);
            object_crc = crc32c::crc32c_append(object_crc, &stripe[..want]);
            let parity = coder.encode(&stripe)?;
            let shards = stripe
                .chunks(layout.shard)
                .chain(parity.iter().map(Vec::as_slice));
            let mut writes = tokio::task::JoinSet::new();
            for (index, (shard, slot)) in shards.zip(streams.iter_mut()).enumerate() {
                let Some(mut stream) = slot.take() else {
                    continue;
                };
                crcs[index] = crc32c::crc32c_append(crcs[index], shard);
                let shard = shard.to_vec();
                writes
                    .spawn(async move { (index, stream.write_all(&shard).await.map(|_| stream)) });
            }
            while let Some(joined) = writes.join_next().await {
                // A node that failed is left out from here on.
                if let Ok((index, Ok(stream))) = joined {
                    streams[index] = Some(stream);
                }
            }
            if streams.iter().all(Option::is_none) {
                return Err(Error::Remote {
                    code: Code::Unavailable,
                    message: "no storage node took the object's fragments".into(),
                });
            }
            done += want as u64;
            progress(done);
        }
        let mut copies = 0u8;
        for (index, slot) in streams.iter_mut().enumerate() {
            let Some(stream) = slot else { continue };
            if finish_fragment_put(stream, crcs[index]).await.is_ok() {
                copies += 1;
            }
        }
        Ok((object_crc, copies, crcs))
    }
}

/// Connects to fragment `addr`'s node and sends the Put header of a
/// fragment of `len` bytes with the Post's `ticket`.
async fn open_fragment_put(
    table: &Table,
    addr: Addr,
    ticket: &[u8],
    len: u64,
) -> Result<TcpStream, Error> {
    let mut stream = Replica::locate(table, addr)?.connect().await?;
    let header = Request::Put {
        addr,
        size: len,
        chain: Vec::new(),
    }
    .encode(Credential::Ticket(ticket));
    stream
        .write_all(&header)
        .await
        .map_err(|e| Error::io("sending a fragment", e))?;
    Ok(stream)
}

/// Ends a fragment's Put: its CRC-32C trailer, then the node's answer
/// that it is durable.
async fn finish_fragment_put(stream: &mut TcpStream, crc: u32) -> Result<(), Error> {
    let io = |e| Error::io("finishing a fragment", e);
    stream.write_all(&crc.to_be_bytes()).await.map_err(io)?;
    stream.flush().await.map_err(io)?;
    read_status(stream, "storing a fragment").await?;
    stream.read_u8().await.map_err(io)?;
    Ok(())
}

/// Reads the `size` bytes (at most [`MAX_INLINE`]) of an object kept
/// inline from `data`.
async fn read_inline<R: AsyncRead + Unpin>(
    name: &str,
    size: u64,
    data: &mut R,
) -> Result<Vec<u8>, Error> {
    let len = usize::try_from(size)
        .ok()
        .filter(|&len| len <= MAX_INLINE)
        .ok_or_else(|| {
            Error::Peer(format!(
                "'{name}' of {size} bytes is over the {MAX_INLINE} bytes a record holds"
            ))
        })?;
    let mut bytes = vec![0; len];
    data.read_exact(&mut bytes)
        .await
        .map_err(|e| Error::io(format!("reading the {size} bytes of '{name}'"), e))?;
    Ok(bytes)
}

/// `attributes`, if they fit a record ([`MAX_ATTRIBUTES`]).
fn checked_attributes(name: &str, attributes: Vec<u8>) -> Result<Vec<u8>, Error> {
    if attributes.len() > MAX_ATTRIBUTES {
        return Err(Error::Malformed {
            context: format!("posting '{name}'"),
            source: WireError::Invalid(format!(
                "its attributes take {} bytes; a record holds at most {MAX_ATTRIBUTES}: \
                 store less with the object",
                attributes.len()
            )),
        });
    }
    Ok(attributes)
}

//! Writing: a Post's plan from the name's coordinator, the data streamed
//! to the first replica (which forwards it along the others), then the
//! commit, or an abort when too few copies were written.

use super::calls::{unexpected, Call};
use super::replica::Replica;
use super::{Client, COMMIT_ATTEMPTS, META_ATTEMPTS, META_TIMEOUT_MS};
use crate::stream::{read_status, write_put_body};
use crate::transport::request_id;
use strata_store_protocol::addr::Addr;
use strata_store_protocol::data::{Credential, Request};
use strata_store_protocol::wire::{Body, Code, WireError, MAX_ATTRIBUTES};
use strata_store_protocol::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// What a Post did.
#[derive(Clone, Debug)]
pub struct PutResult {
    /// The version created.
    pub version: u64,
    /// CRC-32C of the data.
    pub crc: u32,
    /// Durable data copies when acknowledged (0 for an empty object).
    pub copies: u8,
    /// Replica addresses: none for an empty object, whose record (size 0,
    /// the empty checksum), durable on the metadata copies, holds all of
    /// it.
    pub replicas: Vec<Addr>,
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
        let coord = self.coordinator(name)?;
        if size == 0 {
            let attributes = checked_attributes(name, finish()?)?;
            return self.put_empty(coord, name, attributes).await;
        }
        let begin = Call::new(
            request_id(),
            vec![coord],
            Body::PostBegin {
                name: name.to_string(),
                size,
            },
            META_ATTEMPTS,
            META_TIMEOUT_MS,
        );
        let (version, replicas, ticket) = match self.run(begin).await? {
            Body::PostPlan {
                version,
                replicas,
                ticket,
                ..
            } if !replicas.is_empty() => (version, replicas, ticket),
            other => return Err(unexpected("PostBegin", &other)),
        };
        let w_d = self.table().params_for(name).w_d;
        let sent = self
            .send_data(&replicas, &ticket, size, data, progress)
            .await;
        let sent = match sent {
            Ok((crc, copies)) if copies >= w_d => {
                finish().and_then(|a| checked_attributes(name, a)).map(|a| (crc, copies, a))
            }
            Ok((_, copies)) => Err(Error::Remote {
                code: Code::Unavailable,
                message: format!(
                    "only {copies} of the W_d={w_d} data replicas were written; the Post was dropped"
                ),
            }),
            Err(e) => Err(e),
        };
        let (crc, copies, attributes) = match sent {
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
            },
            COMMIT_ATTEMPTS,
            META_TIMEOUT_MS,
        );
        match self.run(commit).await? {
            Body::Done { .. } => Ok(PutResult {
                version,
                crc,
                copies,
                replicas,
            }),
            other => Err(unexpected("PostCommit", &other)),
        }
    }

    /// Posts an empty object with one request to its coordinator `coord`:
    /// its record is all of it (see [`PutResult::replicas`]), durable on
    /// the metadata copies once the answer comes.
    async fn put_empty(
        &self,
        coord: Addr,
        name: &str,
        attributes: Vec<u8>,
    ) -> Result<PutResult, Error> {
        let post = Call::new(
            request_id(),
            vec![coord],
            Body::PostEmpty {
                name: name.to_string(),
                attributes,
            },
            COMMIT_ATTEMPTS,
            META_TIMEOUT_MS,
        );
        match self.run(post).await? {
            Body::Done { version } => Ok(PutResult {
                version,
                crc: crc32c::crc32c(&[]),
                copies: 0,
                replicas: Vec::new(),
            }),
            other => Err(unexpected("PostEmpty", &other)),
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

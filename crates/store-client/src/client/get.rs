//! Reading: a name's record from its metadata addresses ([`Client::stat`]),
//! then the object's data from its replicas ([`Client::get`]), in one
//! direction (see the module above for the steps). An empty or inline
//! object's record holds all of it: its Get ends with the record.

use super::calls::{unexpected, Call};
use super::local::LocalCheck;
use super::replica::Replica;
use super::report::refused_as_damaged;
use super::{checked_name, Client, META_ATTEMPTS, META_TIMEOUT_MS};
use crate::erasure::{FragmentReader, FragmentSource};
use crate::stream::{read_get_body, read_status};
use crate::transport::{guarded, request_id, LAST_REPLY_STALL, REPLY_STALL};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use strata_store_protocol::addr::Addr;
use strata_store_protocol::data::{CodedObject, Credential, Request};
use strata_store_protocol::wire::{Body, Fragments, Record};
use strata_store_protocol::Error;
use tokio::io::{AsyncSeek, AsyncSeekExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// An object looked up for reading ([`Client::open`]): its record, and
/// the Get ticket for its replicas, valid for a short while.
#[derive(Clone, Debug)]
pub struct Opened {
    /// The object's record (its attributes included).
    pub record: Record,
    /// The Get ticket of its replicas.
    pub(super) ticket: Vec<u8>,
}

impl Client {
    /// Reads an object's metadata from the first metadata address that has it.
    pub async fn stat(&self, name: &str) -> Result<Record, Error> {
        Ok(self.stat_ticketed(name).await?.0)
    }

    /// [`Client::stat`], with the Get ticket the metadata node issued for
    /// the record's replicas (empty for an empty object).
    async fn stat_ticketed(&self, name: &str) -> Result<(Record, Vec<u8>), Error> {
        let body = Body::Get {
            name: name.to_string(),
        };
        self.look_up(name, body, "Get", |answer| match answer {
            Body::Found { record, ticket } => Ok((record, ticket)),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// [`Client::stat`], with the link proof the metadata node issued to
    /// this client's tenant for the record's replicas (empty when it has
    /// none): what a rename's `Link` of them under a new name must carry
    /// ([`strata_store_protocol::auth::LinkProof`]).
    pub(super) async fn stat_for_link(&self, name: &str) -> Result<(Record, Vec<u8>), Error> {
        let body = Body::GetLinkProof {
            name: name.to_string(),
        };
        self.look_up(name, body, "GetLinkProof", |answer| match answer {
            Body::LinkProof { record, proof } => Ok((record, proof)),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// Asks `name`'s metadata addresses (falling through to the next on a
    /// miss) with `request`, and takes the record and credential `pick`
    /// finds in the answer (it gives back any other answer), if the record
    /// is `name`'s.
    async fn look_up(
        &self,
        name: &str,
        request: Body,
        kind: &str,
        pick: impl Fn(Body) -> Result<(Record, Vec<u8>), Box<Body>>,
    ) -> Result<(Record, Vec<u8>), Error> {
        checked_name(name, "the object name")?;
        let targets = self.table().meta_addrs(name);
        let call = Call::new(
            request_id(),
            targets,
            request,
            META_ATTEMPTS,
            META_TIMEOUT_MS,
        )
        .falling_through();
        match pick(self.run(call).await?) {
            Ok((record, credential)) if record.name == name => Ok((record, credential)),
            Ok((record, _)) => Err(Error::Peer(format!(
                "unexpected answer to {kind}: the record of '{}', not '{name}'",
                record.name
            ))),
            Err(other) => Err(unexpected(kind, &other)),
        }
    }

    /// The replicas of `record` some node serves, in the record's order,
    /// and the error of the last one none does (the others are tried).
    pub(super) fn locate_replicas(&self, record: &Record) -> (Vec<Replica>, Option<Error>) {
        let table = self.table();
        let mut last = None;
        let mut replicas = Vec::with_capacity(record.replicas.len());
        for &addr in &record.replicas {
            match Replica::locate(&table, addr) {
                Ok(replica) => replicas.push(replica),
                Err(e) => last = Some(e),
            }
        }
        (replicas, last)
    }

    /// Reads an object into `out` from the first replica that serves it
    /// whole and verified, trying them in the order the client's replica
    /// choice gives ([`Client::set_replica_choice`]); returns its metadata. A replica that served
    /// bytes failing the record's CRC-32C, or that its node refused as
    /// damaged, is reported to the name's coordinator once another has
    /// served the object (in the background: never a delay or a failure
    /// of this Get), so that it is repaired.
    pub async fn get<W: AsyncWrite + AsyncSeek + Unpin>(
        &self,
        name: &str,
        out: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<Record, Error> {
        let opened = self.open(name).await?;
        self.read(&opened, out, progress).await?;
        Ok(opened.record)
    }

    /// Looks an object up for reading: one metadata round trip, whose
    /// record a caller may check (its size, version or attributes)
    /// before [`Client::read`] reads that very version's data.
    pub async fn open(&self, name: &str) -> Result<Opened, Error> {
        let (record, ticket) = self.stat_ticketed(name).await?;
        Ok(Opened { record, ticket })
    }

    /// Reads the data of an object [`Client::open`] looked up into `out`,
    /// as [`Client::get`] does. `out` is rewound (sought to its start)
    /// before each replica is tried; an output that cannot go back (a
    /// stream already sent on) fails that seek, which ends the read.
    /// A replica overwritten or deleted since the lookup is gone: the
    /// error is the storage node's.
    pub async fn read<W: AsyncWrite + AsyncSeek + Unpin>(
        &self,
        opened: &Opened,
        out: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(), Error> {
        let Opened { record, ticket } = opened;
        let name = record.name.as_str();
        if let Some(data) = &record.inline {
            return write_inline(record, data, out, progress).await;
        }
        if record.size == 0 && record.crc == crc32c::crc32c(&[]) {
            // The metadata says everything an empty object holds, so there is
            // no data to fetch: a Get is one metadata round trip, as in the
            // design's zero-size measurements. A record whose checksum does
            // not fit an empty object goes through the replicas and fails
            // there with the mismatch.
            return Ok(());
        }
        if let Some(fragments) = &record.fragments {
            return self
                .read_fragments(record, fragments, ticket, out, progress)
                .await;
        }
        let (replicas, mut last) = self.locate_replicas(record);
        // Replicas that served bad bytes or were refused as damaged:
        // reported once another one has served the object.
        let mut damaged = Vec::new();
        // A replica on this process's own disk first: no network at all.
        let mut local_damaged = None;
        if let Some((addr, result)) = self.read_local(record, out, progress).await {
            match result {
                Ok(()) => return Ok(()),
                Err(e) => {
                    if matches!(e, Error::Corrupt(_)) {
                        // Its own bytes failed the record's checksum here,
                        // not a peer's word: reported at once, even if the
                        // output cannot be rewound for another replica.
                        self.report_bad_replica(name, addr);
                        local_damaged = Some(addr);
                    }
                    last = Some(e);
                }
            }
        }
        let order = self.replica_order(&replicas);
        for (position, &index) in order.iter().enumerate() {
            let replica = replicas[index];
            if local_damaged == Some(replica.addr) {
                continue;
            }
            // Give a silent node up only while another replica is left.
            let stall = match position + 1 == order.len() {
                true => LAST_REPLY_STALL,
                false => REPLY_STALL,
            };
            let addr = replica.addr;
            // An idle connection the node closed meanwhile fails before any
            // byte of the object arrives: try that replica again afresh.
            for _ in 0..2 {
                out.seek(std::io::SeekFrom::Start(0))
                    .await
                    .map_err(|e| Error::io("rewinding the output", e))?;
                self.read_sent(&replica);
                let (stream, reused) = match self.connections.take(&replica).await {
                    Ok(c) => c,
                    Err(e) => {
                        // That node is unreachable: the next replica.
                        self.read_sample(&replica, None);
                        last = Some(e);
                        break;
                    }
                };
                let request = Request::Get { addr }.encode(Credential::Ticket(ticket));
                let answer = read_replica(stream, &replica, request, record, out, progress, stall);
                match answer.await {
                    Ok((stream, latency)) => {
                        self.read_sample(&replica, Some(latency));
                        if let Some(stream) = stream {
                            self.connections.keep(&replica, stream);
                        }
                        for bad in damaged {
                            self.report_bad_replica(name, bad);
                        }
                        return Ok(());
                    }
                    Err((e, started)) => {
                        let stale = reused && !started;
                        let bad = matches!(e, Error::Corrupt(_)) || refused_as_damaged(&e);
                        if bad && !damaged.contains(&addr) {
                            damaged.push(addr);
                        }
                        if !started && !stale && !bad {
                            // It did not answer: as slow as can be, until
                            // samples say otherwise.
                            self.read_sample(&replica, None);
                        }
                        last = Some(e);
                        if !stale {
                            break;
                        }
                        // The retry connects afresh, not to the next idle
                        // connection, which the node closed just as well.
                        self.connections.forget_idle(&replica);
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::Corrupt(format!("{name:?} has no replica"))))
    }

    /// The object `opened` names, as a region of a replica file on this
    /// process's own disk ([`Client::set_local_replicas`]) checked against
    /// its record's size and CRC-32C just now, for a server to send with
    /// `sendfile`: the first local replica that passes, those that fail
    /// being reported for repair.
    pub async fn checked_local(&self, opened: &Opened) -> LocalCheck {
        let record = &opened.record;
        if record.inline.is_some() || record.fragments.is_some() || record.size == 0 {
            return LocalCheck::Absent;
        }
        let Some(local) = self.local.get() else {
            return LocalCheck::Absent;
        };
        if let Some(region) = super::local::pinned_region(local, record) {
            return LocalCheck::Passed(region);
        }
        let mut damaged = false;
        // Every local replica in turn: one that fails its check is
        // reported, and the next one (this process may run several
        // storage nodes) is sent instead.
        for &addr in &record.replicas {
            let Some(replica) = local.replicas.open(addr) else {
                continue;
            };
            match super::local::check_local(replica, addr, record, local).await {
                Ok(region) => return LocalCheck::Passed(region),
                Err(e) => {
                    tracing::warn!("{}", e.report());
                    damaged = true;
                    if matches!(e, Error::Corrupt(_)) {
                        self.report_bad_replica(&record.name, addr);
                    }
                }
            }
        }
        if damaged {
            LocalCheck::Damaged
        } else {
            LocalCheck::Absent
        }
    }

    /// Reads the first of `record`'s replicas that this process holds on
    /// its own disk ([`Client::set_local_replicas`]) into `out`, rewound
    /// first: the replica tried and how it went, or `None` if none is
    /// local.
    async fn read_local<W: AsyncWrite + AsyncSeek + Unpin>(
        &self,
        record: &Record,
        out: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Option<(Addr, Result<(), Error>)> {
        let local = self.local.get()?;
        let (addr, replica) = record
            .replicas
            .iter()
            .find_map(|&addr| Some((addr, local.replicas.open(addr)?)))?;
        if let Err(e) = out.seek(std::io::SeekFrom::Start(0)).await {
            return Some((addr, Err(Error::io("rewinding the output", e))));
        }
        let read = super::local::read_local(replica, addr, record, out, progress).await;
        Some((addr, read))
    }

    /// Reads an erasure-coded object into `out`: whole from the node of
    /// its fragment 0 if it is small enough (from that node's object
    /// cache, or gathered there), otherwise or if that fails from the `k`
    /// fragments the replica choice expects to answer fastest (a hedge
    /// asks for one more if the first stripe is late,
    /// [`Client::set_hedge`]), replacing any that fails by another. Each
    /// fragment is checked against its CRC-32C, and the whole against the
    /// object's, before the read succeeds; a read with a fragment that
    /// failed its check is done again without it (rewinding `out`), and
    /// the fragment is reported to the coordinator for repair. The
    /// decisions are [`crate::read_plan::ReadPlan`]'s.
    async fn read_fragments<W: AsyncWrite + AsyncSeek + Unpin>(
        &self,
        record: &Record,
        fragments: &Fragments,
        ticket: &[u8],
        out: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(), Error> {
        let table = self.table();
        let mut located = Vec::with_capacity(record.replicas.len());
        for (index, &addr) in record.replicas.iter().enumerate() {
            if let Ok(replica) = Replica::locate(&table, addr) {
                located.push((index, replica));
            }
        }
        let replicas: Vec<Replica> = located.iter().map(|(_, r)| *r).collect();
        let sources: Vec<FragmentSource> = self
            .replica_order(&replicas)
            .iter()
            .map(|&i| located[i])
            .map(|(index, replica)| FragmentSource {
                index,
                addr: replica.addr,
                endpoint: replica.endpoint,
                request: Request::Get { addr: replica.addr }.encode(Credential::Ticket(ticket)),
                pool: Some(self.fragment_pool.clone()),
            })
            .collect();
        // The node of fragment 0 first: from its object cache, or
        // gathered there, in one stream.
        let first = located.first().filter(|(index, _)| *index == 0);
        let whole = first.is_some() && record.size <= self.whole_object_reads();
        let mut reader = FragmentReader::new(record.size, fragments, sources, self.hedge(), whole)?;
        if let Some(&(_, first)) = first.filter(|_| reader.asks_whole()) {
            let served = self
                .read_whole(record, fragments, first, ticket, out, progress)
                .await;
            if reader.whole_read(served) {
                return Ok(());
            }
        }
        let find = |index: usize| located.iter().find(|(i, _)| *i == index).map(|(_, r)| r);
        let mut sent = 0;
        let mut sampled = 0;
        let mut failed = 0;
        let result = loop {
            out.seek(std::io::SeekFrom::Start(0))
                .await
                .map_err(|e| Error::io("rewinding the output", e))?;
            let pass = decode_into(&mut reader, record, out, progress).await;
            for &index in &reader.opened[sent..] {
                if let Some(replica) = find(index) {
                    self.read_sent(replica);
                }
            }
            sent = reader.opened.len();
            for &(index, latency) in &reader.first_shard[sampled..] {
                if let Some(replica) = find(index) {
                    self.read_sample(replica, Some(latency));
                }
            }
            sampled = reader.first_shard.len();
            for failure in &reader.failures[failed..] {
                if let Some(replica) = find(failure.index).filter(|_| !failure.damaged) {
                    self.read_sample(replica, None);
                }
            }
            failed = reader.failures.len();
            match pass {
                // Read again without the fragments that failed.
                Ok(false) => continue,
                Ok(true) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        let mut damaged: Vec<Addr> = Vec::new();
        for failure in reader.failures.iter().filter(|f| f.damaged) {
            if !damaged.contains(&failure.addr) {
                damaged.push(failure.addr);
            }
        }
        for bad in damaged {
            self.report_bad_replica(&record.name, bad);
        }
        result
    }

    /// Reads an erasure-coded object whole from `first`, the node of its
    /// fragment 0 ([`Request::GetObject`]); whether it came, checked
    /// against the record's size and CRC-32C. On any failure the caller
    /// reads the fragments itself (the output is rewound then).
    async fn read_whole<W: AsyncWrite + AsyncSeek + Unpin>(
        &self,
        record: &Record,
        fragments: &Fragments,
        first: Replica,
        ticket: &[u8],
        out: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> bool {
        let request = Request::GetObject {
            addr: first.addr,
            object: CodedObject {
                size: record.size,
                crc: record.crc,
                data: fragments.data,
                fragments: record
                    .replicas
                    .iter()
                    .copied()
                    .zip(fragments.crcs.iter().copied())
                    .collect(),
            },
        }
        .encode(Credential::Ticket(ticket));
        self.read_sent(&first);
        let Ok((stream, _)) = self.connections.take(&first).await else {
            self.read_sample(&first, None);
            return false;
        };
        // The fragments are the fallback: a silent node is given up.
        let read = read_replica(stream, &first, request, record, out, progress, REPLY_STALL);
        match read.await {
            Ok((stream, latency)) => {
                self.read_sample(&first, Some(latency));
                if let Some(stream) = stream {
                    self.connections.keep(&first, stream);
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Reads a whole object into memory.
    pub async fn get_bytes(&self, name: &str) -> Result<(Record, Vec<u8>), Error> {
        let mut cur = std::io::Cursor::new(Vec::new());
        let rec = self.get(name, &mut cur, &|_| {}).await?;
        let mut v = cur.into_inner();
        v.truncate(rec.size as usize);
        Ok((rec, v))
    }
}

/// Bytes of a Get reply read at once: a small object's whole reply.
const REPLY_BUFFER: usize = 8 * 1024;

/// The node's latency sample is the time until this much of the body
/// (or all of a smaller one) has arrived: the time to the first byte
/// alone misses a node whose link is slow, since a reply's first
/// segment passes before the link's queue holds it back, and the whole
/// reply would make a large object's node look slow.
const LATENCY_SAMPLE_BYTES: u64 = 64 * 1024;

/// Reads one replica over `s` into `out`: the Get `request` (or a
/// GetObject's), the reply's status, then its body (size, data, trailer),
/// checked against `record`. Gives the stream back at a request
/// boundary (`None` if it is out of step) and the node's latency sample
/// (see [`LATENCY_SAMPLE_BYTES`]), or the error and whether the node had
/// started answering. A node silent for `stall` has failed.
async fn read_replica<W: AsyncWrite + Unpin>(
    mut s: TcpStream,
    replica: &Replica,
    request: Vec<u8>,
    record: &Record,
    out: &mut W,
    progress: &(dyn Fn(u64) + Sync),
    stall: Duration,
) -> Result<(Option<TcpStream>, Duration), (Error, bool)> {
    let io = |e| Error::io("reading object data", e);
    let start = Instant::now();
    let before = |e| (e, false);
    let after = |e| (e, true);
    s.write_all(&request).await.map_err(io).map_err(before)?;
    // Buffered, so that a small reply's status, size, data and trailer
    // take one receive instead of one each; reads of a large body's
    // chunks bypass the buffer.
    let mut reply = BufReader::with_capacity(REPLY_BUFFER, guarded(&mut s, stall));
    read_status(&mut reply, "reading the replica")
        .await
        .map_err(before)?;
    let sample_at = record.size.min(LATENCY_SAMPLE_BYTES);
    // Nanoseconds + 1 when the sample's bytes were in (0: not yet).
    let sampled = std::sync::atomic::AtomicU64::new(0);
    let timed = |done: u64| {
        if done >= sample_at && sampled.load(Ordering::Relaxed) == 0 {
            let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
            sampled.store(nanos + 1, Ordering::Relaxed);
        }
        progress(done);
    };
    read_get_body(
        &mut reply,
        replica.addr,
        record.size,
        record.crc,
        out,
        &timed,
    )
    .await
    .map_err(after)?;
    let latency = match sampled.load(Ordering::Relaxed) {
        0 => start.elapsed(),
        nanos => Duration::from_nanos(nanos - 1),
    };
    // The node sends nothing past the trailer until asked again: bytes
    // left over mean the stream is out of step, and it is not kept.
    let in_step = reply.buffer().is_empty();
    drop(reply);
    out.flush()
        .await
        .map_err(|e| after(Error::io("writing the output", e)))?;
    Ok((in_step.then_some(s), latency))
}

/// Writes the bytes of an object kept inline in its `record` to `out`,
/// checked against the record's CRC-32C once more (decoding checked them
/// too: a read never hands on bytes it has not checked itself).
async fn write_inline<W: AsyncWrite + AsyncSeek + Unpin>(
    record: &Record,
    data: &[u8],
    out: &mut W,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(), Error> {
    if data.len() as u64 != record.size || crc32c::crc32c(data) != record.crc {
        return Err(Error::Corrupt(format!(
            "{:?}: its inline bytes fail the record's size or checksum",
            record.name
        )));
    }
    let io = |e| Error::io("writing the output", e);
    out.seek(std::io::SeekFrom::Start(0)).await.map_err(io)?;
    out.write_all(data).await.map_err(io)?;
    out.flush().await.map_err(io)?;
    progress(record.size);
    Ok(())
}

/// Writes the stripes of one pass of `reader` to `out` (the last one
/// cut at the object's size), then checks every fragment read and the
/// object's CRC-32C: whether the read is done (`false`: read again,
/// rewinding `out`).
async fn decode_into<W: AsyncWrite + Unpin>(
    reader: &mut FragmentReader,
    record: &Record,
    out: &mut W,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<bool, Error> {
    let mut done = 0u64;
    let mut crc = 0u32;
    while let Some(stripe) = reader.next_stripe().await {
        for shard in stripe? {
            let take = (record.size - done).min(shard.len() as u64) as usize;
            crc = crc32c::crc32c_append(crc, &shard[..take]);
            out.write_all(&shard[..take])
                .await
                .map_err(|e| Error::io("writing the output", e))?;
            done += take as u64;
        }
        progress(done);
    }
    let object_ok = crc == record.crc && done == record.size;
    if !reader.finish(object_ok).await? {
        return Ok(false);
    }
    out.flush()
        .await
        .map_err(|e| Error::io("writing the output", e))?;
    Ok(true)
}

//! Ranged reads ([`Client::read_range`]): the bytes of a range of an
//! object, read from the chunks of a replica that cover it
//! ([`crate::range_body`]), each checked against its CRC-32C before it
//! is handed on. A chunk that fails its check is reported, and the read
//! goes on from the first byte not handed on, on another replica. An
//! inline object is cut in memory; an erasure-coded one reads only the
//! stripes covering the range ([`super::range_ec`]). A replica written
//! before chunk tables existed (layout 1) is read whole and cut here.

use super::get::Opened;
use super::replica::Replica;
use super::report::refused_as_damaged;
use super::Client;
use crate::range_body::{read_range_body, Asked, RangeAnswer};
use crate::stream::read_status;
use crate::transport::{guarded, LAST_REPLY_STALL, REPLY_STALL};
use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use strata_store_protocol::addr::Addr;
use strata_store_protocol::data::{Credential, Request};
use strata_store_protocol::range::MAX_RANGE;
use strata_store_protocol::wire::Record;
use strata_store_protocol::Error;
use tokio::io::{AsyncSeek, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Bytes of a ranged reply read at once.
const REPLY_BUFFER: usize = 64 * 1024;

impl Client {
    /// Reads the bytes `range` of the object [`Client::open`] looked up
    /// into `out`, and only those: every byte is checked (against its
    /// chunk's CRC-32C, or for an inline object the record's) before it
    /// is written, so `out` never needs rewinding. `progress` is told the
    /// bytes of the range written so far. A chunk failing its check is
    /// read from another replica and the bad replica reported for repair,
    /// as [`Client::read`] does. An empty range or one ending beyond the
    /// object is refused.
    pub async fn read_range<W: AsyncWrite + Unpin>(
        &self,
        opened: &Opened,
        range: Range<u64>,
        out: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(), Error> {
        let record = &opened.record;
        if range.start >= range.end || range.end > record.size {
            return Err(Error::config(format!(
                "the range [{}, {}) of {:?} is empty or ends beyond its {} bytes: ask for \
                 bytes within it",
                range.start, range.end, record.name, record.size
            )));
        }
        if let Some(data) = &record.inline {
            return write_inline_range(record, data, range, out, progress).await;
        }
        let mut at = range.start;
        while at < range.end {
            let piece_len = match record.fragments {
                Some(_) => super::range_ec::EC_PIECE,
                None => MAX_RANGE,
            };
            let piece = at..range.end.min(at.saturating_add(piece_len));
            let base = at - range.start;
            let told = |n: u64| progress(base + n);
            let (answer, handed) = match &record.fragments {
                Some(fragments) => {
                    let read = self.fragments_range(opened, fragments, piece.clone(), out, &told);
                    read.await?
                }
                None => {
                    self.replicas_range(opened, piece.clone(), out, &told)
                        .await?
                }
            };
            at = piece.start + handed;
            if answer == RangeAnswer::NoTable {
                // Layout 1: the rest is read whole and cut here.
                let base = at - range.start;
                let told = |n: u64| progress(base + (n.saturating_sub(at)).min(range.end - at));
                let mut span = SpanWriter::new(out, at..range.end);
                return self.read(opened, &mut span, &told).await;
            }
        }
        out.flush()
            .await
            .map_err(|e| Error::io("writing the output", e))
    }

    /// Reads `piece` (at most [`MAX_RANGE`] bytes) of a replicated
    /// object into `out` from its replicas, in the replica choice's
    /// order, going on from the first byte not handed on when one fails:
    /// how it ended and the bytes handed on.
    async fn replicas_range<W: AsyncWrite + Unpin>(
        &self,
        opened: &Opened,
        piece: Range<u64>,
        out: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(RangeAnswer, u64), Error> {
        let record = &opened.record;
        let (replicas, mut last) = self.locate_replicas(record);
        let order = self.replica_order(&replicas);
        let mut damaged: Vec<Addr> = Vec::new();
        let mut handed = 0u64;
        for (position, &index) in order.iter().enumerate() {
            let replica = replicas[index];
            let stall = match position + 1 == order.len() {
                true => LAST_REPLY_STALL,
                false => REPLY_STALL,
            };
            let asked = |handed: u64| Asked {
                replica: replica.addr,
                size: record.size,
                offset: piece.start + handed,
                length: piece.end - piece.start - handed,
            };
            let how = (opened.ticket.as_slice(), stall);
            let read = self.range_from(&replica, how, asked, out, &mut handed, progress);
            match read.await {
                Ok(answer) => {
                    for bad in damaged {
                        self.report_bad_replica(&record.name, bad);
                    }
                    return Ok((answer, handed));
                }
                Err(e) => {
                    let bad = matches!(e, Error::Corrupt(_)) || refused_as_damaged(&e);
                    if bad && !damaged.contains(&replica.addr) {
                        damaged.push(replica.addr);
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::Corrupt(format!("{:?} has no replica", record.name))))
    }

    /// Reads what `asked` says (given the bytes already handed on) of
    /// one replica into `out` with the Get `ticket`, giving the node up
    /// after `stall` of silence, on an idle connection or a new one (an
    /// idle one the node closed meanwhile is tried again afresh), and
    /// keeps the connection when the answer ended in step.
    pub(super) async fn range_from<W: AsyncWrite + Unpin>(
        &self,
        replica: &Replica,
        (ticket, stall): (&[u8], Duration),
        asked: impl Fn(u64) -> Asked,
        out: &mut W,
        handed: &mut u64,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<RangeAnswer, Error> {
        let mut last = None;
        for _ in 0..2 {
            self.read_sent(replica);
            let (stream, reused) = match self.connections.take(replica).await {
                Ok(c) => c,
                Err(e) => {
                    self.read_sample(replica, None);
                    return Err(e);
                }
            };
            let before = *handed;
            let read = read_range(
                stream,
                (asked(before), stall),
                ticket,
                out,
                handed,
                progress,
            );
            match read.await {
                Ok((answer, stream, latency)) => {
                    self.read_sample(replica, Some(latency));
                    if let Some(stream) = stream {
                        self.connections.keep(replica, stream);
                    }
                    return Ok(answer);
                }
                Err((e, started)) => {
                    let stale = reused && !started && *handed == before;
                    if !stale {
                        if !started && !matches!(e, Error::Corrupt(_)) {
                            self.read_sample(replica, None);
                        }
                        return Err(e);
                    }
                    last = Some(e);
                    self.connections.forget_idle(replica);
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::Peer("no connection to the replica".into())))
    }
}

/// Sends one GetRange on `s` (a node silent for `stall` has failed)
/// and reads its answer into `out`: how it
/// went, the stream if it ended in step, and the time to the answer's
/// status (the node's latency sample); or the error and whether the
/// node had started answering.
async fn read_range<W: AsyncWrite + Unpin>(
    mut s: TcpStream,
    (asked, stall): (Asked, Duration),
    ticket: &[u8],
    out: &mut W,
    handed: &mut u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(RangeAnswer, Option<TcpStream>, Duration), (Error, bool)> {
    let start = Instant::now();
    let request = Request::GetRange {
        addr: asked.replica,
        offset: asked.offset,
        length: asked.length,
    }
    .encode(Credential::Ticket(ticket));
    let io = |e| (Error::io("asking for a range of a replica", e), false);
    s.write_all(&request).await.map_err(io)?;
    let mut reply = BufReader::with_capacity(REPLY_BUFFER, guarded(&mut s, stall));
    read_status(&mut reply, "reading a range of the replica")
        .await
        .map_err(|e| (e, false))?;
    let latency = start.elapsed();
    let answer = read_range_body(&mut reply, asked, out, handed, progress)
        .await
        .map_err(|e| (e, true))?;
    // Bytes left over mean the stream is out of step: not kept.
    let in_step = reply.buffer().is_empty();
    drop(reply);
    Ok((answer, in_step.then_some(s), latency))
}

/// Writes `range` of an inline object's bytes, once they passed the
/// record's size and CRC-32C.
async fn write_inline_range<W: AsyncWrite + Unpin>(
    record: &Record,
    data: &[u8],
    range: Range<u64>,
    out: &mut W,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(), Error> {
    if data.len() as u64 != record.size || crc32c::crc32c(data) != record.crc {
        return Err(Error::Corrupt(format!(
            "{:?}: its inline bytes fail the record's size or checksum",
            record.name
        )));
    }
    // Within the data: checked against the record's size above.
    let slice = &data[range.start as usize..range.end as usize];
    let io = |e| Error::io("writing the output", e);
    out.write_all(slice).await.map_err(io)?;
    out.flush().await.map_err(io)?;
    progress(slice.len() as u64);
    Ok(())
}

/// An output that takes a whole object's bytes and passes on only those
/// of `span` (offsets in the object): how a range of a replica without a
/// chunk table is read. Rewinding (to try another replica) is possible
/// while nothing was passed on.
pub(crate) struct SpanWriter<'a, W> {
    inner: &'a mut W,
    span: Range<u64>,
    position: u64,
    passed: bool,
}

impl<'a, W> SpanWriter<'a, W> {
    /// A writer passing the bytes of `span` to `inner`.
    pub(crate) fn new(inner: &'a mut W, span: Range<u64>) -> Self {
        SpanWriter {
            inner,
            span,
            position: 0,
            passed: false,
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for SpanWriter<'_, W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let at = this.position;
        let consumed = if at < this.span.start {
            // Before the span: dropped.
            (this.span.start - at).min(buf.len() as u64) as usize
        } else if at < this.span.end {
            let take = (this.span.end - at).min(buf.len() as u64) as usize;
            let n = std::task::ready!(Pin::new(&mut *this.inner).poll_write(cx, &buf[..take]))?;
            this.passed |= n > 0;
            n
        } else {
            // Past the span: dropped.
            buf.len()
        };
        this.position += consumed as u64;
        Poll::Ready(Ok(consumed))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

impl<W: Unpin> AsyncSeek for SpanWriter<'_, W> {
    fn start_seek(self: Pin<&mut Self>, position: io::SeekFrom) -> io::Result<()> {
        let this = self.get_mut();
        if position != io::SeekFrom::Start(0) || this.passed {
            return Err(io::Error::other(
                "a ranged read cannot start over once bytes of it were handed on",
            ));
        }
        this.position = 0;
        Ok(())
    }

    fn poll_complete(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Poll::Ready(Ok(self.position))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncSeekExt;

    proptest::proptest! {
        /// Whatever the writes a whole read makes, the span's bytes and
        /// only those come out, in order.
        #[test]
        fn a_span_writer_passes_exactly_its_span(
            size in 1usize..5000,
            a in 0usize..5000,
            b in 0usize..5000,
            cuts in proptest::collection::vec(1usize..700, 1..20),
        ) {
            let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let (x, y) = (a % size, b % size);
            let (from, to) = (x.min(y), x.max(y) + 1);
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let got = rt.block_on(async {
                let mut out = Vec::new();
                let mut span = SpanWriter::new(&mut out, from as u64..to as u64);
                // A false start before the span is rewound.
                span.write_all(&data[..from.min(3)]).await.unwrap();
                span.seek(io::SeekFrom::Start(0)).await.unwrap();
                let mut rest = &data[..];
                for cut in cuts.iter().cycle() {
                    if rest.is_empty() {
                        break;
                    }
                    let n = (*cut).min(rest.len());
                    span.write_all(&rest[..n]).await.unwrap();
                    rest = &rest[n..];
                }
                span.flush().await.unwrap();
                let rewound = span.seek(io::SeekFrom::Start(0)).await;
                proptest::prop_assert!(rewound.is_err(), "rewound after bytes were passed on");
                Ok(out)
            })?;
            proptest::prop_assert_eq!(&got[..], &data[from..to]);
        }
    }
}

//! Moving bodies between HTTP and the store without holding them whole:
//! [`BodyReader`] feeds a PutObject's body to the store's Post while it
//! computes the MD5, and [`Sink`] takes a store read and sends the bytes
//! of the range asked to the response as they come.

use bytes::Bytes;
use futures::Stream;
use md5::{Digest, Md5};
use s3s::dto::StreamingBlob;
use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use strata_store_client::client::local::CheckedRegion;
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;

/// What a Put's body gave so far: shared between the reader the store's
/// Post reads and the gateway, which looks at it once the data went out.
#[derive(Default)]
pub(crate) struct Received {
    /// MD5 of the bytes read so far.
    pub md5: Md5,
    /// Bytes read so far.
    pub bytes: u64,
    /// Why the body could not be read, if it could not.
    pub failed: Option<String>,
    /// Whether the body's end was read: a store that stopped reading
    /// early (it refused the Put) leaves it false.
    pub ended: bool,
    /// The `x-amz-checksum-*` algorithms the request named, fed as the
    /// MD5 is (none named: nothing computed).
    pub checksums: s3s::checksum::ChecksumHasher,
}

/// Most bytes a [`BodyReader`] keeps a copy of to serve again after a
/// refused Post: an inline object's (the store reads it whole before it
/// asks for the name); a larger Post is refused before it reads a byte.
const KEPT_FOR_RETRY: usize = strata_store_protocol::class::MAX_INLINE;

/// A PutObject's body as an [`AsyncRead`], hashed as it is read.
pub(crate) struct BodyReader {
    body: Option<StreamingBlob>,
    chunk: Bytes,
    received: Arc<Mutex<Received>>,
    /// A copy of every byte read so far, while they are at most
    /// [`KEPT_FOR_RETRY`]: what [`Rewind::rewind`] serves again.
    kept: Option<Vec<u8>>,
    /// Bytes at the front of `chunk` served before a rewind: served
    /// again, but neither hashed nor counted again.
    replayed: usize,
    /// Bytes taken from `body` so far.
    pulled: u64,
    /// The body's size, when its stream must be read to its end as soon
    /// as that many bytes came: an aws-chunked body's trailers (its
    /// checksums) follow its data, and the store reads no further than
    /// the size.
    drain_at: Option<u64>,
}

impl BodyReader {
    /// A reader of `body` that records what it read in `received`.
    pub fn new(body: Option<StreamingBlob>, received: Arc<Mutex<Received>>) -> BodyReader {
        BodyReader {
            body,
            chunk: Bytes::new(),
            received,
            kept: Some(Vec::new()),
            replayed: 0,
            pulled: 0,
            drain_at: None,
        }
    }

    /// The same reader, which reads its stream to the end once `size`
    /// bytes came, before it serves the last of them.
    pub fn draining_at(mut self, size: u64) -> BodyReader {
        self.drain_at = Some(size);
        self
    }

    /// Records why the body failed (for the request's answer) and gives
    /// the read's error.
    fn failed(&self, why: String) -> io::Error {
        lock(&self.received).failed = Some(why.clone());
        io::Error::other(why)
    }

    /// Once every byte of the body came (`drain_at`), reads the rest of
    /// the stream (the trailers of an aws-chunked body, which s3s takes
    /// aside): no more data may come.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.drain_at.is_some_and(|size| self.pulled >= size) {
            let Some(body) = self.body.as_mut() else {
                break;
            };
            match ready!(Pin::new(body).poll_next(cx)) {
                Some(Ok(extra)) if extra.is_empty() => {}
                Some(Ok(extra)) => {
                    let why = format!(
                        "the request body holds more than the {} bytes its length declares \
                         ({} more)",
                        self.pulled,
                        extra.len()
                    );
                    return Poll::Ready(Err(self.failed(why)));
                }
                Some(Err(e)) => {
                    return Poll::Ready(Err(
                        self.failed(format!("the request body could not be read: {e}"))
                    ));
                }
                None => {
                    self.body = None;
                    lock(&self.received).ended = true;
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// A Post's data that can be read again from its start, for a Post the
/// store refused because another Post of the name was in progress.
pub(crate) trait Rewind: AsyncRead + Unpin {
    /// Goes back to the first byte; false if that is no longer possible
    /// (more was read than is kept).
    fn rewind(&mut self) -> bool;
}

impl Rewind for BodyReader {
    fn rewind(&mut self) -> bool {
        let Some(kept) = &self.kept else {
            return false;
        };
        // Served so far: `kept`; still to serve: the chunk past the
        // bytes a previous rewind had not served again yet.
        let mut joined = bytes::BytesMut::with_capacity(kept.len() + self.chunk.len());
        joined.extend_from_slice(kept);
        joined.extend_from_slice(&self.chunk[self.replayed..]);
        self.replayed = kept.len();
        self.chunk = joined.freeze();
        true
    }
}

impl Rewind for std::io::Cursor<&[u8]> {
    fn rewind(&mut self) -> bool {
        self.set_position(0);
        true
    }
}

impl AsyncRead for BodyReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        while self.chunk.is_empty() {
            let Some(body) = self.body.as_mut() else {
                lock(&self.received).ended = true;
                return Poll::Ready(Ok(()));
            };
            match ready!(Pin::new(body).poll_next(cx)) {
                Some(Ok(chunk)) => {
                    self.pulled += chunk.len() as u64;
                    self.chunk = chunk;
                }
                Some(Err(e)) => {
                    return Poll::Ready(Err(
                        self.failed(format!("the request body could not be read: {e}"))
                    ));
                }
                None => {
                    self.body = None;
                    lock(&self.received).ended = true;
                }
            }
        }
        ready!(self.poll_drain(cx))?;
        let n = self.chunk.len().min(buf.remaining());
        let part = self.chunk.split_to(n);
        let again = self.replayed.min(n);
        self.replayed -= again;
        let fresh = &part[again..];
        if let Some(kept) = &mut self.kept {
            kept.extend_from_slice(fresh);
        }
        if self
            .kept
            .as_ref()
            .is_some_and(|kept| kept.len() > KEPT_FOR_RETRY)
        {
            self.kept = None;
        }
        let mut received = lock(&self.received);
        received.md5.update(fresh);
        received.checksums.update(fresh);
        received.bytes += fresh.len() as u64;
        buf.put_slice(&part);
        Poll::Ready(Ok(()))
    }
}

/// Locks `received`, whatever a panic elsewhere left in it (counters and
/// a hash: nothing to tear).
pub(crate) fn lock(received: &Mutex<Received>) -> std::sync::MutexGuard<'_, Received> {
    received.lock().unwrap_or_else(|e| e.into_inner())
}

/// One piece of a streamed GetObject body.
pub(crate) enum Piece {
    /// Bytes of the response, in order.
    Data(Bytes),
    /// The read failed: the response is cut short with this error.
    Failed(strata_store_protocol::Error),
}

/// Pieces a streamed Get keeps in flight to a slow HTTP client, each at
/// most one store chunk (256 KiB): the gateway's memory per Get.
pub(crate) const PIECES_IN_FLIGHT: usize = 4;

/// A store read's output that sends the bytes of `span` (offsets in the
/// object) to a GetObject's response. The last piece is held back until
/// the store client flushes, which it does only once the replica's
/// CRC-32C matched: a damaged replica's read fails before the response's
/// last byte, so a client never takes a whole body that was not
/// verified. Bytes outside the span are dropped: a whole read's span is
/// the object, and a ranged read's output is the span alone (offsets
/// from 0).
pub(crate) struct Sink {
    sender: PollSender<Piece>,
    position: u64,
    span: Range<u64>,
    held: Option<Bytes>,
    sent: bool,
}

impl Sink {
    /// A sink sending the bytes of `span` to `sender`.
    pub fn new(sender: mpsc::Sender<Piece>, span: Range<u64>) -> Sink {
        Sink {
            sender: PollSender::new(sender),
            position: 0,
            span,
            held: None,
            sent: false,
        }
    }

    /// Sends the piece held back, once the channel has room.
    fn poll_send_held(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.held.is_none() {
            return Poll::Ready(Ok(()));
        }
        let gone = || io::Error::new(io::ErrorKind::BrokenPipe, "the S3 client went away");
        ready!(self.sender.poll_reserve(cx)).map_err(|_| gone())?;
        if let Some(piece) = self.held.take() {
            self.sender
                .send_item(Piece::Data(piece))
                .map_err(|_| gone())?;
            self.sent = true;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Sink {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let start = self.position;
        let end = start + buf.len() as u64;
        let from = start.max(self.span.start);
        let to = end.min(self.span.end);
        // Past the span, the piece held stays held: it is the response's
        // last, sent at the flush once the whole object was verified.
        if from < to {
            ready!(self.poll_send_held(cx))?;
            let part = &buf[(from - start) as usize..(to - start) as usize];
            self.held = Some(Bytes::copy_from_slice(part));
        }
        self.position = end;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_send_held(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

impl AsyncSeek for Sink {
    /// Rewinding is how the store client starts over on another replica:
    /// possible while no byte reached the response.
    fn start_seek(mut self: Pin<&mut Self>, position: io::SeekFrom) -> io::Result<()> {
        if position != io::SeekFrom::Start(0) || self.sent {
            return Err(io::Error::other(
                "a streamed read cannot start over once bytes went to the S3 client",
            ));
        }
        self.held = None;
        self.position = 0;
        Ok(())
    }

    fn poll_complete(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Poll::Ready(Ok(self.position))
    }
}

/// The body of a GetObject response: `first`, then the pieces still to
/// come from `receiver`; a failed read ends it with an error.
pub(crate) fn response_body(first: Bytes, receiver: mpsc::Receiver<Piece>) -> StreamingBlob {
    let mut receiver = receiver;
    let rest = futures::stream::poll_fn(move |cx| {
        receiver.poll_recv(cx).map(|piece| {
            piece.map(|piece| match piece {
                Piece::Data(bytes) => Ok(bytes),
                Piece::Failed(e) => Err(io::Error::other(e.report().to_string())),
            })
        })
    });
    let first = futures::stream::iter([Ok::<Bytes, io::Error>(first)]);
    StreamingBlob::wrap(futures::StreamExt::chain(first, rest))
}

/// Bytes read at a time from a region's file into its body.
const REGION_PIECE: usize = 256 << 10;

/// A response body that reads `region` from its file, a piece at a
/// time, when polled: for a connection that cannot `sendfile` it (one
/// hyper serves, [`crate::front`]).
pub(crate) fn region_body(region: CheckedRegion) -> StreamingBlob {
    let pieces = futures::stream::unfold(0u64, move |done| {
        let region = region.clone();
        async move {
            if done >= region.length {
                return None;
            }
            let want = (region.length - done).min(REGION_PIECE as u64) as usize;
            let read = tokio::task::spawn_blocking(move || {
                use std::os::unix::fs::FileExt;
                let mut piece = vec![0u8; want];
                region
                    .file
                    .read_exact_at(&mut piece, region.offset + done)
                    .map(|()| Bytes::from(piece))
            })
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)));
            let next = if read.is_ok() {
                done + want as u64
            } else {
                u64::MAX
            };
            Some((read, next))
        }
    });
    StreamingBlob::wrap(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncSeekExt, AsyncWriteExt};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    fn data(piece: Option<Piece>) -> Option<Vec<u8>> {
        match piece {
            Some(Piece::Data(bytes)) => Some(bytes.to_vec()),
            _ => None,
        }
    }

    #[test]
    fn a_sink_sends_only_its_span_and_holds_the_last_piece_until_flushed() {
        runtime().block_on(async {
            let (sender, mut receiver) = mpsc::channel(8);
            let mut sink = Sink::new(sender, 3..9);
            sink.write_all(b"abcdef").await.unwrap();
            // Held back: nothing sent before the next write or the flush.
            assert!(receiver.try_recv().is_err());
            sink.write_all(b"ghijkl").await.unwrap();
            assert_eq!(data(receiver.recv().await), Some(b"def".to_vec()));
            assert!(receiver.try_recv().is_err());
            // Past the span: the last piece waits for the flush still.
            sink.write_all(b"mnopqr").await.unwrap();
            assert!(receiver.try_recv().is_err());
            sink.flush().await.unwrap();
            assert_eq!(data(receiver.recv().await), Some(b"ghi".to_vec()));
            // Bytes already sent: no starting over.
            assert!(sink.seek(io::SeekFrom::Start(0)).await.is_err());
        });
    }

    #[test]
    fn a_sink_starts_over_while_nothing_was_sent() {
        runtime().block_on(async {
            let (sender, mut receiver) = mpsc::channel(8);
            let mut sink = Sink::new(sender, 0..4);
            sink.write_all(b"bad!").await.unwrap();
            sink.seek(io::SeekFrom::Start(0)).await.unwrap();
            sink.write_all(b"good").await.unwrap();
            sink.flush().await.unwrap();
            drop(sink);
            assert_eq!(data(receiver.recv().await), Some(b"good".to_vec()));
            assert!(receiver.recv().await.is_none());
        });
    }
}

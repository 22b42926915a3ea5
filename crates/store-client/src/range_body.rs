//! Reading a storage node's answer to a ranged read
//! ([`strata_store_protocol::data::Request::GetRange`]): every chunk is
//! checked against the CRC-32C the node's chunk table gave before any of
//! its bytes is handed on, so a chunk that fails leaves the output with
//! good bytes only, and the read goes on from there on another replica.

use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::range::{ChunkSpan, MAX_CHUNK, MIN_CHUNK};
use strata_store_protocol::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The reply's layout byte for a replica without a chunk table.
pub const REPLY_WHOLE: u8 = 1;
/// The reply's layout byte for chunks with their CRCs.
pub const REPLY_CHUNKED: u8 = 2;

/// What a ranged read asked of one replica.
#[derive(Clone, Copy, Debug)]
pub struct Asked {
    /// The replica.
    pub replica: Addr,
    /// Its size, as the record says.
    pub size: u64,
    /// The first byte asked.
    pub offset: u64,
    /// Bytes asked.
    pub length: u64,
}

/// How a ranged read's answer went, when it went well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeAnswer {
    /// Every byte asked was checked and handed on.
    Served,
    /// The replica has no chunk table (layout 1): nothing was handed on;
    /// read it whole.
    NoTable,
}

/// Reads the body of a GetRange reply (after its status) for `asked`:
/// the layout, the chunks' CRCs and the chunks, each checked before the
/// bytes of it that were asked go to `out`; `handed` counts them (also
/// on an error: those bytes are good). A chunk failing its CRC, or a
/// reply for another size, is [`Error::Corrupt`]; a reply out of step
/// is [`Error::Peer`].
pub async fn read_range_body<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    s: &mut R,
    asked: Asked,
    out: &mut W,
    handed: &mut u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<RangeAnswer, Error> {
    let at = fmt_addr(asked.replica);
    let io = |e| Error::io(format!("reading a range of replica {at}"), e);
    match s.read_u8().await.map_err(io)? {
        REPLY_WHOLE => return Ok(RangeAnswer::NoTable),
        REPLY_CHUNKED => {}
        other => {
            return Err(Error::Peer(format!(
                "replica {at}: a ranged read answered layout {other} (1 or 2 expected)"
            )))
        }
    }
    let have = s.read_u64().await.map_err(io)?;
    if have != asked.size {
        return Err(Error::Corrupt(format!(
            "replica {at} holds {have} bytes; the metadata says {}",
            asked.size
        )));
    }
    let chunk = u64::from(s.read_u32().await.map_err(io)?);
    let (start, len) = (
        s.read_u64().await.map_err(io)?,
        s.read_u64().await.map_err(io)?,
    );
    let span = ChunkSpan::covering(asked.offset, asked.length, asked.size, chunk);
    if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk) || (start, len) != (span.start, span.len) {
        return Err(Error::Peer(format!(
            "replica {at}: a ranged read answered chunks of {chunk} bytes over [{start}, +{len}), \
             which do not cover the {} bytes asked at {} in chunks of {MIN_CHUNK} to {MAX_CHUNK}",
            asked.length, asked.offset
        )));
    }
    // Bounded: MAX_RANGE / MIN_CHUNK + 1 entries at most (a range was
    // checked before it was asked), 4 bytes each.
    let mut crcs = vec![0u8; span.count as usize * 4];
    s.read_exact(&mut crcs).await.map_err(io)?;
    // One chunk at most, bounded by MAX_CHUNK above.
    let mut buf = vec![0u8; chunk.min(span.len) as usize];
    let end = asked.offset + asked.length;
    for (i, crc) in crcs.chunks_exact(4).enumerate() {
        let bytes = span.chunk(i as u64, chunk);
        let data = &mut buf[..(bytes.end - bytes.start) as usize];
        s.read_exact(data).await.map_err(|e| match e.kind() {
            // The node went away: not a sign of a damaged replica.
            std::io::ErrorKind::UnexpectedEof => Error::Peer(format!(
                "storage node closed the stream in a range of replica {at}"
            )),
            _ => io(e),
        })?;
        let want = u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]);
        let got = crc32c::crc32c(data);
        if got != want {
            return Err(Error::Corrupt(format!(
                "replica {at}: its chunk of bytes {}..{} failed its checksum (got {got:08x}, \
                 want {want:08x})",
                bytes.start, bytes.end
            )));
        }
        let (from, to) = (bytes.start.max(asked.offset), bytes.end.min(end));
        if from < to {
            let kept = &data[(from - bytes.start) as usize..(to - bytes.start) as usize];
            out.write_all(kept)
                .await
                .map_err(|e| Error::io("writing the output", e))?;
            *handed += to - from;
            progress(*handed);
        }
    }
    if s.read_u8().await.map_err(io)? != 0 {
        return Err(Error::Corrupt(format!(
            "replica {at} was cut short while a range of it was sent"
        )));
    }
    Ok(RangeAnswer::Served)
}

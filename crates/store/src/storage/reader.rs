//! Serving a Get from a replica file: the I/O half of the read path. What
//! the header and checksum mean is decided by [`crate::storage::file`].
//! A small replica is read whole, checked here, and written; a larger one
//! is sent with `sendfile` straight from the page cache
//! ([`crate::storage::sendfile`]), and its checksum is checked by the
//! client, end to end, against the stored CRC-32C sent in the trailer.

use crate::storage::file::{check_header, verified, Header, FILE_HEADER};
use crate::storage::sendfile::{send_file, set_cork, SendError};
use std::path::{Path, PathBuf};
use std::time::Duration;
use strata_store_client::stream::write_error;
use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::Error;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;

/// Bytes read or written in one step.
pub(super) const CHUNK: usize = 256 * 1024;

/// Replicas up to this size are read whole in one blocking call and
/// checked on the node: one hand-off to the blocking pool and one write.
/// Bigger ones go out with `sendfile`, never copied through user space.
const SMALL_REPLICA: u64 = 64 * 1024;

/// What opening a replica file found.
enum Opened {
    Missing,
    Damaged,
    /// A small replica read whole (shorter than its size if it was cut
    /// short under us).
    Small {
        header: Header,
        data: Vec<u8>,
    },
    /// A large replica.
    Large {
        header: Header,
        file: std::fs::File,
    },
}

/// Opens a replica file and checks its header (blocking).
fn open_replica(path: &Path) -> Opened {
    use std::io::Read;
    let Ok(mut file) = std::fs::File::open(path) else {
        return Opened::Missing;
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut start = [0u8; FILE_HEADER];
    if file.read_exact(&mut start).is_err() {
        return Opened::Damaged;
    }
    let Some(header) = check_header(&start, len) else {
        return Opened::Damaged;
    };
    if header.size > SMALL_REPLICA {
        return Opened::Large { header, file };
    }
    // Bounded by SMALL_REPLICA, checked above.
    let mut data = Vec::with_capacity(header.size as usize);
    let _ = file.take(header.size).read_to_end(&mut data);
    Opened::Small { header, data }
}

/// Replies a refusal with its reason.
pub(super) async fn reply_err<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    msg: &str,
) -> Result<(), Error> {
    write_error(w, msg)
        .await
        .map_err(|e| Error::io("replying", e))
}

/// Sends the replica `addr` stored at `path`: status, size, data, then
/// the trailer (a flag, 0 when every byte was there, and the CRC-32C the
/// client must find). A peer that takes nothing for `stall` is dropped.
pub(super) async fn get(
    w: &mut BufWriter<OwnedWriteHalf>,
    path: PathBuf,
    addr: Addr,
    stall: Duration,
) -> Result<(), Error> {
    let opened = tokio::task::spawn_blocking(move || open_replica(&path))
        .await
        .map_err(|e| Error::Task {
            context: format!("reading the replica {}", fmt_addr(addr)),
            source: Some(Box::new(e)),
        })?;
    let io = |e| Error::io("sending a replica", e);
    let (header, good) = match opened {
        Opened::Missing => {
            return reply_err(w, &format!("no replica at {}", fmt_addr(addr))).await;
        }
        Opened::Damaged => {
            return reply_err(
                w,
                &format!(
                    "replica {} is damaged (bad header or length); it must be repaired from another copy",
                    fmt_addr(addr)
                ),
            )
            .await;
        }
        Opened::Small { header, data } => {
            w.write_all(&[0]).await.map_err(io)?;
            w.write_all(&header.size.to_be_bytes()).await.map_err(io)?;
            w.write_all(&data).await.map_err(io)?;
            let sent = data.len() as u64;
            pad(w, header.size - sent).await?;
            (header, verified(&header, crc32c::crc32c(&data), sent))
        }
        Opened::Large { header, file } => {
            w.write_all(&[0]).await.map_err(io)?;
            w.write_all(&header.size.to_be_bytes()).await.map_err(io)?;
            let socket = w.get_ref().as_ref();
            set_cork(socket, true);
            // The header goes before the body, which bypasses the buffer.
            w.flush().await.map_err(io)?;
            let socket = w.get_ref().as_ref();
            let sent = send_file(socket, &file, FILE_HEADER as u64, header.size, stall).await;
            let sent = match sent {
                Ok(sent) => sent,
                Err(SendError::Stalled { sent }) => {
                    return Err(Error::Timeout(format!(
                        "the client took nothing for {} ms after {sent} of {} bytes of replica {}; connection closed",
                        stall.as_millis(),
                        header.size,
                        fmt_addr(addr)
                    )))
                }
                Err(SendError::Io(e)) => return Err(io(e)),
            };
            pad(w, header.size - sent).await?;
            // The bytes are checked by the client against the stored CRC.
            (header, sent == header.size)
        }
    };
    w.write_all(&[if good { 0 } else { 1 }]).await.map_err(io)?;
    w.write_all(&header.stored_crc.to_be_bytes())
        .await
        .map_err(io)?;
    w.flush().await.map_err(io)?;
    set_cork(w.get_ref().as_ref(), false);
    if !good {
        tracing::warn!(
            "replica {} failed its checksum or was cut short",
            fmt_addr(addr)
        );
    }
    Ok(())
}

/// Keeps the framing when a replica was cut short under us: zeros for
/// the `missing` bytes, and the trailer says the replica is bad.
async fn pad(w: &mut BufWriter<OwnedWriteHalf>, missing: u64) -> Result<(), Error> {
    let zeros = vec![0u8; CHUNK.min(missing as usize)];
    let mut left = missing;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        w.write_all(&zeros[..n])
            .await
            .map_err(|e| Error::io("sending a replica", e))?;
        left -= n as u64;
    }
    Ok(())
}

//! Serving a Get from a replica file: the I/O half of the read path. What
//! the header and checksum mean is decided by [`crate::storage::file`];
//! this reads the file, streams it, and reports in the reply's trailer
//! whether the bytes sent were the replica as written.

use crate::storage::file::{check_header, verified, Header, FILE_HEADER};
use std::path::{Path, PathBuf};
use strata_store_client::stream::write_error;
use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::Error;
use tokio::fs::File;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bytes read or written in one step.
pub(super) const CHUNK: usize = 256 * 1024;

/// Replicas up to this size are read whole in one blocking call: a Get of
/// a small object then costs one hand-off to the blocking pool instead of
/// one per file operation.
const SMALL_REPLICA: u64 = 1 << 20;

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
    /// A large replica, positioned after its header.
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

/// Sends the replica `addr` stored at `path`, verifying its checksum as
/// it goes.
pub(super) async fn get<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    path: PathBuf,
    addr: Addr,
) -> Result<(), Error> {
    let opened = tokio::task::spawn_blocking(move || open_replica(&path))
        .await
        .map_err(|e| Error::Task {
            context: format!("reading the replica {}", fmt_addr(addr)),
            source: Some(Box::new(e)),
        })?;
    let io = |e| Error::io("sending a replica", e);
    let (header, crc, sent) = match opened {
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
            (header, crc32c::crc32c(&data), data.len() as u64)
        }
        Opened::Large { header, file } => {
            w.write_all(&[0]).await.map_err(io)?;
            w.write_all(&header.size.to_be_bytes()).await.map_err(io)?;
            let mut file = File::from_std(file);
            let (crc, sent) = stream_body(w, &mut file, header.size).await?;
            (header, crc, sent)
        }
    };
    if sent < header.size {
        // Keep the framing: pad, and let the trailer say it is bad.
        let zeros = vec![0u8; CHUNK];
        let mut left = header.size - sent;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            w.write_all(&zeros[..n]).await.map_err(io)?;
            left -= n as u64;
        }
    }
    let good = verified(&header, crc, sent);
    w.write_all(&[if good { 0 } else { 1 }]).await.map_err(io)?;
    w.write_all(&crc.to_be_bytes()).await.map_err(io)?;
    w.flush().await.map_err(io)?;
    if !good {
        tracing::warn!("replica {} failed its checksum", fmt_addr(addr));
    }
    Ok(())
}

/// Streams up to `size` bytes of `file`; returns their CRC-32C and how
/// many there were (fewer if the file was cut short under us).
async fn stream_body<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    file: &mut File,
    size: u64,
) -> Result<(u32, u64), Error> {
    let io = |e| Error::io("sending a replica", e);
    let mut buf = vec![0u8; CHUNK];
    let mut sent = 0u64;
    let mut crc = 0u32;
    while sent < size {
        let want = (size - sent).min(CHUNK as u64) as usize;
        let n = file.read(&mut buf[..want]).await.map_err(io)?;
        if n == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        w.write_all(&buf[..n]).await.map_err(io)?;
        sent += n as u64;
    }
    Ok((crc, sent))
}

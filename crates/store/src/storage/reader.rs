//! Serving a Get from a replica file: the I/O half of the read path. What
//! the header and checksum mean is decided by [`crate::storage::file`].
//! A small replica is read whole, checked here, and written; a larger one
//! is sent with `sendfile` straight from the page cache
//! ([`crate::storage::sendfile`]), and its checksum is checked by the
//! client, end to end, against the stored CRC-32C sent in the trailer.

use crate::storage::file::{check_header, file_name, verified, Header, FILE_HEADER};
use crate::storage::scheduled::{Body, ScheduledSender, Sent};
use crate::storage::sendfile::{send_file, set_cork, SendError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use strata_store_client::nowait::{open_cached, read_cached};
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

/// What a node's reads sent, for `/metrics`.
#[derive(Debug, Default)]
pub struct ReadStats {
    /// Replica data bytes sent by Gets and ranged reads.
    pub bytes_sent: AtomicU64,
    /// Ranged reads served from a chunk table.
    pub ranges: AtomicU64,
}

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

/// What opening a replica file and checking its header found.
pub(super) enum Opening {
    /// It could not be opened.
    NotOpened(std::io::Error),
    /// Its header or its length is wrong; `bytes` of it were read.
    Damaged { bytes: u64 },
    /// Its header agrees with its length; the file is positioned after it.
    Whole { file: std::fs::File, header: Header },
}

/// Opens a replica file and checks its header against its length
/// (blocking): what a Get and the scrub both start with.
pub(super) fn open_checked(path: &Path) -> Opening {
    use std::io::Read;
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) => return Opening::NotOpened(e),
    };
    let Ok(len) = file.metadata().map(|m| m.len()) else {
        return Opening::Damaged { bytes: 0 };
    };
    let mut start = Vec::with_capacity(FILE_HEADER);
    if (&mut file)
        .take(FILE_HEADER as u64)
        .read_to_end(&mut start)
        .is_err()
    {
        return Opening::Damaged { bytes: 0 };
    }
    match check_header(&start, len) {
        Some(header) => Opening::Whole { file, header },
        None => Opening::Damaged {
            bytes: start.len() as u64,
        },
    }
}

/// Opens a replica file for a Get (blocking): a small one is read whole.
fn open_replica(path: &Path) -> Opened {
    use std::io::Read;
    let (file, header) = match open_checked(path) {
        Opening::NotOpened(_) => return Opened::Missing,
        Opening::Damaged { .. } => return Opened::Damaged,
        Opening::Whole { file, header } => (file, header),
    };
    if header.size > SMALL_REPLICA {
        return Opened::Large { header, file };
    }
    // Bounded by SMALL_REPLICA, checked above.
    let mut data = Vec::with_capacity(header.size as usize);
    let _ = file.take(header.size).read_to_end(&mut data);
    Opened::Small { header, data }
}

/// The directory of a node's replica files, held open so that a Get
/// looks up one name in it rather than a whole path.
pub(super) struct ReplicaDir {
    /// The directory, open.
    pub handle: std::fs::File,
    /// Its path, for the blocking pool's opens.
    pub path: PathBuf,
}

/// Opens a replica for a Get on the async worker, when its name and its
/// bytes are all in the kernel's caches (the common case for a hot
/// object): `None` when anything would wait for the disk, and the
/// blocking pool must do it ([`open_replica`]). Answers as it would.
fn open_replica_cached(dir: &ReplicaDir, name: &Path) -> Option<Opened> {
    let file = match open_cached(&dir.handle, name) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(Opened::Missing),
        Err(_) => return None,
    };
    let len = file.metadata().ok()?.len();
    let size = len.saturating_sub(FILE_HEADER as u64);
    let mut start = [0u8; FILE_HEADER];
    // Bounded by SMALL_REPLICA; a large replica's data is not read here.
    let mut data = vec![
        0u8;
        if size <= SMALL_REPLICA {
            size as usize
        } else {
            0
        }
    ];
    let read = read_cached(&file, &mut [&mut start, &mut data], 0).ok()? as u64;
    if read < len.min((FILE_HEADER + data.len()) as u64) {
        // Stopped short of what the file holds: not all of it cached, or
        // cut short under us. The blocking path tells.
        return None;
    }
    let Some(header) = check_header(&start, len) else {
        return Some(Opened::Damaged);
    };
    Some(if header.size > SMALL_REPLICA {
        Opened::Large { header, file }
    } else if (data.len() as u64) < header.size {
        // The chunk table made the file look large, so its data was not
        // read here: the blocking path reads it.
        return None;
    } else {
        // What follows the data is the chunk table.
        data.truncate(header.size as usize);
        Opened::Small { header, data }
    })
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

/// How a Get's body goes out: straight on its connection, or through
/// the node's RS3 sender in the batches of the reader's class.
pub(super) enum Route<'a> {
    /// Sent at once.
    Direct,
    /// Sent in RS3 batches, as a read of this tenant.
    Scheduled(&'a ScheduledSender, &'a str),
}

/// Sends the replica `addr` stored in `dir`: status, size, data, then
/// the trailer (a flag, 0 when every byte was there, and the CRC-32C the
/// client must find). A peer that takes nothing for `stall` is dropped.
/// Gives the connection back at a request boundary.
pub(super) async fn get(
    mut w: BufWriter<OwnedWriteHalf>,
    dir: &ReplicaDir,
    addr: Addr,
    stall: Duration,
    route: Route<'_>,
    stats: &ReadStats,
) -> Result<BufWriter<OwnedWriteHalf>, Error> {
    let name = PathBuf::from(file_name(addr));
    let opened = match open_replica_cached(dir, &name) {
        Some(opened) => opened,
        None => {
            let path = dir.path.join(name);
            tokio::task::spawn_blocking(move || open_replica(&path))
                .await
                .map_err(|e| Error::Task {
                    context: format!("reading the replica {}", fmt_addr(addr)),
                    source: Some(Box::new(e)),
                })?
        }
    };
    let io = |e| Error::io("sending a replica", e);
    let (header, body, checked) = match opened {
        Opened::Missing => {
            reply_err(&mut w, &format!("no replica at {}", fmt_addr(addr))).await?;
            return Ok(w);
        }
        Opened::Damaged => {
            let why = format!(
                "replica {} is damaged (bad header or length); it must be repaired from another copy",
                fmt_addr(addr)
            );
            reply_err(&mut w, &why).await?;
            return Ok(w);
        }
        Opened::Small { header, data } => {
            // Checked here, whole: the trailer's flag says if it was good.
            let good = verified(&header, crc32c::crc32c(&data), data.len() as u64);
            (header, Body::Memory(data), Some(good))
        }
        Opened::Large { header, file } => {
            let body = Body::File {
                file,
                offset: FILE_HEADER as u64,
                length: header.size,
            };
            (header, body, None)
        }
    };
    w.write_all(&[0]).await.map_err(io)?;
    w.write_all(&header.size.to_be_bytes()).await.map_err(io)?;
    let (mut w, sent, corked) = send_body(w, body, header.size, route, stall, addr).await?;
    stats.bytes_sent.fetch_add(sent, Ordering::Relaxed);
    // A larger replica's bytes are checked by the client against the
    // stored CRC; a small one's were checked here.
    let good = sent == header.size && checked.unwrap_or(true);
    w.write_all(&[if good { 0 } else { 1 }]).await.map_err(io)?;
    w.write_all(&header.stored_crc.to_be_bytes())
        .await
        .map_err(io)?;
    w.flush().await.map_err(io)?;
    if corked {
        set_cork(w.get_ref().as_ref(), false);
    }
    if !good {
        tracing::warn!(
            "replica {} failed its checksum or was cut short",
            fmt_addr(addr)
        );
    }
    Ok(w)
}

/// Sends `body`, `length` bytes of replica `addr`, by `route` after
/// what `w` holds, then zeros for what a file cut short under us did not
/// give (the trailer must then say so): the writer, the bytes the body
/// gave, and whether the socket is corked (uncork it after the trailer:
/// only a file sent at once is, so that the trailer leaves with its last
/// segment and the rest pay no uncork).
pub(super) async fn send_body(
    mut w: BufWriter<OwnedWriteHalf>,
    body: Body,
    length: u64,
    route: Route<'_>,
    stall: Duration,
    addr: Addr,
) -> Result<(BufWriter<OwnedWriteHalf>, u64, bool), Error> {
    let io = |e| Error::io("sending a replica", e);
    let corked = matches!((&route, &body), (Route::Direct, Body::File { .. }));
    let (mut w, sent) = match route {
        Route::Direct => send_direct(w, body, stall).await?,
        Route::Scheduled(sender, tenant) => {
            // The header goes before the body, which bypasses the buffer.
            w.flush().await.map_err(io)?;
            match sender.send(tenant, w, body, stall).await {
                Some(answer) => answer,
                None => {
                    return Err(Error::Task {
                        context: "the storage node's RS3 sender stopped".into(),
                        source: None,
                    })
                }
            }
        }
    };
    let sent = match sent {
        Sent::Done(sent) => sent,
        Sent::Stalled(sent) => {
            return Err(Error::Timeout(format!(
                "the client took nothing for {} ms after {sent} of {length} bytes of replica {}; connection closed",
                stall.as_millis(),
                fmt_addr(addr)
            )))
        }
        Sent::Failed(e) => return Err(io(e)),
        // The header is out: the stream cannot carry an error now.
        Sent::Refused(why) => return Err(Error::Peer(why)),
    };
    pad(&mut w, length - sent.min(length)).await?;
    Ok((w, sent, corked))
}

/// Sends a body at once: a small one through the buffer, a file with
/// `sendfile`, corked so that it leaves in full segments.
async fn send_direct(
    mut w: BufWriter<OwnedWriteHalf>,
    body: Body,
    stall: Duration,
) -> Result<(BufWriter<OwnedWriteHalf>, Sent), Error> {
    let io = |e| Error::io("sending a replica", e);
    match body {
        Body::Memory(data) => {
            w.write_all(&data).await.map_err(io)?;
            Ok((w, Sent::Done(data.len() as u64)))
        }
        Body::File {
            file,
            offset,
            length,
        } => {
            set_cork(w.get_ref().as_ref(), true);
            w.flush().await.map_err(io)?;
            let sent = match send_file(w.get_ref().as_ref(), &file, offset, length, stall).await {
                Ok(sent) => Sent::Done(sent),
                Err(SendError::Stalled { sent }) => Sent::Stalled(sent),
                Err(SendError::Io(e)) => Sent::Failed(e),
            };
            Ok((w, sent))
        }
    }
}

/// Keeps the framing when a replica was cut short under us: zeros for
/// the `missing` bytes, and the trailer says the replica is bad.
pub(super) async fn pad(w: &mut BufWriter<OwnedWriteHalf>, missing: u64) -> Result<(), Error> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::file::{header, CHECKSUM_OFFSET};
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// What an opening found, comparable: the kind, the header, and a
    /// small replica's bytes.
    fn summary(opened: &Opened) -> (u8, Option<Header>, Vec<u8>) {
        match opened {
            Opened::Missing => (0, None, Vec::new()),
            Opened::Damaged => (1, None, Vec::new()),
            Opened::Small { header, data } => (2, Some(*header), data.clone()),
            Opened::Large { header, .. } => (3, Some(*header), Vec::new()),
        }
    }

    /// Writes a replica file of `data` (its header's size `size`), synced.
    fn write_replica(path: &Path, data: &[u8], size: u64) {
        let mut bytes = header(size).to_vec();
        let crc = crc32c::crc32c(data).to_be_bytes();
        bytes[CHECKSUM_OFFSET as usize..FILE_HEADER].copy_from_slice(&crc);
        bytes.extend_from_slice(data);
        let mut table = crate::storage::file::ChunkTable::default();
        table.push(data);
        bytes.extend_from_slice(&table.finish());
        let mut file = std::fs::File::create(path).unwrap();
        file.write_all(&bytes).unwrap();
        file.sync_all().unwrap();
    }

    /// Both ways of opening a replica (on the worker when cached, in the
    /// blocking pool otherwise) answer alike for every kind of file; and
    /// once a file's pages are dropped from the page cache, the worker's
    /// way declines rather than wait for the disk (where the file system
    /// drops them: a tmpfs cannot).
    #[test]
    fn the_cached_and_the_blocking_opening_agree() {
        let dir = tempfile::tempdir().unwrap();
        let replicas = ReplicaDir {
            handle: std::fs::File::open(dir.path()).unwrap(),
            path: dir.path().to_path_buf(),
        };
        let small: Vec<u8> = (0..4_096u32).map(|i| (i * 7) as u8).collect();
        let large = vec![9u8; SMALL_REPLICA as usize + 1];
        write_replica(&dir.path().join("small"), &small, small.len() as u64);
        write_replica(&dir.path().join("large"), &large, large.len() as u64);
        write_replica(&dir.path().join("short"), &small, small.len() as u64 + 1);
        std::fs::write(dir.path().join("tiny"), b"S6RP").unwrap();
        for name in ["small", "large", "short", "tiny", "missing"] {
            let path = dir.path().join(name);
            let blocking = summary(&open_replica(&path));
            // Twice: the first open may bring the name into the cache.
            let _ = open_replica_cached(&replicas, Path::new(name));
            let cached = open_replica_cached(&replicas, Path::new(name))
                .unwrap_or_else(|| panic!("{name}: declined though just read"));
            assert_eq!(summary(&cached), blocking, "{name}");
        }
        assert_eq!(summary(&open_replica(&dir.path().join("small"))).2, small);

        let file = std::fs::File::open(dir.path().join("small")).unwrap();
        // SAFETY: a plain advice call on a descriptor we own.
        let advised =
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(advised, 0);
        // SAFETY: statfs fills the struct it is given.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) }, 0);
        match open_replica_cached(&replicas, Path::new("small")) {
            None => {}
            Some(opened) if fs.f_type == libc::TMPFS_MAGIC => {
                assert_eq!(summary(&opened).2, small, "pages kept: the same bytes")
            }
            Some(_) => panic!("read on the worker though its pages were dropped"),
        }
    }
}

//! Reading a replica from this process's own disk: a client that runs in
//! the same process as a storage node (the S3 gateway that `strata store
//! up` starts beside its nodes) reads that node's replica files directly
//! instead of asking the node to send them over loopback TCP. A profile
//! of the gateway under 8 MiB GETs put about a third of the process's
//! CPU in the node's `sendfile` and the loopback stack, and a sixth in
//! the gateway receiving it again; a direct read is one copy from the
//! page cache.
//!
//! The record came from a metadata node that checked the tenant's scope,
//! as a ticket for the network read would have; the bytes are checked
//! against the record's size and CRC-32C before the read succeeds, as
//! the network path checks them. A replica that fails is reported and the
//! other replicas are read over the network.

use std::sync::Arc;
use strata_store_protocol::addr::Addr;
use strata_store_protocol::wire::Record;
use strata_store_protocol::Error;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// The replicas a process keeps on its own disk, as a storage node that
/// runs in it stores them.
pub trait LocalReplicas: Send + Sync {
    /// The replica at `addr` opened for reading, if a storage node of this
    /// process holds it; `None` sends the read over the network.
    fn open(&self, addr: Addr) -> Option<LocalReplica>;
}

/// A replica file opened by [`LocalReplicas::open`].
pub struct LocalReplica {
    /// The open file.
    pub file: std::fs::File,
    /// Where its data starts (after the node's header).
    pub data_offset: u64,
    /// Data bytes, as its header says and its length agrees.
    pub size: u64,
}

/// Bytes read at a time: large enough that the hop to the blocking pool
/// costs little against the copy, small enough to bound the memory of a
/// Get.
const CHUNK: usize = 1 << 20;

/// Bytes written to the output at a time. A sink that copies each write
/// into a buffer of its own (the S3 gateway's) then allocates below the
/// allocator's threshold for fresh memory maps: 1 MiB writes cost it a
/// page fault per 4 KiB, 12% of the gateway's CPU in a profile.
const WRITE_PIECE: usize = 64 << 10;

/// Reads `replica` into `out` and checks it against `record`'s size and
/// CRC-32C; `out` is flushed only once the data checked, so a sink that
/// holds back its last bytes until the flush never passes on a damaged
/// replica whole. A mismatch is [`Error::Corrupt`], naming the replica.
pub(super) async fn read_local<W: AsyncWrite + Unpin>(
    replica: LocalReplica,
    addr: Addr,
    record: &Record,
    out: &mut W,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(), Error> {
    let corrupt = |why: String| Error::Corrupt(format!("local replica {addr:032x}: {why}"));
    if replica.size != record.size {
        return Err(corrupt(format!(
            "holds {} bytes where the record says {}",
            replica.size, record.size
        )));
    }
    let file = std::sync::Arc::new(replica.file);
    let mut buffer = Vec::with_capacity(CHUNK.min(record.size as usize));
    let (mut done, mut crc) = (0u64, 0u32);
    while done < record.size {
        let want = (record.size - done).min(CHUNK as u64) as usize;
        let (file_now, offset) = (file.clone(), replica.data_offset + done);
        buffer = tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::FileExt;
            buffer.resize(want, 0);
            file_now.read_exact_at(&mut buffer, offset).map(|()| buffer)
        })
        .await
        .map_err(|e| Error::io("reading a local replica", std::io::Error::other(e)))?
        .map_err(|e| corrupt(format!("cannot be read whole: {e}")))?;
        crc = crc32c::crc32c_append(crc, &buffer);
        for piece in buffer.chunks(WRITE_PIECE) {
            out.write_all(piece)
                .await
                .map_err(|e| Error::io("writing the output", e))?;
        }
        done += want as u64;
        progress(done);
    }
    if crc != record.crc {
        return Err(corrupt(format!(
            "fails the object's checksum (got {crc:08x}, want {:08x})",
            record.crc
        )));
    }
    out.flush()
        .await
        .map_err(|e| Error::io("writing the output", e))
}

/// A local replica's data, checked against its record: what a server
/// that sends it with `sendfile` needs ([`super::Client::checked_local`]).
#[derive(Clone)]
pub struct CheckedRegion {
    /// The replica file, open.
    pub file: Arc<std::fs::File>,
    /// Where the object's bytes start in it.
    pub offset: u64,
    /// The object's size.
    pub length: u64,
}

/// Bytes read at a time when checking a replica: small enough to stay
/// in the core's cache between the read and the checksum.
const CHECK_CHUNK: usize = 256 << 10;

/// Checks `replica` against `record`'s size and CRC-32C, reading it from
/// the page cache (in the blocking pool: the first read of a cold file
/// waits on the disk); the bytes are read, never kept.
pub(super) async fn check_local(
    replica: LocalReplica,
    addr: Addr,
    record: &Record,
) -> Result<CheckedRegion, Error> {
    let corrupt = move |why: String| Error::Corrupt(format!("local replica {addr:032x}: {why}"));
    if replica.size != record.size {
        return Err(corrupt(format!(
            "holds {} bytes where the record says {}",
            replica.size, record.size
        )));
    }
    let region = CheckedRegion {
        file: Arc::new(replica.file),
        offset: replica.data_offset,
        length: replica.size,
    };
    let (reading, expected) = (region.clone(), record.crc);
    let crc = tokio::task::spawn_blocking(move || crc_of(&reading))
        .await
        .map_err(|e| Error::io("checking a local replica", std::io::Error::other(e)))?
        .map_err(|e| corrupt(format!("cannot be read whole: {e}")))?;
    if crc != expected {
        return Err(corrupt(format!(
            "fails the object's checksum (got {crc:08x}, want {expected:08x})"
        )));
    }
    Ok(region)
}

/// The CRC-32C of `region`'s bytes.
fn crc_of(region: &CheckedRegion) -> std::io::Result<u32> {
    use std::os::unix::fs::FileExt;
    let mut buffer = vec![0u8; CHECK_CHUNK.min(region.length as usize)];
    let (mut done, mut crc) = (0u64, 0u32);
    while done < region.length {
        let want = (region.length - done).min(CHECK_CHUNK as u64) as usize;
        let piece = &mut buffer[..want];
        region.file.read_exact_at(piece, region.offset + done)?;
        crc = crc32c::crc32c_append(crc, piece);
        done += want as u64;
    }
    Ok(crc)
}

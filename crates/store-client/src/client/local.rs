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
    /// process holds it; `None` sends the read over the network. The
    /// file must never shrink once written: the check maps it.
    fn open(&self, addr: Addr) -> Option<LocalReplica>;

    /// The identity of the replica file at `addr` now, looked at without
    /// opening it, if a storage node of this process holds it: what a
    /// GET of a pinned replica checks before sending it.
    fn identity(&self, addr: Addr) -> Option<super::pinned::FileIdentity>;
}

/// The replicas on this process's disk, and those of them pinned in
/// memory once checked ([`super::pinned`]), shared by the clients of
/// every tenant.
pub struct LocalDisk {
    /// The replicas.
    pub replicas: Arc<dyn LocalReplicas>,
    /// Those checked and pinned.
    pub pinned: super::pinned::PinnedReplicas,
}

impl LocalDisk {
    /// `replicas`, pinning up to `pinned_budget` bytes of them once
    /// checked (0: none).
    pub fn new(replicas: Arc<dyn LocalReplicas>, pinned_budget: u64) -> LocalDisk {
        LocalDisk {
            replicas,
            pinned: super::pinned::PinnedReplicas::new(pinned_budget),
        }
    }

    /// Starts a task that lets go of pinned replicas whose files were
    /// deleted, every `period`, for as long as this disk is in use. An
    /// object deleted by another client, or overwritten, leaves a pinned
    /// replica that no GET will ask for again; without the sweep its
    /// memory would stay locked until the next replica is pinned.
    pub fn sweep_pins(self: &Arc<Self>, period: std::time::Duration) {
        let disk = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(disk) = disk.upgrade() else {
                    return;
                };
                // fstat of each pinned file: off the runtime's threads.
                let swept = tokio::task::spawn_blocking(move || disk.pinned.let_go_of_deleted());
                if swept.await.is_err() {
                    return;
                }
            }
        });
    }
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

/// What [`super::Client::checked_local`] found of an object's replicas on
/// this process's disk.
pub enum LocalCheck {
    /// A local replica passed its check: send this region of it.
    Passed(CheckedRegion),
    /// Every local replica failed its check (each was reported for
    /// repair): read the others chunk by chunk, so no byte of a bad
    /// replica is passed on.
    Damaged,
    /// No replica is local, or the object is inline or erasure coded.
    Absent,
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

/// Bytes of a replica mapped at a time when checking it: a bound on the
/// pages one check makes the kernel read in (and map) before it sums
/// them.
const CHECK_WINDOW: u64 = 16 << 20;

/// Replicas of at least this size are summed through maps; smaller ones
/// are read into a buffer, whose copy costs less than setting up and
/// tearing down a map of theirs (a `munmap` in a process of many threads
/// stops the others' cores to flush their TLBs: mapping was 5.6% of the
/// gateway's CPU under 1 MiB GETs, the sum itself 4.9%).
const MAP_FROM: u64 = 8 << 20;

/// Bytes read at a time when checking a replica through a buffer: small
/// enough to stay in the core's cache between the read and the sum.
const CHECK_CHUNK: usize = 256 << 10;

/// Replicas up to this size are checked on the async worker itself when
/// every byte is in the page cache (at most about 0.15 ms of work): the
/// hop to the blocking pool and back costs two thread wake-ups.
const INLINE_CHECK_UP_TO: u64 = 2 << 20;

/// From this size on, a replica is checked in two halves at once (one
/// per core of the blocking pool), its checksum combined from theirs: the
/// check comes before the first byte is sent, so it is the answer's
/// latency. Below it, the second hop to the pool costs more than the
/// half of the sum it saves (a MiB sums in about 60 µs here).
const CHECK_IN_HALVES_FROM: u64 = 8 << 20;

/// A local replica of `record` that is pinned and whose file is the one
/// pinned, as a region to send, found without opening the replica (its
/// path is looked at, then the pinned file sent): a hot GET's shortest
/// path. `None` sends the GET through [`check_local`].
pub(super) fn pinned_region(disk: &LocalDisk, record: &Record) -> Option<CheckedRegion> {
    if !disk.pinned.wants(record.size) {
        return None;
    }
    record.replicas.iter().find_map(|&addr| {
        let identity = disk.replicas.identity(addr)?;
        let (file, offset) = disk
            .pinned
            .pinned_file(addr, identity, record.size, record.crc)?;
        Some(CheckedRegion {
            file,
            offset,
            length: record.size,
        })
    })
}

/// Checks `replica` against `record`'s size and CRC-32C, reading it from
/// the page cache (in the blocking pool: the first read of a cold file
/// waits on the disk); the bytes are read, never kept, unless `pinned`
/// wants them: then they are locked in memory before they are summed,
/// and kept if they pass, so that [`pinned_region`] sends them unread
/// while the file is unchanged.
pub(super) async fn check_local(
    replica: LocalReplica,
    addr: Addr,
    record: &Record,
    disk: &Arc<LocalDisk>,
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
    let pinned = &disk.pinned;
    let crc = if pinned.wants(record.size) {
        // A pinned hit was served by `pinned_region` before the replica
        // was opened: this one is checked and pinned now.
        let identity = super::pinned::FileIdentity::of(&region.file)
            .map_err(|e| corrupt(format!("cannot be looked at: {e}")))?;
        let (disk, file, offset, length) = (
            disk.clone(),
            region.file.clone(),
            region.offset,
            region.length,
        );
        let locked =
            tokio::task::spawn_blocking(move || disk.pinned.lock_and_sum(&file, offset, length))
                .await
                .map_err(|e| Error::io("checking a local replica", std::io::Error::other(e)))?
                .map_err(|e| corrupt(format!("cannot be read whole: {e}")))?;
        let crc = locked.crc;
        pinned.admit(
            addr,
            region.file.clone(),
            identity,
            (record.size, record.crc),
            locked,
        );
        crc
    } else {
        crc_of_region(&region)
            .await
            .map_err(|e| corrupt(format!("cannot be read whole: {e}")))?
    };
    if crc != record.crc {
        return Err(corrupt(format!(
            "fails the object's checksum (got {crc:08x}, want {:08x})",
            record.crc
        )));
    }
    Ok(region)
}

/// The CRC-32C of `region`'s bytes: on this thread if the region is
/// small and cached, else read in the blocking pool.
async fn crc_of_region(region: &CheckedRegion) -> std::io::Result<u32> {
    if region.length <= INLINE_CHECK_UP_TO {
        if let Some(crc) = crc_if_cached(&region.file, region.offset, region.length)? {
            return Ok(crc);
        }
    }
    let piece = |start: u64, length: u64| {
        let (file, offset) = (region.file.clone(), region.offset + start);
        async move {
            tokio::task::spawn_blocking(move || crc_of(&file, offset, length))
                .await
                .map_err(std::io::Error::other)?
        }
    };
    if region.length < CHECK_IN_HALVES_FROM {
        return piece(0, region.length).await;
    }
    let half = region.length / 2;
    let (first, second) = tokio::join!(piece(0, half), piece(half, region.length - half));
    let second_length = (region.length - half) as usize;
    Ok(crc32c::crc32c_combine(first?, second?, second_length))
}

thread_local! {
    /// The buffer a thread reads replicas through to check them.
    static CHECK_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The CRC-32C of `length` bytes of `file` from `offset` if every one of
/// them is in the page cache; `None` if reading them would wait on the
/// disk (or a read came short: the blocking read tells which).
fn crc_if_cached(file: &std::fs::File, offset: u64, length: u64) -> std::io::Result<Option<u32>> {
    sum_through_buffer(
        offset,
        length,
        |piece, at| match crate::nowait::read_cached(file, &mut [piece], at) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
            read => read,
        },
    )
}

/// The CRC-32C of `length` bytes from `offset`, each piece read into the
/// thread's buffer by `read` (at an offset; how many bytes it read);
/// `None` as soon as a read comes short.
fn sum_through_buffer(
    offset: u64,
    length: u64,
    mut read: impl FnMut(&mut [u8], u64) -> std::io::Result<usize>,
) -> std::io::Result<Option<u32>> {
    CHECK_BUFFER.with_borrow_mut(|buffer| {
        buffer.resize(CHECK_CHUNK, 0);
        let (mut done, mut crc) = (0u64, 0u32);
        while done < length {
            let want = (length - done).min(CHECK_CHUNK as u64) as usize;
            let piece = &mut buffer[..want];
            if read(piece, offset + done)? != want {
                return Ok(None);
            }
            crc = crc32c::crc32c_append(crc, piece);
            done += want as u64;
        }
        Ok(Some(crc))
    })
}

/// The CRC-32C of `length` bytes of `file` from `offset`: read through
/// the thread's buffer, or summed in place through read-only maps of
/// [`CHECK_WINDOW`] bytes from [`MAP_FROM`]. For large replicas a `pread`
/// into a buffer costs more than the sum: measured here on a
/// page-cached 64 MiB file, 8.1 GB/s a core against 19 GB/s mapped.
fn crc_of(file: &std::fs::File, offset: u64, length: u64) -> std::io::Result<u32> {
    use std::os::unix::fs::FileExt;
    if length < MAP_FROM {
        let read = |piece: &mut [u8], at| file.read_exact_at(piece, at).map(|()| piece.len());
        return sum_through_buffer(offset, length, read)?
            .ok_or_else(|| std::io::ErrorKind::UnexpectedEof.into());
    }
    let (mut done, mut crc) = (0u64, 0u32);
    while done < length {
        let window = (length - done).min(CHECK_WINDOW);
        let map = super::pinned::map_replica(file, offset + done, window)?;
        crc = crc32c::crc32c_append(crc, &map);
        done += window;
    }
    Ok(crc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region_of(bytes: &[u8]) -> CheckedRegion {
        use std::io::Write;
        let mut file = tempfile::tempfile().expect("a temporary file");
        file.write_all(b"header--").expect("writing");
        file.write_all(bytes).expect("writing");
        CheckedRegion {
            file: Arc::new(file),
            offset: 8,
            length: bytes.len() as u64,
        }
    }

    #[test]
    fn a_region_s_checksum_is_its_bytes_whether_read_whole_or_in_halves() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .expect("a runtime");
        let lengths = [
            0,
            1,
            CHECK_CHUNK + 3,
            INLINE_CHECK_UP_TO as usize + 5,
            CHECK_IN_HALVES_FROM as usize + 12_345,
            2 * CHECK_WINDOW as usize + 12_345,
        ];
        for length in lengths {
            let bytes: Vec<u8> = (0..length).map(|i| (i * 31 % 253) as u8).collect();
            let crc = runtime
                .block_on(crc_of_region(&region_of(&bytes)))
                .expect("read");
            assert_eq!(crc, crc32c::crc32c(&bytes), "{length} bytes");
        }
        let short = CheckedRegion {
            length: 100,
            ..region_of(&[1; 50])
        };
        assert!(runtime.block_on(crc_of_region(&short)).is_err());
        // Past the end of a file large enough to be mapped: an error, not
        // a fault.
        let short_mapped = CheckedRegion {
            length: 2 * MAP_FROM,
            ..region_of(&vec![1; MAP_FROM as usize + 1])
        };
        assert!(runtime.block_on(crc_of_region(&short_mapped)).is_err());
    }
}

//! Copies of ephemeral files held by other nodes, in `DIR/copies/`, in
//! one of two ways:
//!
//! - **pulled whole**: a fetcher thread pulls the file in ranges of
//!   [`FETCH_BYTES`] from its start, while its writer may still be
//!   writing: an open returns at once, reads take what has arrived and
//!   wait at its end for more, for the end of the file (once the holder
//!   says no writer has it open and every byte is here), or for a failure
//!   (EIO). Small files and files being written are copied so.
//! - **by range**: a file of at least the node's range threshold
//!   ([`DEFAULT_RANGE_THRESHOLD`]) that no writer has open is fetched
//!   only where it is read, in chunks of [`CHUNK_BYTES`] tracked by
//!   [`Chunks`]: a read of a missing chunk fetches it at once, from the
//!   reading thread (no hand-off to another thread, and readers at
//!   different places fetch in parallel), and a sequential reader gets a
//!   read-ahead that grows with its run up to [`READ_AHEAD_BYTES`],
//!   fetched by one thread per copy that ends when it has caught up. No
//!   chunk is fetched twice; a read of chunks that are here never waits.
//!   Every range must come from the same content (the holder's
//!   generation, [`crate::protocol::GENERATION_HEADER`]): a file written
//!   again meanwhile fails the copy (EIO) rather than mix two contents.
//!
//! Either way a holder that stops answering fails the copy after the
//! lease, never later; the bytes that arrived are counted against the
//! quota as they arrive, and reported to the locality service (a ranged
//! copy reports what it has, at most once per [`REPORT_PERIOD`] and when
//! it is complete).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::chunks::{Chunks, CHUNK_BYTES};
use super::local::content_name;
use crate::client::{AgentClient, ServiceClient};
use crate::error::ErrorKind;
use crate::protocol::{Entry, HeldFile};
use crate::{F3Error, Result};

/// Bytes asked of the holder at a time by a whole pull.
pub const FETCH_BYTES: u64 = 1024 * 1024;

/// Files of at least this many bytes, with no writer open, are copied by
/// range rather than whole (`strata node --range-threshold`).
pub const DEFAULT_RANGE_THRESHOLD: u64 = 64 * 1024 * 1024;

/// Most bytes fetched ahead of a sequential reader of a ranged copy.
pub const READ_AHEAD_BYTES: u64 = 8 * CHUNK_BYTES;

/// Shortest time between two locality reports of a ranged copy.
const REPORT_PERIOD: Duration = Duration::from_secs(1);

/// How long the holder may hold a fetch at the end of a file being
/// written before it answers with nothing new.
const LONG_POLL: Duration = Duration::from_millis(1000);

/// Least time a fetch may take past its long poll, however short the
/// lease: a range of [`FETCH_BYTES`] crosses a 10 Mbit/s link in it.
const LEAST_PATIENCE: Duration = Duration::from_secs(2);

/// Most time a fetch may take past its long poll, however long the
/// lease.
const MOST_PATIENCE: Duration = Duration::from_secs(10);

/// Pause between attempts after a failed fetch.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Most copies this node keeps track of (each is a file in
/// `DIR/copies/`; `strata f3 evict` drops them).
pub const MAX_COPIES: usize = 65_536;

/// What has arrived so far.
#[derive(Debug)]
struct Progress {
    /// A whole pull: the bytes from the start that are here.
    fetched: u64,
    /// Every byte is here.
    done: bool,
    failure: Option<String>,
    /// The content generation of the first answer: every later answer
    /// must come from it, or the copy would mix two contents.
    generation: Option<u64>,
    /// A copy by range: its chunks and read-ahead.
    ranged: Option<Ranged>,
}

/// The state of a copy by range.
#[derive(Debug)]
struct Ranged {
    chunks: Chunks,
    /// Where the last read ended, and how many bytes the reader has read
    /// in sequence up to there (its read-ahead grows with it).
    last_end: u64,
    run: u64,
    /// The read-ahead window, in bytes, and whether a thread fills it.
    ahead: (u64, u64),
    prefetching: bool,
    /// When its bytes were last reported to the locality service.
    reported: Option<Instant>,
}

impl Ranged {
    /// Nothing here yet of `chunks`.
    fn new(chunks: Chunks) -> Ranged {
        Ranged {
            chunks,
            last_end: 0,
            run: 0,
            ahead: (0, 0),
            prefetching: false,
            reported: None,
        }
    }

    /// Notes a read of `length` bytes at `offset`; whether a read-ahead
    /// thread should start.
    fn note_read(&mut self, offset: u64, length: u64) -> bool {
        let end = offset.saturating_add(length).min(self.chunks.size());
        // Within a chunk of where the last read ended: the kernel may
        // split one read into requests that arrive out of order.
        if offset.abs_diff(self.last_end) > CHUNK_BYTES {
            self.run = 0;
            self.last_end = end;
            return false;
        }
        self.run = self.run.saturating_add(end.saturating_sub(self.last_end));
        self.last_end = self.last_end.max(end);
        let ahead = self.run.min(READ_AHEAD_BYTES);
        let until = self.last_end.saturating_add(ahead).min(self.chunks.size());
        self.ahead = (self.last_end, until);
        !self.prefetching && !self.chunks.has_all(self.window())
    }

    /// The chunks of the read-ahead window.
    fn window(&self) -> std::ops::Range<u64> {
        let (from, until) = self.ahead;
        self.chunks.covering(from, until.saturating_sub(from))
    }
}

/// A copy of another node's ephemeral file, arriving.
#[derive(Debug)]
pub struct RemoteCopy {
    /// Its namespace path.
    pub path: String,
    /// The content version it copies.
    pub version: u64,
    file: File,
    progress: Mutex<Progress>,
    changed: Condvar,
    link: Link,
}

/// What a read of a copy finds.
#[derive(Debug)]
pub enum CopyRead {
    /// Bytes (none: the end of the file).
    Bytes(Vec<u8>),
    /// At the end of what has arrived, the file still growing: wait.
    Wait,
    /// The copy failed (its holder is gone or lost the file).
    Failed(String),
}

/// What a read can do now, decided under the progress lock.
enum Ready {
    /// Read this many bytes from the offset.
    Read(u64),
    /// The end of the file.
    End,
    /// The bytes are not here yet.
    Wait,
    /// The copy failed.
    Failed(String),
}

impl Progress {
    fn ready(&self, offset: u64, length: u32) -> Ready {
        let length = u64::from(length);
        match &self.ranged {
            Some(ranged) => {
                let wanted = ranged.chunks.covering(offset, length);
                if wanted.is_empty() {
                    return Ready::End;
                }
                if ranged.chunks.has_all(wanted) {
                    return Ready::Read(length.min(ranged.chunks.size() - offset));
                }
            }
            None if offset < self.fetched => {
                return Ready::Read((self.fetched - offset).min(length));
            }
            None => {}
        }
        if let Some(failure) = &self.failure {
            return Ready::Failed(failure.clone());
        }
        if self.done && self.ranged.is_none() {
            return Ready::End;
        }
        Ready::Wait
    }
}

impl RemoteCopy {
    /// Up to `length` bytes from `offset` without waiting (a copy by
    /// range starts its read-ahead here).
    pub fn try_read(self: &Arc<Self>, offset: u64, length: u32) -> std::io::Result<CopyRead> {
        let mut progress = self.progress.lock();
        let read_ahead = match progress.ranged.as_mut() {
            Some(ranged) => ranged.note_read(offset, u64::from(length)),
            None => false,
        };
        if read_ahead {
            self.start_read_ahead(&mut progress);
        }
        let ready = progress.ready(offset, length);
        drop(progress);
        self.read_ready(ready, offset)
    }

    /// Up to `length` bytes from `offset`, waiting at the end of what has
    /// arrived (up to `limit`, then [`CopyRead::Wait`]). A copy by range
    /// fetches the missing chunks of the read here, at once.
    pub fn read_waiting(
        &self,
        offset: u64,
        length: u32,
        limit: Duration,
    ) -> std::io::Result<CopyRead> {
        let deadline = Instant::now() + limit;
        let mut progress = self.progress.lock();
        loop {
            let ready = progress.ready(offset, length);
            if !matches!(ready, Ready::Wait) {
                drop(progress);
                return self.read_ready(ready, offset);
            }
            let claimed = progress.ranged.as_mut().and_then(|ranged| {
                let wanted = ranged.chunks.covering(offset, u64::from(length));
                ranged.chunks.claim_first_missing(wanted)
            });
            if let Some(index) = claimed {
                drop(progress);
                self.fetch_chunk(index);
                progress = self.progress.lock();
            } else if self.changed.wait_until(&mut progress, deadline).timed_out() {
                // Growing (a whole pull), or another thread fetches the
                // chunks this read needs.
                return Ok(CopyRead::Wait);
            }
        }
    }

    fn read_ready(&self, ready: Ready, offset: u64) -> std::io::Result<CopyRead> {
        Ok(match ready {
            Ready::Read(bytes) => {
                let mut buffer = vec![0; bytes as usize];
                self.file.read_exact_at(&mut buffer, offset)?;
                CopyRead::Bytes(buffer)
            }
            Ready::End => CopyRead::Bytes(Vec::new()),
            Ready::Wait => CopyRead::Wait,
            Ready::Failed(failure) => CopyRead::Failed(failure),
        })
    }

    /// Whether the copy failed.
    pub fn failed(&self) -> bool {
        self.progress.lock().failure.is_some()
    }

    /// The bytes of the file that are here.
    pub fn arrived_bytes(&self) -> u64 {
        let progress = self.progress.lock();
        match &progress.ranged {
            Some(ranged) => ranged.chunks.arrived_bytes(),
            None => progress.fetched,
        }
    }

    fn advance(&self, update: impl FnOnce(&mut Progress)) {
        let mut progress = self.progress.lock();
        update(&mut progress);
        self.changed.notify_all();
    }

    fn fail(&self, why: String) {
        let mut progress = self.progress.lock();
        if progress.failure.is_none() {
            tracing::error!("{why}");
            progress.failure = Some(why);
        }
        self.changed.notify_all();
    }

    /// Starts the thread that fills the read-ahead window.
    fn start_read_ahead(self: &Arc<Self>, progress: &mut MutexGuard<'_, Progress>) {
        let Some(ranged) = progress.ranged.as_mut() else {
            return;
        };
        ranged.prefetching = true;
        let copy = self.clone();
        let spawned = std::thread::Builder::new()
            .name("f3-read-ahead".into())
            .spawn(move || copy.read_ahead());
        if let Err(e) = spawned {
            // Reads fetch what they need themselves: only slower.
            tracing::warn!("{}: starting a read-ahead thread: {e}", self.path);
            ranged.prefetching = false;
        }
    }

    /// Fetches the read-ahead window's missing chunks, one by one, until
    /// it has caught up (the window moves with the reader).
    fn read_ahead(&self) {
        loop {
            let next = {
                let mut progress = self.progress.lock();
                let failed = progress.failure.is_some();
                let Some(ranged) = progress.ranged.as_mut() else {
                    return;
                };
                let next = if failed {
                    None
                } else {
                    let window = ranged.window();
                    ranged.chunks.claim_first_missing(window)
                };
                if next.is_none() {
                    ranged.prefetching = false;
                }
                next
            };
            match next {
                Some(index) => self.fetch_chunk(index),
                None => return,
            }
        }
    }

    /// Fetches claimed chunk `index` of a copy by range, then marks it
    /// arrived, or releases it and fails the copy.
    fn fetch_chunk(&self, index: u64) {
        let (span, size) = {
            let progress = self.progress.lock();
            let Some(ranged) = &progress.ranged else {
                return;
            };
            (ranged.chunks.span(index), ranged.chunks.size())
        };
        let outcome = self.fetch_range(span, size);
        let mut report = None;
        {
            let mut progress = self.progress.lock();
            let Some(ranged) = progress.ranged.as_mut() else {
                return;
            };
            match &outcome {
                Ok(()) => {
                    ranged.chunks.arrive(index);
                    self.link.grown.fetch_add(span.1, Ordering::Relaxed);
                    let complete = ranged.chunks.complete();
                    let due = ranged
                        .reported
                        .is_none_or(|at| at.elapsed() >= REPORT_PERIOD);
                    if complete || due {
                        ranged.reported = Some(Instant::now());
                        report = Some(ranged.chunks.arrived_bytes());
                    }
                    progress.done = complete;
                }
                Err(_) => ranged.chunks.release(index),
            }
            self.changed.notify_all();
        }
        if let Err(why) = outcome {
            self.fail(why);
        }
        if let Some(bytes) = report {
            self.link.report(&self.path, bytes);
        }
    }

    /// Fetches `length` bytes from `start` of a copy by range of a file
    /// of `size` bytes into the local file, retrying while the holder is
    /// silent for less than the lease; why not, otherwise.
    fn fetch_range(
        &self,
        (start, length): (u64, u64),
        size: u64,
    ) -> std::result::Result<(), String> {
        let path = &self.path;
        let source = &self.link.source;
        // Silence counts from the first call: a call to a holder cut off
        // fails only when its own time is up, inside the lease.
        let asked = Instant::now();
        loop {
            let answer = self.link.agents.fetch(
                &source.address,
                path,
                start,
                length,
                Duration::ZERO,
                patience(source.lease),
            );
            match answer {
                Ok(piece) => {
                    let same = self.same_generation(piece.generation);
                    if !same
                        || piece.writing
                        || piece.size != size
                        || piece.bytes.len() as u64 != length
                    {
                        return Err(rewritten(path, source, piece.size, piece.writing));
                    }
                    return self
                        .file
                        .write_all_at(&piece.bytes, start)
                        .map_err(|e| format!("{path}: writing the local copy: {e}"));
                }
                Err(e) if e.kind == ErrorKind::NotFound || e.kind == ErrorKind::Invalid => {
                    return Err(refused(path, source, &e));
                }
                Err(e) => {
                    if asked.elapsed() >= source.lease {
                        return Err(silent(path, source, asked.elapsed(), &e));
                    }
                    if let Some(failure) = &self.progress.lock().failure {
                        // Another reader has given up on the holder.
                        return Err(failure.clone());
                    }
                    std::thread::sleep(RETRY_PAUSE);
                }
            }
        }
    }

    /// Whether `generation` is the content this copy takes its bytes
    /// from (the first answer's).
    fn same_generation(&self, generation: u64) -> bool {
        *self.progress.lock().generation.get_or_insert(generation) == generation
    }
}

fn rewritten(path: &str, source: &Source, size: u64, writing: bool) -> String {
    format!(
        "{path}: node {} holds another content now (written again since this copy began: \
         {size} bytes, a writer open: {writing}); open the file again to read the new content",
        source.holder
    )
}

fn refused(path: &str, source: &Source, error: &F3Error) -> String {
    format!(
        "{path}: node {} refused the transfer: {error}",
        source.holder
    )
}

fn silent(path: &str, source: &Source, silence: Duration, error: &F3Error) -> String {
    format!(
        "{path}: node {} holding it has not answered for {silence:?} (its lease is {:?}): \
         {error}; the ephemeral data it held is lost unless it comes back",
        source.holder, source.lease
    )
}

/// How long a fetch may take past its long poll: a range of
/// [`FETCH_BYTES`] must have time to cross a slow link, and a holder cut
/// off (no answer, not even a reset) must fail the call well within the
/// lease's reckoning.
fn patience(lease: Duration) -> Duration {
    lease.clamp(LEAST_PATIENCE, MOST_PATIENCE)
}

/// Where a copy is fetched from and reported to.
#[derive(Debug, Clone)]
pub struct Source {
    /// The holder's name.
    pub holder: String,
    /// The holder's transfer address.
    pub address: String,
    /// This node's name (for its locality report).
    pub node: String,
    /// How long the holder may be silent before the copy fails.
    pub lease: Duration,
}

/// What a copy fetches with and reports to.
#[derive(Debug)]
struct Link {
    source: Source,
    agents: AgentClient,
    service: ServiceClient,
    /// Where the bytes arriving are counted against the node's quota.
    grown: Arc<AtomicU64>,
}

impl Link {
    /// Tells the locality service this node holds `bytes` of `path`.
    fn report(&self, path: &str, bytes: u64) {
        let held = HeldFile {
            path: path.to_string(),
            bytes,
        };
        if let Err(e) = self.service.report(&self.source.node, vec![held]) {
            tracing::warn!("{path}: reporting the copy to the F3 service: {e}");
        }
    }
}

/// The copies this node holds or is pulling.
#[derive(Debug)]
pub struct Copies {
    directory: PathBuf,
    copies: Mutex<HashMap<String, Arc<RemoteCopy>>>,
    agents: AgentClient,
    service: ServiceClient,
    /// Where the bytes pulled are counted against the node's quota.
    grown: Arc<AtomicU64>,
    /// Closed files of at least this many bytes are copied by range.
    range_threshold: u64,
}

impl Copies {
    /// Copies kept in `directory` (created if missing), their bytes
    /// counted in `grown` as they arrive; closed files of at least
    /// `range_threshold` bytes are copied by range.
    pub fn new(
        directory: PathBuf,
        agents: AgentClient,
        service: ServiceClient,
        grown: Arc<AtomicU64>,
        range_threshold: u64,
    ) -> Result<Copies> {
        std::fs::create_dir_all(&directory)
            .map_err(|e| F3Error::io(format!("creating {}", directory.display()), e))?;
        Ok(Copies {
            directory,
            copies: Mutex::new(HashMap::new()),
            agents,
            service,
            grown,
            range_threshold,
        })
    }

    /// The copy of file `entry`: the one held or arriving at its
    /// version, else a new one (pulled whole from now, or by range as it
    /// is read).
    pub fn open(&self, entry: &Entry, source: Source) -> Result<Arc<RemoteCopy>> {
        let (path, version) = (entry.path.as_str(), entry.version);
        let mut copies = self.copies.lock();
        if let Some(copy) = copies.get(path) {
            if copy.version == version && !copy.failed() {
                return Ok(copy.clone());
            }
        }
        if copies.len() >= MAX_COPIES && !copies.contains_key(path) {
            return Err(F3Error::conflict(format!(
                "this node tracks {MAX_COPIES} copies already; drop some with `strata f3 evict`"
            )));
        }
        // A file per version: a reader of an older copy keeps its own
        // bytes while a newer one arrives.
        if let Some(old) = copies.remove(path) {
            let _ = std::fs::remove_file(self.copy_path(&old.path, old.version));
        }
        let file_path = self.copy_path(path, version);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&file_path)
            .map_err(|e| F3Error::io(format!("creating {}", file_path.display()), e))?;
        let ranged = self.ranged(entry);
        let whole = ranged.is_none();
        let copy = Arc::new(RemoteCopy {
            path: path.to_string(),
            version,
            file,
            progress: Mutex::new(Progress {
                fetched: 0,
                done: false,
                failure: None,
                generation: None,
                ranged,
            }),
            changed: Condvar::new(),
            link: Link {
                source,
                agents: self.agents.clone(),
                service: self.service.clone(),
                grown: self.grown.clone(),
            },
        });
        copies.insert(path.to_string(), copy.clone());
        if whole {
            let puller = copy.clone();
            std::thread::Builder::new()
                .name("f3-fetch".into())
                .spawn(move || pull_whole(&puller))
                .map_err(|e| F3Error::io("starting a fetcher thread", e))?;
        }
        Ok(copy)
    }

    /// The range state for a copy of `entry`, if it is copied by range:
    /// large, and no writer has it open (a file being written is pulled
    /// whole, so its readers can wait at its growing end).
    fn ranged(&self, entry: &Entry) -> Option<Ranged> {
        if entry.size < self.range_threshold || !entry.writers.is_empty() {
            return None;
        }
        let chunks = Chunks::new(entry.size)
            .map_err(|e| tracing::warn!("{}: pulled whole: {e}", entry.path))
            .ok()?;
        Some(Ranged::new(chunks))
    }

    /// Drops the copy of `path`, if any; whether there was one.
    pub fn evict(&self, path: &str) -> bool {
        match self.copies.lock().remove(path) {
            Some(copy) => {
                let _ = std::fs::remove_file(self.copy_path(path, copy.version));
                true
            }
            None => false,
        }
    }

    /// The directory of the copies.
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// The copies that no handle reads and nothing fetches into (whole
    /// ones, or ones by range): those that may be evicted to make room
    /// (the holder has them).
    pub fn idle(&self) -> Vec<String> {
        self.copies
            .lock()
            .iter()
            .filter(|(_, copy)| Arc::strong_count(copy) == 1 && copy.evictable())
            .map(|(path, _)| path.clone())
            .collect()
    }

    /// Drops the copy of `path` if it is still idle; the bytes freed.
    pub fn evict_idle(&self, path: &str) -> Option<u64> {
        let mut copies = self.copies.lock();
        let copy = copies.get(path)?;
        if Arc::strong_count(copy) != 1 || !copy.evictable() {
            return None;
        }
        let copy = copies.remove(path)?;
        drop(copies);
        let _ = std::fs::remove_file(self.copy_path(path, copy.version));
        // The service ranks nodes by what they hold: this one holds none.
        copy.link.report(path, 0);
        Some(copy.arrived_bytes())
    }

    fn copy_path(&self, path: &str, version: u64) -> PathBuf {
        self.directory
            .join(format!("{}.{version}", content_name(path)))
    }
}

impl RemoteCopy {
    /// Whether it may be evicted when idle: whole, or by range (the
    /// chunks here can be fetched again).
    fn evictable(&self) -> bool {
        let progress = self.progress.lock();
        progress.done || progress.ranged.is_some()
    }
}

/// Pulls a whole copy, range by range from its start, until the end or a
/// failure.
fn pull_whole(copy: &RemoteCopy) {
    let path = copy.path.as_str();
    let source = &copy.link.source;
    // Silence counts from the holder's last answer, not from the first
    // failed call: a call to a holder cut off fails only when its own
    // time is up, which must not come on top of the lease.
    let mut answered = Instant::now();
    loop {
        let offset = copy.progress.lock().fetched;
        let answer = copy.link.agents.fetch(
            &source.address,
            path,
            offset,
            FETCH_BYTES,
            LONG_POLL,
            patience(source.lease),
        );
        match answer {
            Ok(piece) => {
                answered = Instant::now();
                if !copy.same_generation(piece.generation) {
                    // The file was opened for writing again (or cut)
                    // since the pull began: its next bytes may be
                    // another content's.
                    copy.fail(rewritten(path, source, piece.size, piece.writing));
                    return;
                }
                if let Err(e) = copy.file.write_all_at(&piece.bytes, offset) {
                    copy.fail(format!("{path}: writing the local copy: {e}"));
                    return;
                }
                copy.link
                    .grown
                    .fetch_add(piece.bytes.len() as u64, Ordering::Relaxed);
                let fetched = offset + piece.bytes.len() as u64;
                let done = piece.bytes.is_empty() && !piece.writing && fetched >= piece.size;
                copy.advance(|p| {
                    p.fetched = fetched;
                    p.done = done;
                });
                if done {
                    copy.link.report(path, fetched);
                    return;
                }
            }
            Err(e) if e.kind == ErrorKind::NotFound || e.kind == ErrorKind::Invalid => {
                copy.fail(refused(path, source, &e));
                return;
            }
            Err(e) => {
                if answered.elapsed() >= source.lease {
                    copy.fail(silent(path, source, answered.elapsed(), &e));
                    return;
                }
                std::thread::sleep(RETRY_PAUSE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = CHUNK_BYTES;

    fn ranged(size: u64) -> Ranged {
        Ranged::new(Chunks::new(size).unwrap())
    }

    #[test]
    fn a_random_read_gets_no_read_ahead() {
        let mut copy = ranged(160 * MIB);
        assert!(!copy.note_read(150 * MIB, 128 * 1024));
        assert_eq!(copy.run, 0);
        assert!(!copy.note_read(3 * MIB, 4096), "another jump");
    }

    #[test]
    fn a_sequential_read_ahead_grows_with_the_run_up_to_its_bound() {
        let mut copy = ranged(160 * MIB);
        assert!(!copy.note_read(100 * MIB, 128 * 1024));
        // The next request: a run of 128 KiB, so as much read ahead.
        assert!(copy.note_read(100 * MIB + 128 * 1024, 128 * 1024));
        assert_eq!(copy.ahead, (100 * MIB + 256 * 1024, 100 * MIB + 384 * 1024));
        let mut offset = 100 * MIB + 256 * 1024;
        while offset < 120 * MIB {
            copy.note_read(offset, 128 * 1024);
            offset += 128 * 1024;
        }
        assert_eq!(copy.ahead, (120 * MIB, 120 * MIB + READ_AHEAD_BYTES));
        assert_eq!(copy.window(), 120..128);
        // Near the end, the window stops at the file's end.
        while offset < 155 * MIB {
            copy.note_read(offset, MIB);
            offset += MIB;
        }
        assert_eq!(copy.ahead, (155 * MIB, 160 * MIB));
        assert_eq!(copy.window(), 155..160);
    }

    #[test]
    fn no_read_ahead_thread_when_the_window_is_here_or_one_runs() {
        let mut copy = ranged(16 * MIB);
        for index in 0..16 {
            copy.chunks.claim(index);
            copy.chunks.arrive(index);
        }
        assert!(!copy.note_read(0, MIB));
        assert!(!copy.note_read(MIB, MIB), "every chunk is here");
        let mut copy = ranged(16 * MIB);
        copy.prefetching = true;
        assert!(!copy.note_read(0, MIB), "one thread fills the window");
        assert_eq!(copy.window(), 1..2);
    }
}

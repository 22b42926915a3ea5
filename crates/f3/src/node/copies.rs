//! Copies of ephemeral files held by other nodes, pulled into
//! `DIR/copies/` by one fetcher thread per copy in ranges of
//! [`FETCH_BYTES`], while their writer may still be writing: an open
//! returns at once, reads take what has arrived and wait at its end for
//! more, for the end of the file (once the holder says no writer has it
//! open and every byte is here), or for a failure (EIO). A holder that
//! stops answering (killed, or its link cut) fails the copy once it has
//! been silent for the lease: at most a long poll, the lease and a
//! connect timeout after its last answer, never later.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::local::content_name;
use crate::client::{AgentClient, ServiceClient};
use crate::error::ErrorKind;
use crate::protocol::HeldFile;
use crate::{F3Error, Result};

/// Bytes asked of the holder at a time.
pub const FETCH_BYTES: u64 = 1024 * 1024;

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

/// What the fetcher has done so far.
#[derive(Debug, Clone)]
struct Progress {
    fetched: u64,
    done: bool,
    failure: Option<String>,
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

impl RemoteCopy {
    /// Up to `length` bytes from `offset` without waiting.
    pub fn try_read(&self, offset: u64, length: u32) -> std::io::Result<CopyRead> {
        let progress = self.progress.lock().clone();
        self.read_with(&progress, offset, length)
    }

    /// Up to `length` bytes from `offset`, waiting at the end of what has
    /// arrived (up to `limit`, then [`CopyRead::Wait`]).
    pub fn read_waiting(
        &self,
        offset: u64,
        length: u32,
        limit: Duration,
    ) -> std::io::Result<CopyRead> {
        let deadline = Instant::now() + limit;
        let mut progress = self.progress.lock();
        while offset >= progress.fetched && !progress.done && progress.failure.is_none() {
            if self.changed.wait_until(&mut progress, deadline).timed_out() {
                return Ok(CopyRead::Wait);
            }
        }
        let snapshot = progress.clone();
        drop(progress);
        self.read_with(&snapshot, offset, length)
    }

    fn read_with(
        &self,
        progress: &Progress,
        offset: u64,
        length: u32,
    ) -> std::io::Result<CopyRead> {
        if offset < progress.fetched {
            let wanted = (progress.fetched - offset).min(u64::from(length)) as usize;
            let mut buffer = vec![0; wanted];
            self.file.read_exact_at(&mut buffer, offset)?;
            return Ok(CopyRead::Bytes(buffer));
        }
        if let Some(failure) = &progress.failure {
            return Ok(CopyRead::Failed(failure.clone()));
        }
        if progress.done {
            return Ok(CopyRead::Bytes(Vec::new()));
        }
        Ok(CopyRead::Wait)
    }

    /// Whether the fetcher failed.
    pub fn failed(&self) -> bool {
        self.progress.lock().failure.is_some()
    }

    fn advance(&self, update: impl FnOnce(&mut Progress)) {
        let mut progress = self.progress.lock();
        update(&mut progress);
        self.changed.notify_all();
    }
}

/// Where a fetcher pulls from and reports to.
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

/// The copies this node holds or is pulling.
#[derive(Debug)]
pub struct Copies {
    directory: PathBuf,
    copies: Mutex<HashMap<String, Arc<RemoteCopy>>>,
    agents: AgentClient,
    service: ServiceClient,
    /// Where the bytes pulled are counted against the node's quota.
    grown: Arc<AtomicU64>,
}

impl Copies {
    /// Copies kept in `directory` (created if missing), their bytes
    /// counted in `grown` as they arrive.
    pub fn new(
        directory: PathBuf,
        agents: AgentClient,
        service: ServiceClient,
        grown: Arc<AtomicU64>,
    ) -> Result<Copies> {
        std::fs::create_dir_all(&directory)
            .map_err(|e| F3Error::io(format!("creating {}", directory.display()), e))?;
        Ok(Copies {
            directory,
            copies: Mutex::new(HashMap::new()),
            agents,
            service,
            grown,
        })
    }

    /// The copy of `path` at `version`: the one held or arriving, else a
    /// new one whose fetcher starts now.
    pub fn open(&self, path: &str, version: u64, source: Source) -> Result<Arc<RemoteCopy>> {
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
        let copy = Arc::new(RemoteCopy {
            path: path.to_string(),
            version,
            file,
            progress: Mutex::new(Progress {
                fetched: 0,
                done: false,
                failure: None,
            }),
            changed: Condvar::new(),
        });
        copies.insert(path.to_string(), copy.clone());
        let fetcher = Fetcher {
            copy: copy.clone(),
            source,
            agents: self.agents.clone(),
            service: self.service.clone(),
            grown: self.grown.clone(),
        };
        std::thread::Builder::new()
            .name("f3-fetch".into())
            .spawn(move || fetcher.run())
            .map_err(|e| F3Error::io("starting a fetcher thread", e))?;
        Ok(copy)
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

    /// The copies whole here that no handle reads: those that may be
    /// evicted to make room (the holder has them).
    pub fn idle(&self) -> Vec<String> {
        self.copies
            .lock()
            .iter()
            .filter(|(_, copy)| Arc::strong_count(copy) == 1 && copy.progress.lock().done)
            .map(|(path, _)| path.clone())
            .collect()
    }

    /// Drops the copy of `path` if it is still idle; the bytes freed.
    pub fn evict_idle(&self, path: &str) -> Option<u64> {
        let mut copies = self.copies.lock();
        let copy = copies.get(path)?;
        let fetched = {
            let progress = copy.progress.lock();
            (Arc::strong_count(copy) == 1 && progress.done).then_some(progress.fetched)
        }?;
        let copy = copies.remove(path)?;
        let _ = std::fs::remove_file(self.copy_path(path, copy.version));
        Some(fetched)
    }

    fn copy_path(&self, path: &str, version: u64) -> PathBuf {
        self.directory
            .join(format!("{}.{version}", content_name(path)))
    }
}

/// Pulls one copy, range by range, until the end or a failure.
struct Fetcher {
    copy: Arc<RemoteCopy>,
    source: Source,
    agents: AgentClient,
    service: ServiceClient,
    grown: Arc<AtomicU64>,
}

impl Fetcher {
    fn run(self) {
        let path = self.copy.path.clone();
        // Silence counts from the holder's last answer, not from the
        // first failed call: a call to a holder cut off fails only when
        // its own time is up, which must not come on top of the lease.
        let patience = self.source.lease.clamp(LEAST_PATIENCE, MOST_PATIENCE);
        let mut answered = Instant::now();
        loop {
            let offset = self.copy.progress.lock().fetched;
            let answer = self.agents.fetch(
                &self.source.address,
                &path,
                offset,
                FETCH_BYTES,
                LONG_POLL,
                patience,
            );
            match answer {
                Ok(piece) => {
                    answered = Instant::now();
                    if let Err(e) = self.copy.file.write_all_at(&piece.bytes, offset) {
                        self.fail(format!("{path}: writing the local copy: {e}"));
                        return;
                    }
                    self.grown
                        .fetch_add(piece.bytes.len() as u64, Ordering::Relaxed);
                    let fetched = offset + piece.bytes.len() as u64;
                    let done = piece.bytes.is_empty() && !piece.writing && fetched >= piece.size;
                    self.copy.advance(|p| {
                        p.fetched = fetched;
                        p.done = done;
                    });
                    if done {
                        let held = HeldFile {
                            path: path.clone(),
                            bytes: fetched,
                        };
                        if let Err(e) = self.service.report(&self.source.node, vec![held]) {
                            tracing::warn!("{path}: reporting the copy to the F3 service: {e}");
                        }
                        return;
                    }
                }
                Err(e) if e.kind == ErrorKind::NotFound || e.kind == ErrorKind::Invalid => {
                    self.fail(format!(
                        "{path}: node {} refused the transfer: {e}",
                        self.source.holder
                    ));
                    return;
                }
                Err(e) => {
                    if answered.elapsed() >= self.source.lease {
                        self.fail(format!(
                            "{path}: node {} holding it has not answered for {:?} (its lease \
                             is {:?}): {e}; the ephemeral data it held is lost unless it \
                             comes back",
                            self.source.holder,
                            answered.elapsed(),
                            self.source.lease
                        ));
                        return;
                    }
                    std::thread::sleep(RETRY_PAUSE);
                }
            }
        }
    }

    fn fail(&self, why: String) {
        tracing::error!("{why}");
        self.copy.advance(|p| p.failure = Some(why));
    }
}

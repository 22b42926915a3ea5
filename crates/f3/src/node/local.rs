//! Ephemeral files this node holds: their content in `DIR/files/`, one
//! file per path (named by the path's SHA-256), with their size and open
//! writers in memory, so a read at the end of a file being written waits
//! for more bytes, or for the last writer's close, rather than ending.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::{F3Error, Result};

/// The file name of a path's content in a node's directories.
pub fn content_name(path: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(path.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// One ephemeral file held here.
#[derive(Debug)]
pub struct LocalFile {
    /// Its namespace path.
    pub path: String,
    file: File,
    state: Mutex<LocalState>,
    changed: Condvar,
}

#[derive(Debug, Clone, Copy)]
struct LocalState {
    size: u64,
    writers: u32,
    /// Changes whenever the content may be replaced (a writer opens, a
    /// truncate), so a ranged copy never mixes two contents.
    generation: u64,
}

/// A generation no other content of this agent had, nor (being seeded
/// from the clock) of its earlier runs.
fn next_generation() -> u64 {
    static NEXT: std::sync::OnceLock<std::sync::atomic::AtomicU64> = std::sync::OnceLock::new();
    NEXT.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        std::sync::atomic::AtomicU64::new(now.as_nanos() as u64)
    })
    .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl LocalFile {
    /// Writes `data` at `offset`, and wakes the readers waiting for it.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.file.write_all_at(data, offset)?;
        let mut state = self.state.lock();
        state.size = state.size.max(offset + data.len() as u64);
        self.changed.notify_all();
        Ok(())
    }

    /// Up to `length` bytes from `offset`, or none at the end, without
    /// waiting. `None` means: at the end, with a writer open (wait).
    pub fn try_read(&self, offset: u64, length: u32) -> std::io::Result<Option<Vec<u8>>> {
        let state = *self.state.lock();
        if offset >= state.size && state.writers > 0 {
            return Ok(None);
        }
        self.read_within(offset, length, state.size).map(Some)
    }

    /// Up to `length` bytes from `offset`; at the end, waits while a
    /// writer has the file open (up to `limit`, then `None`).
    pub fn read_waiting(
        &self,
        offset: u64,
        length: u32,
        limit: Duration,
    ) -> std::io::Result<Option<Vec<u8>>> {
        let deadline = std::time::Instant::now() + limit;
        let mut state = self.state.lock();
        while offset >= state.size && state.writers > 0 {
            if self.changed.wait_until(&mut state, deadline).timed_out() {
                return Ok(None);
            }
        }
        let size = state.size;
        drop(state);
        self.read_within(offset, length, size).map(Some)
    }

    fn read_within(&self, offset: u64, length: u32, size: u64) -> std::io::Result<Vec<u8>> {
        let wanted = (size.saturating_sub(offset)).min(u64::from(length)) as usize;
        let mut buffer = vec![0; wanted];
        let mut done = 0;
        while done < wanted {
            let n = self
                .file
                .read_at(&mut buffer[done..], offset + done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        buffer.truncate(done);
        Ok(buffer)
    }

    /// Puts its bytes on the disk (an fsync through the mount).
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    /// Its size now and whether a writer has it open.
    pub fn snapshot(&self) -> (u64, bool) {
        let state = self.state.lock();
        (state.size, state.writers > 0)
    }

    /// Its content's generation: a copy fetched by ranges checks that
    /// every range comes from the same one.
    pub fn generation(&self) -> u64 {
        self.state.lock().generation
    }

    /// A writer opened it, emptying it first if `truncate`: the content
    /// may change, so it takes a new generation. One step under the
    /// lock, so a transfer sees either the old content with no writer
    /// or the new generation with one, never a state in between.
    pub fn open_writer(&self, truncate: bool) -> std::io::Result<()> {
        let mut state = self.state.lock();
        if truncate {
            self.file.set_len(0)?;
            state.size = 0;
        }
        state.writers += 1;
        state.generation = next_generation();
        self.changed.notify_all();
        Ok(())
    }

    /// A writer closed it; wakes the waiting readers (at the last close,
    /// they see the end of the file).
    pub fn close_writer(&self) {
        let mut state = self.state.lock();
        state.writers = state.writers.saturating_sub(1);
        self.changed.notify_all();
    }

    /// Truncates or extends it to `size`.
    pub fn set_size(&self, size: u64) -> std::io::Result<()> {
        self.file.set_len(size)?;
        let mut state = self.state.lock();
        state.size = size;
        state.generation = next_generation();
        self.changed.notify_all();
        Ok(())
    }
}

/// The ephemeral files this node holds.
#[derive(Debug)]
pub struct LocalFiles {
    directory: PathBuf,
    open: Mutex<HashMap<String, Arc<LocalFile>>>,
}

impl LocalFiles {
    /// The files kept in `directory` (created if missing).
    pub fn new(directory: PathBuf) -> Result<LocalFiles> {
        std::fs::create_dir_all(&directory)
            .map_err(|e| F3Error::io(format!("creating {}", directory.display()), e))?;
        Ok(LocalFiles {
            directory,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// The directory of the contents.
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// The files held here that no handle has open and no writer holds:
    /// those that may be spilled to make room.
    pub fn idle(&self) -> Vec<String> {
        self.open
            .lock()
            .iter()
            // The map's own reference is the only one: no handle.
            .filter(|(_, file)| Arc::strong_count(file) == 1 && !file.snapshot().1)
            .map(|(path, _)| path.clone())
            .collect()
    }

    /// Where `path`'s content lives.
    pub fn content_path(&self, path: &str) -> PathBuf {
        self.directory.join(content_name(path))
    }

    /// `path`'s content, opened; created empty when `create`, else it
    /// must exist (NotFound otherwise).
    pub fn open(&self, path: &str, create: bool) -> Result<Arc<LocalFile>> {
        let mut open = self.open.lock();
        if let Some(file) = open.get(path) {
            return Ok(file.clone());
        }
        let content = self.content_path(path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(&content)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => F3Error::not_found(format!(
                    "{path}: this node holds no content for it ({} is missing)",
                    content.display()
                )),
                _ => F3Error::io(format!("opening {}", content.display()), e),
            })?;
        let size = file
            .metadata()
            .map_err(|e| F3Error::io(format!("reading {}", content.display()), e))?
            .len();
        let local = Arc::new(LocalFile {
            path: path.to_string(),
            file,
            state: Mutex::new(LocalState {
                size,
                writers: 0,
                generation: next_generation(),
            }),
            changed: Condvar::new(),
        });
        open.insert(path.to_string(), local.clone());
        Ok(local)
    }

    /// The file if this node has it open.
    pub fn get(&self, path: &str) -> Option<Arc<LocalFile>> {
        self.open.lock().get(path).cloned()
    }

    /// Forgets `path` and deletes its content.
    pub fn remove(&self, path: &str) -> Result<()> {
        self.open.lock().remove(path);
        let content = self.content_path(path);
        match std::fs::remove_file(&content) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(F3Error::io(format!("removing {}", content.display()), e)),
        }
    }

    /// Forgets `path` and moves its content to `to` (persist keeps it as
    /// the durable file's local copy).
    pub fn take(&self, path: &str, to: &Path) -> Result<()> {
        self.open.lock().remove(path);
        let content = self.content_path(path);
        std::fs::rename(&content, to).map_err(|e| {
            F3Error::io(
                format!("moving {} to {}", content.display(), to.display()),
                e,
            )
        })
    }
}

//! Removal of layer files in the background.
//!
//! Unlinking a layer can take tens of seconds: a layer that took small
//! writes into reserved clusters is made of thousands of extents, and a
//! file system mounted with online `discard` frees them one by one. So a
//! delete only renames its files into `POOL/trash/` (one cheap, atomic
//! step; the catalog already forgot them) and a reaper thread unlinks them.
//! Files left there by a crash or a shutdown are reaped at the next start.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use crate::error::{Result, VolumeError};
use crate::failpoint::failpoint;

/// The pool's trash directory and its reaper.
#[derive(Debug)]
pub struct Trash {
    dir: PathBuf,
    reaper: mpsc::Sender<PathBuf>,
    /// Files renamed into the trash and not unlinked yet.
    pending: Arc<AtomicUsize>,
}

impl Trash {
    /// Opens `pool/trash` (creating it), starts the reaper and hands it
    /// whatever an earlier run left there.
    pub fn open(pool: &Path) -> Result<Trash> {
        let dir = crate::pool::trash(pool);
        std::fs::create_dir_all(&dir).map_err(|e| {
            VolumeError::Io(format!(
                "cannot create trash directory {}: {e}",
                dir.display()
            ))
        })?;
        let (tx, rx) = mpsc::channel::<PathBuf>();
        let pending = Arc::new(AtomicUsize::new(0));
        let left = pending.clone();
        std::thread::Builder::new()
            .name("strata-trash".into())
            .spawn(move || {
                for path in rx {
                    failpoint("trash-before-unlink");
                    if let Err(e) = std::fs::remove_file(&path) {
                        tracing::warn!("could not remove {}: {e}", path.display());
                    }
                    left.fetch_sub(1, Ordering::AcqRel);
                }
            })
            .map_err(|e| VolumeError::Io(format!("cannot start the trash reaper: {e}")))?;
        let trash = Trash {
            dir,
            reaper: tx,
            pending,
        };
        let entries = std::fs::read_dir(&trash.dir)
            .map_err(|e| VolumeError::Io(format!("cannot list {}: {e}", trash.dir.display())))?;
        for entry in entries.flatten() {
            trash.reap(entry.path());
        }
        Ok(trash)
    }

    /// Moves `file` into the trash for the reaper to unlink. A file that
    /// cannot be moved is unlinked here instead.
    pub fn discard(&self, file: &Path) -> std::io::Result<()> {
        let Some(name) = file.file_name() else {
            return std::fs::remove_file(file);
        };
        let to = self.dir.join(name);
        match std::fs::rename(file, &to) {
            Ok(()) => {
                self.reap(to);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(e),
            Err(_) => std::fs::remove_file(file),
        }
    }

    /// Files waiting to be unlinked.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    fn reap(&self, path: PathBuf) {
        self.pending.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::SendError(path)) = self.reaper.send(path) {
            // The reaper is gone (it never panics; only at exit): unlink here.
            let _ = std::fs::remove_file(path);
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

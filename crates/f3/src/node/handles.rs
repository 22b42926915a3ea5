//! Open files of the FUSE file system: what an open finds and makes
//! (an ephemeral file held here, a copy arriving from its holder, a
//! durable file's local copy or staging file), and a durable file's
//! write-back to the store.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::Arc;

use super::copies::{RemoteCopy, Source};
use super::local::LocalFile;
use super::Shared;
use crate::error::ErrorKind;
use crate::protocol::*;
use crate::{F3Error, Result};

/// An open file.
pub enum Handle {
    /// An ephemeral file held here.
    Local {
        /// The file.
        file: Arc<LocalFile>,
        /// Opened for writing.
        writable: bool,
    },
    /// An ephemeral file held elsewhere, arriving.
    Remote {
        /// The copy.
        copy: Arc<RemoteCopy>,
    },
    /// A durable file: its local copy (read) or staging file (write).
    Durable {
        /// Its namespace path.
        path: String,
        /// The local copy, or the staging file.
        file: File,
        /// The staging file's path, when opened for writing.
        staging: Option<PathBuf>,
        /// Written since the last upload.
        dirty: std::sync::atomic::AtomicBool,
    },
}

/// Opens `entry` (a file) as this node may: the handle and whether
/// it is writable.
pub fn open_entry(
    shared: &Shared,
    entry: &Entry,
    writable: bool,
    truncate: bool,
    tag: u64,
) -> Result<Handle> {
    let path = entry.path.as_str();
    shared.budget.touch(path);
    if entry.ephemeral {
        let holder = entry.holder.clone().unwrap_or_default();
        if holder == shared.name {
            let file = shared.local.open(path, false)?;
            if writable {
                shared.service.writer(&WriterRequest {
                    path: path.into(),
                    node: shared.name.clone(),
                    opened: true,
                    size: None,
                })?;
                file.open_writer(truncate)
                    .map_err(|e| F3Error::io(format!("truncating {path}"), e))?;
            }
            return Ok(Handle::Local { file, writable });
        }
        if writable {
            return Err(F3Error::new(
                ErrorKind::Conflict,
                format!("{path} is ephemeral and held by node {holder}: write it there"),
            ));
        }
        let node = shared.service.node(&holder)?;
        let copy = shared.copies.open(
            entry,
            Source {
                holder,
                address: node.address,
                node: shared.name.clone(),
                lease: shared.lease,
            },
        )?;
        return Ok(Handle::Remote { copy });
    }
    let durable = shared.durable()?;
    if writable {
        let staging =
            shared
                .staging_dir
                .join(format!("{}.{}", super::local::content_name(path), tag));
        if truncate || entry.size == 0 {
            File::create(&staging)
                .map_err(|e| F3Error::io(format!("creating {}", staging.display()), e))?;
        } else {
            durable.download(path, &staging)?;
        }
        shared.service.writer(&WriterRequest {
            path: path.into(),
            node: shared.name.clone(),
            opened: true,
            size: None,
        })?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&staging)
            .map_err(|e| F3Error::io(format!("opening {}", staging.display()), e))?;
        return Ok(Handle::Durable {
            path: path.into(),
            file,
            staging: Some(staging),
            dirty: std::sync::atomic::AtomicBool::new(truncate),
        });
    }
    let cache = shared.cache_path(path);
    let current = shared.cached.lock().get(path) == Some(&entry.version);
    if !current {
        if entry.size == 0 {
            File::create(&cache)
                .map_err(|e| F3Error::io(format!("creating {}", cache.display()), e))?;
        } else {
            durable.download(path, &cache)?;
            shared.budget.grew(entry.size);
        }
        shared.cached.lock().insert(path.into(), entry.version);
        let _ = shared.service.report(
            &shared.name,
            vec![HeldFile {
                path: path.into(),
                bytes: entry.size,
            }],
        );
    }
    let file =
        File::open(&cache).map_err(|e| F3Error::io(format!("opening {}", cache.display()), e))?;
    Ok(Handle::Durable {
        path: path.into(),
        file,
        staging: None,
        dirty: std::sync::atomic::AtomicBool::new(false),
    })
}

/// Writes a durable file's staging content back to the store.
pub fn upload(shared: &Shared, path: &str, staging: &std::path::Path) -> Result<u64> {
    let size = shared.durable()?.upload(path, staging)?;
    let entry = shared.service.update(&UpdateRequest {
        path: path.into(),
        size: Some(size),
        ..UpdateRequest::default()
    })?;
    // The uploaded content is this node's local copy now.
    let cache = shared.cache_path(path);
    // Through a new file renamed over the old one: readers of the
    // previous content keep theirs.
    let fresh = cache.with_extension("fresh");
    if std::fs::copy(staging, &fresh).is_ok() && std::fs::rename(&fresh, &cache).is_ok() {
        shared.budget.grew(size);
        shared.cached.lock().insert(path.into(), entry.version);
        let held = HeldFile {
            path: path.into(),
            bytes: size,
        };
        if let Err(e) = shared.service.report(&shared.name, vec![held]) {
            tracing::warn!("{path}: reporting the local copy to the F3 service: {e}");
        }
    }
    Ok(size)
}

//! Errors of the volume service, each mapped to an HTTP status.
//!
//! A client sees [`VolumeError::public_message`]: the whole message for an
//! error of its request (4xx), and for a failure of the service (5xx) what
//! went wrong without the pool's file names, which only the daemon's log
//! shows.

use thiserror::Error;

/// Result alias for this crate.
pub type Result<T, E = VolumeError> = std::result::Result<T, E>;

/// An error of the volume service. Messages say what was wrong and what to do.
#[derive(Debug, Error)]
pub enum VolumeError {
    /// The request names something that does not exist (404).
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the current state (409).
    #[error("{0}")]
    Conflict(String),
    /// The request itself is invalid (400).
    #[error("{0}")]
    Invalid(String),
    /// The disk engine failed (500; 507 when the file system is full).
    #[error("{0}")]
    Disk(#[from] strata_disk::DiskError),
    /// The catalog database failed (500).
    #[error("catalog: {0}")]
    Catalog(String),
    /// A file operation of the pool failed (500).
    #[error("{0}")]
    Io(String),
    /// The pool's file system has no room left (507).
    #[error("{0}")]
    NoSpace(String),
}

/// HTTP 507 Insufficient Storage.
pub const INSUFFICIENT_STORAGE: u16 = 507;

impl VolumeError {
    /// The HTTP status code for this error.
    pub fn status(&self) -> u16 {
        match self {
            VolumeError::NotFound(_) => 404,
            VolumeError::Conflict(_) => 409,
            VolumeError::Invalid(_) => 400,
            VolumeError::Disk(strata_disk::DiskError::Invalid(_)) => 400,
            VolumeError::NoSpace(_) => INSUFFICIENT_STORAGE,
            VolumeError::Disk(strata_disk::DiskError::Io { error, .. }) if is_no_space(error) => {
                INSUFFICIENT_STORAGE
            }
            _ => 500,
        }
    }

    /// The message an API client gets: the whole message for an error of
    /// the request, and for a failure of the service what happened and
    /// what to do, without the pool's paths (log [`std::fmt::Display`]
    /// for those). `pool` is removed from a disk engine's 400 messages,
    /// which may name a file.
    pub fn public_message(&self, pool: &std::path::Path) -> String {
        match (self, self.status()) {
            (VolumeError::Disk(strata_disk::DiskError::Invalid(msg)), _) => redact_paths(msg, pool),
            (_, INSUFFICIENT_STORAGE) => "the pool's file system is full: nothing was changed; \
                 free space in the pool (delete snapshots or volumes, or grow the file system) \
                 and retry"
                .to_string(),
            (VolumeError::Catalog(_), _) => "the pool's catalog could not be read or written; \
                 the daemon's log has the details"
                .to_string(),
            (VolumeError::Disk(_) | VolumeError::Io(_), 500) => {
                "a layer file of the pool could not be read or written; the daemon's log has \
                 the details"
                    .to_string()
            }
            _ => redact_paths(&self.to_string(), pool),
        }
    }
}

/// Whether an I/O error says the file system is full (or the quota used).
pub fn is_no_space(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EDQUOT)
    ) || error.kind() == std::io::ErrorKind::StorageFull
}

/// Replaces the pool directory (as given and as resolved) with `<pool>`.
pub fn redact_paths(message: &str, pool: &std::path::Path) -> String {
    let mut out = message.to_string();
    let resolved = std::fs::canonicalize(pool).ok();
    for dir in [Some(pool.to_path_buf()), resolved].into_iter().flatten() {
        let dir = dir.display().to_string();
        if !dir.is_empty() && dir != "." {
            out = out.replace(&dir, "<pool>");
        }
    }
    out
}

/// Whether a catalog error's chain holds an I/O error saying the file
/// system is full.
fn catalog_no_space(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>().is_some_and(is_no_space) {
            return true;
        }
        next = e.source();
    }
    // redb does not always expose its I/O error as a source.
    error.to_string().contains("No space left on device")
}

macro_rules! catalog_error {
    ($($t:ty),*) => {$(
        impl From<$t> for VolumeError {
            fn from(e: $t) -> Self {
                if catalog_no_space(&e) {
                    VolumeError::NoSpace(format!("catalog: {e}"))
                } else {
                    VolumeError::Catalog(e.to_string())
                }
            }
        }
    )*};
}

catalog_error!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    serde_json::Error
);

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use strata_disk::error::Place;

    fn io_error(errno: i32) -> VolumeError {
        VolumeError::Disk(strata_disk::DiskError::Io {
            place: Place {
                depth: 0,
                path: PathBuf::from("/srv/pool/layers/abc.qcow2"),
            },
            op: "write",
            error: std::io::Error::from_raw_os_error(errno),
        })
    }

    #[test]
    fn a_full_file_system_is_507_and_names_no_file() {
        let e = io_error(libc::ENOSPC);
        assert_eq!(e.status(), 507);
        let msg = e.public_message(Path::new("/srv/pool"));
        assert!(
            !msg.contains("/srv/pool") && !msg.contains("qcow2"),
            "{msg}"
        );
        assert!(msg.contains("full"), "{msg}");
    }

    #[test]
    fn other_io_failures_are_500_and_name_no_file() {
        let e = io_error(libc::EIO);
        assert_eq!(e.status(), 500);
        let msg = e.public_message(Path::new("/srv/pool"));
        assert!(
            !msg.contains("/srv/pool") && !msg.contains("qcow2"),
            "{msg}"
        );
    }

    #[test]
    fn request_errors_keep_their_message_without_the_pool_path() {
        let e = VolumeError::Disk(strata_disk::DiskError::Invalid(
            "/srv/pool/layers/x.qcow2: cluster size 3 must be a power of two".into(),
        ));
        assert_eq!(e.status(), 400);
        let msg = e.public_message(Path::new("/srv/pool"));
        assert_eq!(
            msg,
            "<pool>/layers/x.qcow2: cluster size 3 must be a power of two"
        );
    }
}

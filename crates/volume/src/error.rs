//! Errors of the volume service, each mapped to an HTTP status.

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
    /// The disk engine failed (500).
    #[error("{0}")]
    Disk(#[from] strata_disk::DiskError),
    /// The catalog database failed (500).
    #[error("catalog: {0}")]
    Catalog(String),
    /// A file operation of the pool failed (500).
    #[error("{0}")]
    Io(String),
}

impl VolumeError {
    /// The HTTP status code for this error.
    pub fn status(&self) -> u16 {
        match self {
            VolumeError::NotFound(_) => 404,
            VolumeError::Conflict(_) => 409,
            VolumeError::Invalid(_) => 400,
            VolumeError::Disk(strata_disk::DiskError::Invalid(_)) => 400,
            _ => 500,
        }
    }
}

macro_rules! catalog_error {
    ($($t:ty),*) => {$(
        impl From<$t> for VolumeError {
            fn from(e: $t) -> Self {
                VolumeError::Catalog(e.to_string())
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

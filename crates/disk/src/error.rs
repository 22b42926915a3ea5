//! Errors of the disk engine. Messages say what, where, and what to do.

use std::path::PathBuf;

use strata_format::FormatError;
use thiserror::Error;

/// Result alias for this crate.
pub type Result<T, E = DiskError> = std::result::Result<T, E>;

/// Where in a chain something went wrong: `layer 17 (disk-17.qcow2)`.
#[derive(Debug, Clone)]
pub struct Place {
    /// Position in the chain, 1 = base; 0 when not known yet.
    pub depth: u32,
    /// The file.
    pub path: PathBuf,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.depth > 0 {
            write!(f, "layer {} ({})", self.depth, self.path.display())
        } else {
            write!(f, "{}", self.path.display())
        }
    }
}

/// An error of the disk engine.
#[derive(Debug, Error)]
pub enum DiskError {
    /// A system call failed.
    // The inner errors are part of the message and deliberately not exposed
    // as `source()`: a field named `source` would be, and `{:#}` (anyhow)
    // would then print every message twice.
    #[error("{place}: {op} failed: {error}")]
    Io {
        /// The file.
        place: Place,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        error: std::io::Error,
    },
    /// A header or table is malformed.
    #[error("{place}: {error}")]
    Format {
        /// The file.
        place: Place,
        /// What the parser found.
        error: FormatError,
    },
    /// Metadata points somewhere it must not.
    #[error("{place}: {detail}")]
    Corrupt {
        /// The file.
        place: Place,
        /// What is wrong.
        detail: String,
    },
    /// The backing chain cannot be assembled.
    #[error("backing chain: {0}")]
    Chain(String),
    /// The image uses something Strata does not implement.
    #[error("{place}: unsupported: {detail}")]
    Unsupported {
        /// The file.
        place: Place,
        /// The feature.
        detail: String,
    },
    /// A write to an image opened read-only.
    #[error("{0}: image is open read-only")]
    ReadOnly(PathBuf),
    /// A request outside the virtual disk.
    #[error(
        "request at offset {offset} length {len} is beyond the end of the disk ({size} bytes)"
    )]
    OutOfRange {
        /// Request offset.
        offset: u64,
        /// Request length.
        len: u64,
        /// Virtual size.
        size: u64,
    },
    /// A caller passed an invalid argument.
    #[error("{0}")]
    Invalid(String),
    /// Another process holds the image's locks in a way this open
    /// conflicts with (see [`crate::lock`]).
    #[error("{}: {detail}", path.display())]
    Locked {
        /// The file.
        path: PathBuf,
        /// Which lock, and what to do.
        detail: String,
    },
}

impl DiskError {
    /// Wraps an I/O error with its place.
    pub fn io(place: &Place, op: &'static str, source: std::io::Error) -> Self {
        DiskError::Io {
            place: place.clone(),
            op,
            error: source,
        }
    }

    /// A corruption found at `place`.
    pub fn corrupt(place: &Place, detail: impl Into<String>) -> Self {
        DiskError::Corrupt {
            place: place.clone(),
            detail: detail.into(),
        }
    }

    /// A format error found at `place`.
    pub fn format(place: &Place, source: FormatError) -> Self {
        match source {
            FormatError::Unsupported(detail) => DiskError::Unsupported {
                place: place.clone(),
                detail,
            },
            error => DiskError::Format {
                place: place.clone(),
                error,
            },
        }
    }
}

//! The errors of a benchmark run, each saying what failed, where, and
//! what to do.

use std::path::PathBuf;

/// What went wrong in a run, a report or a cleanup.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec was refused (nothing was started).
    #[error("{}:{}: {}", path.display(), problem.line, problem.message)]
    Spec {
        /// The spec file.
        path: PathBuf,
        /// Its line and the fix.
        problem: crate::spec::SpecError,
    },
    /// A file or directory of the run could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: String,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The provider could not be started, reached or cleaned up.
    #[error("{0}")]
    Provider(String),
    /// The HTML report could not be drawn.
    #[error("{0}")]
    Report(String),
    /// An option of `strata bench s3` was refused: the message names it
    /// and what to give instead.
    #[error("{0}")]
    Argument(String),
    /// An S3 load run could not start or was cut short.
    #[error("{0}")]
    Load(String),
    /// A run directory's contents are not what `strata bench` writes.
    #[error("{}: {message}", path.display())]
    RunDirectory {
        /// The file.
        path: PathBuf,
        /// What is wrong and what to do.
        message: String,
    },
}

impl Error {
    /// An I/O error on `path` while doing `what`.
    pub fn io(what: impl Into<String>, path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            path: path.into(),
            source,
        }
    }
}

/// A benchmark result.
pub type Result<T> = std::result::Result<T, Error>;

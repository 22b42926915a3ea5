//! What a run writes: one JSON line per operation (`records.jsonl`), the
//! workloads' I/O per second (`io.jsonl`) and the run's identity
//! (`run.json`).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The records file in a run directory.
pub const RECORDS: &str = "records.jsonl";
/// The I/O time series file in a run directory.
pub const IO_SERIES: &str = "io.jsonl";
/// The run's identity file.
pub const RUN_INFO: &str = "run.json";
/// Most lines read back from a records or series file: a run directory is
/// input, and a report of a bigger one is refused rather than exhausting
/// memory.
pub const MAX_LINES: usize = 10_000_000;

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// It did what it was asked.
    Ok,
    /// It failed; `error` says why.
    Error,
    /// It arrived while its operation had `max_in_flight` in flight, and
    /// was not started (an open rate's overload).
    Dropped,
    /// It found nothing to act on (a delete before anything was made):
    /// not started.
    Skipped,
}

/// One operation: a control operation, a workload instance, a setup or a
/// cleanup step. Times are seconds since the run's start.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// The spec's name for it (a control operation's or a workload's), or
    /// `setup` and `cleanup`.
    pub operation: String,
    /// What it did: create, delete, snapshot, delete_snapshot, clone,
    /// resize, workload.
    pub action: String,
    /// What it acted on: a volume, `VOLUME@SNAPSHOT`, or a new volume's
    /// name after `<-` for a clone.
    pub target: String,
    /// When it started.
    pub start: f64,
    /// When each stage was reached (accepted, created, attached, running...).
    pub stages: BTreeMap<String, f64>,
    /// When it ended.
    pub end: f64,
    /// How it ended.
    pub status: Status,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    /// What the provider reported of it (a snapshot's I/O pause...).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub detail: Option<serde_json::Value>,
}

/// One second of one workload instance's I/O.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IoSample {
    /// The workload's name.
    pub workload: String,
    /// The instance (0-based).
    pub instance: u32,
    /// The second since the run's start: I/O in [second, second + 1).
    pub second: u64,
    /// Reads completed in that second.
    pub read_iops: f64,
    /// Writes completed in that second.
    pub write_iops: f64,
    /// KiB read in that second.
    pub read_kib: f64,
    /// KiB written in that second.
    pub write_kib: f64,
    /// Transactions completed in that second (pgbench), or operations a
    /// command's output parser read; they count as the workload's
    /// operations.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub transactions: f64,
}

fn is_zero(value: &f64) -> bool {
    *value == 0.0
}

impl IoSample {
    /// Operations completed in the second: reads, writes and transactions.
    pub fn operations(&self) -> f64 {
        self.read_iops + self.write_iops + self.transactions
    }
}

/// The run's identity, written before anything starts so that
/// `strata bench clean` finds what a killed run left.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunInfo {
    /// The run id every name the run gives starts with.
    pub run_id: String,
    /// The seed of every random draw.
    pub seed: u64,
    /// The provider: `strata` or `null`.
    pub provider: String,
    /// The Strata daemon's API address, when the run used one.
    #[serde(default)]
    pub api: Option<String>,
    /// Whether the run started that daemon itself (on `pool/` in the run
    /// directory).
    #[serde(default)]
    pub own_daemon: bool,
    /// Unix time of the run's start, in seconds.
    pub started_unix: f64,
    /// When the workloads started (seconds since the run's start).
    #[serde(default)]
    pub measure_start: f64,
    /// How long the workloads ran and operations arrived, in seconds.
    pub duration: f64,
    /// Whether the run was stopped early (Ctrl-C).
    #[serde(default)]
    pub interrupted: bool,
}

impl RunInfo {
    /// Writes `run.json` in `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(RUN_INFO);
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::RunDirectory {
            path: path.clone(),
            message: e.to_string(),
        })?;
        std::fs::write(&path, text).map_err(|e| Error::io("cannot write", &path, e))
    }

    /// Reads `run.json` in `dir`.
    pub fn load(dir: &Path) -> Result<RunInfo> {
        let path = dir.join(RUN_INFO);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Error::io(
                "cannot read the run's identity (is this a `strata bench run --out` directory?)",
                &path,
                e,
            )
        })?;
        serde_json::from_str(&text).map_err(|e| Error::RunDirectory {
            path,
            message: format!("not a run identity written by `strata bench run`: {e}"),
        })
    }
}

/// A JSON-lines file that threads append to, one whole line at a time,
/// flushed at once so that a killed run keeps every line written.
pub struct LineWriter {
    file: Mutex<File>,
    path: PathBuf,
}

impl LineWriter {
    /// Creates (or empties) `path`.
    pub fn create(path: PathBuf) -> Result<LineWriter> {
        let file = File::create(&path).map_err(|e| Error::io("cannot create", &path, e))?;
        Ok(LineWriter {
            file: Mutex::new(file),
            path,
        })
    }

    /// Appends `item` as one line.
    pub fn append<T: Serialize>(&self, item: &T) -> Result<()> {
        let mut line = serde_json::to_vec(item).map_err(|e| Error::RunDirectory {
            path: self.path.clone(),
            message: e.to_string(),
        })?;
        line.push(b'\n');
        self.file
            .lock()
            .write_all(&line)
            .map_err(|e| Error::io("cannot append to", &self.path, e))
    }
}

/// Reads every line of a JSON-lines file (at most [`MAX_LINES`]).
pub fn read_lines<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Vec<T>> {
    let file = File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    let mut items = Vec::new();
    for (index, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| Error::io("cannot read", path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        if index >= MAX_LINES {
            return Err(Error::RunDirectory {
                path: path.to_path_buf(),
                message: format!("more than {MAX_LINES} lines: split the run"),
            });
        }
        let item = serde_json::from_str(&line).map_err(|e| Error::RunDirectory {
            path: path.to_path_buf(),
            message: format!(
                "line {}: not a line `strata bench run` writes: {e}",
                index + 1
            ),
        })?;
        items.push(item);
    }
    Ok(items)
}

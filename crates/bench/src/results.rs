//! The results database of a run directory (`results.redb`): the run's
//! identity, its records, its workloads' one-second I/O series and the
//! provider's metrics samples in one embedded redb file, written at the
//! end of a run (also after Ctrl-C), and read by reports in place of the
//! JSON-lines files.
//!
//! Each table's key is the line's number in its JSON-lines file and its
//! value that line's JSON, so a report from either source sees the same
//! values in the same order. The `meta` table holds the schema version.

use std::path::Path;

use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::metrics::{MetricSample, METRICS_SERIES};
use crate::record::{read_lines, IoSample, Record, RunInfo, IO_SERIES, MAX_LINES, RECORDS};

/// The results database in a run directory.
pub const RESULTS: &str = "results.redb";

/// The version of the tables' layout this build writes and reads; a
/// database of another version is refused (its JSON files still serve).
pub const SCHEMA_VERSION: u64 = 1;

/// `schema_version` and nothing else yet.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// `info`: the run's identity (`run.json`) as JSON.
const RUN: TableDefinition<&str, &str> = TableDefinition::new("run");
/// Line number to record (`records.jsonl`).
const RECORD_ROWS: TableDefinition<u64, &str> = TableDefinition::new("records");
/// Line number to I/O sample (`io.jsonl`).
const IO_ROWS: TableDefinition<u64, &str> = TableDefinition::new("io");
/// Line number to metrics sample (`metrics.jsonl`).
const METRIC_ROWS: TableDefinition<u64, &str> = TableDefinition::new("metrics");

/// What a run directory holds: its identity, its records and its I/O
/// series.
#[derive(Clone, Debug, PartialEq)]
pub struct RunData {
    /// `run.json`.
    pub info: RunInfo,
    /// `records.jsonl`.
    pub records: Vec<Record>,
    /// `io.jsonl` (empty when the run had no workload).
    pub samples: Vec<IoSample>,
    /// `metrics.jsonl` (empty when the provider has no metrics).
    pub metrics: Vec<MetricSample>,
}

/// Reads a run directory from its JSON files only (`run.json`,
/// `records.jsonl`, `io.jsonl`, `metrics.jsonl`).
pub fn load_json(dir: &Path) -> Result<RunData> {
    Ok(RunData {
        info: RunInfo::load(dir)?,
        records: read_lines(&dir.join(RECORDS))?,
        samples: read_optional(dir, IO_SERIES)?,
        metrics: read_optional(dir, METRICS_SERIES)?,
    })
}

/// Writes `DIR/results.redb` from the run's identity and JSON-lines
/// files (each line checked as it is copied). The database is made under
/// a temporary name and renamed when complete, so a run killed while
/// writing it leaves no half-written `results.redb`.
pub fn write(dir: &Path) -> Result<()> {
    let data = load_json(dir)?;
    let path = dir.join(RESULTS);
    let partial = dir.join(format!("{RESULTS}.partial"));
    let result = write_data(&partial, &data).and_then(|()| {
        std::fs::rename(&partial, &path).map_err(|e| Error::io("cannot rename", &partial, e))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

/// Writes `data` into a new database at `path` (replacing any file there).
pub fn write_data(path: &Path, data: &RunData) -> Result<()> {
    let failed = |e: &dyn std::fmt::Display| Error::RunDirectory {
        path: path.to_path_buf(),
        message: format!("cannot write the results database: {e}"),
    };
    let _ = std::fs::remove_file(path);
    let database = Database::create(path).map_err(|e| failed(&e))?;
    let transaction = database.begin_write().map_err(|e| failed(&e))?;
    {
        let mut meta = transaction.open_table(META).map_err(|e| failed(&e))?;
        meta.insert("schema_version", SCHEMA_VERSION)
            .map_err(|e| failed(&e))?;
        let mut run = transaction.open_table(RUN).map_err(|e| failed(&e))?;
        let info = serde_json::to_string(&data.info).map_err(|e| failed(&e))?;
        run.insert("info", info.as_str()).map_err(|e| failed(&e))?;
        let mut records = transaction
            .open_table(RECORD_ROWS)
            .map_err(|e| failed(&e))?;
        insert_rows(&mut records, &data.records).map_err(|e| failed(&e))?;
        let mut io = transaction.open_table(IO_ROWS).map_err(|e| failed(&e))?;
        insert_rows(&mut io, &data.samples).map_err(|e| failed(&e))?;
        let mut metrics = transaction
            .open_table(METRIC_ROWS)
            .map_err(|e| failed(&e))?;
        insert_rows(&mut metrics, &data.metrics).map_err(|e| failed(&e))?;
    }
    transaction.commit().map_err(|e| failed(&e))
}

/// Inserts each item as JSON under its index.
fn insert_rows<T: Serialize>(
    table: &mut redb::Table<u64, &str>,
    items: &[T],
) -> std::result::Result<(), String> {
    for (index, item) in items.iter().enumerate() {
        let json = serde_json::to_string(item).map_err(|e| e.to_string())?;
        table
            .insert(index as u64, json.as_str())
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Reads `DIR/results.redb`: every table checked (schema version, row
/// counts, each row's JSON); any fault is an error naming the file and
/// the JSON fallback.
pub fn read(dir: &Path) -> Result<RunData> {
    let path = dir.join(RESULTS);
    let damaged = |what: String| Error::RunDirectory {
        path: path.clone(),
        message: format!(
            "{what}; the run's JSON files hold the same results: \
             `strata bench report --from-json {}` reads them instead",
            dir.display()
        ),
    };
    // redb asserts some of a file's header rather than returning an
    // error (a truncated file): such a panic is this file's fault, and
    // becomes its error.
    let opened = std::panic::catch_unwind(|| Database::open(&path)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(redb::DatabaseError::Storage(redb::StorageError::Corrupted(
            format!("redb refused the file: {what}"),
        )))
    });
    let database =
        opened.map_err(|e| damaged(format!("not a results database that can be read: {e}")))?;
    let transaction = database
        .begin_read()
        .map_err(|e| damaged(format!("cannot read: {e}")))?;
    let meta = transaction
        .open_table(META)
        .map_err(|e| damaged(format!("no schema version: {e}")))?;
    let version = meta
        .get("schema_version")
        .map_err(|e| damaged(format!("cannot read the schema version: {e}")))?
        .map(|v| v.value());
    if version != Some(SCHEMA_VERSION) {
        return Err(damaged(format!(
            "schema version {version:?}, this strata reads version {SCHEMA_VERSION}"
        )));
    }
    let run = transaction
        .open_table(RUN)
        .map_err(|e| damaged(format!("no run table: {e}")))?;
    let info_text = run
        .get("info")
        .map_err(|e| damaged(format!("cannot read the run's identity: {e}")))?
        .ok_or_else(|| damaged("no run identity".into()))?;
    let info: RunInfo = serde_json::from_str(info_text.value())
        .map_err(|e| damaged(format!("the run's identity is not one strata writes: {e}")))?;
    Ok(RunData {
        info,
        records: read_rows(&transaction, RECORD_ROWS, "records").map_err(&damaged)?,
        samples: read_rows(&transaction, IO_ROWS, "io").map_err(&damaged)?,
        metrics: read_rows(&transaction, METRIC_ROWS, "metrics").map_err(&damaged)?,
    })
}

/// Every row of `table`, in key order, at most [`MAX_LINES`].
fn read_rows<T: for<'de> Deserialize<'de>>(
    transaction: &redb::ReadTransaction,
    table: TableDefinition<u64, &str>,
    name: &str,
) -> std::result::Result<Vec<T>, String> {
    let table = transaction
        .open_table(table)
        .map_err(|e| format!("no {name} table: {e}"))?;
    let count = table.len().map_err(|e| format!("table {name}: {e}"))?;
    if count > MAX_LINES as u64 {
        return Err(format!(
            "table {name} has {count} rows, more than {MAX_LINES}"
        ));
    }
    let mut items = Vec::new();
    for row in table.iter().map_err(|e| format!("table {name}: {e}"))? {
        let (key, value) = row.map_err(|e| format!("table {name}: {e}"))?;
        let item = serde_json::from_str(value.value()).map_err(|e| {
            format!(
                "table {name}, row {}: not a row `strata bench run` writes: {e}",
                key.value()
            )
        })?;
        items.push(item);
    }
    Ok(items)
}

/// Reads the JSON-lines file `name` in `dir`, or nothing when it is absent.
fn read_optional<T: for<'de> Deserialize<'de>>(dir: &Path, name: &str) -> Result<Vec<T>> {
    let path = dir.join(name);
    if path.exists() {
        read_lines(&path)
    } else {
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::record::Status;
    use crate::report::summary_of;

    /// A run directory written as a run writes it: identity, records of
    /// two operations (one failure), two seconds of I/O, two scrapes.
    fn run_directory() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let info = RunInfo {
            run_id: "cns0000abcd".into(),
            seed: 5,
            provider: "strata".into(),
            api: Some("127.0.0.1:1".into()),
            own_daemon: true,
            started_unix: 1.5,
            measure_start: 0.25,
            duration: 4.0,
            interrupted: true,
        };
        info.save(dir.path()).unwrap();
        let records: Vec<Record> = (0..6)
            .map(|i| Record {
                operation: if i % 2 == 0 { "snaps" } else { "creates" }.into(),
                action: if i % 2 == 0 { "snapshot" } else { "create" }.into(),
                target: format!("v{i}"),
                start: f64::from(i) * 0.5,
                stages: BTreeMap::from([("created".to_string(), f64::from(i) * 0.5 + 0.01)]),
                end: f64::from(i) * 0.5 + 0.02 * f64::from(i + 1),
                status: if i == 3 { Status::Error } else { Status::Ok },
                error: (i == 3).then(|| "refused".to_string()),
                detail: Some(serde_json::json!({"pause_ms": i})),
            })
            .collect();
        let samples: Vec<IoSample> = (0..2)
            .map(|second| IoSample {
                workload: "writer".into(),
                instance: 0,
                second,
                read_iops: 10.0,
                write_iops: 20.0 * second as f64,
                read_kib: 40.0,
                write_kib: 80.0,
                transactions: 0.0,
            })
            .collect();
        let metrics: Vec<MetricSample> = (0..2)
            .map(|scrape| MetricSample {
                time: f64::from(scrape),
                metric: "strata_volume_ops_total".into(),
                labels: BTreeMap::from([("op".to_string(), "write".to_string())]),
                value: f64::from(scrape) * 100.0,
                kind: None,
            })
            .collect();
        write_json(&dir.path().join(RECORDS), &records);
        write_json(&dir.path().join(IO_SERIES), &samples);
        write_json(&dir.path().join(METRICS_SERIES), &metrics);
        dir
    }

    fn write_json<T: Serialize>(path: &Path, items: &[T]) {
        let lines: Vec<String> = items
            .iter()
            .map(|i| serde_json::to_string(i).unwrap())
            .collect();
        std::fs::write(path, lines.join("\n") + "\n").unwrap();
    }

    /// The database holds what the JSON files hold, and the report's
    /// figures from either are the same.
    #[test]
    fn a_report_from_the_database_equals_one_from_the_json_files() {
        let dir = run_directory();
        write(dir.path()).unwrap();
        assert!(!dir.path().join(format!("{RESULTS}.partial")).exists());
        let from_json = load_json(dir.path()).unwrap();
        let from_database = read(dir.path()).unwrap();
        assert_eq!(from_database, from_json);
        assert_eq!(from_database.records.len(), 6);
        assert_eq!(from_database.metrics.len(), 2);
        let summary = summary_of(&from_database);
        assert_eq!(summary, summary_of(&from_json));
        assert_eq!(summary.operations[1].errors, 1);
        assert!(summary.interrupted);
        // `load` prefers the database: emptied JSON files change nothing.
        std::fs::write(dir.path().join(RECORDS), "").unwrap();
        assert_eq!(
            summary_of(&crate::report::load(dir.path()).unwrap()),
            summary
        );
    }

    fn assert_refused(dir: &Path, expected: &str) {
        let message = read(dir).unwrap_err().to_string();
        assert!(message.contains(RESULTS), "{message}");
        assert!(message.contains("--from-json"), "{message}");
        assert!(message.contains(expected), "{expected}: {message}");
        // The JSON files still serve.
        assert_eq!(load_json(dir).unwrap().records.len(), 6);
    }

    /// Garbage, a truncated file, another schema version and a row that is
    /// not a record: each a clear error naming the file and the JSON
    /// fallback, never a panic.
    #[test]
    fn a_damaged_database_is_refused_with_the_json_fallback() {
        let dir = run_directory();
        let path = dir.path().join(RESULTS);
        std::fs::write(&path, vec![0x5a; 8192]).unwrap();
        assert_refused(dir.path(), "not a results database");
        write(dir.path()).unwrap();
        let whole = std::fs::read(&path).unwrap();
        std::fs::write(&path, &whole[..whole.len() / 3]).unwrap();
        assert_refused(dir.path(), "not a results database");
        let data = load_json(dir.path()).unwrap();
        write_data(&path, &data).unwrap();
        {
            let database = Database::open(&path).unwrap();
            let transaction = database.begin_write().unwrap();
            transaction
                .open_table(RECORD_ROWS)
                .unwrap()
                .insert(2, "{\"operation\": 7}")
                .unwrap();
            transaction.commit().unwrap();
        }
        assert_refused(dir.path(), "table records, row 2");
        write_data(&path, &data).unwrap();
        {
            let database = Database::open(&path).unwrap();
            let transaction = database.begin_write().unwrap();
            transaction
                .open_table(META)
                .unwrap()
                .insert("schema_version", 99)
                .unwrap();
            transaction.commit().unwrap();
        }
        assert_refused(dir.path(), "schema version Some(99)");
    }
}

//! Summaries of a run directory (latency percentiles per operation,
//! operations per minute, I/O per workload with its zero-operation
//! seconds) and comparisons of two runs, metric by metric.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::record::{read_lines, IoSample, Record, RunInfo, Status, IO_SERIES, RECORDS};

/// One operation's figures: latencies (end − start) of those that
/// succeeded, in milliseconds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OperationSummary {
    /// The spec's name for it (or setup, cleanup).
    pub operation: String,
    /// Its action.
    pub action: String,
    /// Records of it.
    pub count: u64,
    /// Those that succeeded.
    pub ok: u64,
    /// Those that failed.
    pub errors: u64,
    /// Arrivals dropped at `max_in_flight`.
    pub dropped: u64,
    /// Arrivals that found nothing to act on.
    pub skipped: u64,
    /// Median latency.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Longest.
    pub max_ms: f64,
    /// Successful operations per minute of the run's duration.
    pub per_minute: f64,
    /// Median time from the start to each stage, in milliseconds.
    pub stage_p50_ms: BTreeMap<String, f64>,
}

/// One workload's I/O over the run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct WorkloadSummary {
    /// The workload's name.
    pub workload: String,
    /// Instances with samples.
    pub instances: u64,
    /// Seconds sampled, summed over instances.
    pub instance_seconds: u64,
    /// Mean operations (reads and writes) per second, all instances together.
    pub mean_iops: f64,
    /// The lowest one-second total of all instances together.
    pub min_iops: f64,
    /// Mean KiB per second read and written, all instances together.
    pub mean_kib_per_s: f64,
    /// Seconds in which an instance completed no I/O, summed over instances.
    pub zero_seconds: u64,
}

/// A run's summary.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// The run id.
    pub run_id: String,
    /// The provider.
    pub provider: String,
    /// The seed.
    pub seed: u64,
    /// The spec's duration, in seconds.
    pub duration: f64,
    /// Whether the run was stopped early.
    pub interrupted: bool,
    /// Records in the run.
    pub records: u64,
    /// Per operation, in the order they first appear.
    pub operations: Vec<OperationSummary>,
    /// Per workload.
    pub workloads: Vec<WorkloadSummary>,
}

/// The `p` quantile (0 to 1) of sorted values, by nearest rank.
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

/// What a run directory holds: its identity, its records and its I/O
/// series.
pub struct RunData {
    /// `run.json`.
    pub info: RunInfo,
    /// `records.jsonl`.
    pub records: Vec<Record>,
    /// `io.jsonl` (empty when the run had no workload).
    pub samples: Vec<IoSample>,
}

/// Reads a run directory.
pub fn load(dir: &Path) -> Result<RunData> {
    let info = RunInfo::load(dir)?;
    let records: Vec<Record> = read_lines(&dir.join(RECORDS))?;
    let io_path = dir.join(IO_SERIES);
    let samples: Vec<IoSample> = if io_path.exists() {
        read_lines(&io_path)?
    } else {
        Vec::new()
    };
    Ok(RunData {
        info,
        records,
        samples,
    })
}

/// Reads a run directory and summarizes it.
pub fn summarize(dir: &Path) -> Result<Summary> {
    Ok(summary_of(&load(dir)?))
}

/// The summary of a run's data.
pub fn summary_of(data: &RunData) -> Summary {
    let info = &data.info;
    Summary {
        run_id: info.run_id.clone(),
        provider: info.provider.clone(),
        seed: info.seed,
        duration: info.duration,
        interrupted: info.interrupted,
        records: data.records.len() as u64,
        operations: operations(&data.records, info.duration),
        workloads: workloads(&data.samples),
    }
}

/// The latencies (end − start, in milliseconds) of `records` that
/// succeeded, sorted.
pub fn latencies<'a>(records: impl Iterator<Item = &'a Record>) -> Vec<f64> {
    sorted(
        records
            .filter(|r| r.status == Status::Ok)
            .map(|r| (r.end - r.start) * 1000.0)
            .collect(),
    )
}

fn operations(records: &[Record], duration: f64) -> Vec<OperationSummary> {
    let mut order: Vec<(String, String)> = Vec::new();
    let mut groups: BTreeMap<(String, String), Vec<&Record>> = BTreeMap::new();
    for record in records {
        let key = (record.operation.clone(), record.action.clone());
        if !groups.contains_key(&key) {
            order.push(key.clone());
        }
        groups.entry(key).or_default().push(record);
    }
    order
        .into_iter()
        .map(|key| {
            let list = &groups[&key];
            let count = |status| list.iter().filter(|r| r.status == status).count() as u64;
            let ok: Vec<&&Record> = list.iter().filter(|r| r.status == Status::Ok).collect();
            let latencies = latencies(list.iter().copied());
            let mut stages: BTreeMap<String, Vec<f64>> = BTreeMap::new();
            for record in &ok {
                for (stage, at) in &record.stages {
                    stages
                        .entry(stage.clone())
                        .or_default()
                        .push((at - record.start) * 1000.0);
                }
            }
            OperationSummary {
                operation: key.0,
                action: key.1,
                count: list.len() as u64,
                ok: ok.len() as u64,
                errors: count(Status::Error),
                dropped: count(Status::Dropped),
                skipped: count(Status::Skipped),
                p50_ms: quantile(&latencies, 0.5),
                p90_ms: quantile(&latencies, 0.9),
                p99_ms: quantile(&latencies, 0.99),
                p999_ms: quantile(&latencies, 0.999),
                max_ms: latencies.last().copied().unwrap_or(0.0),
                per_minute: if duration > 0.0 {
                    ok.len() as f64 * 60.0 / duration
                } else {
                    0.0
                },
                stage_p50_ms: stages
                    .into_iter()
                    .map(|(stage, values)| (stage, quantile(&sorted(values), 0.5)))
                    .collect(),
            }
        })
        .collect()
}

fn workloads(samples: &[IoSample]) -> Vec<WorkloadSummary> {
    let mut by_workload: BTreeMap<&str, Vec<&IoSample>> = BTreeMap::new();
    for sample in samples {
        by_workload
            .entry(&sample.workload)
            .or_default()
            .push(sample);
    }
    by_workload
        .into_iter()
        .map(|(workload, list)| {
            let mut per_second: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
            let mut instances = std::collections::BTreeSet::new();
            for sample in &list {
                instances.insert(sample.instance);
                let entry = per_second.entry(sample.second).or_default();
                entry.0 += sample.operations();
                entry.1 += sample.read_kib + sample.write_kib;
            }
            let seconds = per_second.len().max(1) as f64;
            WorkloadSummary {
                workload: workload.to_string(),
                instances: instances.len() as u64,
                instance_seconds: list.len() as u64,
                mean_iops: per_second.values().map(|v| v.0).sum::<f64>() / seconds,
                min_iops: per_second
                    .values()
                    .map(|v| v.0)
                    .reduce(f64::min)
                    .unwrap_or(0.0),
                mean_kib_per_s: per_second.values().map(|v| v.1).sum::<f64>() / seconds,
                zero_seconds: list.iter().filter(|s| s.operations() == 0.0).count() as u64,
            }
        })
        .collect()
}

/// One metric of two runs side by side.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Comparison {
    /// `OPERATION.METRIC` or `WORKLOAD.METRIC`.
    pub metric: String,
    /// The first run's value.
    pub a: f64,
    /// The second run's value.
    pub b: f64,
    /// b / a (none when a is 0).
    pub ratio: Option<f64>,
}

/// Every metric the two runs share, with its ratio (second over first).
pub fn compare(a: &Summary, b: &Summary) -> Vec<Comparison> {
    let mut rows = Vec::new();
    let mut push = |metric: String, x: f64, y: f64| {
        rows.push(Comparison {
            metric,
            a: x,
            b: y,
            ratio: (x != 0.0).then(|| y / x),
        })
    };
    for op in &a.operations {
        let Some(other) = b
            .operations
            .iter()
            .find(|o| o.operation == op.operation && o.action == op.action)
        else {
            continue;
        };
        let name = format!("{}.{}", op.operation, op.action);
        push(format!("{name}.ok"), op.ok as f64, other.ok as f64);
        push(
            format!("{name}.errors"),
            op.errors as f64,
            other.errors as f64,
        );
        push(format!("{name}.p50_ms"), op.p50_ms, other.p50_ms);
        push(format!("{name}.p99_ms"), op.p99_ms, other.p99_ms);
        push(format!("{name}.max_ms"), op.max_ms, other.max_ms);
        push(
            format!("{name}.per_minute"),
            op.per_minute,
            other.per_minute,
        );
    }
    for workload in &a.workloads {
        let Some(other) = b.workloads.iter().find(|w| w.workload == workload.workload) else {
            continue;
        };
        let name = &workload.workload;
        push(
            format!("{name}.mean_iops"),
            workload.mean_iops,
            other.mean_iops,
        );
        push(
            format!("{name}.min_iops"),
            workload.min_iops,
            other.min_iops,
        );
        push(
            format!("{name}.mean_kib_per_s"),
            workload.mean_kib_per_s,
            other.mean_kib_per_s,
        );
        push(
            format!("{name}.zero_seconds"),
            workload.zero_seconds as f64,
            other.zero_seconds as f64,
        );
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let values: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(quantile(&values, 0.5), 500.0);
        assert_eq!(quantile(&values, 0.99), 990.0);
        assert_eq!(quantile(&values, 0.999), 999.0);
        assert_eq!(quantile(&[7.0], 0.999), 7.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}

//! Summaries of a run directory (latency percentiles per operation,
//! operations per minute, I/O per workload with its zero-operation
//! seconds) and comparisons of two runs, metric by metric.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::metrics::MetricSummary;
use crate::record::{IoSample, Record, Status};
pub use crate::results::{load_json, RunData};
use crate::spec::{matches, Threshold, OPERATION_METRICS, WORKLOAD_METRICS};

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
    /// Per series of the provider's metrics scraped during the run.
    #[serde(default)]
    pub metrics: Vec<MetricSummary>,
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

/// Reads a run directory: from its results database (`results.redb`)
/// when it has one, else from its JSON files (run directories of older
/// versions, or of a run killed before the end).
pub fn load(dir: &Path) -> Result<RunData> {
    if dir.join(crate::results::RESULTS).exists() {
        crate::results::read(dir)
    } else {
        load_json(dir)
    }
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
        metrics: crate::metrics::summarize(&data.metrics),
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

/// An operation's value of one of [`OPERATION_METRICS`].
fn operation_metric(op: &OperationSummary, metric: &str) -> Option<f64> {
    Some(match metric {
        "ok" => op.ok as f64,
        "errors" => op.errors as f64,
        "p50_ms" => op.p50_ms,
        "p99_ms" => op.p99_ms,
        "max_ms" => op.max_ms,
        "per_minute" => op.per_minute,
        _ => return None,
    })
}

/// A workload's value of one of [`WORKLOAD_METRICS`].
fn workload_metric(workload: &WorkloadSummary, metric: &str) -> Option<f64> {
    Some(match metric {
        "mean_iops" => workload.mean_iops,
        "min_iops" => workload.min_iops,
        "mean_kib_per_s" => workload.mean_kib_per_s,
        "zero_seconds" => workload.zero_seconds as f64,
        _ => return None,
    })
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
        for metric in OPERATION_METRICS {
            if let Some((x, y)) = operation_metric(op, metric).zip(operation_metric(other, metric))
            {
                push(format!("{}.{}.{metric}", op.operation, op.action), x, y);
            }
        }
    }
    for workload in &a.workloads {
        let Some(other) = b.workloads.iter().find(|w| w.workload == workload.workload) else {
            continue;
        };
        for metric in WORKLOAD_METRICS {
            if let Some((x, y)) =
                workload_metric(workload, metric).zip(workload_metric(other, metric))
            {
                push(format!("{}.{metric}", workload.workload), x, y);
            }
        }
    }
    rows
}

/// One threshold applied to one metric (or to none, when nothing matched).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Verdict {
    /// The threshold's metric pattern.
    pub threshold: String,
    /// Its bounds as written, such as `max_ratio 1.05`.
    pub bounds: String,
    /// The metric it was applied to (none when no metric matched).
    pub metric: Option<String>,
    /// The first run's value.
    pub a: Option<f64>,
    /// The second run's value.
    pub b: Option<f64>,
    /// Whether every bound held.
    pub pass: bool,
    /// Why it failed (empty when it passed).
    pub reason: String,
}

/// B / A for ratio bounds: 1 when both are 0 (nothing changed), infinite
/// when only A is 0 (anything over nothing is unbounded growth).
fn bound_ratio(a: f64, b: f64) -> f64 {
    match (a == 0.0, b == 0.0) {
        (true, true) => 1.0,
        (true, false) => f64::INFINITY,
        _ => b / a,
    }
}

/// What is wrong with a metric under a threshold (empty when it holds).
fn violations(threshold: &Threshold, a: f64, b: f64) -> Vec<String> {
    let ratio = bound_ratio(a, b);
    let shown_ratio = format!("B / A = {ratio:.3}");
    let shown_b = format!("B = {b}");
    let rules = [
        (ratio, &shown_ratio, threshold.min_ratio, "below min_ratio"),
        (ratio, &shown_ratio, threshold.max_ratio, "above max_ratio"),
        (b, &shown_b, threshold.min, "below min"),
        (b, &shown_b, threshold.max, "above max"),
    ];
    rules
        .into_iter()
        .filter_map(|(value, shown, bound, broken)| {
            let bound = bound?;
            let below = broken.starts_with("below");
            let outside = if below { value < bound } else { value > bound };
            outside.then(|| format!("{shown} is {broken} {bound}"))
        })
        .collect()
}

/// Applies each threshold to every compared metric its pattern matches;
/// a threshold that matches none fails (a rule that checks nothing must
/// not pass silently).
pub fn judge(rows: &[Comparison], thresholds: &[Threshold]) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for threshold in thresholds {
        let matched: Vec<&Comparison> = rows
            .iter()
            .filter(|row| matches(&threshold.pattern, &row.metric))
            .collect();
        if matched.is_empty() {
            verdicts.push(Verdict {
                threshold: threshold.pattern.clone(),
                bounds: threshold.bounds(),
                metric: None,
                a: None,
                b: None,
                pass: false,
                reason: "no metric of both runs matches it".into(),
            });
        }
        for row in matched {
            let wrong = violations(threshold, row.a, row.b);
            verdicts.push(Verdict {
                threshold: threshold.pattern.clone(),
                bounds: threshold.bounds(),
                metric: Some(row.metric.clone()),
                a: Some(row.a),
                b: Some(row.b),
                pass: wrong.is_empty(),
                reason: wrong.join("; "),
            });
        }
    }
    verdicts
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

    fn row(metric: &str, a: f64, b: f64) -> Comparison {
        Comparison {
            metric: metric.into(),
            a,
            b,
            ratio: (a != 0.0).then(|| b / a),
        }
    }

    fn threshold(pattern: &str) -> Threshold {
        Threshold {
            pattern: pattern.into(),
            min_ratio: None,
            max_ratio: None,
            min: None,
            max: None,
        }
    }

    /// Ratio and absolute bounds pass and fail on the right side of their
    /// value; a pattern covers every metric it matches; a threshold that
    /// matches nothing fails.
    #[test]
    fn thresholds_judge_ratios_and_bounds() {
        let rows = [
            row("snaps.snapshot.p99_ms", 10.0, 10.5),
            row("snaps.snapshot.errors", 0.0, 0.0),
            row("clones.clone.errors", 0.0, 2.0),
            row("writer.mean_iops", 1000.0, 970.0),
            row("writer.zero_seconds", 0.0, 0.0),
        ];
        let cases = [
            (
                Threshold {
                    max_ratio: Some(1.05),
                    ..threshold("snaps.snapshot.p99_ms")
                },
                vec![true],
            ),
            (
                Threshold {
                    max_ratio: Some(1.04),
                    ..threshold("snaps.snapshot.p99_ms")
                },
                vec![false],
            ),
            (
                Threshold {
                    min_ratio: Some(0.97),
                    ..threshold("writer.mean_iops")
                },
                vec![true],
            ),
            (
                Threshold {
                    min_ratio: Some(0.98),
                    ..threshold("writer.mean_iops")
                },
                vec![false],
            ),
            (
                Threshold {
                    max: Some(0.0),
                    ..threshold("writer.zero_seconds")
                },
                vec![true],
            ),
            (
                Threshold {
                    max: Some(0.0),
                    ..threshold("*.errors")
                },
                vec![true, false],
            ),
            (
                Threshold {
                    max_ratio: Some(1.0),
                    ..threshold("*.errors")
                },
                vec![true, false],
            ),
            (
                Threshold {
                    min: Some(980.0),
                    ..threshold("writer.mean_iops")
                },
                vec![false],
            ),
            (
                Threshold {
                    min: Some(1.0),
                    ..threshold("nothing.*")
                },
                vec![false],
            ),
        ];
        for (threshold, expected) in cases {
            let verdicts = judge(&rows, std::slice::from_ref(&threshold));
            let passes: Vec<bool> = verdicts.iter().map(|v| v.pass).collect();
            assert_eq!(passes, expected, "{threshold:?}: {verdicts:?}");
            for verdict in verdicts.iter().filter(|v| !v.pass) {
                assert!(!verdict.reason.is_empty(), "{verdict:?}");
            }
        }
    }
}

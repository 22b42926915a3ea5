//! Pass/fail thresholds for `strata bench compare A B`: a metric name
//! pattern and bounds on B / A or on B itself. They are checked against the
//! spec's operations and workloads when the spec is read, so that a
//! threshold that could never match anything is refused with its line.

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::{refused, ControlOperation, SpecError, Workload};

/// Metrics `compare` gives per operation (`OPERATION.ACTION.METRIC`).
pub const OPERATION_METRICS: &[&str] =
    &["ok", "errors", "p50_ms", "p99_ms", "max_ms", "per_minute"];

/// Metrics `compare` gives per workload (`WORKLOAD.METRIC`).
pub const WORKLOAD_METRICS: &[&str] = &["mean_iops", "min_iops", "mean_kib_per_s", "zero_seconds"];

/// Operations the run records besides the spec's control operations.
const RUN_OPERATIONS: &[&str] = &["setup", "cleanup"];

/// A pass/fail rule on the metrics that `pattern` matches.
#[derive(Clone, Debug, PartialEq)]
pub struct Threshold {
    /// A metric name where `*` stands for any characters, such as
    /// `snapshots.snapshot.p99_ms` or `*.errors`.
    pub pattern: String,
    /// B / A must be at least this.
    pub min_ratio: Option<f64>,
    /// B / A must be at most this.
    pub max_ratio: Option<f64>,
    /// B must be at least this.
    pub min: Option<f64>,
    /// B must be at most this.
    pub max: Option<f64>,
}

impl Threshold {
    /// The bounds as written, such as `max_ratio 1.05, max 0`.
    pub fn bounds(&self) -> String {
        let stated = [
            ("min_ratio", self.min_ratio),
            ("max_ratio", self.max_ratio),
            ("min", self.min),
            ("max", self.max),
        ];
        stated
            .iter()
            .filter_map(|(name, value)| value.map(|v| format!("{name} {v}")))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A threshold as written in the YAML.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawThreshold {
    metric: Spanned<String>,
    min_ratio: Option<f64>,
    max_ratio: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
}

/// Whether `name` matches `pattern`, where `*` matches any characters
/// (dots too) and everything else matches itself.
pub fn matches(pattern: &str, name: &str) -> bool {
    let Some((first, rest)) = pattern.split_once('*') else {
        return pattern == name;
    };
    let Some(mut tail) = name.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = rest.split('*').collect();
    let (last, middle) = pieces.split_last().unwrap_or((&"", &[]));
    for piece in middle {
        match tail.find(piece) {
            Some(at) => tail = &tail[at + piece.len()..],
            None => return false,
        }
    }
    tail.len() >= last.len() && tail.ends_with(last)
}

/// Checks every threshold: a known metric, a subject that names one of
/// the spec's operations or workloads, and bounds that can hold.
pub(super) fn check_thresholds(
    raw: &[RawThreshold],
    operations: &[ControlOperation],
    workloads: &[Workload],
) -> Result<Vec<Threshold>, SpecError> {
    raw.iter()
        .map(|threshold| check_threshold(threshold, operations, workloads))
        .collect()
}

fn check_threshold(
    raw: &RawThreshold,
    operations: &[ControlOperation],
    workloads: &[Workload],
) -> Result<Threshold, SpecError> {
    let at = &raw.metric;
    let pattern = at.value.trim();
    let Some((subject, metric)) = pattern.rsplit_once('.') else {
        return refused(at, format!(
            "threshold `{pattern}`: write a metric as OPERATION.ACTION.METRIC or WORKLOAD.METRIC (`*` matches anything), such as `snapshots.snapshot.p99_ms` or `writer.mean_iops`"
        ));
    };
    let known = OPERATION_METRICS.contains(&metric) || WORKLOAD_METRICS.contains(&metric);
    if !metric.contains('*') && !known {
        return refused(at, format!(
            "threshold `{pattern}`: no metric `{metric}`: write one of {} (operations) or {} (workloads)",
            OPERATION_METRICS.join(", "),
            WORKLOAD_METRICS.join(", ")
        ));
    }
    let mut names: Vec<String> = Vec::new();
    for op in operations {
        let subject = format!("{}.{}", op.name, action_label(op));
        names.extend(OPERATION_METRICS.iter().map(|m| format!("{subject}.{m}")));
    }
    for workload in workloads {
        names.extend(
            WORKLOAD_METRICS
                .iter()
                .map(|m| format!("{}.{m}", workload.name)),
        );
    }
    // Setup and cleanup records' actions depend on the run (create, fill,
    // detach...), so only their metric is checked.
    let run_operation = RUN_OPERATIONS
        .iter()
        .any(|run| subject.starts_with(&format!("{run}.")))
        && (metric.contains('*') || OPERATION_METRICS.contains(&metric));
    if !run_operation && !names.iter().any(|name| matches(pattern, name)) {
        let mut subjects: Vec<String> = operations
            .iter()
            .map(|op| format!("{}.{}.METRIC", op.name, action_label(op)))
            .collect();
        subjects.extend(workloads.iter().map(|w| format!("{}.METRIC", w.name)));
        return refused(at, format!(
            "threshold `{pattern}` matches none of this spec's metrics: write one of {} (or setup.ACTION.METRIC, cleanup.ACTION.METRIC), with an operation's METRIC one of {} and a workload's one of {}",
            super::one_of(&subjects),
            OPERATION_METRICS.join(", "),
            WORKLOAD_METRICS.join(", ")
        ));
    }
    check_bounds(raw, pattern)
}

/// The action's name as records and `compare` spell it.
fn action_label(op: &ControlOperation) -> String {
    serde_json::to_value(op.action)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn check_bounds(raw: &RawThreshold, pattern: &str) -> Result<Threshold, SpecError> {
    let at = &raw.metric;
    let stated = [raw.min_ratio, raw.max_ratio, raw.min, raw.max];
    if stated.iter().all(Option::is_none) {
        return refused(at, format!(
            "threshold `{pattern}`: give a bound: `max_ratio: 1.05` or `min_ratio: 0.98` (B / A), `max: 0` or `min: 100` (B)"
        ));
    }
    if stated.iter().flatten().any(|v| !v.is_finite()) {
        return refused(
            at,
            format!("threshold `{pattern}`: bounds must be finite numbers"),
        );
    }
    if [raw.min_ratio, raw.max_ratio]
        .iter()
        .flatten()
        .any(|r| *r < 0.0)
    {
        return refused(at, format!("threshold `{pattern}`: a ratio bound is B / A of non-negative metrics: write 0 or more"));
    }
    let crossed = |low: Option<f64>, high: Option<f64>| low.zip(high).is_some_and(|(l, h)| l > h);
    if crossed(raw.min_ratio, raw.max_ratio) || crossed(raw.min, raw.max) {
        return refused(at, format!("threshold `{pattern}`: the lower bound is above the upper one: no value could pass"));
    }
    Ok(Threshold {
        pattern: pattern.to_string(),
        min_ratio: raw.min_ratio,
        max_ratio: raw.max_ratio,
        min: raw.min,
        max: raw.max,
    })
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn patterns_match_with_stars() {
        assert!(matches("a.b.c", "a.b.c"));
        assert!(!matches("a.b.c", "a.b.cd"));
        assert!(matches("*.errors", "snaps.snapshot.errors"));
        assert!(!matches("*.errors", "snaps.snapshot.ok"));
        assert!(matches("snaps.*", "snaps.snapshot.p99_ms"));
        assert!(matches("*snap*p99*", "snaps.snapshot.p99_ms"));
        assert!(matches("*", ""));
        assert!(!matches("a*a", "a"));
        assert!(matches("a*a", "aa"));
        assert!(!matches("x*", "snaps"));
    }
}

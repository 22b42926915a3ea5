//! The provider's own metrics during a run: the Strata daemon's
//! Prometheus `/metrics` text, scraped at an interval and kept as
//! `metrics.jsonl` (one line per series and scrape), and summarized per
//! series for reports.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The metrics file in a run directory.
pub const METRICS_SERIES: &str = "metrics.jsonl";

/// Most lines one run writes to `metrics.jsonl` (some 100 bytes each):
/// past it scraping stops, and the run says so.
pub const MAX_METRIC_LINES: u64 = 1_000_000;

/// Largest `/metrics` reply read; a bigger one is cut there.
pub const MAX_SCRAPE_BYTES: u64 = 4 << 20;

/// Most labels one series may carry (more is not a daemon's text).
const MAX_LABELS: usize = 32;

/// One value of one series at one scrape.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MetricSample {
    /// Seconds since the run's start.
    pub time: f64,
    /// The metric's name, such as `strata_volume_ops_total`.
    pub metric: String,
    /// Its labels, such as `{volume: "cns…-data-0", op: "write"}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// Reads Prometheus' text format: one sample per line
/// `name{label="value",...} value [timestamp]`; comments, histogram
/// buckets (`_bucket`: dozens per histogram, their `_sum` and `_count`
/// are kept), non-finite values and lines that do not parse are left out.
pub fn parse_exposition(text: &str, time: f64) -> Vec<MetricSample> {
    text.lines()
        .filter_map(|line| parse_line(line.trim(), time))
        .filter(|sample| !sample.metric.ends_with("_bucket"))
        .collect()
}

fn parse_line(line: &str, time: f64) -> Option<MetricSample> {
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let metric = &line[..name_end];
    let valid_name = metric
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    if metric.is_empty() || !valid_name {
        return None;
    }
    let (labels, rest) = match line[name_end..].strip_prefix('{') {
        Some(inside) => parse_labels(inside)?,
        None => (BTreeMap::new(), &line[name_end..]),
    };
    let value: f64 = rest.split_whitespace().next()?.parse().ok()?;
    value.is_finite().then(|| MetricSample {
        time,
        metric: metric.to_string(),
        labels,
        value,
    })
}

/// Labels up to the closing `}`, and what follows it.
fn parse_labels(mut text: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        text = text.trim_start_matches([',', ' ']);
        if let Some(rest) = text.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (key, after) = text.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (at, '"') => break at,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        if labels.len() == MAX_LABELS {
            return None;
        }
        labels.insert(key.trim().to_string(), value);
        text = &after[end + 1..];
    }
}

/// One series over a run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MetricSummary {
    /// The series: its name and labels as Prometheus writes them.
    pub series: String,
    /// Scrapes that had it.
    pub samples: u64,
    /// Its first value.
    pub first: f64,
    /// Its last value.
    pub last: f64,
    /// Its lowest value.
    pub min: f64,
    /// Its highest value.
    pub max: f64,
}

/// A series' name as Prometheus writes it: `name{a="x",b="y"}`.
pub fn series_name(sample: &MetricSample) -> String {
    if sample.labels.is_empty() {
        return sample.metric.clone();
    }
    let labels: Vec<String> = sample
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect();
    format!("{}{{{}}}", sample.metric, labels.join(","))
}

/// Per series, in name order: its count, first, last, lowest and highest.
pub fn summarize(samples: &[MetricSample]) -> Vec<MetricSummary> {
    let mut by_series: BTreeMap<String, MetricSummary> = BTreeMap::new();
    for sample in samples {
        let entry = by_series
            .entry(series_name(sample))
            .or_insert_with_key(|series| MetricSummary {
                series: series.clone(),
                samples: 0,
                first: sample.value,
                last: sample.value,
                min: sample.value,
                max: sample.value,
            });
        entry.samples += 1;
        entry.last = sample.value;
        entry.min = entry.min.min(sample.value);
        entry.max = entry.max.max(sample.value);
    }
    by_series.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_parses_and_buckets_are_left_out() {
        let text =
            "# HELP strata_volumes Volumes.\n# TYPE strata_volumes gauge\nstrata_volumes 2\n\
            strata_volume_ops_total{volume=\"a\",op=\"write\"} 17\n\
            strata_lat_bucket{volume=\"a\",le=\"0.1\"} 3\n\
            strata_lat_sum{volume=\"a\"} 0.25 1700000000\n\
            odd{name=\"x\\\"y,z}\"} 1\n\
            bad line\nstrata_nan NaN\nbroken{volume=\"a\" 1\n";
        let samples = parse_exposition(text, 1.5);
        let names: Vec<String> = samples.iter().map(series_name).collect();
        assert_eq!(
            names,
            [
                "strata_volumes",
                "strata_volume_ops_total{op=\"write\",volume=\"a\"}",
                "strata_lat_sum{volume=\"a\"}",
                "odd{name=\"x\\\"y,z}\"}",
            ]
        );
        assert_eq!(samples[1].value, 17.0);
        assert_eq!(samples[2].value, 0.25);
        assert!(samples.iter().all(|s| s.time == 1.5));
        let later = parse_exposition("strata_volumes 5\nstrata_volumes_x 1\n", 2.5);
        let all: Vec<MetricSample> = samples.into_iter().chain(later).collect();
        let summary = summarize(&all);
        let volumes = summary
            .iter()
            .find(|s| s.series == "strata_volumes")
            .unwrap();
        assert_eq!(
            (volumes.samples, volumes.first, volumes.last, volumes.max),
            (2, 2.0, 5.0, 5.0)
        );
    }
}

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
    /// Its kind, from the exposition's `# TYPE` line for its family
    /// (absent in files of older runs, and for series with no such line:
    /// then the kind follows from the name, [`MetricKind::of`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<MetricKind>,
}

impl MetricSample {
    /// How the series is drawn: by its declared type, else by its name.
    pub fn kind(&self) -> MetricKind {
        self.kind.unwrap_or_else(|| MetricKind::of(&self.metric))
    }
}

/// Reads Prometheus' text format: one sample per line
/// `name{label="value",...} value [timestamp]`, each given the kind its
/// family's `# TYPE` line declares; other comments, histogram buckets
/// (`_bucket`: dozens per histogram, their `_sum` and `_count` are
/// kept), non-finite values and lines that do not parse are left out.
pub fn parse_exposition(text: &str, time: f64) -> Vec<MetricSample> {
    let mut declared: BTreeMap<&str, &str> = BTreeMap::new();
    let mut samples = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some((family, kind)) = type_line(line) {
            declared.insert(family, kind);
            continue;
        }
        let Some(mut sample) = parse_line(line, time) else {
            continue;
        };
        if sample.metric.ends_with("_bucket") {
            continue;
        }
        sample.kind = declared_kind(&declared, &sample.metric);
        samples.push(sample);
    }
    samples
}

/// `# TYPE family kind`: the family and its kind's word.
fn type_line(line: &str) -> Option<(&str, &str)> {
    let mut words = line.strip_prefix('#')?.split_whitespace();
    if words.next()? != "TYPE" {
        return None;
    }
    Some((words.next()?, words.next()?))
}

/// The kind a sample of `metric` has by its family's declaration: a
/// counter's samples count; a histogram's or summary's `_sum` and
/// `_count` grow like counters, its quantiles are values; `gauge` and
/// `untyped` are values. None when no family declares it.
fn declared_kind(declared: &BTreeMap<&str, &str>, metric: &str) -> Option<MetricKind> {
    if let Some(&kind) = declared.get(metric) {
        return Some(match kind {
            "counter" => MetricKind::Counter,
            _ => MetricKind::Gauge,
        });
    }
    let family = metric
        .strip_suffix("_sum")
        .or_else(|| metric.strip_suffix("_count"))?;
    match *declared.get(family)? {
        "histogram" | "summary" => Some(MetricKind::Counter),
        _ => None,
    }
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
        kind: None,
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

/// How a series is drawn: a counter only grows (but for a restart), so
/// its per-second rate is what moves with the load; a gauge is drawn as
/// it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricKind {
    /// A cumulative count, drawn as a rate per second.
    Counter,
    /// A value that goes up and down, drawn as is.
    Gauge,
}

impl MetricKind {
    /// The kind of `metric` by Prometheus' naming conventions, for
    /// series whose exposition declared no type: `_total` for counters
    /// and a histogram's or summary's `_sum` and `_count`.
    pub fn of(metric: &str) -> MetricKind {
        let cumulative = ["_total", "_sum", "_count"];
        if cumulative.iter().any(|suffix| metric.ends_with(suffix)) {
            MetricKind::Counter
        } else {
            MetricKind::Gauge
        }
    }
}

/// Per-second rates of a counter's `(time, value)` points, in time order:
/// one point per interval, at its middle. A drop is a restarted counter
/// (Prometheus' convention), so the interval's increase is the new
/// value; a missing scrape makes a longer interval, averaged over its
/// length; points with no time between them are skipped.
pub fn counter_rates(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    points
        .windows(2)
        .filter_map(|pair| {
            let ((t0, v0), (t1, v1)) = (pair[0], pair[1]);
            let elapsed = t1 - t0;
            if elapsed <= 0.0 {
                return None;
            }
            let increase = if v1 < v0 { v1 } else { v1 - v0 };
            Some(((t0 + t1) / 2.0, increase / elapsed))
        })
        .collect()
}

/// One series as a plot draws it.
#[derive(Clone, Debug, PartialEq)]
pub struct PlottedSeries {
    /// The series: its name and labels as Prometheus writes them.
    pub series: String,
    /// Whether `points` are rates (a counter) or values (a gauge).
    pub kind: MetricKind,
    /// `(seconds since the run's start, value or rate)`, in time order.
    pub points: Vec<(f64, f64)>,
    /// How much the drawn line moves: the sum of its steps over its
    /// largest magnitude (scale-free, so that bytes and counts compare).
    pub movement: f64,
}

/// The series a plot draws, and those it leaves out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlotSelection {
    /// The series drawn, the one that moved most first.
    pub drawn: Vec<PlottedSeries>,
    /// The other series that changed, by how much they moved, most first.
    pub left_out: Vec<String>,
    /// Series scraped in all.
    pub scraped: usize,
}

/// Of the series in `samples`, those whose value changed during the run
/// (as the report's table lists them), drawn as rates (counters) or
/// values (gauges); at most `limit` are drawn, counters whose rate
/// moves first, then those whose line moves most (ties in name order),
/// and the rest are named in `left_out`.
pub fn select_for_plot(samples: &[MetricSample], limit: usize) -> PlotSelection {
    let mut by_series: BTreeMap<String, (MetricKind, Points)> = BTreeMap::new();
    for sample in samples {
        by_series
            .entry(series_name(sample))
            .or_insert_with(|| (sample.kind(), Vec::new()))
            .1
            .push((sample.time, sample.value));
    }
    let scraped = by_series.len();
    let mut changed: Vec<PlottedSeries> = by_series
        .into_iter()
        .filter(|(_, (_, points))| points.iter().any(|p| p.1 != points[0].1))
        .map(|(series, (kind, mut points))| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            if kind == MetricKind::Counter {
                points = counter_rates(&points);
            }
            let movement = movement(&points);
            PlottedSeries {
                series,
                kind,
                points,
                movement,
            }
        })
        .collect();
    // Counters whose rate moves first: the dips a snapshot's pause makes
    // are in rates (operations, bytes), and a small gauge that steps once
    // would otherwise outrank them. Then by movement; stable, so equal
    // ones stay in name order.
    let moving_rate = |s: &PlottedSeries| s.kind == MetricKind::Counter && s.movement > 0.0;
    changed.sort_by(|a, b| {
        moving_rate(b)
            .cmp(&moving_rate(a))
            .then(b.movement.total_cmp(&a.movement))
    });
    let left_out = changed
        .split_off(limit.min(changed.len()))
        .into_iter()
        .map(|s| s.series)
        .collect();
    PlotSelection {
        drawn: changed,
        left_out,
        scraped,
    }
}

/// `(time, value)` points of one series.
type Points = Vec<(f64, f64)>;

/// The sum of a line's steps over its largest magnitude: 0 for a flat
/// line, 1 for a single step from 0, more for a line that goes up and
/// down.
fn movement(points: &[(f64, f64)]) -> f64 {
    let largest = points.iter().map(|p| p.1.abs()).fold(0.0, f64::max);
    if largest == 0.0 {
        return 0.0;
    }
    let steps: f64 = points.windows(2).map(|w| (w[1].1 - w[0].1).abs()).sum();
    steps / largest
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
    fn sample(time: f64, metric: &str, volume: &str, value: f64) -> MetricSample {
        MetricSample {
            time,
            metric: metric.into(),
            labels: [("volume".to_string(), volume.to_string())].into(),
            value,
            kind: None,
        }
    }

    #[test]
    fn declared_types_decide_the_kind_over_names() {
        let text = [
            "# TYPE strata_reads counter",
            "strata_reads 5",
            "# TYPE strata_queue_total gauge",
            "strata_queue_total 3",
            "# TYPE strata_pause_seconds histogram",
            "strata_pause_seconds_bucket{le=\"1\"} 2",
            "strata_pause_seconds_sum 0.5",
            "strata_pause_seconds_count 2",
            "# TYPE strata_latency summary",
            "strata_latency{quantile=\"0.5\"} 0.1",
            "strata_latency_count 9",
            "strata_other_total 1",
            "strata_level 4",
        ]
        .join("\n");
        let text = text.as_str();
        let kinds: Vec<(String, Option<MetricKind>, MetricKind)> = parse_exposition(text, 0.0)
            .iter()
            .map(|s| (s.metric.clone(), s.kind, s.kind()))
            .collect();
        use MetricKind::{Counter, Gauge};
        let expected = [
            ("strata_reads", Some(Counter), Counter),
            ("strata_queue_total", Some(Gauge), Gauge),
            ("strata_pause_seconds_sum", Some(Counter), Counter),
            ("strata_pause_seconds_count", Some(Counter), Counter),
            ("strata_latency", Some(Gauge), Gauge),
            ("strata_latency_count", Some(Counter), Counter),
            ("strata_other_total", None, Counter),
            ("strata_level", None, Gauge),
        ];
        let expected: Vec<(String, Option<MetricKind>, MetricKind)> = expected
            .iter()
            .map(|(m, k, d)| (m.to_string(), *k, *d))
            .collect();
        assert_eq!(kinds, expected);
        // The kind is kept in metrics.jsonl, and lines of older runs
        // (without it) still read.
        let line = serde_json::to_string(&parse_exposition(text, 0.0)[0]).unwrap();
        assert!(line.contains("\"kind\":\"counter\""), "{line}");
        let old: MetricSample =
            serde_json::from_str(r#"{"time":1.0,"metric":"strata_reads","value":2.0}"#).unwrap();
        assert_eq!((old.kind, old.kind()), (None, Gauge));
        // A declared counter without `_total` is drawn as a rate.
        let mut samples = parse_exposition("# TYPE strata_reads counter\nstrata_reads 0\n", 0.0);
        samples.extend(parse_exposition(
            "# TYPE strata_reads counter\nstrata_reads 10\n",
            2.0,
        ));
        samples.extend(parse_exposition(
            "# TYPE strata_reads counter\nstrata_reads 30\n",
            4.0,
        ));
        let selection = select_for_plot(&samples, 6);
        assert_eq!(selection.drawn[0].kind, Counter);
        assert_eq!(selection.drawn[0].points, vec![(1.0, 5.0), (3.0, 10.0)]);
    }

    #[test]
    fn counters_are_told_from_gauges_by_their_names() {
        assert_eq!(
            MetricKind::of("strata_volume_ops_total"),
            MetricKind::Counter
        );
        assert_eq!(
            MetricKind::of("strata_volume_snapshot_pause_seconds_sum"),
            MetricKind::Counter
        );
        assert_eq!(
            MetricKind::of("strata_volume_snapshot_pause_seconds_count"),
            MetricKind::Counter
        );
        assert_eq!(MetricKind::of("strata_volumes"), MetricKind::Gauge);
        assert_eq!(MetricKind::of("strata_totals"), MetricKind::Gauge);
    }

    #[test]
    fn a_counter_becomes_rates_across_a_reset_and_a_missing_scrape() {
        // 0 s: 0, 1 s: 100, 2 s: 300, restart, 3 s: 50, scrape at 4 s
        // missing, 5 s: 250; two scrapes at the same time.
        let points = [
            (0.0, 0.0),
            (1.0, 100.0),
            (2.0, 300.0),
            (3.0, 50.0),
            (5.0, 250.0),
            (5.0, 260.0),
        ];
        assert_eq!(
            counter_rates(&points),
            [(0.5, 100.0), (1.5, 200.0), (2.5, 50.0), (4.0, 100.0)]
        );
        assert!(counter_rates(&[(1.0, 5.0)]).is_empty());
        assert!(counter_rates(&[]).is_empty());
    }

    #[test]
    fn the_series_that_moved_most_are_drawn_and_the_rest_named() {
        let mut samples = Vec::new();
        for second in 0..6 {
            let t = second as f64;
            // Never changes: neither drawn nor left out.
            samples.push(sample(t, "strata_volumes", "all", 2.0));
            // A steady counter: changed, but its rate is flat.
            samples.push(sample(t, "strata_volume_ops_total", "steady", 10.0 * t));
            // A counter whose rate dips at 3 s: it moves most.
            let dipped = [0.0, 100.0, 200.0, 210.0, 310.0, 410.0][second];
            samples.push(sample(t, "strata_volume_ops_total", "dips", dipped));
            // A gauge that steps once.
            let chain = if second < 3 { 1.0 } else { 2.0 };
            samples.push(sample(t, "strata_volume_chain_length", "a", chain));
        }
        // A series missing from some scrapes is still drawn from the rest.
        samples.retain(|s| !(s.labels["volume"] == "a" && s.time == 4.0));
        let selection = select_for_plot(&samples, 2);
        assert_eq!(selection.scraped, 4);
        let drawn: Vec<&str> = selection.drawn.iter().map(|s| s.series.as_str()).collect();
        assert_eq!(
            drawn,
            [
                "strata_volume_ops_total{volume=\"dips\"}",
                "strata_volume_chain_length{volume=\"a\"}"
            ]
        );
        assert_eq!(
            selection.left_out,
            ["strata_volume_ops_total{volume=\"steady\"}"]
        );
        let dips = &selection.drawn[0];
        assert_eq!(dips.kind, MetricKind::Counter);
        assert_eq!(dips.points[2], (2.5, 10.0), "the dip, as a rate");
        let chain = &selection.drawn[1];
        assert_eq!(chain.kind, MetricKind::Gauge);
        assert_eq!(chain.points.len(), 5);
        assert_eq!(chain.points[4], (5.0, 2.0), "values, not rates");
        let all = select_for_plot(&samples, 10);
        assert_eq!(all.drawn.len(), 3, "the flat series is not drawn");
        assert_eq!(all.drawn[2].movement, 0.0);
        assert!(select_for_plot(&[], 6).drawn.is_empty());
    }

    #[test]
    fn a_rate_that_moves_outranks_a_gauge_that_moves_more() {
        let mut samples = Vec::new();
        for second in 0..6 {
            let t = second as f64;
            // A gauge flapping between 0 and 1: movement 5.
            samples.push(sample(
                t,
                "strata_volume_cache_hit_ratio",
                "a",
                (second % 2) as f64,
            ));
            // A throughput counter whose rate dips once: movement 1.8.
            let ops = [0.0, 100.0, 200.0, 210.0, 310.0, 410.0][second];
            samples.push(sample(t, "strata_volume_ops_total", "a", ops));
        }
        let selection = select_for_plot(&samples, 1);
        assert_eq!(
            selection.drawn[0].series,
            "strata_volume_ops_total{volume=\"a\"}"
        );
        assert_eq!(
            selection.left_out,
            ["strata_volume_cache_hit_ratio{volume=\"a\"}"]
        );
    }
}

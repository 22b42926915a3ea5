//! The HTML report of a run: one self-contained page (no JavaScript,
//! plots as inline SVG made with plotters) with the run's identity, its
//! summary tables, the workloads' I/O over time with every control
//! operation marked where it started, the provider's metrics that moved
//! on the same time axis below it, and each operation's latency CDF.

use std::collections::BTreeMap;
use std::fmt::Write;

use plotters::chart::SeriesAnno;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Error, Result};
use crate::metrics::{select_for_plot, MetricKind, PlotSelection, PlottedSeries};
use crate::record::Record;
use crate::report::{latencies, summary_of, RunData, Summary};

/// The size of each plot, in pixels.
const PLOT_SIZE: (u32, u32) = (960, 380);

/// The height of each metric's chart under the I/O plot, in pixels.
const METRIC_CHART_HEIGHT: u32 = 170;

/// Most metric series drawn: a daemon has hundreds, and more small charts
/// than fit on a screen below the I/O plot would no longer be read
/// against it.
const DRAWN_SERIES: usize = 6;

/// Most names of series left out of the metrics plot that its caption
/// gives (the table lists every one that moved).
const NAMED_LEFT_OUT: usize = 12;

/// The plot's margin, and the width of its time and value labels: the
/// same for the I/O plot and the metrics' charts, so that their time
/// axes line up.
const MARGIN: u32 = 12;
const X_LABELS: u32 = 40;
const Y_LABELS: u32 = 70;

/// Renders the report page of `data`.
pub fn render(data: &RunData) -> Result<String> {
    let summary = summary_of(data);
    let io = plot(|area| io_over_time(area, data)).map_err(plot_error("I/O over time"))?;
    let metrics = metrics_figure(data)?;
    let cdf = plot(|area| latency_cdf(area, data)).map_err(plot_error("latency CDFs"))?;
    let mut page = String::new();
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>strata bench: run {id}</title>\n<style>{STYLE}</style></head><body>\n\
         <h1>strata bench: run {id}</h1>\n<p>provider <b>{provider}</b>, seed {seed}, \
         {duration:.0} s{interrupted}, {records} records</p>\n",
        id = escape(&summary.run_id),
        provider = escape(&summary.provider),
        seed = summary.seed,
        duration = summary.duration,
        interrupted = if summary.interrupted {
            " (stopped early)"
        } else {
            ""
        },
        records = summary.records,
    );
    operations_table(&mut page, &summary);
    workloads_table(&mut page, &summary);
    let _ = write!(
        page,
        "<figure id=\"io-over-time\"><figcaption>I/O over time: each workload's \
         operations per second (all its instances), with each control operation \
         marked at its start</figcaption>\n{io}</figure>\n{metrics}\
         <figure id=\"latency-cdf\"><figcaption>Latency CDF of each operation \
         (those that succeeded)</figcaption>\n{cdf}</figure>\n"
    );
    // After the plots: a daemon has hundreds of series.
    metrics_table(&mut page, &summary);
    page.push_str("</body></html>\n");
    Ok(page)
}

/// The pages' style sheet.
pub(crate) const STYLE: &str = "body{font-family:sans-serif;margin:2em;color:#222}\
    table{border-collapse:collapse;margin:1em 0}\
    td,th{border:1px solid #bbb;padding:.25em .6em;text-align:right}\
    th{background:#eee}td:first-child,th:first-child{text-align:left}\
    figure{margin:2em 0}figcaption{font-weight:bold;margin-bottom:.5em}\
    figcaption small{font-weight:normal}";

fn plot_error(what: &'static str) -> impl Fn(String) -> Error {
    move |message| Error::Report(format!("cannot draw the {what}: {message}"))
}

/// Draws with `draw` on an SVG area of [`PLOT_SIZE`]; returns the SVG.
pub(crate) fn plot<F>(draw: F) -> std::result::Result<String, String>
where
    F: FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> std::result::Result<(), String>,
{
    plot_sized(PLOT_SIZE, draw)
}

/// Draws with `draw` on an SVG area of `size`; returns the SVG.
fn plot_sized<F>(size: (u32, u32), draw: F) -> std::result::Result<String, String>
where
    F: FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> std::result::Result<(), String>,
{
    let mut svg = String::new();
    {
        let area = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        area.fill(&WHITE).map_err(|e| e.to_string())?;
        draw(&area)?;
        area.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// A color per series, the same for a name wherever it is drawn.
pub(crate) fn color(index: usize) -> RGBColor {
    const COLORS: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(23, 190, 207),
    ];
    COLORS[index % COLORS.len()]
}

fn io_over_time(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    data: &RunData,
) -> std::result::Result<(), String> {
    let mut series: BTreeMap<&str, BTreeMap<u64, f64>> = BTreeMap::new();
    for sample in &data.samples {
        *series
            .entry(&sample.workload)
            .or_default()
            .entry(sample.second)
            .or_default() += sample.operations();
    }
    let x_max = time_axis(data);
    let y_max = series
        .values()
        .flat_map(|points| points.values().copied())
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.1;
    if !x_max.is_finite() || !y_max.is_finite() {
        return Err(format!(
            "axes of {x_max} s and {y_max} operations per second cannot be drawn"
        ));
    }
    let mut chart = ChartBuilder::on(area)
        .margin(MARGIN)
        .x_label_area_size(X_LABELS)
        .y_label_area_size(Y_LABELS)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("seconds since the run's start")
        .y_desc("operations per second")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(|e| e.to_string())?;
    for (index, (workload, points)) in series.iter().enumerate() {
        let stroke = color(index).stroke_width(2);
        chart
            .draw_series(LineSeries::new(
                points
                    .iter()
                    .map(|(second, iops)| (*second as f64 + 0.5, *iops)),
                stroke,
            ))
            .map_err(|e| e.to_string())?
            .label(format!("{workload} (I/O)"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], stroke));
    }
    let actions = control_actions(data);
    for (index, action) in actions.iter().enumerate() {
        let stroke = control_stroke(series.len() + index);
        draw_control_marks(&mut chart, data, action, (0.0, y_max))?
            .label(format!("{action} (start)"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], stroke));
    }
    if !series.is_empty() || !actions.is_empty() {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The time axis of the I/O plot and the metrics' charts, in seconds
/// since the run's start: the whole run, whatever its parts recorded.
fn time_axis(data: &RunData) -> f64 {
    let last_second = data.samples.iter().map(|s| s.second + 1).max().unwrap_or(0) as f64;
    let last_record = data.records.iter().map(|r| r.end).fold(0.0, f64::max);
    let last_scrape = data.metrics.iter().map(|m| m.time).fold(0.0, f64::max);
    last_second
        .max(last_record)
        .max(last_scrape)
        .max(data.info.duration)
        .max(1.0)
}

/// The workloads of the I/O plot: its series, and the colors its control
/// operations' marks come after.
fn workload_count(data: &RunData) -> usize {
    let mut names: Vec<&str> = data.samples.iter().map(|s| s.workload.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    names.len()
}

/// The actions of the run's control operations, in name order.
fn control_actions(data: &RunData) -> Vec<&str> {
    let mut actions: Vec<&str> = data
        .records
        .iter()
        .filter(|r| is_control(r))
        .map(|r| r.action.as_str())
        .collect();
    actions.sort_unstable();
    actions.dedup();
    actions
}

/// The thin, half-clear line of a control operation's marks.
fn control_stroke(color_index: usize) -> ShapeStyle {
    color(color_index).mix(0.6).stroke_width(1)
}

type TimeChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Control operations of `action`: a thin vertical mark at each start,
/// from `low` to `high`, so that a dip lines up with what caused it. The
/// action's color is the one the I/O plot's legend gives it.
fn draw_control_marks<'c, 'a, 'b>(
    chart: &'c mut TimeChart<'a, 'b>,
    data: &RunData,
    action: &str,
    (low, high): (f64, f64),
) -> std::result::Result<&'c mut SeriesAnno<'a, SVGBackend<'b>>, String> {
    let index = control_actions(data)
        .iter()
        .position(|a| *a == action)
        .unwrap_or(0);
    let stroke = control_stroke(workload_count(data) + index);
    let starts = data
        .records
        .iter()
        .filter(|r| is_control(r) && r.action == action)
        .map(|r| r.start);
    chart
        .draw_series(starts.map(|at| PathElement::new(vec![(at, low), (at, high)], stroke)))
        .map_err(|e| e.to_string())
}

/// The figure of the provider's metrics that moved, or a paragraph
/// saying why there is none.
fn metrics_figure(data: &RunData) -> Result<String> {
    let selection = select_for_plot(&data.metrics, DRAWN_SERIES);
    if let Some(reason) = no_metrics_plot(data, &selection) {
        return Ok(format!(
            "<p id=\"metrics-over-time-absent\">No plot of the provider's metrics: {}</p>\n",
            escape(&reason)
        ));
    }
    let rows = selection.drawn.len() as u32;
    let size = (PLOT_SIZE.0, METRIC_CHART_HEIGHT * rows);
    let svg = plot_sized(size, |area| metric_charts(area, data, &selection.drawn))
        .map_err(plot_error("provider's metrics"))?;
    let mut left_out = String::new();
    if !selection.left_out.is_empty() {
        let named: Vec<String> = selection
            .left_out
            .iter()
            .take(NAMED_LEFT_OUT)
            .map(|s| escape(s))
            .collect();
        let more = selection.left_out.len().saturating_sub(NAMED_LEFT_OUT);
        let _ = write!(
            left_out,
            " Left out, moving less: {}{}.",
            named.join(", "),
            if more > 0 {
                format!(" and {more} more (the table below lists them)")
            } else {
                String::new()
            }
        );
    }
    Ok(format!(
        "<figure id=\"metrics-over-time\"><figcaption>The provider's metrics over the same \
         time: the {rows} of {scraped} series that moved most, counters as rates per second \
         and gauges as values, each control operation marked as above\
         <br><small>{left_out}</small></figcaption>\n{svg}</figure>\n",
        scraped = selection.scraped,
    ))
}

/// Why a run has no metrics plot, if it has none.
fn no_metrics_plot(data: &RunData, selection: &PlotSelection) -> Option<String> {
    if data.metrics.is_empty() && data.info.provider == "strata" {
        return Some(
            "no scrape of the daemon's /metrics answered during the run \
             (the run's warnings say why)."
                .into(),
        );
    }
    if data.metrics.is_empty() {
        return Some(format!(
            "the {} provider exposes no metrics; only the Strata daemon's /metrics is scraped.",
            data.info.provider
        ));
    }
    if selection.drawn.is_empty() {
        return Some(format!(
            "none of the {} series scraped changed during the run.",
            selection.scraped
        ));
    }
    None
}

/// One small chart per series, stacked, each on the I/O plot's time axis.
/// Small multiples rather than one chart of normalized lines: the series
/// differ in unit (operations, bytes, seconds) and each chart keeps its
/// own values readable on its axis, while the shared time axis keeps a
/// dip in one lined up with the control operation above it.
fn metric_charts(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    data: &RunData,
    drawn: &[PlottedSeries],
) -> std::result::Result<(), String> {
    let x_max = time_axis(data);
    let actions = control_actions(data);
    for (index, (row, series)) in area
        .split_evenly((drawn.len(), 1))
        .iter()
        .zip(drawn)
        .enumerate()
    {
        let (low, high) = value_range(&series.points);
        if !x_max.is_finite() || !low.is_finite() || !high.is_finite() {
            return Err(format!("{}: its values cannot be drawn", series.series));
        }
        let unit = match series.kind {
            MetricKind::Counter => "per second",
            MetricKind::Gauge => "value",
        };
        let mut chart = ChartBuilder::on(row)
            .margin(MARGIN)
            .caption(format!("{} ({unit})", series.series), ("sans-serif", 13))
            .x_label_area_size(X_LABELS / 2)
            .y_label_area_size(Y_LABELS)
            .build_cartesian_2d(0.0..x_max, low..high)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .y_labels(4)
            .y_label_formatter(&|v| compact(*v))
            .draw()
            .map_err(|e| e.to_string())?;
        for action in &actions {
            draw_control_marks(&mut chart, data, action, (low, high))?;
        }
        chart
            .draw_series(LineSeries::new(
                series.points.iter().copied(),
                color(index).stroke_width(2),
            ))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A chart's value axis: from 0 (or the lowest value, when negative) to
/// a tenth above the highest, never empty.
fn value_range(points: &[(f64, f64)]) -> (f64, f64) {
    let low = points.iter().map(|p| p.1).fold(0.0, f64::min);
    let high = points.iter().map(|p| p.1).fold(0.0, f64::max);
    let span = (high - low).max(f64::EPSILON.max(high.abs() * 1e-9));
    (low, low + span * 1.1)
}

/// `value` in at most four significant digits with k, M, G or T.
fn compact(value: f64) -> String {
    let magnitude = value.abs();
    for (scale, suffix) in [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")] {
        if magnitude >= scale {
            return format!("{}{suffix}", decimals(value / scale, 2));
        }
    }
    if magnitude >= 1.0 || magnitude == 0.0 {
        decimals(value, 2)
    } else {
        decimals(value, 3)
    }
}

/// `value` with at most `places` decimals, without trailing zeros.
fn decimals(value: f64, places: usize) -> String {
    let text = format!("{value:.places$}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Whether `record` is a control operation of the spec (not a workload
/// instance, nor the run's own setup and cleanup).
fn is_control(record: &Record) -> bool {
    record.action != "workload" && record.operation != "setup" && record.operation != "cleanup"
}

fn latency_cdf(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    data: &RunData,
) -> std::result::Result<(), String> {
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for record in &data.records {
        let key = (record.operation.as_str(), record.action.as_str());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let curves: Vec<(String, Vec<f64>)> = keys
        .iter()
        .map(|&(operation, action)| {
            let of = data
                .records
                .iter()
                .filter(|r| r.operation == operation && r.action == action);
            (format!("{operation} ({action})"), latencies(of))
        })
        .filter(|(_, values)| !values.is_empty())
        .collect();
    // A log axis: control operations and workloads differ by orders of
    // magnitude. Latencies under 1 µs are drawn at 1 µs.
    let floor = 0.001;
    let low = curves
        .iter()
        .filter_map(|(_, v)| v.first().copied())
        .reduce(f64::min)
        .unwrap_or(1.0)
        .max(floor);
    // At least a decade wide, and finite (a record's times are input).
    let high = curves
        .iter()
        .filter_map(|(_, v)| v.last().copied())
        .fold(0.0, f64::max)
        .max(low * 10.0);
    if !high.is_finite() {
        return Err(format!("a latency of {high} ms cannot be drawn"));
    }
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((low * 0.9..high * 1.1).log_scale(), 0.0..1.0)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("latency (ms, log scale)")
        .y_desc("fraction of operations")
        .draw()
        .map_err(|e| e.to_string())?;
    for (index, (label, values)) in curves.iter().enumerate() {
        let stroke = color(index).stroke_width(2);
        let count = values.len() as f64;
        // A step per operation: fraction done by each latency.
        let steps = values.iter().enumerate().flat_map(|(i, &v)| {
            let v = v.max(floor);
            [(v, i as f64 / count), (v, (i + 1) as f64 / count)]
        });
        chart
            .draw_series(LineSeries::new(steps, stroke))
            .map_err(|e| e.to_string())?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], stroke));
    }
    if !curves.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn operations_table(page: &mut String, summary: &Summary) {
    page.push_str(
        "<table id=\"operations\"><tr><th>operation</th><th>action</th><th>ok</th>\
         <th>errors</th><th>dropped</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th>\
         <th>max ms</th><th>per minute</th></tr>\n",
    );
    for op in &summary.operations {
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td>\
             <td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td></tr>",
            escape(&op.operation),
            escape(&op.action),
            op.ok,
            op.errors,
            op.dropped,
            op.p50_ms,
            op.p90_ms,
            op.p99_ms,
            op.max_ms,
            op.per_minute
        );
    }
    page.push_str("</table>\n");
}

fn workloads_table(page: &mut String, summary: &Summary) {
    if summary.workloads.is_empty() {
        return;
    }
    page.push_str(
        "<table id=\"workloads\"><tr><th>workload</th><th>instances</th>\
         <th>mean IOPS</th><th>lowest IOPS in a second</th><th>mean KiB/s</th>\
         <th>zero-operation seconds</th></tr>\n",
    );
    for w in &summary.workloads {
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{}</td></tr>",
            escape(&w.workload),
            w.instances,
            w.mean_iops,
            w.min_iops,
            w.mean_kib_per_s,
            w.zero_seconds
        );
    }
    page.push_str("</table>\n");
}

/// Most metric series the page lists.
const LISTED_SERIES: usize = 100;

/// The provider's metrics that moved during the run.
fn metrics_table(page: &mut String, summary: &Summary) {
    let moved: Vec<_> = summary.metrics.iter().filter(|m| m.min != m.max).collect();
    if moved.is_empty() {
        return;
    }
    let _ = writeln!(
        page,
        "<table id=\"metrics\"><caption>the provider's metrics that moved ({} of {} series)</caption>\
         <tr><th>series</th><th>samples</th><th>first</th><th>last</th><th>min</th><th>max</th></tr>",
        moved.len(),
        summary.metrics.len()
    );
    for m in moved.iter().take(LISTED_SERIES) {
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&m.series),
            m.samples,
            m.first,
            m.last,
            m.min,
            m.max
        );
    }
    page.push_str("</table>\n");
}

/// `text` with HTML's special characters escaped (names come from the
/// spec, which a user wrote).
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::MetricSample;
    use crate::record::{IoSample, RunInfo, Status};

    fn record(operation: &str, action: &str, start: f64, end: f64) -> Record {
        Record {
            operation: operation.into(),
            action: action.into(),
            target: "v<1>".into(),
            start,
            stages: BTreeMap::new(),
            end,
            status: Status::Ok,
            error: None,
            detail: None,
        }
    }

    fn data() -> RunData {
        RunData {
            info: RunInfo {
                run_id: "r<x>".into(),
                seed: 7,
                provider: "null".into(),
                api: None,
                own_daemon: false,
                started_unix: 0.0,
                measure_start: 0.0,
                duration: 10.0,
                interrupted: false,
            },
            records: vec![
                record("snap", "snapshot", 2.0, 2.01),
                record("snap", "snapshot", 6.0, 6.3),
                record("db", "workload", 0.0, 10.0),
            ],
            metrics: Vec::new(),
            samples: (0..10)
                .map(|second| IoSample {
                    workload: "db".into(),
                    instance: 0,
                    second,
                    read_iops: 100.0,
                    write_iops: if second == 6 { 0.0 } else { 50.0 },
                    read_kib: 400.0,
                    write_kib: 200.0,
                    transactions: 0.0,
                })
                .collect(),
        }
    }

    #[test]
    fn the_page_has_both_plots_with_their_series_and_escapes_names() {
        let page = render(&data()).unwrap();
        assert!(page.contains("run r&lt;x&gt;"), "names escaped");
        assert!(!page.contains("r<x>"));
        for id in ["io-over-time", "latency-cdf", "operations", "workloads"] {
            assert!(page.contains(&format!("id=\"{id}\"")), "{id} missing");
        }
        assert_eq!(page.matches("<svg").count(), 2);
        assert!(page.contains("db (I/O)") && page.contains("snapshot (start)"));
        assert!(page.contains("snap (snapshot)"), "a CDF per operation");
        assert!(!page.contains("<script"), "no JavaScript");
    }

    /// Scrapes each second of the daemon's write counter for volume
    /// `v0`..`v{count}`, whose rate dips at the snapshot (6 s) for `v0`.
    fn with_metrics(count: usize) -> RunData {
        let mut run = data();
        run.info.provider = "strata".into();
        for second in 0..=10 {
            for volume in 0..count {
                let dip = if volume == 0 && second > 6 { 50.0 } else { 0.0 };
                run.metrics.push(MetricSample {
                    time: second as f64,
                    metric: "strata_volume_ops_total".into(),
                    labels: [("volume".to_string(), format!("v{volume}"))].into(),
                    value: 100.0 * second as f64 - dip,
                    kind: None,
                });
            }
            run.metrics.push(MetricSample {
                time: second as f64,
                metric: "strata_volumes".into(),
                labels: BTreeMap::new(),
                value: 2.0,
                kind: None,
            });
        }
        run
    }

    #[test]
    fn the_metrics_that_moved_are_drawn_below_the_io_plot() {
        let page = render(&with_metrics(8)).unwrap();
        let io = page.find("id=\"io-over-time\"").unwrap();
        let at = page.find("<figure id=\"metrics-over-time\">").unwrap();
        let cdf = page.find("id=\"latency-cdf\"").unwrap();
        assert!(io < at && at < cdf, "directly below the I/O plot");
        let figure = &page[at..at + page[at..].find("</figure>").unwrap()];
        assert_eq!(figure.matches("<svg").count(), 1);
        // Six charts, each with its line, and the snapshots marked.
        assert_eq!(figure.matches("(per second)").count(), DRAWN_SERIES);
        assert!(figure.contains("strata_volume_ops_total{volume=&quot;v0&quot;} (per second)"));
        assert!(figure.matches("<polyline").count() >= DRAWN_SERIES);
        assert!(figure.contains("the 6 of 9 series that moved most"));
        // The dip moved most; of the steady ones, two are left out.
        assert!(figure.contains("Left out, moving less: strata_volume_ops_total{volume=&quot;v6&quot;}, strata_volume_ops_total{volume=&quot;v7&quot;}."), "{figure}");
        assert!(
            !figure.contains("strata_volumes"),
            "a flat series is not drawn"
        );
        assert!(!page.contains("metrics-over-time-absent"));
    }

    #[test]
    fn a_run_without_metrics_says_why_instead_of_an_empty_chart() {
        let page = render(&data()).unwrap();
        assert!(!page.contains("id=\"metrics-over-time\""));
        assert!(page
            .contains("No plot of the provider's metrics: the null provider exposes no metrics"));
        let mut flat = with_metrics(0);
        flat.metrics.retain(|m| m.metric == "strata_volumes");
        let page = render(&flat).unwrap();
        assert!(page.contains("none of the 1 series scraped changed during the run"));
        let mut unanswered = with_metrics(0);
        unanswered.metrics.clear();
        let page = render(&unanswered).unwrap();
        assert!(page.contains("no scrape of the daemon&#39;s /metrics answered"));
    }

    #[test]
    fn axis_labels_are_compact() {
        assert_eq!(compact(0.0), "0");
        assert_eq!(compact(12.5), "12.5");
        assert_eq!(compact(1500.0), "1.5k");
        assert_eq!(compact(2_000_000.0), "2M");
        assert_eq!(compact(0.0042), "0.004");
        assert_eq!(compact(0.5), "0.5");
        assert_eq!(value_range(&[(0.0, 5.0), (1.0, 5.0)]), (0.0, 5.5));
        let (low, high) = value_range(&[(0.0, 0.0)]);
        assert!(low == 0.0 && high > 0.0, "never an empty axis");
    }

    #[test]
    fn an_empty_run_still_renders() {
        let mut empty = data();
        empty.records.clear();
        empty.samples.clear();
        let page = render(&empty).unwrap();
        assert_eq!(page.matches("<svg").count(), 2);
    }
}

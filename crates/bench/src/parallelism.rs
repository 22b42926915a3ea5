//! Rate against parallelism: several runs of one spec, each with its
//! control operations in closed loops of a different `in_flight: N`, give
//! per operation its successes per minute at each N; drawn one plot per
//! operation (N on a log2 axis), a line per provider.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::html::{color, escape, plot, STYLE};
use crate::report::{summary_of, Summary};
use crate::spec::{self, RateLaw, Spec};

/// One run as the plot sees it: its summary and the parallelism of each
/// of its closed-loop control operations.
#[derive(Clone, Debug)]
pub struct ParallelRun {
    /// The run directory.
    pub dir: PathBuf,
    /// Its summary.
    pub summary: Summary,
    /// `in_flight: N` of each control operation that has a closed-loop
    /// rate, by the operation's name.
    pub parallelism: BTreeMap<String, u32>,
}

/// One operation's mean successes per minute at one parallelism.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Point {
    /// Operations the closed loop kept in flight.
    pub parallelism: u32,
    /// Successes per minute (the mean when several runs share `parallelism`).
    pub per_minute: f64,
    /// Runs averaged into this point.
    pub runs: u32,
}

/// One provider's points of one operation, by parallelism.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Line {
    /// The provider the runs used.
    pub provider: String,
    /// Points in increasing parallelism.
    pub points: Vec<Point>,
}

/// One control operation's rate against parallelism.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Curve {
    /// The spec's name for the operation.
    pub operation: String,
    /// Its action.
    pub action: String,
    /// A line per provider.
    pub lines: Vec<Line>,
}

/// The closed-loop parallelism (`in_flight: N`) of each control operation
/// of `spec` that has one.
pub fn closed_loops(spec: &Spec) -> BTreeMap<String, u32> {
    spec.control_operations
        .iter()
        .filter_map(|op| match op.rate {
            RateLaw::ClosedLoop(n) => Some((op.name.clone(), n)),
            _ => None,
        })
        .collect()
}

/// Reads a run directory for the plot: its summary (from `results.redb`,
/// or its JSON files when `from_json` or it has no database) and its
/// `spec.yaml`; a run whose spec has no closed-loop operation is refused.
pub fn load_run(dir: &Path, from_json: bool) -> Result<ParallelRun> {
    let data = if from_json {
        crate::report::load_json(dir)?
    } else {
        crate::report::load(dir)?
    };
    let path = dir.join("spec.yaml");
    let text =
        std::fs::read_to_string(&path).map_err(|e| Error::io("cannot read the spec", &path, e))?;
    let mut spec = spec::parse(&text).map_err(|problem| Error::Spec {
        path: path.clone(),
        problem,
    })?;
    spec.apply_recorded_overrides(dir)
        .map_err(|problem| Error::Spec {
            path: path.clone(),
            problem,
        })?;
    let parallelism = closed_loops(&spec);
    if parallelism.is_empty() {
        return Err(Error::RunDirectory {
            path,
            message: "no control operation has a closed-loop rate (`in_flight: N`), so the run \
                      has no parallelism to plot against: run the spec with `in_flight: N` rates, \
                      one run per N (docs/bench.md, experiment 1)"
                .into(),
        });
    }
    Ok(ParallelRun {
        dir: dir.to_path_buf(),
        summary: summary_of(&data),
        parallelism,
    })
}

/// Per closed-loop operation (in the order first met), a line per
/// provider of its successes per minute against parallelism; runs with
/// the same provider and parallelism are averaged into one point.
pub fn curves(runs: &[ParallelRun]) -> Vec<Curve> {
    type Sums = BTreeMap<String, BTreeMap<u32, (f64, u32)>>;
    let mut order: Vec<(String, String)> = Vec::new();
    let mut sums: BTreeMap<(String, String), Sums> = BTreeMap::new();
    for run in runs {
        for op in &run.summary.operations {
            let Some(&n) = run.parallelism.get(&op.operation) else {
                continue;
            };
            let key = (op.operation.clone(), op.action.clone());
            if !sums.contains_key(&key) {
                order.push(key.clone());
            }
            let sum = sums
                .entry(key)
                .or_default()
                .entry(run.summary.provider.clone())
                .or_default()
                .entry(n)
                .or_default();
            sum.0 += op.per_minute;
            sum.1 += 1;
        }
    }
    order
        .into_iter()
        .map(|key| {
            let lines = sums
                .remove(&key)
                .unwrap_or_default()
                .into_iter()
                .map(|(provider, points)| Line {
                    provider,
                    points: points
                        .into_iter()
                        .map(|(parallelism, (sum, runs))| Point {
                            parallelism,
                            per_minute: sum / f64::from(runs),
                            runs,
                        })
                        .collect(),
                })
                .collect();
            Curve {
                operation: key.0,
                action: key.1,
                lines,
            }
        })
        .collect()
}

/// The page of several runs: per closed-loop operation, its successes
/// per minute against parallelism as an inline SVG, and the points as a
/// table.
pub fn render(runs: &[ParallelRun]) -> Result<String> {
    let curves = curves(runs);
    let mut page = String::new();
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>strata bench: rate against parallelism</title>\n<style>{STYLE}</style>\
         </head><body>\n<h1>strata bench: rate against parallelism</h1>\n<p>{} runs:",
        runs.len()
    );
    for run in runs {
        let _ = write!(
            page,
            " {} ({}, {})",
            escape(&run.summary.run_id),
            escape(&run.summary.provider),
            escape(&run.dir.display().to_string())
        );
    }
    page.push_str("</p>\n");
    for (index, curve) in curves.iter().enumerate() {
        let svg = plot(|area| draw_curve(area, curve)).map_err(|message| {
            Error::Report(format!(
                "cannot draw the rate of `{}` against parallelism: {message}",
                curve.operation
            ))
        })?;
        let _ = write!(
            page,
            "<figure class=\"rate-parallelism\" id=\"rate-parallelism-{index}\"><figcaption>\
             {} ({}): successes per minute against operations in flight</figcaption>\n\
             {svg}</figure>\n",
            escape(&curve.operation),
            escape(&curve.action)
        );
    }
    points_table(&mut page, &curves);
    page.push_str("</body></html>\n");
    Ok(page)
}

fn points_table(page: &mut String, curves: &[Curve]) {
    page.push_str(
        "<table id=\"rate-parallelism-points\"><tr><th>operation</th><th>action</th>\
         <th>provider</th><th>in flight</th><th>per minute</th><th>runs</th></tr>\n",
    );
    for curve in curves {
        for line in &curve.lines {
            for point in &line.points {
                let _ = writeln!(
                    page,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td></tr>",
                    escape(&curve.operation),
                    escape(&curve.action),
                    escape(&line.provider),
                    point.parallelism,
                    point.per_minute,
                    point.runs
                );
            }
        }
    }
    page.push_str("</table>\n");
}

/// One operation's plot: x is log2 of the parallelism, labeled with the
/// parallelism itself (1, 2, 4...).
fn draw_curve(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    curve: &Curve,
) -> std::result::Result<(), String> {
    let all = || curve.lines.iter().flat_map(|line| line.points.iter());
    let log2 = |n: u32| f64::from(n.max(1)).log2();
    let low = all().map(|p| log2(p.parallelism)).fold(f64::MAX, f64::min);
    let high = all().map(|p| log2(p.parallelism)).fold(0.0, f64::max);
    let (low, high) = (low.min(high).floor(), high.ceil().max(low.floor() + 1.0));
    let y_max = all().map(|p| p.per_minute).fold(0.0, f64::max).max(1.0) * 1.1;
    if !y_max.is_finite() {
        return Err(format!("a rate of {y_max} per minute cannot be drawn"));
    }
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(low - 0.25..high + 0.25, 0.0..y_max)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_labels((high - low) as usize + 1)
        .x_label_formatter(&|v| {
            let whole = v.round();
            if (v - whole).abs() < 1e-6 {
                format!("{}", 2f64.powf(whole))
            } else {
                String::new()
            }
        })
        .x_desc("operations in flight (in_flight: N, log2 scale)")
        .y_desc("successes per minute")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(|e| e.to_string())?;
    for (index, line) in curve.lines.iter().enumerate() {
        let stroke = color(index).stroke_width(2);
        let points: Vec<(f64, f64)> = line
            .points
            .iter()
            .map(|p| (log2(p.parallelism), p.per_minute))
            .collect();
        chart
            .draw_series(LineSeries::new(points.iter().copied(), stroke))
            .map_err(|e| e.to_string())?
            .label(line.provider.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], stroke));
        chart
            .draw_series(points.iter().map(|&at| Circle::new(at, 4, stroke.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::OperationSummary;

    const SPEC: &str = "\
duration: 2s
volumes: [{name: scratch, count: 0, size: 16M}]
control_operations:
  - {name: creates, action: create, volumes: scratch, rate: loop}
  - {name: deletes, action: delete, volumes: scratch, rate: second}
rates:
  - {name: loop, in_flight: 8}
  - {name: second, every: 1s}
";

    fn operation(name: &str, action: &str, per_minute: f64) -> OperationSummary {
        OperationSummary {
            operation: name.into(),
            action: action.into(),
            count: 1,
            ok: 1,
            errors: 0,
            dropped: 0,
            skipped: 0,
            p50_ms: 1.0,
            p90_ms: 1.0,
            p99_ms: 1.0,
            p999_ms: 1.0,
            max_ms: 1.0,
            per_minute,
            stage_p50_ms: BTreeMap::new(),
        }
    }

    /// A run of `provider` whose creates ran `n` in flight at `per_minute`.
    fn run(provider: &str, n: u32, per_minute: f64) -> ParallelRun {
        ParallelRun {
            dir: PathBuf::from(format!("run-{provider}-{n}")),
            summary: Summary {
                run_id: format!("cns{n:08x}"),
                provider: provider.into(),
                seed: 1,
                duration: 2.0,
                interrupted: false,
                records: 3,
                operations: vec![
                    operation("setup", "create", 5.0),
                    operation("creates", "create", per_minute),
                    operation("deletes", "delete", 30.0),
                ],
                workloads: Vec::new(),
                metrics: Vec::new(),
            },
            parallelism: BTreeMap::from([("creates".to_string(), n)]),
        }
    }

    #[test]
    fn a_specs_closed_loops_give_its_parallelism() {
        let spec = spec::parse(SPEC).unwrap();
        assert_eq!(
            closed_loops(&spec),
            BTreeMap::from([("creates".to_string(), 8)])
        );
    }

    /// Only closed-loop operations are plotted; a line per provider, its
    /// points in increasing parallelism, runs of one provider and N
    /// averaged.
    #[test]
    fn the_series_are_per_operation_and_provider_by_parallelism() {
        let runs = [
            run("strata", 4, 400.0),
            run("strata", 1, 100.0),
            run("null", 64, 9000.0),
            run("strata", 4, 600.0),
            run("null", 1, 1000.0),
        ];
        let curves = curves(&runs);
        assert_eq!(curves.len(), 1, "{curves:?}");
        assert_eq!(
            (curves[0].operation.as_str(), curves[0].action.as_str()),
            ("creates", "create")
        );
        type Points = Vec<(u32, f64, u32)>;
        let lines: Vec<(&str, Points)> = curves[0]
            .lines
            .iter()
            .map(|line| {
                let points = line
                    .points
                    .iter()
                    .map(|p| (p.parallelism, p.per_minute, p.runs))
                    .collect();
                (line.provider.as_str(), points)
            })
            .collect();
        assert_eq!(
            lines,
            vec![
                ("null", vec![(1, 1000.0, 1), (64, 9000.0, 1)]),
                ("strata", vec![(1, 100.0, 1), (4, 500.0, 2)]),
            ]
        );
    }

    /// The page has one drawn SVG per operation, with a line and a marker
    /// per point, the providers in the legend and N labeled in powers of 2.
    #[test]
    fn the_page_draws_each_operation_against_parallelism() {
        let runs = [
            run("strata", 1, 100.0),
            run("strata", 8, 700.0),
            run("null", 1, 1000.0),
            run("null", 8, 8000.0),
        ];
        let page = render(&runs).unwrap();
        assert_eq!(page.matches("<svg").count(), 1);
        assert!(page.contains("id=\"rate-parallelism-0\""));
        let at = page.find("<svg").unwrap();
        let svg = &page[at..page.find("</svg>").unwrap()];
        assert!(svg.matches("<polyline").count() >= 2, "a line per provider");
        assert!(svg.matches("<circle").count() >= 4, "a marker per point");
        let texts: Vec<&str> = svg
            .split("<text")
            .skip(1)
            .filter_map(|t| Some(t[t.find('>')? + 1..t.find("</text>")?].trim()))
            .collect();
        for text in ["strata", "null", "1", "2", "4", "8"] {
            assert!(
                texts.contains(&text),
                "{text} missing from the plot: {texts:?}"
            );
        }
        assert!(texts.iter().any(|t| t.contains("log2 scale")), "{texts:?}");
        assert!(
            page.contains("<td>creates</td><td>create</td><td>strata</td><td>8</td><td>700.0</td>")
        );
        assert!(!page.contains("<script"));
    }

    /// A run directory whose spec has no closed loop is refused, naming its
    /// spec; one with a closed loop loads (from its JSON files).
    #[test]
    fn a_run_without_a_closed_loop_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let info = crate::record::RunInfo {
            run_id: "cns00000001".into(),
            seed: 1,
            provider: "null".into(),
            api: None,
            own_daemon: false,
            started_unix: 0.0,
            measure_start: 0.0,
            duration: 2.0,
            interrupted: false,
        };
        info.save(dir.path()).unwrap();
        let record = "{\"operation\":\"creates\",\"action\":\"create\",\"target\":\"v\",\
                      \"start\":0.5,\"stages\":{},\"end\":0.6,\"status\":\"ok\"}\n";
        std::fs::write(dir.path().join("records.jsonl"), record).unwrap();
        std::fs::write(dir.path().join("spec.yaml"), SPEC).unwrap();
        let loaded = load_run(dir.path(), false).unwrap();
        assert_eq!(loaded.parallelism["creates"], 8);
        assert_eq!(loaded.summary.operations[0].per_minute, 30.0);
        let open = SPEC.replace("in_flight: 8", "every: 1s");
        std::fs::write(dir.path().join("spec.yaml"), open).unwrap();
        let message = load_run(dir.path(), true).unwrap_err().to_string();
        assert!(message.contains("spec.yaml"), "{message}");
        assert!(message.contains("in_flight: N"), "{message}");
    }
}

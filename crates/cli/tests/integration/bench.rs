//! `strata bench`: a small spec run end to end against a real volume
//! daemon with fio's verify, the same spec on the null provider, bad specs
//! refused with their line before anything starts, and cleanup after
//! SIGINT.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{at, p, strata, strata_ok, tmp, Launch};

/// An HTTP receiver: each POST's body appended as a line to the file
/// named by its argument; it prints its port.
const RECEIVER: &str = "
import http.server, sys
class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get('Content-Length', 0)))
        with open(sys.argv[1], 'ab') as f:
            f.write(body + b'\\n')
        self.send_response(204)
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(('127.0.0.1', 0), Receiver)
print(server.server_address[1], flush=True)
server.serve_forever()
";

/// Three seconds of two fio writers with verify, snapshots of their
/// volumes, clones of those, volumes created and deleted, grows, and
/// attaches to the writers' volumes while they write.
pub(crate) const SMALL_SPEC: &str = "\
duration: 3s
volumes:
  - {name: data, count: 2, size: 64M}
  - {name: scratch, count: 0, size: 16M}
  - {name: copies, count: 0, size: 64M}
workloads:
  - name: writer
    count: 2
    volumes: data
    fio: {rw: randwrite, bs: 4k, size: 16M, iodepth: 8, verify: crc32c, verify_fatal: 1, verify_backlog: 256, do_verify: 1}
  - name: checker
    volumes: data
    command: [sh, -c, 'test \"$STRATA_BENCH_VOLUME\" = {volume} && test \"$STRATA_BENCH_URI\" = \"{uri}\"']
control_operations:
  - {name: snapshots, action: snapshot, workload: writer, select: random, rate: half-second}
  - {name: clones, action: clone, workload: writer, select: newest, into: copies, rate: second}
  - {name: creates, action: create, volumes: scratch, rate: arrivals}
  - {name: deletes, action: delete, volumes: scratch, select: oldest, rate: second}
  - {name: grows, action: resize, workload: writer, size: +16M, rate: second}
  - {name: attaches, action: attach, workload: writer, select: random, rate: half-second}
rates:
  - {name: half-second, every: 500ms}
  - {name: second, every: 1s}
  - {name: arrivals, poisson_mean: 300ms}
";

/// The records of a run directory, one JSON value per line.
pub(crate) fn records(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("records.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).expect("a record is JSON"))
        .collect()
}

/// Records per (operation, action, status).
pub(crate) fn tally(records: &[Value]) -> BTreeMap<(String, String, String), u64> {
    let mut counts = BTreeMap::new();
    for record in records {
        let key = (
            record["operation"].as_str().unwrap().to_string(),
            record["action"].as_str().unwrap().to_string(),
            record["status"].as_str().unwrap().to_string(),
        );
        *counts.entry(key).or_default() += 1;
    }
    counts
}

pub(crate) fn count(
    tally: &BTreeMap<(String, String, String), u64>,
    operation: &str,
    status: &str,
) -> u64 {
    tally
        .iter()
        .filter(|((o, _, s), _)| o == operation && s == status)
        .map(|(_, n)| n)
        .sum()
}

/// The summary's counts per operation equal the records', and add up to
/// every record.
pub(crate) fn assert_summary_counts_records(dir: &Path, records: &[Value]) -> Value {
    let summary: Value = serde_json::from_str(&strata_ok(&[
        "bench",
        "report",
        &p(dir),
        "--output",
        "json",
    ]))
    .unwrap();
    assert_eq!(summary["records"].as_u64(), Some(records.len() as u64));
    let mut total = 0;
    for op in summary["operations"].as_array().unwrap() {
        let (name, action) = (
            op["operation"].as_str().unwrap(),
            op["action"].as_str().unwrap(),
        );
        let matching: Vec<&Value> = records
            .iter()
            .filter(|r| r["operation"] == name && r["action"] == action)
            .collect();
        let ok = matching.iter().filter(|r| r["status"] == "ok").count() as u64;
        assert_eq!(
            op["count"].as_u64(),
            Some(matching.len() as u64),
            "{name}: {op}"
        );
        assert_eq!(op["ok"].as_u64(), Some(ok), "{name}: {op}");
        total += matching.len();
    }
    assert_eq!(total, records.len());
    summary
}

fn run_small_spec(extra: &[&str]) -> (tempfile::TempDir, std::path::PathBuf, Vec<Value>) {
    run_spec_text(tmp(), SMALL_SPEC, extra)
}

fn run_spec_text(
    dir: tempfile::TempDir,
    text: &str,
    extra: &[&str],
) -> (tempfile::TempDir, std::path::PathBuf, Vec<Value>) {
    let spec = at(&dir, "spec.yaml");
    std::fs::write(&spec, text).unwrap();
    let out = at(&dir, "run");
    let mut args = vec!["bench", "run", &p(&spec), "--out", &p(&out), "--seed", "3"]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    args.extend(extra.iter().map(|a| a.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    strata_ok(&refs);
    let records = records(&out);
    (dir, out, records)
}

#[test]
fn a_small_spec_runs_against_the_daemon_and_its_summary_counts_the_records() {
    let (_dir, out, records) = run_small_spec(&[]);
    let counts = tally(&records);
    // fio verified every block it wrote, on both volumes, under snapshots,
    // clones and grows.
    assert_eq!(count(&counts, "writer", "ok"), 2, "{counts:?}");
    // A command workload got its volume and NBD address, in its words and
    // its environment alike.
    assert_eq!(count(&counts, "checker", "ok"), 1, "{counts:?}");
    assert!(count(&counts, "snapshots", "ok") >= 4, "{counts:?}");
    assert!(count(&counts, "creates", "ok") >= 2, "{counts:?}");
    assert!(count(&counts, "clones", "ok") >= 1, "{counts:?}");
    assert!(count(&counts, "grows", "ok") >= 1, "{counts:?}");
    assert!(count(&counts, "attaches", "ok") >= 4, "{counts:?}");
    assert_eq!(
        counts.keys().filter(|(_, _, s)| s == "error").count(),
        0,
        "{counts:?}"
    );
    for record in &records {
        assert!(
            record["end"].as_f64() >= record["start"].as_f64(),
            "{record}"
        );
        if record["action"] == "create" && record["status"] == "ok" {
            let stages = &record["stages"];
            assert!(
                stages["created"].as_f64() <= stages["attached"].as_f64(),
                "{record}"
            );
        }
        if record["action"] == "snapshot" {
            assert!(record["detail"]["pause_ms"].as_f64().is_some(), "{record}");
        }
        if record["action"] == "attach" {
            let attached = record["stages"]["attached"].as_f64().unwrap_or(-1.0);
            let (start, end) = (record["start"].as_f64(), record["end"].as_f64());
            assert!(
                start <= Some(attached) && Some(attached) <= end,
                "an attach without its handshake: {record}"
            );
            assert!(
                record["target"].as_str().unwrap().contains("data-"),
                "an attach to a volume not of the writers' group: {record}"
            );
        }
    }
    // fio's own files (its verify state) stay in the run directory.
    let state = |dir: &Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().ends_with("verify.state"))
    };
    assert!(state(&out.join("workloads")));
    assert!(
        !state(Path::new(".")),
        "fio wrote its state where the test runs"
    );
    let summary = assert_summary_counts_records(&out, &records);
    let writer = &summary["workloads"][0];
    assert_eq!(writer["instances"], 2);
    assert!(writer["mean_iops"].as_f64().unwrap() > 0.0, "{writer}");
    assert_daemon_metrics_were_scraped(&out, &summary);
    // Every volume the run made (clones, scratch, the writers') was
    // deleted: the cleanup restarts the run's daemon and finds none.
    let cleaned = strata_ok(&["bench", "clean", &p(&out)]);
    assert!(cleaned.contains("0 volume(s) deleted"), "{cleaned}");
    let text = strata_ok(&["bench", "report", &p(&out)]);
    assert!(
        text.contains("p99.9 ms") && text.contains("snapshots"),
        "{text}"
    );
    assert!(text.contains("provider metrics: "), "{text}");
    html_report_renders_in_chromium(&out);
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        page.contains("<table id=\"metrics\">") && page.contains("strata_volume_ops_total"),
        "the page lists no metric that moved"
    );
}

/// The daemon's /metrics was scraped during the run: scrapes a second
/// apart in time order, the writers' operation counters grew between the
/// first and the last, and the summary lists the series.
fn assert_daemon_metrics_were_scraped(out: &Path, summary: &Value) {
    let lines: Vec<Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a metric line is JSON"))
        .collect();
    let times: Vec<f64> = lines.iter().map(|l| l["time"].as_f64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    let mut scrapes = times.clone();
    scrapes.dedup();
    assert!(
        scrapes.len() >= 3,
        "only {} scrapes in 3 s: {scrapes:?}",
        scrapes.len()
    );
    let writes: Vec<f64> = lines
        .iter()
        .filter(|l| l["metric"] == "strata_volume_ops_total" && l["labels"]["op"] == "write")
        .filter(|l| l["labels"]["volume"].as_str().unwrap().ends_with("-data-0"))
        .map(|l| l["value"].as_f64().unwrap())
        .collect();
    assert!(
        writes.len() >= 3 && writes.last() > writes.first(),
        "{writes:?}"
    );
    let series = summary["metrics"].as_array().unwrap();
    assert!(
        series.iter().any(|m| m["series"] == "strata_volumes"),
        "{series:?}"
    );
    assert_daemon_usage_was_scraped(out);
}

/// The daemon the provider started had its CPU time and memory read
/// with every scrape: its CPU time never fell and grew over the run
/// (the daemon served the workloads), and its resident memory is above
/// zero.
pub(crate) fn assert_daemon_usage_was_scraped(out: &Path) {
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).expect("metrics.jsonl");
    let values = |metric: &str| -> Vec<f64> {
        text.lines()
            .map(|line| serde_json::from_str::<Value>(line).expect("a metric line is JSON"))
            .filter(|l| l["metric"] == metric)
            .map(|l| l["value"].as_f64().unwrap())
            .collect()
    };
    let cpu = values("strata_bench_daemon_cpu_seconds_total");
    assert!(cpu.len() >= 2, "{cpu:?}");
    assert!(cpu.windows(2).all(|w| w[0] <= w[1]), "{cpu:?}");
    assert!(cpu.last() > cpu.first(), "no CPU time spent: {cpu:?}");
    let resident = values("strata_bench_daemon_resident_bytes");
    assert!(resident.iter().all(|&bytes| bytes > 0.0), "{resident:?}");
}

/// Headless Chromium as the test command installs it, with the flags
/// this closed network needs (no background connections), a profile of
/// its own, and a bound on its time.
fn chromium(profile: &Path, args: &[&str]) -> std::process::Output {
    let output = Command::new("timeout")
        .arg("120")
        .arg("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", p(profile)))
        .args(args)
        .output()
        .expect("run chromium (scripts/test.sh installs it)");
    assert!(
        output.status.success(),
        "chromium {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `strata bench report --html` of `out` as headless Chromium renders it:
/// the page's DOM, and a Chromium profile for more of its views.
fn rendered_report(out: &Path) -> (String, tempfile::TempDir) {
    strata_ok(&["bench", "report", &p(out), "--html"]);
    let url = format!("file://{}", p(&out.join("report.html")));
    let profile = tempfile::tempdir().unwrap();
    let dom = chromium(profile.path(), &["--dump-dom", &url]);
    (String::from_utf8_lossy(&dom.stdout).into_owned(), profile)
}

/// The text of the figure `id` in a rendered page.
fn figure<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom
        .find(&format!("<figure id=\"{id}\""))
        .unwrap_or_else(|| panic!("no {id} figure in the rendered page"));
    let end = at + dom[at..].find("</figure>").expect("a closed figure");
    &dom[at..end]
}

/// `strata bench report --html` writes a page that Chromium renders with
/// its plots: its DOM holds the SVG figures drawn with lines (the
/// daemon's metrics below the I/O, one chart per series that moved), and
/// its screenshot shows the I/O series' color over a plot's area.
fn html_report_renders_in_chromium(out: &Path) {
    let (dom, profile) = rendered_report(out);
    let url = format!("file://{}", p(&out.join("report.html")));
    for id in ["io-over-time", "metrics-over-time", "latency-cdf"] {
        let figure_text = figure(&dom, id);
        assert!(
            figure_text.contains("<svg") && figure_text.contains("<polyline"),
            "{id}: no drawn SVG plot"
        );
    }
    assert!(dom.contains("writer (I/O)") && dom.contains("snapshot (start)"));
    // The daemon's volume series moved under the writers: charts of
    // them, each with its drawn line, directly below the I/O plot.
    let io = dom.find("<figure id=\"io-over-time\"").unwrap();
    let metrics = dom.find("<figure id=\"metrics-over-time\"").unwrap();
    let cdf = dom.find("<figure id=\"latency-cdf\"").unwrap();
    assert!(
        io < metrics && metrics < cdf,
        "the metrics follow the I/O plot"
    );
    let charts = figure(&dom, "metrics-over-time");
    assert!(
        charts.contains("strata_volume_") && charts.contains("(per second)"),
        "no chart of the daemon's volume counters as rates"
    );
    let drawn = charts.matches("(per second)").count() + charts.matches("(value)").count();
    assert!(
        (1..=6).contains(&drawn) && charts.matches("<polyline").count() >= drawn,
        "{drawn} charts"
    );
    assert!(!dom.contains("metrics-over-time-absent"));
    let shot = out.join("report.png");
    chromium(
        profile.path(),
        &[
            &format!("--screenshot={}", p(&shot)),
            "--window-size=1100,1500",
            &url,
        ],
    );
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut pixels).unwrap();
    let channels = frame.color_type.samples();
    // The first series' blue (31, 119, 180): the workload's I/O line.
    let blue = pixels[..frame.buffer_size()]
        .chunks(channels)
        .filter(|px| {
            px.len() >= 3
                && px[0].abs_diff(31) < 24
                && px[1].abs_diff(119) < 24
                && px[2].abs_diff(180) < 24
        })
        .count();
    assert!(
        blue > 300,
        "the screenshot shows no I/O line ({blue} pixels of its color): {}",
        p(&shot)
    );
}

#[test]
fn the_null_provider_runs_the_same_spec_and_runs_compare() {
    // Every record and the summary are POSTed to a receiver that keeps
    // each body as a line.
    let dir = tmp();
    let received = at(&dir, "received.jsonl");
    let mut receiver = Command::new("python3")
        .args(["-c", RECEIVER, &p(&received)])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut port = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(receiver.stdout.take().unwrap()),
        &mut port,
    )
    .unwrap();
    let text = format!(
        "{SMALL_SPEC}outputs: {{http: \"http://127.0.0.1:{}/records\"}}\n",
        port.trim()
    );
    let (_dir, out, records) = run_spec_text(dir, &text, &["--provider", "null"]);
    let _ = receiver.kill();
    let _ = receiver.wait();
    let posted: Vec<Value> = std::fs::read_to_string(&received)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let (summaries, mut bodies): (Vec<Value>, Vec<Value>) =
        posted.into_iter().partition(|v| v.get("summary").is_some());
    assert_eq!(summaries.len(), 1, "one summary posted");
    assert_eq!(summaries[0]["summary"]["records"], records.len() as u64);
    let mut written = records.clone();
    let key = |v: &Value| v.to_string();
    bodies.sort_by_key(key);
    written.sort_by_key(key);
    assert_eq!(bodies, written, "the posted records are records.jsonl's");
    let counts = tally(&records);
    assert_eq!(count(&counts, "writer", "ok"), 2, "{counts:?}");
    assert_eq!(count(&counts, "checker", "ok"), 1, "{counts:?}");
    assert!(count(&counts, "snapshots", "ok") >= 4, "{counts:?}");
    assert!(count(&counts, "attaches", "ok") >= 4, "{counts:?}");
    assert_eq!(
        count(&counts, "cleanup", "ok"),
        0,
        "the null provider keeps nothing to delete"
    );
    assert_summary_counts_records(&out, &records);
    assert_results_database_matches_the_json(&out);
    assert!(
        !out.join("metrics.jsonl").exists(),
        "the null provider has no metrics"
    );
    // Its report says why it has no metrics plot, rather than drawing an
    // empty one.
    let (dom, _profile) = rendered_report(&out);
    assert!(
        dom.contains("No plot of the provider's metrics: the null provider exposes no metrics"),
        "no sentence in place of the metrics plot"
    );
    assert!(!dom.contains("<figure id=\"metrics-over-time\""));
    figure(&dom, "io-over-time");
    let rows: Value = serde_json::from_str(&strata_ok(&[
        "bench",
        "compare",
        &p(&out),
        &p(&out),
        "--output",
        "json",
    ]))
    .unwrap();
    let per_minute = rows["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["metric"] == "snapshots.snapshot.per_minute")
        .expect("the snapshots' rate is compared");
    assert_eq!(per_minute["ratio"].as_f64(), Some(1.0));
    assert_eq!(
        rows["thresholds"],
        serde_json::json!([]),
        "the spec has none"
    );
}

/// The run wrote `results.redb`, `report` reads it, and its summary is
/// the one from the JSON files; a damaged database is refused naming the
/// file and `--from-json`, which still reads the JSON files.
fn assert_results_database_matches_the_json(out: &Path) {
    let database = out.join("results.redb");
    let kept = std::fs::read(&database).expect("the run wrote results.redb");
    let report = |extra: &[&str]| {
        let mut args = vec!["bench", "report", "--output", "json"];
        args.extend(extra);
        strata(&[args.as_slice(), &[&p(out)]].concat())
    };
    let from_database = report(&[]);
    let from_json = report(&["--from-json"]);
    assert!(from_database.status.success(), "{from_database:?}");
    assert_eq!(from_database.stdout, from_json.stdout);
    std::fs::write(&database, b"not a database").unwrap();
    let refused = report(&[]);
    let error = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{error}");
    assert!(
        error.contains("results.redb") && error.contains("--from-json"),
        "{error}"
    );
    assert_eq!(report(&["--from-json"]).stdout, from_json.stdout);
    std::fs::write(&database, kept).unwrap();
}

/// A hand-made run directory: its identity, records of one snapshot
/// operation with these latencies (seconds), and `iops` per second of
/// one writer.
fn write_run(dir: &Path, latencies: &[f64], iops: &[f64], spec: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let info = serde_json::json!({"run_id": "cns00000001", "seed": 1, "provider": "null",
        "started_unix": 0.0, "duration": 4.0});
    std::fs::write(dir.join("run.json"), info.to_string()).unwrap();
    let records: Vec<String> = latencies
        .iter()
        .enumerate()
        .map(|(i, latency)| {
            serde_json::json!({"operation": "snaps", "action": "snapshot", "target": "v",
                "start": i as f64, "stages": {}, "end": i as f64 + latency, "status": "ok"})
            .to_string()
        })
        .collect();
    std::fs::write(dir.join("records.jsonl"), records.join("\n") + "\n").unwrap();
    let samples: Vec<String> = iops
        .iter()
        .enumerate()
        .map(|(second, n)| {
            serde_json::json!({"workload": "writer", "instance": 0, "second": second,
                "read_iops": 0.0, "write_iops": n, "read_kib": 0.0, "write_kib": n * 4.0})
            .to_string()
        })
        .collect();
    std::fs::write(dir.join("io.jsonl"), samples.join("\n") + "\n").unwrap();
    std::fs::write(dir.join("spec.yaml"), spec).unwrap();
}

/// `compare` applies B's spec's thresholds: B's snapshots are 50% slower
/// and its writer lost a second, so the ratio bound on p99 and the bound
/// on zero seconds fail and it exits 1, while the IOPS bound passes;
/// `--spec` applies another spec's thresholds; a threshold naming an
/// unknown metric is refused with its line.
#[test]
fn compare_applies_the_spec_thresholds() {
    let dir = tmp();
    let spec = |thresholds: &str| {
        format!(
            "duration: 4s\nvolumes: [{{name: data, size: 16M}}]\nworkloads:\n  - {{name: writer, volumes: data, fio: {{rw: randwrite}}}}\n\
             control_operations:\n  - {{name: snaps, action: snapshot, volumes: data, rate: second}}\n\
             rates: [{{name: second, every: 1s}}]\nthresholds:\n{thresholds}"
        )
    };
    let strict = spec("  - {metric: snaps.snapshot.p99_ms, max_ratio: 1.05}\n  - {metric: writer.mean_iops, min_ratio: 0.7}\n  - {metric: writer.zero_seconds, max: 0}\n");
    let (a, b) = (at(&dir, "a"), at(&dir, "b"));
    write_run(
        &a,
        &[0.010, 0.010, 0.010],
        &[100.0, 100.0, 100.0, 100.0],
        &strict,
    );
    write_run(
        &b,
        &[0.015, 0.015, 0.015],
        &[100.0, 100.0, 100.0, 0.0],
        &strict,
    );
    let out = strata(&["bench", "compare", &p(&a), &p(&b), "--output", "json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdicts: Vec<(String, bool)> = json["thresholds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["metric"].as_str().unwrap().to_string(),
                v["pass"].as_bool().unwrap(),
            )
        })
        .collect();
    let expected = [
        ("snaps.snapshot.p99_ms", false),
        ("writer.mean_iops", true),
        ("writer.zero_seconds", false),
    ];
    assert_eq!(verdicts, expected.map(|(m, pass)| (m.to_string(), pass)));
    let human =
        String::from_utf8_lossy(&strata(&["bench", "compare", &p(&a), &p(&b)]).stdout).to_string();
    assert!(
        human.contains("FAIL") && human.contains("above max_ratio 1.05"),
        "{human}"
    );
    let lenient = at(&dir, "lenient.yaml");
    std::fs::write(
        &lenient,
        spec("  - {metric: \"snaps.*\", max_ratio: 1.6}\n"),
    )
    .unwrap();
    strata_ok(&["bench", "compare", &p(&a), &p(&b), "--spec", &p(&lenient)]);
    std::fs::write(
        &lenient,
        spec("  - {metric: snaps.snapshot.p95_ms, max_ratio: 1.6}\n"),
    )
    .unwrap();
    let out = strata(&["bench", "compare", &p(&a), &p(&b), "--spec", &p(&lenient)]);
    let error = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{error}");
    assert!(
        error.contains("lenient.yaml:9:") && error.contains("no metric `p95_ms`"),
        "{error}"
    );
}

/// Each bad spec is refused with its file, line and a fix, and nothing
/// starts: no run directory.
#[test]
fn bad_specs_are_refused_with_their_line_before_anything_starts() {
    let cases = [
        (
            "  - {name: arrivals, poisson_mean: 300ms}",
            "  - {name: arrivals, poisson_mean: 300ms, burst: 2}",
            24,
            "unknown field `burst`",
        ),
        (
            "rate: second}\n  - {name: creates",
            "rate: sometimes}\n  - {name: creates",
            16,
            "names no rate: write one of half-second, second, arrivals",
        ),
        ("every: 500ms", "every: -500ms", 22, "negative interval"),
        (
            "    volumes: data\n    fio",
            "    fio",
            7,
            "uses no volume: add `volumes: GROUP`",
        ),
    ];
    let dir = tmp();
    for (from, to, line, hint) in cases {
        let text = SMALL_SPEC.replacen(from, to, 1);
        assert_ne!(text, SMALL_SPEC, "{to}");
        assert_refused_at_line(&dir, &text, line, hint);
    }
    // A trace file is read relative to the spec, and refused with the
    // spec's line and the file's; a good one (and a bounded
    // increase-decrease rate) shows in the dry run's plan.
    let from_file = SMALL_SPEC.replacen("poisson_mean: 300ms}", "trace_file: arrivals.csv}", 1);
    assert_refused_at_line(&dir, &from_file, 24, "cannot open it");
    std::fs::write(at(&dir, "arrivals.csv"), "seconds\n0.5\n0.25\n").unwrap();
    assert_refused_at_line(&dir, &from_file, 24, "line 3: 0.25 comes before");
    std::fs::write(at(&dir, "arrivals.csv"), "seconds\n0.25\n0.5\n2\n").unwrap();
    let waves = from_file.replacen(
        "every: 1s}",
        "increase_decrease: {low: 1, high: 4, step: 1, every: 1s}}",
        1,
    );
    let spec = at(&dir, "bad.yaml");
    std::fs::write(&spec, waves).unwrap();
    let plan = strata_ok(&["bench", "run", &p(&spec), "--dry-run"]);
    assert!(plan.contains("a trace of 3 arrivals"), "{plan}");
    assert!(
        plan.contains("1 to 4 arrivals a second and back, by 1 every 1s"),
        "{plan}"
    );
}

/// `strata bench run` refuses the spec `text` (written to DIR/bad.yaml)
/// with exit 1, an error at `bad.yaml:LINE` that says `hint`, and no run
/// directory made.
pub(crate) fn assert_refused_at_line(dir: &tempfile::TempDir, text: &str, line: usize, hint: &str) {
    let spec = at(dir, "bad.yaml");
    std::fs::write(&spec, text).unwrap();
    let out = at(dir, "run");
    let result = strata(&["bench", "run", &p(&spec), "--out", &p(&out)]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(1), "{hint}: {stderr}");
    assert!(
        stderr.contains(&format!("bad.yaml:{line}: ")),
        "{hint}: {stderr}"
    );
    assert!(stderr.contains(hint), "{hint}: {stderr}");
    assert!(!out.exists(), "{hint}: a run directory was made");
}

/// Ctrl-C in the middle of a run: the workloads are stopped, and every
/// volume and snapshot the run made on the daemon is deleted.
#[test]
fn cleanup_after_sigint_leaves_no_volume_or_snapshot() {
    let dir = tmp();
    let pool = at(&dir, "pool");
    let daemon = Launch::strata(&[
        "daemon",
        "--pool",
        &p(&pool),
        "--listen",
        "127.0.0.1:0",
        "--nbd-port",
        "0",
    ])
    .start();
    let api = daemon.word_after("http://");
    let spec = at(&dir, "spec.yaml");
    let long = SMALL_SPEC.replacen("duration: 3s", "duration: 60s", 1);
    std::fs::write(&spec, long).unwrap();
    let out = at(&dir, "run");
    let mut bench = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "bench",
            "run",
            &p(&spec),
            "--out",
            &p(&out),
            "--api",
            &api,
            "--pool",
            &p(&pool),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn strata bench run");
    // Wait until the run holds snapshots and a clone.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let counts = tally(&records(&out));
        if count(&counts, "snapshots", "ok") >= 2 && count(&counts, "clones", "ok") >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no snapshot and clone within 30 s: {counts:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let client = [
        "--api",
        api.as_str(),
        "--pool",
        &p(&pool),
        "--output",
        "json",
    ];
    let before: Value =
        serde_json::from_str(&strata_ok(&[&["volume", "list"], &client[..]].concat())).unwrap();
    assert!(before.as_array().unwrap().len() >= 3, "{before}");
    let stderr = crate::bench::interrupt(&mut bench);
    let after: Value =
        serde_json::from_str(&strata_ok(&[&["volume", "list"], &client[..]].concat())).unwrap();
    assert_eq!(
        after,
        serde_json::json!([]),
        "volumes (and with them snapshots) left: {stderr}"
    );
    let records = records(&out);
    let counts = tally(&records);
    assert!(count(&counts, "cleanup", "ok") >= 3, "{counts:?}");
    assert_eq!(
        count(&counts, "writer", "error"),
        2,
        "the writers were stopped: {counts:?}"
    );
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(info["interrupted"], true);
    // results.redb was written after the cleanup: the report read from it
    // counts the cleanup's records too, and says the run was interrupted.
    assert!(out.join("results.redb").exists());
    let summary = assert_summary_counts_records(&out, &records);
    assert_eq!(summary["interrupted"], true);
}

/// Sends SIGINT to a running `strata bench run`, waits at most 60 s for
/// it to stop, and checks it exited 130 (its standard error shown if not);
/// its standard error.
pub(crate) fn interrupt(bench: &mut std::process::Child) -> String {
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(bench.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = bench.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = bench.kill();
            panic!("strata bench run did not stop within 60 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(bench.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    stderr
}

/// `report` of several runs of one spec at different `in_flight: N`:
/// each closed-loop operation's successes per minute at each N, and with
/// `--html` a page with its plot; a run without a closed loop is refused.
#[test]
fn report_of_several_runs_gives_rate_against_parallelism() {
    let dir = tmp();
    let spec = |rate: &str| {
        format!(
            "duration: 4s\nvolumes: [{{name: data, size: 16M}}]\n\
             control_operations:\n  - {{name: snaps, action: snapshot, volumes: data, rate: r}}\n\
             rates: [{{name: r, {rate}}}]\n"
        )
    };
    let (one, four, open) = (at(&dir, "n1"), at(&dir, "n4"), at(&dir, "open"));
    write_run(&one, &[0.01, 0.01], &[], &spec("in_flight: 1"));
    write_run(&four, &[0.01; 4], &[], &spec("in_flight: 4"));
    write_run(&open, &[0.01], &[], &spec("every: 1s"));
    let page = at(&dir, "rate.html");
    let text = strata_ok(&[
        "bench",
        "report",
        &p(&four),
        &p(&one),
        "--html",
        "--html-file",
        &p(&page),
    ]);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [
            ["snaps", "snapshot", "null", "1", "30.0", "1"],
            ["snaps", "snapshot", "null", "4", "60.0", "1"]
        ],
        "{text}"
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("id=\"rate-parallelism-0\"") && html.contains("<polyline"),
        "no drawn plot"
    );
    let out = strata(&["bench", "report", &p(&one), &p(&open)]);
    let error = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{error}");
    assert!(
        error.contains("open/spec.yaml") && error.contains("in_flight: N"),
        "{error}"
    );
}

/// `--parallelism N` runs one spec at several parallelisms: each run
/// records its N, and the report of the runs plots them apart; a spec
/// with no closed loop for it to set is refused before anything runs.
#[test]
fn one_spec_runs_at_several_parallelisms_with_the_override() {
    let dir = tmp();
    let spec = at(&dir, "spec.yaml");
    let text = |rate: &str| {
        format!(
            "duration: 2s\nvolumes: [{{name: data, size: 16M}}]\n\
             control_operations:\n  - {{name: snaps, action: snapshot, volumes: data, rate: r}}\n\
             rates: [{{name: r, {rate}}}]\n"
        )
    };
    std::fs::write(&spec, text("in_flight: 1")).unwrap();
    let mut runs = Vec::new();
    for n in ["2", "8"] {
        let out = at(&dir, &format!("n{n}"));
        strata_ok(&[
            "bench",
            "run",
            &p(&spec),
            "--out",
            &p(&out),
            "--provider",
            "null",
            "--parallelism",
            n,
        ]);
        let overrides = std::fs::read_to_string(out.join("overrides.json")).unwrap();
        assert_eq!(overrides, format!("{{\"parallelism\":{n}}}"));
        runs.push(out);
    }
    let json = strata_ok(&[
        "bench",
        "report",
        &p(&runs[0]),
        &p(&runs[1]),
        "--output",
        "json",
    ]);
    let report: Value = serde_json::from_str(&json).unwrap();
    let points: Vec<u64> = report[0]["lines"][0]["points"]
        .as_array()
        .unwrap_or_else(|| panic!("no points in {report}"))
        .iter()
        .map(|point| point["parallelism"].as_u64().unwrap())
        .collect();
    assert_eq!(points, [2, 8], "{report}");
    std::fs::write(&spec, text("every: 1s")).unwrap();
    let out = strata(&[
        "bench",
        "run",
        &p(&spec),
        "--out",
        &p(&at(&dir, "open")),
        "--provider",
        "null",
        "--parallelism",
        "4",
    ]);
    let error = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{error}");
    assert!(
        error.contains("--parallelism") && error.contains("in_flight"),
        "{error}"
    );
    assert!(
        !at(&dir, "open").exists(),
        "a refused run made its directory"
    );
}

/// A command workload with an output parser: each line its pattern
/// matches is counted in the second it came (the series sums to exactly
/// what was printed), silent seconds are zero-operation seconds, every
/// line is kept in the workload's log; a pattern without `ops` and
/// `parse:` on a fio workload are refused at their line.
#[test]
fn a_command_s_output_parser_gives_its_one_second_series() {
    let text = r#"duration: 4s
volumes:
  - {name: scratch, count: 1, size: 64M}
workloads:
  - name: ticker
    volumes: scratch
    command: [sh, -c, "for i in 1 2 3 4 5 6; do echo 'done 10 ops, 40 KiB'; echo noise; sleep 0.2; done; sleep 1.8"]
    parse: {pattern: 'done (?P<ops>\d+) ops, (?P<write_kib>\d+) KiB'}
"#;
    let (dir, out, _) = run_spec_text(tmp(), text, &["--provider", "null"]);
    let series: Vec<Value> = std::fs::read_to_string(out.join("io.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .filter(|sample: &Value| sample["workload"] == "ticker")
        .collect();
    let sum = |key: &str| -> f64 { series.iter().map(|s| s[key].as_f64().unwrap_or(0.0)).sum() };
    assert_eq!(sum("transactions"), 60.0, "{series:?}");
    assert_eq!(sum("write_kib"), 240.0, "{series:?}");
    let silent = series
        .iter()
        .filter(|s| s["transactions"].as_f64().unwrap_or(0.0) == 0.0)
        .count();
    assert!(silent >= 1, "no silent second counted: {series:?}");
    let summary: Value = serde_json::from_str(&strata_ok(&[
        "bench",
        "report",
        &p(&out),
        "--output",
        "json",
    ]))
    .unwrap();
    let ticker = summary["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["workload"] == "ticker")
        .expect("the command's workload in the summary")
        .clone();
    assert!(ticker["zero_seconds"].as_u64().unwrap() >= 1, "{ticker}");
    assert!(ticker["mean_iops"].as_f64().unwrap() > 0.0, "{ticker}");
    let log = std::fs::read_to_string(out.join("workloads/ticker-0.log")).unwrap();
    assert_eq!(log.matches("noise").count(), 6, "{log}");

    drop(dir);
    let dir = tmp();
    let no_ops = text.replace("(?P<ops>", "(?P<count>");
    assert_refused_at_line(&dir, &no_ops, 5, "names a group `count`");
    let on_fio = text.replace(
        r#"command: [sh, -c, "for i in 1 2 3 4 5 6; do echo 'done 10 ops, 40 KiB'; echo noise; sleep 0.2; done; sleep 1.8"]"#,
        "fio: {rw: read, bs: 4k}",
    );
    assert_refused_at_line(&dir, &on_fio, 5, "`parse:` reads a command's output");
}

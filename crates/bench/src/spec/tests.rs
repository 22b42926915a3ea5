//! The spec's tests: good specs read, bad ones are refused with their
//! line, and the example specs under bench/specs/ stay valid.

use super::*;

/// A good spec: two volume groups, a fio workload, a control operation
/// at a fixed rate (`snaps`) and one in a closed loop (`creates`).
pub(super) const GOOD: &str = "\
duration: 2s
volumes:
  - name: data
    count: 2
    size: 64M
  - name: scratch
    count: 0
    size: 16M
workloads:
  - name: writer
    count: 2
    volumes: data
    fio:
      rw: randwrite
      bs: 4k
      iodepth: 4
control_operations:
  - name: snaps
    action: snapshot
    workload: writer
    select: random
    rate: each-second
  - name: creates
    action: create
    volumes: scratch
    rate: two
rates:
  - name: each-second
    every: 1s
  - name: two
    in_flight: 2
";

#[test]
fn a_good_spec_reads() {
    let spec = parse(GOOD).expect("good spec");
    assert_eq!(spec.duration, Duration::from_secs(2));
    assert_eq!(spec.volumes[0].template, "{group}-{index}");
    assert_eq!(spec.control_operations[0].group, "data");
    assert_eq!(spec.control_operations[1].rate, RateLaw::ClosedLoop(2));
    match &spec.workloads[0].kind {
        WorkloadKind::Fio(options) => assert_eq!(options["iodepth"], "4"),
        other => panic!("not fio: {other:?}"),
    }
}

#[test]
fn ramps_steps_and_traces_read_and_bad_traces_are_refused() {
    let rates = "  - {name: up, ramp: {from: 1s, to: 100ms, over: 30s}}\n  - {name: stairs, steps: [{every: 1s, for: 10s}, {every: 200ms}]}\n  - {name: replay, trace: [0.5, 1.25, 3]}\n";
    let text = GOOD.replacen(
        "    in_flight: 2\n",
        &format!("    in_flight: 2\n{rates}"),
        1,
    );
    parse(&text).expect("ramp, steps and trace");
    let bad = text.replacen("[0.5, 1.25, 3]", "[2, 1]", 1);
    let error = parse(&bad).expect_err("a trace out of order");
    assert_eq!(error.line, 34, "{error}");
    assert!(error.message.contains("in order"), "{error}");
    let open_middle = text.replacen(
        "[{every: 1s, for: 10s}, {every: 200ms}]",
        "[{every: 1s}, {every: 200ms}]",
        1,
    );
    assert!(parse(&open_middle)
        .expect_err("open step first")
        .message
        .contains("only the last"));
    let waves = "  - {name: waves, increase_decrease: {low: 1, high: 10, step: 1, every: 2s}}\n  - {name: recorded, trace_file: arrivals.csv}\n";
    let text = text.replacen(
        "    in_flight: 2\n",
        &format!("    in_flight: 2\n{waves}"),
        1,
    );
    let text = text.replacen("rate: two", "rate: recorded", 1);
    let mut spec = parse(&text).expect("increase_decrease and trace_file");
    assert_eq!(
        spec.control_operations[1].rate,
        RateLaw::TraceFile {
            path: "arrivals.csv".into(),
            line: 33
        }
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    let missing = spec
        .clone()
        .read_trace_files(dir.path())
        .expect_err("no file yet");
    assert_eq!(missing.line, 33, "{missing}");
    assert!(
        missing.message.contains("trace_file") && missing.message.contains("cannot open"),
        "{missing}"
    );
    std::fs::write(dir.path().join("arrivals.csv"), "seconds\n0.5\n2\n").expect("write the trace");
    spec.read_trace_files(dir.path()).expect("the trace reads");
    let ms = Duration::from_millis;
    assert_eq!(
        spec.control_operations[1].rate,
        RateLaw::Trace(vec![ms(500), ms(2000)])
    );
    let upside_down = text.replacen("low: 1, high: 10", "low: 10, high: 1", 1);
    let error = parse(&upside_down).expect_err("low above high");
    assert_eq!(error.line, 32, "{error}");
    assert!(error.message.contains("low at most high"), "{error}");
}

/// Each bad spec is refused with the line to fix and a hint.
#[test]
fn bad_specs_name_their_line() {
    let cases: &[(&str, &str, u64, &str)] = &[
        (
            "      iodepth: 4\n",
            "      iodepth: 4\n    colour: red\n",
            17,
            "unknown field `colour`",
        ),
        (
            "    rate: two\n",
            "    rate: twice\n",
            26,
            "write one of each-second, two",
        ),
        (
            "    every: 1s\n",
            "    every: -1s\n",
            29,
            "negative interval",
        ),
        (
            "    volumes: data\n    fio:",
            "    fio:",
            10,
            "uses no volume: add `volumes: GROUP`",
        ),
        (
            "    action: create\n",
            "    action: explode\n",
            24,
            "unknown variant",
        ),
    ];
    for (from, to, line, hint) in cases {
        let text = GOOD.replacen(from, to, 1);
        let error = parse(&text).expect_err(to);
        assert_eq!(error.line, *line, "{to}: {error}");
        assert!(error.message.contains(hint), "{to}: {error}");
    }
}

/// The example specs under bench/specs/ stay valid and short.
mod example_specs {
    #[test]
    fn every_example_spec_is_valid_and_under_sixty_lines() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/specs");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("bench/specs/") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let text = std::fs::read_to_string(&path).expect("spec");
                assert!(
                    text.lines().count() < 60,
                    "{}: 60 lines or more",
                    path.display()
                );
                if let Err(e) = super::parse(&text) {
                    panic!("{}:{e}", path.display());
                }
                seen += 1;
            }
        }
        assert!(seen >= 3, "only {seen} example specs");
    }
}

/// A file-system group with pgbench and a restore reads with its
/// defaults; the restore's check follows the group's attach mode; names
/// the run keeps for itself cannot be made by a template.
#[test]
fn file_system_groups_pgbench_and_restores_read() {
    let text = "\
duration: 5s
volumes:
  - {name: db, size: 256M, attach: fs}
  - {name: raw, size: 64M}
workloads:
  - {name: bank, volumes: db, pgbench: {clients: 2}}
  - {name: writer, volumes: raw, fio: {rw: randwrite, bs: 4k, verify: crc32c}}
control_operations:
  - {name: check-db, action: restore_and_verify, workload: bank, rate: slow}
  - {name: check-raw, action: restore_and_verify, workload: writer, rate: slow}
  - {name: squash, action: compact, volumes: raw, rate: slow}
rates:
  - {name: slow, every: 2s}
";
    let spec = parse(text).expect("a good spec");
    assert_eq!(spec.volumes[0].attach, Attach::Fs);
    assert_eq!(spec.volumes[1].attach, Attach::Nbd);
    match spec.workloads[0].kind {
        WorkloadKind::Pgbench(options) => assert_eq!((options.scale, options.clients), (1, 2)),
        ref other => panic!("not pgbench: {other:?}"),
    }
    assert_eq!(
        restore_check(&spec.volumes[0], Some(&spec.workloads[0])),
        Some(RestoreCheck::Fsck { pgbench: true })
    );
    match restore_check(&spec.volumes[1], Some(&spec.workloads[1])) {
        Some(RestoreCheck::FioVerify(options)) => {
            assert_eq!(options.keys().collect::<Vec<_>>(), ["bs", "verify"])
        }
        other => panic!("not fio's verify: {other:?}"),
    }
    let mixed = text.replacen("bs: 4k,", "bssplit: 4k/50:64k/50,", 1);
    let error = parse(&mixed).expect_err("mixed block sizes cannot be verified");
    assert_eq!(error.line, 10, "{error}");
    let dashed = text.replacen(
        "{name: raw, size: 64M}",
        "{name: raw, size: 64M, template: \"-{index}\"}",
        1,
    );
    let error = parse(&dashed).expect_err("a template starting with a dash");
    assert!(
        error.message.contains("starting with a letter or digit"),
        "{error}"
    );
}

/// Thresholds read with their bounds; one naming an unknown metric, an
/// operation or workload the spec lacks, or no bound, is refused with
/// its line.
#[test]
fn thresholds_read_and_bad_ones_name_their_line() {
    let thresholds = "thresholds:\n  - {metric: snaps.snapshot.p99_ms, max_ratio: 1.05}\n  - {metric: writer.mean_iops, min_ratio: 0.98}\n  - {metric: \"*.errors\", max: 0}\n  - {metric: setup.create.max_ms, max: 5000}\n";
    let text = format!("{GOOD}{thresholds}");
    let spec = parse(&text).expect("good thresholds");
    assert_eq!(spec.thresholds.len(), 4);
    assert_eq!(spec.thresholds[0].max_ratio, Some(1.05));
    assert_eq!(spec.thresholds[2].pattern, "*.errors");
    let cases: &[(&str, &str, u64, &str)] = &[
        (
            "snaps.snapshot.p99_ms,",
            "snaps.snapshot.p98_ms,",
            33,
            "no metric `p98_ms`",
        ),
        (
            "snaps.snapshot.p99_ms,",
            "snips.snapshot.p99_ms,",
            33,
            "matches none of this spec's metrics",
        ),
        (
            "writer.mean_iops,",
            "writer.p99_ms,",
            34,
            "matches none of this spec's metrics",
        ),
        (
            "min_ratio: 0.98",
            "min_ratio: 2, max_ratio: 1",
            34,
            "lower bound is above",
        ),
        (", max_ratio: 1.05", "", 33, "give a bound"),
        ("max_ratio: 1.05", "most: 1.05", 33, "unknown field `most`"),
    ];
    for (from, to, line, hint) in cases {
        let bad = text.replacen(from, to, 1);
        let error = parse(&bad).expect_err(to);
        assert_eq!(error.line, *line, "{to}: {error}");
        assert!(error.message.contains(hint), "{to}: {error}");
    }
}

/// An HTTP sink's URL reads; one that is not http:// is refused with
/// its line.
#[test]
fn an_http_sink_reads_and_a_bad_url_is_refused() {
    let spec = parse(&format!(
        "{GOOD}outputs: {{http: \"http://127.0.0.1:9/r\"}}\n"
    ))
    .expect("a sink");
    assert_eq!(spec.http_sink.as_deref(), Some("http://127.0.0.1:9/r"));
    let error =
        parse(&format!("{GOOD}outputs:\n  http: https://example.com/\n")).expect_err("https");
    assert_eq!(error.line, 33, "{error}");
    assert!(error.message.contains("write an http:// URL"), "{error}");
}

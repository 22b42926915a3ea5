//! F3's function runner with real agents, real FUSE mounts and real
//! memory cgroups: `strata f3 run` on workflows, the schedulers' choices,
//! parallel and streaming steps, memory limits, warm sandboxes, and the
//! agents' invoke endpoint refusing bad requests. The harness is
//! [`crate::f3::F3`] (the service and agents `a` and `b` on loopback).

use crate::common::{output_text, pattern};
use crate::f3::{http_post, F3};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// `strata f3 run` on `workflow` (written to a file) with `args`; its
/// output, and the JSON report when it printed one.
fn run(
    f3: &F3,
    name: &str,
    workflow: &str,
    args: &[&str],
) -> (std::process::Output, Option<Value>) {
    let file = f3.dir.path().join(format!("{name}.yaml"));
    std::fs::write(&file, workflow).unwrap();
    let file = crate::common::p(&file);
    let mut all = vec!["run", file.as_str(), "--output", "json"];
    all.extend_from_slice(args);
    let out = f3.f3(&all);
    let report = serde_json::from_slice(&out.stdout).ok();
    (out, report)
}

/// [`run`], which must succeed; the report.
fn run_ok(f3: &F3, name: &str, workflow: &str, args: &[&str]) -> Value {
    let (out, report) = run(f3, name, workflow, args);
    assert!(
        out.status.success(),
        "strata f3 run {name}: {}",
        output_text(&out)
    );
    let report = report.expect("a JSON report");
    assert_eq!(report["succeeded"], true, "{report:#}");
    report
}

/// The record of step `step`.
fn record<'a>(report: &'a Value, step: &str) -> &'a Value {
    report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["step"] == step)
        .unwrap_or_else(|| panic!("no record of step {step}: {report:#}"))
}

fn nodes_of(report: &Value) -> Vec<String> {
    report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["node"].as_str().unwrap().to_string())
        .collect()
}

/// A chain of `count` steps, each copying the previous one's output.
fn chain(prefix: &str, count: usize) -> String {
    let mut text = format!(
        "steps:\n  - name: {prefix}0\n    function: [/bin/sh, -c, 'echo start > \
         ${{output.o}}']\n    outputs: {{o: /{prefix}0.eph}}\n"
    );
    for i in 1..count {
        text += &format!(
            "  - name: {prefix}{i}\n    function: [/bin/sh, -c, 'cat ${{input.i}} > \
             ${{output.o}}']\n    inputs: {{i: {{path: /{prefix}{}.eph}}}}\n    outputs: {{o: \
             /{prefix}{i}.eph}}\n",
            i - 1
        );
    }
    text
}

/// The locality scheduler runs a step where its input is and its
/// consumer where the step wrote; round-robin spreads; random repeats
/// with its seed.
#[test]
fn schedulers_place_steps_by_locality_in_turn_and_at_seeded_random() {
    let f3 = F3::up();
    // The seed lives on node b: locality must leave the default (node a,
    // first by name) for it.
    std::fs::write(f3.mount(1).join("seed.eph"), pattern(1 << 20, 3)).unwrap();
    let workflow = "\
steps:
  - name: produce
    function: [/bin/sh, -c, 'cat ${input.seed} ${input.seed} > ${output.data}']
    inputs: {seed: {path: /seed.eph}}
    outputs: {data: /data.eph}
  - name: consume
    function: [/bin/sh, -c, 'wc -c < ${input.data} > ${output.count}']
    inputs: {data: {path: /data.eph}}
    outputs: {count: /count.eph}
";
    let report = run_ok(&f3, "locality", workflow, &[]);
    let (produce, consume) = (record(&report, "produce"), record(&report, "consume"));
    assert_eq!(produce["node"], "b", "{report:#}");
    assert_eq!(consume["node"], "b", "{report:#}");
    assert_eq!(consume["remote_input_bytes"], 0, "{report:#}");
    assert_eq!(consume["input_bytes"], 2 << 20, "{report:#}");
    assert!(
        consume["reason"]
            .as_str()
            .unwrap()
            .contains("holds 2097152 of 2097152"),
        "{report:#}"
    );
    let held = f3.f3_json(&["where", "/data.eph"]);
    assert_eq!(held["nodes"][0]["node"], "b", "{held:#}");
    // Each step is named the producer of its outputs, for loss events.
    let listed = f3.f3_json(&["ls", "/data.eph"]);
    assert_eq!(listed[0]["producer"], "produce", "{listed:#}");
    let listed = f3.f3_json(&["ls", "/count.eph"]);
    assert_eq!(listed[0]["producer"], "consume", "{listed:#}");
    assert_eq!(
        std::fs::read_to_string(f3.mount(0).join("count.eph"))
            .unwrap()
            .trim(),
        "2097152"
    );

    // Run again in turns: `produce` now runs on node a and writes
    // /data.eph anew there (the run removed node b's), `consume` on b.
    let report = run_ok(&f3, "again", workflow, &["--scheduler", "round-robin"]);
    assert_eq!(nodes_of(&report), ["a", "b"], "{report:#}");
    assert_eq!(
        record(&report, "consume")["remote_input_bytes"],
        2 << 20,
        "{report:#}"
    );
    assert_eq!(f3.f3_json(&["where", "/data.eph"])["nodes"][0]["node"], "a");
    assert_eq!(
        std::fs::read_to_string(f3.mount(1).join("count.eph"))
            .unwrap()
            .trim(),
        "2097152"
    );

    let spread = "steps:\n".to_string()
        + &(0..4)
            .map(|i| format!("  - name: rr{i}\n    function: [/bin/sleep, '0.3']\n"))
            .collect::<String>();
    let report = run_ok(&f3, "spread", &spread, &["--scheduler", "round-robin"]);
    let mut nodes = nodes_of(&report);
    nodes.sort();
    assert_eq!(nodes, ["a", "a", "b", "b"], "{report:#}");

    let first = run_ok(
        &f3,
        "random1",
        &chain("r", 8),
        &["--scheduler", "random", "--seed", "7"],
    );
    let again = run_ok(
        &f3,
        "random2",
        &chain("s", 8),
        &["--scheduler", "random", "--seed", "7"],
    );
    assert_eq!(nodes_of(&first), nodes_of(&again));
    assert!(record(&first, "r0")["reason"]
        .as_str()
        .unwrap()
        .contains("seed 7"));
}

/// Independent steps run at once; a streaming consumer starts before
/// its producer ends, on the other node, and reads every byte in order.
#[test]
fn independent_steps_overlap_and_a_streaming_consumer_reads_while_its_producer_writes() {
    let f3 = F3::up();
    let workflow = "\
steps:
  - name: left
    function: [/bin/sleep, '1']
  - name: right
    function: [/bin/sleep, '1']
  - name: writer
    function: [/bin/sh, -c, 'for i in 1 2 3 4 5 6; do echo record $i; sleep 0.25; done > ${output.log}']
    outputs: {log: /stream.eph}
  - name: reader
    function: [/bin/sh, -c, 'cat ${input.log} > ${output.copy}']
    inputs: {log: {path: /stream.eph, stream: true}}
    outputs: {copy: /copy.eph}
";
    let report = run_ok(&f3, "parallel", workflow, &["--scheduler", "round-robin"]);
    let (left, right) = (record(&report, "left"), record(&report, "right"));
    let time = |r: &Value, k: &str| r[k].as_u64().unwrap();
    assert!(
        time(left, "started_ms") < time(right, "ended_ms")
            && time(right, "started_ms") < time(left, "ended_ms"),
        "independent steps ran one after the other: {report:#}"
    );
    let (writer, reader) = (record(&report, "writer"), record(&report, "reader"));
    assert!(
        time(reader, "started_ms") + 500 < time(writer, "ended_ms"),
        "the streaming reader waited for its producer: {report:#}"
    );
    // The writer's sixth record comes at least 1.25 s after its start
    // (five pauses of 0.25 s): a reader that ends before then did not
    // wait at the end of the file for it. (Not the writer's `ended_ms`:
    // the runner takes that when the agent's answer comes, after it
    // has collected the function's output and counters, which may be
    // after the reader's.)
    assert!(
        time(reader, "ended_ms") >= time(writer, "started_ms") + 1250,
        "the reader ended before the last record was written: {report:#}"
    );
    let expected: String = (1..=6).map(|i| format!("record {i}\n")).collect();
    assert_eq!(
        std::fs::read_to_string(f3.mount(0).join("copy.eph")).unwrap(),
        expected
    );
}

/// The cgroup directory agent `pid` of node `name` keeps under the test's
/// own memory cgroup.
fn agent_cgroup(name: &str, pid: u32) -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let own = text
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
            names
                .split(',')
                .any(|n| n == "memory")
                .then(|| path.to_string())
        })
        .expect("a v1 memory cgroup");
    PathBuf::from("/sys/fs/cgroup/memory")
        .join(own.trim_start_matches('/'))
        .join(format!("strata-f3.{name}.{pid}"))
}

/// A step over its memory limit fails the run with the limit named, its
/// dependents are not started, and its sandbox is reusable (warm); a
/// function's second run on a node is warm; an agent's cgroups go when
/// it exits.
#[test]
fn memory_limits_warm_sandboxes_and_cgroups_removed_at_exit() {
    let mut f3 = F3::up();
    let hog = "\
steps:
  - name: hog
    function: [/usr/bin/python3, -c, 'data = b\"x\" * (200 << 20); open(\"${output.o}\", \"w\").write(\"no\")']
    outputs: {o: /hog.eph}
    memory: 32MiB
  - name: after
    function: [/bin/sh, -c, 'cat ${input.h} > ${output.o}']
    inputs: {h: {path: /hog.eph}}
    outputs: {o: /after.eph}
";
    let (out, report) = run(&f3, "hog", hog, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("step `hog` failed") && stderr.contains("memory limit of 33554432 bytes"),
        "{stderr}"
    );
    let report = report.expect("a JSON report");
    let hog_record = record(&report, "hog");
    assert_eq!(hog_record["out_of_memory"], true, "{report:#}");
    assert_eq!(hog_record["outcome"], "failed");
    assert!(hog_record["peak_memory_bytes"].as_u64().unwrap() <= 32 << 20);
    assert_eq!(record(&report, "after")["outcome"], "skipped", "{report:#}");
    let node = hog_record["node"].as_str().unwrap().to_string();
    let index = if node == "a" { 0 } else { 1 };
    // The same function, within its limit now: the OOM-killed sandbox is
    // reused, warm.
    let (status, answer) = http_post(
        &format!("http://{}/v1/invoke", f3.transfer(index)),
        r#"{"function":"hog","argv":["/bin/sh","-c","echo fine"],"memory_bytes":33554432,"timeout_ms":5000}"#,
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["start"], "warm", "{answer}");
    assert_eq!(answer["exit_code"], 0, "{answer}");
    assert_eq!(answer["stdout_tail"], "fine\n");

    let small =
        "steps:\n  - name: small\n    function: [/bin/sh, -c, 'echo hi > ${output.o}']\n    \
                 outputs: {o: /small.eph}\n";
    let first = run_ok(&f3, "small1", small, &[]);
    let second = run_ok(&f3, "small2", small, &[]);
    assert_eq!(record(&first, "small")["start"], "cold", "{first:#}");
    assert_eq!(record(&second, "small")["start"], "warm", "{second:#}");
    assert_eq!(
        record(&second, "small")["node"],
        record(&first, "small")["node"]
    );
    assert!(record(&second, "small")["reason"]
        .as_str()
        .unwrap()
        .contains("warm"));

    let agent = f3.agents[index].1.as_mut().unwrap();
    let cgroup = agent_cgroup(&node, agent.pid());
    assert!(cgroup.join("hog.1").is_dir(), "{}", cgroup.display());
    agent.stop_ok();
    assert!(!cgroup.exists(), "{} left behind", cgroup.display());
}

/// Bad workflows are refused with their line and nothing runs.
#[test]
fn bad_workflows_are_refused_with_lines_and_nothing_runs() {
    let f3 = F3::up();
    let first = "steps:\n  - name: first\n    function: [/bin/sh, -c, 'echo x > \
                 ${output.o}']\n    outputs: {o: /ran.eph}\n";
    let cases = [
        (
            "cycle",
            "  - name: x\n    function: [/bin/true]\n    inputs: {i: {path: /y.eph}}\n    outputs: {o: /x.eph}\n  - name: y\n    function: [/bin/true]\n    inputs: {i: {path: /x.eph}}\n    outputs: {o: /y.eph}\n",
            "line 5",
            "x -> y -> x form a cycle",
        ),
        (
            "unknown",
            "  - name: x\n    function: [/bin/true]\n    memroy: 64MiB\n",
            "line 7",
            "memroy",
        ),
        (
            "nofunction",
            "  - name: x\n    outputs: {o: /x.eph}\n",
            "line 5",
            "has no function",
        ),
        (
            "noinput",
            "  - name: x\n    function: [/bin/true]\n    inputs:\n      i: {path: /nobody/makes.eph}\n",
            "line 8",
            "made by no step and is not in F3",
        ),
    ];
    for (name, steps, line, message) in cases {
        let (out, _) = run(&f3, name, &format!("{first}{steps}"), &[]);
        assert!(!out.status.success(), "{name}: {}", output_text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(line) && stderr.contains(message),
            "{name}: {stderr}"
        );
    }
    let listing = f3.f3(&["ls", "/ran.eph"]);
    assert!(!listing.status.success(), "a refused workflow ran a step");
    for index in 0..2 {
        let status: Value = ureq::get(&format!("http://{}/v1/sandboxes", f3.transfer(index)))
            .call()
            .unwrap()
            .into_json()
            .unwrap();
        assert_eq!(status["warm"], serde_json::json!({}), "{status}");
    }
}

/// The invoke endpoint refuses malformed JSON, oversized argv, unknown
/// fields, a missing executable and a call past its slots, and the agent
/// keeps running; a timeout kills the whole process group; an agent
/// started with --no-cgroups runs functions unmeasured, and says so.
#[test]
fn invoke_endpoint_refuses_bad_requests_and_keeps_running() {
    let mut f3 = F3::up_each(
        &["--slots", "1", "--keep-alive-ms", "1000", "--max-warm", "1"],
        &["--no-cgroups"],
    );
    let sandboxes = |index: usize| -> Value {
        ureq::get(&format!("http://{}/v1/sandboxes", f3.transfer(index)))
            .call()
            .unwrap()
            .into_json()
            .unwrap()
    };
    assert_eq!(sandboxes(0)["cgroups"], "cgroup v1");
    assert_eq!(sandboxes(0)["slots"], 1);
    assert_eq!(sandboxes(1)["cgroups"], "none");
    let (code, answer) = http_post(
        &format!("http://{}/v1/invoke", f3.transfer(1)),
        r#"{"function":"f","argv":["sh","-c","echo $F3_NODE; pwd"],"memory_bytes":33554432,"timeout_ms":5000}"#,
    );
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["peak_memory_bytes"], Value::Null, "{answer}");
    assert_eq!(
        answer["stdout_tail"].as_str().unwrap(),
        format!(
            "b\n{}\n",
            std::fs::canonicalize(f3.mount(1)).unwrap().display()
        )
    );
    let url = format!("http://{}/v1/invoke", f3.transfer(0));
    let (status, answer) = http_post(&url, "{\"function\": ");
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("malformed request"),
        "{answer}"
    );
    let many: Vec<String> = (0..300).map(|i| format!("\"arg{i}\"")).collect();
    let (status, answer) = http_post(
        &url,
        &format!(
            r#"{{"function":"f","argv":["/bin/true",{}],"memory_bytes":33554432,"timeout_ms":1000}}"#,
            many.join(",")
        ),
    );
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("at most 256 words"),
        "{answer}"
    );
    let (status, answer) = http_post(
        &url,
        r#"{"function":"f","argv":["/bin/true"],"memory_bytes":33554432,"timeout_ms":1000,"gpu":1}"#,
    );
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("gpu"),
        "{answer}"
    );
    let (status, answer) = http_post(
        &url,
        r#"{"function":"f","argv":["/no/such/tool","x"],"memory_bytes":33554432,"timeout_ms":1000}"#,
    );
    assert_eq!(status, 404, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("executable \"/no/such/tool\" not found on node a"),
        "{answer}"
    );

    // One slot: a second call while the first runs is refused with 503.
    let slow_url = url.clone();
    let slow = std::thread::spawn(move || {
        http_post(
            &slow_url,
            r#"{"function":"slow","argv":["/bin/sh","-c","sleep 30 & sleep 30"],"memory_bytes":33554432,"timeout_ms":1500}"#,
        )
    });
    std::thread::sleep(Duration::from_millis(500));
    let (status, answer) = http_post(
        &url,
        r#"{"function":"f","argv":["/bin/true"],"memory_bytes":33554432,"timeout_ms":1000}"#,
    );
    assert_eq!(status, 503, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("slots"),
        "{answer}"
    );
    let (status, answer) = slow.join().unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["timed_out"], true, "{answer}");
    let ended = answer["ended_ms"].as_u64().unwrap() - answer["started_ms"].as_u64().unwrap();
    assert!(ended < 5000, "the timeout took {ended} ms: {answer}");
    // Neither sleep survived its group's kill.
    let left = std::process::Command::new("pgrep")
        .args(["-f", "^sleep 30$"])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&left.stdout)
    );

    // At most one warm sandbox (the newest), and none past its keep-alive.
    let cgroups = agent_cgroup("a", f3.agents[0].1.as_ref().unwrap().pid());
    for function in ["k1", "k2"] {
        let (code, answer) = http_post(
            &url,
            &format!(
                r#"{{"function":"{function}","argv":["/bin/true"],"memory_bytes":33554432,"timeout_ms":5000}}"#
            ),
        );
        assert_eq!(code, 200, "{answer}");
    }
    assert_eq!(sandboxes(0)["warm"], serde_json::json!({"k2": 1}));
    assert!(!cgroups.join("slow.1").exists() && !cgroups.join("k1.2").exists());
    assert!(cgroups.join("k2.3").is_dir(), "{}", cgroups.display());
    crate::common::store::wait_until_long(
        "the keep-alive to expire",
        Duration::from_secs(4),
        || sandboxes(0)["warm"] == serde_json::json!({}) && !cgroups.join("k2.3").exists(),
    );
    f3.assert_all_running();
}

//! The steps of the CNSBench experiment scripts (`bench/cns_*.py`) that
//! act on the machine, run for real: the memory group `--memory-limit`
//! puts a provider daemon in, and the pinned pairs of `--duet`.

use std::process::Command;

use serde_json::Value;

use crate::common::{p, tmp};

/// The directory of the bench scripts.
const BENCH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench");

/// Runs a Python driver of the bench scripts; what it printed, as JSON.
fn run_driver(driver: &str) -> Value {
    let out = Command::new("python3")
        .args(["-c", driver])
        .output()
        .expect("python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_slice(&out.stdout).expect("the driver's output as JSON")
}

/// Runs a Python driver of `bench/cns_snapshots.py`, given without its
/// imports: it may use `json`, `os`, `sys` and `cns_snapshots`.
fn run_cns_driver(body: &str) -> Value {
    run_driver(&format!(
        "import json, os, sys\nsys.path.insert(0, {BENCH:?})\nimport cns_snapshots\n{body}"
    ))
}

/// The memory group of `--memory-limit` (`bench/cns_memory.py`): a
/// stand-in for the run starts a "daemon" (a process named `strata`
/// whose first argument is `daemon`, as the volume daemon's is) that
/// waits, then touches 160 MiB. The group adopts the daemon (and only
/// it: the run's own process stays out), holds it under the 48 MiB limit
/// (the limit is hit; its peak stays at the limit), reports the figures,
/// and is gone once closed.
#[test]
fn the_memory_group_adopts_the_daemon_holds_it_to_the_limit_and_is_removed() {
    assert!(
        std::path::Path::new("/sys/fs/cgroup/memory").is_dir(),
        "this test needs the cgroup v1 memory controller at /sys/fs/cgroup/memory"
    );
    let dir = tmp();
    // A copy of python3 named `strata`, run as `strata daemon`: Python
    // runs the file `daemon`, and /proc shows comm `strata` and argv[1]
    // `daemon`.
    let python = String::from_utf8(
        Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3")
            .stdout,
    )
    .unwrap();
    std::fs::copy(python.trim(), dir.path().join("strata")).expect("copying python3");
    std::fs::write(
        dir.path().join("daemon"),
        "import time\ntime.sleep(1)\nheld = [bytearray(1 << 20) for _ in range(160)]\ntime.sleep(0.5)\n",
    )
    .unwrap();
    let driver = format!(
        r#"
import json, os, subprocess, sys
sys.path.insert(0, {bench:?})
from cns_memory import MemoryGroup
group = MemoryGroup(48 << 20)
group.open()
run = subprocess.Popen(["sh", "-c", "./strata daemon; true"], cwd={dir:?})
group.adopt(run)
run.wait()
path = group.path
figures = group.close()
figures["removed"] = not os.path.exists(path)
print(json.dumps(figures))
"#,
        bench = BENCH,
        dir = p(dir.path()),
    );
    let figures = run_driver(&driver);
    assert_eq!(figures["daemons"], 1, "{figures}");
    assert!(figures["limit_hits"].as_u64().unwrap() > 0, "{figures}");
    let peak = figures["mem_max_mib"].as_u64().unwrap();
    assert!((8..=48).contains(&peak), "peak {peak} MiB: {figures}");
    assert_eq!(figures["removed"], true, "{figures}");
}

/// A stand-in for `strata` in the duet test: `bench run` records the
/// cores it may use, when it ran and whether its spec takes snapshots;
/// `bench report` answers with the summary the script reads.
const STAND_IN: &str = r#"#!/usr/bin/env python3
import json, os, sys, time
args = sys.argv[1:]
if args[:2] == ["bench", "run"]:
    out = args[args.index("--out") + 1]
    os.makedirs(out, exist_ok=True)
    start = time.time()
    time.sleep(1.5)
    probe = {"cpus": sorted(os.sched_getaffinity(0)), "start": start, "end": time.time(),
             "snapshots": "control_operations" in open(args[2]).read()}
    with open(os.path.join(out, "probe.json"), "w") as f:
        json.dump(probe, f)
elif args[:2] == ["bench", "report"]:
    print(json.dumps({"workloads": [{"workload": "ycsb-a", "mean_iops": 1000.0,
                                     "min_iops": 900.0, "zero_seconds": 0}],
                      "operations": []}))
else:
    sys.exit(2)
"#;

/// `--duet` (`bench/cns_snapshots.py`): each round runs the pair at once,
/// the side with snapshots and the side without each pinned to its own
/// one core (what the run starts inherits it), and the next round swaps
/// the cores. Two rounds against a stand-in `strata` that records its
/// affinity and when it ran; and the loss per two rounds, which takes
/// the cores' difference out.
#[test]
fn a_duet_runs_the_pair_at_once_on_one_core_each_and_swaps_the_cores() {
    let dir = tmp();
    let strata = dir.path().join("strata");
    std::fs::write(&strata, STAND_IN).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&strata, std::fs::Permissions::from_mode(0o755)).unwrap();
    let driver = format!(
        r#"
import argparse
opts = argparse.Namespace(strata={strata:?}, duration="2s", experiment="fio",
                          restore_every=10, memory_limit=None, keep={dir:?},
                          calibrate=False, snapshot_every=30)
cores = cns_snapshots.duet_cores()
rounds = []
for round_ in range(2):
    pair = cns_snapshots.run_duet(opts, {dir:?}, "strata-4k", round_, cores)
    sides = []
    for snapshots, result in pair:
        mode = "snap" if snapshots else "base"
        out = os.path.join({dir:?}, f"strata-4k-{{mode}}-{{round_}}-cpu{{result['cpu']}}")
        with open(os.path.join(out, "probe.json")) as f:
            probe = json.load(f)
        sides.append({{"snapshots": snapshots, "cpu": result["cpu"],
                      "core_busy": result["core_busy"], **probe}})
    rounds.append(sides)
# Two rounds on cores 5% apart, each side faster on one of them, and a
# true loss of 1% then 3%: the cores' difference cancels.
base = [{{"iops": 100.0}}] * 4
snap = [{{"iops": 99 * 1.05}}, {{"iops": 99 / 1.05}}, {{"iops": 97 * 1.05}}, {{"iops": 97 / 1.05}}]
balanced = cns_snapshots.core_balanced_losses(base, snap)
print(json.dumps({{"rounds": rounds, "balanced": balanced}}))
"#,
        strata = p(&strata),
        dir = p(dir.path()),
    );
    let printed = run_cns_driver(&driver);
    let balanced: Vec<f64> = serde_json::from_value(printed["balanced"].clone()).unwrap();
    assert!(
        balanced.len() == 2
            && (balanced[0] - 0.01).abs() < 1e-9
            && (balanced[1] - 0.03).abs() < 1e-9,
        "the core-balanced losses should be 1% and 3%: {balanced:?}"
    );
    let rounds = &printed["rounds"];
    let mut snapshot_cores = Vec::new();
    for sides in rounds.as_array().unwrap() {
        let [snap, base] = [&sides[0], &sides[1]];
        // The run with snapshots took them, its pair did not.
        assert_eq!(snap["snapshots"], true, "{sides}");
        assert_eq!(base["snapshots"], false, "{sides}");
        // Each side may use exactly the one core it was given, and the two
        // differ; each says how busy its core was (a share of its time).
        for side in [snap, base] {
            assert_eq!(side["cpus"], serde_json::json!([side["cpu"]]), "{sides}");
            let busy = side["core_busy"].as_f64();
            assert!(busy.is_some_and(|b| (0.0..=1.0).contains(&b)), "{sides}");
        }
        assert_ne!(snap["cpu"], base["cpu"], "{sides}");
        // They ran at once: each started before the other ended.
        let time = |side: &Value, key: &str| side[key].as_f64().unwrap();
        assert!(
            time(snap, "start") < time(base, "end") && time(base, "start") < time(snap, "end"),
            "the pair did not overlap: {sides}"
        );
        snapshot_cores.push(snap["cpu"].clone());
    }
    assert_ne!(
        snapshot_cores[0], snapshot_cores[1],
        "the cores were not swapped: {rounds}"
    );
}

/// `--snapshot-every` (`bench/cns_snapshots.py`): the pgbench spec's
/// snapshots come at that interval, and the restores still follow every
/// Nth snapshot by a second; without snapshots the spec has no control
/// operations at all.
#[test]
fn the_pgbench_spec_takes_snapshots_at_the_interval_asked() {
    let driver = r#"
import argparse
opts = argparse.Namespace(experiment="pgbench", duration="2m", snapshot_every=5, restore_every=10)
print(json.dumps({"snap": cns_snapshots.spec_text(opts, "64k", True),
                  "base": cns_snapshots.spec_text(opts, "64k", False)}))
"#;
    let printed = run_cns_driver(driver);
    let snap = printed["snap"].as_str().unwrap();
    let base = printed["base"].as_str().unwrap();
    assert!(
        snap.contains("{name: snapshot-rate, every: 5s}")
            && snap.contains("{name: restores, every: 51s}")
            && snap.contains("cluster_size: 64k"),
        "{snap}"
    );
    assert!(!base.contains("control_operations"), "{base}");
}

/// The write costs of a run (`bench/cns_snapshots.py`), from its scraped
/// `metrics.jsonl`: the counters' growth between the first and the last
/// scrape, summed over volumes. Flushes count only the `flush` series of
/// the latency histogram, whose mean is its sum over its count; the other
/// operations' series and the writes' kinds stay apart.
#[test]
fn the_write_costs_count_flushes_and_their_mean_time_from_the_scrapes() {
    let dir = tmp();
    let driver = format!(
        r#"
def line(time, metric, value, **labels):
    return json.dumps({{"time": time, "metric": metric, "labels": labels, "value": value}})
lines = []
for time, scale in ((1.0, 0), (9.0, 1)):
    for volume in ("a", "b"):
        lines += [
            line(time, "strata_volume_op_latency_seconds_count", 5 + 100 * scale, volume=volume, op="flush"),
            line(time, "strata_volume_op_latency_seconds_sum", 1.0 + 0.03 * scale, volume=volume, op="flush"),
            line(time, "strata_volume_op_latency_seconds_count", 7 + 900 * scale, volume=volume, op="write"),
            line(time, "strata_volume_op_latency_seconds_sum", 2.0 + 9.0 * scale, volume=volume, op="write"),
            line(time, "strata_volume_cluster_writes_total", 10 + 40 * scale, volume=volume, kind="allocating"),
            line(time, "strata_volume_cluster_write_seconds_total", 0.5 + 0.002 * scale, volume=volume, kind="allocating"),
            line(time, "strata_volume_cluster_writes_total", 20 + 400 * scale, volume=volume, kind="in_place"),
            line(time, "strata_volume_cluster_write_seconds_total", 0.1 + 0.004 * scale, volume=volume, kind="in_place"),
        ]
with open(os.path.join({dir:?}, "metrics.jsonl"), "w") as f:
    f.write("\n".join(lines) + "\n")
print(json.dumps(cns_snapshots.write_costs({dir:?})))
"#,
        dir = p(dir.path()),
    );
    let costs = run_cns_driver(&driver);
    // Two volumes, each 100 flushes taking 30 ms together: 300 µs each.
    assert_eq!(costs["flushes"], 200, "{costs}");
    assert_eq!(costs["flush_us"], 300.0, "{costs}");
    assert_eq!(costs["allocating_writes"], 80, "{costs}");
    assert_eq!(costs["allocating_us"], 50.0, "{costs}");
    assert_eq!(costs["in_place_writes"], 800, "{costs}");
    assert_eq!(costs["in_place_us"], 10.0, "{costs}");
}

/// How busy a duet side's core was (`bench/cns_snapshots.py`), from two
/// readings of /proc/stat: the ticks of that core's line alone, busy
/// being all but idle and I/O wait, and guest time left out (user time
/// counts it already). A core missing from the file is an error.
#[test]
fn a_cores_busy_share_counts_all_but_idle_and_io_wait_of_that_core() {
    let dir = tmp();
    let driver = format!(
        r#"
def stat(name, cpu1):
    path = os.path.join({dir:?}, name)
    with open(path, "w") as f:
        f.write("cpu  900 0 900 900 90 0 9 0 0 0\n")
        f.write("cpu0 500 0 500 500 50 0 5 0 0 0\n")
        f.write("cpu1 " + " ".join(str(t) for t in cpu1) + "\n")
        f.write("intr 12345\n")
    return path
# user nice system idle iowait irq softirq steal guest guest_nice
before = cns_snapshots.core_ticks(1, stat("before", [100, 0, 100, 100, 10, 0, 10, 0, 50, 0]))
after = cns_snapshots.core_ticks(1, stat("after", [400, 10, 450, 150, 40, 0, 40, 10, 300, 0]))
try:
    cns_snapshots.core_ticks(7, stat("before", [1] * 10))
    missing = None
except SystemExit as e:
    missing = str(e)
print(json.dumps({{"before": before, "after": after,
                  "busy": cns_snapshots.busy_fraction(before, after),
                  "idle": cns_snapshots.busy_fraction(after, after),
                  "missing": missing}}))
"#,
        dir = p(dir.path()),
    );
    let printed = run_cns_driver(&driver);
    // Busy: user + nice + system + irq + softirq + steal; guest left out.
    assert_eq!(
        printed["before"],
        serde_json::json!([210, 320]),
        "{printed}"
    );
    assert_eq!(
        printed["after"],
        serde_json::json!([910, 1100]),
        "{printed}"
    );
    // 700 busy ticks of 780: idle 50 and I/O wait 30 make the rest.
    assert_eq!(printed["busy"], 0.897, "{printed}");
    assert_eq!(printed["idle"], Value::Null, "{printed}");
    assert!(
        printed["missing"]
            .as_str()
            .is_some_and(|m| m.contains("cpu7")),
        "{printed}"
    );
}

/// `bench/alloc_flush_floor.py`: every sequence is timed and "in place"
/// is the 1.00× the others are against (which is the cheaper is the
/// machine's to say: on tmpfs a flush costs nothing), no test file is
/// left behind, and a count it cannot hold is refused.
#[test]
fn the_flush_floor_times_every_sequence_and_leaves_no_file() {
    let dir = tmp();
    let floor = |args: &[&str]| {
        Command::new("python3")
            .arg(format!("{BENCH}/alloc_flush_floor.py"))
            .args(["--dir", &p(dir.path())])
            .args(args)
            .output()
            .expect("python3")
    };
    let out = floor(&["--count", "40", "--repeat", "1"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let micros = |name: &str| -> f64 {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {name} |")))
            .unwrap_or_else(|| panic!("no row for {name}: {stdout}"));
        row.split('|').nth(2).unwrap().trim().parse().unwrap()
    };
    assert!(
        stdout.contains("| in place | ") && stdout.contains(" | 1.00× |"),
        "{stdout}"
    );
    for name in [
        "into a hole",
        "in place, then metadata",
        "allocating, ordered",
        "allocating, unordered",
    ] {
        assert!(micros(name) > 0.0, "{stdout}");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
    let refused = floor(&["--count", "0"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--count 0: give 1 to 20000"),
        "{refused:?}"
    );
}

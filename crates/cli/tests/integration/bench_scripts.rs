//! The steps of the CNSBench experiment scripts (`bench/cns_*.py`) that
//! act on the machine, run for real: the memory group `--memory-limit`
//! puts a provider daemon in.

use std::process::Command;

use serde_json::Value;

use crate::common::{p, tmp};

/// The directory of the bench scripts.
const BENCH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench");

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
    let out = Command::new("python3")
        .args(["-c", &driver])
        .output()
        .expect("python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let figures: Value = serde_json::from_slice(&out.stdout).expect("the figures as JSON");
    assert_eq!(figures["daemons"], 1, "{figures}");
    assert!(figures["limit_hits"].as_u64().unwrap() > 0, "{figures}");
    let peak = figures["mem_max_mib"].as_u64().unwrap();
    assert!((8..=48).contains(&peak), "peak {peak} MiB: {figures}");
    assert_eq!(figures["removed"], true, "{figures}");
}

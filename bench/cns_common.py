"""What the CNSBench experiment scripts (bench/cns_*.py) share: one
`strata bench run` and its report."""

import json
import os
import subprocess
import sys


def failures(out):
    """The errors of the run's failed records (a run that exits 1 has some)."""
    errors = []
    path = os.path.join(out, "records.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                if record.get("status") == "failed":
                    errors.append(f"{record.get('operation')}: {record.get('error')}")
    return errors


def run_and_report(strata, args, out, label, group=None, cpu=None):
    """Runs `strata bench run ARGS --out OUT`; returns its failed records'
    errors and `strata bench report OUT --output json`. Exit 1 (the run
    went on, but an operation failed) is kept, with the failures named;
    anything else is a run that did not happen, and ends the script.
    With `group` (a cns_memory.MemoryGroup, opened), the run's provider
    daemon is moved into it as soon as it starts. With `cpu`, the run and
    everything it starts (the daemon, fio, PostgreSQL) inherit an affinity
    to that one core (taskset)."""
    pin = ["taskset", "--cpu-list", str(cpu)] if cpu is not None else []
    process = subprocess.Popen([*pin, strata, "bench", "run", *args, "--out", out],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if group:
        group.adopt(process)
    _, stderr = process.communicate()
    if process.returncode not in (0, 1):
        raise SystemExit(f"{label}: strata bench run failed:\n{stderr[-3000:]}")
    failed = failures(out)
    for error in failed[:3]:
        print(f"  {label} failed: {error}", file=sys.stderr)
    report = subprocess.run([strata, "bench", "report", out, "--output", "json"],
                            capture_output=True, text=True, check=True)
    return failed, json.loads(report.stdout)

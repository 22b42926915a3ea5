#!/usr/bin/env python3
"""Experiment 4 of issue 29 (CNSBench): mixes of workloads, and who
interferes with whom, as repeated, interleaved runs.

Three kinds of workload share the machine: fio (random 50% reads, 4 KiB,
16 deep, over NBD on a volume of its own), pgbench (scale 10, 4 clients,
PostgreSQL on ext4 on a volume of its own) and a CPU-bound job (zeros
hashed by md5sum, as fast as it goes; its rate is the bytes dd reports).
The full mix runs 2/2/2 instances (fio/pgbench/CPU); each other mix drops
one instance of one kind (1/2/2, 2/1/2, 2/2/1). Every round runs every
mix, in an order rotated round to round.

Reported (medians over rounds): each kind's throughput per instance in
each mix (fio IOPS, pgbench transactions per second, CPU job MB/s), and
its change against the full mix: dropping a kind's instance and seeing
another kind speed up says the dropped kind interfered with it.

Usage (as root: NBD exports, mounts, PostgreSQL as nobody):
    python3 bench/cns_mixes.py --duration 1m --repeat 3
    python3 bench/cns_mixes.py --duration 20s --repeat 1 --provider qemu
"""

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile

from cns_common import run_and_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("fio", "pgbench", "cpu")
MIXES = ((2, 2, 2), (1, 2, 2), (2, 1, 2), (2, 2, 1))

SPEC = """\
duration: {seconds}s
volumes:
  - {{name: fio-vol, count: {fio}, size: 4G}}
  - {{name: pg-vol, count: {pgbench}, size: 2G, attach: fs}}
  - {{name: cpu-vol, count: {cpu}, size: 64M}}
workloads:
  - name: fio
    count: {fio}
    volumes: fio-vol
    fio: {{rw: randrw, rwmixread: 50, bs: 4k, iodepth: 16, size: 2G, direct: 1}}
  - name: pgbench
    count: {pgbench}
    volumes: pg-vol
    pgbench: {{scale: 10, clients: 4}}
  # The volume is unused: every workload names one.
  - name: cpu
    count: {cpu}
    volumes: cpu-vol
    command: [sh, -c, "timeout -s INT {seconds} dd if=/dev/zero bs=64k | md5sum"]
"""


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strata", default=os.path.join(ROOT, "target/release/strata"))
    parser.add_argument("--duration", default="1m", help="per run: Ns or Nm")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--provider", default="strata", choices=("strata", "qemu"))
    parser.add_argument("--keep", help="keep the run directories here")
    parser.add_argument("--json", help="write the results here too")
    return parser.parse_args()


def seconds(text):
    match = re.fullmatch(r"(\d+)([sm])", text)
    if not match:
        raise SystemExit(f"--duration {text}: give seconds or minutes, such as 30s or 2m")
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1)


def cpu_rates(out, count, seconds_run):
    """MB/s of each CPU job, from dd's summary in its log: the bytes and
    time it states, else (a summary cut short by the signal) its records
    out of 64 KiB over the time it was given."""
    rates = []
    for instance in range(count):
        path = os.path.join(out, "workloads", f"cpu-{instance}.log")
        with open(path) as f:
            text = f.read()
        copied = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", text)
        records = re.search(r"(\d+)\+\d+ records out", text)
        if copied:
            rates.append(int(copied.group(1)) / float(copied.group(2)) / 1e6)
        elif records:
            rates.append(int(records.group(1)) * 65536 / seconds_run / 1e6)
        else:
            raise SystemExit(f"{path}: no dd summary in:\n{text[-2000:]}")
    return rates


def run_one(opts, work, mix, round_):
    counts = dict(zip(KINDS, mix))
    name = "-".join(str(n) for n in mix)
    spec = os.path.join(work, f"mix-{name}.yaml")
    with open(spec, "w") as f:
        f.write(SPEC.format(seconds=seconds(opts.duration), **counts))
    out = os.path.join(work, f"mix-{name}-{round_}")
    args = [spec, "--seed", str(round_ + 1), "--provider", opts.provider]
    failed, summary = run_and_report(opts.strata, args, out, f"mix {name}")
    workloads = {w["workload"]: w for w in summary["workloads"]}
    result = {
        "fio": workloads["fio"]["mean_iops"] / counts["fio"],
        "pgbench": workloads["pgbench"]["mean_iops"] / counts["pgbench"],
        "cpu": statistics.mean(cpu_rates(out, counts["cpu"], seconds(opts.duration))),
        "zero_seconds": sum(w["zero_seconds"] for w in workloads.values()),
        "failed": len(failed),
    }
    if not opts.keep:
        shutil.rmtree(out, ignore_errors=True)
    return result


def main():
    opts = parse_args()
    seconds(opts.duration)
    work = opts.keep or tempfile.mkdtemp(prefix="cns-mixes-")
    os.makedirs(work, exist_ok=True)
    results = {mix: [] for mix in MIXES}
    try:
        for round_ in range(opts.repeat):
            shift = round_ % len(MIXES)
            for mix in MIXES[shift:] + MIXES[:shift]:
                result = run_one(opts, work, mix, round_)
                results[mix].append(result)
                print(f"round {round_ + 1} mix {mix} {json.dumps(result)}", flush=True)
    finally:
        if not opts.keep:
            shutil.rmtree(work, ignore_errors=True)
    full = MIXES[0]
    median = {mix: {k: statistics.median(r[k] for r in runs) for k in KINDS + ("zero_seconds",)}
              for mix, runs in results.items()}
    print(f"\n{opts.provider}, medians of {opts.repeat} rounds, {opts.duration} a run;"
          " per instance (change against 2/2/2)")
    print("| mix fio/pgbench/cpu | fio IOPS | pgbench tps | CPU job MB/s | zero-op seconds |")
    print("|---|---|---|---|---|")
    for mix in MIXES:
        cells = []
        for kind in KINDS:
            value, base = median[mix][kind], median[full][kind]
            change = "" if mix == full else f" ({100 * (value / base - 1):+.1f}%)"
            cells.append(f"{value:,.0f}{change}")
        print(f"| {'/'.join(map(str, mix))} | {' | '.join(cells)} | {median[mix]['zero_seconds']:.0f} |")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"/".join(map(str, m)): runs for m, runs in results.items()}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

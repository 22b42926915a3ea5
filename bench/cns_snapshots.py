#!/usr/bin/env python3
"""Experiments 2 and 3 of issue 29 (CNSBench): snapshots under load, as
repeated, interleaved runs.

Experiment 2 (`--experiment fio`, the default): three volumes, each under fio emulating YCSB-A (random 50% reads, 4 KiB,
zipf 0.99), with a snapshot of one of them at random every 10 s (each
about every 30 s) and the oldest deleted every minute, against the same
spec without control operations. Variants: Strata with 4 KiB and with
64 KiB clusters, and QEMU (qemu-storage-daemon, qcow2, external
snapshots over QMP). Each round runs every variant with and without
snapshots, the order of the pair alternating from round to round, so
that each pair sees the same machine.

Experiment 3 (`--experiment pgbench`): PostgreSQL under pgbench (scale
10, 4 clients) on ext4 on one 2 GiB volume (nbdfuse, a loop device), a
snapshot every 30 s, and a restore-and-verify of the newest snapshot
after every --restore-every-th (the clone's ext4 checked with fsck,
PostgreSQL started on it and pgbench's balances checked against its
history), against the same spec without control operations.

Reported per variant (medians over rounds): mean IOPS (transactions per
second for pgbench) with and without snapshots and the loss (1 -
with/without, per round, then the median), the lowest one-second figure,
zero-operation seconds, the snapshot calls' p50 / p99 / max latency,
for pgbench the restores that passed and failed (summed over rounds),
the provider daemon's CPU time per operation with and without snapshots
and its growth (per round, then the median: a figure far less noisy than
the rate on a shared machine), and for Strata the writes that allocated in the top layer with and
without snapshots and their mean time against a write in place (from the
daemon's strata_volume_cluster_writes_total and
strata_volume_cluster_write_seconds_total), and the flushes' mean time
with and without snapshots (from strata_volume_op_latency_seconds: a
flush after allocating writes writes their metadata and waits for the
disk twice).

In a duet, each run's line also has core_busy: the share of its core's
time (setup included) that was neither idle nor waiting for I/O, from
/proc/stat. pgbench's sides run at about 0.9, never idle, the rest
waiting for I/O: bound by the CPU of their core.

--duet runs each round's pair at once instead of one after the other
("duet benchmarking", Bulej et al., ICPE 2020): the run with snapshots
on one core and the run without on the other, each run and everything
it starts (its own daemon, fio, PostgreSQL) pinned to its core, the
cores swapped every round. Whatever else the shared machine does at
that moment slows both runs of the pair alike, so their ratio keeps
much less of it than two runs minutes apart. The pair still shares the
disk and the page cache, so a snapshot's syncs may slow the other run
as well: if anything, the loss reads low by that much. --calibrate
runs duets without snapshots on either side: their "loss" is the
method's own spread (the two cores' difference and what is left of the
machine's noise), the resolution any loss measured this way has. A duet
run also reports its losses per two rounds taken together (1 - the
geometric mean of their ratios), which cancels a difference between
the two cores, since the sides swap cores between the two.

Before the first round, --warm-up runs (default 1) of the first variant
without snapshots warm the machine and are not counted: the first run of
a session ran slower than the rest.

Usage (as root: the volumes' NBD exports, fio, mounts):
    python3 bench/cns_snapshots.py --duration 2m --repeat 3
    python3 bench/cns_snapshots.py --duration 20s --repeat 1 --variants strata-64k
    python3 bench/cns_snapshots.py --experiment pgbench --duration 3m --restore-every 2
    python3 bench/cns_snapshots.py --duet --experiment pgbench --snapshot-every 5 --restore-every 1000 --variants strata-64k
    python3 bench/cns_snapshots.py --variants strata-4k --memory-limit 3G
    python3 bench/cns_snapshots.py --duet --duration 60s --repeat 6 --variants strata-4k,strata-64k
    python3 bench/cns_snapshots.py --duet --calibrate --duration 60s --repeat 4 --variants strata-4k

--snapshot-every SECONDS (pgbench only; default 30, the target's
interval) takes snapshots more often: with six times as many, a cost
paid per snapshot grows sixfold, and the cost of writing into a fresh
layer grows much less.

--memory-limit SIZE runs each provider daemon (Strata's volume daemon,
qemu-storage-daemon) in a cgroup v1 memory group with that limit, as a
container would (`max`: a group without a limit, to see what runs grow
to); each run's line then shows the group's peak memory (mem_max_mib),
its major faults (pgmajfault), how often it hit the limit (limit_hits)
and the machine's disk reads during the run (disk_read_mib), so that a
limit that thrashes shows.

Targets (issue 29): with a snapshot every 30 s, Strata loses at most 2%
of pgbench's and fio's throughput and has no zero-operation second, with
QEMU's figure in the same run; restore-and-verify passes for every
snapshot taken under load.
"""

import argparse
import concurrent.futures
import json
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile

from cns_common import run_and_report
from cns_memory import MemoryGroup, parse_size

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VARIANTS = {
    "strata-4k": ("strata", "4k"),
    "strata-64k": ("strata", "64k"),
    "qemu": ("qemu", None),
}

SPEC = """\
duration: {duration}
volumes:
  - name: db
    count: 3
    size: 4G
{cluster}workloads:
  - name: ycsb-a
    count: 3
    volumes: db
    fio:
      rw: randrw
      rwmixread: 50
      bs: 4k
      iodepth: 16
      random_distribution: zipf:0.99
      size: 2G
      direct: 1
"""

CONTROL = """\
control_operations:
  - name: snapshots
    action: snapshot
    workload: ycsb-a
    select: random
    rate: every-10s
  - name: prune
    action: delete_snapshot
    workload: ycsb-a
    select: oldest
    rate: every-minute
rates:
  - name: every-10s
    every: 10s
  - name: every-minute
    every: 1m
"""


PGBENCH_SPEC = """\
duration: {duration}
volumes:
  - name: db
    count: 1
    size: 2G
    attach: fs
{cluster}workloads:
  - name: bank
    volumes: db
    pgbench: {{scale: 10, clients: 4}}
"""

PGBENCH_CONTROL = """\
control_operations:
  - {{name: snapshots, action: snapshot, workload: bank, rate: snapshot-rate}}
  - {{name: restores, action: restore_and_verify, workload: bank, select: newest, rate: restores}}
rates:
  - {{name: snapshot-rate, every: {snapshot_seconds}s}}
  - {{name: restores, every: {restore_seconds}s}}
"""

# The spec, its control operations and the workload reported, per experiment.
EXPERIMENTS = {
    "fio": (SPEC, CONTROL, "ycsb-a"),
    "pgbench": (PGBENCH_SPEC, PGBENCH_CONTROL, "bank"),
}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strata", default=os.path.join(ROOT, "target/release/strata"))
    parser.add_argument("--duration", default="2m")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated, of " + ", ".join(VARIANTS))
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), default="fio")
    parser.add_argument("--restore-every", type=int, default=10,
                        help="pgbench: restore the newest snapshot after every Nth")
    parser.add_argument("--snapshot-every", type=int, default=30, metavar="SECONDS",
                        help="pgbench: seconds between snapshots (the target's figure is 30; a"
                             " shorter interval magnifies each snapshot's cost)")
    parser.add_argument("--memory-limit",
                        help="run each provider daemon in a memory cgroup of this size"
                             " (e.g. 3G; max: no limit, figures only)")
    parser.add_argument("--warm-up", type=int, default=1, metavar="RUNS",
                        help="runs of the first variant without snapshots before the first"
                             " round, not counted (0: none)")
    parser.add_argument("--duet", action="store_true",
                        help="run each pair at once, each on its own core, the cores swapped"
                             " every round")
    parser.add_argument("--calibrate", action="store_true",
                        help="with --duet: no snapshots on either side of the pair, to measure"
                             " the method's own spread")
    parser.add_argument("--keep", help="keep the run directories here")
    parser.add_argument("--json", help="write the results here too")
    return parser.parse_args()


def spec_text(opts, cluster, snapshots):
    spec, control, _ = EXPERIMENTS[opts.experiment]
    cluster_line = f"    cluster_size: {cluster}\n" if cluster else ""
    text = spec.format(duration=opts.duration, cluster=cluster_line)
    # One second after every Nth snapshot, so that it is there to restore.
    restore_seconds = opts.snapshot_every * opts.restore_every + 1
    control = control.format(restore_seconds=restore_seconds, snapshot_seconds=opts.snapshot_every)
    return text + (control if snapshots else "")


def run_one(opts, work, variant, snapshots, round_, tag=None, cpu=None):
    provider, cluster = VARIANTS[variant]
    mode = "snap" if snapshots else "base"
    # Each side of a duet writes its own spec: the two run at once.
    side = "" if cpu is None else f"-cpu{cpu}"
    spec = os.path.join(work, f"{variant}-{mode}{side}.yaml")
    with open(spec, "w") as f:
        f.write(spec_text(opts, cluster, snapshots))
    out = os.path.join(work, f"{variant}-{mode}-{tag or round_}{side}")
    args = [spec, "--seed", str(round_ + 1)]
    if provider != "strata":
        args += ["--provider", provider]
    group = None
    if opts.memory_limit:
        group = MemoryGroup(parse_size(opts.memory_limit))
        group.open()
    core_before = core_ticks(cpu) if cpu is not None else None
    try:
        failed, summary = run_and_report(opts.strata, args, out, f"{variant} {mode}", group, cpu)
    finally:
        memory = group.close() if group else {}
    core_after = core_ticks(cpu) if cpu is not None else None
    name = EXPERIMENTS[opts.experiment][2]
    workload = next(w for w in summary["workloads"] if w["workload"] == name)
    snaps = next((o for o in summary["operations"] if o["operation"] == "snapshots"), None)
    restores = next((o for o in summary["operations"] if o["operation"] == "restores"), None)
    result = {
        "iops": workload["mean_iops"],
        "min_iops": workload["min_iops"],
        "zero_seconds": workload["zero_seconds"],
        "failed": len(failed),
        **memory,
    }
    if snaps:
        result.update(snapshots=snaps["ok"], snapshot_errors=snaps["errors"],
                      p50_ms=snaps["p50_ms"], p99_ms=snaps["p99_ms"], max_ms=snaps["max_ms"])
    if restores:
        result.update(restores_ok=restores["ok"], restores_failed=restores["errors"])
    result.update(write_costs(out))
    result.update(daemon_cpu(out, workload["mean_iops"]))
    if cpu is not None:
        result["cpu"] = cpu
        result["core_busy"] = busy_fraction(core_before, core_after)
    if not opts.keep:
        shutil.rmtree(out, ignore_errors=True)
    return result


def core_ticks(cpu, stat="/proc/stat"):
    """Clock ticks core `cpu` has spent so far, as (busy, total): busy is
    everything but idle and I/O wait. Guest time is left out, as user
    time already counts it."""
    with open(stat) as f:
        for line in f:
            fields = line.split()
            if fields and fields[0] == f"cpu{cpu}":
                # user nice system idle iowait irq softirq steal [guest guest_nice]
                ticks = [int(x) for x in fields[1:9]]
                total = sum(ticks)
                return total - ticks[3] - ticks[4], total
    raise SystemExit(f"{stat} has no line for cpu{cpu}")


def busy_fraction(before, after):
    """How busy a core was between two core_ticks readings (0 to 1), or
    None if no tick passed. In a duet every process of a side runs on its
    core: near 1, the side is bound by that core's CPU, and a loss
    measures the CPU that the snapshots' work costs, not waiting."""
    total = after[1] - before[1]
    return round((after[0] - before[0]) / total, 3) if total > 0 else None


def write_costs(out):
    """What the Strata daemon's /metrics (scraped into the run's
    metrics.jsonl) say of the run's writes: how many allocated in the top
    layer and how many went in place, and their mean times; and of its
    flushes: how many, and their mean time. A snapshot
    makes the next write to each cluster allocate, so the difference
    between a pair of runs counts the work snapshots added, without the
    run-to-run noise of comparing two runs' IOPS. (Their times are not
    turned into a throughput loss: under load most of an allocating
    write's extra time is a wait for the volume's writer lock, during
    which the cores serve other requests.) Empty for providers without
    the series."""
    path = os.path.join(out, "metrics.jsonl")
    first, last = {}, {}
    try:
        with open(path) as f:
            for line in f:
                sample = json.loads(line)
                metric = sample["metric"]
                labels = sample.get("labels", {})
                if metric in ("strata_volume_op_latency_seconds_sum",
                              "strata_volume_op_latency_seconds_count"):
                    if labels.get("op") != "flush":
                        continue
                    kind = "flush"
                elif metric in ("strata_volume_cluster_writes_total",
                                "strata_volume_cluster_write_seconds_total"):
                    kind = labels.get("kind")
                else:
                    continue
                key = (metric, labels.get("volume"), kind)
                first.setdefault(key, sample["value"])
                last[key] = sample["value"]
    except FileNotFoundError:
        return {}
    def total(metric, kind):
        return sum(last[k] - first[k] for k in last if k[0] == metric and k[2] == kind)
    writes = {kind: total("strata_volume_cluster_writes_total", kind)
              for kind in ("allocating", "in_place")}
    seconds = {kind: total("strata_volume_cluster_write_seconds_total", kind)
               for kind in ("allocating", "in_place")}
    if not writes["allocating"] and not writes["in_place"]:
        return {}
    mean = {kind: seconds[kind] / writes[kind] if writes[kind] else 0.0 for kind in writes}
    flushes = total("strata_volume_op_latency_seconds_count", "flush")
    flush_seconds = total("strata_volume_op_latency_seconds_sum", "flush")
    return {
        "allocating_writes": int(writes["allocating"]),
        "in_place_writes": int(writes["in_place"]),
        "allocating_us": round(1e6 * mean["allocating"], 1),
        "in_place_us": round(1e6 * mean["in_place"], 1),
        # A write that allocated makes the next flush write metadata and
        # wait for the disk twice: the flushes' mean time shows that cost
        # where the guest waits for it.
        "flushes": int(flushes),
        "flush_us": round(1e6 * flush_seconds / flushes, 1) if flushes else None,
    }


def daemon_cpu(out, mean_rate):
    """The provider daemon's CPU time over the run, from the
    strata_bench_daemon_cpu_seconds_total series `strata bench run` reads
    from /proc with each scrape (Strata's daemon and qemu-storage-daemon
    alike), and per operation: CPU seconds between the first and last
    scrape over the operations of that span at the run's mean rate. On a
    shared machine this moves far less from run to run than the rate
    itself, so a pair of runs compares on it where their IOPS cannot."""
    path = os.path.join(out, "metrics.jsonl")
    readings = []
    try:
        with open(path) as f:
            for line in f:
                sample = json.loads(line)
                if sample["metric"] == "strata_bench_daemon_cpu_seconds_total":
                    readings.append((sample["time"], sample["value"]))
    except FileNotFoundError:
        return {}
    if len(readings) < 2 or mean_rate <= 0:
        return {}
    (start, cpu_start), (end, cpu_end) = readings[0], readings[-1]
    operations = mean_rate * (end - start)
    if operations <= 0:
        return {}
    return {
        "daemon_cpu_s": round(cpu_end - cpu_start, 2),
        "cpu_us_per_op": round(1e6 * (cpu_end - cpu_start) / operations, 1),
    }


def duet_cores():
    """The two cores a duet runs on: the first two this process may use."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit(f"--duet needs two cores; this process may use {cores}")
    if not shutil.which("taskset"):
        raise SystemExit("--duet pins runs with taskset: install util-linux")
    return cores[:2]


def run_duet(opts, work, variant, round_, cores):
    """One round's pair, at once: the side with snapshots (none, with
    --calibrate: side B) on one core and the side without on the other,
    the cores swapped from round to round so that neither side keeps the
    faster core. Returns [(snapshots, result)] as the sequential rounds do.
    The two sides' spec files and run directories are told apart by their
    cores."""
    snap_core, base_core = cores if round_ % 2 == 0 else cores[::-1]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        snap = pool.submit(run_one, opts, work, variant, not opts.calibrate, round_,
                           cpu=snap_core)
        base = pool.submit(run_one, opts, work, variant, False, round_, cpu=base_core)
        return [(True, snap.result()), (False, base.result())]


def core_balanced_losses(base, snap):
    """The loss of each two rounds of duets taken together: 1 - the
    geometric mean of their two ratios (with / without snapshots). The
    cores are swapped between the two rounds, so a core that runs either
    side a factor faster or slower multiplies one ratio by that factor
    and divides the other: their product, and this loss, keep none of it."""
    ratios = [s["iops"] / b["iops"] for s, b in zip(snap, base) if b["iops"] > 0]
    return [1 - math.sqrt(ratios[i] * ratios[i + 1]) for i in range(0, len(ratios) - 1, 2)]


def print_core_balanced(results):
    """One line per variant: its losses with the cores' difference taken out."""
    print("\nloss per two rounds (cores swapped between them), the cores' difference taken out:")
    for variant, runs in results.items():
        losses = core_balanced_losses(runs["base"], runs["snap"])
        if losses:
            print(f"  {variant}: median {100 * statistics.median(losses):.1f}% ("
                  + ", ".join(f"{100 * loss:.1f}" for loss in losses) + ")")


def main():
    opts = parse_args()
    variants = [v for v in opts.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}: give some of {', '.join(VARIANTS)}")
    if opts.memory_limit:
        parse_size(opts.memory_limit)  # a bad size ends the script before any run
    # SIGTERM unwinds like an error, so that the memory group and the run
    # directories are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cores = duet_cores() if opts.duet else None
    if opts.calibrate and not opts.duet:
        raise SystemExit("--calibrate measures the duet method: give --duet as well")
    if opts.snapshot_every < 1:
        raise SystemExit(f"--snapshot-every {opts.snapshot_every}: give a whole number of"
                         " seconds, at least 1")
    if opts.snapshot_every != 30 and opts.experiment != "pgbench":
        raise SystemExit("--snapshot-every sets the pgbench experiment's interval; the fio"
                         " experiment snapshots one of its volumes every 10 s")
    work = opts.keep or tempfile.mkdtemp(prefix="cns-snapshots-")
    os.makedirs(work, exist_ok=True)
    results = {v: {"snap": [], "base": []} for v in variants}
    try:
        # The first run of a session starts on a machine that has not run
        # the workload for a while (pgbench lost 24% of its transactions
        # in one, and nothing in the three rounds after): it warms the
        # machine and is not counted.
        for warm_up in range(opts.warm_up):
            result = run_one(opts, work, variants[0], False, 0, tag=f"warm-up-{warm_up}")
            print(f"warm-up {variants[0]:<10} none      (not counted) {json.dumps(result)}",
                  flush=True)
        for round_ in range(opts.repeat):
            for variant in variants:
                if opts.duet:
                    pair = run_duet(opts, work, variant, round_, cores)
                else:
                    # Alternate which of the pair goes first, round to round.
                    order = [True, False] if round_ % 2 == 0 else [False, True]
                    pair = [(snapshots, run_one(opts, work, variant, snapshots, round_))
                            for snapshots in order]
                for snapshots, result in pair:
                    results[variant]["snap" if snapshots else "base"].append(result)
                    label = "snapshots" if snapshots else "none"
                    if opts.calibrate and snapshots:
                        label = "none (B)"
                    print(f"round {round_ + 1} {variant:<10} {label:<9}"
                          f" {json.dumps(result)}", flush=True)
    finally:
        if not opts.keep:
            shutil.rmtree(work, ignore_errors=True)
    method = "at once, one core each (duet)" if opts.duet else "one after the other"
    if opts.calibrate:
        method += "; calibration: no snapshots on either side, the 'snapshots' columns are side B"
    every = f", a snapshot every {opts.snapshot_every} s" if opts.experiment == "pgbench" else ""
    print(f"\nmedians of {opts.repeat} rounds, {opts.duration} each run{every}, the pair {method}")
    unit = "tps" if opts.experiment == "pgbench" else "IOPS"
    print(f"| variant | {unit}, none | {unit}, snapshots | loss | lowest second (snapshots) |"
          " zero-op seconds (snapshots) | snapshot p50 / p99 / max ms | restores ok / failed |"
          " allocating writes, none / snapshots | mean µs allocating / in place (snapshots) |"
          " mean µs per flush, none / snapshots |"
          " daemon CPU µs per op, none / snapshots | CPU per op, snapshots against none |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    table = {}

    def median_of(rows, key, digits=0):
        """The median of `key` over `rows`, or – if no run has it."""
        values = [r[key] for r in rows if r.get(key) is not None]
        return f"{statistics.median(values):,.{digits}f}" if values else "–"

    for variant, runs in results.items():
        base, snap = runs["base"], runs["snap"]
        losses = [1 - s["iops"] / b["iops"] for s, b in zip(snap, base) if b["iops"] > 0]
        # Per round, the snapshot run's daemon CPU per operation against
        # its pair's: the cost of the snapshots in the daemon's work.
        cpu_growth = [s["cpu_us_per_op"] / b["cpu_us_per_op"] - 1 for s, b in zip(snap, base)
                      if s.get("cpu_us_per_op") and b.get("cpu_us_per_op")]
        med = lambda rows, key: statistics.median(r.get(key, 0) for r in rows)
        table[variant] = {"loss": statistics.median(losses) if losses else None,
                          "cpu_per_op_growth": statistics.median(cpu_growth) if cpu_growth else None,
                          "runs": runs}
        if opts.duet:
            table[variant]["core_balanced_losses"] = core_balanced_losses(base, snap)
        growth = (f"{100 * statistics.median(cpu_growth):+.1f}% ("
                  + ", ".join(f"{100 * g:+.1f}" for g in cpu_growth) + ")") if cpu_growth else "–"
        print(f"| {variant} | {med(base, 'iops'):,.0f} | {med(snap, 'iops'):,.0f} |"
              f" {100 * statistics.median(losses):.1f}% ("
              + ", ".join(f"{100 * loss:.1f}" for loss in losses) + ")"
              f" | {med(snap, 'min_iops'):,.0f} |"
              f" {med(snap, 'zero_seconds'):.0f} | {med(snap, 'p50_ms'):.1f} /"
              f" {med(snap, 'p99_ms'):.1f} / {med(snap, 'max_ms'):.1f} |"
              f" {sum(r.get('restores_ok', 0) for r in snap)} /"
              f" {sum(r.get('restores_failed', 0) for r in snap)} |"
              f" {median_of(base, 'allocating_writes')} / {median_of(snap, 'allocating_writes')} |"
              f" {median_of(snap, 'allocating_us')} / {median_of(snap, 'in_place_us')} |"
              f" {median_of(base, 'flush_us')} / {median_of(snap, 'flush_us')} |"
              f" {median_of(base, 'cpu_us_per_op', 1)} / {median_of(snap, 'cpu_us_per_op', 1)} |"
              f" {growth} |")
    if opts.duet:
        print_core_balanced(results)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

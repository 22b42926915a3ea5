#!/usr/bin/env python3
"""Experiment 1 of issue 29 (CNSBench): the rate of create+attach against
parallelism, as repeated, interleaved runs.

Each run is `strata bench run` of one spec with N creates always in
flight (a create's record ends when an NBD client has finished its
handshake with the new export: stages `created`, then `attached`) and N
deletes of the oldest volume, so the pool stays small. For each round,
every N in --parallelism runs on every provider in turn (Strata's daemon,
QEMU's qemu-storage-daemon over QMP, and the null provider, which answers
at once: the orchestrator's ceiling), so that each cell of a round sees
the same machine.

Reported per provider and N (medians over rounds): creates per minute,
the create's p50 and p99, the median time to each stage, and the stage
that takes the most of a create (its bottleneck); and each provider's
rate over the null provider's.

Beside each create run, the same provider and N run attaches of existing
volumes (`action: attach`: ask where a volume is served, then the NBD
handshake): no volume is made, so their rate is the floor under a
create's on that provider, what its API and NBD server cost alone. A
create's rate over it says what making the volume costs beyond that.

Usage (as root: the NBD exports and QEMU):
    python3 bench/cns_create_attach.py --duration 30s --repeat 2
    python3 bench/cns_create_attach.py --duration 5s --repeat 1 --parallelism 1,64

Target (issue 29): Strata's create+attach rate at parallelism 64 within 2x
of the null provider's.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

from cns_common import run_and_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROVIDERS = ("strata", "qemu", "null")

SPEC = """\
duration: {duration}
volumes: [{{name: fresh, count: 0, size: 1G}}]
control_operations:
  - {{name: creates, action: create, volumes: fresh, rate: loop}}
  - {{name: deletes, action: delete, volumes: fresh, select: oldest, rate: loop}}
rates: [{{name: loop, in_flight: 1}}]
"""

ATTACH_SPEC = """\
duration: {duration}
volumes: [{{name: ready, count: 8, size: 1G}}]
control_operations:
  - {{name: attaches, action: attach, volumes: ready, select: random, rate: loop}}
rates: [{{name: loop, in_flight: 1}}]
"""


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strata", default=os.path.join(ROOT, "target/release/strata"))
    parser.add_argument("--duration", default="30s")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--parallelism", default="1,4,16,64",
                        help="comma-separated numbers of creates in flight")
    parser.add_argument("--providers", default=",".join(PROVIDERS))
    parser.add_argument("--keep", help="keep the run directories here")
    parser.add_argument("--json", help="write the results here too")
    return parser.parse_args()


def run_one(opts, work, spec, provider, n, round_, operation="creates"):
    out = os.path.join(work, f"{provider}-{operation}-{n}-{round_}")
    args = [spec, "--seed", str(round_ + 1), "--parallelism", str(n), "--provider", provider]
    failed, summary = run_and_report(opts.strata, args, out, f"{provider} {operation} N={n}")
    done = next(o for o in summary["operations"] if o["operation"] == operation)
    if not opts.keep:
        shutil.rmtree(out, ignore_errors=True)
    return {
        "per_minute": done["per_minute"],
        "errors": done["errors"],
        "p50_ms": done["p50_ms"],
        "p99_ms": done["p99_ms"],
        "stages_ms": done["stage_p50_ms"],
        "failed": failed[:3],
    }


def bottleneck(stages_ms):
    """The stage that takes longest, from the times to each stage."""
    spans, before = {}, 0.0
    for stage, at in sorted(stages_ms.items(), key=lambda item: item[1]):
        spans[stage] = at - before
        before = at
    return max(spans.items(), key=lambda item: item[1]) if spans else ("-", 0.0)


def main():
    opts = parse_args()
    providers = [p for p in opts.providers.split(",") if p]
    unknown = [p for p in providers if p not in PROVIDERS]
    if unknown:
        raise SystemExit(f"unknown providers {unknown}: give some of {', '.join(PROVIDERS)}")
    counts = [int(n) for n in opts.parallelism.split(",") if n]
    work = opts.keep or tempfile.mkdtemp(prefix="cns-create-")
    os.makedirs(work, exist_ok=True)
    spec = os.path.join(work, "create-attach.yaml")
    with open(spec, "w") as f:
        f.write(SPEC.format(duration=opts.duration))
    attach_spec = os.path.join(work, "attach.yaml")
    with open(attach_spec, "w") as f:
        f.write(ATTACH_SPEC.format(duration=opts.duration))
    results = {(p, n): [] for p in providers for n in counts}
    floors = {(p, n): [] for p in providers for n in counts}
    try:
        for round_ in range(opts.repeat):
            for n in counts:
                # Rotate the providers' order, round to round.
                shift = round_ % len(providers)
                for provider in providers[shift:] + providers[:shift]:
                    result = run_one(opts, work, spec, provider, n, round_)
                    results[(provider, n)].append(result)
                    print(f"round {round_ + 1} {provider:<6} N={n:<3} {json.dumps(result)}",
                          flush=True)
                    floor = run_one(opts, work, attach_spec, provider, n, round_, "attaches")
                    floors[(provider, n)].append(floor)
                    print(f"round {round_ + 1} {provider:<6} N={n:<3} attaches {json.dumps(floor)}",
                          flush=True)
    finally:
        if not opts.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nmedians of {opts.repeat} rounds, {opts.duration} a run")
    print("| provider | N | creates/min | / null | p50 ms | p99 ms |"
          " time to created / attached ms (p50) | bottleneck | attaches/min | creates / attaches |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    table = []
    for n in counts:
        null_rate = None
        if ("null", n) in results:
            null_rate = statistics.median(r["per_minute"] for r in results[("null", n)])
        for provider in providers:
            runs = results[(provider, n)]
            med = lambda key: statistics.median(r[key] for r in runs)
            stages = {stage: statistics.median(r["stages_ms"].get(stage, 0.0) for r in runs)
                      for stage in runs[0]["stages_ms"]}
            stage, span = bottleneck(stages)
            ratio = med("per_minute") / null_rate if null_rate else None
            floor = statistics.median(r["per_minute"] for r in floors[(provider, n)])
            row = {"provider": provider, "n": n, "per_minute": med("per_minute"),
                   "over_null": ratio, "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"),
                   "stages_ms": stages, "bottleneck": stage, "errors": sum(r["errors"] for r in runs),
                   "attaches_per_minute": floor,
                   "attach_errors": sum(r["errors"] for r in floors[(provider, n)]),
                   "over_attaches": med("per_minute") / floor if floor else None}
            table.append(row)
            shown = " / ".join(f"{stages.get(s, 0.0):.2f}" for s in ("created", "attached"))
            over = row["over_attaches"]
            print(f"| {provider} | {n} | {row['per_minute']:,.0f} |"
                  f" {'-' if ratio is None else f'{ratio:.4f}'} | {row['p50_ms']:.2f} |"
                  f" {row['p99_ms']:.2f} | {shown} | {stage} ({span:.2f} ms) |"
                  f" {floor:,.0f} | {'-' if over is None else f'{over:.3f}'} |")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

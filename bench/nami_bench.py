#!/usr/bin/env python3
"""NAMI benchmark: the client's replica choice (nami, primary, uniform) in
the same run, on a store where one storage node is slow (issue 27, "Numbers
to reach", NAMI).

Usage (as root: it makes a network namespace and shapes its loopback):
    python3 bench/nami_bench.py [--strata PATH] [--sn 4] [--rate 20mbit]
        [--size 64k] [--threads 4] [--ops 25] [--passes 8] [--repeat 3]
        [--json-out FILE]

Setup: `strata store up --mn 3 --sn N --replication 3,2,3,2` runs in a
network namespace of its own, and every client runs there too. The replies
of the first storage node (what leaves its TCP port) are shaped on the
namespace's loopback with `tc` htb at --rate; everything else passes at
loopback speed. --threads clients post --ops objects of --size each, once.
Then, for each of --repeat rounds, each choice in turn (interleaved, so
each sees the same machine) runs `strata store bench --workload get
--replica-choice C` over those objects --passes times, in a new client.

Reported per choice (the median of the rounds): Gets per second, MB/s, p50
and p99 latency, each storage node's share of the reads (the slow node
first), the slow node's latency and the fast nodes' mean as the NAMI client
estimated them (ms, EWMA of the time to 64 KiB of the reply), and the spread of reads
across nodes (standard deviation over mean, %). The spread is of reads
sent, not of disk utilization as the thesis measured.

Targets (issue 27): nami >= 20% more Gets/s than uniform with the slow
node at about 3x the others' latency (see the latency columns); spread of
use <= 15% of the mean.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

STRATA_DEFAULT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "strata"
)


def run(args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


class Namespace:
    def __init__(self):
        self.name = f"namib{os.getpid() % 100000}"
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        run(["ip", "netns", "add", self.name])
        run(["ip", "-n", self.name, "link", "set", "lo", "up"])

    def slow_port(self, port, rate):
        ns = self.name
        run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb",
             "default", "10"])
        run(["tc", "-n", ns, "class", "add", "dev", "lo", "parent", "1:", "classid", "1:10",
             "htb", "rate", "40gbit"])
        run(["tc", "-n", ns, "class", "add", "dev", "lo", "parent", "1:", "classid", "1:20",
             "htb", "rate", rate, "ceil", rate, "burst", "64kb"])
        run(["tc", "-n", ns, "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip",
             "prio", "1", "u32", "match", "ip", "sport", str(port), "0xffff", "flowid", "1:20"])

    def close(self):
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


def strata_json(opts, ns, on, env, *args):
    out = run(["ip", "netns", "exec", ns.name, opts.strata, *args, "--output", "json",
               "--cluster", on], env=env)
    return json.loads(out.stdout)


def start_store(opts, ns, d, log):
    args = ["ip", "netns", "exec", ns.name, opts.strata, "store", "up", "--dir", d,
            "--listen", "127.0.0.1:0", "--mn", "3", "--sn", str(opts.sn),
            "--replication", "3,2,3,2"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    if "ready on " not in line:
        proc.kill()
        sys.exit(f"strata store up did not start: {line!r} (see its log)")
    return proc, line.split("ready on ")[1].split()[0]


def one_run(opts, ns, on, env, choice, slow_id):
    r = strata_json(opts, ns, on, env, "store", "bench", "--workload", "get",
                    "--replica-choice", choice, "--threads", str(opts.threads),
                    "--ops", str(opts.ops), "--size", opts.size, "--passes", str(opts.passes))
    nodes = r["client"]["nodes"]
    total = sum(n["reads"] for n in nodes) or 1
    reads = [n["reads"] for n in nodes]
    slow = [n for n in nodes if n["id"] == slow_id]
    fast = [n for n in nodes if n["id"] != slow_id]
    lat = lambda ns_: [n["latency_ms"] for n in ns_ if n["latency_ms"] is not None]
    return {
        "errors": r["errors"],
        "ops_per_s": r["ops_per_s"],
        "mb_per_s": r["mb_per_s"],
        "p50_ms": r["p50_ms"],
        "p99_ms": r["p99_ms"],
        "slow_share": sum(n["reads"] for n in slow) / total,
        "shares": [n["reads"] / total for n in slow + fast],
        "slow_latency_ms": statistics.mean(lat(slow)) if lat(slow) else None,
        "fast_latency_ms": statistics.mean(lat(fast)) if lat(fast) else None,
        "spread_pct": 100 * statistics.pstdev(reads) / statistics.mean(reads) if reads else 0,
    }


def median_of(runs, key):
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata", default=STRATA_DEFAULT)
    ap.add_argument("--sn", type=int, default=4)
    ap.add_argument("--rate", default="20mbit")
    ap.add_argument("--size", default="64k")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--ops", type=int, default=25)
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json-out")
    opts = ap.parse_args()
    opts.strata = os.path.abspath(opts.strata)
    if os.geteuid() != 0:
        sys.exit("run as root: the bench makes a network namespace and shapes it with tc")
    ns = Namespace()
    work = tempfile.mkdtemp(prefix="nami-bench-")
    log = open(os.path.join(work, "store.log"), "w")
    proc = None
    try:
        d = os.path.join(work, "cluster")
        proc, on = start_store(opts, ns, d, log)
        env = dict(os.environ, STRATA_CLUSTER_KEY=os.path.join(d, "cluster.key"),
                   STRATA_CREDENTIAL=os.path.join(d, "admin.credential"))
        status = strata_json(opts, ns, on, env, "store", "status")
        slow = status["storage_nodes"][0]
        port = int(slow["endpoint"].rsplit(":", 1)[1])
        made = strata_json(opts, ns, on, env, "store", "bench", "--workload", "post",
                           "--threads", str(opts.threads), "--ops", str(opts.ops),
                           "--size", opts.size)
        if made["errors"]:
            sys.exit(f"posting the objects failed: {made}")
        ns.slow_port(port, opts.rate)
        choices = ["nami", "primary", "uniform"]
        runs = {c: [] for c in choices}
        for _ in range(opts.repeat):
            for c in choices:
                runs[c].append(one_run(opts, ns, on, env, c, slow["id"]))
        report = {}
        for c in choices:
            report[c] = {k: median_of(runs[c], k) for k in
                         ["ops_per_s", "mb_per_s", "p50_ms", "p99_ms", "slow_share",
                          "slow_latency_ms", "fast_latency_ms", "spread_pct", "errors"]}
            report[c]["shares"] = [statistics.median(s) for s in zip(*[r["shares"] for r in runs[c]])]
        setup = (f"{opts.sn} storage nodes, replication 3, node 1 shaped to {opts.rate}; "
                 f"{opts.threads} clients x {opts.ops} objects of {opts.size} x "
                 f"{opts.passes} passes; median of {opts.repeat} rounds")
        print(setup)
        print("| choice | Gets/s | MB/s | p50 ms | p99 ms | read share per node (slow first) "
              "| slow/fast latency ms | read spread % |")
        print("|---|---|---|---|---|---|---|---|")
        for c in choices:
            r = report[c]
            shares = " / ".join(f"{100 * s:.0f}%" for s in r["shares"])
            lat = (f"{r['slow_latency_ms']:.2f} / {r['fast_latency_ms']:.2f}"
                   if r["slow_latency_ms"] is not None and r["fast_latency_ms"] is not None
                   else "-")
            print(f"| {c} | {r['ops_per_s']:.0f} | {r['mb_per_s']:.1f} | {r['p50_ms']:.2f} "
                  f"| {r['p99_ms']:.1f} | {shares} | {lat} | {r['spread_pct']:.0f} |")
        gain = report["nami"]["ops_per_s"] / report["uniform"]["ops_per_s"] - 1
        print(f"nami vs uniform: {100 * gain:+.0f}% Gets/s (target >= +20%)")
        if opts.json_out:
            with open(opts.json_out, "w") as f:
                json.dump({"setup": setup, "runs": runs, "median": report}, f, indent=1)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
        ns.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

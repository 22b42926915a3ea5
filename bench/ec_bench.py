#!/usr/bin/env python3
"""Erasure coding benchmark (issue 27, "Numbers to reach"): Gets and Posts
of objects kept in ec(4,2) against replicated(3), in the same run, on one
store, and the raw bytes each class stores.

Usage:
    python3 bench/ec_bench.py [--strata PATH] [--size 1M] [--threads 8]
        [--ops 16] [--passes 5] [--repeat 3] [--json-out FILE]

Setup: `strata store up --mn 1 --sn 6` with bucket `ec` in ec(4,2) and bucket
`r3` in replicated(3), W_d = N_d for both (every fragment or replica
durable before the answer). For each class, --threads clients post --ops
objects of --size each (`strata store bench --workload post`), then, for
each of --repeat rounds (the classes interleaved), read them --passes
times (`--workload get`). ec(4,2) Gets go to the node of each object's
fragment 0, which serves it from its object cache after the first pass
(warm) or gathers its fragments. Reported per class (medians of the
rounds): Posts/s, Gets/s, MB/s, p50/p99 latency, the store's CPU per GB
read, and the bytes on the storage nodes' disks over the bytes posted.

Targets: ec(4,2) Gets of 1 MB objects with the cache warm within 10% of
replicated(3); ec(4,2) raw bytes <= 1.6x (replication 3: 3x).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
STRATA_DEFAULT = os.path.join(HERE, "..", "target", "release", "strata")


def ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except OSError:
        return 0


def disk_bytes(d, prefix):
    """Bytes of the replica files under the storage nodes of `d`."""
    total = 0
    for root, _, files in os.walk(d):
        if os.path.basename(root) == "replicas":
            total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def bench(opts, on, pid, workload, prefix, passes=1):
    args = [opts.strata, "store", "bench", "--cluster", on, "--workload", workload,
            "--threads", str(opts.threads), "--ops", str(opts.ops), "--size", opts.size,
            "--passes", str(passes), "--prefix", prefix, "--output", "json"]
    before = ticks(pid)
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench failed: {out.stderr}")
    r = json.loads(out.stdout)
    cpu = (ticks(pid) - before) / os.sysconf("SC_CLK_TCK")
    r["store_cpu_s"] = cpu
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default=STRATA_DEFAULT)
    ap.add_argument("--size", default="1M")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--ops", type=int, default=16)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json-out")
    opts = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ec-bench-")
    d = os.path.join(work, "store")
    store = subprocess.Popen(
        [opts.strata, "store", "up", "--dir", d, "--listen", "127.0.0.1:0", "--mn", "1",
         "--sn", "6", "--bucket-class", "ec=ec(4,2)", "--bucket-class", "r3=replicated(3)",
         "--object-cache", "256M"],
        stdout=subprocess.PIPE, text=True)
    try:
        line = store.stdout.readline()
        on = line.split()[4]
        os.environ["STRATA_CREDENTIAL"] = os.path.join(d, "admin.credential")
        classes = {"ec(4,2)": "ec", "replicated(3)": "r3"}
        results = {c: {"posts": [], "gets": []} for c in classes}
        raw = {}
        for cls, prefix in classes.items():
            before = disk_bytes(d, prefix)
            r = bench(opts, on, store.pid, "post", prefix)
            results[cls]["posts"].append(r)
            posted = r["bytes"] if "bytes" in r else r["ops"] * r.get("size", 0)
            raw[cls] = (disk_bytes(d, prefix) - before, posted)
        for _ in range(opts.repeat):
            for cls, prefix in classes.items():
                results[cls]["gets"].append(bench(opts, on, store.pid, "get", prefix,
                                                  opts.passes))
        table = []
        for cls in classes:
            gets = results[cls]["gets"]
            post = results[cls]["posts"][0]
            med = lambda k: statistics.median(g[k] for g in gets)
            mb = med("mb_per_s")
            cpu_per_gb = statistics.median(
                g["store_cpu_s"] / max(g["mb_per_s"] * g["seconds"] / 1000, 1e-9) for g in gets)
            disk, posted = raw[cls]
            table.append({
                "class": cls, "posts_per_s": post["ops_per_s"], "gets_per_s": med("ops_per_s"),
                "mb_per_s": mb, "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"),
                "store_cpu_s_per_gb": cpu_per_gb, "raw_over_posted": disk / posted if posted else 0,
            })
        print(f"{'class':<15} {'Posts/s':>8} {'Gets/s':>8} {'MB/s':>8} {'p50 ms':>7} "
              f"{'p99 ms':>7} {'CPU s/GB':>9} {'raw/posted':>10}")
        for row in table:
            print(f"{row['class']:<15} {row['posts_per_s']:>8.0f} {row['gets_per_s']:>8.0f} "
                  f"{row['mb_per_s']:>8.0f} {row['p50_ms']:>7.2f} {row['p99_ms']:>7.2f} "
                  f"{row['store_cpu_s_per_gb']:>9.2f} {row['raw_over_posted']:>10.2f}")
        ec, r3 = table
        print(f"ec(4,2) / replicated(3): Gets/s {ec['gets_per_s'] / r3['gets_per_s']:.2f}x, "
              f"Posts/s {ec['posts_per_s'] / r3['posts_per_s']:.2f}x")
        if opts.json_out:
            with open(opts.json_out, "w") as f:
                json.dump({"table": table, "runs": results}, f, indent=1)
    finally:
        store.terminate()
        store.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

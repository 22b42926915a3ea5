#!/usr/bin/env python3
"""Collective image distribution benchmark: `strata mirror` on loopback.

Usage:
    /usr/bin/python3 bench/mirror_bench.py [--mirrors 1,8,32] [--strata PATH]
        [--patterns sync-same,shifted-same,sync-disjoint] [--quick]

Scaled down from issue 6 so a run takes minutes on 2 cores (every size
and rate divided by the same factors, so times keep their proportions):

  issue            here
  4 GiB image      16 MiB image
  1 GiB read       4 MiB read per mirror (128 chunks of 32 KiB)
  128 MiB disjoint 512 KiB per mirror, at different offsets
  125 MB/s repo    4 MB/s repository cap (token bucket in repo-serve)
  125 MB/s links   4 MB/s upload cap per mirror (--peer-rate)
  5 s shift        0.3 s between mirror starts (shifted-same)
  threshold 512    threshold 8 (512 chunks is 16 MiB, 4 times the read
                   here; scaled with the read so "unmatched" keeps its
                   meaning)

Modes, all in the same run:
  mirror        peers on, adaptive prefetch (threshold 8), fanout 8
  on-demand     --no-peers: every mirror reads the repository on demand
  unlimited     peers on, prefetch never stops
  threshold-0   peers on, no prefetch (on-demand from peers or repository)
  pre-broadcast the whole image first copied to every host through a
                pipeline (mirror 0 fills from the repository; mirror i
                prefetches everything mirror i-1 advertises, capped per
                link like the rest), then read locally; the time includes
                the copy.

Reads go through each mirror's NBD export with libnbd (64 KiB sequential
preads, one connection per mirror). Reported per run: completion time
(first start to last end), per-mirror throughput min/avg/max, the
fastest-to-slowest gap, chunks from the repository / peers on demand /
peers by prefetch, and bytes moved that were never read. Finally the
trace-prefetch gain for the first host (one mirror, no peers, reading a
scattered boot-like pattern with 10 ms of "compute" between reads, with
and without the trace a previous host recorded), against a repository
that also answers each read after 20 ms, as a remote one would.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

try:
    import nbd
except ImportError:
    sys.exit("needs libnbd's Python module: run with /usr/bin/python3 (apt-get install python3-libnbd)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
IMAGE = 16 * MIB
READ = 4 * MIB
DISJOINT = MIB // 2
RATE = "4M"
SHIFT = 0.3
THRESHOLD = "8"
REQ = 64 * 1024
FANOUT = 8
THINK = 0.01
TRACE_LATENCY_MS = 20


def start(args, strata):
    p = subprocess.Popen([strata] + args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    if not line.startswith("strata: "):
        p.kill()
        raise RuntimeError(f"{args} did not start: {line!r}")
    return p, line


def word_after(line, key):
    return line[line.index(key) + len(key):].split()[0]


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def stats(d):
    with open(os.path.join(d, "stats.json")) as f:
        return json.load(f)


def read_region(uri, ranges, think, out, i, together=None):
    h = nbd.NBD()
    h.connect_uri(uri)
    if together is not None:
        # "Together": every reader starts once all are connected, so the
        # time each takes to connect does not count as a throughput gap.
        together.wait()
    t0 = time.monotonic()
    n = 0
    for off, length in ranges:
        for o in range(off, off + length, REQ):
            h.pread(min(REQ, off + length - o), o)
            n += min(REQ, off + length - o)
            if think:
                time.sleep(think)
    t1 = time.monotonic()
    h.shutdown()
    out[i] = (t0, t1, n)


def regions(pattern, n):
    if pattern == "sync-disjoint":
        return [[(i * DISJOINT % IMAGE, DISJOINT)] for i in range(n)]
    return [[(8 * MIB, READ)] for _ in range(n)]


def run_mode(strata, work, url, mode, pattern, n):
    dirs = [os.path.join(work, f"{mode}-{pattern}-{n}-{i}") for i in range(n)]
    procs = []
    common = ["-p", "0", "--peer-rate", RATE]
    try:
        for i, d in enumerate(dirs):
            args = ["mirror", "--repo", url, "--dir", d] + common
            if mode == "on-demand":
                args += ["--no-peers"]
            elif mode == "pre-broadcast":
                args += ["--unmatched", "unlimited", "--prefetch-timeout", "60", "--fanout", "1",
                         "--prefetch-threads", "8"]
                args += ["--fill"] if i == 0 else ["--peers", procs[-1][1]]
            else:
                args += ["--fanout", str(FANOUT)]
                args += {"mirror": ["--unmatched", THRESHOLD], "unlimited": ["--unmatched", "unlimited"],
                         "threshold-0": ["--unmatched", "0"]}[mode]
                if procs:
                    args += ["--peers", ",".join(pp for _, pp, _ in procs)]
            p, line = start(args, strata)
            peer = word_after(line, " peer listen address ")
            procs.append((p, peer, "nbd://" + word_after(line, "nbd://")))
        t_begin = time.monotonic()
        if mode == "pre-broadcast":
            while not all(os.path.exists(os.path.join(d, "stats.json")) and stats(d)["complete"] for d in dirs):
                time.sleep(0.05)
        else:
            time.sleep(0.5)  # links up
        out = [None] * n
        threads = []
        regs = regions(pattern, n)
        together = None if pattern == "shifted-same" else threading.Barrier(n)
        for i, (_, _, uri) in enumerate(procs):
            th = threading.Thread(target=read_region, args=(uri, regs[i], 0, out, i, together))
            threads.append(th)
            th.start()
            if pattern == "shifted-same":
                time.sleep(SHIFT)
        for th in threads:
            th.join()
        time.sleep(0.7)  # stats.json catches up
        st = [stats(d) for d in dirs]
    finally:
        for p, _, _ in procs:
            stop(p)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    start_t = t_begin if mode == "pre-broadcast" else min(o[0] for o in out)
    completion = max(o[1] for o in out) - start_t
    tput = [o[2] / (o[1] - (t_begin if mode == "pre-broadcast" else o[0])) / MIB for o in out]
    read_bytes = sum(o[2] for o in out)
    moved = sum((s["repo_demand"] + s["repo_prefetch"] + s["peer_demand"] + s["peer_prefetch"]) for s in st) * 32768
    return {
        "mode": mode, "pattern": pattern, "mirrors": n, "completion_s": round(completion, 2),
        "tput_min": round(min(tput), 2), "tput_avg": round(statistics.mean(tput), 2),
        "tput_max": round(max(tput), 2),
        "gap_pct": round(100 * (max(tput) - min(tput)) / max(tput), 1),
        "repo": sum(s["repo_demand"] + s["repo_prefetch"] for s in st),
        "peer_demand": sum(s["peer_demand"] for s in st),
        "peer_prefetch": sum(s["peer_prefetch"] for s in st),
        "peer_timeouts": sum(s["peer_timeouts"] for s in st),
        "switched_off": sum(s["policy"]["switched_off"] for s in st),
        "unread_mib": round(max(0, moved - read_bytes) / MIB, 2) if mode != "pre-broadcast"
        else round(sum(s["unread_bytes"] for s in st) / MIB, 2),
    }


def trace_gain(strata, work, img):
    """First-host completion with and without a recorded trace, against a
    repository with the bandwidth cap and a TRACE_LATENCY_MS round trip per
    read: on loopback the cap alone makes every pattern bandwidth-bound
    (the reader's think time refills the bucket), which no prefetch can
    beat; a remote repository's latency is what prefetch hides."""
    repo, line = start(["mirror", "repo-serve", "-p", "0", "--rate", RATE, "--latency-ms",
                        str(TRACE_LATENCY_MS), img], strata)
    try:
        return trace_runs(strata, work, "http://" + word_after(line, "http://"))
    finally:
        stop(repo)


def trace_runs(strata, work, url):
    # A boot-like scattered pattern: 24 pieces of 64 KiB across the image.
    ranges = [((i * 7919 * 65536) % (IMAGE - REQ), REQ) for i in range(24)]
    times = {}
    for label, extra in [("record", ["--record-trace"]), ("no-trace", []), ("trace", ["--trace"])]:
        d = os.path.join(work, "trace-" + label)
        p, line = start(["mirror", "--repo", url, "--dir", d, "-p", "0", "--no-peers"] + extra, strata)
        out = [None]
        read_region("nbd://" + word_after(line, "nbd://"), ranges, THINK, out, 0)
        stop(p)
        shutil.rmtree(d, ignore_errors=True)
        times[label] = out[0][1] - out[0][0]
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mirrors", default="1,8,32")
    ap.add_argument("--patterns", default="sync-same,shifted-same,sync-disjoint")
    ap.add_argument("--modes", default="mirror,on-demand,unlimited,threshold-0,pre-broadcast")
    ap.add_argument("--strata", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "strata"))
    ap.add_argument("--quick", action="store_true", help="mirrors 1,8 only")
    ap.add_argument("--fanout", type=int, default=FANOUT, help="peers each mirror links to")
    a = ap.parse_args()
    globals()["FANOUT"] = a.fanout
    if a.quick:
        a.mirrors = "1,8"
    work = tempfile.mkdtemp(prefix="mirror-bench-")
    img = os.path.join(work, "base.raw")
    with open(img, "wb") as f:
        f.write(os.urandom(IMAGE))
    subprocess.run([a.strata, "mirror", "digest", img], check=True, stdout=subprocess.DEVNULL)
    repo, line = start(["mirror", "repo-serve", "-p", "0", "--rate", RATE, img], a.strata)
    url = "http://" + word_after(line, "http://")
    rows = []
    try:
        print(f"{'pattern':14} {'mode':13} {'N':>3} {'time s':>7} {'MiB/s min/avg/max':>19} {'gap%':>5} "
              f"{'repo':>5} {'p-dem':>5} {'p-pre':>5} {'unread MiB':>10}")
        for n in [int(x) for x in a.mirrors.split(",")]:
            for pattern in a.patterns.split(","):
                for mode in a.modes.split(","):
                    if n == 1 and mode in ("unlimited", "threshold-0", "pre-broadcast"):
                        continue
                    r = run_mode(a.strata, work, url, mode, pattern, n)
                    rows.append(r)
                    print(f"{pattern:14} {mode:13} {n:3} {r['completion_s']:7.2f} "
                          f"{r['tput_min']:5.2f}/{r['tput_avg']:5.2f}/{r['tput_max']:5.2f} {r['gap_pct']:5.1f} "
                          f"{r['repo']:5} {r['peer_demand']:5} {r['peer_prefetch']:5} {r['unread_mib']:10.2f}",
                          flush=True)
        t = trace_gain(a.strata, work, img)
        print(f"trace prefetch, first host: {t['no-trace']:.2f} s without, {t['trace']:.2f} s with "
              f"({100 * (1 - t['trace'] / t['no-trace']):.0f}% less)")
        print(json.dumps({"rows": rows, "trace": t}))
    finally:
        stop(repo)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""NAMI benchmark: the client's replica choice (nami, primary, uniform) in
the same run, on a store where one storage node is slow (issue 27, "Numbers
to reach", NAMI).

Usage (as root: it makes a network namespace and shapes its loopback, or
cgroups that limit each storage node's disk):
    python3 bench/nami_bench.py [--strata PATH] [--sn 4] [--rate 20mbit]
        [--size 64k] [--threads 4] [--ops 25] [--passes 8] [--repeat 3]
        [--json-out FILE]
    python3 bench/nami_bench.py --slow disk [--disk-rate 8M] [--slow-factor 3]
        [--size 256k] [--threads 8] [--ops 48] [--passes 2] [--repeat 3]

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

--slow disk: the slow node is slowed by its disk instead, and the spread
is of disk utilization, as the thesis measured it. `strata store up --sn 0`
runs the orchestrator and the metadata nodes; each storage node is a
`strata store node add` process of its own, started in a cgroup v1 blkio
group of its own whose `blkio.throttle.read_bps_device` on the disk that
holds the cluster's directory is --disk-rate for every node but the first,
which gets --disk-rate / --slow-factor (its reads take that many times
longer). The nodes run with `--scrub-rate 0`, so the scrub reads nothing
from disk during a pass. Objects are larger than MAX_INLINE (4 KiB), so
they live in replica files, not in their records; replicated objects have
no cache in the store but the kernel's page cache, which is dropped
(`sync; echo 3 > /proc/sys/vm/drop_caches`) before every pass, so every
Get reads its replica from disk. Each pass is one `strata store bench
--passes 1` (a new client: NAMI learns the latencies again in each pass).
Per choice and round, over its --passes passes: Gets/s, the bytes each
node's cgroup read from the disk (`blkio.throttle.io_service_bytes`), and
each node's utilization = bytes read / (its bandwidth x pass time); the
spread is the standard deviation of the utilizations over their mean.

Targets (issue 27): nami >= 20% more Gets/s than uniform with the slow
node at about 3x the others' latency (see the latency columns); spread of
use <= 15% of the mean.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

STRATA_DEFAULT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "strata"
)


def run(args, **kw):
    done = subprocess.run(args, capture_output=True, text=True, **kw)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited with {done.returncode}: "
                           f"{done.stderr.strip()[-2000:]} {done.stdout.strip()[-500:]}")
    return done


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


BLKIO = "/sys/fs/cgroup/blkio"
# The first bytes of a replica file (crates/store/src/storage/file.rs).
REPLICA_MAGIC = b"S6RP"


def disk_of(path):
    """MAJ:MIN of the whole disk that holds `path`: the blkio throttle
    takes whole disks, not partitions."""
    dev = os.stat(path).st_dev
    node = os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if os.path.exists(os.path.join(node, "partition")):
        with open(os.path.join(os.path.dirname(node), "dev")) as f:
            return f.read().strip()
    if not os.path.exists(node):
        sys.exit(f"{path} is on device {os.major(dev)}:{os.minor(dev)}, which is not a "
                 "block device (tmpfs?): set TMPDIR to a directory on a disk")
    return f"{os.major(dev)}:{os.minor(dev)}"


class DiskGroup:
    """A cgroup v1 blkio group whose processes read `device` at `bps` at most."""

    def __init__(self, name, device, bps):
        if not os.path.isdir(BLKIO):
            sys.exit(f"--slow disk needs the cgroup v1 blkio hierarchy at {BLKIO}")
        self.path = os.path.join(BLKIO, name)
        self.device = device
        self.bps = bps
        os.makedirs(self.path, exist_ok=True)
        with open(os.path.join(self.path, "blkio.throttle.read_bps_device"), "w") as f:
            f.write(f"{device} {bps}")

    def read_bytes(self):
        """Bytes this group's processes have read from the device so far."""
        with open(os.path.join(self.path, "blkio.throttle.io_service_bytes")) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[0] == self.device and parts[1] == "Read":
                    return int(parts[2])
        return 0

    def close(self):
        # rmdir fails while a process is still in the group: retry briefly.
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        print(f"could not remove the cgroup {self.path}", file=sys.stderr)


def drop_caches():
    """Empties the page cache, so the next reads come from the disk."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def start_disk_node(opts, ns, on, d, group, log):
    """A `strata store node add` process, moved into `group` before it
    starts (every thread it makes stays there); its id and endpoint."""
    os.makedirs(d, exist_ok=True)
    args = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', os.path.join(group.path, "cgroup.procs"),
            "ip", "netns", "exec", ns.name, opts.strata, "store", "node", "add",
            "--cluster", on, "--dir", d, "--scrub-rate", "0"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    m = re.search(r"storage node ([0-9a-f]{16}) .* on ([0-9.]+:[0-9]+)", line)
    if not m:
        proc.kill()
        sys.exit(f"strata store node add did not start: {line!r} (see its log)")
    return proc, m.group(1), m.group(2)


def wait_nodes_up(opts, ns, on, env, count):
    for _ in range(200):
        status = strata_json(opts, ns, on, env, "store", "status")
        if sum(s["state"] == "up" for s in status["storage_nodes"]) >= count:
            return
        time.sleep(0.05)
    sys.exit(f"the {count} storage nodes did not come up within 10 s")


def post_when_placeable(opts, ns, on, env):
    """Posts the objects. The metadata nodes learn of storage nodes added
    after them from the next table they fetch: until then a Post finds
    no node to place on, so the first Posts are retried for a while."""
    for _ in range(40):
        try:
            strata_json(opts, ns, on, env, "store", "bench", "--workload", "post",
                        "--threads", "1", "--ops", "1", "--size", opts.size,
                        "--prefix", "probe")
            break
        except RuntimeError:
            time.sleep(0.25)
    made = strata_json(opts, ns, on, env, "store", "bench", "--workload", "post",
                       "--threads", str(opts.threads), "--ops", str(opts.ops),
                       "--size", opts.size)
    if made["errors"]:
        sys.exit(f"posting the objects failed: {made}")


def unloaded_latencies(opts, ns, on, env, nodes):
    """Each node's read latency without queueing: one client reads its
    objects one at a time, uniform choice, on cold caches. The client's
    estimate per node, ms (None for a node it never read from)."""
    drop_caches()
    r = strata_json(opts, ns, on, env, "store", "bench", "--workload", "get",
                    "--replica-choice", "uniform", "--threads", "1", "--ops", str(opts.ops),
                    "--size", opts.size, "--passes", "1")
    by_id = {n["id"]: n for n in r["client"]["nodes"]}
    return [by_id.get(i, {}).get("latency_ms") for i in nodes]


def walk_files(d):
    return [os.path.join(root, f) for root, _, names in os.walk(d) for f in names]


def is_replica(path):
    """A replica file: it starts with the store's replica magic."""
    with open(path, "rb") as f:
        return f.read(4) == REPLICA_MAGIC


def disk_read_times(work_dirs, groups, count=16):
    """Each node's disk as its process sees it: on cold caches, one
    reader in the node's blkio group reads `count` of the node's replica
    files one after the other; the mean time per file, ms. This is the
    3x the slow node is set to (its reads take that much longer)."""
    times = []
    for d, g in zip(work_dirs, groups):
        files = sorted(f for f in walk_files(d) if is_replica(f))[:count]
        drop_caches()
        start = time.monotonic()
        run(["sh", "-c", 'echo $$ > "$0" && exec cat "$@" > /dev/null',
             os.path.join(g.path, "cgroup.procs"), *files])
        times.append(1e3 * (time.monotonic() - start) / max(len(files), 1))
    return times


def disk_choice_round(opts, ns, on, env, choice, nodes, groups):
    """One round of `choice`: --passes passes, each on cold caches."""
    ops = seconds = served = 0
    disk = [0] * len(nodes)
    reads = [0] * len(nodes)
    p50, p99, slow_lat, fast_lat, errors = [], [], [], [], 0
    for _ in range(opts.passes):
        drop_caches()
        before = [g.read_bytes() for g in groups]
        r = strata_json(opts, ns, on, env, "store", "bench", "--workload", "get",
                        "--replica-choice", choice, "--threads", str(opts.threads),
                        "--ops", str(opts.ops), "--size", opts.size, "--passes", "1")
        after = [g.read_bytes() for g in groups]
        disk = [t + a - b for t, a, b in zip(disk, after, before)]
        ops += r["ops"]
        seconds += r["seconds"]
        served += r["mb_per_s"] * 1e6 * r["seconds"]
        errors += r["errors"]
        p50.append(r["p50_ms"])
        p99.append(r["p99_ms"])
        by_id = {n["id"]: n for n in r["client"]["nodes"]}
        reads = [t + by_id.get(i, {}).get("reads", 0) for t, i in zip(reads, nodes)]
        if by_id.get(nodes[0], {}).get("latency_ms") is not None:
            slow_lat.append(by_id[nodes[0]]["latency_ms"])
        fast = [by_id[i]["latency_ms"] for i in nodes[1:]
                if by_id.get(i, {}).get("latency_ms") is not None]
        if fast:
            fast_lat.append(statistics.mean(fast))
    util = [b / (g.bps * seconds) for b, g in zip(disk, groups)]
    total_reads = sum(reads) or 1
    return {
        "errors": errors,
        "ops_per_s": ops / seconds,
        "mb_per_s": served / seconds / 1e6,
        "p50_ms": statistics.median(p50),
        "p99_ms": statistics.median(p99),
        "shares": [x / total_reads for x in reads],
        "disk_mb_per_s": [b / seconds / 1e6 for b in disk],
        "utilization": util,
        "util_spread_pct": 100 * statistics.pstdev(util) / statistics.mean(util)
        if statistics.mean(util) > 0 else None,
        "read_spread_pct": 100 * statistics.pstdev(reads) / statistics.mean(reads)
        if sum(reads) else None,
        "disk_over_served": sum(disk) / served if served else None,
        "slow_latency_ms": statistics.mean(slow_lat) if slow_lat else None,
        "fast_latency_ms": statistics.mean(fast_lat) if fast_lat else None,
    }


def disk_main(opts, ns, work, log):
    """--slow disk: every storage node in a process and a blkio group of its own."""
    d = os.path.join(work, "cluster")
    device = disk_of(work)
    fast_bps = parse_rate(opts.disk_rate)
    rates = [int(fast_bps / opts.slow_factor)] + [fast_bps] * (opts.sn - 1)
    groups, nodes, procs = [], [], []
    store = None
    try:
        args = ["ip", "netns", "exec", ns.name, opts.strata, "store", "up", "--dir", d,
                "--listen", "127.0.0.1:0", "--mn", "3", "--sn", "0",
                "--replication", "3,2,3,2"]
        store = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
        line = store.stdout.readline()
        if "ready on " not in line:
            sys.exit(f"strata store up did not start: {line!r} (see its log)")
        on = line.split("ready on ")[1].split()[0]
        env = dict(os.environ, STRATA_CLUSTER_KEY=os.path.join(d, "cluster.key"),
                   STRATA_CREDENTIAL=os.path.join(d, "admin.credential"))
        for k, bps in enumerate(rates):
            groups.append(DiskGroup(f"{ns.name}-sn{k}", device, bps))
            proc, node, _ = start_disk_node(opts, ns, on, os.path.join(d, f"sn-{k}"),
                                            groups[-1], log)
            procs.append(proc)
            nodes.append(node)
        wait_nodes_up(opts, ns, on, env, opts.sn)
        post_when_placeable(opts, ns, on, env)
        unloaded = unloaded_latencies(opts, ns, on, env, nodes)
        file_ms = disk_read_times([os.path.join(d, f"sn-{k}") for k in range(opts.sn)], groups)
        choices = ["nami", "primary", "uniform"]
        runs = {c: [] for c in choices}
        for _ in range(opts.repeat):
            for c in choices:
                runs[c].append(disk_choice_round(opts, ns, on, env, c, nodes, groups))
        report = {}
        for c in choices:
            report[c] = {k: median_of(runs[c], k) for k in
                         ["ops_per_s", "mb_per_s", "p50_ms", "p99_ms", "util_spread_pct",
                          "read_spread_pct", "disk_over_served", "slow_latency_ms",
                          "fast_latency_ms", "errors"]}
            for k in ["shares", "disk_mb_per_s", "utilization"]:
                report[c][k] = [statistics.median(v) for v in zip(*[r[k] for r in runs[c]])]
        setup = (f"{opts.sn} storage nodes (one process and blkio group each), replication 3; "
                 f"disk reads limited to {fast_bps / 1e6:.2f} MB/s, node 1 to "
                 f"{rates[0] / 1e6:.2f} MB/s (1/{opts.slow_factor:g}), device {device}; "
                 f"{opts.threads} clients x {opts.ops} objects of {opts.size}; "
                 f"{opts.passes} passes per choice and round, caches dropped before each; "
                 f"median of {opts.repeat} rounds")
        print(setup)
        print("unloaded latency (one client, uniform choice, cold caches; the client's "
              "estimate, ms, slow first): "
              + " / ".join("-" if x is None else f"{x:.1f}" for x in unloaded))
        print("disk read time per replica file (serial reads in each node's group, cold "
              "caches, ms, slow first): " + " / ".join(f"{x:.1f}" for x in file_ms))
        print("| choice | Gets/s | MB/s | p50 ms | p99 ms | reads sent per node (slow first) "
              "| disk MB/s per node | utilization per node | utilization spread % "
              "| read spread % | slow/fast latency ms | disk bytes / bytes served |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        pct = lambda xs: " / ".join(f"{100 * x:.0f}%" for x in xs)
        for c in choices:
            r = report[c]
            lat = (f"{r['slow_latency_ms']:.1f} / {r['fast_latency_ms']:.1f}"
                   if r["slow_latency_ms"] is not None and r["fast_latency_ms"] is not None
                   else "-")
            disk_rates = " / ".join(f"{x:.1f}" for x in r["disk_mb_per_s"])
            print(f"| {c} | {r['ops_per_s']:.0f} | {r['mb_per_s']:.1f} | {r['p50_ms']:.1f} "
                  f"| {r['p99_ms']:.1f} | {pct(r['shares'])} | {disk_rates} "
                  f"| {pct(r['utilization'])} | {r['util_spread_pct']:.0f} "
                  f"| {r['read_spread_pct']:.0f} | {lat} | {r['disk_over_served']:.2f} |")
        gain = report["nami"]["ops_per_s"] / report["uniform"]["ops_per_s"] - 1
        print(f"nami vs uniform: {100 * gain:+.0f}% Gets/s (target >= +20%); utilization "
              f"spread nami {report['nami']['util_spread_pct']:.0f}%, uniform "
              f"{report['uniform']['util_spread_pct']:.0f}% (target <= 15%)")
        if opts.json_out:
            with open(opts.json_out, "w") as f:
                json.dump({"setup": setup, "unloaded_latency_ms": unloaded,
                           "file_read_ms": file_ms, "runs": runs,
                           "median": report}, f, indent=1)
    finally:
        # `store up` stops the nodes registered with it; then make sure.
        for p in [store] + procs:
            if p is None:
                continue
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for g in groups:
            g.close()


def parse_rate(text):
    """Bytes per second from 8M, 512k, 1G (binary units) or a plain number."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower()
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata", default=STRATA_DEFAULT)
    ap.add_argument("--sn", type=int, default=4)
    ap.add_argument("--rate", default="20mbit")
    # Defaults per --slow mode (link / disk): a disk pass reads every
    # object once from a cold cache, so it needs more and larger objects.
    ap.add_argument("--size", help="object size (64k / 256k)")
    ap.add_argument("--threads", type=int, help="clients (4 / 8)")
    ap.add_argument("--ops", type=int, help="objects per client (25 / 48)")
    ap.add_argument("--passes", type=int, help="passes per choice and round (8 / 2)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json-out")
    ap.add_argument("--slow", choices=["link", "disk"], default="link",
                    help="slow the first node's link (tc) or its disk (cgroup blkio)")
    ap.add_argument("--disk-rate", default="8M",
                    help="--slow disk: each fast node's disk read rate, bytes/s")
    ap.add_argument("--slow-factor", type=float, default=3.0,
                    help="--slow disk: the slow node reads at --disk-rate / this")
    opts = ap.parse_args()
    defaults = {"link": ("64k", 4, 25, 8), "disk": ("256k", 8, 48, 2)}[opts.slow]
    for name, value in zip(["size", "threads", "ops", "passes"], defaults):
        if getattr(opts, name) is None:
            setattr(opts, name, value)
    opts.strata = os.path.abspath(opts.strata)
    if os.geteuid() != 0:
        sys.exit("run as root: the bench makes a network namespace and shapes it with tc")
    ns = Namespace()
    work = tempfile.mkdtemp(prefix="nami-bench-")
    log = open(os.path.join(work, "store.log"), "w")
    if opts.slow == "disk":
        try:
            disk_main(opts, ns, work, log)
        except BaseException:
            log.flush()
            with open(os.path.join(work, "store.log")) as f:
                sys.stderr.write("".join(f.readlines()[-20:]))
            raise
        finally:
            log.close()
            ns.close()
            shutil.rmtree(work, ignore_errors=True)
        return
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

#!/usr/bin/env python3
"""RS3 benchmark: the storage node's batch read scheduler (docs/design/rs3.md)
against no scheduling, on one node whose link is the bottleneck, in the same
run (issue 26, "Numbers to reach", RS3).

Usage (as root: it makes network namespaces):
    python3 bench/rs3_bench.py [--strata PATH] [--rate 1gbit] [--queue 8mb]
        [--cc cubic] [--batches 64K,128K,256K] [--repeat 3] [--quick]
        [--json-out FILE] [--plot docs/rs3-latency.svg]

Topology: the store runs in a network namespace of its own (the node); a
second namespace routes between it and the root namespace, where every
client runs. The router's egress towards the clients is shaped by `tc tbf`
(--rate, default 1gbit; queue --queue, default 8mb; burst 256kb), as a
switch port would be: the queue must be in a router, since TCP small
queues bound a sender's own qdisc and shaping the node's own veth builds
no queue. The node's TCP congestion control is set on its route (--cc,
default cubic, Linux's default: it fills the router's queue as a
loss-based sender does; bbr keeps the queue short by itself, which leaves
a scheduler less to win). The topology is removed at the end, on failure
too.

Latency and throughput, for each mode (RS3 off; RS3 on with each
--rs3-batch of --batches): a fresh one-node store (`--mn 1 --sn 1
--replication 1,1,1,1`); tenant `bulk` posts 4 objects of 64 MB and tenant
`small` posts 8 x --small-objects objects of 4 KiB. Then 4 clients of
`bulk` stream 64 MB Gets continuously (`store bench --workload get
--passes` large, stopped at the end); after --warmup seconds (past slow
start, the router's queue full), 8 clients of `small` issue 4 KiB Gets:
first as a sequence of short `store bench` runs for --window seconds
(each run's median latency and start time make the time series of the
plot), then as one longer run (--small-passes passes over every object)
whose p50/p99 go in the table. A last mode, "no streams", runs the small
Gets alone (RS3 off): the floor. The streams' throughput is the bytes their
sockets received (`ss -ti` bytes_received, sampled every 0.25 s, summed
per client process) over the whole measurement, divided by its length;
the bytes the host's end of the link received over the same time are
reported too, with the router's queue backlog (`tc -s qdisc`, sampled
alike; median and maximum), the packets it dropped, and the median round
trip of a 32-byte UDP echo in the node's namespace probed every 50 ms
(its reply crosses the queue as a metadata reply does: the queueing delay
of one crossing).

Weighted shares: RS3 on (--weight-batch) with `--rs3-weight w1=1
--rs3-weight w2=2 --rs3-weight w3=3`; tenants w1, w2, w3 each post
--weight-clients objects of 64 MB, then stream them with --weight-clients
clients each, all at once; after --warmup seconds, each tenant's bytes
received over --window seconds (sampled as above) give its MB/s and its
share of the total, against 1/6, 2/6 and 3/6.

Targets (issue 26): small-Get p50 without/with RS3 >= 20x; the streams'
throughput with RS3 within 15% of without; each weighted share within 5%
of its target (relative). Every figure is the median of --repeat runs;
the plot shows the first run's series, latency on a log scale.
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TAG = f"rs3b{os.getpid() % 1000000}"
# Addresses apart from the integration test's (10.251.77/78), which may run
# at the same time.
NODE_IP, ROUTER_NODE_IP = "10.251.97.1", "10.251.97.2"
ROUTER_HOST_IP, HOST_IP = "10.251.98.1", "10.251.98.2"
MB = 1_000_000
STREAM_SIZE = "64M"
SMALL_SIZE = "4096"


def run_ok(args):
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


class Link:
    """The node and router namespaces, and the shaped link between the
    router and this namespace."""

    def __init__(self, rate, queue, burst, congestion_control):
        self.node, self.router = f"{TAG}n", f"{TAG}r"
        self.node_end, self.router_node_end = f"{TAG}a", f"{TAG}b"
        self.router_host_end, self.host_end = f"{TAG}c", f"{TAG}d"
        self.remove()
        n, r = self.node, self.router
        for args in [
            ["netns", "add", n], ["netns", "add", r],
            ["link", "add", self.node_end, "type", "veth", "peer", "name", self.router_node_end],
            ["link", "set", self.node_end, "netns", n],
            ["link", "set", self.router_node_end, "netns", r],
            ["link", "add", self.host_end, "type", "veth", "peer", "name", self.router_host_end],
            ["link", "set", self.router_host_end, "netns", r],
            ["-n", n, "addr", "add", f"{NODE_IP}/30", "dev", self.node_end],
            ["-n", r, "addr", "add", f"{ROUTER_NODE_IP}/30", "dev", self.router_node_end],
            ["-n", r, "addr", "add", f"{ROUTER_HOST_IP}/30", "dev", self.router_host_end],
            ["addr", "add", f"{HOST_IP}/30", "dev", self.host_end],
            ["-n", n, "link", "set", self.node_end, "up"],
            ["-n", n, "link", "set", "lo", "up"],
            ["-n", r, "link", "set", self.router_node_end, "up"],
            ["-n", r, "link", "set", self.router_host_end, "up"],
            ["link", "set", self.host_end, "up"],
            # Per route: the host's net.ipv4.tcp_congestion_control may
            # be locked (tcp_allowed_congestion_control), a route's is not.
            ["-n", n, "route", "add", "default", "via", ROUTER_NODE_IP,
             "congctl", congestion_control],
            ["route", "add", f"{NODE_IP.rsplit('.', 1)[0]}.0/30", "via", ROUTER_HOST_IP],
        ]:
            run_ok(["ip"] + args)
        run_ok(["ip", "netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        run_ok(["tc", "-n", r, "qdisc", "add", "dev", self.router_host_end, "root", "tbf",
                "rate", rate, "burst", burst, "limit", queue])

    def remove(self):
        for name in [self.node, self.router]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "route", "del", f"{NODE_IP.rsplit('.', 1)[0]}.0/30"],
                       capture_output=True)
        # The host's end goes with the router's unless a process still
        # holds that namespace: remove it by name too.
        subprocess.run(["ip", "link", "del", self.host_end], capture_output=True)

    def qdisc(self):
        """(backlog bytes, dropped packets, sent bytes) of the shaped queue."""
        out = run_ok(["tc", "-s", "-n", self.router, "qdisc", "show", "dev",
                      self.router_host_end])
        backlog = re.search(r"backlog (\d+)b", out)
        dropped = re.search(r"dropped (\d+)", out)
        sent = re.search(r"Sent (\d+) bytes", out)
        return (int(backlog.group(1)) if backlog else 0,
                int(dropped.group(1)) if dropped else 0,
                int(sent.group(1)) if sent else 0)

    def host_rx(self):
        with open(f"/sys/class/net/{self.host_end}/statistics/rx_bytes") as f:
            return int(f.read())


def socket_bytes():
    """bytes_received of every TCP socket of this namespace to the node, by
    (local, peer) address, with the owning process id."""
    out = run_ok(["ss", "-tinpH", "dst", NODE_IP])
    sockets, key, pid = {}, None, None
    for line in out.splitlines():
        if line and not line[0].isspace():
            fields = line.split()
            key = (fields[3], fields[4]) if len(fields) >= 5 else None
            found = re.search(r"pid=(\d+)", line)
            pid = int(found.group(1)) if found else None
            continue
        found = re.search(r"bytes_received:(\d+)", line)
        if key and found:
            sockets[key] = (pid, int(found.group(1)))
    return sockets


ECHO = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 0))
print(s.getsockname()[1], flush=True)
while True:
    data, peer = s.recvfrom(64)
    s.sendto(data, peer)
"""


class Probe(threading.Thread):
    """Round trips of a 32-byte UDP echo to the node every 50 ms."""

    def __init__(self, link):
        super().__init__(daemon=True)
        self.echo = subprocess.Popen(["ip", "netns", "exec", link.node, sys.executable, "-c",
                                      ECHO], stdout=subprocess.PIPE, text=True)
        self.port = int(self.echo.stdout.readline())
        self.halt = threading.Event()
        self.rtts = []
        self.start()

    def run(self):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(1.0)
            while not self.halt.wait(0.05):
                sent = time.monotonic()
                s.sendto(b"x" * 32, (NODE_IP, self.port))
                try:
                    s.recvfrom(64)
                except OSError:
                    continue
                self.rtts.append((time.monotonic() - sent) * 1e3)

    def stop(self):
        """The median round trip, ms."""
        self.halt.set()
        self.join()
        stop(self.echo)
        return statistics.median(self.rtts) if self.rtts else float("nan")


class Sampler(threading.Thread):
    """Every 0.25 s: the bytes each client process received since start
    (a socket first seen after the start counts from zero), the router's
    backlog, and at start and stop the link's counters."""

    def __init__(self, link):
        super().__init__(daemon=True)
        self.link = link
        self.halt = threading.Event()
        self.by_pid, self.backlogs = {}, []
        self.last = socket_bytes()
        self.started = time.monotonic()
        self.rx0 = link.host_rx()
        self.dropped0 = link.qdisc()[1]
        # A UDP echo in the node's namespace: its replies cross the
        # router's queue as the data (and the metadata replies) do, so
        # their round trip is the queueing delay one crossing adds.
        self.probe = Probe(link)

    def sample(self):
        now = socket_bytes()
        for key, (pid, received) in now.items():
            before = self.last.get(key, (pid, 0))[1]
            self.by_pid[pid] = self.by_pid.get(pid, 0) + max(0, received - before)
        self.last = now
        self.backlogs.append(self.link.qdisc()[0])

    def run(self):
        while not self.halt.wait(0.25):
            self.sample()

    def stop(self):
        self.halt.set()
        self.join()
        self.sample()
        self.seconds = time.monotonic() - self.started
        self.link_mb_per_s = (self.link.host_rx() - self.rx0) / self.seconds / MB
        self.dropped = self.link.qdisc()[1] - self.dropped0
        self.echo_ms = self.probe.stop()

    def mb_per_s(self, pids):
        return sum(self.by_pid.get(pid, 0) for pid in pids) / self.seconds / MB


class Store:
    """A one-node `strata store up` in the node's namespace."""

    def __init__(self, strata, link, workdir, flags, nice=0):
        self.strata = strata
        self.dir = tempfile.mkdtemp(dir=workdir)
        self.log = open(os.path.join(self.dir, "store.log"), "w")
        self.process = subprocess.Popen(
            ["nice", "-n", str(nice), "ip", "netns", "exec", link.node, strata, "store", "up",
             "--dir", self.dir,
             "--listen", f"{NODE_IP}:0", "--mn", "1", "--sn", "1",
             "--replication", "1,1,1,1"] + flags,
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.process.stdout.readline()
        if "ready on " not in line:
            tail = self.stop()
            raise RuntimeError(f"store up with {flags} did not start: {line!r}; "
                               f"its log ends: {tail}")
        self.on = line.split("ready on ", 1)[1].split()[0]
        # Keep reading its output so that it never blocks on a full pipe.
        threading.Thread(target=self.process.stdout.read, daemon=True).start()

    def log_tail(self):
        try:
            with open(self.log.name, errors="replace") as f:
                return f.read()[-800:].strip()
        except OSError:
            return "(no log)"

    def tenant(self, name):
        run_ok([self.strata, "store", "tenant", "add", "--dir", self.dir, "--tenant", name])
        return os.path.join(self.dir, f"{name}.credential")

    def bench_args(self, credential, workload, threads, ops, size, prefix, passes=1):
        return [self.strata, "store", "bench", "--cluster", self.on, "--output", "json",
                "--credential", credential, "--workload", workload, "--threads", str(threads),
                "--ops", str(ops), "--size", size, "--prefix", prefix, "--passes", str(passes)]

    def bench(self, *args, **kwargs):
        out = subprocess.run(self.bench_args(*args, **kwargs), capture_output=True,
                             text=True, env=self.env())
        if not out.stdout:
            raise RuntimeError(f"store bench {args}: {out.stderr.strip()}")
        report = json.loads(out.stdout)
        if report["errors"]:
            raise RuntimeError(f"store bench {args}: {report['errors']} errors: "
                               f"{out.stderr.strip()[-500:]}")
        return report

    def stream(self, credential, threads, prefix):
        """Clients streaming 64 MB Gets until stopped."""
        return subprocess.Popen(
            self.bench_args(credential, "get", threads, 1, STREAM_SIZE, prefix, passes=100000),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env())

    def env(self):
        return dict(os.environ, STRATA_CLUSTER_KEY=os.path.join(self.dir, "cluster.key"))

    def stop(self):
        stop(self.process)
        self.log.close()
        tail = self.log_tail()
        # Each store holds hundreds of MB: bound the disk a run takes.
        shutil.rmtree(self.dir, ignore_errors=True)
        return tail


def stop(process):
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def latency_mode(a, link, workdir, name, flags, streaming=True):
    """One mode's small-Get latencies, series and stream throughput; with
    `streaming` false, the small Gets alone (the floor)."""
    store = Store(a.strata, link, workdir, flags, a.nice)
    streams = []
    try:
        bulk, small = store.tenant("bulk"), store.tenant("small")
        store.bench(bulk, "post", 4, 1, STREAM_SIZE, "bulk/b")
        store.bench(small, "post", 8, a.small_objects, SMALL_SIZE, "small/s")
        if streaming:
            streams = [store.stream(bulk, 4, "bulk/b")]
            time.sleep(a.warmup)
        sampler = Sampler(link)
        sampler.start()
        series, begin = [], time.monotonic()
        while time.monotonic() - begin < a.window:
            at = time.monotonic() - begin
            r = store.bench(small, "get", 8, a.series_ops, SMALL_SIZE, "small/s")
            series.append({"t": at, "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"],
                           "seconds": r["seconds"]})
        whole = store.bench(small, "get", 8, a.small_objects, SMALL_SIZE, "small/s",
                            passes=a.small_passes)
        streaming = all(s.poll() is None for s in streams)
        sampler.stop()
        if not streaming:
            raise RuntimeError(f"{name}: the streams ended before the small Gets did")
        return {
            "mode": name, "flags": flags,
            "small_p50_ms": whole["p50_ms"], "small_p99_ms": whole["p99_ms"],
            "small_gets": whole["ops"],
            "series_p50_ms": statistics.median(s["p50_ms"] for s in series),
            "stream_mb_per_s": sampler.mb_per_s([s.pid for s in streams]),
            "link_mb_per_s": sampler.link_mb_per_s,
            "backlog_kb_median": statistics.median(sampler.backlogs) / 1e3,
            "backlog_kb_max": max(sampler.backlogs) / 1e3,
            "dropped": sampler.dropped,
            "echo_ms": sampler.echo_ms,
            "seconds": sampler.seconds,
            "series": series,
        }
    finally:
        for s in streams:
            stop(s)
        store.stop()


WEIGHTS = {"w1": 1, "w2": 2, "w3": 3}
IDLE = "no streams"


def weighted(a, link, workdir):
    flags = ["--rs3", "--rs3-batch", a.weight_batch]
    for tenant, weight in WEIGHTS.items():
        flags += ["--rs3-weight", f"{tenant}={weight}"]
    store = Store(a.strata, link, workdir, flags, a.nice)
    streams = {}
    try:
        credentials = {t: store.tenant(t) for t in WEIGHTS}
        for tenant, credential in credentials.items():
            store.bench(credential, "post", a.weight_clients, 1, STREAM_SIZE, f"{tenant}/b")
        for tenant, credential in credentials.items():
            streams[tenant] = store.stream(credential, a.weight_clients, f"{tenant}/b")
        time.sleep(a.warmup)
        sampler = Sampler(link)
        sampler.start()
        time.sleep(a.window)
        streaming = all(s.poll() is None for s in streams.values())
        sampler.stop()
        if not streaming:
            raise RuntimeError("weighted: a tenant's streams ended early")
        rates = {t: sampler.mb_per_s([s.pid]) for t, s in streams.items()}
        total = sum(rates.values())
        return {
            "flags": flags, "total_mb_per_s": total, "link_mb_per_s": sampler.link_mb_per_s,
            "backlog_kb_median": statistics.median(sampler.backlogs) / 1e3,
            "echo_ms": sampler.echo_ms,
            "tenants": {t: {"weight": WEIGHTS[t], "mb_per_s": rates[t],
                            "share": rates[t] / total if total else 0.0}
                        for t in WEIGHTS},
        }
    finally:
        for s in streams.values():
            stop(s)
        store.stop()


def median_rows(runs, keys):
    return {k: statistics.median(r[k] for r in runs) for k in keys}


LATENCY_KEYS = ["small_p50_ms", "small_p99_ms", "series_p50_ms", "stream_mb_per_s",
                "link_mb_per_s", "backlog_kb_median", "backlog_kb_max", "dropped", "echo_ms"]


def print_latency(modes, base):
    print("\n### Small 4 KiB Gets (8 clients) under 4 streams of 64 MB Gets\n")
    print("| mode | small p50 ms | small p99 ms | series p50 ms | p50 without/with "
          "| streams MB/s | with/without | link MB/s | queue KB (median, max) | drops "
          "| UDP echo ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    off = modes[base]
    for name, m in modes.items():
        ratio = "-" if name == IDLE else f"{m['stream_mb_per_s'] / off['stream_mb_per_s']:.3f}"
        print(f"| {name} | {m['small_p50_ms']:.2f} | {m['small_p99_ms']:.2f} "
              f"| {m['series_p50_ms']:.2f} | {off['small_p50_ms'] / m['small_p50_ms']:.1f}x "
              f"| {m['stream_mb_per_s']:.1f} | {ratio} "
              f"| {m['link_mb_per_s']:.1f} | {m['backlog_kb_median']:.0f}, "
              f"{m['backlog_kb_max']:.0f} | {m['dropped']:.0f} | {m['echo_ms']:.2f} |")
    print("\nTargets: p50 without/with >= 20x; streams with/without >= 0.85.")


def print_weighted(runs):
    print("\n### Weighted shares, RS3 weights 1:2:3\n")
    print("| tenant | weight | MB/s | share | target | share/target |")
    print("|---|---|---|---|---|---|")
    total = statistics.median(r["total_mb_per_s"] for r in runs)
    for tenant, weight in WEIGHTS.items():
        rate = statistics.median(r["tenants"][tenant]["mb_per_s"] for r in runs)
        share = statistics.median(r["tenants"][tenant]["share"] for r in runs)
        target = weight / sum(WEIGHTS.values())
        print(f"| {tenant} | {weight} | {rate:.1f} | {share:.3f} | {target:.3f} "
              f"| {share / target:.3f} |")
    print(f"\nTotal {total:.1f} MB/s. Target: share/target within 0.95 to 1.05.")


def svg_plot(path, series_by_mode, labels, title):
    """A line chart of each mode's small-Get p50 over time, log scale."""
    width, height = 760, 420
    left, right, top, bottom = 70, 250, 40, 50
    plot_w, plot_h = width - left - right, height - top - bottom
    points = [p for s in series_by_mode.values() for p in s]
    t_max = max([p["t"] + p["seconds"] for p in points] + [1.0])
    values = [max(p["p50_ms"], 1e-3) for p in points] or [1.0]
    low = 10 ** math.floor(math.log10(min(values)))
    high = 10 ** math.ceil(math.log10(max(values)))
    if high <= low:
        high = low * 10

    def x(t):
        return left + plot_w * t / t_max

    def y(v):
        span = math.log10(high) - math.log10(low)
        return top + plot_h * (1 - (math.log10(max(v, low)) - math.log10(low)) / span)

    colors = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left + plot_w / 2}" y="22" text-anchor="middle" font-size="14">'
           f'{title}</text>',
           f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
           f'stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="black"/>']
    decade = low
    while decade <= high * 1.0001:
        for step in (1, 2, 5):
            v = decade * step
            if v > high * 1.0001:
                break
            out.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{left + plot_w}" '
                       f'y2="{y(v):.1f}" stroke="#ddd"/>')
            out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">'
                       f'{v:g}</text>')
        decade *= 10
    step = 1 if t_max <= 12 else 2 if t_max <= 24 else 5
    t = 0
    while t <= t_max:
        out.append(f'<line x1="{x(t):.1f}" y1="{top + plot_h}" x2="{x(t):.1f}" '
                   f'y2="{top + plot_h + 5}" stroke="black"/>')
        out.append(f'<text x="{x(t):.1f}" y="{top + plot_h + 18}" text-anchor="middle">'
                   f'{t}</text>')
        t += step
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 12}" text-anchor="middle">'
               f'seconds into the measurement (4 streams of 64 MB Gets all along)</text>')
    out.append(f'<text transform="translate(18,{top + plot_h / 2}) rotate(-90)" '
               f'text-anchor="middle">4 KiB Get p50 per run (ms, log)</text>')
    for i, (name, series) in enumerate(series_by_mode.items()):
        color = "#888" if name == IDLE else colors[i % len(colors)]
        line = " ".join(f"{x(p['t']):.1f},{y(p['p50_ms']):.1f}" for p in series)
        out.append(f'<polyline points="{line}" fill="none" stroke="{color}" '
                   f'stroke-width="1.5"/>')
        for p in series:
            out.append(f'<circle cx="{x(p["t"]):.1f}" cy="{y(p["p50_ms"]):.1f}" r="2" '
                       f'fill="{color}"/>')
        ly = top + 10 + 36 * i
        out.append(f'<line x1="{left + plot_w + 15}" y1="{ly}" x2="{left + plot_w + 40}" '
                   f'y2="{ly}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{left + plot_w + 45}" y="{ly + 4}">{name}</text>')
        out.append(f'<text x="{left + plot_w + 45}" y="{ly + 18}" font-size="10" '
                   f'fill="#555">{labels[name]}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default=os.path.join(ROOT, "target", "release", "strata"))
    ap.add_argument("--rate", default="1gbit", help="the link's rate (tc tbf)")
    ap.add_argument("--queue", default="8mb", help="the router's queue (tc tbf limit)")
    ap.add_argument("--burst", default="256kb", help="tc tbf burst")
    ap.add_argument("--cc", default="cubic",
                    help="the node's TCP congestion control (cubic: Linux's default)")
    ap.add_argument("--batches", default="64K,128K,256K", help="RS3 batch budgets to run")
    ap.add_argument("--weight-batch", default="256K", help="RS3 batch of the weighted run")
    ap.add_argument("--weight-clients", type=int, default=4, help="stream clients per tenant")
    ap.add_argument("--nice", type=int, default=0,
                    help="the store's niceness (-10: ahead of other work on a shared host)")
    ap.add_argument("--no-weights", action="store_true", help="skip the weighted run")
    ap.add_argument("--small-objects", type=int, default=8, help="4 KiB objects per client")
    ap.add_argument("--small-passes", type=int, default=2)
    ap.add_argument("--series-ops", type=int, default=4,
                    help="4 KiB Gets per client in each run of the time series")
    ap.add_argument("--warmup", type=float, default=2.5)
    ap.add_argument("--window", type=float, default=8.0, help="seconds of time series")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one repeat, shorter windows")
    ap.add_argument("--json-out", default=None, help="also write every result to this file")
    ap.add_argument("--plot", default=os.path.join(ROOT, "docs", "rs3-latency.svg"))
    a = ap.parse_args()
    if a.quick:
        a.repeat, a.window = 1, 3.0
    if os.geteuid() != 0:
        sys.exit("rs3_bench.py needs root (ip netns, tc)")
    modes = [("RS3 off", [])] + [(f"RS3 {b}", ["--rs3", "--rs3-batch", b])
                                 for b in a.batches.split(",") if b]
    # The small Gets alone, RS3 off: the floor RS3 can approach.
    modes.append((IDLE, []))
    # SIGTERM ends the run through the finally blocks: the namespaces go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    link = Link(a.rate, a.queue, a.burst, a.cc)
    results = {"latency": [], "weighted": []}
    try:
        with tempfile.TemporaryDirectory(prefix="rs3-bench-") as workdir:
            for i in range(a.repeat):
                run = {}
                for name, flags in modes:
                    print(f"# run {i + 1}/{a.repeat}: {name}", file=sys.stderr, flush=True)
                    run[name] = latency_mode(a, link, workdir, name, flags, name != IDLE)
                    m = run[name]
                    print(f"#   small p50 {m['small_p50_ms']:.2f} ms, p99 "
                          f"{m['small_p99_ms']:.2f} ms, streams {m['stream_mb_per_s']:.1f}"
                          f" MB/s, queue {m['backlog_kb_median']:.0f} KB",
                          file=sys.stderr, flush=True)
                results["latency"].append(run)
                if a.no_weights:
                    continue
                print(f"# run {i + 1}/{a.repeat}: weights 1:2:3", file=sys.stderr, flush=True)
                w = weighted(a, link, workdir)
                print("#   " + ", ".join(f"{t} {v['mb_per_s']:.1f} MB/s ({v['share']:.3f})"
                                          for t, v in w["tenants"].items()),
                      file=sys.stderr, flush=True)
                results["weighted"].append(w)
    finally:
        link.remove()
    print(f"Link {a.rate}, router queue {a.queue}, node's TCP congestion control {a.cc}; "
          f"median of {a.repeat} run(s).")
    medians = {name: median_rows([r[name] for r in results["latency"]], LATENCY_KEYS)
               for name, _ in modes}
    print_latency(medians, modes[0][0])
    if results["weighted"]:
        print_weighted(results["weighted"])
    first = results["latency"][0]
    labels = {name: f"p50 {m['small_p50_ms']:.1f} ms, streams {m['stream_mb_per_s']:.0f} MB/s"
              for name, m in medians.items()}
    svg_plot(a.plot, {name: first[name]["series"] for name, _ in modes}, labels,
             f"4 KiB Gets under 4 streams of 64 MB Gets, link {a.rate}, queue {a.queue}, {a.cc}")
    print(f"\nPlot: {a.plot}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"args": vars(a), "medians": medians, **results}, f, indent=1)


if __name__ == "__main__":
    main()

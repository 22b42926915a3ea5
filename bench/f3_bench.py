#!/usr/bin/env python3
"""F3 benchmark on shaped links: issue 30's experiments 2 (fio), 3
(read-while-write) and 4 (a pipeline under link load).

Usage (as root: network namespaces, tc, cgroups, FUSE mounts):
    python3 bench/f3_bench.py [--strata PATH] [--rate 200mbit] [--disk 40M]
        [--size 512M] [--repeat 3] [--stream-size 400M] [--stream-rate 20M]
        [--pipeline-mb 200] [--loads 0,50,75,90]
        [--only fio|stream|pipeline] [--json-out FILE]

Setup. A bridge in the root network namespace carries 10.77.0.1, where two
object stores run (`strata store up`, 3 storage nodes each: replication
1,1,1,1 and 3,2,3,2) with one F3 service each (`strata f3 serve`). Nodes a
and b are network namespaces on the bridge through a veth pair; each link
is shaped with `tc tbf` at --rate in both directions (the namespace side
shapes what the node sends, the host side what it receives). Each node
runs two agents (`strata node`, entered with `nsenter --net` so that their
FUSE mounts are visible to every process): one with the replication-1
store and service, one with the replication-3 ones. The agents of a node
share a cgroup v1 blkio group limiting /dev/vda reads and writes to --disk
bytes per second (the node's local tier). The stores' disks are not
limited: the durable tier is bounded by the link only.

Experiment 2 (fio, 1 MiB blocks, --size, psync, end_fsync=1), --repeat
rounds, the cases interleaved within each round:
  ceiling      fio on node a's directory itself, inside a's cgroup
  f3-local     an ephemeral file (NAME.eph) written and read on node a
  f3-remote    that file read on node b (pulled from a over both links)
  durable-r1   a durable file written on a (uploaded at close), read on b
  durable-r3   the same on the replication-3 store
Bandwidth is the size over the wall time of the fio process (open to
close, so a durable file's upload at close counts). The agent does not
implement fsync (ephemeral content is not durable by design), so an F3
write ends in node a's page cache; "f3-local to disk" adds the time to
fsync the content file in a's directory from a's cgroup. Before every
read the page cache is dropped (echo 3 > /proc/sys/vm/drop_caches), so
reads come from the throttled disk or over the link.

Experiment 3 (read-while-write): a producer on node a writes an ephemeral
file of --stream-size in 1 MiB writes paced at --stream-rate; a consumer
on node b reads it (a) at once, to end of file (F3 blocks at end of file
while the writer is open), (b) after polling once a second for a marker
file the producer makes after its close, (c) after the producer has
finished. Reported: end-to-end time (producer start to consumer end) and
the consumer's first byte (after the producer's start). The consumer
checks every byte.

Experiment 4 (a pipeline under link load): a FASTQ-like input of
--pipeline-mb MB (4-line records: @id, 100 bases of acgt, +, 100 quality
characters) is written before the clock starts as an ephemeral file held
by node a. Two streaming filters run as a workflow (`strata f3 run`,
service and agents of the replication-1 store): `upper` rewrites every
record (tr acgt ACGT: the same size) and `sample` keeps 1 record in 7
(sed), so 926 -> 926 -> 132 MB for 926 MB in. Three ways:
  f3-locality     intermediate ephemeral, --scheduler locality, `sample`
                  streams it (stream: true) on the node that writes it
  f3-round-robin  the same, --scheduler round-robin: `sample` on node b
                  streams the intermediate over both links while written
  durable         intermediate durable (uploaded to the store over a's link
                  at its close; an object is complete only then, so
                  `sample` does not stream it), --scheduler locality: a
                  keeps a local copy of what it wrote, so `sample` runs
                  on a and reads that copy
  durable-round-robin  the same, --scheduler round-robin: `sample` on b
                  downloads the intermediate over b's link
(--ways picks some of them; all by default.)
The final output is ephemeral in every case, and its size is checked. A
load generator sends paced UDP (32 KiB datagrams) at --loads percent of
--rate over every shaped direction, for the run only: from the root
namespace to each node and from each node to the bridge address (no
listener: the datagrams are dropped after crossing the link). Reported:
end-to-end time of `strata f3 run` per (load, way), medians over
--repeat rounds, and F3's lead = durable time / F3 time - 1.

Everything lives under /tmp/f3bench-PID and is removed at exit, with the
namespaces, bridge, cgroups, mounts and processes (also on Ctrl-C).
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import zlib

STRATA_DEFAULT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "strata"
)
DISK = "254:0"  # /dev/vda
BRIDGE_IP = "10.77.0.1"
NODES = ["a", "b"]
MIB = 1 << 20
PIPELINE_WAYS = ["f3-locality", "f3-round-robin", "durable", "durable-round-robin"]
PIPELINE_TARGET = {50: 0.16, 75: 0.25, 90: 0.59}  # issue 30: F3's lead over durable


def run(args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower()
    if text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


class Bench:
    def __init__(self, opts):
        self.opts = opts
        self.tag = f"f3b{os.getpid() % 10000}"
        self.work = f"/tmp/f3bench-{os.getpid()}"
        self.procs = []
        self.logs = []
        self.mounts = []
        self.links = {}
        self.cgroups = {}

    # ---- setup -------------------------------------------------------

    def setup_network(self):
        br = f"{self.tag}br"
        run(["ip", "link", "add", br, "type", "bridge"])
        self.bridge = br
        run(["ip", "addr", "add", f"{BRIDGE_IP}/24", "dev", br])
        run(["ip", "link", "set", br, "up"])
        for i, n in enumerate(NODES):
            ns, host, peer = f"{self.tag}{n}", f"{self.tag}{n}h", f"{self.tag}{n}p"
            run(["ip", "netns", "add", ns])
            run(["ip", "link", "add", host, "type", "veth", "peer", "name", peer])
            run(["ip", "link", "set", peer, "netns", ns])
            run(["ip", "-n", ns, "link", "set", peer, "name", "eth0"])
            run(["ip", "-n", ns, "addr", "add", f"10.77.0.{11 + i}/24", "dev", "eth0"])
            run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
            run(["ip", "link", "set", host, "master", br])
            run(["ip", "link", "set", host, "up"])
            tbf = ["tbf", "rate", self.opts.rate, "burst", "256kb", "latency", "50ms"]
            run(["tc", "qdisc", "add", "dev", host, "root", *tbf])
            run(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", *tbf])
            self.links[n] = {"ns": ns, "host": host, "ip": f"10.77.0.{11 + i}"}

    def setup_cgroups(self):
        for n in NODES:
            path = f"/sys/fs/cgroup/blkio/{self.tag}-{n}"
            os.makedirs(path, exist_ok=True)
            self.cgroups[n] = path
            limit = parse_size(self.opts.disk)
            if limit:
                for knob in ["read_bps_device", "write_bps_device"]:
                    with open(os.path.join(path, f"blkio.throttle.{knob}"), "w") as f:
                        f.write(f"{DISK} {limit}\n")

    def spawn(self, name, args, cgroup=None, env=None):
        log = open(os.path.join(self.work, f"{name}.log"), "w")
        self.logs.append(log)

        def enter():
            if cgroup:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))

        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=enter, env=env, start_new_session=True)
        self.procs.append(proc)
        return proc, log.name

    def wait_line(self, logname, word, proc, limit=60):
        deadline = time.time() + limit
        while time.time() < deadline:
            with open(logname) as f:
                text = f.read()
            if word in text:
                return text
            if proc.poll() is not None:
                sys.exit(f"{logname}: exited early:\n{text[-2000:]}")
            time.sleep(0.1)
        sys.exit(f"{logname}: no {word!r} after {limit}s")

    def setup_services(self):
        # env: the agents' own logs at warnings only (bounded).
        env = dict(os.environ, RUST_LOG="warn")
        self.stores = {}
        for r, repl, port, meta in [(1, "1,1,1,1", 10890, 10893), (3, "3,2,3,2", 10891, 10894)]:
            d = os.path.join(self.work, f"store{r}")
            p, log = self.spawn(f"store{r}", [self.opts.strata, "store", "up", "--dir", d,
                                              "--listen", f"{BRIDGE_IP}:{port}", "--sn", "3",
                                              "--replication", repl, "--scrub-rate", "0"],
                                env=env)
            self.wait_line(log, "ready", p)
            m, mlog = self.spawn(f"meta{r}", [self.opts.strata, "f3", "serve", "--dir",
                                              os.path.join(self.work, f"meta{r}"),
                                              "--listen", f"{BRIDGE_IP}:{meta}"], env=env)
            self.wait_line(mlog, "serving", m)
            self.stores[r] = {"store": f"{BRIDGE_IP}:{port}", "meta": f"{BRIDGE_IP}:{meta}",
                              "credential": os.path.join(d, "admin.credential")}
        self.mount = {}
        self.dirs = {}
        for n in NODES:
            for r, s in self.stores.items():
                key = f"{n}{r}"
                d = os.path.join(self.work, f"node-{key}")
                mnt = os.path.join(self.work, f"mnt-{key}")
                os.makedirs(mnt)
                p, log = self.spawn(
                    f"node-{key}",
                    ["nsenter", f"--net=/var/run/netns/{self.links[n]['ns']}", self.opts.strata,
                     "node", "--name", n, "--dir", d, "--mount", mnt, "--meta", s["meta"],
                     "--listen", f"{self.links[n]['ip']}:0", "--store", s["store"],
                     "--credential", s["credential"]],
                    cgroup=self.cgroups[n], env=env)
                self.wait_line(log, "ready", p)
                self.mounts.append(mnt)
                self.mount[key] = mnt
                self.dirs[key] = d

    # ---- measuring -----------------------------------------------------

    def link_bytes(self):
        total = {}
        for n, link in self.links.items():
            base = f"/sys/class/net/{link['host']}/statistics"
            total[n] = sum(int(open(f"{base}/{k}").read()) for k in ["rx_bytes", "tx_bytes"])
        return total

    def timed(self, fn):
        before = self.link_bytes()
        start = time.monotonic()
        result = fn()
        seconds = time.monotonic() - start
        after = self.link_bytes()
        moved = {n: after[n] - before[n] for n in after}
        return seconds, moved, result

    def fio(self, path, mode, cgroup=None):
        args = ["fio", "--name=f3", f"--filename={path}", f"--rw={mode}", "--bs=1M",
                f"--size={self.size}", "--ioengine=psync", "--output-format=json",
                "--invalidate=0"]
        if mode == "write":
            args.append("--end_fsync=1")

        def enter():
            if cgroup:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))

        def go():
            out = subprocess.run(args, check=True, capture_output=True, text=True,
                                 preexec_fn=enter)
            job = json.loads(out.stdout)["jobs"][0][mode]
            return job["io_bytes"]

        seconds, moved, io_bytes = self.timed(go)
        if io_bytes != self.size:
            sys.exit(f"fio {mode} {path}: {io_bytes} bytes, expected {self.size}")
        return {"mb_s": self.size / seconds / 1e6, "s": seconds,
                "link_mb": {n: m / 1e6 for n, m in moved.items()}}

    def fsync_newest(self, directory, cgroup):
        """Time to fsync the newest content file in `directory` from `cgroup`."""
        files = [os.path.join(directory, f) for f in os.listdir(directory)]
        newest = max(files, key=os.path.getmtime)
        code = ("import os,sys;fd=os.open(sys.argv[1],os.O_RDONLY);os.fsync(fd)")

        def enter():
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

        start = time.monotonic()
        subprocess.run([sys.executable, "-c", code, newest], check=True, preexec_fn=enter)
        return time.monotonic() - start

    def fio_round(self, k):
        r = {}
        # The ceiling: the node's own directory, under its cgroup's limit.
        ceiling = os.path.join(self.dirs["a1"], f"ceiling-{k}.dat")
        r["ceiling write"] = self.fio(ceiling, "write", self.cgroups["a"])
        drop_caches()
        r["ceiling read"] = self.fio(ceiling, "read", self.cgroups["a"])
        os.remove(ceiling)
        # F3-local: written and read on node a.
        eph = f"round-{k}.eph"
        drop_caches()
        w = self.fio(os.path.join(self.mount["a1"], eph), "write")
        synced = self.fsync_newest(os.path.join(self.dirs["a1"], "files"), self.cgroups["a"])
        r["f3-local write"] = w
        r["f3-local write to disk"] = {"mb_s": self.size / (w["s"] + synced) / 1e6, "s": w["s"] + synced,
                                       "link_mb": w["link_mb"]}
        drop_caches()
        r["f3-local read"] = self.fio(os.path.join(self.mount["a1"], eph), "read")
        # F3-remote: node b pulls node a's file over both links.
        drop_caches()
        r["f3-remote read"] = self.fio(os.path.join(self.mount["b1"], eph), "read")
        for rep in [1, 3]:
            dur = f"round-{k}-r{rep}.dat"
            drop_caches()
            r[f"durable-r{rep} write"] = self.fio(os.path.join(self.mount[f"a{rep}"], dur), "write")
            drop_caches()
            r[f"durable-r{rep} read"] = self.fio(os.path.join(self.mount[f"b{rep}"], dur), "read")
        for case, v in r.items():
            print(f"  round {k}: {case:24s} {v['mb_s']:7.1f} MB/s {v['s']:6.1f} s "
                  f"links a/b {v['link_mb']['a']:.0f}/{v['link_mb']['b']:.0f} MB", flush=True)
        # Free the disk for the next round (ephemeral on a, copies on b).
        for name, m in [(eph, "a1"), (f"round-{k}-r1.dat", "a1"), (f"round-{k}-r3.dat", "a3")]:
            try:
                os.remove(os.path.join(self.mount[m], name))
            except OSError as e:
                print(f"  (could not remove {name}: {e})")
        return r

    # ---- read-while-write ----------------------------------------------

    def produce(self, path, marker, t0, out):
        size, rate = self.stream_size, parse_size(self.opts.stream_rate)
        block = bytes((i * 7) % 251 for i in range(MIB))
        written = 0
        with open(path, "wb", buffering=0) as f:
            while written < size:
                n = min(MIB, size - written)
                f.write(block[:n])
                written += n
                ahead = t0 + written / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        out["produced"] = time.monotonic() - t0
        with open(marker, "wb"):
            pass

    def consume(self, path, t0, out):
        while not os.path.exists(path):
            time.sleep(0.01)
        block = bytes((i * 7) % 251 for i in range(MIB))
        got, first, bad = 0, None, False
        with open(path, "rb", buffering=0) as f:
            while True:
                data = f.read(MIB)
                if not data:
                    break
                if first is None:
                    first = time.monotonic() - t0
                # Every write is a prefix of `block` and starts at a MiB boundary.
                off = got % MIB
                if data != block[off:off + len(data)]:
                    bad = True
                got += len(data)
        out.update(first_byte=first, consumed=time.monotonic() - t0, bytes=got, bad=bad)

    def stream_case(self, mode, k):
        name = f"stream-{mode}-{k}.eph"
        src = os.path.join(self.mount["a1"], name)
        dst = os.path.join(self.mount["b1"], name)
        marker_a = os.path.join(self.mount["a1"], f"stream-{mode}-{k}.done.eph")
        marker_b = os.path.join(self.mount["b1"], f"stream-{mode}-{k}.done.eph")
        out = {}
        drop_caches()
        before = self.link_bytes()
        t0 = time.monotonic()
        producer = threading.Thread(target=self.produce, args=(src, marker_a, t0, out))
        producer.start()
        if mode == "sequential":
            producer.join()
        elif mode == "poll":
            while not os.path.exists(marker_b):
                time.sleep(1.0)
        self.consume(dst, t0, out)
        producer.join()
        after = self.link_bytes()
        if out["bytes"] != self.stream_size or out["bad"]:
            sys.exit(f"{mode}: consumer read {out['bytes']} bytes (bad={out['bad']}), "
                     f"expected {self.stream_size}")
        out["link_mb_b"] = (after["b"] - before["b"]) / 1e6
        print(f"  round {k}: {mode:16s} end-to-end {out['consumed']:6.1f} s, first byte "
              f"{out['first_byte']:6.2f} s, producer {out['produced']:5.1f} s, "
              f"b's link {out['link_mb_b']:.0f} MB", flush=True)
        for p in [src, marker_a]:
            os.remove(p)
        return out

    # ---- pipeline under link load ----------------------------------------

    def make_fastq(self, path, size):
        """Writes FASTQ-like records up to `size` bytes; returns (records, kept bytes)."""
        import random
        rng = random.Random(7)
        pool = ["".join(rng.choice("acgt") for _ in range(100)) for _ in range(64)]
        qual = "".join(chr(33 + rng.randrange(41)) for _ in range(100))
        written, kept, n, chunk = 0, 0, 0, []
        with open(path, "w") as f:
            while written < size:
                rec = f"@r{n:012d}\n{pool[n % 64]}\n+\n{qual}\n"
                chunk.append(rec)
                written += len(rec)
                if n % 7 == 0:
                    kept += len(rec)
                n += 1
                if len(chunk) >= 4096:
                    f.write("".join(chunk))
                    chunk = []
            f.write("".join(chunk))
        return n, written, kept

    def pipeline_yaml(self, durable):
        mid = "/pipe-mid.fq" if durable else "/pipe-mid.eph"
        stream = "false" if durable else "true"
        return f"""steps:
  - name: upper
    function: [/bin/sh, -c, 'tr acgt ACGT < ${{input.reads}} > ${{output.upper}}']
    inputs: {{reads: {{path: /pipe-in.eph, stream: true}}}}
    outputs: {{upper: {mid}}}
    memory: 512MiB
    timeout: 20m
  - name: sample
    function: [/bin/sh, -c, 'sed -n "1~28{{N;N;N;p}}" < ${{input.upper}} > ${{output.kept}}']
    inputs: {{upper: {{path: {mid}, stream: {stream}}}}}
    outputs: {{kept: /pipe-out.eph}}
    memory: 512MiB
    timeout: 20m
"""

    def start_load(self, percent):
        """Paced UDP senders over every shaped direction; returns their processes."""
        if percent <= 0:
            return []
        rate_bits = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
        unit = next(u for u in rate_bits if self.opts.rate.endswith(u))
        bits = float(self.opts.rate[:-len(unit)]) * rate_bits[unit]
        byte_rate = bits / 8 * percent / 100
        code = ("import socket,sys,time\n"
                "dst,rate,limit=sys.argv[1],float(sys.argv[2]),float(sys.argv[3])\n"
                "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                "buf=b'x'*32768;t0=time.monotonic();sent=0\n"
                "while time.monotonic()-t0<limit:\n"
                "  try: s.sendto(buf,(dst,9))\n"
                "  except OSError: pass\n"
                "  sent+=len(buf)\n"
                "  ahead=t0+sent/rate-time.monotonic()\n"
                "  if ahead>0: time.sleep(ahead)\n")
        limit = str(self.opts.load_limit)
        procs = []
        for n, link in self.links.items():
            # Into the node (its host-side qdisc) and out of it (its namespace's).
            for prefix, dst in [([], link["ip"]),
                                (["ip", "netns", "exec", link["ns"]], BRIDGE_IP)]:
                p = subprocess.Popen([*prefix, sys.executable, "-c", code, dst,
                                      str(byte_rate), limit],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
                self.procs.append(p)
                procs.append(p)
        time.sleep(1.0)  # let the queues fill before the clock starts
        return procs

    def stop_load(self, procs):
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait()

    def pipeline_case(self, way, load, k, expected):
        path = os.path.join(self.work, f"pipe-{way}.yaml")
        with open(path, "w") as f:
            f.write(self.pipeline_yaml(way.startswith("durable")))
        scheduler = "round-robin" if way.endswith("round-robin") else "locality"
        drop_caches()
        procs = self.start_load(load)
        try:
            seconds, moved, out = self.timed(lambda: subprocess.run(
                [self.opts.strata, "f3", "run", path, "--scheduler", scheduler,
                 "--meta", self.stores[1]["meta"], "--output", "json"],
                capture_output=True, text=True, timeout=3600))
        finally:
            self.stop_load(procs)
        if out.returncode != 0:
            sys.exit(f"pipeline {way} at {load}%: {out.stderr[-3000:]}")
        steps = {s["step"]: s["node"] for s in json.loads(out.stdout)["steps"]}
        got = os.path.getsize(os.path.join(self.mount["a1"], "pipe-out.eph"))
        if got != expected:
            sys.exit(f"pipeline {way} at {load}%: output {got} bytes, expected {expected}")
        print(f"  round {k}: load {load:2d}% {way:15s} {seconds:6.1f} s, steps "
              f"upper@{steps['upper']} sample@{steps['sample']}, links a/b "
              f"{moved['a'] / 1e6:.0f}/{moved['b'] / 1e6:.0f} MB (load included)", flush=True)
        return {"s": seconds, "nodes": steps, "link_mb": {n: m / 1e6 for n, m in moved.items()}}

    def pipeline(self):
        size = self.opts.pipeline_mb * 1000 * 1000
        records, written, kept = self.make_fastq(os.path.join(self.mount["a1"], "pipe-in.eph"), size)
        print(f"  input: {written / 1e6:.0f} MB, {records} records, expected output "
              f"{kept / 1e6:.0f} MB", flush=True)
        loads = [int(x) for x in self.opts.loads.split(",")]
        runs = []
        for k in range(self.opts.repeat):
            runs.append({str(load): {way: self.pipeline_case(way, load, k, kept)
                                     for way in self.ways}
                         for load in loads})
        return {"input_bytes": written, "output_bytes": kept, "runs": runs}

    # ---- teardown --------------------------------------------------------

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for m in self.mounts:
            if os.path.ismount(m):
                subprocess.run(["umount", "-l", m], capture_output=True)
        for log in self.logs:
            log.close()
        for link in self.links.values():
            subprocess.run(["ip", "netns", "del", link["ns"]], capture_output=True)
            subprocess.run(["ip", "link", "del", link["host"]], capture_output=True)
        if getattr(self, "bridge", None):
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        for path in self.cgroups.values():
            try:
                os.rmdir(path)
            except OSError as e:
                print(f"cgroup {path} not removed: {e}", file=sys.stderr)
        shutil.rmtree(self.work, ignore_errors=True)


def med(runs, case, key="mb_s"):
    return statistics.median(r[case][key] for r in runs)


def report_fio(runs, opts):
    cases = list(runs[0].keys())
    print(f"\nExperiment 2: fio, {opts.size} file, 1 MiB blocks, links {opts.rate}, "
          f"node disk {opts.disk}/s; median of {len(runs)} rounds")
    print("| case | MB/s | s | MB over a's / b's link |")
    print("|---|---|---|---|")
    for c in cases:
        la = statistics.median(r[c]["link_mb"]["a"] for r in runs)
        lb = statistics.median(r[c]["link_mb"]["b"] for r in runs)
        print(f"| {c} | {med(runs, c):.1f} | {med(runs, c, 's'):.1f} | {la:.0f} / {lb:.0f} |")
    ratios = {
        "f3-local write / durable-r1 write": med(runs, "f3-local write") / med(runs, "durable-r1 write"),
        "f3-local write / durable-r3 write": med(runs, "f3-local write") / med(runs, "durable-r3 write"),
        "f3-local write to disk / durable-r1 write":
            med(runs, "f3-local write to disk") / med(runs, "durable-r1 write"),
        "f3-local write to disk / durable-r3 write":
            med(runs, "f3-local write to disk") / med(runs, "durable-r3 write"),
        "f3-local read / durable-r1 read": med(runs, "f3-local read") / med(runs, "durable-r1 read"),
        "f3-local read / durable-r3 read": med(runs, "f3-local read") / med(runs, "durable-r3 read"),
        "f3-remote read / durable-r1 read": med(runs, "f3-remote read") / med(runs, "durable-r1 read"),
        "f3-remote read / durable-r3 read": med(runs, "f3-remote read") / med(runs, "durable-r3 read"),
        "disk / network (ceiling read / f3-remote read)":
            med(runs, "ceiling read") / med(runs, "f3-remote read"),
    }
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x")
    return ratios


def report_stream(runs, opts):
    print(f"\nExperiment 3: read-while-write, {opts.stream_size} at {opts.stream_rate}/s "
          f"on a, consumer on b; median of {len(runs)} rounds")
    print("| consumer | end-to-end s | first byte s | producer s |")
    print("|---|---|---|---|")
    for mode in runs[0]:
        e = statistics.median(r[mode]["consumed"] for r in runs)
        f = statistics.median(r[mode]["first_byte"] for r in runs)
        p = statistics.median(r[mode]["produced"] for r in runs)
        print(f"| {mode} | {e:.1f} | {f:.2f} | {p:.1f} |")


def report_pipeline(result, opts):
    runs = result["runs"]
    print(f"\nExperiment 4: pipeline, {result['input_bytes'] / 1e6:.0f} MB in, "
          f"{result['output_bytes'] / 1e6:.0f} MB out, links {opts.rate}, node disk "
          f"{opts.disk}/s; median of {len(runs)} rounds")
    ways = list(runs[0][next(iter(runs[0]))])
    heads = [h for h, a, b in [("lead (locality)", "durable", "f3-locality"),
                               ("lead (round-robin)", "durable-round-robin", "f3-round-robin")]
             if a in ways and b in ways]
    print("| link load | " + " | ".join(f"{w} s" for w in ways) + " | " +
          " | ".join(heads) + " | target |")
    print("|---|" + "---|" * (len(ways) + len(heads) + 1))
    summary = {}
    for load in runs[0]:
        t = {w: statistics.median(r[load][w]["s"] for r in runs) for w in ways}
        # F3's lead: the same placement, durable intermediate against ephemeral.
        pairs = {"locality": ("durable", "f3-locality"),
                 "round-robin": ("durable-round-robin", "f3-round-robin")}
        leads = {p: t[d] / t[f] - 1 for p, (d, f) in pairs.items() if d in t and f in t}
        target = PIPELINE_TARGET.get(int(load))
        summary[load] = {"seconds": t, "leads": leads}
        print(f"| {load}% | " + " | ".join(f"{t[w]:.1f}" for w in ways) + " | " +
              " | ".join(f"{v:+.0%}" for v in leads.values()) +
              f" | {'>= ' + format(target, '.0%') if target else '-'} |")
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata", default=STRATA_DEFAULT)
    ap.add_argument("--rate", default="200mbit")
    ap.add_argument("--disk", default="40M", help="node disk limit per second (0: none)")
    ap.add_argument("--size", default="512M")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--stream-size", default="400M")
    ap.add_argument("--stream-rate", default="20M")
    ap.add_argument("--pipeline-mb", type=int, default=200, help="pipeline input, MB")
    ap.add_argument("--loads", default="0,50,75,90", help="link load, percent of --rate")
    ap.add_argument("--ways", default=",".join(PIPELINE_WAYS),
                    help="pipeline ways to run: " + ", ".join(PIPELINE_WAYS))
    ap.add_argument("--load-limit", type=float, default=900,
                    help="a load sender stops by itself after this many seconds")
    ap.add_argument("--only", choices=["fio", "stream", "pipeline"])
    ap.add_argument("--json-out")
    opts = ap.parse_args()
    opts.strata = os.path.abspath(opts.strata)
    if os.geteuid() != 0:
        sys.exit("run as root: namespaces, tc, cgroups and FUSE mounts")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    # Ctrl-C cleans up even when started with SIGINT ignored (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    bench = Bench(opts)
    bench.size = parse_size(opts.size)
    bench.stream_size = parse_size(opts.stream_size)
    bench.ways = opts.ways.split(",")
    if not set(bench.ways) <= set(PIPELINE_WAYS):
        sys.exit(f"--ways: each of {', '.join(PIPELINE_WAYS)}")
    os.makedirs(bench.work)
    result = {"options": vars(opts)}
    try:
        bench.setup_network()
        bench.setup_cgroups()
        bench.setup_services()
        if opts.only in (None, "fio"):
            runs = []
            for k in range(opts.repeat):
                runs.append(bench.fio_round(k))
            result["fio"] = runs
            result["fio_ratios"] = report_fio(runs, opts)
        if opts.only in (None, "stream"):
            runs = []
            for k in range(opts.repeat):
                runs.append({m: bench.stream_case(m, k)
                             for m in ["read-while-write", "poll", "sequential"]})
            result["stream"] = runs
            report_stream(runs, opts)
        if opts.only in (None, "pipeline"):
            result["pipeline"] = bench.pipeline()
            result["pipeline_summary"] = report_pipeline(result["pipeline"], opts)
    finally:
        bench.close()
    if opts.json_out:
        with open(opts.json_out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

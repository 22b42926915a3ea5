#!/usr/bin/env python3
"""NBD export benchmark: `strata serve` vs `qemu-nbd` on long qcow2 chains.

Usage:
    python3 bench/nbd_bench.py [--chains 1,100,500,1000] [--repeat 3]
        [--runtime 10] [--servers strata,qemu] [--strata PATH]
        [--no-physical] [--quick] [-v]
    bench/run-nbd-bench.sh [same options]

For every chain length N it generates (or reuses) bench/out/chains/nNNNN
with bench/gen-chain.sh (1 GiB disk, 64 KiB clusters; existing chains are
only read, never rewritten), warms the page cache, then serves the chain
with each server in turn (one server at a time, on a Unix socket) and runs
the same clients against it:

  rand-qd16   fio --ioengine=nbd, random 4 KiB reads, iodepth 16, time-based
  rand-qd1    the same at iodepth 1
  write-qd16  fio random 4 KiB writes, iodepth 16, time-based, into a FRESH
              top layer on the chain (made per repeat and server:
              `strata img snapshot` for Strata, `qemu-img create -b` for
              QEMU; every first write to a 64 KiB cluster copies the rest of
              it from the chain, as a VM on a new snapshot would)
  seq         `nbdcopy URI null:`, the whole disk (nbdcopy asks for block
              status and skips holes; it opens 4 connections when the server
              advertises multi-conn, which both do)

Server options, matched wherever both have them:
  strata serve --read-only --socket S TOP              (reads)
  qemu-nbd --read-only --persistent --shared=16 --cache=writeback
           --aio=threads -f qcow2 --socket S TOP         (reads)
  and the same without --read-only on the fresh layer for writes.
Peak RSS is VmHWM of the server process (/proc/PID/status) read right
before it is stopped, separately for the read server and the write server.

"Physical bound" rows run the same clients against `nbdkit memory 1G`
(filled with the chain's content first, so reads return real data) and
against expected.raw (the flat raw image) served by each server with
`-f raw`: the protocol path without any qcow2 or chain work.

Every number is the median of --repeat runs.  A server that crashes or
refuses to start (e.g. qemu-nbd on ~1,000 layers) is reported as such
("crash (signal 11)", "exit 1") instead of a number.  The machine may be
shared: each run records how many cores other processes kept busy
meanwhile (column "other load" in the JSON), as bench/img_bench.py does.

Results: markdown on stdout and in bench/out/nbd-bench-<timestamp>.md, all
samples in bench/out/nbd-bench-<timestamp>.json.

--quick: chains 1 and 100, runtime 3 s, 1 repeat (a smoke run).
"""

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)
OUT_DIR = os.path.join(BENCH_DIR, "out")
CHAINS_DIR = os.path.join(OUT_DIR, "chains")
DISK_SIZE = 1 << 30

SERVERS = ("qemu", "strata")
LABEL = {"qemu": "qemu-nbd", "strata": "strata serve", "nbdkit": "nbdkit memory"}
TESTS = ("rand-qd16", "rand-qd1", "write-qd16", "seq")
TEST_LABEL = {
    "rand-qd16": "rand read 4k QD16",
    "rand-qd1": "rand read 4k QD1",
    "write-qd16": "rand write 4k QD16",
    "seq": "seq read (nbdcopy)",
}

VERBOSE = False


def log(*args):
    if VERBOSE:
        print("[nbd-bench]", *args, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- helpers

def cpu_snapshot():
    """(wall, machine busy CPU s, CPU s of this process and its children)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields[:8]) - fields[3] - fields[4]
    mine = sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), mine


def proc_cpu(pid):
    """CPU seconds used so far by a (running) process."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def other_load(before, after, server_cpu):
    """Cores kept busy by processes that are neither ours nor the server."""
    wall = after[0] - before[0]
    if wall <= 0:
        return None
    mine = (after[2] - before[2]) + server_cpu
    return max(0.0, ((after[1] - before[1]) - mine) / wall)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def child_setup():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    raise_nofile()


def warm(paths):
    for path in paths:
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass


def status_text(returncode):
    if returncode is None:
        return "running"
    if returncode < 0:
        return "crash (signal %d)" % -returncode
    return "exit %d" % returncode


def vm_hwm_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


# ---------------------------------------------------------------- servers

class ServerError(Exception):
    pass


class Server:
    """One server process on a Unix socket; `with Server(...) as s:`."""

    def __init__(self, kind, image, fmt, read_only, strata, workdir, timeout=300):
        self.kind, self.image, self.fmt = kind, image, fmt
        self.read_only = read_only
        self.sock = os.path.join(workdir, "%s.sock" % kind)
        self.log = os.path.join(workdir, "%s.log" % kind)
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        if kind == "strata":
            cmd = [strata, "serve", "--socket", self.sock, "-f", fmt]
            if read_only:
                cmd.append("--read-only")
            cmd.append(image)
        elif kind == "qemu":
            cmd = ["qemu-nbd", "--persistent", "--shared=16", "--cache=writeback",
                   "--aio=threads", "-f", fmt, "--socket", self.sock]
            if read_only:
                cmd.append("--read-only")
            cmd.append(image)
        elif kind == "nbdkit":
            cmd = ["nbdkit", "--foreground", "--unix", self.sock, "memory", "1G"]
        else:
            raise ValueError(kind)
        self.cmd = cmd
        log(" ".join(cmd))
        self.errf = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE if kind == "strata" else subprocess.DEVNULL,
                                     stderr=self.errf, preexec_fn=child_setup,
                                     start_new_session=True)
        self.start_wall = time.monotonic()
        self.rss_kib = None
        self._wait_ready(timeout)

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        if self.kind == "strata":
            # The one readiness line; blocking read, bounded by the timeout.
            import selectors
            sel = selectors.DefaultSelector()
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            buf = b""
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    self._fail("not ready after %d s" % timeout)
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    self._fail("exited before it was ready")
                buf += chunk
            line = buf.split(b"\n", 1)[0].decode(errors="replace")
            if not line.startswith("strata: serving"):
                self._fail("unexpected readiness line %r" % line)
            # Keep draining stdout in the background (never blocks the server).
            import threading
            threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        else:
            while True:
                if self.proc.poll() is not None:
                    self._fail("exited before it was ready")
                try:
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.connect(self.sock)
                    s.close()
                    break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    self._fail("not ready after %d s" % timeout)
                time.sleep(0.02)
        self.ready_seconds = time.monotonic() - self.start_wall

    def _fail(self, why):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.errf.flush()
        with open(self.log) as f:
            tail = f.read()[-2000:]
        raise ServerError("%s (%s): %s\n%s" % (
            status_text(self.proc.returncode) if self.proc.returncode else "killed",
            self.kind, why, tail))

    @property
    def uri(self):
        return "nbd+unix:///?socket=%s" % self.sock

    def alive(self):
        return self.proc.poll() is None

    def died(self):
        """Status text if the server is gone, else None."""
        rc = self.proc.poll()
        return None if rc is None else status_text(rc)

    def cpu(self):
        return proc_cpu(self.proc.pid)

    def stop(self):
        """SIGTERM; returns the exit status text ("exit 0" is clean)."""
        if self.proc.poll() is None:
            self.rss_kib = vm_hwm_kib(self.proc.pid)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.errf.close()
                return "hung on SIGTERM"
        self.errf.close()
        return status_text(self.proc.returncode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.stop()


# ---------------------------------------------------------------- clients

def run_fio(uri, rw, depth, runtime, workdir, size=DISK_SIZE):
    out = os.path.join(workdir, "fio.json")
    cmd = ["fio", "--name=bench", "--ioengine=nbd", "--uri=" + uri,
           "--rw=" + rw, "--bs=4k", "--iodepth=%d" % depth,
           "--size=%d" % size, "--time_based", "--runtime=%d" % runtime,
           "--norandommap", "--randrepeat=0", "--output-format=json",
           "--output=" + out]
    log(" ".join(cmd))
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=runtime + 120)
    except subprocess.TimeoutExpired:
        return {"status": "fio timeout"}
    if proc.returncode != 0:
        return {"status": "fio exit %d: %s" % (proc.returncode, (proc.stderr or proc.stdout)[-300:])}
    with open(out) as f:
        text = f.read()
    job = json.loads(text[text.index("{"):])["jobs"][0]
    if job.get("error"):
        return {"status": "fio error %s" % job["error"]}
    side = job["read" if "read" in rw else "write"]
    pct = side["clat_ns"].get("percentile", {})
    return {
        "status": "ok",
        "iops": side["iops"],
        "mbps": side["bw_bytes"] / 1e6,
        "p50_us": pct.get("50.000000", 0) / 1000,
        "p99_us": pct.get("99.000000", 0) / 1000,
    }


def run_nbdcopy(uri, size=DISK_SIZE):
    cmd = ["nbdcopy", uri, "null:"]
    log(" ".join(cmd))
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return {"status": "nbdcopy timeout"}
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"status": "nbdcopy exit %d: %s" % (proc.returncode, proc.stderr[-300:])}
    return {"status": "ok", "seconds": wall, "mbps": size / wall / 1e6}


# ---------------------------------------------------------------- chains

def ensure_chain(n):
    """Chain directory and top layer; generates it only when missing."""
    d = os.path.join(CHAINS_DIR, "n%04d" % n)
    top = os.path.join(d, "layer-%04d.qcow2" % n)
    stamp = os.path.join(d, "chain.stamp")
    if not (os.path.exists(top) and os.path.exists(stamp)):
        log("generating chain", n)
        subprocess.run([os.path.join(BENCH_DIR, "gen-chain.sh"), str(n), d],
                       check=True, stdout=subprocess.DEVNULL)
    return d, top


def fresh_layer(kind, top, workdir, strata):
    """A new, empty top layer on `top` for the write test."""
    path = os.path.join(workdir, "write-top-%s.qcow2" % kind)
    if os.path.exists(path):
        os.unlink(path)
    if kind == "strata":
        subprocess.run([strata, "img", "snapshot", top, path], check=True,
                       stdout=subprocess.DEVNULL, preexec_fn=raise_nofile)
    else:
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", top,
                        "-F", "qcow2", path], check=True)
    return path


# ---------------------------------------------------------------- measuring

def measure_reads(kind, image, fmt, args, workdir):
    """One server session: rand-qd16, rand-qd1, seq. Returns {test: sample}."""
    res = {}
    try:
        srv = Server(kind, image, fmt, True, args.strata, workdir)
    except ServerError as e:
        status = str(e).split(" (", 1)[0]
        log("server failed:", e)
        return {t: {"status": status, "detail": str(e)[-500:]} for t in ("rand-qd16", "rand-qd1", "seq")}, None, None, None
    with srv:
        for test, depth in (("rand-qd16", 16), ("rand-qd1", 1)):
            before, scpu = cpu_snapshot(), srv.cpu()
            r = run_fio(srv.uri, "randread", depth, args.runtime, workdir)
            r["other_load"] = other_load(before, cpu_snapshot(), srv.cpu() - scpu)
            res[test] = r
            if srv.died():
                r["status"] = srv.died()
                break
        if srv.alive():
            before, scpu = cpu_snapshot(), srv.cpu()
            r = run_nbdcopy(srv.uri)
            r["other_load"] = other_load(before, cpu_snapshot(), srv.cpu() - scpu)
            res["seq"] = r
        dead = srv.died()
        for t in ("rand-qd16", "rand-qd1", "seq"):
            if dead and res.get(t, {}).get("status") != "ok":
                res[t] = {"status": dead}
        exit_status = srv.stop()
        return res, srv.rss_kib, exit_status, srv.ready_seconds


def measure_write(kind, top, args, workdir):
    if kind == "nbdkit":
        layer, fmt = None, "raw"
    else:
        layer, fmt = fresh_layer(kind, top, workdir, args.strata), "qcow2"
    try:
        srv = Server(kind, layer, fmt, False, args.strata, workdir)
    except ServerError as e:
        return {"status": str(e).split(" (", 1)[0], "detail": str(e)[-500:]}, None, None
    with srv:
        before, scpu = cpu_snapshot(), srv.cpu()
        r = run_fio(srv.uri, "randwrite", 16, args.runtime, workdir)
        r["other_load"] = other_load(before, cpu_snapshot(), srv.cpu() - scpu)
        if srv.died():
            r["status"] = srv.died()
        exit_status = srv.stop()
    if layer:
        os.unlink(layer)
    return r, srv.rss_kib, exit_status


def fill_nbdkit(srv, raw):
    subprocess.run(["nbdcopy", raw, srv.uri], check=True)


def measure_nbdkit(raw, args, workdir):
    """nbdkit memory 1G holding the chain's content: reads, then writes."""
    try:
        srv = Server("nbdkit", None, "raw", False, args.strata, workdir)
    except ServerError as e:
        st = {"status": "nbdkit failed", "detail": str(e)[-500:]}
        return {t: st for t in TESTS}, None
    res = {}
    with srv:
        fill_nbdkit(srv, raw)
        for test, rw, depth in (("rand-qd16", "randread", 16), ("rand-qd1", "randread", 1),
                                ("write-qd16", "randwrite", 16)):
            res[test] = run_fio(srv.uri, rw, depth, args.runtime, workdir)
        res["seq"] = run_nbdcopy(srv.uri)
        srv.stop()
    return res, srv.rss_kib


# ---------------------------------------------------------------- report

def fmt_num(v, digits=0):
    if v is None:
        return "–"
    if digits == 0:
        return "{:,.0f}".format(v)
    return "{:,.{}f}".format(v, digits)


def cell(samples, key, digits=0):
    """Median of `key` over ok samples, or the first failure status."""
    oks = [s[key] for s in samples if s.get("status") == "ok" and s.get(key) is not None]
    if oks:
        return median(oks), fmt_num(median(oks), digits)
    fails = [s.get("status") for s in samples if s.get("status") != "ok"]
    return None, (fails[0] if fails else "–")


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "–"
    return "%.2f×" % (a / b)


def render(results, args, meta):
    lines = []
    lines.append("# NBD benchmark: strata serve vs qemu-nbd")
    lines.append("")
    lines.append("%s, %s; runtime %d s per fio run, median of %d; chain 1 GiB, 64 KiB clusters." % (
        meta["date"], meta["host"], args.runtime, args.repeat))
    lines.append("Versions: %s; %s; %s; %s." % (meta["qemu"], meta["fio"], meta["libnbd"], meta["nbdkit"]))
    lines.append("")
    rows = [r for r in results["rows"]]
    lines.append("## Throughput (IOPS for fio rows, MB/s for seq)")
    lines.append("")
    lines.append("| image | test | qemu-nbd | strata serve | Strata/QEMU |")
    lines.append("|---|---|---:|---:|---:|")
    for row in rows:
        for test in TESTS:
            if not any(test in k for k in row["samples"].values()):
                continue
            key = "mbps" if test == "seq" else "iops"
            vals = {}
            texts = {}
            for kind in ("qemu", "strata", "nbdkit"):
                samples = row["samples"].get(kind, {}).get(test)
                if samples is None:
                    vals[kind], texts[kind] = None, "–"
                else:
                    vals[kind], texts[kind] = cell(samples, key, 0 if key == "iops" else 1)
            if row["image"] == "nbdkit memory":
                lines.append("| %s | %s | %s (nbdkit) | | |" % (row["image"], TEST_LABEL[test], texts["nbdkit"]))
                continue
            lines.append("| %s | %s | %s | %s | %s |" % (
                row["image"], TEST_LABEL[test], texts["qemu"], texts["strata"],
                ratio(vals["strata"], vals["qemu"])))
    lines.append("")
    lines.append("## Latency, fio completion latency p50 / p99 (µs)")
    lines.append("")
    lines.append("| image | test | qemu-nbd p50 / p99 | strata p50 / p99 | Strata/QEMU p50 / p99 |")
    lines.append("|---|---|---:|---:|---:|")
    for row in rows:
        for test in ("rand-qd16", "rand-qd1", "write-qd16"):
            if not any(test in k for k in row["samples"].values()):
                continue
            parts = {}
            vals = {}
            for kind in ("qemu", "strata", "nbdkit"):
                samples = row["samples"].get(kind, {}).get(test)
                if samples is None:
                    parts[kind], vals[kind] = "–", (None, None)
                    continue
                v50, t50 = cell(samples, "p50_us", 1)
                v99, t99 = cell(samples, "p99_us", 1)
                parts[kind] = t50 if v50 is None else "%s / %s" % (t50, t99)
                vals[kind] = (v50, v99)
            if row["image"] == "nbdkit memory":
                lines.append("| %s | %s | %s (nbdkit) | | |" % (row["image"], TEST_LABEL[test], parts["nbdkit"]))
                continue
            lines.append("| %s | %s | %s | %s | %s / %s |" % (
                row["image"], TEST_LABEL[test], parts["qemu"], parts["strata"],
                ratio(vals["strata"][0], vals["qemu"][0]), ratio(vals["strata"][1], vals["qemu"][1])))
    lines.append("")
    lines.append("## Peak RSS of the server (VmHWM, MiB): read server / write server")
    lines.append("")
    lines.append("| image | qemu-nbd | strata serve | Strata/QEMU (read) |")
    lines.append("|---|---:|---:|---:|")
    for row in rows:
        r = {}
        t = {}
        for kind in ("qemu", "strata", "nbdkit"):
            rr = row["rss"].get(kind, {})
            rd = median(rr.get("read", []))
            wr = median(rr.get("write", []))
            r[kind] = rd
            t[kind] = "%s / %s" % (fmt_num(rd / 1024 if rd else None, 1), fmt_num(wr / 1024 if wr else None, 1))
        if row["image"] == "nbdkit memory":
            lines.append("| %s | %s (nbdkit) | | |" % (row["image"], t["nbdkit"]))
            continue
        lines.append("| %s | %s | %s | %s |" % (row["image"], t["qemu"], t["strata"], ratio(r["strata"], r["qemu"])))
    lines.append("")
    # Exit statuses after SIGTERM, and startup times.
    notes = []
    for row in rows:
        for kind, st in row.get("exit", {}).items():
            bad = sorted(set(s for s in st if s not in ("exit 0", None)))
            if bad:
                notes.append("- %s, %s: SIGTERM exit status %s" % (row["image"], LABEL[kind], ", ".join(bad)))
        for kind, secs in row.get("ready", {}).items():
            if secs:
                notes.append("- %s, %s: ready in %.2f s (median)" % (row["image"], LABEL[kind], median(secs)))
    if notes:
        lines.append("## Server start-up and shutdown")
        lines.append("")
        lines.extend(notes)
        lines.append("")
    loads = [s.get("other_load") for row in rows for kd in row["samples"].values()
             for ss in kd.values() for s in ss if s.get("other_load") is not None]
    if loads:
        lines.append("Other processes kept %.2f cores busy on average during the runs (max %.2f)." % (
            statistics.mean(loads), max(loads)))
        lines.append("")
    lines.extend(targets(results))
    return "\n".join(lines) + "\n"


def targets(results):
    """The issue's targets, evaluated on what was measured."""
    by_chain = {row["chain"]: row for row in results["rows"] if row.get("chain")}
    out = ["## Targets", ""]

    def med(row, kind, test, key):
        samples = row["samples"].get(kind, {}).get(test) or []
        return cell(samples, key)[0]

    if 1 in by_chain:
        row = by_chain[1]
        worst = []
        for test in TESTS:
            key = "mbps" if test == "seq" else "iops"
            s, q = med(row, "strata", test, key), med(row, "qemu", test, key)
            if s is not None and q:
                worst.append((s / q, test))
        if worst:
            r, t = min(worst)
            out.append("- chain 1, Strata ≥ 1.0× qemu-nbd on every row: %s (lowest %.2f× on %s)" % (
                "met" if r >= 1.0 else "NOT met", r, TEST_LABEL[t]))
    if 1 in by_chain and 1000 in by_chain:
        a, b = by_chain[1], by_chain[1000]
        for test in ("rand-qd16", "rand-qd1", "seq"):
            key = "mbps" if test == "seq" else "iops"
            s1, s1000 = med(a, "strata", test, key), med(b, "strata", test, key)
            if s1 and s1000 is not None:
                out.append("- chain 1000 keeps ≥ 90%% of chain 1 (%s): %.0f%% %s" % (
                    TEST_LABEL[test], 100 * s1000 / s1, "met" if s1000 >= 0.9 * s1 else "NOT met"))
        r1 = median(a["rss"].get("strata", {}).get("read", []))
        r1000 = median(b["rss"].get("strata", {}).get("read", []))
        if r1 and r1000:
            out.append("- Strata RSS at chain 1000 ≤ 1.5× chain 1 (read server): %.2f× %s" % (
                r1000 / r1, "met" if r1000 <= 1.5 * r1 else "NOT met"))
    if len(out) == 2:
        out.append("- (needs chains 1 and 1000 with both servers)")
    out.append("")
    return out


# ---------------------------------------------------------------- main

def tool_version(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0].strip()
    except (OSError, IndexError):
        return "?"


def main():
    global VERBOSE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chains", default="1,100,500,1000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=10, help="seconds per fio run")
    ap.add_argument("--servers", default="qemu,strata")
    ap.add_argument("--strata", default=os.path.join(REPO, "target", "release", "strata"))
    ap.add_argument("--no-physical", action="store_true", help="skip nbdkit and raw-file rows")
    ap.add_argument("--quick", action="store_true", help="chains 1,100; 3 s runs; 1 repeat")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    VERBOSE = args.verbose
    if args.quick:
        args.chains, args.runtime, args.repeat = "1,100", 3, 1
    chains = [int(x) for x in args.chains.split(",") if x]
    servers = [s for s in args.servers.split(",") if s]
    for s in servers:
        if s not in SERVERS:
            ap.error("unknown server %r" % s)
    if "strata" in servers:
        ok = os.access(args.strata, os.X_OK) and subprocess.run(
            [args.strata, "serve", "--help"], capture_output=True).returncode == 0
        if not ok:
            print("note: %s has no `serve` subcommand; measuring qemu-nbd only" % args.strata,
                  file=sys.stderr)
            servers = [s for s in servers if s != "strata"]
    raise_nofile()
    os.makedirs(OUT_DIR, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="nbd-bench-", dir=os.path.join(OUT_DIR))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    meta = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "host": "%s, %d cores, %s" % (platform.machine(), os.cpu_count(), platform.release()),
        "qemu": tool_version(["qemu-nbd", "--version"]),
        "fio": tool_version(["fio", "--version"]),
        "libnbd": tool_version(["nbdcopy", "--version"]),
        "nbdkit": tool_version(["nbdkit", "--version"]),
        "args": vars(args),
        "servers": servers,
    }
    results = {"meta": meta, "rows": []}
    try:
        # Repeats are the outer loop, so every chain and server is sampled
        # across the whole run: load from other processes that comes and
        # goes then biases no chain or server in particular.
        rows = []
        for n in chains:
            d, top = ensure_chain(n)
            layers = sorted(f for f in os.listdir(d) if f.endswith(".qcow2"))
            rows.append((n, top, [os.path.join(d, f) for f in layers],
                         {"image": "chain %d" % n, "chain": n, "samples": {}, "rss": {},
                          "exit": {}, "ready": {}}))
        for rep in range(args.repeat):
            for n, top, files, row in rows:
                warm(files)
                for kind in servers:
                    log("chain", n, "repeat", rep + 1, kind)
                    res, rss, ex, ready = measure_reads(kind, top, "qcow2", args, workdir)
                    for t, r in res.items():
                        row["samples"].setdefault(kind, {}).setdefault(t, []).append(r)
                    row["rss"].setdefault(kind, {}).setdefault("read", []).append(rss)
                    row["exit"].setdefault(kind, []).append(ex)
                    row["ready"].setdefault(kind, []).append(ready)
                    r, rss, ex = measure_write(kind, top, args, workdir)
                    row["samples"].setdefault(kind, {}).setdefault("write-qd16", []).append(r)
                    row["rss"].setdefault(kind, {}).setdefault("write", []).append(rss)
                    row["exit"].setdefault(kind, []).append(ex)
        for _, _, _, row in rows:
            results["rows"].append(row)
            print(render_progress(row), file=sys.stderr, flush=True)
        if not args.no_physical:
            raw = os.path.join(ensure_chain(chains[0])[0], "expected.raw")
            warm([raw])
            row = {"image": "raw file", "samples": {}, "rss": {}, "exit": {}, "ready": {}}
            for rep in range(args.repeat):
                for kind in servers:
                    res, rss, ex, _ = measure_reads(kind, raw, "raw", args, workdir)
                    for t, r in res.items():
                        row["samples"].setdefault(kind, {}).setdefault(t, []).append(r)
                    row["rss"].setdefault(kind, {}).setdefault("read", []).append(rss)
                    row["exit"].setdefault(kind, []).append(ex)
            results["rows"].append(row)
            row = {"image": "nbdkit memory", "samples": {"nbdkit": {}}, "rss": {"nbdkit": {}},
                   "exit": {}, "ready": {}}
            for rep in range(args.repeat):
                res, rss = measure_nbdkit(raw, args, workdir)
                for t, r in res.items():
                    row["samples"]["nbdkit"].setdefault(t, []).append(r)
                row["rss"]["nbdkit"].setdefault("read", []).append(rss)
            results["rows"].append(row)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    md = render(results, args, meta)
    print(md)
    base = os.path.join(OUT_DIR, "nbd-bench-%s" % stamp)
    with open(base + ".md", "w") as f:
        f.write(md)
    with open(base + ".json", "w") as f:
        json.dump(results, f, indent=1)
    print("results: %s.md, %s.json" % (base, base), file=sys.stderr)


def render_progress(row):
    parts = []
    for kind, tests in row["samples"].items():
        for t, ss in tests.items():
            key = "mbps" if t == "seq" else "iops"
            parts.append("%s %s=%s" % (kind, t, cell(ss, key)[1]))
    return "[nbd-bench] %s: %s" % (row["image"], "; ".join(parts))


if __name__ == "__main__":
    main()

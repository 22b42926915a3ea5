#!/usr/bin/env python3
"""Volume service benchmark (issue 4): `strata daemon` under fio.

Measures, against the same daemon build in the same run:

1. fio random writes (4 KiB, iodepth 16, ioengine=nbd) on one volume,
   with no snapshots (the anchor) and with a snapshot every second,
   alternated --repeat times: IOPS medians and their ratio, write p99,
   and the I/O pause each snapshot reported. Each run alternates with the
   same run against QEMU's block layer (bench/qemu_anchor.py:
   qemu-storage-daemon, external snapshots over QMP; --no-qemu skips it),
   so both systems' snapshot ratios come from the same minutes. Each
   repeat also measures the file system alone (bench/page_cache_floor.py:
   fio writes into one file against a new file every second, the earlier
   files kept as frozen layers are; --no-floor skips it), the part of the
   ratio no snapshot code can avoid.
   One more run with a snapshot every second logs every write's
   completion latency: p50/p99/max of the writes that completed while a
   snapshot call was in flight, against all the others.
2. Snapshot of an exported 50 GiB volume (with data, while fio writes):
   the pause (catalog commit included) and the API call's wall time.
3. 500 volumes in one daemon: create time, daemon RSS, restart time to
   the readiness line with every volume re-exported, RSS after restart.
4. Compaction: a 1 GiB volume with a 200-layer chain (every snapshot
   deleted), fio random reads (4 KiB, iodepth 16) without compaction (the
   anchor) and then while the chain is compacted at --compact-rate:
   read p99 ratio, the rate the merge achieved, its longest I/O pause.

Usage: bench/run-volume-bench.sh [--quick] [--repeat 3] [--runtime 10]
                                  [--volumes 500] [--snap-volume-gib 50]
                                  [--compact-rate 64M] [--only compaction|throughput|big]
                                  [--iodepth 16] [--daemon-arg=ARG ...]

--only big compares the 50 GiB snapshot with standby tops (the default)
and without (`strata daemon --standby-min-index off`) in the same run.
Results: bench/out/volume-bench-<timestamp>.{md,json}, markdown on stdout.
"""

import argparse
import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import page_cache_floor
import qemu_anchor

ROOT = Path(__file__).resolve().parent.parent
STRATA = Path(os.environ.get("STRATA_BIN", ROOT / "target" / "release" / "strata"))


class Daemon:
    """A `strata daemon` on free ports."""

    def __init__(self, pool, cluster_size="64k", extended_l2="on", extra=()):
        self.pool = pool
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [str(STRATA), "daemon", "--pool", str(pool), "--listen", "127.0.0.1:0",
             "--nbd-port", "0", "--cluster-size", cluster_size, "--extended-l2", extended_l2,
             *extra],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        self.ready_s = time.monotonic() - t0
        if not line:
            raise SystemExit("daemon did not start")
        self.nbd = line.split(" on ")[1].split(",")[0]
        self.api = line.split("http://")[1].split(",")[0]

    def call(self, method, path, body=None, timeout=120):
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        token = Path(self.pool) / "api.token"  # made by daemons that check one
        if token.exists():
            headers["Authorization"] = "Bearer " + token.read_text().strip()
        req = urllib.request.Request(f"http://{self.api}{path}", data=data, method=method,
                                     headers=headers)
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def uri(self, vol):
        return f"nbd://{self.nbd}/{vol}"

    def rss_mib(self):
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self):
        self.proc.terminate()
        # An unlink in progress in the daemon's trash (seconds to minutes
        # for a fragmented layer on a file system with online discard)
        # finishes before the process can exit.
        self.proc.wait(timeout=1800)


def fio(uri, runtime, workdir, size="1G", rw="randwrite", extra=(), iodepth=16):
    out = subprocess.run(
        ["fio", "--name=bench", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", "--bs=4k",
         f"--iodepth={iodepth}", f"--size={size}", "--time_based", f"--runtime={runtime}",
         "--norandommap", "--randrepeat=0", "--output-format=json", *extra],
        cwd=workdir, capture_output=True, text=True, check=True)
    job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    w = job["read" if "read" in rw else "write"]
    return {"iops": w["iops"], "p99_us": w["clat_ns"]["percentile"]["99.000000"] / 1e3,
            "errors": job["error"]}


def snapshot_loop(d, vol, every, stop, pauses, prefix, calls=None):
    """A snapshot every `every` seconds, on a fixed clock: the next call
    starts `every` after the previous one started (at once when that one
    took longer), so slow calls do not thin the snapshots out. `calls`,
    if given, gets each call's (start, end) in Unix time."""
    n = 0
    start = time.monotonic()
    while not stop.wait(max(0.0, start + (n + 1) * every - time.monotonic())):
        n += 1
        t0 = time.time()
        r = d.call("POST", f"/v1/volumes/{vol}/snapshots", {"name": f"{prefix}-{n}"})
        if calls is not None:
            calls.append((t0, time.time()))
        pauses.append(r["pause_ms"])


@contextlib.contextmanager
def snapshots_every(d, vol, every, calls=None):
    """Snapshots of `vol` every `every` seconds (none when `every` is None)
    from a second thread while the block runs; yields their pauses, in ms.
    `calls` gets each call's (start, end) in Unix time."""
    pauses, stop, t = [], threading.Event(), None
    if every is not None:
        t = threading.Thread(target=snapshot_loop,
                             args=(d, vol, every, stop, pauses, "s", calls))
        t.start()
    try:
        yield pauses
    finally:
        stop.set()
        if t:
            t.join()


def bench_snapshot_latency(d, args, workdir):
    """One more run with a snapshot every second and fio's log of every
    write's completion latency (Unix-time stamps, 1 ms resolution): the
    writes that completed while a snapshot call was in flight (from the
    client sending it to the answer, plus 1 ms for the stamps' rounding)
    against all the others. A separate run: the log costs fio time."""
    vol = "lat-1s"
    d.call("POST", "/v1/volumes", {"name": vol, "size": 1 << 30})
    calls = []
    prefix = Path(workdir) / "snaplat"
    with snapshots_every(d, vol, 1.0, calls) as pauses:
        fio(d.uri(vol), args.runtime, workdir,
            extra=[f"--write_lat_log={prefix}", "--log_unix_epoch=1"])
    windows = [(int(a * 1000), int(b * 1000) + 1) for a, b in calls]
    during, outside = [], []
    w = 0
    with open(f"{prefix}_clat.1.log") as log:
        for line in log:
            fields = line.split(",")
            ms, lat_us = int(fields[0]), int(fields[1]) / 1000
            while w < len(windows) and windows[w][1] < ms:
                w += 1
            inside = w < len(windows) and windows[w][0] <= ms
            (during if inside else outside).append(lat_us)
    for f in Path(workdir).glob("snaplat_*.log"):
        f.unlink()
    d.call("DELETE", f"/v1/volumes/{vol}", timeout=1800)
    wait_trash_empty(d)

    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")
    return {"snapshots": len(calls), "call_ms_median": statistics.median(
                (b - a) * 1000 for a, b in calls) if calls else 0,
            "pause_ms_median": statistics.median(pauses) if pauses else 0,
            "writes_during": len(during), "writes_outside": len(outside),
            "p50_during_us": pct(during, 0.5), "p99_during_us": pct(during, 0.99),
            "max_during_us": max(during, default=float("nan")),
            "p50_outside_us": pct(outside, 0.5), "p99_outside_us": pct(outside, 0.99),
            "max_outside_us": max(outside, default=float("nan"))}


def snapshot_latency_md(lat):
    """The latency rows of the report."""
    return ["", f"Write latency around snapshots (one more 1 s run with fio's per-write "
            f"log: {lat['snapshots']} snapshots, calls {lat['call_ms_median']:.1f} ms "
            f"median, pauses {lat['pause_ms_median']:.2f} ms median):", "",
            "| fio randwrite 4k qd16, completion latency | writes | p50 µs | p99 µs | max µs |",
            "|---|---|---|---|---|",
            f"| completed during a snapshot call | {lat['writes_during']} | "
            f"{lat['p50_during_us']:.0f} | {lat['p99_during_us']:.0f} | {lat['max_during_us']:.0f} |",
            f"| all other writes | {lat['writes_outside']} | {lat['p50_outside_us']:.0f} | "
            f"{lat['p99_outside_us']:.0f} | {lat['max_outside_us']:.0f} |"]


def modes(args):
    """Snapshot intervals compared with the no-snapshot anchor."""
    return ["none", "1s"] + (["none-long", "30s"] if args.long else [])


def runtime(args, mode):
    """The 30 s interval needs runs long enough to hold snapshots."""
    return 65 if mode in ("none-long", "30s") else args.runtime


def bench_throughput(d, args, workdir):
    rows = []
    for rep in range(args.repeat):
        for mode in modes(args):
            vol = f"tp-{mode}-{rep}"
            d.call("POST", "/v1/volumes", {"name": vol, "size": 1 << 30})
            every = None if mode.startswith("none") else float(mode[:-1])
            with snapshots_every(d, vol, every) as pauses:
                r = fio(d.uri(vol), runtime(args, mode), workdir, iodepth=args.iodepth)
            r.update(mode=mode, rep=rep, snapshots=len(pauses),
                     pause_ms_median=statistics.median(pauses) if pauses else 0,
                     pause_ms_max=max(pauses) if pauses else 0)
            rows.append(r)
            if args.qemu:
                # The anchor, alternated with Strata's run of the same mode.
                rows.append(qemu_anchor.run(functools.partial(fio, iodepth=args.iodepth),
                                            workdir, mode,
                                            runtime(args, mode), args.cluster_size,
                                            args.extended_l2, rep))
            # Unlinking layers that subcluster writes fragmented can take
            # minutes on a file system mounted with online `discard`.
            t0 = time.monotonic()
            d.call("DELETE", f"/v1/volumes/{vol}", timeout=1800)
            # The daemon unlinks in the background: wait, so the next run
            # does not share the disk and CPU with that unlink.
            wait_trash_empty(d)
            r["delete_s"] = time.monotonic() - t0
        if args.floor:
            # The file system's own ratio for the pattern, in the same minutes.
            rows.append({"mode": "floor", "rep": rep,
                         **page_cache_floor.run(workdir, args.runtime)})
    return rows


def per_run_ratios(tp, mode, anchor):
    """IOPS ratio of each repeat's `mode` run to its `anchor` run: the
    spread a shared machine puts around the median."""
    runs = [r for r in tp if r["mode"] == mode]
    anchors = [r for r in tp if r["mode"] == anchor]
    return ", ".join(f"{x['iops'] / y['iops']:.3f}" for x, y in zip(runs, anchors))


def floor_md(args, tp):
    """The file system's own cost of a new file every second, beside the
    ratios above (bench/page_cache_floor.py)."""
    rows = [r for r in tp if r["mode"] == "floor"]
    if not rows:
        return []
    return ["", "Same run, the file system alone (bench/page_cache_floor.py: what "
            "writes into a new file every second cost without any snapshot code):", "",
            *page_cache_floor.markdown(page_cache_floor.summary(rows))]


def qemu_md(args, tp):
    """The QEMU anchor's rows beside Strata's: IOPS medians, the ratio of
    each interval to its no-snapshot run, and per-run ratios."""
    if not args.qemu:
        return []
    med = lambda m, k: statistics.median(r[k] for r in tp if r["mode"] == m)
    per_run = lambda m, a: per_run_ratios(tp, m, a)
    lines = ["", "Same run, QEMU's block layer (qemu-storage-daemon, NBD export, external "
             "snapshots by `blockdev-snapshot`; its pause is that call's wall time):", "",
             f"| fio randwrite 4k qd{args.iodepth} | Strata IOPS | QEMU IOPS | Strata / QEMU |",
             "|---|---|---|---|"]
    for m in modes(args):
        lines.append(f"| {m} | {med(m, 'iops'):.0f} | {med('qemu-' + m, 'iops'):.0f} | "
                     f"{med(m, 'iops') / med('qemu-' + m, 'iops'):.2f} |")
    lines += ["", "| snapshot interval | Strata ratio (per run) | QEMU ratio (per run) "
              "| Strata pause ms | QEMU blockdev-snapshot ms |", "|---|---|---|---|---|"]
    for m, a in (("1s", "none"), ("30s", "none-long")):
        if m not in modes(args):
            continue
        lines.append(
            f"| {m} | {med(m, 'iops') / med(a, 'iops'):.3f} ({per_run(m, a)}) | "
            f"{med('qemu-' + m, 'iops') / med('qemu-' + a, 'iops'):.3f} "
            f"({per_run('qemu-' + m, 'qemu-' + a)}) | {med(m, 'pause_ms_median'):.1f} | "
            f"{med('qemu-' + m, 'pause_ms_median'):.1f} |")
    return lines


def wait_trash_empty(d, limit=1800):
    t0 = time.monotonic()
    while d.call("GET", "/v1/pool").get("trash_pending", 0) > 0:
        if time.monotonic() - t0 > limit:
            raise SystemExit("the daemon's trash did not empty")
        time.sleep(0.5)


def bench_big_snapshot(d, args, workdir):
    gib = args.snap_volume_gib
    d.call("POST", "/v1/volumes", {"name": "big", "size": gib << 30})
    # Some data spread over the whole volume first.
    fio(d.uri("big"), 3, workdir, size=f"{gib}G")
    idle, busy = [], []
    for i in range(args.snapshots):
        t0 = time.monotonic()
        r = d.call("POST", "/v1/volumes/big/snapshots", {"name": f"idle-{i}"})
        idle.append((r["pause_ms"], (time.monotonic() - t0) * 1e3))
        # Snapshots of a volume come seconds apart, not back to back:
        # leave the daemon's standby keeper time for the next top.
        time.sleep(1)
    stop = threading.Event()
    load = threading.Thread(target=lambda: fio(d.uri("big"), args.snapshots + 2, workdir,
                                               size=f"{gib}G"))
    load.start()
    time.sleep(1)
    for i in range(args.snapshots):
        t0 = time.monotonic()
        r = d.call("POST", "/v1/volumes/big/snapshots", {"name": f"busy-{i}"})
        busy.append((r["pause_ms"], (time.monotonic() - t0) * 1e3))
        time.sleep(0.5)
    stop.set()
    load.join()
    d.call("DELETE", "/v1/volumes/big")
    med = lambda xs, k: statistics.median(x[k] for x in xs)
    return {"gib": gib, "n": args.snapshots,
            "idle_pause_ms": med(idle, 0), "idle_call_ms": med(idle, 1),
            "busy_pause_ms": med(busy, 0), "busy_call_ms": med(busy, 1),
            "busy_pause_ms_max": max(x[0] for x in busy)}


def big_ab(args, base):
    """The 50 GiB snapshot with standby tops (the default) and without
    (`--standby-min-index off`), alternated --repeat times in one run."""
    rows = {"default": [], "off": []}
    for rep in range(args.repeat):
        for mode, extra in (("default", ()), ("off", ("--standby-min-index", "off"))):
            pool = base / f"pool-big-{mode}-{rep}"
            d = Daemon(pool, args.cluster_size, args.extended_l2, extra)
            try:
                rows[mode].append(bench_big_snapshot(d, args, base))
            finally:
                d.stop()
                shutil.rmtree(pool, ignore_errors=True)
    med = lambda m, k: statistics.median(r[k] for r in rows[m])
    lines = [f"### Snapshot of a {args.snap_volume_gib} GiB volume, extended L2 {args.extended_l2}, "
             f"{time.strftime('%Y-%m-%d %H:%M')} (repeat {args.repeat}, {args.snapshots} snapshots "
             "idle and under fio each; medians of the per-run medians)", "",
             "| standby tops | idle pause ms | idle API call ms | busy pause ms | busy API call ms | busy pause max ms |",
             "|---|---|---|---|---|---|"]
    for m, label in (("default", "on (default)"), ("off", "off")):
        lines.append(f"| {label} | {med(m, 'idle_pause_ms'):.1f} | {med(m, 'idle_call_ms'):.1f} | "
                     f"{med(m, 'busy_pause_ms'):.1f} | {med(m, 'busy_call_ms'):.1f} | "
                     f"{max(r['busy_pause_ms_max'] for r in rows[m]):.1f} |")
    return "\n".join(lines) + "\n"


def build_chain(d, vol, layers, workdir):
    """A 1 GiB volume with data everywhere and a chain of `layers` layers,
    each holding about 1 s of random writes, with every snapshot deleted."""
    d.call("POST", "/v1/volumes", {"name": vol, "size": 1 << 30})
    subprocess.run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={d.uri(vol)}",
                    "--rw=write", "--bs=1m", "--iodepth=4", "--size=1G"],
                   cwd=workdir, capture_output=True, check=True)
    load = subprocess.Popen(
        ["fio", "--name=layers", "--ioengine=nbd", f"--uri={d.uri(vol)}", "--rw=randwrite",
         "--bs=4k", "--iodepth=4", "--size=1G", "--time_based", "--runtime=3600",
         "--rate_iops=4000", "--norandommap", "--randrepeat=0"],
        cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for i in range(1, layers):
            time.sleep(0.05)
            d.call("POST", f"/v1/volumes/{vol}/snapshots", {"name": f"l{i}"})
    finally:
        load.terminate()
        load.wait()
    for i in range(1, layers):
        d.call("DELETE", f"/v1/volumes/{vol}/snapshots/l{i}")
    return d.call("GET", f"/v1/volumes/{vol}")


def bench_compaction(d, args, workdir):
    rows = []
    for rep in range(args.repeat):
        vol = f"cmp-{rep}"
        info = build_chain(d, vol, args.layers, workdir)
        anchor = fio(d.uri(vol), args.runtime, workdir, rw="randread")
        t0 = time.monotonic()
        d.call("POST", f"/v1/volumes/{vol}/compact", {"rate": args.compact_rate})
        during = fio(d.uri(vol), args.runtime, workdir, rw="randread")
        fio_end = time.monotonic() - t0
        while True:
            st = d.call("GET", f"/v1/volumes/{vol}/compact")
            if st["state"] != "running":
                break
            time.sleep(0.2)
        after = d.call("GET", f"/v1/volumes/{vol}")
        rows.append({"rep": rep, "layers_before": info["chain_length"],
                     "layers_after": after["chain_length"], "state": st["state"],
                     "anchor_p99_us": anchor["p99_us"], "during_p99_us": during["p99_us"],
                     "anchor_iops": anchor["iops"], "during_iops": during["iops"],
                     "compact_s": st["elapsed_s"], "bytes_copied": st["bytes_copied"],
                     "rate_mib_s": st["bytes_copied"] / st["elapsed_s"] / 2**20,
                     "covered": st["elapsed_s"] >= fio_end, "max_pause_ms": st["max_pause_ms"]})
        d.call("DELETE", f"/v1/volumes/{vol}")
    return rows


def compaction_md(args, rows):
    med = lambda k: statistics.median(r[k] for r in rows)
    return [f"| 1 GiB volume, {rows[0]['layers_before']} layers, compact at "
            f"{args.compact_rate >> 20} MiB/s | fio randread 4k qd16 p99 µs (median) | IOPS (median) |",
            "|---|---|---|",
            f"| no compaction (anchor) | {med('anchor_p99_us'):.0f} | {med('anchor_iops'):.0f} |",
            f"| during compaction | {med('during_p99_us'):.0f} | {med('during_iops'):.0f} |",
            f"| ratio | {med('during_p99_us') / med('anchor_p99_us'):.2f} | "
            f"{med('during_iops') / med('anchor_iops'):.2f} |", "",
            f"Compaction: {rows[0]['layers_before']} → {rows[0]['layers_after']} layers, "
            f"{med('bytes_copied') / 2**20:.0f} MiB copied in {med('compact_s'):.1f} s "
            f"({med('rate_mib_s'):.1f} MiB/s achieved), longest splice pause "
            f"{max(r['max_pause_ms'] for r in rows):.1f} ms; read run inside the compaction "
            f"in {sum(r['covered'] for r in rows)} of {len(rows)} repeats; states "
            f"{', '.join(r['state'] for r in rows)}.", ""]


def bench_many(args, base):
    pool = base / "many"
    d = Daemon(pool)
    t0 = time.monotonic()
    for i in range(args.volumes):
        d.call("POST", "/v1/volumes", {"name": f"v{i:04d}", "size": 1 << 30})
    create_s = time.monotonic() - t0
    rss = d.rss_mib()
    d.stop()
    d = Daemon(pool)
    restart_s = d.ready_s
    listed = len(d.call("GET", "/v1/volumes"))
    info = subprocess.run(["qemu-img", "info", "--output", "json",
                           d.uri(f"v{args.volumes - 1:04d}")],
                          capture_output=True, text=True, check=True)
    size = json.loads(info.stdout)["virtual-size"]
    rss_after = d.rss_mib()
    d.stop()
    return {"volumes": args.volumes, "listed_after_restart": listed,
            "last_export_size": size, "create_s": create_s, "rss_mib": rss,
            "restart_s": restart_s, "rss_after_restart_mib": rss_after}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--daemon-arg", action="append", default=[],
                    help="extra argument for the benchmark's main daemon (repeat it: "
                         "--daemon-arg=--sealed-layer-cache --daemon-arg=keep)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=10)
    ap.add_argument("--volumes", type=int, default=500)
    ap.add_argument("--snap-volume-gib", type=int, default=50)
    ap.add_argument("--snapshots", type=int, default=10)
    ap.add_argument("--layers", type=int, default=200)
    ap.add_argument("--compact-rate", type=str, default="32M",
                    help="compaction pace, bytes/s with K/M/G suffix")
    ap.add_argument("--only", choices=["compaction", "throughput", "big"],
                    help="run one section only")
    ap.add_argument("--cluster-size", default="64k",
                    help="cluster size of the daemon's new volumes")
    ap.add_argument("--extended-l2", choices=["on", "off"], default="on",
                    help="extended L2 entries (subclusters) in the daemon's new volumes")
    ap.add_argument("--iodepth", type=int, default=16,
                    help="fio queue depth of the throughput runs (16 saturates two cores)")
    ap.add_argument("--no-qemu", dest="qemu", action="store_false",
                    help="skip the QEMU anchor (qemu-storage-daemon) in the throughput runs")
    ap.add_argument("--no-floor", dest="floor", action="store_false",
                    help="skip the file system's own measurement (bench/page_cache_floor.py)")
    ap.add_argument("--long", action="store_true",
                    help="also compare a snapshot every 30 s (65 s runs) with its anchor")
    args = ap.parse_args()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    r = args.compact_rate.upper()
    args.compact_rate = int(r[:-1]) * units[r[-1]] if r[-1] in units else int(r)
    if args.quick:
        args.repeat, args.runtime, args.snapshots = 1, 5, 5
    if not STRATA.exists():
        raise SystemExit("build first: cargo build --release")
    out_dir = ROOT / "bench" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="volume-bench-", dir=out_dir))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        d = Daemon(base / "pool", args.cluster_size, args.extended_l2, args.daemon_arg)
        if args.only == "throughput":
            tp = bench_throughput(d, args, base)
            lat = bench_snapshot_latency(d, args, base)
            (out_dir / f"volume-throughput-{stamp}.json").write_text(
                json.dumps({"runs": tp, "latency": lat}, indent=1))
            d.stop()
            iops = {m: statistics.median(r["iops"] for r in tp if r["mode"] == m) for m in modes(args)}
            p99 = {m: statistics.median(r["p99_us"] for r in tp if r["mode"] == m) for m in modes(args)}
            text = "\n".join([
                f"### Snapshot throughput, cluster size {args.cluster_size}, "
                f"extended L2 {args.extended_l2}, "
                f"{time.strftime('%Y-%m-%d %H:%M')} (repeat {args.repeat}, {args.runtime} s runs)", "",
                f"| fio randwrite 4k qd{args.iodepth} | IOPS (median) | write p99 µs (median) |",
                "|---|---|---|",
                *[f"| {m} | {iops[m]:.0f} | {p99[m]:.0f} |" for m in modes(args)],
                f"| ratio 1s/none | {iops['1s'] / iops['none']:.3f} (per run {per_run_ratios(tp, '1s', 'none')}) "
                f"| {p99['1s'] / p99['none']:.2f} |",
                *([f"| ratio 30s/none-long | {iops['30s'] / iops['none-long']:.3f} "
                   f"| {p99['30s'] / p99['none-long']:.2f} |"] if args.long else []),
                *snapshot_latency_md(lat), *qemu_md(args, tp), *floor_md(args, tp), ""])
            (out_dir / f"volume-throughput-{stamp}.md").write_text(text)
            print(text)
            return
        if args.only == "big":
            d.stop()
            text = big_ab(args, base)
            (out_dir / f"volume-big-{stamp}.md").write_text(text)
            print(text)
            return
        if args.only == "compaction":
            rows = bench_compaction(d, args, base)
            d.stop()
            text = "\n".join([f"### Volume compaction, {time.strftime('%Y-%m-%d %H:%M')} "
                              f"(repeat {args.repeat}, fio runtime {args.runtime} s)", "",
                              *compaction_md(args, rows)])
            (out_dir / f"volume-compaction-{stamp}.md").write_text(text)
            (out_dir / f"volume-compaction-{stamp}.json").write_text(json.dumps(rows, indent=1))
            print(text)
            return
        tp = bench_throughput(d, args, base)
        lat = bench_snapshot_latency(d, args, base)
        big = bench_big_snapshot(d, args, base)
        comp = bench_compaction(d, args, base)
        d.stop()
        many = bench_many(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    iops = {m: statistics.median(r["iops"] for r in tp if r["mode"] == m) for m in modes(args)}
    p99 = {m: statistics.median(r["p99_us"] for r in tp if r["mode"] == m) for m in modes(args)}
    pauses = [r["pause_ms_median"] for r in tp if r["mode"] == "1s"]
    long_rows = []
    if args.long:
        long_rows = [
            f"| no snapshots, 65 s runs (anchor) | {iops['none-long']:.0f} | {p99['none-long']:.0f} |",
            f"| snapshot every 30 s, 65 s runs | {iops['30s']:.0f} | {p99['30s']:.0f} |",
            f"| ratio | {iops['30s'] / iops['none-long']:.3f} | {p99['30s'] / p99['none-long']:.2f} |"]
    md = [f"### Volume service, {time.strftime('%Y-%m-%d %H:%M')} "
          f"(repeat {args.repeat}, fio runtime {args.runtime} s)", "",
          "| fio randwrite 4k qd16 on one volume | IOPS (median) | write p99 µs (median) |",
          "|---|---|---|",
          f"| no snapshots (anchor) | {iops['none']:.0f} | {p99['none']:.0f} |",
          f"| snapshot every 1 s | {iops['1s']:.0f} | {p99['1s']:.0f} |",
          f"| ratio (per run {per_run_ratios(tp, '1s', 'none')}) | {iops['1s'] / iops['none']:.3f} "
          f"| {p99['1s'] / p99['none']:.2f} |",
          *long_rows, *snapshot_latency_md(lat), *qemu_md(args, tp), *floor_md(args, tp), "",
          f"Snapshot pause during that run: median {statistics.median(pauses):.1f} ms "
          f"(per-run medians {', '.join(f'{p:.1f}' for p in pauses)}), "
          f"max {max(r['pause_ms_max'] for r in tp if r['mode'] == '1s'):.1f} ms.", "",
          f"| {big['gib']} GiB volume, {big['n']} snapshots | pause ms (median) | API call ms (median) |",
          "|---|---|---|",
          f"| idle | {big['idle_pause_ms']:.1f} | {big['idle_call_ms']:.1f} |",
          f"| under fio randwrite | {big['busy_pause_ms']:.1f} (max {big['busy_pause_ms_max']:.1f}) "
          f"| {big['busy_call_ms']:.1f} |", "",
          f"| {many['volumes']} volumes of 1 GiB | value |", "|---|---|",
          f"| create all (sequential API calls) | {many['create_s']:.1f} s |",
          f"| daemon RSS | {many['rss_mib']:.0f} MiB |",
          f"| restart to readiness, all re-exported | {many['restart_s']:.2f} s |",
          f"| RSS after restart | {many['rss_after_restart_mib']:.0f} MiB |",
          f"| volumes listed after restart | {many['listed_after_restart']} |", "",
          *compaction_md(args, comp)]
    text = "\n".join(md) + "\n"
    (out_dir / f"volume-bench-{stamp}.md").write_text(text)
    (out_dir / f"volume-bench-{stamp}.json").write_text(
        json.dumps({"throughput": tp, "latency": lat, "big_snapshot": big, "many": many,
                    "compaction": comp}, indent=1))
    print(text)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Compare two (or more) `strata` binaries on the volume write workload.

For each repeat and each binary, in turn: a fresh daemon and 1 GiB volume,
fio random 4 KiB writes at iodepth 16 over NBD for RUNTIME seconds, without
snapshots and then with a snapshot every second. Reports median IOPS, the
1 s / none ratio, and the daemon's CPU time per write (user + system from
/proc, which is steadier than IOPS on a shared machine).

Each configuration is a binary, optionally followed by daemon arguments
("target/release/strata --sealed-layer-cache drop"); --cluster-size and
--extended-l2 there override the format of that configuration's volume. The memory the guest
reported free to its hypervisor during the run (virtio-balloon free page
reporting, where the kernel has it) is printed beside, in MiB.

--flush-each-write turns the workload into a database's: 8 KiB writes,
each followed by a flush (fio's fsync=1), over the first 256 MiB of the
volume, written once beforehand. Without snapshots every write then goes
in place; with one every second nearly every write allocates, so the
difference in time per write is what an allocating write and its flush
cost the daemon. bench/alloc_flush_floor.py measures what the file system
alone charges for the same steps.

Usage: bench/volume_ab.py "OLD_BINARY[ ARGS]","NEW_BINARY[ ARGS]" [--repeat 3] [--runtime 8]
                          [--extended-l2 on|off] [--iodepth 16] [--flush-each-write]
"""
import argparse
import os
import shutil
import statistics
import tempfile
import threading
from pathlib import Path

import volume_bench as vb


def daemon_cpu_s(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reported_mib():
    """Memory the guest has reported free to the hypervisor so far (MiB),
    or 0 where the kernel does not say."""
    p = Path("/sys/module/page_reporting/parameters/reported_kib")
    return int(p.read_text()) / 1024 if p.exists() else 0.0


def one_run(config, mode, args, work):
    binary, *extra = config.split()
    vb.STRATA = Path(binary)
    pool = work / "pool"
    shutil.rmtree(pool, ignore_errors=True)
    pool.mkdir()
    # The format options the Daemon helper always passes can be overridden per configuration.
    fmt = {"--cluster-size": "64k", "--extended-l2": args.extended_l2}
    for flag in fmt:
        if flag in extra:
            i = extra.index(flag)
            fmt[flag] = extra[i + 1]
            del extra[i:i + 2]
    d = vb.Daemon(pool, cluster_size=fmt["--cluster-size"], extended_l2=fmt["--extended-l2"], extra=extra)
    try:
        d.call("POST", "/v1/volumes", {"name": "v", "size": 1 << 30})
        fio_args, size = (f"--iodepth={args.iodepth}",), "1G"
        if args.flush_each_write:
            size = "256M"
            vb.fio(d.uri("v"), 60, work, size=size, rw="write",
                   extra=("--bs=1M", "--time_based=0"), iodepth=4)
            fio_args += ("--bs=8k", "--fsync=1")
        stop, pauses, loop = threading.Event(), [], None
        if mode == "1s":
            loop = threading.Thread(target=vb.snapshot_loop, args=(d, "v", 1.0, stop, pauses, "s"))
            loop.start()
        c0, m0 = daemon_cpu_s(d.proc.pid), reported_mib()
        r = vb.fio(d.uri("v"), args.runtime, work, size=size, extra=fio_args)
        c1, m1 = daemon_cpu_s(d.proc.pid), reported_mib()
        stop.set()
        if loop:
            loop.join()
        return r["iops"], (c1 - c0) * 1e6 / max(r["iops"] * args.runtime, 1), m1 - m0
    finally:
        d.proc.kill()
        d.proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binaries", help="comma-separated strata binaries, each with optional daemon arguments")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=8)
    ap.add_argument("--extended-l2", choices=["on", "off"], default="on")
    ap.add_argument("--iodepth", type=int, default=16,
                    help="fio's queue depth (16 saturates both cores; 1 leaves CPU idle)")
    ap.add_argument("--flush-each-write", action="store_true",
                    help="8 KiB writes over 256 MiB written beforehand, each followed by a flush")
    args = ap.parse_args()
    bins = args.binaries.split(",")
    res = {}
    with tempfile.TemporaryDirectory(prefix="strata-ab-") as tmp:
        for rep in range(args.repeat):
            for b in bins:
                for mode in ("none", "1s"):
                    iops, cpu, reported = one_run(b, mode, args, Path(tmp))
                    res.setdefault((b, mode), []).append((iops, cpu))
                    print(f"repeat {rep} {b} {mode}: {iops:.0f} IOPS, {cpu:.1f} us CPU/write, "
                          f"{reported:.0f} MiB reported free", flush=True)
    print()
    print("| binary | IOPS none | IOPS 1 s | ratio | µs per write none / 1 s | daemon CPU µs/write none | 1 s |")
    print("|---|---|---|---|---|---|---|")
    for b in bins:
        med = {m: (statistics.median(x[0] for x in res[(b, m)]), statistics.median(x[1] for x in res[(b, m)]))
               for m in ("none", "1s")}
        per_write = f"{1e6 * args.iodepth / med['none'][0]:.0f} / {1e6 * args.iodepth / med['1s'][0]:.0f}"
        print(f"| {b} | {med['none'][0]:.0f} | {med['1s'][0]:.0f} | {med['1s'][0] / med['none'][0]:.3f} | {per_write} "
              f"| {med['none'][1]:.1f} | {med['1s'][1]:.1f} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What it costs the machine to keep one second of snapshot data.

With a snapshot every second, each second's writes stay in their own
layer file: the kernel must write them back (`fdatasync`) and, to reuse
the memory, drop them from the page cache (`POSIX_FADV_DONTNEED`, what
`strata daemon --sealed-layer-cache drop` does). Without snapshots a
random-write run rewrites pages that are already dirty and writes back
nothing for `dirty_expire_centisecs` (30 s). So the 1 s case carries work
the no-snapshot case never does, whatever the snapshot code looks like.

This measures that work alone, system-wide (all CPUs, kernel threads
included, from /proc/stat): a file of PAGES 4 KiB pages written in order
(the layout of a 4 KiB-cluster layer's new data), then its `fdatasync`,
then its drop. It reports the CPU time per page of each step, and the
share of the machine that persisting and dropping takes at a given rate
of new pages per second (--rate: the 1 s case's write IOPS).

Usage: bench/persist_cost.py [--pages 200000] [--repeat 5] [--rate 120000] [--dir DIR]
"""

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def busy_cpu_s():
    """CPU seconds spent on all CPUs, idle and iowait excluded."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def one(path, pages):
    """CPU µs per page of the sync and of the drop of `pages` new pages."""
    block = os.urandom(4096)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        for i in range(pages):
            os.pwrite(fd, block, i * 4096)
        time.sleep(0.2)  # let the writer's own tail of CPU time settle
        c0 = busy_cpu_s()
        os.fdatasync(fd)
        c1 = busy_cpu_s()
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        c2 = busy_cpu_s()
    finally:
        os.close(fd)
        os.unlink(path)
    return (c1 - c0) * 1e6 / pages, (c2 - c1) * 1e6 / pages


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rate", type=float, default=120_000,
                    help="new pages per second to cost (the 1 s case's write IOPS)")
    ap.add_argument("--dir", default=str(Path(__file__).resolve().parent / "out"),
                    help="a directory on the file system of the daemon's pool")
    args = ap.parse_args()
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="persist-", dir=args.dir) as work:
        for rep in range(args.repeat):
            rows.append(one(Path(work) / f"layer-{rep}", args.pages))
            print(f"run {rep}: sync {rows[-1][0]:.2f} µs/page, drop {rows[-1][1]:.2f} µs/page",
                  flush=True)
    sync = statistics.median(r[0] for r in rows)
    drop = statistics.median(r[1] for r in rows)
    cpus = os.cpu_count() or 1
    share = (sync + drop) * args.rate / 1e6 / cpus
    print()
    print("| step | CPU µs per page (median) |")
    print("|---|---|")
    print(f"| fdatasync of new pages written in order | {sync:.2f} |")
    print(f"| POSIX_FADV_DONTNEED of the synced pages | {drop:.2f} |")
    print(f"| both, at {args.rate:,.0f} new pages/s | {share * 100:.1f}% of {cpus} CPUs |")


if __name__ == "__main__":
    main()

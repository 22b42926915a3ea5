#!/usr/bin/env python3
"""The file system's own cost of snapshots, for the volume benchmark.

After a snapshot, a write lands in the new top layer: a new file, so the
first write to each 4 KiB block is a write to a page the kernel's page
cache does not have yet (allocate it, charge it, put it on the LRU, mark
it dirty, reserve the block). Without snapshots most writes overwrite a
page that is already cached and dirty. Any layered format on a file
system pays this, whatever its own code does.

This measures it without Strata or QEMU: fio 4 KiB random buffered writes
(psync, one thread) on the benchmark's file system,

- into one sparse 1 GiB file for RUNTIME seconds (the no-snapshot case),
- into a new sparse 1 GiB file every second for RUNTIME seconds (what a
  snapshot every second leaves the file system to do),

and reports both rates, their ratio (the file system's ratio for the
pattern) and the extra time per write that the fresh files cost.

Usage: bench/page_cache_floor.py [--repeat 3] [--runtime 10] [--dir DIR]
"""

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path


def fio_iops(path, runtime):
    """IOPS of 4 KiB random buffered writes into `path` (1 GiB, sparse)."""
    out = subprocess.run(
        ["fio", "--name=floor", f"--filename={path}", "--rw=randwrite", "--bs=4k",
         "--size=1G", "--ioengine=psync", "--time_based", f"--runtime={runtime}",
         "--norandommap", "--randrepeat=0", "--output-format=json"],
        capture_output=True, text=True, check=True)
    return json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]["write"]["iops"]


def run(workdir, runtime):
    """One measurement in `workdir`: both cases, files removed after."""
    work = Path(tempfile.mkdtemp(prefix="floor-", dir=workdir))
    try:
        one = fio_iops(work / "one", runtime)
        (work / "one").unlink()
        fresh = []
        for second in range(runtime):
            path = work / f"fresh-{second}"
            fresh.append(fio_iops(path, 1))
            path.unlink()
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    fresh_iops = statistics.mean(fresh)
    return {"one_file_iops": one, "fresh_file_iops": fresh_iops,
            "ratio": fresh_iops / one,
            "extra_us_per_write": 1e6 / fresh_iops - 1e6 / one}


def summary(rows):
    """Medians over repeated runs."""
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    med["ratios"] = [r["ratio"] for r in rows]
    return med


def markdown(s):
    """Rows for the benchmark report."""
    per_run = ", ".join(f"{r:.2f}" for r in s["ratios"])
    return [
        "| file system alone: fio psync randwrite 4k | IOPS (median) |", "|---|---|",
        f"| one 1 GiB file for the whole run | {s['one_file_iops']:.0f} |",
        f"| a new 1 GiB file every second | {s['fresh_file_iops']:.0f} |",
        f"| ratio | {s['ratio']:.3f} (per run {per_run}) |",
        f"| extra time per write in a new file | {s['extra_us_per_write']:.1f} µs |"]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=10)
    ap.add_argument("--dir", default=str(Path(__file__).resolve().parent / "out"),
                    help="where the files go (the file system of the daemon's pool)")
    args = ap.parse_args()
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    rows = [run(args.dir, args.runtime) for _ in range(args.repeat)]
    print("\n".join(markdown(summary(rows))))


if __name__ == "__main__":
    main()

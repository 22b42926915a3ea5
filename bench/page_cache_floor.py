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

- into one sparse 1 GiB file for RUNTIME seconds (the no-snapshot case);
- into a new sparse 1 GiB file every second for RUNTIME seconds, keeping
  the earlier files (what a snapshot every second leaves: the frozen
  layers stay, and so do their cached pages). This is the floor;
- the same, but removing each file after its second. The kernel then
  reuses the pages it just freed. An earlier version of this script
  measured only this case and so understated the floor.

and reports the rates, the ratios to the one-file case and the extra
time per write.

The kept files need RUNTIME GiB of free space (fio lays them out in full).

Why the two differ so much on a virtual machine: a page the page cache
takes from memory the guest has never touched (or has handed back to the
hypervisor: free page reporting, DAMON's proactive reclaim) faults in the
host on its first write. Seen here: the copy into such a page took most
of a write's time. Pages freed a moment ago are still backed and cheap.

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


def fresh_files(work, runtime, keep):
    """Mean IOPS of one second in each of `runtime` new files; `keep`
    leaves the files (and their cached pages) until the end."""
    rates = []
    for second in range(runtime):
        path = work / f"fresh-{keep}-{second}"
        rates.append(fio_iops(path, 1))
        if not keep:
            path.unlink()
    return statistics.mean(rates)


def run(workdir, runtime):
    """One measurement in `workdir`: the three cases, files removed after."""
    work = Path(tempfile.mkdtemp(prefix="floor-", dir=workdir))
    try:
        one = fio_iops(work / "one", runtime)
        (work / "one").unlink()
        removed = fresh_files(work, runtime, keep=False)
        kept = fresh_files(work, runtime, keep=True)
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    return {"one_file_iops": one,
            "kept_iops": kept, "ratio": kept / one,
            "extra_us_per_write": 1e6 / kept - 1e6 / one,
            "removed_iops": removed, "removed_ratio": removed / one,
            "removed_extra_us": 1e6 / removed - 1e6 / one}


def summary(rows):
    """Medians over repeated runs."""
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    med["ratios"] = [r["ratio"] for r in rows]
    med["removed_ratios"] = [r["removed_ratio"] for r in rows]
    return med


def markdown(s):
    """Rows for the benchmark report."""
    def runs(key):
        return ", ".join(f"{r:.2f}" for r in s[key])
    return [
        "| file system alone: fio psync randwrite 4k | IOPS (median) | ratio to one file "
        "| extra µs per write |", "|---|---|---|---|",
        f"| one 1 GiB file for the whole run | {s['one_file_iops']:.0f} | 1 | 0 |",
        f"| a new 1 GiB file every second, earlier ones kept (the floor) | {s['kept_iops']:.0f} "
        f"| **{s['ratio']:.3f}** ({runs('ratios')}) | {s['extra_us_per_write']:.1f} |",
        f"| a new 1 GiB file every second, each removed after its second | "
        f"{s['removed_iops']:.0f} | {s['removed_ratio']:.3f} ({runs('removed_ratios')}) "
        f"| {s['removed_extra_us']:.1f} |"]


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

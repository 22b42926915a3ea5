#!/usr/bin/env python3
"""What the file system under a pool charges for a write and flush, with
and without allocation: the floor under any copy-on-write layer that
orders its data before its metadata.

A guest write after a snapshot lands in a cluster the new top layer does
not have yet. Before the flush that follows can report success, Strata
makes the data durable, then writes the metadata that points at it
(L2 entry, chain index owners, refcount) and makes that durable too, so
a crash never leaves metadata pointing at data that is not there. This
script times those steps with plain system calls on one file, without
Strata, so that the figures are the machine's and not the daemon's:

- in place: an 8 KiB pwrite into written space, fdatasync (a write
  after the cluster is the top's own);
- into a hole: an 8 KiB pwrite into a new 64 KiB stretch at the end of
  the file, fdatasync (the file system allocates blocks and grows the
  file);
- in place, then metadata: in place, then two 512-byte pwrites at two
  other places and a second fdatasync (ordered metadata alone);
- allocating, ordered: into a hole, then the metadata and a second
  fdatasync (what an allocating write and its flush cost at least);
- allocating, unordered: the same with one fdatasync for both (the
  order given up: what a metadata journal could reach at best).

Each sequence runs COUNT times on a fresh file in DIR (default: the
current directory, which should be on the pool's file system); the
median over --repeat runs of the mean time per sequence is reported,
with its ratio to "in place". The files are at most 64 MiB plus 64 KiB
per sequence, and are deleted at the end.

Usage: python3 bench/alloc_flush_floor.py [--dir DIR] [--count 2000] [--repeat 3]
"""

import argparse
import os
import random
import statistics
import tempfile
import time

WRITTEN = 64 << 20
PAGE = 8192
SECTOR = 512
CLUSTER = 64 << 10
PAGE_BYTES = b"\x5a" * PAGE
SECTOR_BYTES = b"\xa5" * SECTOR


def in_place(fd, i, rng):
    os.pwrite(fd, PAGE_BYTES, rng.randrange(WRITTEN // 2 // PAGE) * PAGE)
    os.fdatasync(fd)


def write_into_hole(fd, i, rng):
    """8 KiB somewhere in the i-th new 64 KiB stretch past the written space."""
    os.pwrite(fd, PAGE_BYTES, WRITTEN + i * CLUSTER + rng.randrange(CLUSTER // PAGE) * PAGE)


def into_hole(fd, i, rng):
    write_into_hole(fd, i, rng)
    os.fdatasync(fd)


def metadata(fd, rng):
    """Two sectors in the upper half of the written space (the data of the
    in-place sequences stays in the lower half)."""
    half = WRITTEN // 2
    os.pwrite(fd, SECTOR_BYTES, half + rng.randrange(half // 2 // SECTOR) * SECTOR)
    os.pwrite(fd, SECTOR_BYTES, half + half // 2 + rng.randrange(half // 2 // SECTOR) * SECTOR)


def in_place_then_metadata(fd, i, rng):
    in_place(fd, i, rng)
    metadata(fd, rng)
    os.fdatasync(fd)


def allocating_ordered(fd, i, rng):
    into_hole(fd, i, rng)
    metadata(fd, rng)
    os.fdatasync(fd)


def allocating_unordered(fd, i, rng):
    write_into_hole(fd, i, rng)
    metadata(fd, rng)
    os.fdatasync(fd)


SEQUENCES = [
    ("in place", in_place),
    ("into a hole", into_hole),
    ("in place, then metadata", in_place_then_metadata),
    ("allocating, ordered", allocating_ordered),
    ("allocating, unordered", allocating_unordered),
]


def time_sequence(directory, step, count, seed):
    """Mean µs per sequence over `count`, on a fresh file whose first
    WRITTEN bytes are written and durable."""
    fd, path = tempfile.mkstemp(prefix="floor-", dir=directory)
    try:
        chunk = b"\x01" * (1 << 20)
        for at in range(0, WRITTEN, len(chunk)):
            os.pwrite(fd, chunk, at)
        os.fsync(fd)
        rng = random.Random(seed)
        start = time.perf_counter()
        for i in range(count):
            step(fd, i, rng)
        return (time.perf_counter() - start) / count * 1e6
    finally:
        os.close(fd)
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=".", help="where the test files go (the pool's file system)")
    ap.add_argument("--count", type=int, default=2000, help="sequences per run (at most 20000)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not 1 <= args.count <= 20000:
        raise SystemExit(f"--count {args.count}: give 1 to 20000 (each takes 64 KiB of file)")
    if args.repeat < 1:
        raise SystemExit(f"--repeat {args.repeat}: give at least 1")
    times = {name: [] for name, _ in SEQUENCES}
    for r in range(args.repeat):
        # Interleaved, so that a slow moment of a shared machine hits all.
        for name, step in SEQUENCES:
            times[name].append(time_sequence(args.dir, step, args.count, r))
            print(f"run {r + 1} {name}: {times[name][-1]:.0f} µs", flush=True)
    base = statistics.median(times["in place"])
    print(f"\nmedians of {args.repeat} runs of {args.count} sequences each, in {os.path.abspath(args.dir)}")
    print("| sequence | µs per write and flush | against in place |")
    print("|---|---|---|")
    for name, _ in SEQUENCES:
        m = statistics.median(times[name])
        print(f"| {name} | {m:.0f} | {m / base:.2f}× |")


if __name__ == "__main__":
    main()

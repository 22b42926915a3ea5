#!/usr/bin/env python3
"""F3 range fetches (issue 30): time to the first byte of a 1 MiB read far
into a large ephemeral file held by another node.

The F3 service and two node agents (`strata node`, on loopback): node a
writes a file of --size-mb MiB; node b opens it and reads 1 MiB at
--offset-mb. The time is from the open to the read's return (the open
itself returns at once). Each round writes the file anew (a new version,
so node b has no copy yet). Also reported: the bytes node a's transfer
service sent for that read (`strata_f3_served_bytes_total`), sampled
right after it.

Run as root (FUSE mounts):
    python3 bench/f3_range.py --size-mb 160 --offset-mb 150 --repeat 5
"""

import argparse
import os
import statistics
import time

from f3_locality import Cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strata", default=os.path.join(ROOT, "target/release/strata"))
    parser.add_argument("--size-mb", type=int, default=160)
    parser.add_argument("--offset-mb", type=int, default=150)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--node-arg", action="append", default=[],
                        help="an extra `strata node` argument for both agents")
    return parser.parse_args()


def main():
    args = parse_args()
    cluster = Cluster(args.strata, ["a", "b"], args.node_arg, prefix="f3range-")
    try:
        block = bytes(range(256)) * (MIB // 256)
        times, served = [], []
        for round_ in range(args.repeat):
            name = f"big{round_}.eph"
            with open(f"{cluster.mounts[0]}/{name}", "wb") as f:
                for index in range(args.size_mb):
                    f.write(block)
            before = cluster.served_by("a")
            started = time.perf_counter()
            fd = os.open(f"{cluster.mounts[1]}/{name}", os.O_RDONLY)
            try:
                data = os.pread(fd, MIB, args.offset_mb * MIB)
                elapsed = time.perf_counter() - started
                served.append(cluster.served_by("a") - before)
            finally:
                os.close(fd)
            if data != block[:len(data)] or len(data) == 0:
                raise SystemExit(f"round {round_}: wrong bytes ({len(data)} read)")
            times.append(elapsed)
            os.unlink(f"{cluster.mounts[0]}/{name}")
        print(f"first 1 MiB at {args.offset_mb} MiB of a {args.size_mb} MiB remote file "
              f"(loopback), {args.repeat} rounds:")
        print(f"  median {statistics.median(times) * 1000:.1f} ms, "
              f"min {min(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms")
        print(f"  holder served at the read's return: median "
              f"{statistics.median(served) / MIB:.1f} MiB")
    finally:
        cluster.close()


if __name__ == "__main__":
    main()

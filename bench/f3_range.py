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
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import urllib.request

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


class Cluster:
    """The F3 service and agents a and b, torn down on exit."""

    def __init__(self, strata, node_args):
        self.strata = strata
        self.dir = tempfile.mkdtemp(prefix="f3range-")
        self.processes, self.mounts, self.logs, self.agents = [], [], [], {}
        self.meta = self.start(["f3", "serve", "--dir", f"{self.dir}/meta",
                                "--listen", "127.0.0.1:0"], "serving on ", "service")
        for name in ["a", "b"]:
            mount = f"{self.dir}/mnt-{name}"
            os.makedirs(mount)
            self.mounts.append(mount)
            self.agents[name] = self.start(
                ["node", "--dir", f"{self.dir}/node-{name}", "--mount", mount,
                 "--meta", self.meta, "--name", name, *node_args], "transfer on ", name)

    def start(self, args, marker, label):
        log_path = f"{self.dir}/{label}.log"
        log = open(log_path, "w+")
        self.logs.append(log)
        process = subprocess.Popen([self.strata, *args], stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(process)
        deadline, text = time.time() + 20, ""
        while time.time() < deadline:
            with open(log_path) as f:
                text = f.read(1 << 16)
            match = re.search(re.escape(marker) + r"(\S+)", text)
            if match:
                return match.group(1).rstrip(",")
            if process.poll() is not None:
                break
            time.sleep(0.05)
        raise SystemExit(f"{label} did not start: {text[-2000:]}")

    def served(self, name):
        with urllib.request.urlopen(f"http://{self.agents[name]}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        match = re.search(r"^strata_f3_served_bytes_total\{[^}]*\} (\d+)$", text, re.M)
        return int(match.group(1))

    def close(self):
        for mount in self.mounts:
            subprocess.run(["umount", "-l", mount], capture_output=True)
        for process in reversed(self.processes):
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        for log in self.logs:
            log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def main():
    args = parse_args()
    cluster = Cluster(args.strata, args.node_arg)
    try:
        block = bytes(range(256)) * (MIB // 256)
        times, served = [], []
        for round_ in range(args.repeat):
            name = f"big{round_}.eph"
            with open(f"{cluster.mounts[0]}/{name}", "wb") as f:
                for index in range(args.size_mb):
                    f.write(block)
            before = cluster.served("a")
            started = time.perf_counter()
            fd = os.open(f"{cluster.mounts[1]}/{name}", os.O_RDONLY)
            try:
                data = os.pread(fd, MIB, args.offset_mb * MIB)
                elapsed = time.perf_counter() - started
                served.append(cluster.served("a") - before)
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

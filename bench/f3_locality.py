#!/usr/bin/env python3
"""F3 experiment 1 (issue 30): bytes moved between nodes by hand-offs,
under locality, random and round-robin placement.

N node agents (`strata node`, on loopback) and the F3 service; a workflow
of P writer/reader pairs, each writer writing one ephemeral file and its
reader reading it whole. `strata f3 run` places the steps; the bytes moved
are what the agents' transfer services sent to other nodes
(`strata_f3_served_bytes_total` on each agent's /metrics, summed), checked
against the runner's own count of each step's input bytes held elsewhere.

The issue's target: locality placement moves 0 bytes for co-locatable
hand-offs; random placement moves about (N-1)/N of them.

Run as root (FUSE mounts):
    python3 bench/f3_locality.py --nodes 3 --pairs 6 --repeat 3
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strata", default=os.path.join(ROOT, "target/release/strata"))
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--min-mb", type=int, default=100, help="smallest hand-off")
    parser.add_argument("--max-mb", type=int, default=400, help="largest hand-off")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="write the results here too")
    return parser.parse_args()


class Cluster:
    """The F3 service and agents named `names`, each started with
    `node_args` too, torn down on exit (bench/f3_range.py uses it too)."""

    def __init__(self, strata, names, node_args=(), prefix="f3locality-"):
        self.strata = strata
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.processes, self.mounts, self.logs, self.agents = [], [], [], {}
        self.meta = self.start(["f3", "serve", "--dir", f"{self.dir}/meta",
                                "--listen", "127.0.0.1:0"], "serving on ", "service")
        for name in names:
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
        deadline = time.time() + 20
        while time.time() < deadline:
            log.flush()
            with open(log_path) as f:
                text = f.read(1 << 16)
            match = re.search(re.escape(marker) + r"(\S+)", text)
            if match:
                return match.group(1).rstrip(",")
            if process.poll() is not None:
                break
            time.sleep(0.05)
        raise SystemExit(f"{label} did not start: {text[-2000:]}")

    def served_by(self, name):
        """Bytes agent `name`'s transfer service has sent."""
        with urllib.request.urlopen(f"http://{self.agents[name]}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        match = re.search(r"^strata_f3_served_bytes_total\{[^}]*\} (\d+)$", text, re.M)
        return int(match.group(1))

    def served(self):
        """Bytes every agent's transfer service has sent, summed."""
        return sum(self.served_by(name) for name in self.agents)

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


def workflow(pairs, min_mb, max_mb):
    """P writer/reader pairs of evenly spread sizes; the total bytes."""
    lines, total = ["steps:"], 0
    for index in range(pairs):
        mb = min_mb + (max_mb - min_mb) * index // max(pairs - 1, 1)
        total += mb << 20
        lines += [
            f"  - name: write{index}",
            f"    function: [/bin/sh, -c, 'head -c {mb}M /dev/zero > ${{output.data}}']",
            f"    outputs: {{data: /handoff{index}.eph}}",
            f"  - name: read{index}",
            "    function: [/bin/sh, -c, 'wc -c < ${input.data} > ${output.size}']",
            f"    inputs: {{data: {{path: /handoff{index}.eph}}}}",
            f"    outputs: {{size: /size{index}.eph}}",
        ]
    return "\n".join(lines) + "\n", total


def run_once(cluster, path, scheduler, seed):
    before = cluster.served()
    started = time.time()
    out = subprocess.run([cluster.strata, "f3", "run", path, "--scheduler", scheduler,
                          "--seed", str(seed), "--meta", cluster.meta, "--output", "json"],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"strata f3 run failed: {out.stderr[-3000:]}")
    elapsed = time.time() - started
    report = json.loads(out.stdout)
    moved = cluster.served() - before
    readers = [s for s in report["steps"] if s["step"].startswith("read")]
    counted = sum(s.get("remote_input_bytes", 0) for s in readers)
    colocated = sum(1 for s in readers
                    if s["node"] == next(w["node"] for w in report["steps"]
                                         if w["step"] == "write" + s["step"][4:]))
    return {"moved": moved, "counted": counted, "colocated": colocated, "seconds": elapsed}


def main():
    opts = parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the agents mount FUSE file systems")
    text, total = workflow(opts.pairs, opts.min_mb, opts.max_mb)
    cluster = Cluster(opts.strata, [f"n{index}" for index in range(opts.nodes)],
                      ["--slots", "8"])
    results = {"locality": [], "random": [], "round-robin": []}
    try:
        path = f"{cluster.dir}/handoffs.yaml"
        with open(path, "w") as f:
            f.write(text)
        for round_ in range(opts.repeat):
            for scheduler in results:
                result = run_once(cluster, path, scheduler, seed=round_ + 1)
                results[scheduler].append(result)
                print(f"round {round_ + 1} {scheduler:<11} moved {result['moved'] / 2**20:8.1f} MiB"
                      f" (runner counted {result['counted'] / 2**20:.1f}),"
                      f" {result['colocated']}/{opts.pairs} readers with their writer,"
                      f" {result['seconds']:.1f} s", flush=True)
    finally:
        cluster.close()
    expected = (opts.nodes - 1) / opts.nodes
    print(f"\n{opts.pairs} hand-offs, {total / 2**20:.0f} MiB in all, {opts.nodes} nodes;"
          f" medians of {opts.repeat}")
    print("| placement | MiB moved | share of hand-off bytes | readers on their writer's node |"
          " run time s |")
    print("|---|---|---|---|---|")
    summary = {}
    for scheduler, runs in results.items():
        moved = statistics.median(r["moved"] for r in runs)
        share = moved / total
        summary[scheduler] = {"moved_bytes": moved, "share": share, "runs": runs}
        print(f"| {scheduler} | {moved / 2**20:.1f} | {share:.2f} |"
              f" {statistics.median(r['colocated'] for r in runs):.0f}/{opts.pairs} |"
              f" {statistics.median(r['seconds'] for r in runs):.1f} |")
    print(f"\nrandom placement's expected share: (N-1)/N = {expected:.2f}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"nodes": opts.nodes, "pairs": opts.pairs, "total_bytes": total,
                       "results": summary}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

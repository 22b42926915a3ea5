#!/usr/bin/env python3
"""Virtual-disk engine benchmark: Strata vs QEMU on long qcow2 backing chains.

Usage:
    python3 bench/img_bench.py [--chains 1,50,100,500,1000] [--repeat 3]
        [--strata PATH | --no-strata] [--rand-count N] [--no-big] [-v] ...
    bench/run-img-bench.sh [same options]

For every chain length N it generates (or reuses) bench/out/chains/nNNNN with
bench/gen-chain.sh (1 GiB disk, 64 KiB clusters), warms the page cache, then
measures, interleaving the tools within each repeat:

  open        open the chain and read one 4 KiB block (wall time of
              `bench -c 1 -d 1 -s 4k`)
  rand        random 4 KiB reads, queue depth 16 (`bench -d 16 -s 4k -S STEP`)
  seq         full sequential read (`bench -d 4 -s 2M -S 2M -c SIZE/2M`)
  convert     whole-disk copy to a null target (qemu: null-co driver,
              strata: /dev/null)
  snapshot    external snapshot on top of the chain, plus the new file's
              apparent and allocated size
  index       strata only: `strata img index` on a copy of the top layer
  compare     content check against expected.raw (exit 0 = identical)

Three variants are run: "qemu" (qemu-img on the chain), "strata" (the same,
untouched chain: Strata rebuilds the chain index in memory) and
"strata-idx" (a copy of the top layer on which `strata img index` stored the
index).  Peak RSS is the child's ru_maxrss (os.wait4).  Timings are medians of
--repeat runs; a variant that crashes (e.g. QEMU's SIGSEGV on ~900+ layers) is
reported as "crash (signal N)" and not retried.

A final row snapshots a "fully allocated" 50 GiB disk
(`qemu-img create -f qcow2 -o cluster_size=64k,preallocation=metadata`).

Results: markdown on stdout and in bench/out/img-bench-<timestamp>.md, all
samples in bench/out/img-bench-<timestamp>.json.

Random pattern: qemu-img bench has no random mode.  QEMU 10.0.x issues request
0 at -o OFFSET and then advances with `offset = (offset + step) % image_size`
(QEMU master later changed this to `% (image_size - bufsize)`).  With a 4 KiB
aligned step of P blocks, P odd, on a 2^k-block disk, the offsets visit every
4 KiB block once per 2^k requests in a scattered order; P = 162007 (prime,
~0.618 of the 262144 blocks of 1 GiB, a golden-ratio stride) spreads
consecutive requests evenly over the whole disk.
"""

import argparse
import datetime
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)
OUT_DIR = os.path.join(BENCH_DIR, "out")

DISK_SIZE = 1 << 30
CLUSTER = 64 << 10
BLOCK = 4096
RAND_STEP = 162007 * BLOCK   # see module docstring
RAND_DEPTH = 16
RAND_MIN_SECONDS = 1.0      # auto count: runs shorter than this are redone ...
RAND_TARGET_SECONDS = 2.0   # ... with a count scaled to last about this long
RAND_MAX_COUNT = 4000000
SEQ_BUF = 2 << 20
SEQ_DEPTH = 4

VARIANTS = ("qemu", "strata", "strata-idx")
LABEL = {"qemu": "QEMU", "strata": "Strata", "strata-idx": "Strata (indexed)"}


# ---------------------------------------------------------------- running

GNU_TIME = "/usr/bin/time"


def run_cmd(cmd, timeout):
    """Run cmd; return dict(status, wall, rss_kib, out, err).

    status is "ok", "exit N", "crash (signal N)" or "timeout".

    Peak RSS: a child forked from this Python process starts with Python's
    own memory as its high-water mark, and Linux carries that mark across
    execve into ru_maxrss (wait4 would report >= ~20 MiB for `true`).  So the
    command is started by GNU time (Debian package `time`), whose fork of a
    ~1 MiB process gives a clean ru_maxrss (`%M`, from wait4 of its child).
    Without /usr/bin/time we fall back to our own wait4 (inflated RSS).
    """
    def no_core_dumps():
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    use_time = os.access(GNU_TIME, os.X_OK)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as rss_file:
        full = [GNU_TIME, "-o", rss_file.name, "-f", "%M"] + cmd if use_time else cmd
        start = time.perf_counter()
        proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                preexec_fn=no_core_dumps, start_new_session=True)
        timer = threading.Timer(timeout, os.killpg, (proc.pid, 9))
        timer.start()
        _, wait_status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        timed_out = not timer.is_alive()
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(wait_status)
        out.seek(0)
        err.seek(0)
        result = {"wall": wall, "rss_kib": usage.ru_maxrss,
                  "out": out.read().decode(errors="replace"),
                  "err": err.read().decode(errors="replace")}
        signum = -proc.returncode if proc.returncode < 0 else 0
        if use_time:
            report = rss_file.read()
            m = re.search(r"Command terminated by signal (\d+)", report)
            signum = int(m.group(1)) if m else signum
            lines = report.split()
            result["rss_kib"] = int(lines[-1]) if lines and lines[-1].isdigit() else None
    if timed_out:
        result["status"] = "timeout"
    elif signum:
        result["status"] = "crash (signal %d)" % signum
    elif proc.returncode != 0:
        result["status"] = "exit %d" % proc.returncode
    else:
        result["status"] = "ok"
    return result


def parse_run_seconds(run):
    """Seconds of the I/O phase from `bench` output (JSON or human line)."""
    text = run["out"].strip()
    if text.startswith("{"):
        return float(json.loads(text)["seconds"])
    m = re.search(r"Run completed in ([0-9.]+) seconds", text)
    if not m:
        raise ValueError("no 'Run completed' line in: %r" % text[-300:])
    return float(m.group(1))


def file_sizes(path):
    st = os.stat(path)
    return st.st_size, st.st_blocks * 512


def warm(paths):
    """Read files once so every tool starts from a warm page cache."""
    for path in paths:
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass


def cpu_snapshot():
    """(wall, machine busy CPU seconds, CPU seconds of this process + its children)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields[:8]) - fields[3] - fields[4]   # all but idle and iowait
    mine = sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), mine


def other_cpu_cores(before, after):
    """Average number of cores busy with work that was not ours between two snapshots."""
    wall = after[0] - before[0]
    if wall <= 0:
        return None
    return max(0.0, ((after[1] - before[1]) - (after[2] - before[2])) / wall)


def median(values):
    return statistics.median(values) if values else None


# ---------------------------------------------------------------- commands

class Tools:
    """Command lines for each variant; strata-idx uses the indexed copy."""

    def __init__(self, qemu_img, strata):
        self.qemu_img = qemu_img
        self.strata = strata

    def bench(self, variant, image, count, depth, bufsize, step):
        args = ["-f", "qcow2", "-c", str(count), "-d", str(depth),
                "-s", str(bufsize), "-S", str(step)]
        if variant == "qemu":
            return [self.qemu_img, "bench"] + args + [image]
        return [self.strata, "img", "bench"] + args + ["--output", "json", image]

    def convert_null(self, variant, image, size):
        if variant == "qemu":
            # -O raw to /dev/null fails ("Cannot grow device files"); null-co
            # discards writes, so this measures the read side only.
            return [self.qemu_img, "convert", "-n", "-f", "qcow2", image,
                    "--target-image-opts", "driver=null-co,size=%d" % size]
        return [self.strata, "img", "convert", "-f", "qcow2", "-O", "raw", image, "/dev/null"]

    def snapshot(self, variant, image, new):
        if variant == "qemu":
            return [self.qemu_img, "create", "-q", "-f", "qcow2", "-b", image, "-F", "qcow2", new]
        return [self.strata, "img", "snapshot", "-q", image, new]

    def compare(self, variant, image, expected):
        tool = [self.qemu_img] if variant == "qemu" else [self.strata, "img"]
        return tool + ["compare", "-f", "qcow2", "-F", "raw", image, expected]

    def index(self, image):
        return [self.strata, "img", "index", image]


# ---------------------------------------------------------------- measuring

class Measure:
    """Collects samples per (metric, variant); stops a variant after a failure."""

    def __init__(self, timeout, verbose):
        self.timeout = timeout
        self.verbose = verbose
        self.data = {}   # metric -> variant -> {"samples": [...], "status": str}

    def slot(self, metric, variant):
        return self.data.setdefault(metric, {}).setdefault(
            variant, {"samples": [], "status": "ok"})

    def failed(self, metric, variant):
        return self.slot(metric, variant)["status"] != "ok"

    def run(self, metric, variant, cmd, extract=None):
        """Run cmd, store a sample {wall, rss_kib, **extract(run)}; return the run."""
        slot = self.slot(metric, variant)
        if slot["status"] != "ok":
            return None
        run = run_cmd(cmd, self.timeout)
        if self.verbose:
            print("  %-9s %-10s %-18s %7.3f s  %s" % (metric, variant, run["status"], run["wall"],
                                                      " ".join(cmd)), file=sys.stderr)
        if run["status"] != "ok":
            slot["status"] = run["status"]
            slot["stderr"] = run["err"][-1000:]
            return None
        sample = {"wall": run["wall"], "rss_kib": run["rss_kib"]}
        if extract:
            try:
                sample.update(extract(run))
            except (ValueError, KeyError) as e:
                slot["status"] = "bad output"
                slot["stderr"] = str(e)
                return None
        slot["samples"].append(sample)
        return run

    def summarise(self):
        """Add median_<field> for every numeric sample field."""
        for variants in self.data.values():
            for slot in variants.values():
                if slot["samples"]:
                    for key, value in slot["samples"][0].items():
                        if isinstance(value, (int, float)):
                            slot["median_" + key] = median([s[key] for s in slot["samples"]])
        return self.data


def measure_chain(n, top, expected, tools, variants, args, m):
    """All metrics for one chain; returns extra facts (index sizes, counts)."""
    chain_dir = os.path.dirname(top)
    scratch = os.path.join(OUT_DIR, "scratch")
    os.makedirs(scratch, exist_ok=True)
    indexed = os.path.join(chain_dir, "strata-indexed-top.qcow2")  # same dir: relative backing names resolve
    images = {"qemu": top, "strata": top, "strata-idx": indexed}
    facts = {}

    # Random-read count: fixed with --rand-count, else start at clamp(2e6/N, 5000, 200000)
    # and, per variant, scale it up so a run lasts >= RAND_MIN_SECONDS (fast runs are noise).
    start_count = args.rand_count or min(200000, max(5000, 2000000 // n))
    rand_count = {v: start_count for v in variants}
    seq_count = DISK_SIZE // SEQ_BUF
    facts["rand_count"] = rand_count

    def rand_sample(run, count):
        seconds = parse_run_seconds(run)
        sample = {"seconds": seconds, "iops": count / seconds}
        if run["out"].lstrip().startswith("{"):   # strata: how it resolved the chain
            sample["index_mode"] = json.loads(run["out"]).get("index", {}).get("mode")
        return sample

    def run_rand(v, calibrate):
        """One timed run; on the first repeat, redo (up to 3 times) runs that were too short."""
        for attempt in range(4 if calibrate and not args.rand_count else 1):
            count = rand_count[v]
            cmd = tools.bench(v, images[v], count, RAND_DEPTH, BLOCK, RAND_STEP)
            if m.run("rand", v, cmd, lambda r: rand_sample(r, count)) is None:
                return
            seconds = m.slot("rand", v)["samples"][-1]["seconds"]
            if seconds >= RAND_MIN_SECONDS or count >= RAND_MAX_COUNT or attempt == 3:
                return
            m.slot("rand", v)["samples"].pop()   # too short to mean much: scale up, run again
            rand_count[v] = min(RAND_MAX_COUNT,
                                int(count * RAND_TARGET_SECONDS / max(seconds, 1e-3)))

    warm([os.path.join(chain_dir, "layer-%04d.qcow2" % i) for i in range(1, n + 1)])

    # Index build: time `strata img index` on a fresh copy of the top layer each repeat.
    if "strata-idx" in variants:
        for _ in range(args.repeat):
            shutil.copyfile(top, indexed)   # top layers are small, except for N=1
            before = file_sizes(indexed)
            if m.run("index", "strata", tools.index(indexed)) is None:
                break
            after = file_sizes(indexed)
            facts["index_bytes_added"] = {"apparent": after[0] - before[0],
                                          "allocated": after[1] - before[1]}
        if m.failed("index", "strata"):
            variants = [v for v in variants if v != "strata-idx"]

    for rep in range(args.repeat):
        for v in variants:
            m.run("open", v, tools.bench(v, images[v], 1, 1, BLOCK, BLOCK))
        for v in variants:
            run_rand(v, calibrate=(rep == 0))
        for v in variants:
            m.run("seq", v, tools.bench(v, images[v], seq_count, SEQ_DEPTH, SEQ_BUF, SEQ_BUF),
                  lambda r: {"seconds": parse_run_seconds(r),
                             "mb_s": DISK_SIZE / parse_run_seconds(r) / 1e6})
        if not args.no_convert:
            for v in variants:
                m.run("convert", v, tools.convert_null(v, images[v], DISK_SIZE),
                      lambda r: {"mb_s": DISK_SIZE / r["wall"] / 1e6})
        for v in variants:
            new = os.path.join(scratch, "snap-%s.qcow2" % v)
            if os.path.exists(new):
                os.unlink(new)
            m.run("snapshot", v, tools.snapshot(v, os.path.abspath(images[v]), new),
                  lambda r: dict(zip(("apparent", "allocated"), file_sizes(new))))
            if os.path.exists(new):
                os.unlink(new)

    for v in variants:
        m.run("compare", v, tools.compare(v, images[v], expected))
    if "strata-idx" in variants:
        # Does QEMU still read the top layer after Strata stored its index there?
        m.run("compare", "qemu-on-idx", tools.compare("qemu", indexed, expected))
    if os.path.exists(indexed):
        os.unlink(indexed)
    return facts


def measure_big(tools, variants, args, m):
    """Snapshot of a 50 GiB qcow2 with every cluster allocated (metadata preallocation)."""
    big_dir = os.path.join(OUT_DIR, "big")
    os.makedirs(big_dir, exist_ok=True)
    big = os.path.join(big_dir, "big-%s.qcow2" % args.big_size)
    create_cmd = [tools.qemu_img, "create", "-q", "-f", "qcow2",
                  "-o", "cluster_size=64k,preallocation=metadata", big, args.big_size]
    if not os.path.exists(big):
        subprocess.run(create_cmd, check=True)
    indexed = os.path.join(big_dir, "big-indexed.qcow2")
    images = {"qemu": big, "strata": big, "strata-idx": indexed}
    facts = {"create_cmd": " ".join(create_cmd), "base_sizes": file_sizes(big)}
    if "strata-idx" in variants:
        for _ in range(args.repeat):
            subprocess.run(["cp", "--sparse=always", big, indexed], check=True)
            before = file_sizes(indexed)
            if m.run("index", "strata", tools.index(indexed)) is None:
                variants = [v for v in variants if v != "strata-idx"]
                break
            after = file_sizes(indexed)
            facts["index_bytes_added"] = {"apparent": after[0] - before[0],
                                          "allocated": after[1] - before[1]}
    for _ in range(args.repeat):
        for v in variants:
            new = os.path.join(big_dir, "snap-%s.qcow2" % v)
            if os.path.exists(new):
                os.unlink(new)
            m.run("snapshot", v, tools.snapshot(v, images[v], new),
                  lambda r: dict(zip(("apparent", "allocated"), file_sizes(new))))
            if os.path.exists(new):
                os.unlink(new)
    if os.path.exists(indexed):
        os.unlink(indexed)
    return facts


# ---------------------------------------------------------------- reporting

def fmt_num(x, digits=3):
    if x is None:
        return "-"
    if x >= 1000:
        return "{:,.0f}".format(x)
    return "{:.{}g}".format(x, digits)


def cell(data, metric, variant, field, scale=1.0):
    """Formatted median, or the failure status, or '-'."""
    slot = data.get(metric, {}).get(variant)
    if slot is None:
        return "-", None
    if slot["status"] != "ok":
        return slot["status"], None
    value = slot.get("median_" + field)
    if value is None:
        return "-", None
    return fmt_num(value * scale), value * scale


def metric_table(results, metric, field, title, scale=1.0, variants=VARIANTS):
    """One markdown table: rows = chain lengths, columns = variants + ratios vs QEMU."""
    header = ["layers"]
    for v in variants:
        header.append(LABEL[v])
        if v != "qemu":
            header.append("%s / QEMU" % LABEL[v])
    lines = ["#### " + title, "", "| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)]
    for label, data in results:
        row = [label]
        qemu_text, qemu_value = cell(data, metric, "qemu", field, scale)
        for v in variants:
            text, value = (qemu_text, qemu_value) if v == "qemu" else cell(data, metric, v, field, scale)
            row.append(text)
            if v != "qemu":
                row.append("%.2fx" % (value / qemu_value) if value and qemu_value else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def compare_table(results):
    header = ["layers", "QEMU", "Strata", "Strata (indexed)", "QEMU on Strata-indexed top"]
    lines = ["#### Content check against expected.raw (compare exit status)", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, data in results:
        row = [label]
        for v in ("qemu", "strata", "strata-idx", "qemu-on-idx"):
            slot = data.get("compare", {}).get(v)
            row.append("-" if slot is None else ("identical" if slot["status"] == "ok"
                                                 else slot["status"].replace("exit 1", "DIFFERENT")))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def machine_info(tools):
    def first_line(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0]
        except (OSError, IndexError):
            return "?"
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cores": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "qemu": first_line([tools.qemu_img, "--version"]),
            "strata": first_line([tools.strata, "--version"]) if tools.strata else "not run",
            "python": platform.python_version()}


def render(meta, chain_results, big_result, variants):
    out = ["# Strata vs QEMU: qcow2 backing chains (%s)" % meta["started"], ""]
    mi = meta["machine"]
    out += ["Machine: %s cores (%s), %s GiB RAM, Linux %s; %s; %s." % (
        mi["cores"], mi["cpu"], mi["mem_gib"], mi["kernel"], mi["qemu"], mi["strata"]),
        "Disk %d GiB, %d KiB clusters, chains from bench/gen-chain.sh; page cache warm; "
        "medians of %d runs; ratio = Strata / QEMU (for IOPS and MB/s higher is better, "
        "for times and RSS lower is better)." % (DISK_SIZE >> 30, CLUSTER >> 10, meta["repeat"]),
        "Random reads: 4 KiB, QD %d, step %d bytes (%d blocks); requests per run in the table "
        "below." % (RAND_DEPTH, RAND_STEP, RAND_STEP // BLOCK), ""]
    others = ", ".join("N=%s: %.2f" % (n, d["facts"]["other_cpu_cores"]) for n, d in chain_results
                       if d["facts"].get("other_cpu_cores") is not None)
    if others:
        out += ["CPU used by OTHER processes during the measurements, in cores (of %s): %s. "
                "Anything above ~0.1 means the figures were taken on a busy machine." % (
                    mi["cores"], others), ""]
    rows = [(str(n), data) for n, data in chain_results]
    out.append(metric_table(rows, "open", "wall", "Open chain + read one 4 KiB block (ms)", 1000, variants))
    out.append(metric_table(rows, "rand", "iops", "Random 4 KiB reads, QD 16 (IOPS)", 1, variants))
    count_lines = ["Random-read requests per run: " + "; ".join(
        "N=%s: %s" % (n, ", ".join("%s %d" % (LABEL[v], c) for v, c in d["facts"]["rand_count"].items()))
        for n, d in chain_results)]
    modes = ["N=%s %s: %s" % (n, LABEL[v], slot["samples"][0]["index_mode"])
             for n, d in chain_results for v, slot in d.get("rand", {}).items()
             if slot["samples"] and slot["samples"][0].get("index_mode")]
    if modes:
        count_lines.append("Strata chain resolution (bench JSON `index.mode`): " + "; ".join(modes) + ".")
    out.append("\n\n".join(count_lines) + "\n")
    out.append(metric_table(rows, "rand", "rss_kib", "Peak RSS during random reads (MiB)", 1 / 1024, variants))
    out.append(metric_table(rows, "seq", "seconds", "Sequential read of the whole disk, 2 MiB x QD 4 (s)", 1, variants))
    out.append(metric_table(rows, "seq", "mb_s", "Sequential read (MB/s, 10^6 bytes)", 1, variants))
    out.append(metric_table(rows, "seq", "rss_kib", "Peak RSS during sequential read (MiB)", 1 / 1024, variants))
    if any("convert" in d for _, d in rows):
        out.append(metric_table(rows, "convert", "wall", "Whole-disk convert to a null target (s, process wall time)", 1, variants))
    out.append(metric_table(rows, "snapshot", "wall", "External snapshot (ms, process wall time)", 1000, variants))
    out.append(metric_table(rows, "snapshot", "apparent", "Snapshot: new file apparent size (KiB)", 1 / 1024, variants))
    out.append(metric_table(rows, "snapshot", "allocated", "Snapshot: new file allocated size (KiB)", 1 / 1024, variants))
    if "strata-idx" in variants:
        idx_lines = ["#### Strata index build on the top layer (`strata img index`)", "",
                     "| layers | time (ms) | peak RSS (MiB) | bytes added to the top (apparent / allocated) |",
                     "|---|---|---|---|"]
        for n, data in chain_results:
            t, _ = cell(data, "index", "strata", "wall", 1000)
            r, _ = cell(data, "index", "strata", "rss_kib", 1 / 1024)
            added = data.get("facts", {}).get("index_bytes_added", {})
            idx_lines.append("| %s | %s | %s | %s / %s |" % (n, t, r, added.get("apparent", "-"),
                                                           added.get("allocated", "-")))
        out.append("\n".join(idx_lines) + "\n")
    out.append(compare_table(rows))
    if big_result:
        data = big_result
        facts = data["facts"]
        big_rows = [("%s prealloc=metadata" % meta["big_size"], data)]
        out.append("### Snapshot of a fully allocated %s disk\n\n`%s` (base file: %d bytes apparent, "
                   "%d allocated)\n" % (meta["big_size"], facts["create_cmd"], *facts["base_sizes"]))
        out.append(metric_table(big_rows, "snapshot", "wall", "Snapshot time (ms)", 1000, variants))
        out.append(metric_table(big_rows, "snapshot", "apparent", "New layer apparent size (KiB)", 1 / 1024, variants))
        out.append(metric_table(big_rows, "snapshot", "allocated", "New layer allocated size (KiB)", 1 / 1024, variants))
        if "index" in data:
            t, _ = cell(data, "index", "strata", "wall", 1000)
            added = facts.get("index_bytes_added", {})
            out.append("Strata index build on the %s disk: %s ms; bytes added to the file: %s "
                       "apparent / %s allocated\n" % (meta["big_size"], t, added.get("apparent", "-"),
                                                       added.get("allocated", "-")))
    notes = []
    for n, data in chain_results + ([("big", big_result)] if big_result else []):
        for metric, vs in data.items():
            if metric == "facts":
                continue
            for v, slot in vs.items():
                if slot["status"] not in ("ok",) and not (metric == "compare" and slot["status"] == "exit 1"):
                    msg = slot.get("stderr", "").strip().splitlines()
                    notes.append("- N=%s %s %s: %s%s" % (n, metric, v, slot["status"],
                                                         (" - " + msg[-1]) if msg else ""))
    if notes:
        out += ["### Failures", ""] + notes + [""]
    return "\n".join(out)


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description="Strata vs QEMU backing-chain benchmark")
    ap.add_argument("--chains", default="1,50,100,500,1000",
                    help="comma-separated chain lengths (default 1,50,100,500,1000)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per timing (median; default 3)")
    ap.add_argument("--strata", default=os.path.join(REPO, "target", "release", "strata"),
                    help="strata binary (default target/release/strata)")
    ap.add_argument("--no-strata", action="store_true", help="QEMU only (baseline)")
    ap.add_argument("--qemu-img", default="qemu-img")
    ap.add_argument("--chains-dir", default=os.path.join(OUT_DIR, "chains"))
    ap.add_argument("--rand-count", type=int, default=0,
                    help="random reads per run (default: clamp(2000000/N, 5000, 200000), "
                         "scaled up per tool so that a run lasts >= 1 s)")
    ap.add_argument("--no-convert", action="store_true", help="skip the convert-to-null timing")
    ap.add_argument("--no-big", action="store_true", help="skip the big-disk snapshot row")
    ap.add_argument("--big-size", default="50G")
    ap.add_argument("--timeout", type=float, default=1800, help="per command, seconds")
    ap.add_argument("-v", "--verbose", action="store_true", help="log every command to stderr")
    ap.add_argument("--quick", action="store_true",
                    help="a short demonstration: chains 1 and 1000, one run each, no 50G row")
    args = ap.parse_args()
    if args.quick:
        args.chains, args.repeat, args.no_big = "1,1000", 1, True

    strata = None
    if not args.no_strata:
        if os.access(args.strata, os.X_OK):
            strata = os.path.abspath(args.strata)
        else:
            print("img_bench: %s not found, running QEMU only" % args.strata, file=sys.stderr)
    variants = list(VARIANTS) if strata else ["qemu"]
    tools = Tools(args.qemu_img, strata)
    os.makedirs(OUT_DIR, exist_ok=True)

    started = datetime.datetime.now()
    stamp = started.strftime("%Y%m%d-%H%M%S")
    meta = {"started": started.isoformat(timespec="seconds"), "repeat": args.repeat,
            "machine": machine_info(tools), "disk_size": DISK_SIZE, "cluster_size": CLUSTER,
            "rand_step": RAND_STEP, "rand_depth": RAND_DEPTH, "seq_bufsize": SEQ_BUF,
            "seq_depth": SEQ_DEPTH, "big_size": args.big_size, "variants": variants,
            "argv": sys.argv[1:]}

    chain_results = []
    for n in [int(x) for x in args.chains.split(",") if x.strip()]:
        chain_dir = os.path.join(args.chains_dir, "n%04d" % n)
        t0 = time.monotonic()
        gen = subprocess.run([os.path.join(BENCH_DIR, "gen-chain.sh"), str(n), chain_dir,
                              "--size", str(DISK_SIZE), "--cluster-size", str(CLUSTER)],
                             check=True, capture_output=True, text=True)
        top = gen.stdout.strip().splitlines()[-1]
        print("img_bench: N=%d chain ready in %.1f s (%s)" % (n, time.monotonic() - t0, top),
              file=sys.stderr)
        m = Measure(args.timeout, args.verbose)
        t0 = time.monotonic()
        cpu_before = cpu_snapshot()
        facts = measure_chain(n, top, os.path.join(chain_dir, "expected.raw"), tools, variants, args, m)
        data = m.summarise()
        facts["other_cpu_cores"] = other_cpu_cores(cpu_before, cpu_snapshot())
        data["facts"] = facts
        chain_results.append((n, data))
        print("img_bench: N=%d measured in %.1f s" % (n, time.monotonic() - t0), file=sys.stderr)

    big_result = None
    if not args.no_big:
        m = Measure(args.timeout, args.verbose)
        facts = measure_big(tools, variants, args, m)
        big_result = m.summarise()
        big_result["facts"] = facts

    meta["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    report = render(meta, chain_results, big_result, variants)
    md_path = os.path.join(OUT_DIR, "img-bench-%s.md" % stamp)
    json_path = os.path.join(OUT_DIR, "img-bench-%s.json" % stamp)
    with open(md_path, "w") as f:
        f.write(report)
    with open(json_path, "w") as f:
        json.dump({"meta": meta, "chains": {str(n): d for n, d in chain_results},
                   "big": big_result}, f, indent=1)
    print(report)
    print("img_bench: wrote %s and %s" % (md_path, json_path), file=sys.stderr)


if __name__ == "__main__":
    main()

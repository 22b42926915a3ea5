#!/usr/bin/env python3
"""Object-store benchmark: `strata store` against nginx serving the same
objects as files, in the same run (docs/benchmarks.md, section 5).

Usage:
    python3 bench/store_bench.py [--strata PATH] [--threads 5,25]
        [--sizes 0,2600,306000,2300000] [--replication 1,3] [--quick] [--pin]

For each replication (1: N_m=W_m=N_d=W_d=1; 3: N_m=3 W_m=2 N_d=3 W_d=2) it
starts `strata store up` (3 metadata and 3 storage nodes in one process,
mapped mode on loopback) in a fresh directory, and for every object size
and client count runs `strata store bench` (the load generator): Posts,
then Gets of the same objects (each read several times over when that is
needed for a run of about 6,000 reads; nginx gets the same reads). CPU% is the store process's utime+stime
over the run (100% = one core), and the load generator's CPU is counted
apart (client_cpu_pct: on loopback the kernel charges TCP's work to
whichever side's call runs it, so the last table gives Gets' bytes per
CPU-second for the server alone and with its generator); CPU efficiency
= ops/s x replication / CPU%. nginx (installed from Debian with apt-get when missing) serves the
same objects as files from a temporary root (2 workers, sendfile,
keep-alive) and the same load generator GETs them over HTTP/1.1
keep-alive; wrk (a standard HTTP load generator in C, installed from
Debian when missing) GETs them too, for 2 s per run. Zero-byte Gets also
run with `--engine batched`: the generator drives every client from one
thread and one UDP socket with batched sends and receives, as a generator
on machines of its own costs the servers nothing; the last table sets it
against nginx driven by wrk. MN memory: the RSS growth of a 1-MN, 1-SN store process per
zero-byte object posted past a warm-up batch of 20,000 (80,000 more),
scaled to a million, and the metadata database's bytes per object.

Ceph side by side (`--ceph bluestore|memstore`, default none): after the
Strata runs, bench/ceph_cluster.py brings up a one-host Ceph 16 cluster
(--ceph-osds OSDs, default 1; pool `bench1` of size 1, and `bench3` of size
3 with 3 OSDs) and, for the same sizes, client counts and replications,
runs `rados bench -p POOL SECONDS write -t CLIENTS -b SIZE --no-cleanup`
then `rados bench -p POOL SECONDS seq -t CLIENTS` on the objects just
written, twice (--ceph-seconds each, 3 in quick mode, 10 otherwise): the
first pass (`ceph-read-cold`) reads from the disk, the second
(`ceph-read`, the one set against Strata's Gets, which read objects the
page cache holds) mostly from BlueStore's cache. Zero-byte
objects are `-b 0`: rados bench accepts it and each write creates an
empty object (a RADOS write of no bytes), as a Strata zero-byte Post
creates a key with no body; a zero-byte seq read is a read op on that
object. The runs are timed (rados bench's --max-objects is ignored by
Ceph 16's write bench), so Ceph writes more objects than Strata's fixed
counts; the objects are removed after each run. CPU% is the OSD
processes' utime+stime over the rados bench run (as for Strata's store
process), the monitor and manager apart (`cpu_all_pct`); bytes per
CPU-second = MB/s / CPU share. A memstore cluster is restarted before
every write run (memstore never returns the memory of deleted objects).
The last table gives Strata/Ceph ratios (post against write, get against
seq read). Peak OSD memory (VmHWM) is reported as kind `ceph-memory`.

Every figure is the median of --repeat runs.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# Command prefixes that pin the servers and the load generators to CPUs of
# their own (`--pin`): servers on CPU 0, generators on CPU 1, as if the
# clients ran on machines apart from the servers.
SERVER_CPU = []
CLIENT_CPU = []
ROOT = os.path.dirname(HERE)


def ticks(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total


def children_cpu_seconds():
    """CPU seconds (user + system) of this script's finished children: the
    load generator's, once `subprocess.run` has waited for it."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def start_store(strata, workdir, replication, mns=3, sns=3, d=None):
    d = d or tempfile.mkdtemp(dir=workdir)
    # Every copy before the answer (W = N), as RADOS acknowledges a write
    # once every OSD of its acting set has it: the same durability.
    rep = "1,1,1,1" if replication == 1 else "3,3,3,3"
    p = subprocess.Popen(
        SERVER_CPU + [strata, "store", "up", "--dir", d, "--listen", "127.0.0.1:0",
         "--mn", str(mns), "--sn", str(sns), "--replication", rep],
        stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    addr = line.split()[4]
    # Tenants seal their requests: the load generators (run one cluster at
    # a time) use the admin credential `store up` wrote.
    os.environ["STRATA_CREDENTIAL"] = os.path.join(d, "admin.credential")
    return p, addr


def bench(strata, cluster, workload, threads, ops, size, pids, http=None, passes=1,
          engine="tasks"):
    args = [strata, "store", "bench", "--cluster", cluster, "--workload", workload,
            "--threads", str(threads), "--ops", str(ops), "--size", str(size),
            "--passes", str(passes), "--output", "json", "--engine", engine]
    if http:
        args += ["--http", http]
    hz = os.sysconf("SC_CLK_TCK")
    t0, c0 = ticks(pids), children_cpu_seconds()
    out = subprocess.run(CLIENT_CPU + args, capture_output=True, text=True)
    cpu_ticks = ticks(pids) - t0
    if out.returncode != 0 and not out.stdout:
        sys.exit(f"bench failed: {out.stderr}")
    r = json.loads(out.stdout)
    r["cpu_pct"] = 100.0 * cpu_ticks / hz / r["seconds"]
    # The generator's whole process lifetime (start-up included), against
    # the run's seconds: a slight overstatement, the same for every server.
    r["client_cpu_pct"] = 100.0 * (children_cpu_seconds() - c0) / r["seconds"]
    return r


def ensure_tools():
    """nginx and wrk (the reference server and a standard HTTP load
    generator), from Debian when missing."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if not shutil.which("wrk"):
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, env=env)
    if shutil.which("nginx") or os.path.exists("/usr/sbin/nginx"):
        return
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "nginx-light"],
                   check=False, env=env)
    if not (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")):
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "nginx"],
                       check=True, env=env)


def start_nginx(workdir, root, port):
    conf = os.path.join(workdir, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""
user root;
worker_processes 2;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port};
        root {root};
    }}
}}
""")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    p = subprocess.Popen(SERVER_CPU + [nginx, "-c", conf, "-p", workdir])
    time.sleep(0.5)
    kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
    return p, [p.pid] + [int(k) for k in kids]


def wrk_bench(port, threads, ops, size, pids, workdir, seconds=2):
    """nginx driven by wrk (one thread, `threads` keep-alive connections)
    GETting the same files the generator's HTTP workload reads, in turn."""
    lua = os.path.join(workdir, f"paths-{size}-{threads}.lua")
    with open(lua, "w") as f:
        # Built in init: wrk fills in the Host header only by then.
        f.write("reqs = {}\n"
                "init = function(args)\n"
                f"  for t = 0, {threads - 1} do for i = 0, {ops - 1} do\n"
                f"    reqs[#reqs + 1] = wrk.format('GET', '/bench/{size}/' .. t .. '/' .. i)\n"
                "  end end\n"
                "end\n"
                "n = 0\n"
                "request = function() n = n % #reqs + 1; return reqs[n] end\n")
    hz = os.sysconf("SC_CLK_TCK")
    t0, c0 = ticks(pids), children_cpu_seconds()
    out = subprocess.run(CLIENT_CPU + ["wrk", "-t1", f"-c{threads}", f"-d{seconds}s", "--latency", "-s", lua,
                          f"http://127.0.0.1:{port}/"], capture_output=True, text=True, check=True).stdout
    cpu_ticks = ticks(pids) - t0
    client_cpu = children_cpu_seconds() - c0
    units = {"us": 1e-3, "ms": 1.0, "s": 1e3}

    def ms(text):
        for u in ("us", "ms", "s"):
            if text.endswith(u):
                return float(text[:-len(u)]) * units[u]
        return float(text)

    lat, rate, errors = {}, 0.0, 0
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("50%", "99%"):
            lat[parts[0]] = ms(parts[1])
        elif line.startswith("Requests/sec:"):
            rate = float(parts[1])
        elif line.strip().startswith("Non-2xx"):
            errors += int(parts[-1])
        elif line.strip().startswith("Socket errors:"):
            errors += sum(int(x.strip(",")) for x in parts[3::2])
    return {"ops_per_s": rate, "mb_per_s": rate * size / 1e6, "p50_ms": lat.get("50%", 0.0),
            "p99_ms": lat.get("99%", 0.0), "cpu_pct": 100.0 * cpu_ticks / hz / seconds,
            "client_cpu_pct": 100.0 * client_cpu / seconds, "errors": errors}


def write_files(root, size, threads, ops):
    data = bytes((i * 31 % 251) for i in range(size))
    for t in range(threads):
        d = os.path.join(root, "bench", str(size), str(t))
        os.makedirs(d, exist_ok=True)
        for i in range(ops):
            with open(os.path.join(d, str(i)), "wb") as f:
                f.write(data)


def ops_for(size, threads, quick):
    budget = (60 if quick else 200) * 1000 * 1000  # bytes per run
    per = max(size, 2000) * threads
    total = 300 if quick else 600  # operations per run, all clients
    return max(4, min(total // threads, budget // per))


def read_passes(size, threads, ops, quick):
    """Reads of each object per Get or nginx run: small objects are cheap to
    read and slow to Post, so a run reads them several times to last long
    enough to measure (about 30,000 reads, at most 200 MB; 150,000 of
    zero-byte objects, a run of about 2 s)."""
    target = 6000 if quick else (150000 if size == 0 else 30000)
    by_count = target // (threads * ops)
    by_bytes = (200 * 1000 * 1000) // max(size * threads * ops, 1)
    return max(1, min(250 if size == 0 else 50, by_count, by_bytes))


def rados_bench(conf, pool, mode, seconds, threads, size, run_name, osd_pids, all_pids):
    """One `rados bench` run (mode write or seq) on the OSDs whose CPU
    time is measured; returns the rate, the bandwidth, the mean latency and
    the CPU figures in the fields Strata's rows use."""
    args = ["rados", "-c", conf, "-p", pool, "bench", str(seconds), mode, "-t", str(threads),
            "--run-name", run_name]
    if mode == "write":
        args += ["-b", str(size), "--no-cleanup"]
    hz = os.sysconf("SC_CLK_TCK")
    osd0, all0 = ticks(osd_pids), ticks(all_pids)
    out = subprocess.run(CLIENT_CPU + args, capture_output=True, text=True,
                         timeout=seconds * 4 + 120)
    osd_ticks, all_ticks = ticks(osd_pids) - osd0, ticks(all_pids) - all0
    if out.returncode != 0:
        sys.exit(f"rados bench failed ({' '.join(args)}): {out.stderr[-2000:]}")
    fields = {}
    for line in out.stdout.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    try:
        elapsed = float(fields["Total time run"])
        made = int(fields.get("Total writes made") or fields["Total reads made"])
        latency_ms = float(fields["Average Latency(s)"]) * 1000
    except (KeyError, ValueError):
        sys.exit(f"rados bench printed no totals ({' '.join(args)}):\n{out.stdout[-2000:]}")
    rate = made / max(elapsed, 1e-9)
    cpu_pct = 100.0 * osd_ticks / hz / max(elapsed, 1e-9)
    return {"ops_per_s": rate, "mb_per_s": rate * size / 1e6, "lat_avg_ms": latency_ms,
            "cpu_pct": cpu_pct, "cpu_all_pct": 100.0 * all_ticks / hz / max(elapsed, 1e-9),
            "objects": made, "errors": 0}


def peak_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def ceph_runs(store, osds, media, sizes, threads, reps, repeat, seconds):
    """The same sizes, client counts and replications against RADOS
    (rados bench write, then seq), one cluster for all of them (memstore:
    restarted before every write run). Returns rows like Strata's."""
    from ceph_cluster import CephCluster, CephError

    rows = []
    cluster = CephCluster(osds=osds, store=store, media=media, daemon_prefix=SERVER_CPU)
    started = time.time()
    try:
        cluster.start()
    except (CephError, subprocess.TimeoutExpired) as error:
        sys.exit(f"store_bench: Ceph did not come up: {error}")
    print(json.dumps({"kind": "ceph-up", "store": store, "osds": osds, "media": media,
                      "seconds": round(time.time() - started, 1)}), flush=True)
    peak, peak_sum = 0, 0  # the largest OSD's VmHWM, and all OSDs' together

    def note_peaks():
        peaks = [peak_kib(p) for p in cluster.osd_pids()]
        return max([peak] + peaks), max(peak_sum, sum(peaks))

    try:
        first = True
        for rep in reps:
            if rep == 3 and osds < 3:
                print(json.dumps({"kind": "ceph-skip", "rep": 3,
                                  "why": "replication 3 needs --ceph-osds 3"}), flush=True)
                continue
            pool = cluster.pool(rep)
            for s in sizes:
                for t in threads:
                    runs = {"ceph-write": [], "ceph-read-cold": [], "ceph-read": []}
                    for i in range(repeat):
                        if store == "memstore" and not first:
                            peak, peak_sum = note_peaks()
                            cluster.restart()
                        first = False
                        name = f"r{rep}-s{s}-t{t}-{i}"
                        pids = (cluster.osd_pids(), cluster.all_pids())
                        runs["ceph-write"].append(rados_bench(cluster.conf, pool, "write", seconds,
                                                              t, s, name, *pids))
                        # The first pass reads from the disk; the second from
                        # BlueStore's cache, as Strata's Gets read objects the
                        # page cache holds.
                        for kind in ("ceph-read-cold", "ceph-read"):
                            runs[kind].append(rados_bench(cluster.conf, pool, "seq", seconds, t,
                                                          s, name, *pids))
                        subprocess.run(["rados", "-c", cluster.conf, "-p", pool, "cleanup",
                                        "--run-name", name], capture_output=True, check=True,
                                       timeout=300)
                    for kind, rs in runs.items():
                        med = {k: statistics.median(r[k] for r in rs)
                               for k in ("ops_per_s", "mb_per_s", "lat_avg_ms", "cpu_pct",
                                         "cpu_all_pct", "objects")}
                        med.update(kind=kind, rep=rep, size=s, threads=t, store=store,
                                   p50_ms=None, p99_ms=None, errors=0)
                        factor = rep if kind == "ceph-write" else 1
                        med["eff"] = med["ops_per_s"] * factor / max(med["cpu_pct"], 1e-9)
                        rows.append(med)
                        print(json.dumps(med), flush=True)
        peak, peak_sum = note_peaks()
    finally:
        cluster.stop()
    memory = {"kind": "ceph-memory", "store": store, "osd_peak_mib": round(peak / 1024),
              "osds_peak_sum_mib": round(peak_sum / 1024)}
    print(json.dumps(memory), flush=True)
    return rows, memory


def bytes_per_cpu_second(row):
    return row["mb_per_s"] * 1e6 / max(row["cpu_pct"] / 100.0, 1e-9)


def ratio_rows(rows):
    """Strata/Ceph for each (op, replication, size, clients) both ran:
    Posts against rados writes, Gets against rados seq reads."""
    by = {(r["kind"], r["rep"], r["size"], r["threads"]): r for r in rows}
    out = []
    for (kind, rep, size, threads), ceph in by.items():
        if kind not in ("ceph-write", "ceph-read"):
            continue
        strata = by.get(("post" if kind == "ceph-write" else "get", rep, size, threads))
        if not strata:
            continue
        out.append({"kind": "ratio", "op": "post/write" if kind == "ceph-write" else "get/seq",
                    "rep": rep, "size": size, "threads": threads,
                    "strata_ops_per_s": strata["ops_per_s"], "ceph_ops_per_s": ceph["ops_per_s"],
                    "ops_ratio": strata["ops_per_s"] / max(ceph["ops_per_s"], 1e-9),
                    "strata_cpu_pct": strata["cpu_pct"], "ceph_cpu_pct": ceph["cpu_pct"],
                    "strata_bytes_per_cpu_s": bytes_per_cpu_second(strata),
                    "ceph_bytes_per_cpu_s": bytes_per_cpu_second(ceph),
                    "eff_ratio": strata["eff"] / max(ceph["eff"], 1e-9)})
    return out


def print_ceph_tables(rows, ratios, memory):
    print()
    print(f"Ceph ({memory['store']}; largest OSD peak RSS {memory['osd_peak_mib']} MiB, "
          f"all OSDs {memory['osds_peak_sum_mib']} MiB):")
    print()
    print("| op | repl | size | clients | ops/s | MB/s | mean lat ms | OSD CPU % | all daemons CPU % "
          "| bytes per CPU-s | eff (ops/s x repl / CPU%) | objects |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["kind"].startswith("ceph-"):
            print(f"| {r['kind']} | {r['rep']} | {r['size']} | {r['threads']} | {r['ops_per_s']:.0f} | "
                  f"{r['mb_per_s']:.1f} | {r['lat_avg_ms']:.2f} | {r['cpu_pct']:.0f} | "
                  f"{r['cpu_all_pct']:.0f} | {bytes_per_cpu_second(r) / 1e6:.1f} MB | "
                  f"{r['eff']:.1f} | {r['objects']:.0f} |")
    print()
    print("Strata / Ceph (ratios above 1 favour Strata):")
    print()
    print("| op | repl | size | clients | Strata ops/s | Ceph ops/s | ops/s ratio | Strata CPU % | "
          "Ceph CPU % | Strata bytes/CPU-s | Ceph bytes/CPU-s | eff ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in ratios:
        print(f"| {r['op']} | {r['rep']} | {r['size']} | {r['threads']} | {r['strata_ops_per_s']:.0f} | "
              f"{r['ceph_ops_per_s']:.0f} | {r['ops_ratio']:.2f}x | {r['strata_cpu_pct']:.0f} | "
              f"{r['ceph_cpu_pct']:.0f} | {r['strata_bytes_per_cpu_s'] / 1e6:.1f} MB | "
              f"{r['ceph_bytes_per_cpu_s'] / 1e6:.1f} MB | {r['eff_ratio']:.2f}x |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default=os.path.join(ROOT, "target", "release", "strata"))
    ap.add_argument("--threads", default="5,25")
    ap.add_argument("--sizes", default="0,2600,306000,2300000")
    ap.add_argument("--replication", default="1,3")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--pin", action="store_true",
                    help="servers on CPU 0, load generators on CPU 1 (taskset)")
    ap.add_argument("--ceph", choices=["bluestore", "memstore", "none"], default="none",
                    help="also run the same workload against a one-host Ceph cluster")
    ap.add_argument("--ceph-osds", type=int, default=1,
                    help="OSDs of the Ceph cluster (3 for replication 3)")
    ap.add_argument("--ceph-media", choices=["detected", "ssd"], default="detected",
                    help="ssd forces BlueStore's SSD settings on this rotational-looking disk")
    ap.add_argument("--ceph-seconds", type=int, default=None,
                    help="seconds of each rados bench run (default 3 quick, 10 otherwise)")
    ap.add_argument("--json-out", default=None, help="also write every row to this JSON file")
    a = ap.parse_args()
    if a.pin:
        SERVER_CPU.extend(["taskset", "-c", "0"])
        CLIENT_CPU.extend(["taskset", "-c", "1"])
    threads = [int(x) for x in a.threads.split(",")]
    sizes = [int(x) for x in a.sizes.split(",")]
    reps = [int(x) for x in a.replication.split(",")]
    repeat = 1 if a.quick else a.repeat
    ensure_tools()
    work = tempfile.mkdtemp(prefix="strata-store-bench-")
    rows = []
    try:
        root = os.path.join(work, "www")
        for s in sizes:
            for t in threads:
                write_files(root, s, t, ops_for(s, t, a.quick))
        port = 18080
        ng, ng_pids = start_nginx(work, root, port)
        try:
            for rep in reps:
                store, cluster = start_store(a.strata, work, rep)
                try:
                    for s in sizes:
                        for t in threads:
                            n = ops_for(s, t, a.quick)
                            runs = {"post": [], "get": [], "get-batched": [], "nginx": [],
                                    "nginx-wrk": []}
                            for _ in range(repeat):
                                runs["post"].append(bench(a.strata, cluster, "post", t, n, s, [store.pid]))
                                k = read_passes(s, t, n, a.quick)
                                runs["get"].append(bench(a.strata, cluster, "get", t, n, s, [store.pid],
                                                         passes=k))
                                if s == 0:
                                    runs["get-batched"].append(bench(a.strata, cluster, "get", t, n, s,
                                                                     [store.pid], passes=k,
                                                                     engine="batched"))
                                if rep == reps[0]:
                                    runs["nginx"].append(bench(a.strata, cluster, "http", t, n, s, ng_pids,
                                                               http=f"127.0.0.1:{port}", passes=k))
                                    runs["nginx-wrk"].append(wrk_bench(port, t, n, s, ng_pids, work))
                            for kind, rs in runs.items():
                                if not rs:
                                    continue
                                med = {k: statistics.median(r[k] for r in rs)
                                       for k in ("ops_per_s", "mb_per_s", "p50_ms", "p99_ms", "cpu_pct",
                                                 "client_cpu_pct")}
                                med.update(kind=kind, rep=1 if kind.startswith("nginx") else rep, size=s,
                                           threads=t,
                                           errors=sum(r["errors"] for r in rs))
                                factor = med["rep"] if kind == "post" else 1
                                med["eff"] = med["ops_per_s"] * factor / max(med["cpu_pct"], 1e-9)
                                rows.append(med)
                                print(json.dumps(med), flush=True)
                finally:
                    store.terminate()
                    store.wait()
        finally:
            ng.terminate()
            ng.wait()
        # MN memory per million objects: the RSS slope past a warm-up batch
        # (the first objects also pay for the runtime's fixed costs), and
        # the database's bytes on disk.
        d = tempfile.mkdtemp(dir=work)
        store, cluster = start_store(a.strata, work, 1, mns=1, sns=1, d=d)
        try:
            time.sleep(0.5)
            n_threads, n_ops = 25, (200 if a.quick else 800)
            batches = 2 if a.quick else 5
            per_batch = n_threads * n_ops

            def post_batch(k):
                args = [a.strata, "store", "bench", "--cluster", cluster, "--workload", "post",
                        "--threads", str(n_threads), "--ops", str(n_ops), "--size", "0",
                        "--prefix", f"mem{k}", "--output", "json"]
                subprocess.run(args, capture_output=True, text=True, check=True)

            post_batch(0)
            warm = rss_kib(store.pid)
            for k in range(1, batches):
                post_batch(k)
            after = rss_kib(store.pid)
            objects = per_batch * (batches - 1)
            db = os.path.getsize(os.path.join(d, "mn-0", "meta.redb"))
            mem = {"kind": "memory", "objects": per_batch * batches, "rss_warm_kib": warm,
                   "rss_after_kib": after,
                   "mib_per_million": (after - warm) / 1024 / objects * 1e6,
                   "db_bytes_per_object": db / (per_batch * batches)}
            print(json.dumps(mem), flush=True)
        finally:
            store.terminate()
            store.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ceph_memory, ratios = None, []
    if a.ceph != "none":
        seconds = a.ceph_seconds or (3 if a.quick else 10)
        ceph_rows, ceph_memory = ceph_runs(a.ceph, a.ceph_osds, a.ceph_media, sizes, threads,
                                           reps, repeat, seconds)
        rows.extend(ceph_rows)
        ratios = ratio_rows(rows)
        for r in ratios:
            print(json.dumps(r), flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"rows": rows, "ratios": ratios, "ceph_memory": ceph_memory,
                       "strata_memory": mem}, f, indent=1)
    print()
    print("| op | repl | size | clients | ops/s | MB/s | p50 ms | p99 ms | CPU % | eff (ops/s x repl / CPU%) | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["kind"].startswith("ceph-"):
            continue
        print(f"| {r['kind']} | {r['rep']} | {r['size']} | {r['threads']} | {r['ops_per_s']:.0f} | {r['mb_per_s']:.1f} | "
              f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['cpu_pct']:.0f} | {r['eff']:.1f} | {r['errors']} |")
    print()
    print("Request rate against nginx (repl 1 Gets; each server with each generator):")
    print()
    print("| size | clients | get / nginx (generator's HTTP) | get-batched / nginx-wrk | get-batched / best nginx |")
    print("|---|---|---|---|---|")
    by = {(r["kind"], r["rep"], r["size"], r["threads"]): r["ops_per_s"] for r in rows}
    for s in sizes:
        for t in threads:
            ng = by.get(("nginx", 1, s, t), 0)
            wrk = by.get(("nginx-wrk", 1, s, t), 0)
            get = by.get(("get", 1, s, t), 0)
            batched = by.get(("get-batched", 1, s, t))
            cells = [f"{get / ng:.2f}x" if ng else "-"]
            cells.append(f"{batched / wrk:.2f}x" if batched and wrk else "-")
            cells.append(f"{batched / max(ng, wrk):.2f}x" if batched and max(ng, wrk) else "-")
            print(f"| {s} | {t} | " + " | ".join(cells) + " |")
    print_bytes_per_cpu(rows, sizes, threads)
    if ceph_memory:
        print_ceph_tables(rows, ratios, ceph_memory)


def print_bytes_per_cpu(rows, sizes, threads):
    """Gets against nginx in MB per CPU-second, counting the server alone
    and the server with its load generator. On loopback the kernel runs
    the TCP stack (and, without IRQ time accounting, charges its softirq
    work) in whichever process's call drives it, the sender's or the
    receiver's, so the server's share alone depends on the generator; the
    pair's sum does not."""
    by = {(r["kind"], r["rep"], r["size"], r["threads"]): r for r in rows}
    lines = []
    for s in sizes:
        for t in threads:
            get, ng = by.get(("get", 1, s, t)), by.get(("nginx", 1, s, t))
            if not (get and ng and s > 0):
                continue

            def per(row, with_client):
                cpu = row["cpu_pct"] + (row["client_cpu_pct"] if with_client else 0.0)
                return row["mb_per_s"] / max(cpu / 100.0, 1e-9)

            lines.append(f"| {s} | {t} | {per(get, False):.0f} | {per(ng, False):.0f} | "
                         f"{per(get, False) / per(ng, False):.2f}x | {per(get, True):.0f} | "
                         f"{per(ng, True):.0f} | {per(get, True) / per(ng, True):.2f}x |")
    if not lines:
        return
    print()
    print("Gets against nginx, MB per CPU-second (repl 1, the same generator):")
    print()
    print("| size | clients | Strata, server | nginx, server | ratio | Strata, server + generator "
          "| nginx, server + generator | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""S3 gateway benchmark: Strata's gateway against nginx (GET) and Ceph's
RADOS Gateway (GET and PUT), in one run, and the S3 behaviour of Strata's
gateway compared with RGW's (docs/benchmarks.md, section "S3 gateway").

Usage:
    python3 bench/s3_bench.py [--strata PATH] [--sizes 0,4KiB,1MiB,64MiB]
        [--clients 1,8,32] [--seconds 5] [--repeat 1] [--quick] [--pin]
        [--no-rgw] [--behaviour-only] [--json FILE]

What runs, all on loopback and all at durability one copy:
- Strata: `strata store up` (1 metadata node, 1 storage node, replication
  1,1,1,1) in a fresh directory, its S3 gateway, a tenant `bench` and its
  bucket `bench`;
- nginx (Debian's, installed with apt-get when missing): 2 workers,
  sendfile on, keep-alive, serving `bench/KEY` files that hold the very
  bytes the S3 objects hold;
- Ceph 16 with a RADOS Gateway (bench/ceph_cluster.py --rgw: a monitor, a
  manager, one BlueStore OSD on a sparse file, pools of size 1, radosgw
  with its beast frontend, `debug_rgw` and `debug_ms` 0), a user made with
  `radosgw-admin user create` and a bucket `bench`. Debian's radosgw
  package is installed when missing (a benchmark dependency).

The load generator is `strata bench s3` (Rust, tokio + hyper, one
keep-alive connection per client, requests signed with AWS SigV4 as
aws-cli signs them over HTTP; unsigned GETs for nginx). For each size and
client count it runs GETs against the three servers (after one PUT of
each object, not timed) and PUTs against Strata and RGW, --seconds each,
the servers in turn, --repeat times; every figure is the median. CPU is
the servers' utime+stime from /proc over the run: Strata's `store up`
process (gateway and nodes), nginx's master and workers, and every Ceph
daemon (radosgw, OSD, monitor, manager). MB per CPU-second = bytes moved
/ 10^6 / those CPU-seconds.

The behaviour comparison (bench/s3_behaviour.py) then sends the same few
hundred requests to Strata and RGW and prints every difference in status,
error code and the headers ETag, Content-Length, Content-Range,
Content-Type and x-amz-meta-*.

Logs are bounded (Ceph's through ceph_cluster's BoundedLog, Strata's and
nginx's to files under the run's directory, cut at 4 MiB on exit), and
everything is stopped and removed at the end, on failure or Ctrl-C too.
"""
import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
ROOT = os.path.dirname(HERE)
from ceph_cluster import CephCluster, CephError  # noqa: E402
from store_bench import ticks  # noqa: E402

SERVER_CPU = []
CLIENT_CPU = []
LOG_LIMIT_BYTES = 4 * 1024 * 1024
BUCKET = "bench"
REGION = "us-east-1"


def parse_size(text):
    text = text.strip()
    for suffix, shift in (("KiB", 10), ("MiB", 20), ("GiB", 30), ("K", 10), ("M", 20),
                          ("G", 30)):
        if text.endswith(suffix):
            return int(text[:-len(suffix)]) << shift
    return int(text)


def size_name(size):
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bounded(path):
    """Cuts a log file to LOG_LIMIT_BYTES (its end kept)."""
    try:
        size = os.path.getsize(path)
        if size > LOG_LIMIT_BYTES:
            with open(path, "rb") as f:
                f.seek(size - LOG_LIMIT_BYTES)
                tail = f.read()
            with open(path, "wb") as f:
                f.write(tail)
    except OSError:
        pass


class Server:
    """A server under test: its endpoint, keys (None: unsigned) and the
    pids whose CPU counts."""

    def __init__(self, name, endpoint, keys, pids):
        self.name, self.endpoint, self.keys, self.pids = name, endpoint, keys, pids


class Strata:
    def __init__(self, strata, workdir):
        self.strata = strata
        self.dir = os.path.join(workdir, "strata")
        self.log = os.path.join(workdir, "strata.log")
        self.process = None

    def start(self):
        self.process = subprocess.Popen(
            SERVER_CPU + [self.strata, "store", "up", "--dir", self.dir, "--listen",
                          f"127.0.0.1:{free_port()}", "--replication", "1,1,1,1"],
            stdout=subprocess.PIPE, stderr=open(self.log, "wb"), text=True,
            start_new_session=True)
        line = self.process.stdout.readline()
        if "s3 on " not in line:
            raise RuntimeError(f"strata store up did not get ready ({line!r}): read {self.log}")
        self.endpoint = line.split("s3 on ")[1].split()[0].rstrip(",")
        self.keys = self.tenant(BUCKET)
        return Server("strata", self.endpoint, self.keys, [self.process.pid])

    def tenant(self, name):
        out = subprocess.run([self.strata, "store", "tenant", "add", "--dir", self.dir,
                              "--tenant", name, "--output", "json"],
                             capture_output=True, text=True, check=True)
        issued = json.loads(out.stdout)
        return issued["s3_access_key"], issued["s3_secret_key"]

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        bounded(self.log)


class Nginx:
    def __init__(self, workdir):
        self.workdir = os.path.join(workdir, "nginx")
        self.root = os.path.join(self.workdir, "root")
        os.makedirs(os.path.join(self.root, BUCKET))
        self.process = None

    def start(self):
        nginx = ensure_nginx()
        port = free_port()
        conf = os.path.join(self.workdir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""
user root;
worker_processes 2;
daemon off;
pid {self.workdir}/nginx.pid;
error_log {self.workdir}/error.log;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port};
        root {self.root};
    }}
}}
""")
        self.process = subprocess.Popen(SERVER_CPU + [nginx, "-c", conf, "-p", self.workdir],
                                        start_new_session=True)
        wait_listening(port, "nginx", self.process)
        kids = subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True,
                              text=True).stdout.split()
        return Server("nginx", f"http://127.0.0.1:{port}", None,
                      [self.process.pid] + [int(k) for k in kids])

    def copy_from(self, client, prefix, count):
        """Writes the objects `prefix`0.. as files, read through `client`
        (boto3 on Strata), so nginx serves the very same bytes."""
        for index in range(count):
            client.download_file(BUCKET, f"{prefix}{index}",
                                 os.path.join(self.root, BUCKET, f"{prefix}{index}"))

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)
        bounded(os.path.join(self.workdir, "error.log"))


def ensure_nginx():
    for path in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if path and os.path.exists(path):
            return path
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "nginx-light"],
                   check=True, env=env)
    return shutil.which("nginx") or "/usr/sbin/nginx"


def wait_listening(port, name, process, timeout_s=30):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} while starting")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{name} did not listen on port {port} within {timeout_s} s")


def make_bucket(server, bucket=BUCKET):
    import boto3
    from botocore.config import Config
    client = boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=server.keys[0],
                          aws_secret_access_key=server.keys[1], region_name=REGION,
                          config=Config(retries={"max_attempts": 1},
                                        s3={"addressing_style": "path"}))
    client.create_bucket(Bucket=bucket)
    return client


def load(strata, server, op, size, clients, seconds, prefix, objects, prepare=False,
         threads=2):
    """One `strata bench s3` run; its report with the servers' CPU-seconds."""
    args = CLIENT_CPU + [strata, "bench", "s3", "--endpoint", server.endpoint, "--bucket",
                         BUCKET, "--op", op, "--size", str(size), "--clients", str(clients),
                         "--objects", str(objects), "--key-prefix", prefix, "--duration",
                         f"{seconds}s", "--threads", str(threads), "--output", "json"]
    if server.keys:
        args += ["--access-key", server.keys[0], "--secret-key", server.keys[1]]
    else:
        args += ["--unsigned"]
    if prepare:
        args += ["--prepare"]
    hz = os.sysconf("SC_CLK_TCK")
    before = ticks(server.pids)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(args, capture_output=True, text=True)
    cpu_seconds = (ticks(server.pids) - before) / hz
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The load generator's own CPU: on 2 shared cores it competes with
    # the servers, and says which side was CPU-bound.
    client_cpu_seconds = (after.ru_utime + after.ru_stime
                          - children.ru_utime - children.ru_stime)
    if out.returncode not in (0, 3) or not out.stdout:
        raise RuntimeError(f"strata bench s3 against {server.name} failed "
                           f"(exit {out.returncode}): {out.stderr[-2000:]}")
    report = json.loads(out.stdout)
    # Prepared PUTs are not timed but their CPU is in `before`..now: only
    # the timed part's share is wanted, so a prepare run is done apart.
    report["cpu_seconds"] = cpu_seconds
    report["client_cpu_seconds"] = client_cpu_seconds
    report["server"] = server.name
    return report


def median_of(reports):
    """The median of each figure over repeated runs (errors summed)."""
    first = reports[0]
    out = dict(first)
    for field in ("requests_per_second", "megabytes_per_second", "latency_p50_microseconds",
                  "latency_p99_microseconds", "cpu_seconds", "seconds", "mb_per_cpu_second",
                  "requests_per_cpu_second", "client_cpu_seconds"):
        out[field] = statistics.median(r.get(field, 0.0) for r in reports)
    out["errors"] = sum(r["errors"] for r in reports)
    out["error_samples"] = sorted({e for r in reports for e in r["error_samples"]})[:8]
    out["runs"] = len(reports)
    return out


def run_matrix(strata, servers, sizes, clients_list, seconds, repeat, nginx, strata_client,
               json_path=None):
    """Every (op, size, clients) against the servers in turn; medians."""
    results = []
    for size in sizes:
        # Fewer 64 MiB objects: preparing them costs minutes on RGW.
        objects = max(clients_list) if size <= (1 << 20) else min(8, max(clients_list))
        prefix = f"s{size}-"
        # The objects GETs read: PUT once through each S3 server (then a
        # one-second warm-up GET), copied from Strata into nginx's files,
        # before any timed run.
        for server in servers:
            if server.keys:
                load(strata, server, "get", size, min(objects, 8), 1, prefix, objects,
                     prepare=True)
        if any(s.name == "nginx" for s in servers):
            nginx.copy_from(strata_client, prefix, objects)
        for op in ("get", "put"):
            for clients in clients_list:
                runs = {s.name: [] for s in servers if op == "get" or s.keys}
                for _ in range(repeat):
                    for server in servers:
                        if server.name not in runs:
                            continue
                        # PUTs write keys of their own, so GETs always read
                        # complete objects.
                        key_prefix = prefix if op == "get" else f"p{size}-"
                        # A key per client for PUTs: Strata's store takes
                        # one Post of a key at a time (the gateway makes
                        # concurrent Puts of one key wait their turn), so
                        # shared keys would measure the waiting.
                        report = load(strata, server, op, size, clients, seconds, key_prefix,
                                      objects if op == "get" else clients)
                        cpu = report["cpu_seconds"]
                        report["mb_per_cpu_second"] = report["bytes"] / 1e6 / cpu if cpu else 0.0
                        report["requests_per_cpu_second"] = (report["requests"] / cpu
                                                             if cpu else 0.0)
                        runs[server.name].append(report)
                for name, reports in runs.items():
                    row = median_of(reports)
                    row.update(op=op, size=size, clients=clients, server=name)
                    results.append(row)
                    if json_path:
                        # After every row, so a run cut short keeps its figures.
                        with open(json_path, "w") as f:
                            json.dump(results, f, indent=1)
                    print(f"# {op} {size_name(size)} x{clients} {name}: "
                          f"{row['requests_per_second']:.0f} req/s, "
                          f"{row['megabytes_per_second']:.1f} MB/s, "
                          f"{row['mb_per_cpu_second']:.1f} MB/CPU-s, {row['errors']} errors"
                          + (f" ({'; '.join(row['error_samples'])})" if row["errors"] else ""),
                          file=sys.stderr, flush=True)
    return results


def table(results):
    """Markdown tables: one row per (op, size, clients), the servers side
    by side, then the ratios."""
    by = {(r["op"], r["size"], r["clients"], r["server"]): r for r in results}
    keys = sorted({(r["op"], r["size"], r["clients"]) for r in results},
                  key=lambda k: (k[0], k[1], k[2]))
    for r in results:
        # Runs recorded before the field existed: from the medians.
        if "requests_per_cpu_second" not in r:
            r["requests_per_cpu_second"] = (r["requests_per_second"] * r["seconds"]
                                            / r["cpu_seconds"] if r["cpu_seconds"] else 0.0)
    lines = ["| op | size | clients | server | req/s | MB/s | p50 ms | p99 ms | server CPU-s "
             "| req/CPU-s | MB/CPU-s | errors |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for op, size, clients in keys:
        for server in ("strata", "nginx", "rgw"):
            r = by.get((op, size, clients, server))
            if not r:
                continue
            lines.append(f"| {op.upper()} | {size_name(size)} | {clients} | {server} | "
                         f"{r['requests_per_second']:.0f} | {r['megabytes_per_second']:.1f} | "
                         f"{r['latency_p50_microseconds'] / 1000:.2f} | "
                         f"{r['latency_p99_microseconds'] / 1000:.2f} | "
                         f"{r['cpu_seconds']:.2f} | {r['requests_per_cpu_second']:.0f} | "
                         f"{r['mb_per_cpu_second']:.1f} | "
                         f"{r['errors']} |")
    lines += ["", "| op | size | clients | Strata/nginx req/s | Strata/nginx per CPU-s | "
              "Strata/RGW req/s | Strata/RGW per CPU-s |", "|---|---|---|---:|---:|---:|---:|"]

    def ratio(a, b, field):
        if not a or not b or not b[field]:
            return "–"
        return f"{a[field] / b[field]:.2f}"

    for op, size, clients in keys:
        s = by.get((op, size, clients, "strata"))
        n = by.get((op, size, clients, "nginx"))
        g = by.get((op, size, clients, "rgw"))
        # Requests per CPU-second and bytes per CPU-second give the same
        # ratio when both sides move the same objects.
        per_cpu = "requests_per_cpu_second"
        lines.append(f"| {op.upper()} | {size_name(size)} | {clients} | "
                     f"{ratio(s, n, 'requests_per_second')} | {ratio(s, n, per_cpu)} | "
                     f"{ratio(s, g, 'requests_per_second')} | {ratio(s, g, per_cpu)} |")
    return "\n".join(lines)


def interrupt(_signal, _frame):
    raise KeyboardInterrupt()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    ap.add_argument("--strata", default=os.path.join(default_target, "release", "strata"),
                    help="the strata binary (a release build)")
    ap.add_argument("--sizes", default="0,4KiB,1MiB,64MiB")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--seconds", type=int, default=5, help="each timed run")
    ap.add_argument("--repeat", type=int, default=1, help="runs per figure (median)")
    ap.add_argument("--quick", action="store_true", help="clients 1,32 and 2 s runs")
    ap.add_argument("--pin", action="store_true",
                    help="servers on CPU 0, the load generator on CPU 1 (taskset)")
    ap.add_argument("--no-rgw", action="store_true", help="leave Ceph out")
    ap.add_argument("--behaviour-only", action="store_true",
                    help="only the behaviour comparison (Strata and RGW)")
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--table-from", metavar="FILE",
                    help="print the tables of an earlier run's --json file, and run nothing")
    a = ap.parse_args()
    if a.table_from:
        with open(a.table_from) as f:
            print(table(json.load(f)))
        return
    if not os.access(a.strata, os.X_OK):
        sys.exit(f"s3_bench: no strata binary at {a.strata}: build one with "
                 "`cargo build --release -p strata` or give --strata PATH")
    if a.behaviour_only and a.no_rgw:
        sys.exit("s3_bench: --behaviour-only compares with RGW: drop --no-rgw")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    clients = [int(c) for c in ("1,32" if a.quick else a.clients).split(",")]
    if any(c < 1 or c > 1024 for c in clients) or a.seconds < 1 or a.repeat < 1:
        sys.exit("s3_bench: clients 1 to 1024, --seconds and --repeat at least 1")
    seconds = 2 if a.quick else a.seconds
    if a.pin:
        SERVER_CPU.extend(["taskset", "-c", "0"])
        CLIENT_CPU.extend(["taskset", "-c", "1"])
    signal.signal(signal.SIGTERM, interrupt)
    workdir = tempfile.mkdtemp(prefix="strata-s3-bench-")
    strata = Strata(a.strata, workdir)
    nginx = Nginx(workdir)
    ceph = None
    try:
        servers = [strata.start()]
        strata_client = make_bucket(servers[0])
        if not a.behaviour_only:
            servers.append(nginx.start())
        if not a.no_rgw:
            started = time.time()
            ceph = CephCluster(osds=1, store="bluestore", rgw=True, daemon_prefix=SERVER_CPU,
                               directory=os.path.join(workdir, "ceph"))
            ceph.start()
            rgw = Server("rgw", ceph.rgw_endpoint, ceph.rgw_user("bench"), ceph.all_pids())
            make_bucket(rgw)
            servers.append(rgw)
            print(f"# Ceph and RGW up in {time.time() - started:.0f} s", file=sys.stderr,
                  flush=True)
        if not a.behaviour_only:
            results = run_matrix(a.strata, servers, sizes, clients, seconds, a.repeat, nginx,
                                 strata_client, a.json)
            print(table(results), flush=True)
        if not a.no_rgw:
            import s3_behaviour
            # The admin tenant, whose scope admits any bucket, so a
            # missing bucket is NoSuchBucket (a tenant's own key gets
            # AccessDenied outside its one bucket).
            strata_keys = strata.tenant("*")
            rgw_keys = ceph.rgw_user("behave")
            differences, requests = s3_behaviour.compare(
                ("strata", strata.endpoint, strata_keys), ("rgw", ceph.rgw_endpoint, rgw_keys),
                bucket="behave")
            print(f"\nBehaviour: {requests} requests to each of Strata and RGW, "
                  f"{len(differences)} differences")
            for line in differences:
                print(f"- {line}")
    except (CephError, RuntimeError, subprocess.CalledProcessError) as error:
        sys.exit(f"s3_bench: {error}")
    except KeyboardInterrupt:
        print("s3_bench: interrupted; stopping everything", file=sys.stderr)
    finally:
        if ceph:
            ceph.stop()
        nginx.stop()
        strata.stop()
        # The gateway's last warnings say what any error was; the log
        # goes with the directory.
        try:
            with open(strata.log, errors="replace") as f:
                warnings = [line for line in f if " WARN " in line][-10:]
            for line in warnings:
                print(f"# strata: {line.rstrip()[:300]}", file=sys.stderr)
        except OSError:
            pass
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

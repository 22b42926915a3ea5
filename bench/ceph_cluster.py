#!/usr/bin/env python3
"""A one-host Ceph cluster for benchmarks: Debian's ceph 16 packages, every
file under one temporary directory, no systemd, no cephadm.

Usage (CLI):
    python3 bench/ceph_cluster.py up [--osds 1] [--store bluestore|memstore]
        [--dir D] [--osd-size-gib 20] [--memstore-gib 4] [--media detected|ssd]
        [--timeout 120]

`up` prints the ceph.conf path on stdout (one line; the start-up time and
the pools go to stderr) and keeps running until SIGTERM or Ctrl-C; then it
stops every daemon (OSDs, manager, monitor, in that order; SIGTERM, then
SIGKILL after 20 s) and removes the directory (which must be empty or new
at start). Without --dir it makes one under $TMPDIR. Use the
cluster from another shell with `ceph -c CONF -s` or
`rados -c CONF -p bench1 bench 10 write -t 16`.

Usage (module, from other bench scripts):
    from ceph_cluster import CephCluster
    with CephCluster(osds=1, store="bluestore") as ceph:
        subprocess.run(["rados", "-c", ceph.conf, "-p", ceph.pool(1), ...])
        ceph.osd_pids()        # for CPU time, as store_bench's ticks() reads
    # every daemon stopped, the directory removed

What it sets up (named in docs/benchmarks.md when results are quoted):
- a monitor `a` on loopback (msgr2 and msgr1 on two free ports), cephx
  auth with keyrings under the directory, `osd_crush_chooseleaf_type = 0`
  so replicas may share the one host;
- a manager `x`;
- N OSDs: BlueStore on sparse files (`bluestore_block_path`, created by
  mkfs, `--osd-size-gib` each, data, DB and WAL in the one file), or
  memstore (`memstore_device_bytes`, an in-memory ceiling);
- pools `bench1` (size 1, min_size 1: replication 1, to compare with
  Strata at replication 1) and, with 3 or more OSDs, `bench3` (size 3,
  min_size 2), 32 PGs each, the PG autoscaler off.
Logs are bounded: `log_to_file = false`, the daemons' stderr (errors and
the default debug levels) goes through a pipe into `log/NAME.log`, cut at
4 MiB; `log_max_recent = 500`; the cluster log is not written to a file.

Facts to know: memstore's memory grows without bound and is not returned
after deletes (restart between runs); Debian's OSD is built without
tcmalloc, so `osd_memory_target` does not hold (BlueStore OSDs have
reached 1.9 GiB); the OSDs see this VM's disk as rotational
(/sys/block/*/queue/rotational = 1) and use the HDD defaults
(`bluestore_prefer_deferred_size_hdd` = 64 KiB, 5 op shards of 1 thread,
...), unless `--media ssd` forces the SSD ones.

Missing packages are installed with apt-get (ceph-mon ceph-mgr ceph-osd
ceph-common python3-rados, --no-install-recommends) after a simulation
that must not remove any qemu package.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

PACKAGES = ["ceph-mon", "ceph-mgr", "ceph-osd", "ceph-common", "python3-rados"]
BINARIES = ["ceph-mon", "ceph-mgr", "ceph-osd", "ceph", "ceph-authtool", "monmaptool", "rados"]
# With rgw=True (a benchmark dependency, not a test one).
RGW_PACKAGES = ["radosgw"]
RGW_BINARIES = ["radosgw", "radosgw-admin"]
# Each daemon's captured stderr stops growing here (the rest is counted).
LOG_LIMIT_BYTES = 4 * 1024 * 1024
STOP_TIMEOUT_S = 20
PG_COUNT = 32


def ensure_packages(rgw=False):
    """Install Debian's ceph 16 packages when a binary is missing (radosgw
    too with `rgw`); abort if the install would remove a qemu package (the
    project's anchors)."""
    packages = PACKAGES + (RGW_PACKAGES if rgw else [])
    binaries = BINARIES + (RGW_BINARIES if rgw else [])
    missing = [b for b in binaries if not shutil.which(b)] + [
        package for package in packages if "install ok installed" not in subprocess.run(
            ["dpkg-query", "-W", "-f", "${Status}", package], capture_output=True,
            text=True).stdout]
    if not missing:
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    cmd = ["apt-get", "install", "-y", "--no-install-recommends"] + packages
    plan = subprocess.run(cmd[:2] + ["-s"] + cmd[2:], capture_output=True, text=True, env=env)
    removed = [line for line in plan.stdout.splitlines()
               if line.startswith("Remv") and "qemu" in line.lower()]
    if plan.returncode != 0 or removed:
        sys.exit("ceph_cluster: not installing Ceph (missing: " + ", ".join(missing) + "): "
                 + ("`apt-get install -s` would remove qemu packages:\n  " + "\n  ".join(removed)
                    if removed else f"`apt-get install -s` failed:\n{plan.stderr[-2000:]}")
                 + "\nInstall " + " ".join(packages) + " by hand "
                 "without removing qemu, then run again.")
    subprocess.run(cmd + ["-qq"], check=True, env=env)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BoundedLog(threading.Thread):
    """Copies a daemon's output into a file up to LOG_LIMIT_BYTES, then
    counts what it drops, so a chatty daemon cannot fill the disk."""

    def __init__(self, stream, path):
        super().__init__(daemon=True)
        self.stream, self.path = stream, path

    def run(self):
        written, dropped = 0, 0
        with open(self.path, "wb") as out:
            for line in iter(self.stream.readline, b""):
                if written + len(line) <= LOG_LIMIT_BYTES:
                    out.write(line)
                    out.flush()
                    written += len(line)
                else:
                    dropped += len(line)
            if dropped:
                out.write(f"[ceph_cluster: {dropped} more bytes dropped]\n".encode())


class CephError(RuntimeError):
    """A step of bringing the cluster up failed; the message names the log."""


class CephCluster:
    """A one-host Ceph cluster under `directory` (made under $TMPDIR when
    None): start() brings it up and waits for health, stop() stops every
    daemon and removes the directory. Also a context manager."""

    def __init__(self, osds=1, store="bluestore", directory=None, osd_size_gib=20,
                 memstore_gib=4, media="detected", timeout_s=120, daemon_prefix=(), rgw=False):
        if store not in ("bluestore", "memstore"):
            raise ValueError(f"store must be bluestore or memstore, not {store!r}")
        self.osds, self.store, self.media = osds, store, media
        self.osd_size_gib, self.memstore_gib = osd_size_gib, memstore_gib
        self.timeout_s = timeout_s
        # A RADOS Gateway `rgw.x` (beast frontend on a free loopback port)
        # over the cluster's pools; its endpoint once started.
        self.rgw = rgw
        self.rgw_endpoint = None
        # Put before every daemon's command: `taskset -c 0` pins the
        # daemons to the servers' CPU, as the store bench's --pin does.
        self.daemon_prefix = list(daemon_prefix)
        self.directory = os.path.abspath(directory or tempfile.mkdtemp(prefix="strata-ceph-"))
        self.conf = os.path.join(self.directory, "ceph.conf")
        self.daemons = {}  # name ("mon.a", "mgr.x", "osd.0") -> Popen
        # Set once the directory was found empty: stop() never removes a
        # directory that held something else.
        self.owns_files = False

    # ---- life cycle -------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        ensure_packages(self.rgw)
        try:
            os.makedirs(self.directory, exist_ok=True)
            if os.listdir(self.directory):
                raise CephError(f"{self.directory} is not empty: give an empty or new directory")
            self.owns_files = True
            for sub in ("log", "run", "crash", "mon", "mgr", "osd", "rgw"):
                os.makedirs(os.path.join(self.directory, sub))
            self.write_conf()
            self.start_monitor()
            self.start_manager()
            for osd_id in range(self.osds):
                self.start_osd(osd_id)
            self.create_pools()
            self.wait_healthy()
            if self.rgw:
                self.start_rgw()
        except BaseException:
            self.stop()
            raise

    def stop(self):
        """Stops the OSDs, then the manager, then the monitor, and removes
        the directory (only if it was empty or new at start())."""
        order = sorted(self.daemons,
                       key=lambda n: {"rgw": 0, "osd": 1, "mgr": 2, "mon": 3}[n[:3]])
        for name in order:
            process = self.daemons[name]
            if process.poll() is None:
                process.terminate()
        deadline = time.time() + STOP_TIMEOUT_S
        for name in order:
            process = self.daemons[name]
            try:
                process.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.daemons.clear()
        if self.owns_files:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.owns_files = False

    def restart(self):
        """A fresh cluster in the same place (memstore's memory is only
        returned when its OSD exits)."""
        self.stop()
        self.start()

    # ---- what users read ---------------------------------------------
    def pool(self, replication):
        """The pool with `replication` copies (1 always; 3 with 3 OSDs)."""
        if replication == 3 and self.osds < 3:
            raise CephError("a size-3 pool needs --osds 3")
        if replication not in (1, 3):
            raise CephError(f"no pool with replication {replication}: 1 or 3")
        return f"bench{replication}"

    def ec_pool(self, data, parity):
        """An erasure-coded pool of `data` + `parity` chunks, one per OSD
        (crush failure domain osd: they all share the one host), made on
        first use; returns its name."""
        if self.osds < data + parity:
            raise CephError(f"an ec pool of {data}+{parity} needs --osds {data + parity}")
        name = f"benchec{data}{parity}"
        profile = f"k{data}m{parity}"
        self.ceph("osd", "erasure-code-profile", "set", profile, f"k={data}", f"m={parity}",
                  "crush-failure-domain=osd", "--force")
        self.ceph("osd", "pool", "create", name, str(PG_COUNT), str(PG_COUNT), "erasure",
                  profile)
        self.ceph("osd", "pool", "application", "enable", name, "rados")
        self.wait_healthy()
        return name

    def rgw_pid(self):
        """The RADOS Gateway's process id (rgw=True)."""
        return self.daemons["rgw.x"].pid

    def rgw_user(self, uid):
        """Makes RGW user `uid` (`radosgw-admin user create`); returns its
        (access key, secret key)."""
        out = self.run(["radosgw-admin", "-c", self.conf, "user", "create", f"--uid={uid}",
                        f"--display-name={uid}"], f"radosgw-admin user create {uid}",
                       log_name="rgw.x")
        keys = json.loads(out)["keys"][0]
        return keys["access_key"], keys["secret_key"]

    def osd_pids(self):
        return [p.pid for n, p in self.daemons.items() if n.startswith("osd.")]

    def all_pids(self):
        return [p.pid for p in self.daemons.values()]

    def log(self, name):
        return os.path.join(self.directory, "log", f"{name}.log")

    # ---- steps ---------------------------------------------------------
    def write_conf(self):
        d = self.directory
        self.fsid = str(uuid.uuid4())
        self.mon_addr = f"[v2:127.0.0.1:{free_port()},v1:127.0.0.1:{free_port()}]"
        rgw = ""
        if self.rgw:
            self.rgw_port = free_port()
            self.rgw_endpoint = f"http://127.0.0.1:{self.rgw_port}"
            # RGW makes its own six pools at first start, with the default
            # PG count: 8 each keeps the one OSD under mon_max_pg_per_osd.
            # tcp_nodelay: without it beast's answers wait on delayed ACKs
            # (about 40 ms a small GET).
            rgw = f"""osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
[client.rgw.x]
rgw_frontends = beast endpoint=127.0.0.1:{self.rgw_port} tcp_nodelay=1
rgw_data = {d}/rgw
keyring = {d}/rgw/keyring
debug_rgw = 0/0
debug_ms = 0/0
"""
        media = ""
        if self.media == "ssd":
            # The VM's disk says rotational; these force BlueStore's and the
            # OSD's SSD choices (op shards, deferred writes, cache size).
            media = ("bluestore_debug_enforce_settings = ssd\n"
                     "osd_op_num_shards = 8\nosd_op_num_threads_per_shard = 2\n")
        with open(self.conf, "w") as f:
            f.write(f"""[global]
fsid = {self.fsid}
mon_host = {self.mon_addr}
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_ipv6 = false
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
run_dir = {d}/run
admin_socket = {d}/run/$cluster-$name.asok
pid_file = {d}/run/$name.pid
crash_dir = {d}/crash
log_to_file = false
log_to_stderr = true
err_to_stderr = true
log_max_recent = 500
mon_cluster_log_to_file = false
mon_data_avail_warn = 1
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
mon_warn_on_insecure_global_id_reclaim_allowed = false
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
osd_objectstore = {self.store}
bluestore_block_create = true
bluestore_block_size = {self.osd_size_gib << 30}
memstore_device_bytes = {self.memstore_gib << 30}
{media}
[mon]
mon_data = {d}/mon/$id
keyring = {d}/mon/$id/keyring
[mgr]
mgr_data = {d}/mgr/$id
keyring = {d}/mgr/$id/keyring
[osd]
osd_data = {d}/osd/$id
keyring = {d}/osd/$id/keyring
bluestore_block_path = {d}/osd/block-$id
[client]
keyring = {d}/admin.keyring
{rgw}""")

    def run(self, args, what, log_name=None):
        out = subprocess.run(args, capture_output=True, text=True, timeout=self.timeout_s)
        if out.returncode != 0:
            hint = f"; read {self.log(log_name)}" if log_name else ""
            raise CephError(f"{what} failed (exit {out.returncode}): {' '.join(args)}\n"
                            f"{(out.stderr or out.stdout)[-2000:]}{hint}")
        return out.stdout

    def ceph(self, *args):
        return self.run(["ceph", "-c", self.conf, "--connect-timeout", "30"] + list(args),
                        f"ceph {' '.join(args)}", log_name="mon.a")

    def spawn(self, name, args):
        """Runs a daemon in the foreground (-f), in a session of its own, its
        output through a BoundedLog."""
        process = subprocess.Popen(self.daemon_prefix + args + ["-f", "-c", self.conf],
                                   stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        BoundedLog(process.stdout, self.log(name)).start()
        self.daemons[name] = process
        return process

    def start_monitor(self):
        d = self.directory
        mon_keyring = os.path.join(d, "mon.keyring")
        admin = os.path.join(d, "admin.keyring")
        self.run(["ceph-authtool", "--create-keyring", mon_keyring, "--gen-key", "-n", "mon.",
                  "--cap", "mon", "allow *"], "mon keyring")
        self.run(["ceph-authtool", "--create-keyring", admin, "--gen-key", "-n", "client.admin",
                  "--cap", "mon", "allow *", "--cap", "osd", "allow *", "--cap", "mds", "allow *",
                  "--cap", "mgr", "allow *"], "admin keyring")
        self.run(["ceph-authtool", mon_keyring, "--import-keyring", admin], "keyring import")
        monmap = os.path.join(d, "monmap")
        self.run(["monmaptool", "--create", "--addv", "a", self.mon_addr, "--fsid", self.fsid,
                  monmap], "monmap")
        self.run(["ceph-mon", "-c", self.conf, "--mkfs", "-i", "a", "--monmap", monmap,
                  "--keyring", mon_keyring], "ceph-mon --mkfs")
        self.spawn("mon.a", ["ceph-mon", "-i", "a"])
        self.ceph("status")  # waits (connect timeout) for the monitor to answer

    def start_manager(self):
        os.makedirs(os.path.join(self.directory, "mgr", "x"))
        self.ceph("auth", "get-or-create", "mgr.x", "mon", "allow profile mgr", "osd", "allow *",
                  "mds", "allow *", "-o", os.path.join(self.directory, "mgr", "x", "keyring"))
        self.spawn("mgr.x", ["ceph-mgr", "-i", "x"])

    def start_osd(self, osd_id):
        osd_uuid = str(uuid.uuid4())
        given = self.ceph("osd", "new", osd_uuid).strip()
        if given != str(osd_id):
            raise CephError(f"the monitor gave OSD id {given}, expected {osd_id}")
        data = os.path.join(self.directory, "osd", str(osd_id))
        os.makedirs(data)
        name = f"osd.{osd_id}"
        # The key first: mkfs reads the monitor's config with it.
        self.ceph("auth", "get-or-create", name, "osd", "allow *", "mon", "allow profile osd",
                  "mgr", "allow profile osd", "-o", os.path.join(data, "keyring"))
        self.run(["ceph-osd", "-c", self.conf, "-i", str(osd_id), "--mkfs",
                  "--osd-uuid", osd_uuid], f"ceph-osd --mkfs ({name})")
        self.spawn(name, ["ceph-osd", "-i", str(osd_id)])

    def start_rgw(self):
        """Starts `radosgw` as client.rgw.x and waits until its beast
        frontend answers (it makes its pools on the way)."""
        self.ceph("auth", "get-or-create", "client.rgw.x", "mon", "allow rw", "osd", "allow rwx",
                  "mgr", "allow rw", "-o", os.path.join(self.directory, "rgw", "keyring"))
        process = self.spawn("rgw.x", ["radosgw", "-n", "client.rgw.x"])
        deadline = time.time() + self.timeout_s
        while time.time() < deadline:
            if process.poll() is not None:
                raise CephError(f"radosgw exited with {process.returncode} while starting: "
                                f"read {self.log('rgw.x')}")
            try:
                with socket.create_connection(("127.0.0.1", self.rgw_port), timeout=1):
                    return
            except OSError:
                time.sleep(0.5)
        raise CephError(f"radosgw did not listen on {self.rgw_endpoint} within "
                        f"{self.timeout_s} s: read {self.log('rgw.x')}")

    def create_pools(self):
        pools = [(1, 1)] + ([(3, 2)] if self.osds >= 3 else [])
        for size, min_size in pools:
            name = self.pool(size)
            self.ceph("osd", "pool", "create", name, str(PG_COUNT), str(PG_COUNT), "replicated")
            self.ceph("osd", "pool", "set", name, "size", str(size), "--yes-i-really-mean-it")
            self.ceph("osd", "pool", "set", name, "min_size", str(min_size))
            self.ceph("osd", "pool", "application", "enable", name, "rados")

    def wait_healthy(self):
        """Waits until every OSD is up and in and every PG active+clean; on
        timeout, names the daemon whose log to read."""
        deadline = time.time() + self.timeout_s
        last = ""
        while time.time() < deadline:
            for name, process in self.daemons.items():
                if process.poll() is not None:
                    raise CephError(f"{name} exited with {process.returncode} while the cluster "
                                    f"was starting: read {self.log(name)}")
            try:
                status = json.loads(self.ceph("status", "--format", "json"))
            except (CephError, subprocess.TimeoutExpired, ValueError) as error:
                last = str(error)
                time.sleep(1)
                continue
            osdmap = status.get("osdmap", {})
            pgmap = status.get("pgmap", {})
            clean = sum(s["count"] for s in pgmap.get("pgs_by_state", [])
                        if s["state_name"] == "active+clean")
            up, inn = osdmap.get("num_up_osds", 0), osdmap.get("num_in_osds", 0)
            wanted_pgs = PG_COUNT * (2 if self.osds >= 3 else 1)
            last = (f"{up}/{self.osds} OSDs up, {inn} in, {clean}/{wanted_pgs} PGs active+clean, "
                    f"mgr available: {status.get('mgrmap', {}).get('available')}")
            # The manager adds a pool of its own (device_health_metrics).
            if up == inn == self.osds and clean == pgmap.get("num_pgs", 0) >= wanted_pgs:
                return
            time.sleep(1)
        raise CephError(f"the Ceph cluster in {self.directory} was not healthy after "
                        f"{self.timeout_s} s ({last}); read {self.log(self.lagging(last))} "
                        f"and the other logs in {os.path.join(self.directory, 'log')}")

    def lagging(self, last):
        """The daemon to blame from the last status line: an OSD not up,
        else the manager if unavailable (PG states come through it), else
        the first OSD (peering), else the monitor (no status at all)."""
        if not last.startswith(("0/", "1/", "2/", "3/", "4/", "5/", "6/", "7/", "8/", "9/")):
            return "mon.a"
        if int(last.split("/")[0]) < self.osds:
            return f"osd.{int(last.split('/')[0])}"
        if "mgr available: False" in last:
            return "mgr.x"
        return "osd.0"


def interrupt(_signal, _frame):
    """SIGTERM ends `up` like Ctrl-C, so the daemons are stopped and the
    directory removed."""
    raise KeyboardInterrupt()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="bring a cluster up and keep it until SIGTERM/Ctrl-C")
    up.add_argument("--rgw", action="store_true",
                    help="also start a RADOS Gateway (beast on loopback) with a user `bench`")
    up.add_argument("--osds", type=int, default=1)
    up.add_argument("--store", choices=["bluestore", "memstore"], default="bluestore")
    up.add_argument("--dir", default=None, help="an empty or new directory (default: a temporary one)")
    up.add_argument("--osd-size-gib", type=int, default=20, help="each BlueStore sparse file")
    up.add_argument("--memstore-gib", type=int, default=4, help="each memstore OSD's capacity")
    up.add_argument("--media", choices=["detected", "ssd"], default="detected")
    up.add_argument("--timeout", type=int, default=120, help="seconds to wait for health")
    a = parser.parse_args()
    signal.signal(signal.SIGTERM, interrupt)
    cluster = CephCluster(osds=a.osds, store=a.store, directory=a.dir,
                          osd_size_gib=a.osd_size_gib, memstore_gib=a.memstore_gib,
                          media=a.media, timeout_s=a.timeout, rgw=a.rgw)
    started = time.time()
    try:
        cluster.start()
    except (CephError, subprocess.TimeoutExpired) as error:
        sys.exit(f"ceph_cluster: {error}")
    except KeyboardInterrupt:
        return
    try:
        print(cluster.conf, flush=True)
        pools = [cluster.pool(1)] + ([cluster.pool(3)] if a.osds >= 3 else [])
        if a.rgw:
            access, secret = cluster.rgw_user("bench")
            print(f"# RGW on {cluster.rgw_endpoint}, user bench: access key {access}, "
                  f"secret key {secret}", file=sys.stderr, flush=True)
        print(f"# {a.osds} {a.store} OSD(s) up in {time.time() - started:.1f} s; pools: "
              f"{', '.join(pools)}; Ctrl-C or SIGTERM stops it", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()

"""A cgroup v1 memory group for the provider daemon of one `strata bench
run` (bench/cns_*.py --memory-limit): the daemon's page cache then
recycles its own pages within the limit, as in a container, instead of
growing into free guest memory (which, on a VM with free page reporting,
costs the host's first touch of every fresh page).

cgroup v1 because this machine's cgroup v2 has no memory controller."""

import os
import re
import threading
import time

ROOT = "/sys/fs/cgroup/memory"
# The processes moved into the group: Strata's volume daemon and
# qemu-storage-daemon (comm is cut at 15 characters).
DAEMONS = {"strata": "daemon", "qemu-storage-da": ""}
POLL_SECONDS = 0.02


def parse_size(text):
    """Bytes of SIZE (`512M`, `3G`, `1073741824`), or None for `max`
    (a group without a limit, to see what a run grows to)."""
    if text == "max":
        return None
    match = re.fullmatch(r"(\d+)([KMGT]?)(i?B)?", text.strip(), re.IGNORECASE)
    if not match:
        raise SystemExit(f"--memory-limit {text!r}: give a size such as 3G or 512M, or max")
    scale = 1024 ** " KMGT".index((match.group(2) or " ").upper())
    return int(match.group(1)) * scale


def disk_read_bytes():
    """Bytes read from the machine's disks so far (whole disks, as
    /sys/block lists them, but not loop, RAM or NBD devices)."""
    total = 0
    for name in os.listdir("/sys/block"):
        if name.startswith(("loop", "ram", "zram", "nbd")):
            continue
        with open(f"/sys/block/{name}/stat") as f:
            total += int(f.read().split()[2]) * 512
    return total


def children(pid):
    """Pids of the live children of `pid` (from every thread of it)."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            pass
    return found


def is_daemon(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except FileNotFoundError:
        return False
    if comm not in DAEMONS:
        return False
    word = DAEMONS[comm]
    return not word or (len(args) > 1 and args[1].decode(errors="replace") == word)


class MemoryGroup:
    """/sys/fs/cgroup/memory/strata-bench-<pid>, made for one run and
    removed after it (also when the run fails): `adopt(process)` watches
    the run's process and moves each provider daemon it starts into the
    group; `close()` returns the group's figures and removes it."""

    def __init__(self, limit):
        self.path = os.path.join(ROOT, f"strata-bench-{os.getpid()}")
        self.limit = limit
        self.disk_before = 0
        self.adopted = []
        self._stop = threading.Event()
        self._watcher = None

    def open(self):
        if not os.path.isdir(ROOT):
            raise SystemExit(f"--memory-limit needs the cgroup v1 memory controller at {ROOT}")
        if os.path.isdir(self.path):
            self._remove()
        os.mkdir(self.path)
        # No move_charge_at_immigrate (gone from recent kernels): what the
        # daemon allocates before it is moved, within POLL_SECONDS of its
        # start and before any volume exists, stays charged outside.
        if self.limit is not None:
            try:
                self._write("memory.limit_in_bytes", str(self.limit))
            except OSError:
                self._remove()
                raise
        self.disk_before = disk_read_bytes()

    def adopt(self, process):
        """Moves the provider daemons `process` starts into the group, in a thread."""
        def watch():
            while not self._stop.is_set() and process.poll() is None:
                for child in children(process.pid):
                    if child not in self.adopted and is_daemon(child):
                        try:
                            self._write("cgroup.procs", str(child))
                            self.adopted.append(child)
                        except (ProcessLookupError, FileNotFoundError):
                            pass
                time.sleep(POLL_SECONDS)
        self._watcher = threading.Thread(target=watch, daemon=True)
        self._watcher.start()

    def close(self):
        """The group's peak memory, major faults, OOM-limit hits and the
        machine's disk reads during the run; removes the group."""
        self._stop.set()
        if self._watcher:
            self._watcher.join()
        figures = {}
        try:
            stat = dict(line.split() for line in self._read("memory.stat").splitlines())
            figures = {
                "mem_max_mib": round(int(self._read("memory.max_usage_in_bytes")) / 2**20),
                "pgmajfault": int(stat.get("total_pgmajfault", 0)),
                "limit_hits": int(self._read("memory.failcnt")),
                "disk_read_mib": round((disk_read_bytes() - self.disk_before) / 2**20),
                "daemons": len(self.adopted),
            }
        finally:
            self._remove()
        return figures

    def _remove(self):
        # A daemon still in the group (the run was cut short) goes back to
        # the root group, so that the group can go.
        try:
            for pid in self._read("cgroup.procs").split():
                try:
                    with open(os.path.join(ROOT, "cgroup.procs"), "w") as f:
                        f.write(pid)
                except (ProcessLookupError, OSError):
                    pass
        except FileNotFoundError:
            return
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        print(f"warning: could not remove {self.path}", flush=True)

    def _read(self, name):
        with open(os.path.join(self.path, name)) as f:
            return f.read().strip()

    def _write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

"""QEMU's block layer as the anchor for the volume benchmark: a
`qemu-storage-daemon` exporting one qcow2 image over NBD, with external
snapshots taken over QMP while fio writes, the way libvirt takes them.

Each snapshot creates the overlay with `qemu-img create` (same cluster size
and L2 format as the base) outside QEMU, then `blockdev-add` opens it and
`blockdev-snapshot` puts it above the active layer. QEMU drains I/O and
flushes the old active layer inside `blockdev-snapshot`; that call's wall
time is reported as its pause (QEMU reports no pause of its own).
"""

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

QSD = shutil.which("qemu-storage-daemon")
QEMU_IMG = shutil.which("qemu-img")


def available():
    """Whether qemu-storage-daemon and qemu-img are installed."""
    return QSD is not None and QEMU_IMG is not None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def create_image(path, size, cluster_size, extended_l2, backing=None):
    opts = f"cluster_size={cluster_size},extended_l2={extended_l2}"
    cmd = [QEMU_IMG, "create", "-q", "-f", "qcow2", "-o", opts, str(path)]
    if backing:
        cmd[3:3] = ["-b", str(backing), "-F", "qcow2"]
    else:
        cmd.append(str(size))
    subprocess.run(cmd, check=True)


class Qmp:
    """A minimal QMP client: one command at a time, events skipped."""

    def __init__(self, path, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX)
                self.sock.connect(str(path))
                break
            except OSError:
                self.sock.close()
                if time.monotonic() > deadline:
                    raise SystemExit(f"QMP socket {path} did not come up")
                time.sleep(0.05)
        self.reader = self.sock.makefile("r")
        json.loads(self.reader.readline())  # greeting
        self.execute("qmp_capabilities")

    def execute(self, cmd, **arguments):
        msg = {"execute": cmd}
        if arguments:
            msg["arguments"] = arguments
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            reply = json.loads(self.reader.readline())
            if "event" in reply:
                continue
            if "error" in reply:
                raise RuntimeError(f"QMP {cmd}: {reply['error']}")
            return reply["return"]

    def close(self):
        self.reader.close()
        self.sock.close()


class QemuExport:
    """qemu-storage-daemon serving `base` (qcow2) over NBD on loopback."""

    def __init__(self, workdir, size, cluster_size, extended_l2):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cluster_size, self.extended_l2 = cluster_size, extended_l2
        self.base = self.dir / "base.qcow2"
        create_image(self.base, size, cluster_size, extended_l2)
        self.port = free_port()
        qmp_path = self.dir / "qmp.sock"
        self.proc = subprocess.Popen(
            [QSD,
             "--blockdev", f"driver=file,node-name=file0,filename={self.base}",
             "--blockdev", "driver=qcow2,node-name=top0,file=file0",
             "--nbd-server", f"addr.type=inet,addr.host=127.0.0.1,addr.port={self.port}",
             "--export", "type=nbd,id=exp0,node-name=top0,name=vol,writable=on",
             "--chardev", f"socket,path={qmp_path},server=on,wait=off,id=qmp0",
             "--monitor", "chardev=qmp0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.qmp = Qmp(qmp_path)
        self.top = "top0"
        self.layers = 0

    def uri(self):
        return f"nbd://127.0.0.1:{self.port}/vol"

    def snapshot(self):
        """Takes one external snapshot; returns the blockdev-snapshot
        call's wall time in ms (QEMU drains and flushes inside it)."""
        self.layers += 1
        n = self.layers
        path = self.dir / f"layer-{n}.qcow2"
        below = self.base if n == 1 else self.dir / f"layer-{n - 1}.qcow2"
        create_image(path, None, self.cluster_size, self.extended_l2, backing=below)
        self.qmp.execute("blockdev-add", **{
            "driver": "qcow2", "node-name": f"top{n}", "backing": None,
            "file": {"driver": "file", "filename": str(path)}})
        t0 = time.monotonic()
        self.qmp.execute("blockdev-snapshot", node=self.top, overlay=f"top{n}")
        ms = (time.monotonic() - t0) * 1e3
        self.top = f"top{n}"
        return ms

    def stop(self):
        try:
            self.qmp.execute("quit")
        except (OSError, RuntimeError, ValueError):
            pass
        self.qmp.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def snapshot_loop(q, every, stop, pauses):
    """A snapshot every `every` seconds on a fixed clock, as the Strata
    side does."""
    n = 0
    start = time.monotonic()
    while not stop.wait(max(0.0, start + (n + 1) * every - time.monotonic())):
        n += 1
        pauses.append(q.snapshot())


def run(fio, workdir, mode, runtime, cluster_size, extended_l2, rep):
    """One fio run against a fresh QEMU export; `mode` is the Strata
    side's ("none", "none-long", or an interval like "1s"). Returns the
    same row shape, with the mode prefixed by "qemu-"."""
    q = QemuExport(Path(workdir) / f"qemu-{mode}-{rep}", 1 << 30, cluster_size,
                   extended_l2)
    pauses, stop, t = [], threading.Event(), None
    try:
        if not mode.startswith("none"):
            t = threading.Thread(target=snapshot_loop,
                                 args=(q, float(mode[:-1]), stop, pauses))
            t.start()
        r = fio(q.uri(), runtime, workdir)
    finally:
        stop.set()
        if t:
            t.join()
        q.stop()
    r.update(mode=f"qemu-{mode}", rep=rep, snapshots=len(pauses),
             pause_ms_median=sorted(pauses)[len(pauses) // 2] if pauses else 0,
             pause_ms_max=max(pauses) if pauses else 0)
    return r

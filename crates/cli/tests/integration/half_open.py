"""Opens COUNT TCP connections to HOST:PORT and holds them half-open.

Usage: half_open.py HOST PORT COUNT CHILD (CHILD: this process's index).

Each connection sends the start of a request head ("GET ... X-Slow: ")
and nothing more, like a slow-loris client. Used by the starvation test
in volume.rs; one process cannot hold more sockets than its descriptor
limit, so the test starts several of these.

Reports on stdout, one line each:
  opened N              every socket is created and its connect started
  state O C F X         O sockets held, C connected (head sent),
                        F connects failed, X closed by the server
Holds every socket (closed ones included, so the count stays honest)
until stdin reaches its end, then closes them all and exits. The parent
closing stdin, or dying, is the release.
"""

import errno
import os
import resource
import selectors
import socket
import sys
import time

HEAD = b"GET /v1/pool HTTP/1.1\r\nHost: x\r\nX-Slow: "
REPORT_EVERY = 0.25
# Linux's IP_BIND_ADDRESS_NO_PORT: bind() takes the address only, connect()
# picks the port for the whole 4-tuple.
BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)


def source_address(child, index):
    """A loopback source address of its own for each connection (all of
    127/8 is local): tens of thousands of connects from 127.0.0.1 to one
    port make the kernel search its ephemeral ports longer at each one,
    for many seconds in all."""
    return f"127.{1 + child % 250}.{index // 250 % 250}.{1 + index % 250}"


def main():
    host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    child = int(sys.argv[4])
    # The test's own soft limit may be low; the hard one bounds us.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    events = selectors.DefaultSelector()
    events.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")
    held = []
    failed = 0
    for index in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        held.append(s)
        s.setsockopt(socket.IPPROTO_IP, BIND_ADDRESS_NO_PORT, 1)
        s.bind((source_address(child, index), 0))
        code = s.connect_ex((host, port))
        if code in (0, errno.EINPROGRESS):
            events.register(s, selectors.EVENT_WRITE, "connecting")
        else:
            failed += 1
    print(f"opened {len(held)}", flush=True)
    connected = closed = 0
    last_report = 0.0
    while True:
        for key, mask in events.select(timeout=REPORT_EVERY):
            if key.data == "stdin":
                if not os.read(key.fd, 4096):
                    return
                continue
            s = key.fileobj
            if key.data == "connecting":
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                    failed += 1
                    events.unregister(s)
                    continue
                connected += 1
                try:
                    s.send(HEAD)
                except OSError:
                    pass
                events.modify(s, selectors.EVENT_READ, "waiting")
            else:
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    closed += 1
                    events.unregister(s)
        now = time.monotonic()
        if now - last_report >= REPORT_EVERY:
            last_report = now
            print(f"state {len(held)} {connected} {failed} {closed}", flush=True)


if __name__ == "__main__":
    main()

"""What one job's (or no one's) requests cost the coordinator: the figures of docs/security.md.

In one process, on loopback, against the real :class:`KVServer` and the daemon's real
handle; each line is one bound of the resource model (issue 49), printed as JSON:

* ``stalled_frames``: N sessions of one job each announce a 1 MiB frame and send all but its
  last byte; the server's RSS growth (MiB), the bytes it counted, and how long until every
  one was closed;
* ``keys``: 100,000 small keys of one job: bytes counted vs RSS growth;
* ``tick_counters``: the daemon's batched read with one job's ``events`` at 10^6 and 10^15;
* ``restart``: after a coordinator restart, how long a worker's first connection waits
  for the daemon's re-registration (it retries, it is never refused).

Run: ``.venv/bin/python benchmarks/coordinator_limits.py [--frames 300]`` (about 20 s).
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import threading
import time

from malletrain.elastic.coordinator.handle import Coordinator
from malletrain.elastic.coordinator.kvserver import KVServer, ServerLimits
from malletrain.elastic.protocol import wire
from malletrain.elastic.protocol.authclient import AuthClient

MASTER = b"k" * 32


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def stalled_frames(n: int) -> dict[str, float]:
    srv = KVServer(MASTER, limits=ServerLimits(frame_timeout_s=5.0)).start()
    srv.admit("", ["m1"])
    before = rss_mib()
    socks = []
    body = b"\0" * (wire.MAX_VALUE_BYTES - 1)
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", srv.port))
        sess = wire.client_handshake(sock, "m1", wire.job_secret(MASTER, "m1"))
        sess.sock.sendall(struct.pack("!I", wire.MAX_VALUE_BYTES) + body)
        socks.append(sess.sock)
    time.sleep(1.0)
    peak = rss_mib() - before
    counted = srv.usage.bytes
    t0 = time.monotonic()
    for s in socks:
        s.settimeout(10)
        try:
            while s.recv(1 << 16):
                pass
        except OSError:
            pass
    closed_s = time.monotonic() - t0
    srv.close()
    return {"frames": n, "rss_growth_mib": round(peak, 1),
            "counted_mib": round(counted / 2**20, 1), "all_closed_after_s": round(closed_s, 1)}


def keys(n: int = 100_000) -> dict[str, float]:
    srv = KVServer(MASTER).start()
    srv.admit("", ["m1"])
    c = AuthClient("127.0.0.1", srv.port, "m1", wire.job_secret(MASTER, "m1"))
    before = rss_mib()
    for i in range(n):
        c.set(f"mt/m1/k{i}", "1")
    grew = rss_mib() - before
    out = {"keys": n, "counted_mib": round(srv.usage.bytes / 2**20, 1),
           "rss_growth_mib": round(grew, 1)}
    srv.close()
    return out


def tick_counters() -> dict[str, float]:
    coord = Coordinator.start()
    coord.store.set("mt/a/events", str(10**6))
    coord.store.set("mt/b/events", str(10**15))
    t0 = time.monotonic()
    coord.read_jobs(["a", "b"])
    out = {"read_jobs_s": round(time.monotonic() - t0, 3)}
    coord.close()
    return out


def restart() -> dict[str, float]:
    srv = KVServer(MASTER).start()  # restarted: no realm, no jobs
    got: dict[str, float] = {}

    def worker() -> None:
        t0 = time.monotonic()
        AuthClient("127.0.0.1", srv.port, "m1", wire.job_secret(MASTER, "m1", "db"),
                   connect_timeout_s=30)
        got["connected_after_s"] = time.monotonic() - t0

    t = threading.Thread(target=worker)
    t.start()
    time.sleep(2.0)
    t0 = time.monotonic()
    Coordinator.attach(f"127.0.0.1:{srv.port}", MASTER, realm="db", live_jobs=lambda: ["m1"])
    t.join(30)
    srv.close()
    return {"daemon_reattached_after_s": 2.0,
            "worker_connected_after_s": round(got.get("connected_after_s", -1), 2),
            "after_reattach_s": round(time.monotonic() - t0, 2),
            "refusals_retried": srv.counts["auth_failures"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=300)
    a = ap.parse_args()
    for name, fn in (("tick_counters", tick_counters), ("restart", restart),
                     ("stalled_frames", lambda: stalled_frames(a.frames)), ("keys", keys)):
        print(json.dumps({name: fn()}), flush=True)


if __name__ == "__main__":
    main()

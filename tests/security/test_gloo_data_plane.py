"""An outsider against a formed process group's own sockets (issue 15, item 2).

Two gloo ranks form their group through the authenticated coordinator; then ``mt-bob``, a
second Unix account, connects to every TCP port the ranks listen on (any local user sees them
with ``ss -ltn``), three times each, sending random bytes on some connections and holding the
others. The ranks keep all-reducing meanwhile: every result must stay exact and both must exit
cleanly. (What a connection made *during* the rendezvous window can do is not covered here:
docs/security.md lists it as an exposure.)
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from datetime import timedelta

import psutil
import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

PROBE = r"""
import os, socket, sys, time
held = []
for port in map(int, sys.argv[1:]):
    for i in range(3):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i != 1:
            s.sendall(os.urandom(4096))
        held.append(s)
print("connected", len(held), flush=True)
time.sleep(4)
"""


def _rank(rank: int, port: int, secret: bytes, q, run_s: float) -> None:
    import torch
    import torch.distributed as dist

    from malletrain.elastic.protocol.authstore import AuthStore

    store = AuthStore("127.0.0.1", port, "m1", secret)
    dist.init_process_group("gloo", store=dist.PrefixStore("mt/m1/pg/1/", store), rank=rank,
                            world_size=2, timeout=timedelta(seconds=10))
    q.put(("ready", os.getpid()))
    n, error, t0 = 0, None, time.monotonic()
    try:
        while True:
            t = torch.full((1001,), float(rank + 1))
            t[-1] = float(time.monotonic() - t0 > run_s)  # stop together, not on own clocks
            dist.all_reduce(t)
            if not bool((t[:-1] == 3.0).all()):
                error = f"wrong result at all-reduce {n}"
                break
            n += 1
            if t[-1] > 0:
                break
    except Exception as exc:  # reported to the test, which fails on it
        error = f"{type(exc).__name__}: {exc}"
    q.put(("done", n, error))
    dist.destroy_process_group()


def test_junk_on_gloos_ports_does_not_disturb_a_formed_group(dev_cluster):
    from malletrain.elastic.coordinator.handle import Coordinator

    coord = Coordinator.start("127.0.0.1", 0)
    port = int(coord.address.rsplit(":", 1)[1])
    secret = bytes.fromhex(coord.job_secret("m1"))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, secret, q, 8.0)) for r in range(2)]
    try:
        for p in procs:
            p.start()
        pids = [q.get(timeout=120)[1] for _ in procs]
        ports = sorted({c.laddr.port for pid in pids
                        for c in psutil.Process(pid).net_connections("tcp")
                        if c.status == psutil.CONN_LISTEN})
        assert ports, "the ranks listen on no TCP port: nothing was probed"
        res = dev_cluster.run(sys.executable, "-c", PROBE, *map(str, ports), user="mt-bob",
                              timeout_s=60)
        assert f"connected {3 * len(ports)}" in res.stdout
        done = [q.get(timeout=120) for _ in procs]
        for _tag, n, error in done:
            assert error is None, error
            assert n > 100, f"only {n} all-reduces in 8 s"
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        coord.close()

"""Another user of the cluster against a running job's coordinator (issue 15, item 1).

The victim is a real elastic job (gloo workers, the standalone ``malletrain coordinator``
process); the attacker is ``mt-bob``, a separate Unix account of the dev cluster with a job of
its own (so it holds a valid secret, just not the victim's). Before the coordinator was
authenticated, the same user read the victim's keys, wrote ``finished`` (the daemon cancelled
the job) and joined its process group; each of those is tried here and must fail, and the
victim must still finish with exactly the samples it asked for.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from elastic_harness import Cluster, attach, committed_steps, start_coordinator, wait_for

from malletrain.elastic.protocol.authstore import AuthStore

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

ATTACKS = r"""
import json, socket, sys
from datetime import timedelta
import torch.distributed as dist
# the raw client: every request the wire has, admin ones included
from malletrain.elastic.protocol.authclient import AuthClient
host, port, victim, own = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
own_secret = bytes.fromhex(sys.stdin.read().strip())
out = {}
def attempt(name, fn):
    try:
        out[name] = ["ok", repr(fn())[:60]]
    except Exception as exc:
        out[name] = type(exc).__name__
# the attack that worked on the old TCPStore coordinator
attempt("tcpstore_read", lambda: dist.TCPStore(host, port, is_master=False,
        timeout=timedelta(seconds=3)).get(f"mt/{victim}/progress"))
# no secret, a guessed one, its own secret presented for the victim's job or as the daemon
attempt("guessed_secret", lambda: AuthClient(host, port, victim, b"\0" * 32, connect_timeout_s=3))
attempt("own_secret_as_victim",
        lambda: AuthClient(host, port, victim, own_secret, connect_timeout_s=3))
attempt("own_secret_as_daemon",
        lambda: AuthClient(host, port, None, own_secret, connect_timeout_s=3))
# its own job's session, naming the victim's keys
s = AuthClient(host, port, own, own_secret)
s.set(f"mt/{own}/progress", "{}")
attempt("read_progress", lambda: s.get(f"mt/{victim}/progress"))
attempt("probe_key", lambda: s.check([f"mt/{victim}/latest"]))
attempt("write_finished", lambda: s.set(f"mt/{victim}/finished", "{}"))
attempt("write_epoch", lambda: s.compare_set(f"mt/{victim}/cfg/99", "", "{}"))
attempt("join_group", lambda: s.get(f"mt/{victim}/pg/1/0"))
attempt("forget_victim", lambda: s.forget_job(victim))
attempt("read_many_victim", lambda: s.read_many([f"mt/{victim}/progress"]))
attempt("count_keys", lambda: s.num_keys())
# junk on the wire: a huge length, then garbage
for junk in (b"\xff\xff\xff\xff" + b"x" * 64, b"GET / HTTP/1.0\r\n\r\n"):
    with socket.create_connection((host, port), timeout=5) as raw:
        raw.sendall(junk)
        try:
            out.setdefault("junk", []).append(raw.recv(100).decode(errors="replace")[:40])
        except OSError as exc:
            out.setdefault("junk", []).append(type(exc).__name__)
print(json.dumps(out))
"""

FLOOD = r"""
import socket, sys, time
host, port, n, hold_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
socks = []
end = time.monotonic() + hold_s
while time.monotonic() < end:
    socks = [s for s in socks if s.fileno() >= 0]
    while len(socks) < n:  # keep n connections open, each stalled mid-handshake
        s = socket.create_connection((host, port))
        s.sendall(b"\x00\x00\x00\x10{\"v\": 1")
        socks.append(s)
    if len(socks) == n:
        print("holding", flush=True)
    time.sleep(0.2)
    for s in list(socks):
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                s.close()
        except BlockingIOError:
            pass
        except OSError:
            s.close()
"""


def _victim_args(total: int) -> list[str]:
    return ["--total-samples", str(total), "--dataset-size", "512", "--batch", "4",
            "--hidden", "32", "--step-sleep", "0.02"]


def _finishes_exactly(cluster: Cluster, worker, total: int) -> None:
    wait_for(lambda: cluster.coord.is_finished(cluster.job_id), 180, "the victim to finish",
             cluster)
    assert worker.proc.wait(60) == 0
    assert worker.exit_record()["reason"] == "finished"
    steps = committed_steps([worker])
    assert sorted(steps) == list(range(len(steps)))
    assert sum(r["n"] for r in steps.values()) == total


def test_another_user_can_neither_read_nor_change_a_job(dev_cluster, tmp_path):
    proc, address = start_coordinator(tmp_path)
    tmp_path.chmod(0o755)
    cluster = Cluster(tmp_path, job_id="m1", coord=attach(tmp_path, address))
    total = 4800  # the victim must outlast the attacks, however slow the machine
    try:
        w0 = cluster.launch("s0-r0", *_victim_args(total))
        cluster.wait_registered("s0-r0")
        cluster.coord.publish("m1", ["s0-r0"])
        cluster.wait_step(w0, 5)
        host, port = address.rsplit(":", 1)
        res = dev_cluster.run(sys.executable, "-c", ATTACKS, host, port, "m1", "m2",
                              user="mt-bob", timeout_s=120, input=cluster.coord.job_secret("m2"))
        out = json.loads(res.stdout.strip().splitlines()[-1])
        assert out["tcpstore_read"] != "ok" and out["tcpstore_read"][0] != "ok"
        for name in ("guessed_secret", "own_secret_as_victim", "own_secret_as_daemon"):
            assert out[name] == "AuthenticationRefused", (name, out)  # at the handshake
        for name in ("read_progress", "probe_key", "write_finished", "write_epoch",
                     "join_group", "forget_victim", "read_many_victim"):
            assert out[name] == "StoreRefused", (name, out)
        assert out["count_keys"] == ["ok", "1"]  # its own key only: nothing of the victim's
        # closed without a byte of answer (a reset: the junk was left unread)
        assert set(out["junk"]) <= {"", "ConnectionResetError"}, out["junk"]
        assert not cluster.coord.is_finished("m1")
        assert cluster.coord.membership("m1").members == ("s0-r0",)
        _finishes_exactly(cluster, w0, total)
        # and the coordinator serves on: the attacks ended only the attackers' connections
        assert cluster.coord.progress("m1").samples_total == total
    finally:
        cluster.stop()
        proc.terminate()
        proc.wait(10)


def test_a_connection_flood_does_not_keep_a_job_out(dev_cluster, tmp_path):
    """300 connections of mt-bob stalled mid-handshake, held open: the victim's new member
    still connects, joins and trains, and the daemon's calls answer within 2 s."""
    proc, address = start_coordinator(tmp_path)
    cluster = Cluster(tmp_path, job_id="m1", coord=attach(tmp_path, address))
    host, port = address.rsplit(":", 1)
    flood = subprocess.Popen(
        ["setpriv", "--reuid=mt-bob", "--regid=mt-bob", "--init-groups", sys.executable,
         "-c", FLOOD, host, port, "300", "90"],
        env=dev_cluster.env, stdout=subprocess.PIPE, text=True)
    total = 800
    try:
        assert flood.stdout is not None and flood.stdout.readline().strip() == "holding"
        t0 = time.monotonic()
        secret = bytes.fromhex(cluster.coord.job_secret("m1"))
        worker_side = AuthStore(host, int(port), "m1", secret)
        worker_side.set("mt/m1/x", "1")
        assert time.monotonic() - t0 < 2.0
        t0 = time.monotonic()
        assert cluster.coord.membership("m1") is None
        assert time.monotonic() - t0 < 2.0
        w0 = cluster.launch("s0-r0", *_victim_args(total))
        cluster.wait_registered("s0-r0")
        cluster.coord.publish("m1", ["s0-r0"])
        _finishes_exactly(cluster, w0, total)
        assert flood.poll() is None, "the flood ended early: the test proved nothing"
    finally:
        flood.kill()
        flood.wait(10)
        cluster.stop()
        proc.terminate()
        proc.wait(10)

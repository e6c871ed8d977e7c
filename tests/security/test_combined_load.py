"""One user with 8 jobs and every trick at once, against another user's training job (issue
49, item 8: the combined load test).

On the real dev cluster, the real daemon and its coordinator: mt-alice trains a malleable job
(``examples/elastic_train.py``, real torch workers over gloo). mt-bob submits the 8 jobs his
limit allows; each of them that gets a node runs :data:`ATTACK` with its OWN job's secret
(read from the worker's environment, as any job can): counters set out of range, its key
quota filled, progress reports of junk, 1 MiB frames stalled half sent, as many idle
sessions as it can open, handshakes without a secret trickled a byte at a time, directories
named after other jobs planted in the snapshot directory. Beside them, bob holds 40 idle
connections on the daemon's submit socket and submits + aborts in a loop.

Measured throughout, once a second: the daemon's and the coordinator's RSS, alice's
``jobs`` request on the submit socket (as alice, one process, its round trip) and the
daemon's tick duration (its histogram). The victim must finish with exactly its samples, the
RSS stay under the resource model's bound (docs/security.md), every call of alice's and
every tick answer in < 2 s. The figures are printed (``pytest -s``) for the closing note.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from malletrain.devstack import LocalDaemon, as_user
from malletrain.elastic.coordinator.kvspace import ServerLimits

from .helpers import rss_mib

pytestmark = [pytest.mark.slurm, pytest.mark.e2e, pytest.mark.torch]

SAMPLES = 40_000
BOB_JOBS = 8
HOLD_S = 600.0  # bob's attacks hold until the test ends (it cancels them)

#: each of bob's jobs' workers: every trick it can play with its own job's secret, then hold
ATTACK = r"""
import json, os, socket, struct, sys, threading, time
from pathlib import Path
from malletrain.elastic.protocol import wire
from malletrain.elastic.protocol.authclient import AuthClient
from malletrain.elastic.protocol.config import ElasticConfig, parse_address
cfg = ElasticConfig.from_env()
host, port = parse_address(cfg.coordinator)
job, out, hold_s = cfg.job_id, Path(sys.argv[1]), float(sys.argv[2])
started = time.time()
got = {}
def attempt(name, fn):
    try:
        got[name] = ["ok", repr(fn())[:40]]
    except Exception as exc:
        got[name] = type(exc).__name__
s = AuthClient(host, port, job, cfg.secret)
attempt("events_huge", lambda: s.set(f"mt/{job}/events", str(10**15)))
attempt("latest_zero", lambda: s.set(f"mt/{job}/latest", "0"))
attempt("progress_junk", lambda: s.set(f"mt/{job}/progress", "[" * 5000))
attempt("add_overflow", lambda: s.add(f"mt/{job}/events", 2**70))
filled = 0
for i in range(24):  # 1 MB values until the job's 16 MiB quota refuses one
    try:
        s.set(f"mt/{job}/fill/{i}", "x" * 1_000_000)
        filled += 1
    except Exception as exc:
        got["fill_refused"] = type(exc).__name__
        break
got["filled_mb"] = filled
for n in range(1, 40):  # plant other jobs' snapshot directories (the daemon's own are 0700)
    try:
        os.mkdir(Path(os.environ.get("MALLETRAIN_STATE_DIR", "/nonexistent")).parent / f"m{n}")
    except OSError:
        pass
held, refused = [], 0
def session():
    sock = socket.create_connection((host, port), timeout=10)
    return wire.client_handshake(sock, job, cfg.secret).sock
body = b"\0" * (wire.MAX_VALUE_BYTES // 2)
for _ in range(20):  # frames announced at 1 MiB and stalled half sent
    try:
        sk = session()
        sk.sendall(struct.pack("!I", wire.MAX_VALUE_BYTES) + body)
        held.append(sk)
    except Exception:
        refused += 1
for _ in range(600):  # idle sessions: 4 jobs x 620 is more than one user may hold
    try:
        held.append(session())
    except Exception:
        refused += 1
time.sleep(1.0)
for sk in list(held):  # those the server closed after the handshake: over a session cap
    sk.setblocking(False)
    try:
        if sk.recv(1) == b"":
            held.remove(sk)
            refused += 1
    except BlockingIOError:
        pass
    except OSError:
        held.remove(sk)
        refused += 1
got["sessions_held"], got["sessions_refused"] = len(held), refused
def trickle():  # handshakes with no secret, a byte every 2 s, reopened when closed
    socks = []
    end = time.monotonic() + hold_s
    while time.monotonic() < end:
        while len(socks) < 100:
            try:
                socks.append(socket.create_connection((host, port), timeout=5))
            except OSError:
                break
        for sk in list(socks):
            try:
                sk.sendall(b"\x00")
            except OSError:
                socks.remove(sk)
        time.sleep(2.0)
threading.Thread(target=trickle, daemon=True).start()
got["armed_after_s"] = round(time.time() - started, 1)  # and a file per run: a job restarts
(out / f"attack-{job}-{os.getpid()}.json").write_text(json.dumps(got))
time.sleep(hold_s)
"""

#: alice's probe: her `jobs` request on the submit socket once a second, each round trip
PROBE = r"""
import json, sys, time
from pathlib import Path
from malletrain.daemon.submit.channel import call
sock, stop = Path(sys.argv[1]), Path(sys.argv[2])
rtt = []
while not stop.exists():
    t0 = time.monotonic()
    try:
        call(sock, {"op": "jobs"}, timeout_s=10)
        rtt.append(time.monotonic() - t0)
    except Exception as exc:
        rtt.append(repr(exc))
    time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
print(json.dumps(rtt))
"""

#: bob at the submit socket: 40 idle connections held, and submit + abort in a loop
CHANNEL = r"""
import json, socket, sys, time
from pathlib import Path
from malletrain.daemon.submit.channel import call
sock, stop = Path(sys.argv[1]), Path(sys.argv[2])
idle = []
for _ in range(40):
    try:
        c = socket.socket(socket.AF_UNIX)
        c.connect(str(sock))
        idle.append(c)
    except OSError:
        pass
spec = {"script": "/bin/true", "name": "churn", "args": ["a" * 4000] * 100}
got = {"accepted": 0, "refused": 0}
while not stop.exists():
    try:
        job = call(sock, {"op": "submit", "spec": spec})["job_id"]
        call(sock, {"op": "abort", "job_id": job})
        got["accepted"] += 1
    except Exception:
        got["refused"] += 1
    time.sleep(0.2)
print(json.dumps(got))
"""


def _tick_max_s(url: str, last: dict[str, float]) -> float:
    """The mean of the ticks since the last scrape (sum and count of the histogram)."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    total = float(re.search(r"^malletrain_tick_duration_seconds_sum (\S+)", text, re.M)[1])
    count = float(re.search(r"^malletrain_tick_duration_seconds_count (\S+)", text, re.M)[1])
    dt, dn = total - last.get("sum", 0.0), count - last.get("count", 0.0)
    last.update(sum=total, count=count)
    return dt / dn if dn else 0.0


class Sampler(threading.Thread):
    """RSS of the daemon and the coordinator, and the daemon's ticks, once a second."""

    def __init__(self, d: LocalDaemon) -> None:
        super().__init__(daemon=True)
        self.d, self.stop = d, threading.Event()
        self.daemon_mib: list[float] = []
        self.coord_mib: list[float] = []
        self.tick_s: list[float] = []
        m = re.search(r"serving metrics on (http://\S+)", d.log())
        assert m, d.log()[-2000:]
        self.url = m.group(1)

    def run(self) -> None:
        coord_pid = int((self.d.state / "coordinator.pid").read_text())
        last: dict[str, float] = {}
        while not self.stop.wait(1.0):
            assert self.d.proc is not None
            self.daemon_mib.append(rss_mib(self.d.proc.pid))
            self.coord_mib.append(rss_mib(coord_pid))
            self.tick_s.append(_tick_max_s(self.url, last))


def _user_python(d: LocalDaemon, user: str, code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(as_user(user, [sys.executable, "-c", code, *args]), env=d.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_one_users_every_trick_leaves_another_users_job_and_the_daemon_unharmed(
        daemon, clean_cluster):
    d = daemon
    victim = d.submit_example("mt-alice", "victim", "1-4", SAMPLES, launcher="torchrun")
    d.cli("mt-alice", "jobs", "--socket", str(d.socket))
    sampler = Sampler(d)
    sampler.start()
    attack = d.out / "attack.py"
    attack.write_text(ATTACK)
    attack.chmod(0o644)
    bob_jobs = [d.submit("mt-bob", "--parsable", "-N", "1", "-J", f"attack{i}",
                         "-o", str(d.out / f"attack{i}-%j.out"), "-D", str(d.out), str(attack),
                         str(d.out), str(HOLD_S)).stdout.strip() for i in range(BOB_JOBS)]
    stop = d.out / "stop"
    probe = _user_python(d, "mt-alice", PROBE, str(d.socket), str(stop))
    channel = _user_python(d, "mt-bob", CHANNEL, str(d.socket), str(stop))
    deadline = time.monotonic() + 240
    while d.jobs()[victim]["state"] != "completed" and time.monotonic() < deadline:
        time.sleep(1.0)
    stop.touch()
    sampler.stop.set()
    sampler.join(10)
    rtt = json.loads(probe.communicate(timeout=120)[0])
    churn = json.loads(channel.communicate(timeout=120)[0])
    runs = sorted(d.out.glob("attack-m*.json"))
    attacks = [json.loads(p.read_text()) for p in runs]
    rows = d.jobs()
    armed = sorted(p.stat().st_mtime for p in runs)
    finished = (d.out / "victim.json").stat().st_mtime
    figures = {
        "victim": {k: rows[victim][k] for k in ("state", "samples_total", "preemptions")},
        "bob_jobs_attacking": len({p.name.split("-")[1] for p in runs}),
        "bob_attack_runs": len(attacks), "bob_jobs": len(bob_jobs), "attacks": attacks[:1],
        "victim_trained_under_attack_s": round(finished - armed[0], 1) if armed else None,
        "bob_sessions_held": sum(a["sessions_held"] for a in attacks),
        "bob_submissions": churn,
        "alice_jobs_rtt_max_s": max((x for x in rtt if isinstance(x, float)), default=None),
        "alice_jobs_failed": [x for x in rtt if not isinstance(x, float)],
        "tick_mean_max_s": round(max(sampler.tick_s, default=0.0), 3),
        "daemon_rss_max_mib": round(max(sampler.daemon_mib), 1),
        "coordinator_rss_max_mib": round(max(sampler.coord_mib), 1),
    }
    print("combined load:", json.dumps(figures))
    result = d.result("victim")
    assert result is not None and result["samples_total"] == SAMPLES, (figures, d.log()[-3000:])
    assert rows[victim]["state"] == "completed"
    assert armed and armed[0] < finished - 10, ("bob's attacks did not overlap the victim's "
                                                "training", armed, finished, d.log()[-3000:])
    # what the coordinator refused, with the job's own secret: never accepted. A run armed
    # once bob's other jobs hold his whole session quota (2,048 a user) is not let in at
    # all: unreachable, the quota at work (seen in a CI run: 2,044 held, one run shut out).
    tricks = ("events_huge", "latest_zero", "add_overflow", "fill_refused")
    for a in attacks:
        assert {a[t] for t in tricks} <= {"StoreRefused", "CoordinatorUnreachable"}, a
        assert a["filled_mb"] <= 16, a
    assert any(all(a[t] == "StoreRefused" for t in tricks) for a in attacks), attacks
    limits = ServerLimits()
    assert all(a["sessions_held"] <= limits.max_connections_per_job for a in attacks)
    assert not figures["alice_jobs_failed"] and figures["alice_jobs_rtt_max_s"] < 2.0, figures
    assert figures["tick_mean_max_s"] < 2.0, figures
    # the model's bound for one user's 8 jobs: 8 x 16 MiB counted, 2,048 sessions of
    # ~0.1 MiB each (a thread and a socket), the server's own ~30 MiB, twice for slack
    bound_mib = 2 * (8 * limits.max_job_bytes / 2**20 + 0.1 * limits.max_connections_per_user
                     + 30)
    assert figures["coordinator_rss_max_mib"] < bound_mib, figures
    assert figures["daemon_rss_max_mib"] < 300, figures
    assert "Traceback" not in d.log(), d.log()[-3000:]

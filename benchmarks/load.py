"""The daemon under a supercomputer's load: 5,000 nodes, 500 malleable jobs of 50 users.

What runs is the real thing, unchanged: ``malletrain daemon`` as a process (its loop, the
CLI Slurm backend with a subprocess per call, the SQLite store, the metrics registry and
server, the coordinator process it starts, the submit channel). Only Slurm is replayed:
``benchmarks/replay_slurm.py`` answers ``sinfo``/``squeue``/``scontrol``/``sbatch``... in
22.05's shapes at ``--nodes`` nodes (92 % busy with regular jobs of 10 min to 2 h that end,
and pending ones with a backfill plan that start on their planned nodes and preempt
scavenger slots there), after ``--latency-ms`` per call.

1. **Submissions**: ``--clients`` processes start at once, each as one of ``--users`` Unix
   uids (``os.setuid``: 30000+k, no passwd entry needed), and submit ``jobs / clients``
   jobs each the way ``malletrain submit`` does: the ``submit`` request, one ``sbatch`` per
   slot (``--max-nodes`` 2 to 8, one of five model kinds, :data:`KINDS`), the ``attach``
   request. ``submit_ms`` = the two requests' round trips (the daemon's part; sbatch is
   Slurm's).
2. **Workers**: a thread stands in for every slot's worker: it registers the member with
   the job's own secret (read from the slot's script, as the node's worker gets it), rank
   0 writes a progress report every 2 s at its kind's rate, members leave when a
   membership drops them or their slot is preempted or parked. So the daemon reads a live
   coordinator for 500 jobs.
3. **Steady state**: after ``--settle-s``, for ``--minutes``, the benchmark scrapes the
   daemon's tick histogram twice a second (only its count and sum: a whole scrape of 500
   jobs' series would cost the daemon more than what is measured): each tick's duration is
   the growth of
   ``malletrain_tick_duration_seconds_sum`` between scrapes one tick apart; the daemon's
   CPU is read from ``/proc/PID/stat`` (all its threads, the scrapes' answers included),
   and so is the coordinator process's (printed apart: it is not the daemon's loop, but
   it runs on the same login node);
   Slurm calls per tick are counted by the replay (the daemon's own calls: the tick's,
   its actions', the arrival probe's). At the end, the daemon's own p99 time per request
   (``malletrain_request_duration_seconds``, to its histogram's bucket) is printed beside
   the clients' round trips, which also hold the wait for a CPU on a machine the clients
   keep busy.

Last line: ``load nodes=N jobs=J tick_p99_ms=T cpu_fraction=F slurm_calls_per_tick=C
submit_p99_ms=S rss_mb=M``. Targets (issue 18): tick p99 < 100 ms, < 2 % of a core,
<= 3 Slurm calls per tick, submit p99 < 200 ms.

``--submit-notice``: the replay writes the notice of ``slurm/job_submit.lua`` at every
submission (regular or slot) and the daemon reads it (``slurm.submit_notice``), so that the
arrival probe asks only after a submission.

Run (root; ~6 min): ``.venv/bin/python benchmarks/load.py [--submit-notice]``
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_slurm import ReplaySlurm, Shape, serve, write_shims  # benchmarks/ is no package

from malletrain.daemon.jobs.slots import parse_tag, render_slot
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.daemon.submit.channel import call
from malletrain.elastic.protocol.authstore import AuthStore
from malletrain.elastic.protocol.config import parse_address
from malletrain.elastic.protocol.jobstore import JobStore
from malletrain.elastic.protocol.keys import MemberInfo, ProgressReport
from malletrain.errors import RetryableError
from malletrain.slurm.backend import CliBackend

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
EXAMPLE = REPO / "examples" / "elastic_train.py"
FIRST_UID = 30000
#: the kinds of model the jobs train (profiles are pooled per kind), as (samples/s on one
#: node, scaling exponent): rate(n) = base * n ** exponent, from near-linear to flat
KINDS = {"resnet": (120.0, 0.9), "bert": (60.0, 0.75), "gpt": (20.0, 0.95),
         "vit": (200.0, 0.6), "lstm": (300.0, 0.4)}


# ------------------------------------------------------------------------- the daemon
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_daemon(work: Path, port: int, env: dict[str, str], profile: str | None,
                 log_level: str = "INFO", notice: Path | None = None
                 ) -> subprocess.Popen[bytes]:
    state = work / "state"
    state.mkdir(mode=0o755)
    (work / "slurm.conf").write_text("# replayed\n")
    config = work / "malletrain.yaml"
    config.write_text(yaml.safe_dump({
        "slurm": {"scavenger_partition": "scavenger", "partitions": ["batch"],
                  "slurm_conf": str(work / "slurm.conf"), "min_slot_time_s": 60,
                  "max_slot_time_s": 900, "command_timeout_s": 20,
                  "submit_notice": str(notice) if notice else None},
        "allocator": {"policy": "malletrain"},  # the default tick interval (5 s)
        "state": {"database_path": str(state / "state.db"),
                  "snapshot_dir": str(state / "snapshots")},
        "coordinator": {"host": "127.0.0.1", "port": 0},
        "submit": {"socket_path": str(state / "submit.sock")},
        "metrics": {"enabled": True, "address": f"127.0.0.1:{port}"},
        "limits": {"max_jobs_per_user": 16, "max_jobs_total": 1000, "max_nodes_per_job": 64},
        "logging": {"level": log_level, "format": "text"},
    }))
    logf = open(work / "daemon.log", "ab")  # noqa: SIM115 (the child keeps it)
    wrap = ["-m", "cProfile", "-o", profile] if profile else []  # the loop's thread only
    proc = subprocess.Popen([PYTHON, *wrap, "-m", "malletrain.cli", "daemon", "--config",
                             str(config)],
                            env=env, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while not (state / "submit.sock").exists() or not (state / "coordinator.addr").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the daemon did not start:\n{(work / 'daemon.log').read_text()}")
        time.sleep(0.2)
    return proc


# ------------------------------------------------------------------------- submissions
def client(uid: int, n_jobs: int, sock: Path, path_env: str, seed: int,
           start: threading.Event | None, results: mp.Queue) -> None:  # type: ignore[type-arg]
    """One user's ``malletrain submit`` x ``n_jobs``, timed (runs in a forked process)."""
    os.setgid(uid)
    os.setuid(uid)
    os.environ["PATH"] = path_env
    rng = random.Random(seed)
    backend = CliBackend()
    if start is not None:
        start.wait()
    for k in range(n_jobs):
        hi = rng.choice((2, 4, 4, 8))
        kind = rng.choice(sorted(KINDS))
        spec = JobSpec.from_dict({"name": f"load{uid}-{k}", "script": str(EXAMPLE),
                                  "kind": kind, "min_nodes": rng.choice((1, 1, 2)),
                                  "max_nodes": hi})
        t0 = time.perf_counter()
        answer = _retrying(sock, {"op": "submit", "spec": spec.to_dict()})
        submit_s = time.perf_counter() - t0
        job_id = str(answer["job_id"])
        ids = [backend.submit(render_slot(
            spec, job_id, s, coordinator=str(answer["coordinator"]),
            secret=str(answer["job_secret"]), state_dir=str(answer["state_dir"]),
            partition=str(answer["partition"]))) for s in range(spec.max_nodes)]
        t1 = time.perf_counter()
        _retrying(sock, {"op": "attach", "job_id": job_id, "slots": ids})
        results.put((job_id, kind, submit_s, time.perf_counter() - t1))


def _retrying(sock: Path, request: dict[str, object]) -> dict[str, object]:
    for attempt in range(50):
        try:
            return call(sock, request)
        except RetryableError:
            time.sleep(0.05 * (attempt + 1))
    raise SystemExit(f"the daemon kept refusing {request['op']}")


def submit_all(args: argparse.Namespace, sock: Path, path_env: str, workers: Workers
               ) -> list[tuple[float, float]]:
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    start = ctx.Event()
    per = args.jobs // args.clients
    procs = [ctx.Process(target=client, args=(FIRST_UID + k % args.users, per, sock, path_env,
                                              args.seed + k, start, results))
             for k in range(args.clients)]
    for p in procs:
        p.start()
    start.set()
    out = []
    for _ in range(per * args.clients):
        job_id, kind, submit_s, attach_s = results.get(timeout=600)
        workers.kinds[job_id] = kind
        out.append((submit_s, attach_s))
    for p in procs:
        p.join(30)
    return out


# ------------------------------------------------------------------------- workers
class Workers(threading.Thread):
    """Every slot's worker, as the coordinator sees it (registrations, progress, leaves)."""

    def __init__(self, slurm: ReplaySlurm, addr_file: Path) -> None:
        super().__init__(daemon=True, name="workers")
        self.slurm = slurm
        self.addr_file = addr_file
        self.stores: dict[str, JobStore] = {}
        self.registered: dict[int, str] = {}  # slurm job id -> member id
        self.samples: dict[str, float] = {}
        self.reported: dict[str, float] = {}
        self.members: dict[str, tuple[str, ...]] = {}
        self.kinds: dict[str, str] = {}  # job -> its kind (KINDS), as the clients report

    def _store(self, job: str, secret: str) -> JobStore:
        if job not in self.stores:
            host, port = parse_address(self.addr_file.read_text().strip())
            self.stores[job] = JobStore(AuthStore(host, port, job, bytes.fromhex(secret)), job)
        return self.stores[job]

    def run(self) -> None:
        while True:
            time.sleep(1.0)
            with contextlib.suppress(Exception):
                self.cycle()

    def cycle(self) -> None:
        with self.slurm.lock:
            running = [(j.job_id, j.comment, j.secret, j.node_list[0], j.restart_count)
                       for j in self.slurm.jobs.values() if j.partition == "scavenger"
                       and j.state == "RUNNING" and j.secret]
            ended = [(i, self.slurm.jobs[i].state, self.slurm.jobs[i].comment)
                     for i in self.slurm.ended_slots if i in self.slurm.jobs]
            self.slurm.ended_slots.clear()
        for sid, state, comment in ended:
            member = self.registered.pop(sid, None)
            tag = parse_tag(comment)
            if member and tag and tag[0] in self.stores:
                reason = "removed" if state == "COMPLETED" else "sigterm"
                self.stores[tag[0]].depart(member, reason, None, None)  # type: ignore[arg-type]
        for sid, comment, secret, node, restarts in running:
            tag = parse_tag(comment)
            if tag is None or sid in self.registered:
                continue
            member = f"s{tag[1]}-r{restarts}"
            self._store(tag[0], secret).register(MemberInfo(member, node, sid, 1, time.time()))
            self.registered[sid] = member
        now = time.time()
        for job, js in list(self.stores.items()):
            if now - self.reported.get(job, 0.0) >= 2.0:
                self._progress(job, js, now)

    def _progress(self, job: str, js: JobStore, now: float) -> None:
        m = js.current()
        if m is None or not m.members:
            return
        dropped = set(self.members.get(job, ())) - set(m.members)
        self.members[job] = m.members
        if dropped:
            self._leave(job, dropped)
        n = len(m.members)
        base, exponent = KINDS.get(self.kinds.get(job, ""), (100.0, 0.8))
        rate = base * n ** exponent
        last = self.reported.get(job, now)
        self.samples[job] = self.samples.get(job, 0.0) + rate * (now - last)
        self.reported[job] = now
        js.set_progress(ProgressReport(epoch=m.epoch, step=int(self.samples[job] // 64),
                                       samples_total=int(self.samples[job]),
                                       samples_per_s=rate, world_size=n, step_time_s=0.5,
                                       time_s=now, members=m.members))

    def _leave(self, job: str, dropped: set[str]) -> None:
        """Members a membership dropped leave at the step boundary: their slot job ends."""
        with self.slurm.lock:
            for sid, member in list(self.registered.items()):
                rj = self.slurm.jobs.get(sid)
                tag = parse_tag(rj.comment) if rj else None
                if rj and tag and tag[0] == job and member in dropped and rj.state == "RUNNING":
                    self.slurm._end(rj, "COMPLETED")


# ------------------------------------------------------------------------- measuring
def scrape(port: int) -> dict[str, float]:
    # only the tick histogram's count and sum (``name[]``): a whole scrape of 500 jobs'
    # series costs the daemon ~13 ms, which at 2 Hz would be 2.6 % of a core of its own
    query = "&".join(f"name[]=malletrain_tick_duration_seconds_{s}" for s in ("count", "sum"))
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics?{query}", timeout=10).read()
    out = {}
    for line in text.decode().splitlines():
        if line.startswith("malletrain_tick_duration_seconds_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def phases(port: int) -> dict[str, tuple[float, float]]:
    """Each tick phase's (sum of seconds, count) so far (``malletrain_tick_phase_seconds``)."""
    query = "&".join(f"name[]=malletrain_tick_phase_seconds_{s}" for s in ("count", "sum"))
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics?{query}", timeout=10).read()
    out: dict[str, list[float]] = {}
    for line in text.decode().splitlines():
        if line.startswith("malletrain_tick_phase_seconds_") and 'phase="' in line:
            phase = line.split('phase="', 1)[1].split('"', 1)[0]
            k = 0 if line.startswith("malletrain_tick_phase_seconds_sum") else 1
            out.setdefault(phase, [0.0, 0.0])[k] = float(line.rsplit(" ", 1)[1])
    return {p: (v[0], v[1]) for p, v in out.items()}


def daemon_request_p99_s(port: int, op: str) -> float:
    """The daemon's own p99 time for one request kind, as its histogram's bucket bound (the
    clients' round trips add the wait for a CPU on a machine they keep busy)."""
    query = "name[]=malletrain_request_duration_seconds_bucket"
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics?{query}", timeout=10).read()
    buckets = []
    for line in text.decode().splitlines():
        if line.startswith("malletrain_request_duration_seconds_bucket{") and \
                f'op="{op}"' in line:
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(line.rsplit(" ", 1)[1])))
    buckets.sort()
    if not buckets or buckets[-1][1] == 0:
        return 0.0
    total = buckets[-1][1]
    return next(le for le, count in buckets if count >= 0.99 * total)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(pid: int, port: int, slurm: ReplaySlurm, seconds: float, coordinator_pid: int
            ) -> dict[str, object]:
    ticks: list[float] = []
    calls0, acts0, subs0 = dict(slurm.daemon_calls), slurm.daemon_acts, slurm.submissions
    c0, t0 = cpu_s(pid), time.monotonic()
    k0 = cpu_s(coordinator_pid)
    phases0 = phases(port)
    prev = scrape(port)
    first = prev
    while time.monotonic() - t0 < seconds:
        time.sleep(0.5)
        cur = scrape(port)
        n = cur["malletrain_tick_duration_seconds_count"] - prev[
            "malletrain_tick_duration_seconds_count"]
        if n == 1:
            ticks.append(cur["malletrain_tick_duration_seconds_sum"]
                         - prev["malletrain_tick_duration_seconds_sum"])
        prev = cur
    wall = time.monotonic() - t0
    cpu = cpu_s(pid) - c0
    coordinator_cpu = cpu_s(coordinator_pid) - k0
    n_ticks = prev["malletrain_tick_duration_seconds_count"] - first[
        "malletrain_tick_duration_seconds_count"]
    calls = {k: v - calls0.get(k, 0) for k, v in slurm.daemon_calls.items()}
    acting = sum(v for k, v in calls.items() if k.startswith(("scontrol", "scancel"))
                 and k != "scontrol show")
    phase_ms = {p: 1000 * (s - phases0.get(p, (0, 0))[0]) / max(1, n - phases0.get(p, (0, 0))[1])
                for p, (s, n) in phases(port).items()}
    observe = sum(calls.get(k, 0) for k in ("sinfo", "sinfo states", "squeue", "scontrol show"))
    ticks.sort()
    return {"ticks": ticks, "n_ticks": n_ticks, "cpu_fraction": cpu / wall, "wall_s": wall,
            "coordinator_cpu_fraction": coordinator_cpu / wall,
            "calls": calls, "calls_per_tick": sum(calls.values()) / max(1, n_ticks),
            "observe_calls_per_tick": observe / max(1, n_ticks), "phase_ms": phase_ms,
            "probe_calls_per_s": calls.get("squeue pending", 0) / wall,
            "submissions_per_s": (slurm.submissions - subs0) / wall,
            "acts_per_tick": (slurm.daemon_acts - acts0) / max(1, n_ticks),
            "acts_per_call": (slurm.daemon_acts - acts0) / max(1, acting),
            "tick_calls_per_tick": (sum(calls.values()) - calls.get("squeue pending", 0))
            / max(1, n_ticks)}


def p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(0.99 * len(values)))] if values else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--users", type=int, default=50)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--settle-s", type=float, default=60.0)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--log-level", default="INFO", help="the daemon's (DEBUG shows plans)")
    ap.add_argument("--submit-notice", action="store_true",
                    help="the replay writes slurm/job_submit.lua's notice at every "
                         "submission and the daemon reads it (slurm.submit_notice)")
    ap.add_argument("--profile", metavar="FILE",
                    help="run the daemon under cProfile, stats to FILE (slower ticks)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("load.py runs the clients as other uids: run it as root")
    work = Path(tempfile.mkdtemp(prefix="malletrain-load-"))
    work.chmod(0o755)
    notice = work / "submit-notice" if args.submit_notice else None
    slurm = ReplaySlurm(Shape(nodes=args.nodes, latency_s=args.latency_ms / 1000,
                              seed=args.seed), notice=notice)
    serve(slurm, work / "slurm.sock")
    write_shims(work / "bin", work / "slurm.sock")
    path_env = f"{work / 'bin'}:{os.environ['PATH']}"
    port = free_port()
    daemon = start_daemon(work, port, {**os.environ, "PATH": path_env}, args.profile,
                          args.log_level, notice)
    try:
        workers = Workers(slurm, work / "state" / "coordinator.addr")
        workers.start()
        t0 = time.monotonic()
        submitted = submit_all(args, work / "state" / "submit.sock", path_env, workers)
        print(f"submitted {len(submitted)} jobs in {time.monotonic() - t0:.1f} s "
              f"from {args.clients} clients as {args.users} users", flush=True)
        time.sleep(args.settle_s)
        coordinator_pid = int((work / "state" / "coordinator.pid").read_text())
        m = measure(daemon.pid, port, slurm, 60.0 * args.minutes, coordinator_pid)
        ticks = m["ticks"]
        assert isinstance(ticks, list)
        both = [a + b for a, b in submitted]
        running = sum(1 for j in slurm.jobs.values()
                      if j.partition == "scavenger" and j.state == "RUNNING")
        print(f"ticks measured {len(ticks)} of {m['n_ticks']:.0f}: p50 "
              f"{1000 * statistics.median(ticks):.1f} ms, p99 {1000 * p99(ticks):.1f} ms, "
              f"max {1000 * max(ticks):.1f} ms; {running} slots running")
        print(f"daemon calls in {m['wall_s']:.0f} s: {m['calls']}; the snapshot's "
              f"{m['observe_calls_per_tick']:.2f} a tick, with its actions' "
              f"{m['tick_calls_per_tick']:.2f}; the arrival probe's "
              f"{m['probe_calls_per_s']:.2f} a second (submissions: "
              f"{m['submissions_per_s']:.2f} a second); {m['acts_per_tick']:.1f} slot "
              f"actions a tick, {m['acts_per_call']:.1f} per acting call")
        print("tick phases, mean ms: " + ", ".join(
            f"{p} {ms:.1f}" for p, ms in m["phase_ms"].items()))  # type: ignore[attr-defined]
        print(f"submit request p99 {1000 * p99([a for a, _ in submitted]):.1f} ms, attach "
              f"p99 {1000 * p99([b for _, b in submitted]):.1f} ms (round trips); the "
              f"daemon's own p99: submit <= "
              f"{1000 * daemon_request_p99_s(port, 'submit'):.0f} ms, attach <= "
              f"{1000 * daemon_request_p99_s(port, 'attach'):.0f} ms (histogram buckets)")
        print(f"the coordinator process (every worker's registrations and progress): "
              f"cpu_fraction={m['coordinator_cpu_fraction']:.3f}")
        print(f"load nodes={args.nodes} jobs={len(submitted)} tick_p99_ms={1000 * p99(ticks):.1f} "
              f"cpu_fraction={m['cpu_fraction']:.3f} "
              f"slurm_calls_per_tick={m['calls_per_tick']:.2f} "
              f"submit_p99_ms={1000 * p99(both):.1f} rss_mb={rss_mb(daemon.pid):.0f}")
    finally:
        daemon.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            daemon.wait(30)
        pid_file = work / "state" / "coordinator.pid"
        with contextlib.suppress(Exception):
            os.kill(int(pid_file.read_text()), 15)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Soak: hours of churn on the real dev cluster; fails on growth that does not level off.

One daemon on its own 4-node dev cluster runs for ``--minutes`` (default 120) while a churn
loop keeps it busy the way a centre would:

* malleable jobs of two users (``examples/elastic_train.py``, 1-4 nodes, real torch workers
  over gloo) are submitted so that about ``--jobs`` are alive at any time, each with a random
  number of samples (it finishes on its own), and one in ``--cancel-one-in`` is cancelled
  10-90 s after its submission;
* regular jobs of mt-bob (1-4 nodes, 5-40 s) arrive at random (mean gap ``--regular-gap-s``)
  and preempt the slots on their nodes: the malleable jobs shrink, are evicted to zero and
  grow back when the regular jobs end.

Every ``--sample-s`` (default 60) it samples the daemon and its coordinator process (RSS,
open files, threads) and the daemon's SQLite database (main file + WAL). Ended jobs are kept
``--keep-ended`` (default 20) in the database, so that the database reaches its steady size
within the soak. At the end:

* each series is judged on the samples after a warm-up (the first quarter): it "levels off"
  unless the median of its last third exceeds the median of its middle third by more than
  its tolerance (10 % plus a floor: 16 MB of RSS, 16 fds, 4 threads, 512 KiB of database);
* every malleable job must have ended completed (with exactly its samples) or cancelled:
  a failed or lost job fails the soak as well.

Usage (root): ``.venv/bin/python benchmarks/soak.py [--minutes 120] [--seed 0]``. Last line:
``soak minutes=M samples=N jobs=J completed=C cancelled=X failed=F regular=R grew=SERIES``
(``grew=-``: nothing grew); exit status 0 only if nothing grew and no job failed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from malletrain.devstack import (
    LocalCluster,
    LocalDaemon,
    StackError,
    as_user,
    check_python_reachable,
    run,
)

NODES = 4
#: (relative, absolute) tolerance of each series: growth below either is noise.
TOLERANCE: dict[str, tuple[float, float]] = {
    "daemon_rss_mb": (0.10, 16.0), "daemon_fds": (0.10, 16.0), "daemon_threads": (0.10, 4.0),
    "coordinator_rss_mb": (0.10, 16.0), "coordinator_fds": (0.10, 16.0),
    "coordinator_threads": (0.10, 4.0), "database_kib": (0.10, 512.0),
}
ENDED = ("completed", "cancelled", "failed")


@dataclass
class Churn:
    """What the churn loop did and holds: jobs by id with their samples, regular jobs."""

    samples: dict[str, int] = field(default_factory=dict)  # malletrain job id -> its samples
    tags: dict[str, str] = field(default_factory=dict)  # job id -> tag (its result file)
    cancel_at: dict[str, float] = field(default_factory=dict)  # job id -> when (monotonic)
    cancelled: set[str] = field(default_factory=set)
    regular: int = 0
    next_regular_at: float = 0.0


def process_sample(pid: int | None) -> tuple[float, int, int] | None:
    """(RSS in MB, open fds, threads) of ``pid``, or None if it is not there."""
    if pid is None:
        return None
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            return p.memory_info().rss / 1e6, p.num_fds(), p.num_threads()
    except psutil.Error:
        return None


def coordinator_pid(d: LocalDaemon) -> int | None:
    path = d.state / "coordinator.pid"
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def database_kib(d: LocalDaemon) -> float:
    db = d.state / "state.db"
    return sum(p.stat().st_size for p in (db, Path(f"{db}-wal")) if p.exists()) / 1024


def sample(d: LocalDaemon) -> dict[str, float]:
    row: dict[str, float] = {"database_kib": database_kib(d)}
    for name, pid in (("daemon", d.proc.pid if d.proc else None),
                      ("coordinator", coordinator_pid(d))):
        got = process_sample(pid)
        if got is not None:
            row[f"{name}_rss_mb"], row[f"{name}_fds"], row[f"{name}_threads"] = got
    return row


def grew(series: list[float], rel: float, floor: float) -> tuple[bool, str]:
    """Whether ``series`` (after its warm-up) still grows at its end; and a summary."""
    body = series[len(series) // 4:]
    if len(body) < 6:
        return False, f"too few samples ({len(series)})"
    third = len(body) // 3
    middle = statistics.median(body[third:2 * third])
    last = statistics.median(body[2 * third:])
    growth = last - middle
    summary = f"start {series[0]:.1f} middle {middle:.1f} end {last:.1f}"
    return growth > max(rel * abs(middle), floor), summary


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.base = Path(args.dir)
        self.cluster = LocalCluster(self.base / "cluster", args.port, NODES)
        self.env = self.cluster.env
        self.churn = Churn()
        self.rows: list[dict[str, float]] = []
        self.daemon: LocalDaemon | None = None

    def start(self) -> LocalDaemon:
        self.base.mkdir(parents=True, exist_ok=True)
        self.cluster.up(epilog=True)
        check_python_reachable("mt-alice", self.env)
        self.daemon = LocalDaemon(self.base / "daemon", self.env, self.cluster.slurm_conf,
                                  tick_s=1.0, state={"keep_ended_jobs": self.args.keep_ended})
        return self.daemon.start()

    # -- the churn ------------------------------------------------------------------------
    def step(self, d: LocalDaemon, jobs: dict[str, dict[str, object]]) -> None:
        alive = [j for j, row in jobs.items() if row.get("state") not in ENDED]
        if len(alive) < self.args.jobs:
            self.submit(d)
        now = time.monotonic()
        for job in [j for j, at in self.churn.cancel_at.items() if at <= now]:
            del self.churn.cancel_at[job]
            d.cli(None, "cancel", "--socket", str(d.socket), job, check=False)
            self.churn.cancelled.add(job)
        if time.monotonic() >= self.churn.next_regular_at:
            self.submit_regular()
            self.churn.next_regular_at = (time.monotonic()
                                          + self.rng.expovariate(1.0 / self.args.regular_gap_s))

    def submit(self, d: LocalDaemon) -> None:
        n = len(self.churn.samples)
        user = ("mt-alice", "mt-bob")[n % 2]
        samples = self.rng.randrange(4_000, 40_000, 1_000)
        tag = f"s{n}"
        job = d.submit_example(user, tag, f"1-{NODES}", samples)
        self.churn.samples[job], self.churn.tags[job] = samples, tag
        if self.rng.randrange(self.args.cancel_one_in) == 0:
            self.churn.cancel_at[job] = time.monotonic() + self.rng.uniform(10, 90)

    def submit_regular(self) -> None:
        nodes = self.rng.randint(1, NODES)
        hold_s = self.rng.randint(5, 40)
        run(as_user("mt-bob", ["sbatch", "--parsable", "-p", "batch", "-N", str(nodes),
                               "-t", "2", "-o", "/dev/null", "--wrap", f"srun sleep {hold_s}"]),
            self.env)
        self.churn.regular += 1

    def loop(self, d: LocalDaemon) -> None:
        end = time.monotonic() + self.args.minutes * 60
        next_sample = time.monotonic()
        while time.monotonic() < end:
            try:
                jobs = d.jobs()
            except StackError as exc:
                print(f"# jobs query failed: {exc}", flush=True)
                jobs = {}
            self.step(d, jobs)
            if time.monotonic() >= next_sample:
                self.rows.append(sample(d))
                print(f"# {len(self.rows):4d} {self.rows[-1]}", flush=True)
                next_sample += self.args.sample_s
            time.sleep(2.0)

    # -- the end --------------------------------------------------------------------------
    def drain(self, d: LocalDaemon, timeout_s: float = 600) -> dict[str, dict[str, object]]:
        """Wait until every malleable job has ended (no new ones, no regular jobs)."""
        deadline = time.monotonic() + timeout_s
        jobs = d.jobs()
        while time.monotonic() < deadline:
            jobs = d.jobs()
            if all(row.get("state") in ENDED for row in jobs.values()):
                break
            time.sleep(2.0)
        return jobs

    def outcomes(self, d: LocalDaemon, jobs: dict[str, dict[str, object]]) -> dict[str, int]:
        """Counts of completed (exact samples), cancelled and failed-or-lost jobs.

        Jobs pruned from the database (``keep_ended_jobs``) are judged by their result file:
        the example writes it only when the job has finished with all its samples.
        """
        out = {"completed": 0, "cancelled": 0, "failed": 0}
        for job, samples in self.churn.samples.items():
            result = d.result(self.churn.tags[job])
            state = jobs.get(job, {}).get("state")
            if result is not None and int(result["samples_total"]) == samples:
                out["completed"] += 1
            elif job in self.churn.cancelled and state in ("cancelled", None):
                out["cancelled"] += 1
            else:
                out["failed"] += 1
                print(f"# job {job} lost or failed: state {state}, result {result}", flush=True)
        return out

    def verdict(self) -> list[str]:
        bad = []
        for name, (rel, floor) in TOLERANCE.items():
            series = [row[name] for row in self.rows if name in row]
            growing, summary = grew(series, rel, floor)
            print(f"# {name}: {summary}{' GROWS' if growing else ''}", flush=True)
            if growing:
                bad.append(name)
        return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=3, help="malleable jobs alive at a time")
    ap.add_argument("--cancel-one-in", type=int, default=5)
    ap.add_argument("--regular-gap-s", type=float, default=45.0)
    ap.add_argument("--sample-s", type=float, default=60.0)
    ap.add_argument("--keep-ended", type=int, default=20)
    ap.add_argument("--dir", default="/tmp/malletrain-soak")
    ap.add_argument("--port", type=int, default=27900)
    ap.add_argument("--keep", action="store_true", help="leave the dev cluster up")
    args = ap.parse_args()
    soak = Soak(args)
    try:
        d = soak.start()
        soak.loop(d)
        soak.rows.append(sample(d))
        outcome = soak.outcomes(d, soak.drain(d))
        d.stop()
        d.stop_coordinator()
    finally:
        if not args.keep:
            soak.cluster.down()
    bad = soak.verdict()
    print(f"soak minutes={args.minutes:g} samples={len(soak.rows)} "
          f"jobs={len(soak.churn.samples)} completed={outcome['completed']} "
          f"cancelled={outcome['cancelled']} failed={outcome['failed']} "
          f"regular={soak.churn.regular} grew={','.join(bad) or '-'}")
    return 0 if not bad and outcome["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

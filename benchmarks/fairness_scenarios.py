"""The workloads ``benchmarks/fairness.py`` replays: real traces, each job given a real user.

* ``ab``: issue 47's scenario on Philly's per-minute node log (user A's 20 jobs, B's one);
* ``ricc-users``: ``configs/sim/sia-aws-48.yaml``'s jobs on RIKEN RICC, the users and groups
  of the log's own jobs of the same days (SWF fields 12-13);
* ``philly-vcs``: the same jobs on Philly's node log, each given the virtual cluster of one
  real Philly job submitted in the same days (``philly-jobs-pollux.csv``: Philly's job log has
  VCs, no user ids): a VC is a team's share of the cluster, one "user" here;
* ``swf-users``: any SWF log with user ids (:class:`SwfLog`).
"""

from __future__ import annotations

import csv
import gzip
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from malletrain.sim.counts import read_philly_minutes
from malletrain.sim.jobs import SimJob, parse_jobs
from malletrain.sim.swf import swf_trace
from malletrain.sim.trace import IdleTrace, slice_from

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "data" / "traces"
DAY = 86400.0
def philly(day: float, days: float) -> IdleTrace:
    tr = slice_from(read_philly_minutes(TRACES / "philly-node-usage-per-minute.csv"), day * DAY)
    return IdleTrace(tr.source, tr.node_names, tr.start_s, (day + days) * DAY, tr.events_list)


RICC = TRACES / "RICC-2010-2.swf.gz"


def ricc(day: float, days: float) -> IdleTrace:
    return swf_trace(RICC, 1024, day * DAY, (day + days) * DAY, 8)


def ab_jobs() -> list[SimJob]:
    """The issue's A/B scenario: A's 20 jobs at t=0, B's one at t=60 s, one kind, 1-8 nodes."""
    kind = parse_jobs(ROOT / "configs/sim/sia-imagenet-48.yaml")[0]
    kind = replace(kind, min_nodes=1, max_nodes=8, curve=tuple(p for p in kind.curve if p[0] <= 8))
    a = [replace(kind, name=f"a-{i:02d}", submit_s=0.0, user="a") for i in range(20)]
    return [*a, replace(kind, name="b-00", submit_s=60.0, user="b")]


def swf_users(path: Path, from_s: float, to_s: float, count: int) -> list[tuple[str, str]]:
    """``count`` (user, group) pairs (SWF fields 12 and 13) of the jobs submitted in
    [from_s, to_s) (seconds from the log's first submission, as ``swf_trace`` counts), evenly
    spaced over them in submit order: the i-th is that of job ``floor(i x M / count)`` of the
    ``M``, so each user appears in proportion to its share of the log's submissions."""
    pairs: list[tuple[str, str]] = []
    first = None
    with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as fh:
        for line in fh:
            fields = line.split()
            if not fields or line.startswith(";"):
                continue
            first = float(fields[1]) if first is None else first
            if from_s <= float(fields[1]) - first < to_s:
                pairs.append((f"u{int(fields[11])}", f"g{int(fields[12])}"))
    if len(pairs) < count:
        raise SystemExit(f"{path}: only {len(pairs)} jobs in [{from_s:g}, {to_s:g}) s")
    if {u for u, _ in pairs} <= {"u-1"}:
        raise SystemExit(f"{path}: no user ids (SWF field 12 is -1 in [{from_s:g}, {to_s:g}) s)")
    return [pairs[i * len(pairs) // count] for i in range(count)]


JOBS = ROOT / "configs/sim/sia-aws-48.yaml"


def users_jobs(log: Path, day: float, days: float, jobs_file: Path = JOBS) -> list[SimJob]:
    """The jobs of ``jobs_file``, each given the user and group of one job of ``log``."""
    jobs = parse_jobs(jobs_file)
    users = swf_users(log, day * DAY, (day + days) * DAY, len(jobs))
    return [replace(j, user=u, account=g) for j, (u, g) in zip(jobs, users, strict=True)]


def ricc_jobs(day: float, days: float) -> list[SimJob]:
    return users_jobs(RICC, day, days)


PHILLY_JOBS = TRACES / "philly-jobs-pollux.csv"
#: the node log's first minute (its day 0; ``philly-node-usage-per-minute.csv``)
PHILLY_START = datetime(2017, 10, 3)


def philly_vcs(path: Path, from_s: float, to_s: float, count: int) -> list[str]:
    """``count`` virtual clusters of the Philly jobs submitted in [from_s, to_s) (seconds
    from the node log's first minute), evenly spaced over them in submit order (the file's
    rows are not sorted), as :func:`swf_users` samples users."""
    with path.open(newline="") as fh:
        subs = sorted(((datetime.fromisoformat(row["timestamp"]) - PHILLY_START)
                       .total_seconds(), row["cluster"]) for row in csv.DictReader(fh))
    vcs = [vc for t, vc in subs if from_s <= t < to_s]
    if len(vcs) < count:
        raise SystemExit(f"{path}: only {len(vcs)} jobs in [{from_s:g}, {to_s:g}) s")
    return [f"vc-{vcs[i * len(vcs) // count]}" for i in range(count)]


def philly_jobs(day: float, days: float) -> list[SimJob]:
    jobs = parse_jobs(JOBS)
    vcs = philly_vcs(PHILLY_JOBS, day * DAY, (day + days) * DAY, len(jobs))
    return [replace(j, user=vc, account=vc) for j, vc in zip(jobs, vcs, strict=True)]


@dataclass(frozen=True)
class SwfLog:
    """``--swf``: a log of the user's choice for the scenario ``swf-users``."""

    path: Path
    nodes: int
    procs_per_node: int = 1
    jobs_file: Path = JOBS

    def trace(self, day: float, days: float) -> IdleTrace:
        return swf_trace(self.path, self.nodes, day * DAY, (day + days) * DAY,
                         self.procs_per_node)

    def jobs(self, day: float, days: float) -> list[SimJob]:
        return users_jobs(self.path, day, days, self.jobs_file)


@dataclass(frozen=True)
class Scenario:
    name: str
    #: (first day, days) -> the trace and the jobs
    trace: Callable[[float, float], IdleTrace]
    jobs: Callable[[float, float], list[SimJob]]
    #: the user whose waits are reported (the newcomer), or None: the worst user's
    watch: str | None
    #: the first day of the log replayed unless ``--day`` says otherwise
    day: float


SCENARIOS = {
    "ab": Scenario("ab", philly, lambda day, days: ab_jobs(), "b", 14.0),
    "ricc-users": Scenario("ricc-users", ricc, ricc_jobs, None, 30.0),
    "philly-vcs": Scenario("philly-vcs", philly, philly_jobs, None, 14.0),
}

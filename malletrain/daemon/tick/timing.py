"""Time arithmetic of slots: time limits, extensions, and how long a regular job waited."""

from __future__ import annotations

import math

from malletrain.core.cluster import ClusterSnapshot, JobState
from malletrain.daemon.jobs.slots import SlotView, parse_tag
from malletrain.daemon.jobs.store import JobRecord
from malletrain.daemon.tick.world import DecideSettings

_WANTS_NODE = (JobState.RUNNING, JobState.PENDING, JobState.COMPLETING, JobState.COMPLETED)


def yield_s(snapshot: ClusterSnapshot, node: str | None, ended_at: float | None
            ) -> float | None:
    """Seconds from a regular job's submission to our slot freeing the node it now uses.

    Only a job that wants the node after our slot is a candidate: one pending (planned on
    it, or with no plan yet but allowed on it) or one that started when our slot ended or
    later. A job that ran on the node before our slot (Slurm keeps finished jobs for
    MinJobAge) would otherwise be taken for the one we yielded to, and its whole age
    reported as the yield time (CI saw 60-120 s). Of several candidates the shortest wait
    counts: the figure is a lower bound when Slurm's choice is not known.
    """
    if node is None or ended_at is None:
        return None
    partitions = {p for n in snapshot.nodes if n.name == node for p in n.partitions}
    best: float | None = None
    for j in snapshot.jobs:
        if parse_tag(j.comment) is not None or j.submit_time is None:
            continue
        # a job Slurm preempts for need not have planned nodes yet (it may still wait for
        # other nodes): any pending job allowed on the node is a candidate
        unplanned = (j.state is JobState.PENDING and not j.planned_nodes
                     and not partitions.isdisjoint(j.partition.split(",")))
        on_node = node in j.nodes or node in j.planned_nodes or unplanned
        started_before = (j.state is not JobState.PENDING and j.start_time is not None
                          and j.start_time < ended_at - 1.0)
        if (j.state in _WANTS_NODE and on_node and not started_before
                and j.submit_time <= ended_at + 1.0):
            delay = max(0.0, ended_at - j.submit_time)
            best = delay if best is None else min(best, delay)
    return best


def _slot_time_s(window_s: float | None, s: DecideSettings, job: JobRecord, now_s: float
                 ) -> float:
    """How much longer a slot may run: the node's window, the site's cap, the job's limit."""
    limit = s.max_slot_time_s if window_s is None else min(window_s, s.max_slot_time_s)
    if job.spec.time_limit_s is not None:
        limit = min(limit, job.created_s + job.spec.time_limit_s - now_s)
    return limit


def extension_min(v: SlotView, window_s: float | None, s: DecideSettings, job: JobRecord,
                  now_s: float) -> int | None:
    """The new total time limit (minutes) of a running slot close to its limit, or None."""
    if v.time_limit_s is None or v.start_time is None:
        return None
    remaining = v.start_time + v.time_limit_s - now_s
    if remaining > s.extend_margin_s:
        return None
    more_s = _slot_time_s(window_s, s, job, now_s)
    total_min = math.floor((now_s - v.start_time + more_s) / 60.0)
    if total_min * 60 < v.time_limit_s + s.extend_margin_s:
        return None  # not worth an update: the window ends about when the limit does
    return total_min


def time_limit_min(window_s: float | None, s: DecideSettings, job: JobRecord, now_s: float
                   ) -> int:
    return max(1, math.floor(_slot_time_s(window_s, s, job, now_s) / 60.0))

"""What the daemon reports: Prometheus's figures after a tick, ``malletrain jobs``'s rows.

Pure: the tick hands over its plan, its snapshot and the live jobs, and the metrics server
reads the result at scrape time (a collector, prometheus client_python's way), never the
daemon's state; the rows come from the store's records and what the last tick saw.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from malletrain.core.cluster import ClusterSnapshot
from malletrain.daemon.jobs.slots import SlotStatus
from malletrain.daemon.jobs.store import JobRecord
from malletrain.daemon.submit.requests import JobRow
from malletrain.daemon.tick import TickPlan
from malletrain.ops.metrics import JobStatus, MetricsSnapshot


def metrics_snapshot(plan: TickPlan, snap: ClusterSnapshot, jobs: Sequence[JobRecord], *,
                     job_nodes: Mapping[str, tuple[str, ...]], partition: str,
                     horizon_s: float, private: bool, slurm_up: bool) -> MetricsSnapshot:
    """The cluster's and each job's figures after ``plan``.

    ``private``: whoever can scrape the metrics is not known, so where Slurm keeps jobs
    private the per-job series do not say whose job it is. Idle node-seconds are predicted
    up to ``horizon_s`` (the longest slot) per node.
    """
    total = sum(1 for n in snap.nodes if partition in n.partitions)
    scavenged = sum(1 for vs in plan.slot_views.values() for v in vs
                    if v.status is SlotStatus.RUNNING)
    windows = [n.window_s for n in plan.free_nodes + plan.held_nodes]
    predicted = sum(horizon_s if w is None else min(w, horizon_s) for w in windows)
    statuses = tuple(
        JobStatus(job_id=j.job_id, user="" if private else j.user, state=j.state.value,
                  nodes=len(job_nodes.get(j.job_id, ())), samples_per_s=j.samples_per_s,
                  samples_total=j.samples_total, rescales_up=j.rescales_up,
                  rescales_down=j.rescales_down)
        for j in jobs
    )
    return MetricsSnapshot(
        time_s=time.time(), total_nodes=total, idle_nodes=len(plan.free_nodes),
        scavenged_nodes=scavenged, predicted_idle_node_seconds=predicted, jobs=statuses,
        slurm_up=slurm_up,
    )


def job_rows(jobs: Sequence[JobRecord], job_nodes: Mapping[str, tuple[str, ...]],
             job_members: Mapping[str, int], points: Mapping[str, int],
             reasons: Mapping[str, str], entitled: Mapping[str, int] | None = None,
             failures: Mapping[str, str] | None = None) -> list[JobRow]:
    """One row per job: its record, and the nodes, members, profile points, reason and last
    failure the last tick saw (an ended job shows none; its MESSAGE says why), with its
    user's nodes and entitlement."""
    entitled = entitled or {}
    failures = failures or {}
    user_nodes: dict[str, int] = {}
    for j in jobs:
        if not j.state.terminal:
            user_nodes[j.user] = user_nodes.get(j.user, 0) + len(job_nodes.get(j.job_id, ()))
    return [JobRow(
        job_id=j.job_id, user=j.user, name=j.spec.name, state=j.state.value,
        nodes=job_nodes.get(j.job_id, ()) if not j.state.terminal else (),
        members=job_members.get(j.job_id, 0) if j.state.active else 0,
        min_nodes=j.spec.min_nodes, max_nodes=j.spec.max_nodes,
        samples_total=j.samples_total,
        samples_per_s=j.samples_per_s if j.state.active else 0.0,
        profile_points=points.get(j.job_id, 0) if j.state.active else 0,
        rescales_up=j.rescales_up, rescales_down=j.rescales_down,
        preemptions=j.preemptions, message=j.lifecycle.history[-1].reason,
        rate_target=j.spec.rate_target,
        reason=reasons.get(j.job_id, "") if j.state.active else "",
        user_nodes=user_nodes.get(j.user, 0), user_entitled=entitled.get(j.user, 0),
        failure=failures.get(j.job_id, "") if j.state.active else "",
    ) for j in jobs]

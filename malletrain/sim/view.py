"""The simulated cluster as the shared scavenger sees it: a ClusterSnapshot per event.

The daemon gets a :class:`~malletrain.core.cluster.ClusterSnapshot` from Slurm and
asks ``core.scavenger`` for idle nodes and their predicted windows. The simulator
does the same with a *reduced* snapshot: only the nodes idle in the trace (a busy
node can never be scavenged, so listing 3,000 of them per event would change no
answer) and the pending jobs whose planned nodes touch them. Node objects are
built once per node and reused, so an event costs a tuple of references, not
thousands of new objects.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from malletrain.core.cluster import ClusterSnapshot, Job, JobState, Node, NodeState
from malletrain.core.model import IdleNode
from malletrain.sim.trace import PlannedStart

log = logging.getLogger(__name__)

#: The partition the replayed regular workload runs in (names only; nothing reads it).
REGULAR_PARTITION = "batch"


class SnapshotView:
    """Builds per-event snapshots over a fixed node set and asks the scavenger for windows."""

    def __init__(self, node_names: Sequence[str]) -> None:
        self.node_names = tuple(node_names)
        self._idle_nodes = tuple(
            Node(name=n, state=NodeState.IDLE, partitions=(REGULAR_PARTITION,))
            for n in self.node_names
        )

    def snapshot(
        self, now_s: float, idle: np.ndarray, planned: Sequence[PlannedStart] | None
    ) -> ClusterSnapshot:
        """The cluster at ``now_s``: idle nodes (by index) and the backfill plan on them."""
        nodes = tuple(self._idle_nodes[i] for i in idle)
        jobs: tuple[Job, ...] = ()
        if planned:
            jobs = tuple(
                Job(
                    job_id=p.job_id,
                    name=f"swf-{p.job_id}",
                    user="regular",
                    partition=REGULAR_PARTITION,
                    state=JobState.PENDING,
                    node_count=len(p.nodes),
                    planned_nodes=tuple(self.node_names[i] for i in p.nodes),
                    start_time=p.start_s,
                )
                for p in planned
            )
        return ClusterSnapshot(taken_at=now_s, nodes=nodes, jobs=jobs)

    def idle_nodes(
        self,
        now_s: float,
        idle: np.ndarray,
        planned: Sequence[PlannedStart] | None,
        idle_since_s: np.ndarray,
    ) -> tuple[IdleNode, ...]:
        """Idle nodes with the scavenger's windows and the trace's idle ages, in index order."""
        snap = self.snapshot(now_s, idle, planned)
        windows = _windows(snap)
        names = self.node_names
        return tuple(
            IdleNode(
                name=names[i],
                window_s=windows.get(names[i]),
                idle_age_s=float(now_s - idle_since_s[i]),
            )
            for i in idle
        )


def _windows(snap: ClusterSnapshot) -> dict[str, float | None]:
    """Per idle node: seconds until the earliest planned start on it (None = unbounded).

    TEMPORARY until core/scavenger.py lands; then this calls the shared scavenger.
    """
    out: dict[str, float | None] = {n.name: None for n in snap.nodes}
    for job in snap.jobs:
        if job.start_time is None:
            continue
        w = max(0.0, job.start_time - snap.taken_at)
        for name in job.planned_nodes:
            if name in out:
                cur = out[name]
                out[name] = w if cur is None else min(cur, w)
    return out

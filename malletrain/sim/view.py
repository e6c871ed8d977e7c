"""The simulated cluster as the shared scavenger sees it: a ClusterSnapshot per event.

The daemon gets a :class:`~malletrain.core.cluster.ClusterSnapshot` from Slurm and
asks ``core.scavenger`` for idle nodes and their predicted windows. The simulator
does the same with a *reduced* snapshot: only the nodes idle in the trace (a busy
node can never be scavenged, so listing 3,000 of them per event would change no
answer) and the pending jobs whose planned nodes touch them. Node objects are
built once per node and rebuilt only when the node turns idle (to carry
``last_busy_at``, from which the scavenger derives the idle age), so an event
costs a tuple of references, not thousands of new objects.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from malletrain.core.cluster import ClusterSnapshot, Job, JobState, Node, NodeState
from malletrain.core.model import IdleNode
from malletrain.core.scavenging import scavenger
from malletrain.sim.trace import PlannedStart

log = logging.getLogger(__name__)

#: The partition the replayed regular workload runs in (names only; nothing reads it).
REGULAR_PARTITION = "batch"


class SnapshotView:
    """Builds per-event snapshots over a fixed node set and asks the scavenger for windows."""

    def __init__(self, node_names: Sequence[str], node_types: Sequence[str] | None = None
                 ) -> None:
        self.node_names = tuple(node_names)
        # a node's type reaches the scavenger as Slurm would give it: one GPU of that model
        gres = [""] * len(self.node_names) if node_types is None else [
            f"gpu:{t}:1" if t else "" for t in node_types]
        self._nodes = [
            Node(name=n, state=NodeState.IDLE, partitions=(REGULAR_PARTITION,), gres=g)
            for n, g in zip(self.node_names, gres, strict=True)
        ]
        #: The last plan seen and its claims: a trace hands the same plan object on
        #: until the plan changes, so the claims are worked out once per plan.
        self._plan: Sequence[PlannedStart] | None = None
        self._claims: dict[str, scavenger.Claim] = {}

    def mark_idle(self, indices: Sequence[int], since_s: Sequence[float]) -> None:
        """Nodes that turned idle (at ``since_s``): their Node objects carry the time."""
        for i, t in zip(indices, since_s, strict=True):
            self._nodes[i] = replace(self._nodes[i], last_busy_at=float(t))

    def snapshot(
        self, now_s: float, idle: np.ndarray, planned: Sequence[PlannedStart] | None
    ) -> ClusterSnapshot:
        """The cluster at ``now_s``: idle nodes (by index) and the backfill plan on them."""
        nodes = tuple(self._nodes[i] for i in idle)
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
        self, now_s: float, idle: np.ndarray, planned: Sequence[PlannedStart] | None
    ) -> tuple[IdleNode, ...]:
        """What the shared scavenger makes of the cluster at ``now_s`` (windows, idle ages).

        The same as ``scavenger.idle_nodes(self.snapshot(...))``; the plan's claims
        depend on the plan alone (no reservations here), so they are reused while the
        trace hands on the same plan.
        """
        if planned is not self._plan or not planned:
            self._plan = planned
            self._claims = (
                scavenger.earliest_claims(self.snapshot(now_s, idle[:0], planned), now_s)
                if planned else {}
            )
        nodes = ClusterSnapshot(taken_at=now_s, nodes=tuple(self._nodes[i] for i in idle))
        return scavenger.idle_nodes(nodes, now_s, claims=self._claims)

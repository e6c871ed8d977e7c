"""Which nodes are idle now, and for how long they are predicted to stay idle (pure).

Slurm's backfill plan says when each pending job is expected to start and on which nodes
(``planned_nodes``); reservations say when nodes are taken for other reasons.  An idle node
stays idle at most until the earliest such claim on it; with no claim its window is
unbounded (``None``).  This module turns a :class:`ClusterSnapshot` into that view, for the
daemon, ``malletrain nodes`` and the simulator alike.

Cost: one pass over the planned nodes of pending jobs and the nodes of reservations builds a
``node -> earliest claim`` dict (:func:`earliest_claims`); each node is then one lookup, so a
4,000-node cluster with thousands of jobs costs O(nodes + planned node slots), never
O(nodes x jobs).

What counts as idle: :class:`NodeState.IDLE` (``PLANNED`` included: a planned node is
exactly the hole to fill before the planned start) and none of :data:`UNUSABLE_FLAGS`, not
inside an active reservation, and, when ``partitions`` is given, in one of them (the daemon
passes its scavenger partition).  A pending job with a planned start but no planned nodes
claims no particular node and is ignored; a claim in the past clips the window to 0.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from malletrain.core.cluster import ClusterSnapshot, JobState, Node, NodeState
from malletrain.core.model import IdleNode

#: Flags that make an idle node unusable for scavenging.
UNUSABLE_FLAGS = frozenset(
    {
        "DRAIN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN",
        "POWERING_UP", "REBOOT_REQUESTED", "REBOOT_ISSUED", "MAINTENANCE", "RESERVED",
    }
)


@dataclass(frozen=True)
class Claim:
    """The earliest future use of a node: a pending job's planned start or a reservation."""

    start_at: float
    #: ``"job 42"`` or ``"reservation maint"``: for humans and logs.
    by: str
    #: When the claiming job was submitted (``None`` for a reservation): a claim due the
    #: moment its job arrives is Slurm's to serve first (the daemon's ``yield_ahead``).
    submitted_at: float | None = None


@dataclass(frozen=True)
class NodeWindow:
    """One node's row in ``malletrain nodes`` and the daemon's view."""

    name: str
    state: NodeState
    flags: frozenset[str]
    partitions: tuple[str, ...]
    #: Usable by malletrain right now.
    idle: bool
    #: Seconds it stays idle from ``now``; ``None`` = unbounded; ``0`` when not idle.
    window_s: float | None
    #: The claim that ends the window, if any.
    claim: Claim | None
    #: Seconds since the node last ran a job (0 if unknown or busy).
    idle_age_s: float
    #: Leaf switch (Slurm topology), if known.
    switch: str | None = None
    #: Node type (:func:`node_type`): the GPU model of its GRES; "" for a node without GPUs.
    node_type: str = ""


def earliest_claims(
    snapshot: ClusterSnapshot, now: float, *, exclude_job_ids: Collection[int] = ()
) -> dict[str, Claim]:
    """``node -> earliest claim`` over pending jobs' plans and reservations not yet ended.

    Claims in the past are kept (a stale plan clips the window to 0); reservations that
    have ended are dropped.  Claims are applied latest-first with ``dict.update``, so the
    earliest one per node wins without a comparison per planned node slot; among claims
    with the same start the job listed first (then the reservation) wins.

    ``exclude_job_ids``: jobs whose plans are not claims, i.e. the caller's own (the
    daemon's released node slots are pending jobs planned onto the very node they are
    meant to take; counted as claims they would end their own node's window).
    """
    skip = frozenset(exclude_job_ids)
    claims: list[tuple[Claim, tuple[str, ...]]] = []
    for job in snapshot.jobs:
        if job.job_id in skip:
            continue
        # UNKNOWN too: a state name a newer Slurm added must not hide a plan (a planned
        # start is the scheduler's promise of those nodes, whatever the job's state reads)
        if (job.state in (JobState.PENDING, JobState.UNKNOWN) and job.start_time is not None
                and job.planned_nodes):
            claims.append((Claim(job.start_time, f"job {job.job_id}", job.submit_time),
                           job.planned_nodes))
    for resv in snapshot.reservations:
        if resv.end_time > now and resv.nodes:
            claims.append((Claim(resv.start_time, f"reservation {resv.name}"), resv.nodes))
    # Stable sort, latest start first; reversing keeps "first listed wins" among equals.
    claims.reverse()
    claims.sort(key=lambda c: c[0].start_at, reverse=True)
    by_node: dict[str, Claim] = {}
    for claim, nodes in claims:
        by_node.update(dict.fromkeys(nodes, claim))
    return by_node


def is_idle(node: Node) -> bool:
    """Whether Slurm would let a scavenger job start on ``node`` now (state-wise)."""
    return node.state is NodeState.IDLE and not (node.flags & UNUSABLE_FLAGS)


def node_windows(
    snapshot: ClusterSnapshot,
    now: float,
    *,
    partitions: Collection[str] | None = None,
    claims: Mapping[str, Claim] | None = None,
    idle_only: bool = False,
) -> tuple[NodeWindow, ...]:
    """Every node (in ``partitions``, if given) with its predicted idle window at ``now``.

    ``claims`` may be passed in when the caller already computed :func:`earliest_claims`
    (the simulator does, incrementally). ``idle_only`` leaves the busy nodes out (the
    tick's pool: at 5,000 nodes, 92 % busy, their windows were most of its cost).
    """
    wanted = None if partitions is None else frozenset(partitions)
    by_node = claims if claims is not None else earliest_claims(snapshot, now)
    reserved_now = {
        name
        for resv in snapshot.reservations
        if resv.start_time <= now < resv.end_time
        for name in resv.nodes
    }
    out: list[NodeWindow] = []
    for node in snapshot.nodes:
        if wanted is not None and wanted.isdisjoint(node.partitions):
            continue
        claim = by_node.get(node.name)
        # Inside an active reservation the node is not ours to use, even if Slurm says idle.
        idle = is_idle(node) and node.name not in reserved_now
        if idle_only and not idle:
            continue
        if not idle:
            window: float | None = 0.0
        elif claim is None:
            window = None
        else:
            window = max(0.0, claim.start_at - now)
        age = 0.0
        if idle and node.last_busy_at is not None:
            age = max(0.0, now - node.last_busy_at)
        out.append(
            NodeWindow(
                name=node.name,
                state=node.state,
                flags=node.flags,
                partitions=node.partitions,
                idle=idle,
                window_s=window,
                claim=claim,
                idle_age_s=age,
                switch=node.switch,
                node_type=node_type(node.gres),
            )
        )
    return tuple(out)


@functools.lru_cache(maxsize=1024)  # a few GRES strings, 5,000 nodes a tick
def node_type(gres: str) -> str:
    """A node's type from its Slurm GRES: the GPU model (``gpu:a100:4(S:0-1)`` -> ``a100``),
    ``gpu`` for GPUs without a type (``gpu:4``), "" for none (``(null)``, ``""``).

    Nodes of one type are interchangeable to a job; a job's throughput is kept per type
    (``MalleableJob.type_throughput``) and it runs on one type at a time (``core.hetero``).
    """
    for item in gres.split(","):
        parts = item.split("(", 1)[0].strip().split(":")
        if parts[0] != "gpu":
            continue
        if len(parts) >= 3 or (len(parts) == 2 and not parts[1].isdigit()):
            return parts[1].lower()
        return "gpu"
    return ""


def idle_nodes(
    snapshot: ClusterSnapshot,
    now: float,
    *,
    partitions: Collection[str] | None = None,
    min_window_s: float = 0.0,
    claims: Mapping[str, Claim] | None = None,
) -> tuple[IdleNode, ...]:
    """The allocator's input: idle nodes whose window is ``None`` or > ``min_window_s``."""
    out: list[IdleNode] = []
    for w in node_windows(snapshot, now, partitions=partitions, claims=claims, idle_only=True):
        if w.window_s is not None and w.window_s <= min_window_s:
            continue
        out.append(IdleNode(name=w.name, window_s=w.window_s, idle_age_s=w.idle_age_s,
                            switch=w.switch, node_type=w.node_type))
    return tuple(out)

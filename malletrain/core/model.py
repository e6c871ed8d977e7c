"""The allocator's input and output: the contract between core/ and its callers.

The daemon builds an :class:`AllocationInput` from a Slurm snapshot plus the
Profiling Advisor; the simulator builds one from a replayed trace. A policy is a
pure function ``AllocationInput -> Plan``; the caller applies the difference.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class IdleNode:
    """A node malletrain may use right now (idle in Slurm, or already held by a malleable job)."""

    name: str
    #: Predicted remaining idle time in seconds from ``now``;
    #: ``None`` = nothing planned (unbounded).
    window_s: float | None
    #: How long the node has been idle (seconds), for the hole-length estimate.
    idle_age_s: float = 0.0
    #: Network locality group (e.g. leaf switch) if known, so a job's nodes stay close.
    switch: str | None = None
    #: Node type (a GPU model from the node's GRES, ``core.scavenger.node_type``); "" = the
    #: one type of a homogeneous cluster. A job's throughput may differ per type.
    node_type: str = ""


@dataclass(frozen=True)
class ThroughputModel:
    """What a policy believes about a job's throughput (whole job, samples/s) at n nodes.

    ``points`` are (nodes, samples_per_s) sorted by nodes; between points the curve
    is linear, beyond the last point it is flat (a conservative extrapolation)
    unless ``optimistic_slope`` allows a bounded optimistic extension, the way the
    Profiling Advisor expresses uncertainty about untried sizes.

    ``measured_max_nodes`` says how far the curve is measured: beyond it the rate
    is a guess (the optimistic extension), which a policy may use to explore onto
    free nodes but should not pay for by taking nodes from another running job.
    ``None`` (the default): not said, every size is trusted (true curves, tests);
    0: nothing measured yet.
    """

    points: tuple[tuple[int, float], ...]
    optimistic_slope: float = 0.0
    measured_max_nodes: int | None = None

    def scaled(self, factor: float) -> ThroughputModel:
        """The same curve with every rate times ``factor`` (a change of units)."""
        return ThroughputModel(tuple((n, r * factor) for n, r in self.points),
                               self.optimistic_slope * factor, self.measured_max_nodes)

    def spread_beyond(self, cap: int, factor: float) -> ThroughputModel:
        """The same curve with the rate beyond ``cap`` nodes times ``factor``: a job that
        no longer fits on one switch (``cap`` nodes) runs at ``factor`` of its packed rate
        (``MalleableJob.spread_factor``)."""
        if factor >= 1.0 or cap < 1 or not self.points:
            return self
        head = tuple(pt for pt in self.points if pt[0] <= cap)
        if not head or head[-1][0] != cap:
            head += ((cap, self.rate(cap)),)
        beyond = tuple((n, r * factor) for n, r in self.points if n > cap + 1)
        tail = ((cap + 1, self.rate(cap + 1) * factor), *beyond)
        return ThroughputModel(head + tail, self.optimistic_slope * factor,
                               self.measured_max_nodes)

    def rate(self, n: int) -> float:
        if n <= 0 or not self.points:
            return 0.0
        pts = self.points
        if n <= pts[0][0]:
            # below the first measured size: scale proportionally from it
            return pts[0][1] * n / pts[0][0]
        for (n0, r0), (n1, r1) in itertools.pairwise(pts):
            if n <= n1:
                return r0 + (r1 - r0) * (n - n0) / (n1 - n0)
        last_n, last_r = pts[-1]
        return last_r + self.optimistic_slope * (n - last_n)


@dataclass(frozen=True)
class MalleableJob:
    job_id: str
    min_nodes: int
    max_nodes: int
    #: Nodes the job holds now (empty when it is not running).
    nodes: tuple[str, ...]
    throughput: ThroughputModel
    #: Seconds of progress lost when the job grows / shrinks (measured or default).
    scale_up_s: float
    scale_down_s: float
    #: Submit order, for first-come-first-served tie breaks.
    submit_order: int = 0
    #: Whose job it is: nodes are divided among users first (``core.allocation.fairness``);
    #: jobs with the same (or no) user share one part.
    user: str = ""
    #: The Slurm account it runs under: with ``AllocationInput.account_weights``, nodes are
    #: divided among accounts before their users (Slurm's fair-share tree).
    account: str = ""
    #: The limits the job's nodes count against (keys of ``AllocationInput.caps``: Slurm's
    #: per-user, per-account and QOS limits, ``daemon/tick/limits.py``).
    limits: tuple[str, ...] = ()
    #: The job's weight among its user's jobs (``--nice``: below 1 for a nicer job): its
    #: value is scaled by it, so it matters only within its user's part of the nodes.
    weight: float = 1.0
    #: Seconds of progress (at the new rate) lost when the job starts from zero nodes:
    #: rendezvous, process start-up, first slow steps. ``None``: same as ``scale_up_s``
    #: (a start is a scale-up from nothing; the newcomers' start-up dominates both).
    start_s: float | None = None
    #: Relative noise of the job's measured throughput (std / mean of its progress
    #: intervals at its current size; 0 = exact). The policy asks for a larger gain
    #: before moving nodes away from a job whose rate it knows only this well.
    rate_noise: float = 0.0
    #: Samples the job still has to do before it is complete, if the user declared the
    #: job's total (e.g. epochs x dataset size); ``None``: not declared (runs until it
    #: ends). A declaration, not a measurement and not the throughput curve, so a policy
    #: that learns curves online may use it (the simulator fills it from the jobs file's
    #: ``total_samples`` minus the progress made). MalleTrainPolicy's ``finish_weight``
    #: reads it to value a job that can finish soon (its finish lets a queued job in).
    remaining_samples: float | None = None
    #: Throughput per node type where it differs from ``throughput`` (the job's profile kept
    #: per type). A job runs on one type at a time (``core.hetero``).
    type_throughput: Mapping[str, ThroughputModel] = field(default_factory=dict)
    #: The node types the job can use (its ``--gres`` type or ``--constraint``); None: any.
    allowed_types: frozenset[str] | None = None
    #: Cost objective: the throughput (the model's units) beyond which more is worth
    #: nothing, so the plan meets it at the lowest price (``AllocationInput.prices``).
    rate_target: float | None = None
    #: Nodes the job must never be given (its ``--exclude``): placement skips them; the
    #: caller caps ``max_nodes`` at the nodes it may use.
    excluded_nodes: frozenset[str] = frozenset()
    #: The job's throughput when its nodes span switches, relative to one switch (learned
    #: from its step times: ``ProfilingAdvisor.spread_factor``; 1: no penalty known).
    spread_factor: float = 1.0

    def model_on(self, node_type: str) -> ThroughputModel | None:
        """The job's throughput on nodes of ``node_type``; None where it cannot run."""
        if self.allowed_types is not None and node_type not in self.allowed_types:
            return None
        return self.type_throughput.get(node_type, self.throughput)


@dataclass(frozen=True)
class AllocationInput:
    now_s: float
    #: Every node a policy may hand out: free idle nodes and nodes held by the jobs below.
    nodes: tuple[IdleNode, ...]
    jobs: tuple[MalleableJob, ...]
    #: Submitted malleable jobs waiting for an admission slot (not in ``jobs``): a job
    #: that finishes lets the next one in. ``None``: not known (a policy assumes some wait).
    queued_jobs: int | None = None
    #: Price of a node-second per node type (absent: 0), in the plan's value units per
    #: node-second; the plan maximises value minus price x node-seconds over the horizon.
    prices: Mapping[str, float] = field(default_factory=dict)
    #: Nodes the jobs carrying each key in ``MalleableJob.limits`` may hold together (the
    #: nodes of jobs not in ``jobs`` already taken off); a key absent here binds nothing.
    caps: Mapping[str, int] = field(default_factory=dict)
    #: Weights of users' shares (a user not named: 1; ``accounting.share_weights``).
    user_weights: Mapping[str, float] = field(default_factory=dict)
    #: Weights of accounts' shares (``accounting.account_weights``; a named account or not:
    #: 1 where absent); empty: no account level, users share the nodes directly.
    account_weights: Mapping[str, float] = field(default_factory=dict)
    #: With ``account_weights``: each account's parent account (Slurm's account tree, read
    #: with the limits); an account not named hangs from the top (empty: one level).
    account_parents: Mapping[str, str] = field(default_factory=dict)

    @cached_property
    def node_index(self) -> dict[str, int]:
        """Node name -> its position in ``nodes`` (built once: a decision looks it up for
        its value table, its plan check and its node choice)."""
        return dict(zip(self.node_names, range(len(self.nodes)), strict=True))

    @cached_property
    def node_name_rank(self) -> np.ndarray:
        """Each node's rank by name: node choices break ties of window by name (twice a
        decision with the plan check)."""
        order = np.argsort(np.array([n.name for n in self.nodes], dtype=str), kind="stable")
        rank = np.empty(len(self.nodes), dtype=np.int64)
        rank[order] = np.arange(len(self.nodes))
        return rank

    @cached_property
    def node_names(self) -> list[str]:
        """Each node's name by position (node choices work on positions, answer in names)."""
        return list(map(attrgetter("name"), self.nodes))

    @cached_property
    def node_switch_id(self) -> np.ndarray:
        """Each node's switch as a number by position (-1: no topology), for every node
        choice of a decision: numbers in order of first appearance."""
        switches = list(map(attrgetter("switch"), self.nodes))
        seen = dict.fromkeys(switches)
        seen.pop(None, None)
        ids: dict[str | None, int] = {s: i for i, s in enumerate(seen)}
        ids[None] = -1
        return np.fromiter(map(ids.__getitem__, switches), dtype=np.int64, count=len(switches))


@dataclass(frozen=True)
class Plan:
    """How many and which nodes each job should hold after this decision."""

    assignments: Mapping[str, tuple[str, ...]]
    #: The policy's objective value for this plan (its own units), for logs and tests.
    objective: float = 0.0
    decision_s: float = 0.0
    notes: tuple[str, ...] = field(default=(), compare=False)

    def count(self, job_id: str) -> int:
        return len(self.assignments.get(job_id, ()))


class Policy(Protocol):
    """An allocation policy: a pure function of its input."""

    name: str

    def decide(self, inp: AllocationInput) -> Plan: ...

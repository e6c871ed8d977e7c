"""Typed, immutable views of the cluster: the domain model both backends produce.

The Slurm backend (CLI or pyslurm) and the simulator both produce these; the
scavenger, daemon and CLI consume them. Parsers map anything they do not recognise to
``UNKNOWN`` rather than failing, so one odd node never blinds the daemon.

Times are epoch seconds (``*_at``/``*_time``) or durations in seconds (``*_s``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from enum import StrEnum


class NodeState(StrEnum):
    IDLE = "idle"
    ALLOCATED = "allocated"
    MIXED = "mixed"
    COMPLETING = "completing"
    DRAINING = "draining"
    DRAINED = "drained"
    DOWN = "down"
    RESERVED = "reserved"
    FUTURE = "future"
    UNKNOWN = "unknown"


class JobState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    CONFIGURING = "CONFIGURING"
    UNKNOWN = "UNKNOWN"

    @property
    def is_active(self) -> bool:
        """Whether the job holds or may soon hold nodes."""
        return self in _ACTIVE_JOB_STATES


_ACTIVE_JOB_STATES = frozenset(
    {
        JobState.PENDING,
        JobState.RUNNING,
        JobState.SUSPENDED,
        JobState.COMPLETING,
        JobState.CONFIGURING,
        JobState.REQUEUED,
    }
)


@dataclass(frozen=True)
class Node:
    name: str
    state: NodeState
    #: Slurm's extra state flags, upper-case (e.g. ``PLANNED``, ``DRAIN``, ``RESERVED``).
    flags: frozenset[str] = frozenset()
    partitions: tuple[str, ...] = ()
    cpus: int = 0
    features: tuple[str, ...] = ()
    gres: str = ""
    reason: str = ""
    #: When the node last ran a job (epoch s), if Slurm says; for the idle age of a hole.
    last_busy_at: float | None = None
    #: Leaf switch of Slurm's topology (``scontrol show topology``), if configured.
    switch: str | None = None


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]
    priority_tier: int = 1
    preempt_mode: str = "OFF"
    grace_time_s: int = 0
    max_time_s: int | None = None
    default: bool = False
    state: str = "UP"


@dataclass(frozen=True)
class Job:
    job_id: int
    name: str
    user: str
    partition: str
    state: JobState
    state_reason: str = ""
    node_count: int = 0
    #: Nodes the job runs on (running jobs).
    nodes: tuple[str, ...] = ()
    #: Nodes the backfill plan reserves for a pending job (``squeue --start``); empty if none.
    planned_nodes: tuple[str, ...] = ()
    time_limit_s: int | None = None
    submit_time: float | None = None
    #: Running: actual start. Pending: the scheduler's planned start, if any.
    start_time: float | None = None
    end_time: float | None = None
    comment: str = ""
    #: The Slurm account and QOS the job runs under (empty: Slurm names none): a regular
    #: job's nodes count against the same association and QOS limits as the slots of the
    #: malleable jobs of its user and account (``daemon/tick/limits.py``).
    account: str = ""
    qos: str = ""
    #: The GPUs it holds (running) or asks for (pending), against the same limits' GPU
    #: counts; read only where the site holds such a limit (0 otherwise).
    gpus: int = 0


@dataclass(frozen=True)
class Reservation:
    name: str
    nodes: tuple[str, ...]
    start_time: float
    end_time: float


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything one tick knows about the cluster, from one batched set of calls."""

    taken_at: float
    nodes: tuple[Node, ...] = ()
    partitions: tuple[Partition, ...] = ()
    jobs: tuple[Job, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    #: Parser warnings (unknown states, skipped records): shown, never fatal.
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def node(self, name: str) -> Node | None:
        return self._node_index.get(name)

    def job(self, job_id: int) -> Job | None:
        return self._job_index.get(job_id)

    # Built on first use: a tick looks up every slot's job (thousands at a large site),
    # and a scan per lookup was 180 ms of a tick at 500 jobs (benchmarks/load.py).
    @functools.cached_property
    def _node_index(self) -> dict[str, Node]:
        index: dict[str, Node] = {}
        for n in self.nodes:
            index.setdefault(n.name, n)  # the first, as a scan finds it
        return index

    @functools.cached_property
    def _job_index(self) -> dict[int, Job]:
        index: dict[int, Job] = {}
        for j in self.jobs:
            index.setdefault(j.job_id, j)
        return index

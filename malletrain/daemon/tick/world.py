"""What one tick decides from: the daemon's whole view, frozen (the pipeline's input).

The daemon observes (one batched Slurm snapshot, the store's jobs and slots, per job the
coordinator's membership, registrations, departures and progress) and freezes the result
into a :class:`World`; every step of :mod:`malletrain.daemon.tick` reads it and none writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from malletrain.core.accounting import SiteLimits
from malletrain.core.cluster import ClusterSnapshot
from malletrain.core.model import ThroughputModel
from malletrain.daemon.jobs.store import JobRecord, SlotRecord


@dataclass(frozen=True)
class DecideSettings:
    scavenger_partition: str = "scavenger"
    min_slot_time_s: float = 60.0
    max_slot_time_s: float = 3600.0
    #: a released slot that has not started after this long is held again (node taken).
    place_timeout_s: float = 30.0
    #: a member asked to leave whose slot has not ended after this long is requeued anyway.
    leave_timeout_s: float = 20.0
    #: newcomers of one job are published together, waiting at most this long for the rest.
    publish_batch_s: float = 8.0
    #: no progress report for this long: the job is stalled; 4x this long: failed.
    heartbeat_timeout_s: float = 30.0
    #: a finished job's slots still running after this long are cancelled.
    finish_grace_s: float = 15.0
    #: a slot that ends this soon after being placed (and was not asked to) failed to start.
    start_failure_s: float = 30.0
    #: this many start failures and the job fails (its script or environment is broken).
    max_start_failures: int = 5
    #: a running slot whose time limit ends within this is extended, if its node's window
    #: allows (otherwise it ends at its limit and the node goes back to Slurm).
    extend_margin_s: float = 180.0
    #: a held node that a foreign pending job (or a reservation) is planned to take within
    #: this long, or should already have taken, is given back now
    #: (:func:`~malletrain.daemon.tick.yielding.yield_ahead`); capped at
    #: ``min_slot_time_s`` so a node given back is never placed again at once.
    yield_ahead_s: float = 10.0
    #: a claim due the moment its job was submitted is left to Slurm's own preemption for
    #: this long after the submission before its nodes are given back.
    yield_confirm_s: float = 1.0
    #: a regular job pending without a plan up to this long after its submission is served
    #: from held nodes if it needs them
    #: (:func:`~malletrain.daemon.tick.yielding.serve_unplanned`).
    yield_unplanned_s: float = 10.0
    #: price of a node-second per node type (``allocator.node_prices``; CPU nodes: "").
    node_prices: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Registration:
    node: str
    registered_at_s: float


@dataclass(frozen=True)
class CoordView:
    """What the coordinator says about one job."""

    epoch: int = 0
    members: tuple[str, ...] = ()
    #: live registrations (not departed since): member -> where and when.
    live: Mapping[str, Registration] = field(default_factory=dict)
    #: member -> time of its latest departure (sigterm, removed, failed...).
    departed: Mapping[str, float] = field(default_factory=dict)
    #: members whose latest departure was a SIGTERM (Slurm preempting or timing out the slot).
    sigtermed: frozenset[str] = frozenset()
    #: members whose latest departure says the training code failed on its own (an
    #: exception in an ElasticJob step, a restart-mode launch that exited non-zero)
    crashed: frozenset[str] = frozenset()
    #: members that held the job's last state and could not save it (evicted to zero)
    state_lost: frozenset[str] = frozenset()
    #: the last "crashed" departure's own words (restart mode: the failed step's line)
    failure: str = ""
    samples_total: int | None = None
    samples_per_s: float = 0.0
    progress_at_s: float | None = None
    finished_samples: int | None = None


@dataclass(frozen=True)
class JobModel:
    throughput: ThroughputModel
    scale_up_s: float
    scale_down_s: float
    #: measured cost of a start from zero nodes (None: the policy uses scale_up_s)
    start_s: float | None = None
    #: relative noise of its measured throughput (the policy's hysteresis scales with it)
    rate_noise: float = 0.0
    #: its throughput per node type, where the cluster has several (core.hetero)
    by_type: Mapping[str, ThroughputModel] = field(default_factory=dict)
    #: its rate across switches relative to one switch (core.spread; 1: none measured)
    spread_factor: float = 1.0


@dataclass(frozen=True)
class World:
    now_s: float
    snapshot: ClusterSnapshot
    jobs: tuple[JobRecord, ...]
    slots: Mapping[str, tuple[SlotRecord, ...]]
    coord: Mapping[str, CoordView]
    models: Mapping[str, JobModel]
    settings: DecideSettings = DecideSettings()
    #: node -> when its current hole began (idle in Slurm or scavenged by us since then);
    #: kept by the caller from the previous tick's :attr:`TickPlan.hole_start_s`.
    hole_start_s: Mapping[str, float] = field(default_factory=dict)
    #: jobs whose actions of an earlier tick are still being applied (the service applies
    #: them off the tick: daemon/act/action_queue.py). Pinned: they keep the nodes they hold
    #: and get no actions, so no other job is planned onto a node such a job may still take
    #: or leave (the daemon saw ten times the placements and parks without this).
    busy: frozenset[str] = frozenset()
    #: Slurm's limits on users, accounts and QOS (``sacctmgr``, read every
    #: ``accounting.refresh_s``) or the settings' per-user cap; None: no limits known.
    limits: SiteLimits | None = None

    def coord_of(self, job_id: str) -> CoordView:
        return self.coord.get(job_id, _NOTHING_SAID)


#: what the coordinator says of a job it does not know (one instance: asked ~1,500
#: times a tick at 500 jobs, and building the default at every call, found or not, was
#: 3 % of the decision)
_NOTHING_SAID = CoordView()

"""What one tick asks for: typed actions, and the plan that carries them to the actuator."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from malletrain.core.lifecycle import JobPhase
from malletrain.core.model import IdleNode, Plan
from malletrain.daemon.jobs.slots import SlotView


@dataclass(frozen=True)
class Place:
    job_id: str
    slot: int
    slurm_job_id: int
    node: str
    time_limit_min: int


@dataclass(frozen=True)
class Park:
    """``scontrol requeuehold``: back into the pool (kills the payload if still running)."""

    job_id: str
    slot: int
    slurm_job_id: int
    why: str
    preempted: bool = False
    start_failed: bool = False
    node: str | None = None
    #: seconds from the claiming job's submission to this slot's end (yield latency).
    yield_s: float | None = None
    #: the slot's member, still registered though the slot ended (killed, node lost)
    gone_member: str | None = None


@dataclass(frozen=True)
class Extend:
    """Raise a running slot's time limit (total minutes) as its node's window allows."""

    job_id: str
    slot: int
    slurm_job_id: int
    time_limit_min: int


@dataclass(frozen=True)
class Hold:
    """``scontrol hold`` a released slot that should not start (any more)."""

    job_id: str
    slot: int
    slurm_job_id: int
    why: str


@dataclass(frozen=True)
class Leave:
    """Mark the slot as leaving (its member is left out of the next membership)."""

    job_id: str
    slot: int


@dataclass(frozen=True)
class ClearMarks:
    job_id: str
    slot: int


@dataclass(frozen=True)
class Publish:
    job_id: str
    members: tuple[str, ...]
    old_size: int


@dataclass(frozen=True)
class Cancel:
    job_id: str
    slot: int
    slurm_job_id: int


@dataclass(frozen=True)
class Transit:
    job_id: str
    to: JobPhase
    reason: str


Action = Place | Park | Extend | Hold | Leave | ClearMarks | Publish | Cancel | Transit


@dataclass(frozen=True)
class TickPlan:
    targets: Mapping[str, tuple[str, ...]]
    actions: tuple[Action, ...]
    slot_views: Mapping[str, tuple[SlotView, ...]]
    allocation: Plan | None = None
    #: nodes idle and usable (free) and held by malleable jobs, for metrics.
    free_nodes: tuple[IdleNode, ...] = ()
    held_nodes: tuple[IdleNode, ...] = ()
    hole_start_s: Mapping[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    #: job id -> why it has the nodes it has (:mod:`.reasons`), for ``malletrain jobs``
    reasons: Mapping[str, str] = field(default_factory=dict)
    #: user -> the nodes the user is entitled to now (:func:`.reasons.entitlements`)
    entitled: Mapping[str, int] = field(default_factory=dict)
    #: Held nodes are being given back ahead of a foreign job (``yield_ahead``). Slurm's
    #: backfill plan moves every pass while that job waits, and may name more of our nodes
    #: next: the loop should look again soon instead of after a whole tick interval. Also
    #: while a claim is left to Slurm for ``yield_confirm_s``: its end must be seen in time.
    follow_up: bool = False

"""Step 4 of a tick: how many and which nodes each managed job should hold (the policy).

The policy (:mod:`malletrain.core.policies`) is the same code the simulator runs; here it
gets the pool's nodes and one :class:`~malletrain.core.model.MalleableJob` per managed job,
capped at the slots the job still has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from malletrain.core.allocation.targets import target_now
from malletrain.core.lifecycle import JobPhase
from malletrain.core.model import AllocationInput, MalleableJob, Plan, Policy, ThroughputModel
from malletrain.daemon.jobs.slots import SlotStatus
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.daemon.jobs.store import JobRecord
from malletrain.daemon.tick.limits import JobLimits
from malletrain.daemon.tick.pool import Pool
from malletrain.daemon.tick.views import JobSlots
from malletrain.daemon.tick.world import JobModel

#: slot states that can still run the job on a node (ENDING slots are on their way out)
_PLACEABLE = (SlotStatus.PARKED, SlotStatus.PLACING, SlotStatus.RUNNING, SlotStatus.ENDED)
#: a job with no model yet competes as a linear job (never as "worth nothing")
_UNKNOWN = JobModel(ThroughputModel(((1, 1.0),), 1.0), 3.0, 1.0)
_NO_LIMITS = JobLimits()
#: ``--nice`` N: the job's value is weighed 1 / (1 + N / NICE_HALF) within its user's part
#: (nice 100 counts half), so a nicer job gets less of its user's nodes (never others').
NICE_HALF = 100.0


def nice_weight(nice: int) -> float:
    """The weight of a job submitted with ``--nice=nice`` (0: 1.0)."""
    return 1.0 / (1.0 + max(0, nice) / NICE_HALF)


@dataclass(frozen=True)
class Allocation:
    plan: Plan | None = None
    #: job -> the nodes it should hold (only nodes actually on offer)
    targets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def allowed_types(spec: JobSpec, gpu_types: frozenset[str]) -> frozenset[str] | None:
    """The node types a job's slots can run on (``core.scavenger.node_type``): its GPU model
    (``--gres=gpu:a100:4``), any GPU type for a job that asks for GPUs, any type otherwise.
    Told to the allocator so that it never plans a slot onto a node Slurm would refuse it."""
    if spec.gpu_type:
        return frozenset({spec.gpu_type.lower()})
    if spec.gpus_per_node > 0:
        return gpu_types
    return None


def rate_target(job: JobRecord, now_s: float) -> float | None:
    """The job's ``--rate-target`` as the plan is told it now: met on average since its
    first start, so time without nodes is made up (``core.targets.target_now``). Only once
    the job reports progress: before that its rate is a guess (one sample/s a node), and
    what it owes for its start-up alone made it grow onto a node it did not need."""
    if job.spec.rate_target is None or job.samples_total <= 0:
        return job.spec.rate_target
    return target_now(job.spec.rate_target, job.lifecycle.first_s(JobPhase.STARTING),
                      job.samples_total, now_s)


def policy_jobs(now_s: float, managed: tuple[JobRecord, ...], slots: Mapping[str, JobSlots],
                held: Mapping[str, tuple[str, ...]], models: Mapping[str, JobModel],
                gpu_types: frozenset[str] = frozenset(),
                offered: frozenset[str] = frozenset(),
                limits: Mapping[str, JobLimits] | None = None) -> tuple[MalleableJob, ...]:
    """One policy job per managed job, capped at its usable slots, for a job with
    ``--exclude`` at the ``offered`` nodes it may use, and at Slurm's limits on its size
    (``limits``: its caps shared with other jobs go in as its ``MalleableJob.limits``)."""
    out = []
    limits = limits or {}
    for job in managed:
        usable = sum(1 for v in slots[job.job_id].views if v.status in _PLACEABLE)
        excluded = frozenset(job.spec.exclude)
        if excluded:
            usable = min(usable, len(offered - excluded))
        lim = limits.get(job.job_id, _NO_LIMITS)
        if lim.max_nodes is not None:
            usable = min(usable, lim.max_nodes)
        max_n = min(job.spec.max_nodes, usable)
        if max_n < job.spec.min_nodes:
            continue
        model = models.get(job.job_id) or _UNKNOWN
        out.append(MalleableJob(
            job_id=job.job_id, min_nodes=job.spec.min_nodes, max_nodes=max_n,
            nodes=held[job.job_id], throughput=model.throughput,
            scale_up_s=model.scale_up_s, scale_down_s=model.scale_down_s,
            submit_order=job.seq, start_s=model.start_s, rate_noise=model.rate_noise,
            type_throughput=model.by_type, allowed_types=allowed_types(job.spec, gpu_types),
            rate_target=rate_target(job, now_s), excluded_nodes=excluded,
            spread_factor=model.spread_factor, user=job.user, account=lim.account,
            limits=tuple(lim.caps),
            weight=nice_weight(job.spec.nice)))
    return tuple(out)


def allocate(now_s: float, pool: Pool, jobs: tuple[MalleableJob, ...], policy: Policy,
             pinned: Mapping[str, tuple[str, ...]] | None = None,
             prices: Mapping[str, float] | None = None,
             caps: Mapping[str, int] | None = None,
             weights: Mapping[str, float] | None = None,
             account_weights: Mapping[str, float] | None = None,
             account_parents: Mapping[str, str] | None = None) -> Allocation:
    """The policy's targets for ``jobs``; ``pinned`` jobs keep what they hold, and their
    nodes are not offered to the others. ``prices``: per node type, per node-second
    (``allocator.node_prices``); ``caps``: Slurm's limits (``AllocationInput.caps``);
    ``weights``: users' share weights; ``account_weights``: accounts' (the fair-share
    tree: accounts first, then users), ``account_parents`` the accounts' own tree."""
    pinned = pinned or {}
    if not jobs:
        return Allocation(None, dict(pinned))
    taken = {n for ns in pinned.values() for n in ns}
    nodes = tuple(n for n in pool.free + pool.held + pool.leaving if n.name not in taken)
    plan = policy.decide(AllocationInput(now_s=now_s, nodes=nodes, jobs=jobs,
                                         prices=dict(prices or {}), caps=dict(caps or {}),
                                         user_weights=dict(weights or {}),
                                         account_weights=dict(account_weights or {}),
                                         account_parents=dict(account_parents or {})))
    offered = pool.offered - taken
    # zero-window leftovers are offered to keep the hole model honest, never to be used
    targets = {k: tuple(n for n in v if n in offered) for k, v in plan.assignments.items()}
    return Allocation(plan, {**targets, **pinned})

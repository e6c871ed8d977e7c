"""Where a policy's throughput curves come from in a simulation.

The registry entry of each policy (``core.policies.POLICIES[name].curves``) says
what it may see: ``"true"`` (the jobs file's measured curves), ``"learned"`` (the
Profiling Advisor's model, fed only with progress the jobs really made, as the
daemon feeds it) or ``"none"``. The simulator never hands a ``learned`` policy the
file's curves: :class:`LearnedCurves` only ever reads the advisor.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from malletrain.core.allocation.hetero import TypedProgress, TypeSpeeds, typed_models
from malletrain.core.model import ThroughputModel
from malletrain.sim.jobs import SimJob

log = logging.getLogger(__name__)


class CurveProvider(Protocol):
    """What a policy is told of each job. ``node_type``: the one type of the job's nodes on a
    cluster of several types (None: untyped, or a mix)."""

    def model(self, job: SimJob) -> tuple[ThroughputModel, float, float]:
        """(throughput model, scale_up_s, scale_down_s) the policy is told for ``job``."""
        ...

    def type_models(self, job: SimJob, types: Sequence[str]) -> dict[str, ThroughputModel]:
        """The policy's throughput model of ``job`` per node type (empty: not per type)."""
        ...

    def observe(self, job: SimJob, t_s: float, nodes: int, samples_total: float,
                node_type: str | None = None) -> None:
        """``job`` had made ``samples_total`` (net, cumulative) by ``t_s`` on ``nodes`` nodes."""
        ...

    def rescaled(self, job: SimJob, t_s: float, old_nodes: int, new_nodes: int,
                 old_type: str | None = None, new_type: str | None = None) -> None: ...

    def forget(self, job: SimJob) -> None: ...


class TrueCurves:
    """The measured curves and costs from the jobs file (FreeTrain, known-curves)."""

    def model(self, job: SimJob) -> tuple[ThroughputModel, float, float]:
        return job.true_model, job.scale_up_s, job.scale_down_s

    def type_models(self, job: SimJob, types: Sequence[str]) -> dict[str, ThroughputModel]:
        return job.true_models()

    def observe(self, job: SimJob, t_s: float, nodes: int, samples_total: float,
                node_type: str | None = None) -> None:
        return None

    def rescaled(self, job: SimJob, t_s: float, old_nodes: int, new_nodes: int,
                 old_type: str | None = None, new_type: str | None = None) -> None:
        return None

    def forget(self, job: SimJob) -> None:
        return None


class NoCurves(TrueCurves):
    """Nothing: for policies that decide without curves (equal share)."""

    #: Rescale costs a curve-free policy is told (it should not use them either).
    DEFAULT_COST_S = 0.0

    def model(self, job: SimJob) -> tuple[ThroughputModel, float, float]:
        return ThroughputModel(()), self.DEFAULT_COST_S, self.DEFAULT_COST_S

    def type_models(self, job: SimJob, types: Sequence[str]) -> dict[str, ThroughputModel]:
        return {}


def job_kind(name: str) -> str:
    """A job's kind for pooled profiles: its name without a trailing ``-<number>``.

    ``sia-imagenet-aws-007`` is of kind ``sia-imagenet-aws``: what the daemon would
    know from the submitted script; nothing about the curve itself.
    """
    head, sep, tail = name.rpartition("-")
    return head if sep and tail.isdigit() else name


class LearnedCurves:
    """The Profiling Advisor, fed what the jobs really did; never reads ``job.curve``.

    The only things of a job it passes on are its name (and kind, from the name),
    its node counts, the type of its nodes, the time and its net progress: the same as
    the daemon sees. On a cluster of several types each job is profiled per type, as
    ``<name>@<type>`` (pooled per ``<kind>@<type>``): its rates on one GPU model say
    little about another's.
    """

    def __init__(self, pool_kinds: bool = True) -> None:
        from malletrain.core.profiling.profiler import ProfilingAdvisor

        self.advisor = ProfilingAdvisor()
        self.pool_kinds = pool_kinds
        self._known: set[str] = set()
        self.speeds = TypeSpeeds()
        #: each typed profile sees only the progress made on its type
        self.progress = TypedProgress()

    def _key(self, job: SimJob, node_type: str | None) -> str:
        key = job.name if node_type is None else TypedProgress.key(job.name, node_type)
        if key not in self._known:
            self._known.add(key)
            kind = job_kind(job.name) if self.pool_kinds else None
            if kind is not None and node_type is not None:
                kind = f"{kind}@{node_type}"
            self.advisor.register(key, kind)
        return key

    def model(self, job: SimJob) -> tuple[ThroughputModel, float, float]:
        key = self._key(job, None)
        up, down = self.advisor.scale_costs(key)
        return self.advisor.answers(key).model, up, down

    def type_models(self, job: SimJob, types: Sequence[str]) -> dict[str, ThroughputModel]:
        return typed_models(self.advisor, self.speeds, job.name,
                            job_kind(job.name) if self.pool_kinds else None, types)

    def observe(self, job: SimJob, t_s: float, nodes: int, samples_total: float,
                node_type: str | None = None) -> None:
        typed = self.progress.observe(job.name, node_type, samples_total)
        if typed is None:
            self.advisor.observe(self._key(job, None), t_s, nodes, samples_total)
        else:
            self.advisor.observe(self._key(job, node_type), t_s, nodes, typed[1])

    def rescaled(self, job: SimJob, t_s: float, old_nodes: int, new_nodes: int,
                 old_type: str | None = None, new_type: str | None = None) -> None:
        if old_type == new_type:
            self.advisor.rescaled(self._key(job, old_type), t_s, old_nodes, new_nodes)
            return
        # a move between types: it stopped on one and started on the other
        self.advisor.rescaled(self._key(job, old_type), t_s, old_nodes, 0)
        self.advisor.rescaled(self._key(job, new_type), t_s, 0, new_nodes)

    def forget(self, job: SimJob) -> None:
        self.progress.forget(job.name)
        for key in [k for k in self._known if k == job.name or k.startswith(job.name + "@")]:
            self._known.discard(key)
            self.advisor.forget(key)


def provider_for(curves: str) -> CurveProvider:
    """The provider a policy's registry entry asks for."""
    if curves == "true":
        return TrueCurves()
    if curves == "none":
        return NoCurves()
    if curves == "learned":
        return LearnedCurves()
    raise ValueError(f"unknown curve source {curves!r}")

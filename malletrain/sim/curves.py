"""Where a policy's throughput curves come from in a simulation.

The registry entry of each policy (``core.policies.POLICIES[name].curves``) says
what it may see: ``"true"`` (the jobs file's measured curves), ``"learned"`` (the
Profiling Advisor's model, fed only with progress the jobs really made, as the
daemon feeds it) or ``"none"``. The simulator never hands a ``learned`` policy the
file's curves: :class:`LearnedCurves` only ever reads the advisor.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Protocol

from malletrain.core.model import ThroughputModel
from malletrain.sim.jobs import SimJob

log = logging.getLogger(__name__)


class CurveProvider(Protocol):
    def model(self, job: SimJob) -> tuple[ThroughputModel, float, float]:
        """(throughput model, scale_up_s, scale_down_s) the policy is told for ``job``."""
        ...

    def observe(self, job: SimJob, t_s: float, nodes: int, samples_total: float) -> None:
        """``job`` had made ``samples_total`` (net, cumulative) by ``t_s`` on ``nodes`` nodes."""
        ...

    def rescaled(self, job: SimJob, t_s: float, old_nodes: int, new_nodes: int) -> None: ...

    def forget(self, job: SimJob) -> None: ...


class TrueCurves:
    """The measured curves and costs from the jobs file (FreeTrain, known-curves)."""

    def model(self, job: SimJob) -> tuple[ThroughputModel, float, float]:
        return job.true_model, job.scale_up_s, job.scale_down_s

    def observe(self, job: SimJob, t_s: float, nodes: int, samples_total: float) -> None:
        return None

    def rescaled(self, job: SimJob, t_s: float, old_nodes: int, new_nodes: int) -> None:
        return None

    def forget(self, job: SimJob) -> None:
        return None


class NoCurves(TrueCurves):
    """Nothing: for policies that decide without curves (equal share)."""

    #: Rescale costs a curve-free policy is told (it should not use them either).
    DEFAULT_COST_S = 0.0

    def model(self, job: SimJob) -> tuple[ThroughputModel, float, float]:
        return ThroughputModel(()), self.DEFAULT_COST_S, self.DEFAULT_COST_S


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
    its node counts, the time and its net progress: the same as the daemon sees.
    """

    def __init__(self, pool_kinds: bool = True) -> None:
        from malletrain.core.profiler import ProfilingAdvisor

        self.advisor = ProfilingAdvisor()
        self.pool_kinds = pool_kinds
        self._known: set[str] = set()

    def _register(self, job: SimJob) -> None:
        if job.name not in self._known:
            self._known.add(job.name)
            self.advisor.register(job.name, job_kind(job.name) if self.pool_kinds else None)

    def model(self, job: SimJob) -> tuple[ThroughputModel, float, float]:
        self._register(job)
        up, down = self.advisor.scale_costs(job.name)
        # how far the curve is measured: the policy explores beyond it on free nodes only
        measured = max(self.advisor.measured_sizes(job.name), default=0)
        return replace(self.advisor.model(job.name), measured_max_nodes=measured), up, down

    def observe(self, job: SimJob, t_s: float, nodes: int, samples_total: float) -> None:
        self._register(job)
        self.advisor.observe(job.name, t_s, nodes, samples_total)

    def rescaled(self, job: SimJob, t_s: float, old_nodes: int, new_nodes: int) -> None:
        self._register(job)
        self.advisor.rescaled(job.name, t_s, old_nodes, new_nodes)

    def forget(self, job: SimJob) -> None:
        self._known.discard(job.name)
        self.advisor.forget(job.name)


def provider_for(curves: str) -> CurveProvider:
    """The provider a policy's registry entry asks for."""
    if curves == "true":
        return TrueCurves()
    if curves == "none":
        return NoCurves()
    if curves == "learned":
        return LearnedCurves()
    raise ValueError(f"unknown curve source {curves!r}")

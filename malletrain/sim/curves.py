"""Where a policy's throughput curves come from in a simulation.

The registry entry of each policy (``core.policies.POLICIES[name].curves``) says
what it may see: ``"true"`` (the jobs file's measured curves), ``"learned"`` (the
Profiling Advisor's model, fed only with progress the jobs really made, as the
daemon feeds it) or ``"none"``. The simulator never hands a ``learned`` policy the
file's curves: :class:`LearnedCurves` only ever reads the advisor.
"""

from __future__ import annotations

import logging
from typing import Protocol

from malletrain.core.model import ThroughputModel
from malletrain.sim.jobs import SimJob

log = logging.getLogger(__name__)


class CurveProvider(Protocol):
    def model(self, job: SimJob) -> tuple[ThroughputModel, float, float]:
        """(throughput model, scale_up_s, scale_down_s) the policy is told for ``job``."""
        ...

    def observe(
        self, job: SimJob, nodes: int, t0_s: float, t1_s: float, samples: float, changed_s: float
    ) -> None:
        """``job`` made ``samples`` on ``nodes`` nodes during [t0_s, t1_s]."""
        ...

    def rescaled(self, job: SimJob, old_nodes: int, new_nodes: int, now_s: float) -> None: ...

    def forget(self, job: SimJob) -> None: ...


class TrueCurves:
    """The measured curves and costs from the jobs file (FreeTrain, known-curves)."""

    def model(self, job: SimJob) -> tuple[ThroughputModel, float, float]:
        return job.true_model, job.scale_up_s, job.scale_down_s

    def observe(
        self, job: SimJob, nodes: int, t0_s: float, t1_s: float, samples: float, changed_s: float
    ) -> None:
        return None

    def rescaled(self, job: SimJob, old_nodes: int, new_nodes: int, now_s: float) -> None:
        return None

    def forget(self, job: SimJob) -> None:
        return None


class NoCurves(TrueCurves):
    """Nothing: for policies that decide without curves (equal share)."""

    #: Rescale costs a curve-free policy is told (it should not use them either).
    DEFAULT_COST_S = 0.0

    def model(self, job: SimJob) -> tuple[ThroughputModel, float, float]:
        return ThroughputModel(()), self.DEFAULT_COST_S, self.DEFAULT_COST_S


def provider_for(curves: str) -> CurveProvider:
    """The provider a policy's registry entry asks for."""
    if curves == "true":
        return TrueCurves()
    if curves == "none":
        return NoCurves()
    if curves == "learned":
        from malletrain.sim.learned import LearnedCurves

        return LearnedCurves()
    raise ValueError(f"unknown curve source {curves!r}")

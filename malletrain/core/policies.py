"""The policy registry: a name -> a factory of :class:`~malletrain.core.model.Policy`.

Callers (``malletrain simulate --policy NAME``, the daemon's settings) look a
policy up here. Each entry says where the policy's throughput curves come from,
because a policy never reads a jobs file itself; the caller fills
``MalleableJob.throughput``:

* ``curves="true"``: the caller passes the jobs' true (measured) curves;
* ``curves="learned"``: the caller passes ``ProfilingAdvisor.model(job_id)``
  (and ``ProfilingAdvisor.scale_costs``), learned online from progress reports;
* ``curves="none"``: the policy ignores the curves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from malletrain.core.model import Policy
from malletrain.core.options import CORE, LIVE, PRESETS, REPLAY, PolicyOptions

__all__ = ["CORE", "LIVE", "POLICIES", "PRESETS", "REPLAY", "PolicyOptions", "PolicySpec",
           "make_policy", "policy_names"]

CurveSource = Literal["true", "learned", "none"]


@dataclass(frozen=True)
class PolicySpec:
    name: str
    curves: CurveSource
    description: str
    factory: Callable[[PolicyOptions], Policy]


def _equal_share(opts: PolicyOptions) -> Policy:
    from malletrain.core.baselines import EqualShare

    return EqualShare()


def _no_loss_bound(opts: PolicyOptions) -> Policy:
    from malletrain.core.baselines import NoLossBound

    return NoLossBound()


def _malletrain(name: str) -> Callable[[PolicyOptions], Policy]:
    def factory(opts: PolicyOptions) -> Policy:
        from malletrain.core.allocation.allocator import malletrain_policy

        return malletrain_policy(opts, name=name)

    return factory


def _freetrain(opts: PolicyOptions) -> Policy:
    from malletrain.core.baselines import FreeTrain

    return FreeTrain(tfwd_s=opts.tfwd_s, time_limit_s=opts.milp_time_limit_s)


POLICIES: dict[str, PolicySpec] = {
    spec.name: spec
    for spec in (
        PolicySpec(
            "malletrain",
            "learned",
            "exact DP over node counts, per-node windows, curves learned online",
            _malletrain("malletrain"),
        ),
        PolicySpec(
            "malletrain-known-curves",
            "true",
            "malletrain's allocator given the true curves (an upper reference)",
            _malletrain("malletrain-known-curves"),
        ),
        PolicySpec(
            "freetrain",
            "true",
            "FreeTrain's per-event MILP (HiGHS), look-ahead Tfwd, given the true curves",
            _freetrain,
        ),
        PolicySpec(
            "equal-share",
            "none",
            "equal split over admitted jobs, clipped to [min, max], leftovers FCFS",
            _equal_share,
        ),
        PolicySpec(
            "no-loss-bound",
            "true",
            "evaluation reference: the highest summed throughput at every event, costs "
            "ignored (replay it with --no-rescale-cost); not a policy for a cluster",
            _no_loss_bound,
        ),
    )
}


def policy_names() -> tuple[str, ...]:
    return tuple(POLICIES)


def make_policy(name: str, options: PolicyOptions | None = None) -> Policy:
    """A fresh policy instance (policies may keep learned state, e.g. hole lengths)."""
    try:
        spec = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    return spec.factory(options or CORE)

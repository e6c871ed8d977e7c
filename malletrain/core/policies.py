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

CurveSource = Literal["true", "learned", "none"]


@dataclass(frozen=True)
class PolicyOptions:
    """Knobs a caller may set; each policy reads the ones that concern it."""

    #: FreeTrain's look-ahead (seconds): the value of one second of throughput.
    tfwd_s: float = 10.0
    #: malletrain's cap on any node's window (seconds): beyond it nothing is predictable.
    horizon_s: float = 1800.0
    #: Wall-clock limit for one MILP solve (FreeTrain).
    milp_time_limit_s: float = 10.0
    #: malletrain's fixed hysteresis on top of the one from measured rate noise (0 on
    #: exact replays; the daemon sets it, see malletrain.daemon.daemon.LIVE_POLICY).
    keep_margin: float = 0.0
    #: malletrain's hole-model prior floor (HoleLengthModel.prior_floor).
    hole_prior_floor: float = 0.0
    #: malletrain's horizon for windows estimated from idle age (no plan), capped by
    #: ``horizon_s``; None = ``horizon_s``. Replays set 300 s and the grouping below
    #: (malletrain.sim.cli_simulate.REPLAY_POLICY); the daemon keeps both off for now.
    estimate_horizon_s: float | None = None
    #: malletrain: unplanned nodes that turned idle within one slot of this many seconds
    #: share one reclaim event (0: off).
    reclaim_group_s: float = 0.0
    #: malletrain's finish-aware valuation (MalleTrainPolicy.finish_weight; 0: off; replays
    #: set 0.5) and the horizon within which a finish counts. Needs
    #: MalleableJob.remaining_samples (declared by the user) and AllocationInput.queued_jobs.
    finish_weight: float = 0.0
    finish_horizon_s: float = 24 * 3600.0


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
        from malletrain.core.allocator import malletrain_policy

        return malletrain_policy(
            name=name,
            horizon_s=opts.horizon_s,
            keep_margin=opts.keep_margin,
            hole_prior_floor=opts.hole_prior_floor,
            estimate_horizon_s=opts.estimate_horizon_s,
            reclaim_group_s=opts.reclaim_group_s,
            finish_weight=opts.finish_weight,
            finish_horizon_s=opts.finish_horizon_s,
        )

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
    return spec.factory(options or PolicyOptions())

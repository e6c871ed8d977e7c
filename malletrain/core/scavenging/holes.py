"""How long an idle node will stay idle, where the scheduler predicts nothing.

Slurm's backfill plan predicts a window for nodes that a pending job is planned
on; for every other idle node the only evidence is how long it has already been
idle. Idle holes are heavy-tailed (DESIGN §1: median 475 s, 40% under 5 min,
91% under 1 h), so the expected remaining idle time *grows* with the idle age:
a node idle for an hour is likely to stay idle much longer than one freed a
minute ago. :class:`HoleLengthModel` learns that distribution online and answers

* ``expected_remaining_s(age)`` = E[min(L - age, horizon) | L > age], the node's
  expected useful window within the allocator's horizon, and
* ``ends_within(age)`` = P(L - age < horizon | L > age), the chance that the node
  is reclaimed (and its job pays a scale-down) within the horizon.

The estimator is Kaplan-Meier over log-spaced bins: completed holes are events,
holes still open are right-censored at their current age (without censoring, the
long holes still running would be missed and the estimate biased short). A
lognormal prior fitted to the published Summit numbers stands in, with a small
weight, until real holes are seen. :class:`HoleTracker` turns the sequence of
idle-node lists a caller already has (one per decision) into hole observations,
so neither the daemon nor the simulator needs extra bookkeeping.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from malletrain.core.model import IdleNode

log = logging.getLogger(__name__)

#: Lognormal prior: median 475 s; sigma so that 40% of holes are under 300 s.
PRIOR_MEDIAN_S = 475.0
PRIOR_SIGMA = 1.8


def _lognormal_cdf(x: np.ndarray, median_s: float, sigma: float) -> np.ndarray:
    z = (np.log(np.maximum(x, 1e-9)) - math.log(median_s)) / (sigma * math.sqrt(2.0))
    erf = np.vectorize(math.erf, otypes=[float])
    return 0.5 * (1.0 + erf(z))


@dataclass
class HoleLengthModel:
    """Online hole-length distribution (Kaplan-Meier on log-spaced bins)."""

    #: Weight of the prior, in pseudo-holes.
    prior_weight: float = 20.0
    #: Share of the prior that no amount of data outweighs: the survival curve used is
    #: ``(1 - f) S_learned + f S_prior``. Without it a run of short holes (a few
    #: preemptions on a small cluster, a burst of short jobs) drove every young unplanned
    #: node to an expected remaining time below a start-up plus a scale-down with reclaim
    #: almost sure, and the policy stopped using idle nodes at all. With it, at least a
    #: fraction ``f`` of young holes is believed to be as long as the population's.
    #: Default off: on the Philly replay (minute-long holes are real there) ``f = 0.1``
    #: cost 3.6 % of the samples (more preemption losses); a long-idle node is valued by
    #: its age whatever the history, and the daemon's worthless-node failure came from a
    #: rescale-cost outlier (see the Profiling Advisor's ``max_cost_s``), not from here.
    prior_floor: float = 0.0
    #: Past this many counted holes, old counts are halved (the workload drifts).
    max_count: float = 20_000.0
    n_bins: int = 96
    min_s: float = 1.0
    max_s: float = 3.0e6
    edges_s: np.ndarray = field(init=False, repr=False)
    events: np.ndarray = field(init=False, repr=False)
    _prior: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.edges_s = np.concatenate(([0.0], np.geomspace(self.min_s, self.max_s, self.n_bins)))
        self.events = np.zeros(self.n_bins, dtype=float)
        prior = np.diff(_lognormal_cdf(self.edges_s, PRIOR_MEDIAN_S, PRIOR_SIGMA))
        prior[-1] += max(0.0, 1.0 - prior.sum())
        self._prior = prior

    # -- learning ---------------------------------------------------------------
    def observe(self, length_s: float) -> None:
        """One hole that ended after ``length_s`` seconds."""
        self.observe_many([length_s])

    def observe_many(self, lengths_s: Iterable[float]) -> None:
        arr = np.asarray([x for x in lengths_s if x >= 0 and math.isfinite(x)], dtype=float)
        if arr.size == 0:
            return
        idx = np.clip(np.searchsorted(self.edges_s, arr, side="right") - 1, 0, self.n_bins - 1)
        np.add.at(self.events, idx, 1.0)
        if self.events.sum() > self.max_count:
            self.events *= 0.5

    @property
    def observed(self) -> float:
        return float(self.events.sum())

    # -- answers ----------------------------------------------------------------
    def _survival(self, open_ages_s: np.ndarray | None) -> np.ndarray:
        """S at every bin edge (len n_bins + 1), censoring the open holes."""
        events = self.events + self.prior_weight * self._prior
        censored = np.zeros(self.n_bins, dtype=float)
        if open_ages_s is not None and open_ages_s.size:
            idx = np.clip(
                np.searchsorted(self.edges_s, open_ages_s, side="right") - 1, 0, self.n_bins - 1
            )
            np.add.at(censored, idx, 1.0)
        at_risk = np.cumsum((events + censored)[::-1])[::-1]
        hazard = np.divide(events, at_risk, out=np.zeros_like(events), where=at_risk > 0)
        surv = np.concatenate(([1.0], np.cumprod(1.0 - np.clip(hazard, 0.0, 1.0))))
        f = min(max(self.prior_floor, 0.0), 1.0)
        if f > 0:
            prior_surv = np.clip(np.concatenate(([1.0], 1.0 - np.cumsum(self._prior))), 0.0, 1.0)
            surv = (1.0 - f) * surv + f * prior_surv
        return np.maximum(surv, 1e-12)

    def expected_remaining_s(
        self,
        ages_s: Sequence[float] | np.ndarray,
        horizon_s: float | np.ndarray,
        open_ages_s: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(E[min(L - a, H) | L > a], P(L - a < H | L > a)) for each age ``a``.

        ``horizon_s``: one H for all, or one per age.

        ``open_ages_s``: ages of the holes open now (censored observations); by
        default ``ages_s`` itself.
        """
        ages = np.maximum(np.asarray(ages_s, dtype=float), 0.0)
        if ages.size == 0:
            return np.zeros(0), np.zeros(0)
        surv = self._survival(ages if open_ages_s is None else open_ages_s)
        edges = self.edges_s
        # integral of S from 0 to each edge (trapezoid), then linear in between; past the
        # last edge S stays at its last value (the last bin counts every longer hole): a
        # node idle for longer than ``max_s`` is as likely to stay as one just under it,
        # not certain to end now (it was valued at 0 and its job stopped)
        integ = np.concatenate(([0.0], np.cumsum(np.diff(edges) * (surv[1:] + surv[:-1]) / 2)))

        def integral(x: np.ndarray) -> np.ndarray:
            return np.interp(x, edges, integ) + np.maximum(x - edges[-1], 0.0) * surv[-1]

        s_a = np.interp(ages, edges, surv)
        end = ages + horizon_s
        s_end = np.interp(end, edges, surv)
        area = integral(end) - integral(ages)
        remaining = np.clip(area / s_a, 0.0, horizon_s)
        p_end = np.clip(1.0 - s_end / s_a, 0.0, 1.0)
        return remaining, p_end

    # -- persistence ------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "min_s": self.min_s,
            "max_s": self.max_s,
            "n_bins": self.n_bins,
            "events": self.events.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HoleLengthModel:
        """Parse :meth:`to_dict` output; ValueError naming the bad field."""
        try:
            model = cls(
                n_bins=int(data["n_bins"]), min_s=float(data["min_s"]), max_s=float(data["max_s"])
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"hole model: bad or missing n_bins/min_s/max_s ({exc})") from None
        events = np.asarray(data["events"], dtype=float)
        if events.shape != model.events.shape or (events < 0).any():
            raise ValueError("hole model: 'events' does not match 'n_bins' or is negative")
        model.events = events
        return model


@dataclass
class HoleTracker:
    """Turns successive idle-node lists into completed-hole observations.

    A node that was offered at the previous decision and is missing now was
    taken back by Slurm: its hole lasted from ``now - idle_age`` (first seen) to
    ``now``. Callers that see every node event (the simulator, the daemon's
    event-driven loop) therefore observe exact hole lengths.
    """

    model: HoleLengthModel = field(default_factory=HoleLengthModel)
    _start_s: dict[str, float] = field(default_factory=dict, repr=False)

    def update(self, now_s: float, nodes: Sequence[IdleNode]) -> None:
        current: dict[str, float] = {}
        for n in nodes:
            start = self._start_s.get(n.name)
            if start is None:
                start = now_s - max(0.0, n.idle_age_s)
            current[n.name] = start
        ended = [now_s - s for name, s in self._start_s.items() if name not in current]
        if ended:
            self.model.observe_many(ended)
        self._start_s = current

"""Finish-aware valuation: with a queue, a job's finish admits the next one.

Used by :class:`~malletrain.core.allocation.allocator.MalleTrainPolicy` when ``finish_weight`` > 0
(the simulator's replays; docs/evaluation.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from malletrain.core.allocation.valuation import rates_upto
from malletrain.core.model import AllocationInput


def slot_rate(inp: AllocationInput, counts: np.ndarray) -> float:
    """``sigma``: what one more admitted job would add per second, given a plan's counts.

    The queued job's curve is unknown until it runs, so it is taken as the mean curve
    ``rbar`` of the admitted jobs; it would take ``n`` nodes at the plan's node price
    ``lambda`` (0 if the plan leaves nodes free, else the smallest last-node marginal
    rate among the jobs holding nodes): ``sigma = max_n rbar(n) - lambda n``. Where
    nodes are scarce a slot is worth little (the newcomer only takes nodes from the
    others); where they are left free it is worth a whole job's rate.
    """
    if not inp.jobs:
        return 0.0
    hi = max(j.max_nodes for j in inp.jobs)
    curves = np.stack([rates_upto(j.throughput, hi) for j in inp.jobs])
    lam = 0.0
    if int(counts.sum()) >= len(inp.nodes):
        marg = [
            float(curves[i, n] - curves[i, n - 1]) for i, n in enumerate(counts.tolist()) if n
        ]
        lam = max(0.0, min(marg, default=0.0))
    rbar = curves.mean(axis=0)
    return float(np.max(rbar - lam * np.arange(hi + 1)))


def finish_weights(inp: AllocationInput, sigma: float, weight: float, horizon_s: float,
                   cap: float) -> np.ndarray:
    """``beta_j`` per job of ``inp.jobs``: the extra weight of its samples (0 for most).

    Why: with a concurrency limit and a queue, a job's finish admits the next job,
    which adds ``sigma`` samples/s (:func:`slot_rate`). A job with ``R`` samples left
    at rate ``r`` finishes in ``R / r`` s; each sample it makes now brings that finish,
    and so the next admission, ``1 / r`` s earlier, worth ``sigma / r`` samples. So a
    sample of job j is worth ``1 + finish_weight x sigma / r_j`` (``finish_weight``
    < 1 discounts the guess; capped at ``finish_weight_cap``). Only jobs whose finish
    is within ``finish_horizon_s`` count: beyond it the allocation the finish time
    assumes will have been re-decided many times, and the slot's worth is discounted to
    nothing. The value table is linear in a job's rates (work and losses alike), so
    weighting its row maximises the weighted samples exactly. Needs
    ``MalleableJob.remaining_samples`` (declared by the user, not learned); jobs
    without it get 0, and so does every job when ``inp.queued_jobs == 0`` (a finish
    admits nobody). Measured in docs/evaluation.md ("Finish-aware valuation").
    """
    beta = np.zeros(len(inp.jobs))
    if weight <= 0 or sigma <= 0 or inp.queued_jobs == 0:
        return beta
    for i, job in enumerate(inp.jobs):
        left = job.remaining_samples
        r = job.throughput.rate(len(job.nodes)) if job.nodes else 0.0
        if left is None or r <= 0 or left / r > horizon_s:
            continue
        beta[i] = min(cap, weight * sigma / r)
    return beta


@dataclass
class SlotOutlook:
    """The worth of an admission slot over time: ``sigma`` (:func:`slot_rate`) averaged
    over about ``memory_s`` (an exponential average weighted by the time each value held).

    ``sigma`` prices a slot at this decision's node price: nearly nothing while nodes are
    scarce, a whole job's rate while they are left free. A finish brought forward now
    admits the next job at some later time, when the machine may be in either state, so
    the finish-aware valuation uses the larger of now's ``sigma`` and this average.
    """

    memory_s: float
    mean: float = 0.0
    _held: float = 0.0
    _since_s: float | None = None

    def update(self, now_s: float, sigma: float) -> float:
        """Record ``sigma`` decided at ``now_s``; the slot's worth to use now."""
        if self._since_s is None:
            self.mean, self._since_s = sigma, now_s
        elif now_s > self._since_s:
            keep = math.exp(-(now_s - self._since_s) / self.memory_s)
            self.mean = keep * self.mean + (1.0 - keep) * self._held
            self._since_s = now_s
        self._held = sigma
        return max(sigma, self.mean)

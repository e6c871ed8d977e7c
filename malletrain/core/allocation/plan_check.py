"""A plan's value on the nodes it really hands out, beside the best plan that shrinks nobody.

Why: the count problem (:mod:`.knapsack`) values each job's growth on the free pool's best
windows, as if every growing job would get them: only the number of nodes is shared, not
the windows. Where the free pool is small and many jobs could grow onto nodes that others
give up, every grower counts on the same few long windows, and all but the first get
another job's shorter one instead. Seen in ``benchmarks/load.py`` (5,000 nodes, 500 jobs,
about 460 idle nodes, as many jobs as nodes): two new free nodes made a plan shrink 134
jobs for 77 others (+10 % as the table valued it, less than keeping as really placed),
and the next tick, valuing what the growers really got, moved most of them back: the
allocation swung between two such plans, 100-200 slot actions a tick.

So a plan that shrinks a running job is valued again on the nodes each job really gets
(its growth: the nodes the placement step hands it), and so is the best plan in which no
running job shrinks (its growth is the free pool's alone, so no node is counted twice);
the one worth more wins (the plan as solved on a tie). A plan that shrinks nobody
is taken as it is. Both values use the same table function as the plan itself (costs,
hysteresis, exploration, prices, finish weights).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from malletrain.core.allocation.knapsack import solve_counts
from malletrain.core.allocation.placement import assign_nodes
from malletrain.core.allocation.valuation import NodeOffer
from malletrain.core.model import AllocationInput

log = logging.getLogger(__name__)

#: values an offer as the plan's own table does: V[job, count]
TableOf = Callable[[NodeOffer], np.ndarray]
#: a count the no-shrink plan must not choose (finite: the DP needs count 0 allowed)
_FORBIDDEN = -1e30


@dataclass(frozen=True)
class Solution:
    """The count problem's answer and what it was solved on (``offer`` None: no jobs)."""

    counts: dict[str, int]
    objective: float
    w: np.ndarray
    p: np.ndarray
    key: np.ndarray
    values: np.ndarray
    offer: NodeOffer | None
    table: TableOf

    def growth_order(self, inp: AllocationInput, counts: Mapping[str, int]) -> list[str]:
        """Growing jobs, the largest value per new node first (it picks from the pool first)."""
        gain: list[tuple[float, int, str]] = []
        for j, job in enumerate(inp.jobs):
            n = counts[job.job_id]
            if self.offer is not None and n > self.offer.own_idx[j].size:
                gain.append((-float(self.values[j, n]) / n, job.submit_order, job.job_id))
        return [j for _, _, j in sorted(gain)]

    def shrinks(self, inp: AllocationInput) -> bool:
        """Whether the solved counts put a running job below its present size."""
        return self.offer is not None and any(
            self.counts[job.job_id] < self.offer.own_idx[j].size
            for j, job in enumerate(inp.jobs))

    def place(self, inp: AllocationInput, counts: Mapping[str, int]
              ) -> dict[str, tuple[str, ...]]:
        windows = {n.name: float(self.w[i]) for i, n in enumerate(inp.nodes)}
        return assign_nodes(inp, counts, windows_s=windows,
                            growth_order=self.growth_order(inp, counts))


def weighted(table: TableOf, factor: np.ndarray) -> TableOf:
    """``table`` with each job's row multiplied by ``factor[job]`` (finish weights)."""
    return lambda offer: table(offer) * factor[:, None]


def realised_value(inp: AllocationInput, sol: Solution,
                   assignments: Mapping[str, tuple[str, ...]]) -> float:
    """The plan's value with each job's growth on the nodes it was really given."""
    assert sol.offer is not None
    index = {n.name: i for i, n in enumerate(inp.nodes)}
    new_idx = []
    for j, job in enumerate(inp.jobs):
        own = set(sol.offer.own_idx[j].tolist())
        idx = np.array([index[n] for n in assignments.get(job.job_id, ())
                        if n in index and index[n] not in own], dtype=np.int64)
        new_idx.append(idx[np.argsort(-sol.w[idx], kind="stable")])
    width = max((i.size for i in new_idx), default=0)
    grow_w = np.zeros((len(inp.jobs), width))
    grow_p = np.zeros_like(grow_w)
    grow_g = np.full_like(grow_w, np.nan)
    for j, idx in enumerate(new_idx):
        grow_w[j, : idx.size] = sol.w[idx]
        grow_p[j, : idx.size] = sol.p[idx]
        grow_g[j, : idx.size] = sol.key[idx]
    real = replace(sol.offer, grow_w=grow_w, grow_p=grow_p, grow_g=grow_g,
                   grow_n=np.array([i.size for i in new_idx], dtype=np.int64))
    values = sol.table(real)
    total = 0.0
    for j, job in enumerate(inp.jobs):
        n = len(assignments.get(job.job_id, ()))
        total += float(values[j, n]) if n < values.shape[1] else -np.inf
    return total


def no_shrink_counts(inp: AllocationInput, sol: Solution) -> tuple[dict[str, int], float]:
    """The best counts in which no running job ends below its present size."""
    assert sol.offer is not None
    values = sol.values.copy()
    for j, idx in enumerate(sol.offer.own_idx):
        c = idx.size
        if c and np.isfinite(values[j, c:]).any():  # else it cannot keep its size anyway
            values[j, :c] = _FORBIDDEN
    arr, objective = solve_counts(values, len(inp.nodes))
    return {job.job_id: int(n) for job, n in zip(inp.jobs, arr, strict=True)}, objective


def _moves_across_users(inp: AllocationInput, planned: Mapping[str, int],
                        kept: Mapping[str, int]) -> bool:
    """Whether the no-shrink plan gives one user more nodes and another fewer than the plan
    (whose shares :mod:`.fairness` divided): keeping would undo a fair division."""
    delta: dict[str, int] = {}
    for job in inp.jobs:
        delta[job.user] = delta.get(job.user, 0) + kept[job.job_id] - planned[job.job_id]
    return any(d > 0 for d in delta.values()) and any(d < 0 for d in delta.values())


def _over_caps(inp: AllocationInput, counts: Mapping[str, int]) -> bool:
    """Whether ``counts`` gives the jobs under some limit more than its cap (Slurm's limits,
    ``AllocationInput.caps``): keeping a job's size never outranks them."""
    if not inp.caps:
        return False
    used: dict[str, int] = {}
    for job in inp.jobs:
        for key in job.limits:
            used[key] = used.get(key, 0) + counts[job.job_id]
    return any(n > inp.caps[k] for k, n in used.items() if k in inp.caps)


def better_plan(inp: AllocationInput, sol: Solution,
                assignments: dict[str, tuple[str, ...]], fair: bool = False
                ) -> tuple[dict[str, tuple[str, ...]], float]:
    """``assignments`` (which shrink a running job) or the best plan that shrinks nobody,
    whichever is worth more on the nodes really handed out: (assignments, objective)."""
    counts, objective = no_shrink_counts(inp, sol)
    if objective <= _FORBIDDEN / 2:  # cannot happen while keeping is feasible; be safe
        return assignments, sol.objective
    if (fair and _moves_across_users(inp, sol.counts, counts)) or _over_caps(inp, counts):
        return assignments, sol.objective  # users' fair shares come first (.fairness)
    kept = sol.place(inp, counts)
    planned_value = realised_value(inp, sol, assignments)
    kept_value = realised_value(inp, sol, kept)
    if kept_value > planned_value:
        log.debug("plan check: shrinking nobody (%.6g) beats the plan that shrinks (%.6g "
                  "as placed, %.6g as valued)", kept_value, planned_value, sol.objective)
        return kept, objective
    return assignments, sol.objective

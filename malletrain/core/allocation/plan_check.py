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

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from malletrain.core.allocation.knapsack import solve_many
from malletrain.core.allocation.placement import assign_positions
from malletrain.core.allocation.valuation import NodeOffer
from malletrain.core.model import AllocationInput

log = logging.getLogger(__name__)

#: values an offer as the plan's own table does: V[job, count] for the jobs ``rows`` (indices
#: into ``inp.jobs``, the offer's rows in that order; None: every job)
TableOf = Callable[[NodeOffer, "np.ndarray | None"], np.ndarray]
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

    def place(self, inp: AllocationInput, counts: Mapping[str, int]) -> dict[str, list[int]]:
        """The nodes of ``counts``: each job's node positions in ``inp.nodes``."""
        return assign_positions(inp, counts, window_array=self.w,
                                growth_order=self.growth_order(inp, counts))


def weighted(table: TableOf, factor: np.ndarray) -> TableOf:
    """``table`` with each job's row multiplied by ``factor[job]`` (finish weights)."""
    return lambda offer, rows: table(offer, rows) * (factor if rows is None
                                                     else factor[rows])[:, None]


def realised_value(inp: AllocationInput, sol: Solution,
                   assignments: Mapping[str, Sequence[int]]) -> float:
    """The plan's value with each job's growth on the nodes it was really given (each job's
    node positions in ``inp.nodes``, as :meth:`Solution.place` gives them)."""
    return realised_values(inp, sol, [assignments])[0]


def realised_values(inp: AllocationInput, sol: Solution,
                    plans: Sequence[Mapping[str, Sequence[int]]]) -> list[float]:
    """:func:`realised_value` of each plan, the growers of all of them in one table.

    A job at or below its present size is worth what the solved table says (its value
    there depends on its own nodes only), so only the growing jobs are valued again.
    """
    assert sol.offer is not None
    own_n = np.array([idx.size for idx in sol.offer.own_idx], dtype=np.int64)
    totals: list[float] = []
    rows: list[np.ndarray] = []  # each plan's growing jobs
    got_ns: list[np.ndarray] = []  # their counts in it
    pairs: list[tuple[np.ndarray, np.ndarray]] = []  # their (row, new node) pairs
    for plan in plans:
        got_n = np.array([len(plan.get(job.job_id, ())) for job in inp.jobs], dtype=np.int64)
        keeping = np.flatnonzero(got_n <= own_n)
        totals.append(float(sol.values[keeping, got_n[keeping]].sum()))
        grow = np.flatnonzero(got_n > own_n)
        pairs.append(_growth_nodes(inp, sol, plan, grow, sum(r.size for r in rows)))
        rows.append(grow)
        got_ns.append(got_n[grow])
    every = np.concatenate(rows)
    if not every.size:
        return totals
    row_of, node = (np.concatenate(x) for x in zip(*pairs, strict=True))
    order = np.lexsort((-sol.w[node], row_of))  # by row, then longest window first
    row_of, node = row_of[order], node[order]
    grow_n = np.bincount(row_of, minlength=every.size)
    col = np.arange(row_of.size) - np.repeat(np.cumsum(grow_n) - grow_n, grow_n)
    width = int(grow_n.max(initial=0))
    grow_w = np.zeros((every.size, width))
    grow_p = np.zeros_like(grow_w)
    grow_g = np.full_like(grow_w, np.nan)
    grow_w[row_of, col] = sol.w[node]
    grow_p[row_of, col] = sol.p[node]
    grow_g[row_of, col] = sol.key[node]
    real = replace(sol.offer.select(every.tolist()), grow_w=grow_w, grow_p=grow_p,
                   grow_g=grow_g, grow_n=grow_n, whole_growth_only=True)
    values = sol.table(real, every)
    n = np.concatenate(got_ns)
    if not (n < values.shape[1]).all():
        values = np.pad(values, ((0, 0), (0, int(n.max()) + 1 - values.shape[1])),
                        constant_values=-np.inf)
    got = values[np.arange(every.size), n]
    cuts = np.cumsum([r.size for r in rows])[:-1]
    return [total + float(part.sum()) if part.size else total
            for total, part in zip(totals, np.split(got, cuts), strict=True)]


def _growth_nodes(inp: AllocationInput, sol: Solution, plan: Mapping[str, Sequence[int]],
                  grow: np.ndarray, first_row: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, node) of every node the growing jobs ``grow`` get in ``plan`` that they do not
    hold now, rows numbered from ``first_row``."""
    assert sol.offer is not None
    holder = np.full(len(inp.nodes), -1, dtype=np.int64)
    for j in grow.tolist():
        holder[sol.offer.own_idx[j]] = j
    got = [plan[inp.jobs[j].job_id] for j in grow.tolist()]
    row_of = np.repeat(np.arange(grow.size), [len(x) for x in got])
    node = np.fromiter(itertools.chain.from_iterable(got), dtype=np.int64, count=row_of.size)
    new = holder[node] != grow[row_of]
    return row_of[new] + first_row, node[new]


def keeps_size(values: np.ndarray, held: np.ndarray) -> np.ndarray:
    """Per job: whether it runs and may keep its size or grow (a count at or above the nodes
    it ``held`` is allowed in ``values``): the jobs the no-shrink plan holds at their size."""
    at_least = np.arange(values.shape[1])[None, :] >= held[:, None]
    return (held > 0) & (np.isfinite(values) & at_least).any(axis=1)


def no_shrink_counts(inp: AllocationInput, sol: Solution, by_user: bool = False
                     ) -> tuple[dict[str, int], float]:
    """The best counts in which no running job ends below its present size; ``by_user``:
    each user's jobs within the nodes the plan gives that user (its fair part, as
    :mod:`.fairness` divided it), so keeping never moves nodes from one user to another.

    A job that keeps its size holds its ``c`` nodes whatever else happens, so it is solved as
    a problem on the nodes left: its row shifted by ``c`` (count 0 = keep exactly) and the
    capacity less ``c``; the same optimum as forbidding counts below ``c``, on a smaller
    table (half the nodes are held in a busy pool). The objective is ``_FORBIDDEN`` or less
    where keeping does not fit (a user's part below what its jobs hold).
    """
    assert sol.offer is not None
    held = np.array([idx.size for idx in sol.offer.own_idx], dtype=np.int64)
    width = sol.values.shape[1]
    fixed = np.where(keeps_size(sol.values, held), held, 0)
    cols = np.arange(width)[None, :] + fixed[:, None]
    values = np.take_along_axis(sol.values, np.minimum(cols, width - 1), axis=1)
    values[cols >= width] = -np.inf
    values[:, 0] = np.where(np.isfinite(values[:, 0]), values[:, 0], _FORBIDDEN)
    groups: dict[str, list[int]] = {}
    for j, job in enumerate(inp.jobs):
        groups.setdefault(job.user if by_user else "", []).append(j)
    planned = np.array([sol.counts[job.job_id] for job in inp.jobs], dtype=np.int64)
    parts = [np.array(members, dtype=np.int64) for members in groups.values()]
    # each group's nodes left beside the sizes it keeps: checked for all before any DP
    left = [(int(planned[idx].sum()) if by_user else len(inp.nodes)) - int(fixed[idx].sum())
            for idx in parts]
    if min(left, default=0) < 0:
        return {}, _FORBIDDEN
    counts = np.zeros(len(inp.jobs), dtype=np.int64)
    objective = 0.0
    solved = solve_many([(values[idx], n) for idx, n in zip(parts, left, strict=True)])
    for idx, (arr, part) in zip(parts, solved, strict=True):
        counts[idx] = arr + fixed[idx]
        objective += part
    return {job.job_id: int(n) for job, n in zip(inp.jobs, counts, strict=True)}, objective


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
                assignments: dict[str, list[int]], fair: bool = False
                ) -> tuple[dict[str, list[int]], float]:
    """``assignments`` (which shrink a running job; node positions, as :meth:`Solution.place`
    gives them) or the best plan that shrinks nobody (``fair``: within each user's part of
    the plan), whichever is worth more on the nodes really handed out: (assignments,
    objective)."""
    by_user = fair and len({job.user for job in inp.jobs}) > 1
    counts, objective = no_shrink_counts(inp, sol, by_user=by_user)
    if objective <= _FORBIDDEN / 2 or _over_caps(inp, counts):
        # keeping does not fit in some user's fair part, or passes Slurm's limits: users'
        # shares and limits come first (.fairness)
        return assignments, sol.objective
    kept = sol.place(inp, counts)
    planned_value, kept_value = realised_values(inp, sol, [assignments, kept])
    if kept_value > planned_value:
        log.debug("plan check: shrinking nobody (%.6g) beats the plan that shrinks (%.6g "
                  "as placed, %.6g as valued)", kept_value, planned_value, sol.objective)
        return kept, objective
    return assignments, sol.objective

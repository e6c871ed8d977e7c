"""The DP's shortcuts answer exactly as the full DP: the scarce-node span (``knapsack._solve``'s
floor) and small problems solved side by side (``solve_many``).

The answer's ties follow the first optimum of the final row (the plan that leaves the most
nodes unused among the best), and the allocator's replays depend on those ties, so the
counts must be the same, not just the objective: integer values make ties common here.
"""

from __future__ import annotations

import numpy as np
import pytest

from malletrain.core.allocation import knapsack
from malletrain.core.allocation.knapsack import solve_counts, solve_many


def table(rng: np.random.Generator, jobs: int, width: int, integer: bool) -> np.ndarray:
    """A value table like the allocator's: count 0 allowed, sizes from a minimum, some
    counts forbidden, values rising then flat or falling (integers: many ties)."""
    values = np.full((jobs, width), -np.inf)
    values[:, 0] = 0.0
    for j in range(jobs):
        lo, hi = sorted(rng.integers(1, width, size=2).tolist())
        gain = rng.integers(0, 5, size=hi - lo + 1) if integer else rng.random(hi - lo + 1)
        values[j, lo : hi + 1] = np.cumsum(gain) - (rng.integers(0, 3) if integer else 0.5)
    return values


@pytest.mark.parametrize("seed", range(40))
def test_the_scarce_span_gives_the_full_dps_counts(seed: int) -> None:
    rng = np.random.default_rng(seed)
    integer = seed % 2 == 0
    values = table(rng, int(rng.integers(64, 160)), int(rng.integers(3, 20)), integer)
    _, _, largest = knapsack._useful_options(values)
    total = int(largest.sum())
    for capacity in (total // 4, total // 2, total - 1, total // 2 + 3):
        counts, objective = solve_counts(values, capacity)
        full = knapsack._solve(values, *knapsack._useful_options(values),
                               min(capacity, total), 0)
        assert full is not None
        assert counts.tolist() == full[0].tolist()
        assert objective == full[1]
        assert counts.sum() <= capacity


def test_a_plan_that_leaves_nodes_unused_is_solved_again_in_full() -> None:
    """Jobs that run at 30 nodes or not at all on 329 nodes: the best plan runs ten and
    leaves 29 nodes unused, below the floor, so the span alone cannot find its first
    optimum; the answer is the full DP's."""
    values = np.full((100, 31), -np.inf)
    values[:, 0] = 0.0
    values[:, 30] = 1.0 + np.arange(100) % 3
    capacity = 329
    useful = knapsack._useful_options(values)
    assert knapsack._solve(values, *useful, capacity, capacity - capacity // 16) is None
    counts, objective = solve_counts(values, capacity)
    full = knapsack._solve(values, *useful, capacity, 0)
    assert full is not None and counts.tolist() == full[0].tolist()
    assert objective == 3.0 * 10  # ten jobs of the best kind (value 3)
    assert counts.sum() == 300


@pytest.mark.parametrize("seed", range(20))
def test_problems_side_by_side_give_each_ones_counts(seed: int) -> None:
    """Users' parts: many problems of a few jobs, of different sizes, widths and capacities
    (some above what their jobs can use, some 0), one of them large."""
    rng = np.random.default_rng(1000 + seed)
    problems = []
    for _ in range(int(rng.integers(1, 30))):
        values = table(rng, int(rng.integers(1, 12)), int(rng.integers(2, 34)), seed % 2 == 0)
        _, _, largest = knapsack._useful_options(values)
        problems.append((values, int(rng.integers(0, int(largest.sum()) + 8))))
    problems.append((table(rng, 70, 9, True), 150))
    for (values, capacity), (counts, objective) in zip(problems, solve_many(problems),
                                                       strict=True):
        want_counts, want = solve_counts(values, capacity)
        assert counts.tolist() == want_counts.tolist()
        assert objective == want

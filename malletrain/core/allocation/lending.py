"""Lending a user's part: which nodes of a fair plan another user's jobs gain far more from.

Off in every preset (``fair_share_lend_factor`` 0): on RICC's users it bought throughput only
with Jain's index of users' work below 0.95 (docs/allocator-measured.md). :func:`lend` finds
the nodes; :func:`.fairness.lend_evenly` divides them among the other users. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from malletrain.core.allocation.knapsack import solve_counts
from malletrain.core.allocation.shares import Unit


def unit_floor(values: np.ndarray, counts: np.ndarray) -> int:
    """The nodes a unit keeps whatever it lends: the smallest size at which one of the jobs
    its fair plan ``counts`` runs is worth more than at 0 nodes (``values``), so that its
    best plan there still runs a job: a user whose part fits a job's minimum and whose start
    pays gets nodes (the bound of docs/allocator.md holds whatever is lent)."""
    floor = int(counts.sum())
    for j in np.flatnonzero(counts).tolist():
        gains = np.flatnonzero(values[j, 1:int(counts[j]) + 1] > values[j, 0])
        if gains.size:
            floor = min(floor, int(gains[0]) + 1)
    return floor


def lend(values: np.ndarray, units: Mapping[Unit, Sequence[int]], counts: np.ndarray,
         capacity: int, factor: float,
         solved: dict[tuple[Unit, int], tuple[np.ndarray, float]]) -> np.ndarray:
    """Which nodes of the fair plan ``counts`` are worth lending: each unit's jobs are sized
    on its :func:`unit_floor` alone (its own best plan there), then every other node goes
    to one count problem over all jobs' sizes above their floor sizes, in which a job's own
    nodes up to its fair size count ``factor`` times. So a node of a user's part moves to
    another user's job only where that job gains more than ``factor`` times what the owner's
    jobs lose (rescale costs included): a part is lent only where its owner's marginal value
    per node is far below the others'. The counts of that problem (the caller keeps the
    lenders' and divides the rest fairly again)."""
    base = np.zeros_like(counts)
    for u, idx in units.items():
        key = (u, unit_floor(values[idx], counts[idx]))
        if key not in solved:
            solved[key] = solve_counts(values[idx], key[1])
        base[idx] = solved[key][0]
    width = values.shape[1]
    rows = np.arange(values.shape[0])[:, None]
    cols = np.arange(width)[None, :] + base[:, None]
    shifted = np.where(cols < width, values[rows, np.minimum(cols, width - 1)], -np.inf)
    if factor > 1.0:
        own = np.minimum(np.minimum(cols, np.maximum(counts, base)[:, None]), width - 1)
        shifted += (factor - 1.0) * (values[rows, own] - values[rows, base[:, None]])
    extra, _ = solve_counts(shifted, capacity - int(base.sum()))
    return base + extra

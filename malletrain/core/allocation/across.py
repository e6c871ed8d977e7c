"""Nodes across users by what they add to each job, relative to its own rate. Pure.

* :func:`rest_by_value`: the nodes past every user's part for its jobs' useful sizes
  (:func:`.fairness.useful_sizes`), one count problem over every job's nodes past its plan;
* lending a user's part (off in every preset, ``fair_share_lend_factor`` 0: on RICC's users
  it bought throughput only with Jain's index of users' work below 0.95,
  docs/allocator-measured.md): :func:`lend` finds which nodes of a fair plan another user's
  jobs gain far more from; :func:`.fairness.lend_evenly` divides them among the other users.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from malletrain.core.allocation.knapsack import solve_counts
from malletrain.core.allocation.shares import Unit
from malletrain.core.model import MalleableJob


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


def rest_by_value(units: Mapping[Unit, list[int]], wants: Mapping[Unit, int],
                  rows_of: Mapping[Unit, np.ndarray], capacity: int,
                  scale: np.ndarray | None,
                  plan: tuple[np.ndarray, dict[Unit, float]]) -> None:
    """The nodes no unit took in the rounds, to the jobs they add the most to: one count
    problem over every job's nodes past its plan, up to its unit's ``wants`` (its demand held
    to Slurm's caps), each job's row in its rate per node at its minimum (``scale``: what a
    node adds relative to the job's own speed, so no job's reported rate buys one); ``plan``
    (counts, each unit's objective) updated in place; ``rows_of``: each unit's rows as the
    rounds sized it.

    After the rounds every user's part for its jobs' useful sizes is met, or no node is left:
    the rest takes nothing from anyone's part. Divided equally instead, a VC whose one job
    adds half a node's worth per node past 4 took as much of it as a VC of a dozen jobs
    (Philly days 60-63 under ``REPLAY``: fairness cost 11 % of the work). It also gives back
    what a unit gave up in the rounds where keeping is worth more: a running job's row peaks
    at the size it holds and may be worth less at every size of its part than at 0 (a user
    holding 17 nodes with a part of 5, all back to Slurm within a second, stopped, and its 17
    nodes stayed idle though nobody else wanted them: RICC day 31, issue 47).

    The rows are the rounds' own: a unit explores (values a size past its measured ones as
    a guess, :func:`.fairness._unit_rows`) only onto the free pool and its part, never onto
    the rest, which holds other users' nodes past their useful sizes. Explored onto them, one
    job's guess at 7 nodes took a measured job's second node across users, and back again a
    tick later (the dev cluster's ``test_slurm_limits.py``)."""
    counts, objective = plan
    took = {u: int(counts[idx].sum()) for u, idx in units.items()}
    left = capacity - sum(took.values())
    more = {u: min(wants[u] - took[u], left) for u in units if wants[u] > took[u]}
    if left <= 0 or not more:
        return
    jobs = [(u, k, j) for u in more for k, j in enumerate(units[u])]
    ids = np.array([j for _, _, j in jobs])
    table = _gains(np.stack([rows_of[u][k] for u, k, _ in jobs]), counts[ids],
                   np.array([more[u] for u, _, _ in jobs]))
    if scale is not None:
        table /= scale[ids][:, None]
    extra = np.argmax(table, axis=1)  # (each job's best, the smallest count of it)
    if int(extra.sum()) > left:  # (the jobs a node adds nothing to take none: not solved)
        gaining = np.flatnonzero(extra > 0)
        extra[gaining] = solve_counts(table[gaining], left)[0]
    counts[ids] += extra
    for u in more:
        idx, rows = units[u], rows_of[u]
        if int(counts[idx].sum()) > wants[u]:  # (its jobs together past its cap)
            counts[idx] = solve_counts(rows, wants[u])[0]
        objective[u] = float(rows[np.arange(len(idx)), counts[idx]].sum())


def _gains(rows: np.ndarray, now: np.ndarray, reach: np.ndarray) -> np.ndarray:
    """``[i, n]``: what ``n`` more nodes add to row ``i`` over its value at ``now[i]``, for
    ``n`` up to ``reach[i]`` (-inf past it or past the row's end)."""
    width = int(reach.max()) + 1
    steps = np.arange(width)[None, :]
    cols = now[:, None] + steps
    picked = np.take_along_axis(rows, np.minimum(cols, rows.shape[1] - 1), axis=1)
    ok = (steps <= reach[:, None]) & (cols < rows.shape[1])
    return np.where(ok, picked - picked[:, :1], -np.inf)


def per_node_rates(jobs: Sequence[MalleableJob]) -> np.ndarray:
    """Each job's rate per node at its minimum times its ``--nice`` weight (1 where unknown):
    the unit in which the nodes past users' parts are compared (:func:`rest_by_value`), so
    that neither a job's reported rate nor its user's nice moves them across users."""
    lo = [max(1, j.min_nodes) for j in jobs]
    rates = np.array([j.throughput.rate(n) / n * j.weight for j, n in zip(jobs, lo, strict=True)])
    return np.where(rates > 0, rates, 1.0)

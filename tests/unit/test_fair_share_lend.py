"""Lending a user's part (``PolicyOptions.fair_share_lend_factor``; off in every preset).

Strict max-min parts cost 5.27 % of the user-blind allocator's work on the RICC replay
(docs/allocator-measured.md): nodes given to users whose one job gains next to nothing from
them. With a lend factor ``f`` a user's node goes to other users only where their jobs gain
more than ``f`` times what its own lose; the nodes lent are divided among the others max-min
(a job claiming a steep curve gets its user's part of them, no more), and every user keeps
the nodes that run one of its jobs (the no-starvation bound)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from test_fair_share_bound import worlds

from malletrain.core.allocation.fairness import solve_fair
from malletrain.core.options import REPLAY, PolicyOptions
from malletrain.core.policies import make_policy


def _row(per_node: float, width: int, flat_after: int | None = None, least: int = 1,
         flat_slope: float = 0.0) -> np.ndarray:
    """A job's value at 0..width-1 nodes: ``per_node`` each up to ``flat_after``, then
    ``flat_slope`` each; ``-inf`` below ``least`` (its minimum)."""
    n = np.arange(width, dtype=float)
    knee = width if flat_after is None else flat_after
    row = per_node * np.minimum(n, knee) + flat_slope * np.maximum(n - knee, 0.0)
    row[1:least] = -np.inf
    return row


def test_a_flat_part_is_lent_and_the_nodes_lent_are_divided_evenly():
    # a's job gains 10 a node up to 2 nodes, then 0.1; b's 1, c's (claims) 5: 30 nodes
    values = np.vstack([_row(10.0, 31, 2, flat_slope=0.1), _row(1.0, 31), _row(5.0, 31)])
    users = ["a", "b", "c"]
    strict, _ = solve_fair(values, users, [0, 0, 0], 30)
    assert list(strict) == [10, 10, 10]
    lent, value = solve_fair(values, users, [0, 0, 0], 30, lend_factor=8.0)
    assert list(lent) == [2, 14, 14]  # c's steeper claim gets c's half of the 8 lent, no more
    assert value > float(values[np.arange(3), strict].sum())


def test_a_part_is_lent_only_where_the_others_gain_factor_times_more():
    # a's job gains 0.2 a node beyond 2 nodes; b's and c's 1: five times, not eight
    values = np.vstack([_row(10.0, 31, 2, flat_slope=0.2), _row(1.0, 31), _row(1.0, 31)])
    users = ["a", "b", "c"]
    assert list(solve_fair(values, users, [10, 10, 10], 30, lend_factor=8.0)[0]) == [10, 10, 10]
    assert list(solve_fair(values, users, [10, 10, 10], 30, lend_factor=4.0)[0]) == [2, 14, 14]


def test_a_user_whose_jobs_gain_little_still_runs_one():
    # the newcomer's job needs 3 nodes and gains little beyond: it keeps its 3, lends the rest
    values = np.vstack([_row(10.0, 41), _row(10.0, 41), _row(0.5, 41, 3, least=3)])
    counts, _ = solve_fair(values, ["a", "b", "new"], [20, 20, 0], 40, lend_factor=8.0)
    assert counts[2] == 3 and counts.sum() == 40
    counts, _ = solve_fair(values, ["a", "b", "new"], [20, 20, 0], 40, lend_factor=1.0)
    assert counts[2] == 3  # even with no protection of the owner's nodes at all


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_with_lending_a_user_holding_nothing_gets_its_minimum_at_the_first_decision(world):
    """docs/allocator.md's bound, with the replays' preset lending at factor 8."""
    inp, users = world
    new = inp.jobs[-1]
    assume(len(inp.nodes) // users >= new.min_nodes)
    policy = make_policy("malletrain", REPLAY.with_(fair_share_lend_factor=8.0))
    values, _, _ = policy.value_table(inp)
    assume(values[-1, new.min_nodes] > 0)
    plan = policy.decide(inp)
    assert plan.count("new-0") >= new.min_nodes
    got = [n for j in inp.jobs for n in plan.assignments.get(j.job_id, ())]
    assert len(got) == len(set(got)) <= len(inp.nodes)


@pytest.mark.parametrize("factor", [-1.0, 0.5, 0.99])
def test_a_lend_factor_below_one_is_refused(factor):
    with pytest.raises(ValueError, match="fair_share_lend_factor"):
        PolicyOptions(fair_share_lend_factor=factor)

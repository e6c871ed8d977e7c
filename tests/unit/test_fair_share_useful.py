"""A user's part counts the nodes its jobs use well (``fair_share_min_gain``, issue 47).

On Philly's node log with its virtual clusters as users (``benchmarks/fairness.py --scenario
philly-vcs``), strict equal parts cost 17 % of the work: a VC with one job that scales poorly
past a few nodes put its whole part on that job, each node past the bend adding a fraction
of what it added to another VC's job. With ``min_gain`` the division counts a job's demand up
to its useful size only (every node past its minimum adds at least ``min_gain`` times its
rate per node there); the rest of the part goes to the other users first, and back to the
job where nobody else takes it (work-conserving).
"""

from __future__ import annotations

import numpy as np

from malletrain.core.allocation.fairness import solve_fair, useful_sizes


def rates(per_node: list[float]) -> np.ndarray:
    """A rate curve from each node's gain (index 0: 0 nodes)."""
    return np.concatenate(([0.0], np.cumsum(per_node)))


FLAT = rates([100.0] * 4 + [10.0] * 12)  # 16 nodes: the bend at 4
LINEAR = rates([100.0] * 16)


def test_the_useful_size_is_where_a_node_first_adds_less_than_min_gain():
    table = np.stack([FLAT, LINEAR, rates([50.0, 50.0, 40.0, 30.0] + [20.0] * 12)])
    sizes = useful_sizes(table, np.array([1, 1, 2]), 0.5)
    # the third job runs on 2 or more (50 a node there): its 3rd and 4th nodes add 40 and
    # 30, at least half of 50; its 5th adds 20
    assert sizes.tolist() == [4, 16, 4]
    # a minimum past the bend is the job's useful size: it cannot run on fewer
    assert useful_sizes(np.stack([FLAT]), np.array([6]), 0.5).tolist() == [6]


def test_nodes_a_users_job_uses_poorly_go_to_the_other_user_first():
    values = np.stack([FLAT, LINEAR])
    strict, _ = solve_fair(values, ["a", "b"], [0, 0], 16)
    assert strict.tolist() == [8, 8]
    useful = useful_sizes(values, np.array([1, 1]), 0.5)
    counts, objective = solve_fair(values, ["a", "b"], [0, 0], 16, useful=useful)
    assert counts.tolist() == [4, 12]
    assert objective > float(values[0, 8] + values[1, 8])


def test_what_nobody_else_takes_goes_back_to_the_job_past_its_useful_size():
    """b's job stops at 6 nodes: a's job gets the other 10, past its bend at 4."""
    useful = useful_sizes(np.stack([FLAT, LINEAR]), np.array([1, 1]), 0.5)
    values = np.stack([FLAT, LINEAR])
    values[1, 7:] = -np.inf
    counts, _ = solve_fair(values, ["a", "b"], [0, 0], 16, useful=useful)
    assert counts.tolist() == [10, 6]


def test_the_entitlement_malletrain_jobs_shows_follows_the_same_division():
    """`malletrain jobs --json`'s user_entitled: a's job flattens past 4 nodes, so of 16
    nodes a is entitled to 4 and b to 12; where b may hold only 2 (a Slurm limit), what no
    one else takes goes back to a: 14 (the division's rest, offered up to the full demand)."""
    from types import SimpleNamespace

    from malletrain.core.model import MalleableJob, ThroughputModel
    from malletrain.daemon.tick.reasons import entitlements, useful_most

    flat = MalleableJob("ja", 1, 16, (), ThroughputModel(tuple((n, float(r)) for n, r in
                                                               enumerate(FLAT) if n)),
                        10.0, 10.0, user="a")
    linear = MalleableJob("jb", 1, 16, (), ThroughputModel(((1, 100.0), (16, 1600.0))),
                          10.0, 10.0, user="b")
    useful = useful_most([flat, linear], 0.5)
    assert useful == {"ja": 4, "jb": 16}
    assert useful_most([flat], 0.0) == {}
    managed = [SimpleNamespace(job_id=j, user=u, spec=SimpleNamespace(max_nodes=16, min_nodes=1))
               for j, u in (("ja", "a"), ("jb", "b"))]
    most = {"ja": 16, "jb": 16}
    assert entitlements(managed, {}, 16, most, useful=useful) == {"a": 4, "b": 12}
    assert entitlements(managed, {}, 16, most) == {"a": 8, "b": 8}  # strict parts
    assert entitlements(managed, {}, 16, {"ja": 16, "jb": 2}, useful=useful) == \
        {"a": 14, "b": 2}

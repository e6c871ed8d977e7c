"""A user's part counts the nodes its jobs use well (``fair_share_min_gain``, issue 47).

On Philly's node log with its virtual clusters as users (``benchmarks/fairness.py --scenario
philly-vcs``), strict equal parts cost 17 % of the work: a VC with one job that scales poorly
past a few nodes put its whole part on that job, each node past the bend adding a fraction
of what it added to another VC's job. With ``min_gain`` the division counts a job's demand up
to its useful size only (every node past its minimum adds at least ``min_gain`` times its
rate per node there); what is left once every user's part is met goes where it adds the most
relative to each job's own rate (work-conserving).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from malletrain.core.allocation.fairness import solve_fair, useful_sizes
from malletrain.core.allocation.shares import FairTree, member_shares
from malletrain.core.model import AllocationInput, IdleNode, MalleableJob, ThroughputModel
from malletrain.core.options import LIVE
from malletrain.core.policies import make_policy
from malletrain.daemon.tick.reasons import entitlements, useful_most


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


def test_the_nodes_past_every_users_part_go_where_they_add_the_most():
    """Three users; b's job stops at 8. Every part is met with 8 nodes left (a's and c's jobs
    past their bends at 4): they go to c, whose job still adds 40 a node there, not half to
    a, whose job adds 10 (in equal parts: 8 and 8; Philly days 60-63 under REPLAY lost 11 %
    of the work so). Compared per node of each job's own rate, so a tenfold rate changes
    nothing."""
    steeper = rates([100.0] * 4 + [40.0] * 12)
    values = np.stack([FLAT, LINEAR, steeper])
    values[1, 9:] = -np.inf
    useful = useful_sizes(np.stack([FLAT, LINEAR, steeper]), np.array([1, 1, 1]), 0.5)
    assert useful.tolist() == [4, 16, 4]
    per_node = np.array([100.0, 100.0, 100.0])
    counts, _ = solve_fair(values, ["a", "b", "c"], [0, 0, 0], 24, useful=useful,
                           scale=per_node)
    assert counts.tolist() == [4, 8, 12]
    loud = values.copy()
    loud[0] *= 10.0  # a's job reports ten times the rate: its rest is the same
    again, _ = solve_fair(loud, ["a", "b", "c"], [0, 0, 0], 24, useful=useful,
                          scale=per_node * np.array([10.0, 1.0, 1.0]))
    assert again.tolist() == [4, 8, 12]


def test_the_rest_is_no_ground_to_explore_on_another_users_nodes():
    """The dev cluster's tables (``test_slurm_limits.py``, one decision logged, values
    rounded): alice's job holds 6 nodes, bob's 2 (his limit); the kind's early curve says a
    second node adds little, so both useful sizes are 1 and bob's second node is in the
    rest. Alice's 7th node is unmeasured: explored (the table before ``explore_free_only``)
    it is worth 546k more, measured-rate 16k less. The rest is valued on the rounds' own
    rows, so bob keeps his node (explored onto it, the plan moved it to alice and back a
    tick later)."""
    inf = np.inf
    values = np.array([[-342259.0, 1173786.0, 1611925.0, 2049671.0, 2487022.0, 2923980.0,
                        3364905.0, 3348489.0, 3345160.0],
                       [-180233.0, 1335812.0, 1776249.0, -inf, -inf, -inf, -inf, -inf, -inf]])
    explored = values.copy()
    explored[0, 7:] = [3911096.0, 4469819.0]
    counts, _ = solve_fair(values, ["mt-alice", "mt-bob"], [6, 2], 8, unexplored=explored,
                           useful=np.array([1, 1]), slack=2, scale=np.array([1781.0, 1781.0]))
    assert counts.tolist() == [6, 2]


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


def test_the_rest_follows_slurms_fair_share_weights():
    """``tests/e2e/test_sshare.py``'s case, as the daemon decides it: bob weighted 3 to
    alice's 1 (sshare's fair-share factors). Both jobs' curves bend at 3, so each user's
    part for useful sizes is 3 (alice's 2 of 8 plus what bob's useful demand leaves), and 2
    nodes are the rest. Valued alike they stayed with alice, who held them (keeping costs
    nothing: 5 and 3, alice past the entitlement ``malletrain jobs`` shows, the e2e test's
    failure); valued in proportion to the users' shares they go to bob.
    """
    bend = ThroughputModel(tuple((n, 100.0 * min(n, 3) + 40.0 * max(0, n - 3))
                                 for n in range(1, 9)))
    jobs = (MalleableJob("a", 1, 8, tuple(f"n{i}" for i in range(5)), bend, 3.0, 1.0, 0,
                         user="mt-alice"),
            MalleableJob("b", 1, 8, tuple(f"n{i}" for i in range(5, 8)), bend, 3.0, 1.0, 1,
                         user="mt-bob"))
    nodes = tuple(IdleNode(f"n{i}", None, 3600.0) for i in range(8))
    policy = make_policy("malletrain", LIVE)
    weights = {"mt-bob": 3.0, "mt-alice": 1.0}
    weighted = policy.decide(AllocationInput(1000.0, nodes, jobs, user_weights=weights))
    assert (weighted.count("a"), weighted.count("b")) == (3, 5)
    managed = [SimpleNamespace(job_id=j.job_id, user=j.user, spec=j) for j in jobs]
    shown = entitlements(managed, {j.job_id: j.nodes for j in jobs}, 8, {"a": 8, "b": 8},
                         weights, useful=useful_most(jobs, LIVE.fair_share_min_gain))
    # (the rest's 2 in weighted parts rounds to 1 each: the light user is not rounded to 0)
    assert shown == {"mt-alice": 4, "mt-bob": 4}
    alike = policy.decide(AllocationInput(1000.0, nodes, jobs))
    assert (alike.count("a"), alike.count("b")) == (5, 3)  # alice past what she is shown


def test_a_user_below_its_part_of_the_rest_may_grow_past_its_measured_sizes():
    """The dev cluster's curves (``tests/e2e/test_sshare.py``, one decision logged, rates rounded):
    both jobs measured up to 5 nodes, a second node adding less than half the first (useful
    sizes 1), so 6 of 8 nodes are the rest; bob, weighted 2 to alice's 1, is shown 6 of 8 (the
    rest's odd node rounds to the heavier user) and holds 5. Valued on its measured sizes only,
    his 6th node was worth a flat curve's nothing against alice's 3rd, and alice kept 3 above
    the 2 she was shown; within his part of the rest, his sizes are valued as the rounds value a
    part (explored onto the nodes the division moves to him), so it goes to him. (Logged with
    sshare's factors 0.333333 and 0.666667, whose 6 nodes of the rest were then rounded to 1
    and 5; now 2 and 4, so the weights here are 0.3 and 0.7: 1.8 and 4.2, the odd node bob's.)
    """
    def curve(*points: tuple[int, float]) -> ThroughputModel:
        return ThroughputModel(points, 205.0, measured_max_nodes=5)

    early = curve((1, 419.5), (3, 726.6), (5, 1136.7))
    jobs = (MalleableJob("a", 1, 8, ("n0", "n1", "n2"), early, 20.0, 5.0, 0, user="mt-alice"),
            MalleableJob("b", 1, 8, tuple(f"n{i}" for i in range(3, 8)), early, 20.0, 5.0, 1,
                         user="mt-bob"))
    nodes = tuple(IdleNode(f"n{i}", None, 3600.0) for i in range(8))
    weights = {"mt-alice": 0.3, "mt-bob": 0.7}
    plan = make_policy("malletrain", LIVE).decide(AllocationInput(1000.0, nodes, jobs,
                                                                  user_weights=weights))
    assert (plan.count("a"), plan.count("b")) == (2, 6)


def test_each_users_share_of_the_rest_follows_its_weight_down_the_account_tree():
    # weights alone: in proportion
    shares = member_shares(["a", "b", "b"], {"a": 1.0, "b": 3.0}, None)
    assert shares == {"a": 0.25, "b": 0.75}
    assert member_shares(["a", "b"], None, None) == {"a": 0.5, "b": 0.5}
    # accounts first: phys (weight 1) has two users, chem (weight 1) one
    tree = FairTree(members=("phys/x", "phys/y", "chem/z"),
                    weights={"phys/x": 1.0, "phys/y": 1.0, "chem/z": 1.0},
                    parents={"phys/x": "phys", "phys/y": "phys", "chem/z": "chem"},
                    account_weights={})
    shares = member_shares(tree.members, tree.weights, tree)
    assert shares == {"chem/z": 0.5, "phys/x": 0.25, "phys/y": 0.25}

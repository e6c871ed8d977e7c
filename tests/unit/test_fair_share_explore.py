"""A user below its fair part grows onto the other users' surplus at sizes it has not measured.

Found on the dev cluster (``tests/e2e/test_account_tree.py``): mt-bob's job, measured at 1-3
nodes, stayed at 3 of its 4 while mt-alice's two jobs held 5 of the 8 nodes, for as long as
they ran. ``explore_free_only`` values a size beyond the measured ones at the measured rate
where the nodes would come from another running job (an unmeasured guess must not evict a
measured job, that node comes back), so bob's 4th node was worth nothing to him and the
division's work conservation gave it back to alice. Across users the node does not come
back: it is bob's by the division. Exploration now uses, besides the free pool, the nodes the
division moves to the user (its part less what it holds); within one user's jobs the rule
holds as before."""

from __future__ import annotations

from dataclasses import replace

from malletrain.core.model import AllocationInput, IdleNode, MalleableJob, ThroughputModel
from malletrain.core.options import LIVE, REPLAY
from malletrain.core.policies import make_policy

#: measured at 1-3 nodes, the advisor's optimistic extension beyond
LEARNED = ThroughputModel(((1, 250.0), (2, 500.0), (3, 745.0)), optimistic_slope=240.0,
                          measured_max_nodes=3)
NODES = tuple(IdleNode(f"n{i}", None, 600.0) for i in range(1, 9))


def _jobs(bob_held: tuple[str, ...]) -> tuple[MalleableJob, ...]:
    return (MalleableJob("a", 1, 8, ("n1", "n2", "n3"), LEARNED, 3.0, 1.0, 0, user="mt-alice"),
            MalleableJob("b", 1, 8, ("n6", "n7"), LEARNED, 3.0, 1.0, 1, user="mt-alice"),
            MalleableJob("c", 1, 8, bob_held, LEARNED, 3.0, 1.0, 2, user="mt-bob"))


def test_a_user_below_its_part_explores_onto_the_others_surplus():
    inp = AllocationInput(1000.0, NODES, _jobs(("n4", "n5", "n8")))
    for preset in (LIVE, REPLAY):
        plan = make_policy("malletrain", preset).decide(inp)
        assert plan.count("c") == 4, preset
        assert plan.count("a") + plan.count("b") == 4


def test_within_one_user_the_unmeasured_guess_still_takes_no_node():
    """One user: a job does not grow past its measured sizes onto its sibling's nodes."""
    jobs = tuple(replace(j, user="mt-alice") for j in _jobs(("n4", "n5", "n8")))
    plan = make_policy("malletrain", LIVE).decide(AllocationInput(1000.0, NODES, jobs))
    assert [plan.count(j) for j in ("a", "b", "c")] == [3, 2, 3]

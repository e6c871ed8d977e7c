"""Equal-share and FreeTrain baselines."""

from __future__ import annotations

from malletrain.core.baselines import EqualShare, equal_share_counts
from malletrain.core.model import AllocationInput, IdleNode, MalleableJob, ThroughputModel
from malletrain.core.policies import make_policy, policy_names

LINEAR = ThroughputModel(((1, 1.0), (64, 64.0)))


def job(job_id, lo, hi, nodes=(), order=0, tm=LINEAR, up=10.0, down=5.0):
    return MalleableJob(job_id, lo, hi, tuple(nodes), tm, up, down, order)


def nodes(n, window=None, switch=None):
    return tuple(IdleNode(f"n{i}", window, 0.0, switch) for i in range(n))


def test_equal_share_splits_evenly_and_refills_capped_jobs():
    jobs = (job("a", 1, 2, order=0), job("b", 1, 100, order=1), job("c", 1, 100, order=2))
    assert equal_share_counts(12, jobs) == {"a": 2, "b": 5, "c": 5}


def test_equal_share_leftovers_first_come_first_served():
    jobs = (job("a", 1, 10, order=0), job("b", 1, 10, order=1), job("c", 1, 10, order=2))
    assert equal_share_counts(11, jobs) == {"a": 5, "b": 3, "c": 3}


def test_equal_share_min_above_share_gets_nothing_unless_leftovers_cover_it():
    jobs = (job("a", 1, 4, order=0), job("big", 4, 8, order=1), job("c", 1, 4, order=2))
    # share 1: big (min 4) gets 0; the 3 left over cannot start big, so a grows (FCFS)
    assert equal_share_counts(5, jobs) == {"a": 4, "big": 0, "c": 1}
    # share 4 covers big's min
    assert equal_share_counts(12, jobs) == {"a": 4, "big": 4, "c": 4}


def test_equal_share_keeps_current_nodes():
    inp = AllocationInput(
        0.0, nodes(6), (job("a", 1, 6, nodes=("n4", "n5")), job("b", 1, 6, order=1))
    )
    plan = EqualShare().decide(inp)
    assert set(plan.assignments["a"]) == {"n4", "n5", plan.assignments["a"][2]}
    assert plan.count("a") == 3 and plan.count("b") == 3
    assert not set(plan.assignments["a"]) & set(plan.assignments["b"])


def test_registry_names():
    assert "equal-share" in policy_names()
    assert make_policy("equal-share").name == "equal-share"

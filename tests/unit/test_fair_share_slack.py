"""A user that Slurm took nodes from waits up to a turn, within a slack of its part, instead of
taking nodes back from other users at once (``fair_share_slack_nodes``).

On Philly's virtual clusters under ``LIVE`` every reclaim moved nodes between users (a shrink
of one user's job and a grow of another's), 5,520 rescales against the user-blind
allocator's 3,603 (benchmarks/fairness.py --scenario philly-vcs --preset live)."""

from __future__ import annotations

from malletrain.core.allocation.shares import within_slack
from malletrain.core.model import AllocationInput, IdleNode, MalleableJob, ThroughputModel
from malletrain.core.options import LIVE
from malletrain.core.policies import make_policy

LINEAR = ThroughputModel(tuple((n, 100.0 * n) for n in range(1, 9)))


def test_only_a_waiting_user_within_the_slack_leaves_nodes_with_others():
    parts, held = {"alice": 4, "bob": 4}, {"alice": 5, "bob": 3}
    most = {"alice": 8, "bob": 8}
    assert within_slack(parts, held, 2, {"bob"}, most) == {"alice": 5, "bob": 3}
    assert within_slack(parts, held, 2, set(), most) == parts  # bob was not reclaimed
    assert within_slack(parts, held, 0, {"bob"}, most) == parts  # no slack
    # more than the slack below: brought to part - slack; holding nothing: the whole part
    assert within_slack(parts, {"alice": 7, "bob": 1}, 2, {"bob"}, most) == \
        {"alice": 6, "bob": 2}
    assert within_slack(parts, {"alice": 8, "bob": 0}, 2, {"bob"}, most) == parts
    # alice's Slurm limit fell to 4 (tests/e2e/test_slurm_limits.py): she keeps nothing past
    # it, so bob's part is not lowered for nodes she must give back anyway
    assert within_slack(parts, held, 2, {"bob"}, {"alice": 4, "bob": 8}) == parts
    # the shortfall spread over the waiting users, the sum kept
    three = within_slack({"a": 6, "b": 5, "c": 5}, {"a": 8, "b": 4, "c": 4}, 2, {"b", "c"},
                         {"a": 16, "b": 16, "c": 16})
    assert three == {"a": 8, "b": 4, "c": 4}
    assert sum(three.values()) == 16


def _jobs(alice: tuple[str, ...], bob: tuple[str, ...]) -> tuple[MalleableJob, ...]:
    return (MalleableJob("a", 1, 8, alice, LINEAR, 3.0, 1.0, 0, user="mt-alice"),
            MalleableJob("c", 1, 8, bob, LINEAR, 3.0, 1.0, 1, user="mt-bob"))


def _nodes(*numbers: int) -> tuple[IdleNode, ...]:
    return tuple(IdleNode(f"n{i}", None, 600.0) for i in numbers)


def test_a_reclaimed_user_waits_a_turn_then_gets_its_part():
    policy = make_policy("malletrain", LIVE)
    first = policy.decide(AllocationInput(1000.0, _nodes(*range(1, 10)),
                                          _jobs(("n1", "n2", "n3", "n4", "n5"),
                                                ("n6", "n7", "n8", "n9"))))
    assert (first.count("a"), first.count("c")) == (5, 4)
    # Slurm takes n8 and n9 from bob; n10 turns idle: parts 4 and 4 of 8
    after = _jobs(("n1", "n2", "n3", "n4", "n5"), ("n6", "n7"))
    now = AllocationInput(1060.0, _nodes(*range(1, 8), 10), after)
    plan = policy.decide(now)
    assert (plan.count("a"), plan.count("c")) == (5, 3)  # bob waits, alice keeps her fifth
    strict = make_policy("malletrain", LIVE.with_(fair_share_slack_nodes=0))
    assert (strict.decide(now).count("a"), strict.decide(now).count("c")) == (4, 4)
    # a turn later bob is no longer waiting: his whole part
    later = _jobs(("n1", "n2", "n3", "n4", "n5"), ("n6", "n7", "n10"))
    plan = policy.decide(AllocationInput(1060.0 + LIVE.fair_turn_s, _nodes(*range(1, 8), 10),
                                         later))
    assert (plan.count("a"), plan.count("c")) == (4, 4)


def test_a_grow_not_placed_yet_is_no_reclaim():
    """The daemon places a grow's slots over the next ticks: until then the job holds fewer
    nodes than its plan gave it, but Slurm took none of them; its user does not wait."""
    policy = make_policy("malletrain", LIVE)
    first = policy.decide(AllocationInput(1000.0, _nodes(*range(1, 10)),
                                          _jobs(("n1", "n2", "n3", "n4", "n5"), ("n6", "n7"))))
    assert (first.count("a"), first.count("c")) == (5, 4)  # bob grows onto n8, n9
    # not placed yet, and Slurm takes n8 and n9 (never bob's): parts 4 and 4 of 8
    plan = policy.decide(AllocationInput(1060.0, _nodes(*range(1, 8), 10),
                                         _jobs(("n1", "n2", "n3", "n4", "n5"), ("n6", "n7"))))
    assert (plan.count("a"), plan.count("c")) == (4, 4)

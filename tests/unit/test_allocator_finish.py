"""Finish-aware valuation (MalleTrainPolicy.finish_weight, docs/evaluation.md).

With a concurrency limit and a queue, a job's finish admits the next job. A job that
can finish within ``finish_horizon_s`` counts its samples ``1 + beta_j`` times,
``beta_j = finish_weight x sigma / r_j``, ``sigma`` what one more admitted job would add
at the plan's node price. Off by default; it reads the user-declared
``MalleableJob.remaining_samples`` and ``AllocationInput.queued_jobs``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from malletrain.core.allocation.allocator import MalleTrainPolicy, malletrain_policy
from malletrain.core.allocation.finish import SlotOutlook, slot_rate
from malletrain.core.model import AllocationInput, IdleNode, MalleableJob, ThroughputModel
from malletrain.core.options import CORE

NEAR = ThroughputModel(((1, 10.0), (2, 15.0)))
FAR = ThroughputModel(((1, 10.0), (2, 16.0)))


def case(*, near_left: float | None = 1000.0, queued: int | None = 3) -> AllocationInput:
    """'near' and 'far' hold one node each (windows beyond the horizon: no reclaims) and
    one node is free; 'far' gains more from it (6/s against 5/s), 'near' can finish."""
    nodes = tuple(IdleNode(n, 5000.0) for n in ("n1", "n2", "free"))
    jobs = (
        MalleableJob("near", 1, 2, ("n1",), NEAR, 18.0, 12.0, 0, remaining_samples=near_left),
        MalleableJob("far", 1, 2, ("n2",), FAR, 18.0, 12.0, 1, remaining_samples=1e12),
    )
    return AllocationInput(0.0, nodes, jobs, queued_jobs=queued)


def policy(weight: float) -> MalleTrainPolicy:
    return malletrain_policy(CORE.with_(finish_weight=weight))


def test_off_by_default_and_the_free_node_goes_to_the_better_curve():
    assert MalleTrainPolicy().finish_weight == 0.0
    plan = MalleTrainPolicy().decide(case())
    assert plan.count("far") == 2 and plan.count("near") == 1


def test_slot_rate_uses_the_plans_node_price():
    inp = case()
    # plan near=1, far=2 uses every node: lambda = smallest last-node marginal = 6;
    # mean curve (10, 15.5): max(0, 10 - 6, 15.5 - 12) = 4
    assert slot_rate(inp, np.array([1, 2])) == pytest.approx(4.0)
    # a node left free: lambda = 0, a slot is worth the mean curve's peak
    assert slot_rate(inp, np.array([1, 1])) == pytest.approx(15.5)


def test_weights_only_for_jobs_that_can_finish_within_the_horizon():
    pol = policy(1.0)
    beta = pol.finish_weights(case(), sigma=4.0)
    # near: 1000 samples at 10/s = 100 s <= 24 h: beta = 1.0 x 4 / 10; far: 1e11 s away
    assert beta.tolist() == pytest.approx([0.4, 0.0])
    assert pol.finish_weights(case(), sigma=100.0).tolist() == [1.0, 0.0]  # capped
    short = dataclasses.replace(pol, finish_horizon_s=50.0)
    assert short.finish_weights(case(), sigma=4.0).tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    "inp",
    [case(queued=0), case(near_left=None)],
    ids=["nobody-queued", "total-not-declared"],
)
def test_no_weight_without_a_queue_or_a_declared_total(inp):
    assert not policy(1.0).finish_weights(inp, sigma=4.0).any()
    plan = policy(1.0).decide(inp)
    assert plan.count("far") == 2 and plan.count("near") == 1


def test_a_job_about_to_finish_gets_the_free_node_while_jobs_wait():
    # near: (10 x 1800 + 5 x 1800 - 18 x 10) x 1.4 - 10 x 1800 x 1.4 = 12,348 > far's 10,620
    plan = policy(1.0).decide(case())
    assert plan.count("near") == 2 and plan.count("far") == 1
    # unknown queue (None): a policy assumes some jobs wait
    assert policy(1.0).decide(case(queued=None)).count("near") == 2


def test_weight_too_small_to_move_the_node():
    # beta = 0.5 x 4 / 10 = 0.2: 8,820 x 1.2 = 10,584 < 10,620
    plan = policy(0.5).decide(case())
    assert plan.count("far") == 2 and plan.count("near") == 1


def test_the_slot_outlook_averages_sigma_over_the_time_each_value_held():
    out = SlotOutlook(memory_s=100.0)
    assert out.update(0.0, 10.0) == 10.0  # the first value is the average
    # 10 held for 100 s: the average stays 10; now's 0 is below it
    assert out.update(100.0, 0.0) == pytest.approx(10.0)
    # 0 held for 100 s: 10 x e^-1
    assert out.update(200.0, 0.0) == pytest.approx(10.0 * math.exp(-1.0))
    assert out.update(200.0, 50.0) == 50.0  # now's sigma when larger; same instant: no decay
    assert out.mean == pytest.approx(10.0 * math.exp(-1.0))


def test_with_an_outlook_a_scarce_moment_still_values_finishes():
    # sigma at the plan's price is 4 (nodes all used); an outlook that remembers 30 (nodes
    # were free for the last hour) weights near (10/s) by 0.5 x 30 / 10, capped at 1
    pol = malletrain_policy(CORE.with_(finish_weight=0.5, finish_outlook_s=3600.0))
    assert pol.finish_outlook_s == 3600.0
    pol.outlook = SlotOutlook(3600.0)
    pol.outlook.update(-3600.0, 30.0)
    assert pol.finish_weights(case(), sigma=4.0).tolist() == pytest.approx([1.0, 0.0])
    assert pol.decide(case()).count("near") == 2  # without the outlook: far gets it (above)
    assert policy(0.5).finish_weights(case(), sigma=4.0).tolist() == pytest.approx([0.2, 0.0])

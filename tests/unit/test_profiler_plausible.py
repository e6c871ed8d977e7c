"""Reports far above a job's own history are held until they repeat (core/profiling/plausible.py).

A job's own user can make its workers report any progress (docs/security.md). Across users the
fair shares already make a report worthless (tests/unit/test_fair_share_bound.py); within a
user's part, one wild report must not bend the job's curve."""

from __future__ import annotations

import pytest
from test_profiler import Feed

from malletrain.core.profiling.plausible import PlausibleRule, ReportGuard
from malletrain.core.profiling.profile import AdvisorSettings
from malletrain.core.profiling.profiler import ProfilingAdvisor


def test_one_report_ten_times_the_history_is_held_and_moves_nothing():
    adv = ProfilingAdvisor()
    f = Feed(adv, n=2)
    f.run(300)  # 190/s at 2 nodes for 300 s
    before = adv.model("j").rate(2)
    f.run(10, rate=1900.0)  # one report claiming 10x
    f.run(100)
    assert adv.model("j").rate(2) == pytest.approx(before) == pytest.approx(190.0)
    assert adv._jobs["j"].guard.held_total == 1
    assert adv.rate_noise("j") == 0.0  # the held report is not noise either


def test_a_jump_that_repeats_is_the_jobs_new_speed():
    adv = ProfilingAdvisor()
    f = Feed(adv, n=2)
    f.run(300)
    f.run(60, rate=1900.0)  # six reports in a row at 10x: held twice, then accepted
    assert adv._jobs["j"].guard.held_total == 2
    assert adv.model("j").rate(2) > 190.0 * 1.5


def test_a_first_report_at_a_new_size_is_held_beyond_linear_times_the_factor():
    adv = ProfilingAdvisor()
    f = Feed(adv, n=1)
    f.run(100)  # 100/s on one node
    f.rescale(4, 0.0)
    f.run(60)  # 340/s on 4: below linear, accepted (warm-up first)
    f.rescale(8, 0.0)
    f.run(20, rate=100.0 * 8 * 5)  # 5x linear at 8 nodes: held (twice; a third would count)
    assert adv._jobs["j"].guard.held_total == 2
    assert adv.measured_sizes("j") == (1, 4)


def test_falls_are_never_held_and_the_rule_can_be_switched_off():
    guard = ReportGuard()
    rule = PlausibleRule(factor=4.0, repeats=3)
    assert guard.admit(rule, 2, 1900.0, 10.0, clean=True)  # no history: accepted
    assert guard.admit(rule, 2, 1.0, 10.0, clean=True)  # a stall is real
    assert not guard.admit(rule, 2, 1e6, 10.0, clean=True)
    off = ProfilingAdvisor(AdvisorSettings(plausible=PlausibleRule(factor=0.0)))
    f = Feed(off, n=2)
    f.run(300)
    f.run(10, rate=1900.0)
    assert off._jobs["j"].guard.held_total == 0


def test_a_creeping_claim_is_slowed_by_the_time_weighted_history():
    """Each report just under 4x the last: accepted ones weigh by their seconds against the
    whole history, so the reference creeps, not the claim."""
    guard = ReportGuard()
    rule = PlausibleRule()
    assert guard.admit(rule, 1, 100.0 * 1000, 1000.0, clean=True)  # 1,000 s at 100/s
    rate, accepted = 100.0, 0
    for _ in range(10):
        rate *= 3.9
        accepted += guard.admit(rule, 1, rate * 10, 10.0, clean=True)
    assert accepted <= 3  # 390, 1521 fit under 4x the mean; 5932 does not
    assert guard.reference(1) < 200.0

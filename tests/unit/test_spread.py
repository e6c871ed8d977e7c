"""The spread penalty (core/spread.py): learned from step times, priced in the count problem."""

from __future__ import annotations

import pytest

from malletrain.core.allocation.allocator import MalleTrainPolicy
from malletrain.core.allocation.spread import switch_capacity, with_spread_penalty
from malletrain.core.model import AllocationInput, IdleNode, MalleableJob, ThroughputModel
from malletrain.core.profiling.comm import MIN_SPREAD_FACTOR, StepTimes, spread_factor
from malletrain.core.profiling.profile import Profile
from malletrain.core.profiling.profiler import ProfilingAdvisor

LINEAR = ThroughputModel(((1, 10.0), (8, 80.0)))


def _steps(step_s: float, sync_s: float, per_node: float = 32.0, w: float = 5.0) -> StepTimes:
    return StepTimes(step_s - sync_s, sync_s, per_node, w)


def test_the_factor_is_the_spread_rate_over_the_packed_one_at_the_same_size():
    packed = {2: _steps(0.10, 0.02), 4: _steps(0.10, 0.02)}
    spread = {4: _steps(0.25, 0.17)}
    assert spread_factor(packed, spread) == pytest.approx(0.4)
    # a size never run packed: compared with the packed steps' fit (sync flat here)
    assert spread_factor(packed, {8: _steps(0.20, 0.12)}) == pytest.approx(0.5, abs=0.05)
    assert spread_factor(packed, {}) == 1.0  # nothing spread measured: no penalty
    assert spread_factor({}, spread) == 1.0  # nothing to compare with
    assert spread_factor(packed, {4: _steps(0.05, 0.0)}) == 1.0  # never taken to help
    assert spread_factor(packed, {4: _steps(100.0, 99.0)}) == MIN_SPREAD_FACTOR


def test_the_advisor_learns_it_per_kind_and_keeps_spread_steps_out_of_the_curve():
    adv = ProfilingAdvisor()
    adv.register("a", "resnet")
    adv.register("b", "resnet")
    for _ in range(3):
        adv.step_times("a", 4, 0.10, 0.02, 32.0)
        adv.step_times("b", 4, 0.40, 0.32, 32.0, spread=True)
    assert adv.spread_factor("a") == pytest.approx(0.25)  # b's spread steps, a's kind
    prof = Profile.from_dict(adv.profile_dict("resnet"))
    assert set(prof.step_times()) == {4} and prof.step_times()[4].sync_s == pytest.approx(0.02)
    assert prof.step_times(spread=True)[4].sync_s == pytest.approx(0.32)


def test_spread_steps_survive_a_restart_and_bad_ones_are_refused():
    prof = Profile()
    prof.add_step(4, 0.4, 0.3, 32.0, spread=True)
    again = Profile.from_dict(prof.to_dict())
    assert again.spread_steps == prof.spread_steps and not again.steps
    bad = prof.to_dict()
    bad["spread_steps"] = {"4": [1.0, -2.0, 3.0, 1.0]}
    with pytest.raises(ValueError, match=r"spread_steps\[4\]"):
        Profile.from_dict(bad)


def test_a_curve_beyond_one_switch_is_lowered_by_the_factor():
    m = LINEAR.spread_beyond(4, 0.5)
    assert [m.rate(n) for n in (1, 4, 5, 8)] == pytest.approx([10.0, 40.0, 25.0, 40.0])
    assert LINEAR.spread_beyond(4, 1.0) is LINEAR


def _nodes() -> tuple[IdleNode, ...]:
    return tuple(IdleNode(f"n{i}", None, 0.0, "sw0" if i < 4 else "sw1") for i in range(8))


def test_the_count_problem_does_not_spread_a_job_that_pays_for_it():
    """Job a is faster per node, but across the two 4-node switches it runs at a fifth of
    its rate: the allocator gives it one switch and b the other; without the penalty a
    takes all 8 nodes."""
    slow = ThroughputModel(((1, 6.0), (8, 48.0)))
    a = MalleableJob("a", 1, 8, (), LINEAR, 0.0, 0.0, 0)
    b = MalleableJob("b", 1, 8, (), slow, 0.0, 0.0, 1)
    inp = AllocationInput(now_s=0.0, nodes=_nodes(), jobs=(a, b))
    assert switch_capacity(inp) == 4
    plain = MalleTrainPolicy().decide(inp)
    assert plain.count("a") == 8
    spread = AllocationInput(now_s=0.0, nodes=_nodes(),
                             jobs=(MalleableJob("a", 1, 8, (), LINEAR, 0.0, 0.0, 0,
                                                spread_factor=0.2), b))
    plan = MalleTrainPolicy().decide(spread)
    assert (plan.count("a"), plan.count("b")) == (4, 4)
    switch = {n.name: n.switch for n in _nodes()}
    assert len({switch[n] for n in plan.assignments["a"]}) == 1  # and on one switch


def test_no_topology_no_penalty():
    flat = tuple(IdleNode(f"n{i}", None, 0.0) for i in range(8))
    job = MalleableJob("a", 1, 8, (), LINEAR, 0.0, 0.0, 0, spread_factor=0.2)
    inp = AllocationInput(now_s=0.0, nodes=flat, jobs=(job,))
    assert switch_capacity(inp) is None and with_spread_penalty(inp) is inp

"""The advisor's per-job answer cache: exact with ``refresh_s`` = 0 (replays), at most
``refresh_s`` behind more evidence at known sizes otherwise (the daemon).

The cache is keyed on the generation of the job's pool (its kind, else itself);
these tests drive two advisors with the same random history, one asked after every
step (the cache is hit and invalidated all the time), one only at the end, and
check that both answer the same (``refresh_s`` = 0), and that evidence from another job of the same
kind reaches a job's cached answer.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain.core.profiling.profile import AdvisorSettings
from malletrain.core.profiling.profiler import ProfilingAdvisor

RATE = {1: 100.0, 2: 190.0, 3: 270.0, 4: 340.0, 6: 430.0, 8: 500.0}
JOBS = ("a-000", "a-001", "b-000", "solo")
KINDS = {"a-000": "a", "a-001": "a", "b-000": "b", "solo": None}

step = st.tuples(
    st.sampled_from(JOBS),
    st.sampled_from(sorted(RATE)),
    st.sampled_from(("observe", "observe", "observe", "rescale", "forget")),
)


def answers(adv: ProfilingAdvisor, job: str) -> tuple:
    m = adv.model(job)
    one = (m.points, m.optimistic_slope, adv.scale_costs(job), adv.start_cost_s(job),
           adv.measured_sizes(job), adv.spread_factor(job))
    told = adv.answers(job)  # all at once, kept per merged profile: the same answers
    assert (told.model.points, told.model.optimistic_slope,
            (told.scale_up_s, told.scale_down_s), told.start_s, told.measured_sizes,
            told.spread_factor) == one
    assert told.model.measured_max_nodes == max(one[4], default=0)
    return one


def replay(adv: ProfilingAdvisor, steps, ask_every_step: bool) -> list[tuple]:
    t = 0.0
    nodes = dict.fromkeys(JOBS, 0)
    samples = dict.fromkeys(JOBS, 0.0)
    for job, n, what in steps:
        adv.register(job, KINDS[job])
        t += 40.0
        if what == "forget":
            adv.forget(job)
            nodes[job], samples[job] = 0, 0.0
        elif what == "rescale" and n != nodes[job]:
            samples[job] -= 15.0 * RATE.get(nodes[job], 0.0)
            adv.rescaled(job, t, nodes[job], n)
            nodes[job] = n
        elif nodes[job] > 0:
            samples[job] += RATE[nodes[job]] * 40.0
            adv.observe(job, t, nodes[job], samples[job])
        if ask_every_step:
            for j in JOBS:
                answers(adv, j)
    return [answers(adv, j) for j in JOBS]


@settings(max_examples=60, deadline=None)
@given(st.lists(step, min_size=1, max_size=60))
def test_cached_answers_equal_fresh_ones(steps):
    cached = replay(ProfilingAdvisor(), steps, ask_every_step=True)
    fresh = replay(ProfilingAdvisor(), steps, ask_every_step=False)
    assert cached == fresh


def test_evidence_of_a_sibling_reaches_a_cached_answer():
    adv = ProfilingAdvisor()
    adv.register("a-000", "a")
    adv.register("a-001", "a")
    for t in range(0, 400, 40):
        adv.observe("a-000", float(t), 2, 190.0 * t)
    before = adv.model("a-001")
    assert before.rate(2) == pytest.approx(190.0)
    for t in range(0, 400, 40):
        adv.observe("a-001", float(t), 4, 340.0 * t)
    # a-000 never ran at 4: its (cached) model must now know the sibling's 4-node rate
    assert adv.model("a-000").rate(4) == pytest.approx(340.0)
    adv.forget("a-001")
    assert adv.model("a-000").rate(4) == pytest.approx(340.0)


def test_declaring_a_job_again_unchanged_keeps_the_cache_a_new_kind_does_not():
    adv = ProfilingAdvisor()
    for job in ("a-000", "a-001"):
        adv.register(job, "a")
    for t in range(0, 400, 40):
        adv.observe("a-000", float(t), 2, 190.0 * t)
    cached = adv.model("a-001")
    adv.register("a-000", "a")  # the daemon declares every job at every tick
    adv.register("a-001", None)
    assert adv.model("a-001") is cached  # not rebuilt
    adv.register("a-000", "b")  # moved to another kind: a-001 loses its evidence
    assert adv.model("a-001") is not cached
    assert adv.model("a-001").points != cached.points  # no measured point of kind a left


def test_answers_may_lag_more_evidence_at_known_sizes_by_refresh_s_only():
    """The daemon (refresh_s = 30): a job's model is refitted at most every 30 s of report
    time while its kind only adds evidence at sizes it knows; a new size, a measured cost
    or a sibling leaving refreshes it at once (core.answers)."""
    adv = ProfilingAdvisor(AdvisorSettings(refresh_s=30.0, warmup_s=0.0))
    adv.register("a-000", "a")
    adv.register("a-001", "a")
    adv.observe("a-000", 0.0, 2, 0.0)
    adv.observe("a-000", 10.0, 2, 1900.0)
    first = adv.model("a-001")
    assert first.rate(2) == pytest.approx(190.0)
    # more evidence at 2 nodes, slower: within 30 s the answer stands
    adv.observe("a-000", 20.0, 2, 1900.0 + 1500.0)
    assert adv.model("a-001") is first
    adv.observe("a-000", 40.0, 2, 1900.0 + 1500.0 + 3000.0)
    refreshed = adv.model("a-001")
    assert refreshed is not first and refreshed.rate(2) == pytest.approx(6400.0 / 40.0)
    # a size measured for the first time is known at once, whatever the clock
    adv.observe("a-001", 41.0, 4, 0.0)
    adv.observe("a-001", 42.0, 4, 340.0)
    assert adv.model("a-000").rate(4) == pytest.approx(340.0)
    assert adv.model("a-001").rate(4) == pytest.approx(340.0)


def test_exact_answers_with_refresh_zero():
    adv = ProfilingAdvisor(AdvisorSettings(warmup_s=0.0))
    adv.observe("j", 0.0, 2, 0.0)
    adv.observe("j", 10.0, 2, 1900.0)
    assert adv.model("j").rate(2) == pytest.approx(190.0)
    adv.observe("j", 11.0, 2, 1900.0 + 100.0)
    assert adv.model("j").rate(2) == pytest.approx(2000.0 / 11.0)


def test_answers_are_kept_while_the_profile_stands_and_a_prior_never_is():
    """A tick asks the advisor once per job (``answers``); the same object comes back until
    the job's merged profile is worked out again, except for a job with no rate of its own
    or of its kind, whose prior follows every other job's rates."""
    adv = ProfilingAdvisor(AdvisorSettings(refresh_s=30.0, warmup_s=0.0))
    adv.register("a-000", "a")
    adv.register("new", "b")
    adv.observe("a-000", 0.0, 2, 0.0)
    adv.observe("a-000", 10.0, 2, 2000.0)
    told = adv.answers("a-000")
    assert adv.answers("a-000") is told
    prior = adv.answers("new")
    assert prior.model.rate(1) == pytest.approx(100.0)  # the median rate per node
    assert prior.measured_sizes == () and prior.model.measured_max_nodes == 0
    adv.observe("a-000", 20.0, 2, 2000.0 + 1000.0)  # more evidence at 2 nodes: may lag
    assert adv.answers("a-000") is told
    adv.register("c-000", "c")
    adv.observe("c-000", 0.0, 1, 0.0)
    adv.observe("c-000", 10.0, 1, 3000.0)
    # another kind's first rate moves the prior of "new" (its own pool did not change)
    assert adv.answers("new").model.rate(1) == pytest.approx(300.0)
    adv.observe("a-000", 21.0, 4, 3000.0)
    adv.observe("a-000", 22.0, 4, 3000.0 + 380.0)  # a new size: worked out at once
    assert adv.answers("a-000") is not told
    assert adv.answers("a-000").measured_sizes == (2, 4)

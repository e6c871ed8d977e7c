"""The Profiling Advisor: curves, warm-up, rescale costs, priors, persistence."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain.core.profiling.profile import AdvisorSettings, fit_curve
from malletrain.core.profiling.profiler import ProfilingAdvisor

TRUE = {1: 100.0, 2: 190.0, 4: 340.0, 8: 500.0}
#: costs exactly as measured (no shrinkage towards the default), for exact expectations
EXACT = AdvisorSettings(cost_prior_weight=0.0)


class Feed:
    """Drives the advisor the way the simulator does: net progress, losses deducted."""

    def __init__(self, adv, job="j", t=0.0, n=1):
        self.adv, self.job, self.t, self.n, self.samples = adv, job, t, n, 0.0
        adv.observe(job, t, n, 0.0)

    def run(self, seconds, step=10.0, rate=None):
        for _ in range(int(seconds / step)):
            self.t += step
            self.samples += (TRUE[self.n] if rate is None else rate) * step
            self.adv.observe(self.job, self.t, self.n, self.samples)

    def rescale(self, new_n, cost_s):
        self.samples -= cost_s * TRUE[self.n]
        self.adv.rescaled(self.job, self.t, self.n, new_n)
        self.n = new_n


def test_learns_curve_and_costs_from_forced_rescales():
    adv = ProfilingAdvisor(EXACT)
    f = Feed(adv, n=2)
    f.run(100)
    f.rescale(4, 15.0)
    f.run(100)
    f.rescale(1, 7.0)
    f.run(100)
    f.rescale(8, 20.0)
    f.run(100)
    model = adv.model("j")
    assert model.points == tuple((n, pytest.approx(r)) for n, r in sorted(TRUE.items()))
    up, down = adv.scale_costs("j")
    assert up == pytest.approx(17.5) and down == pytest.approx(7.0)
    # beyond the largest size: at most the last measured marginal (concavity bound)
    assert model.optimistic_slope == pytest.approx((500.0 - 340.0) / 4)


def test_warmup_progress_is_discarded():
    adv = ProfilingAdvisor(AdvisorSettings(warmup_s=30.0))
    f = Feed(adv, n=1)
    f.run(100)
    f.rescale(2, 0.0)
    f.run(30, rate=20.0)  # slow first steps after joining
    f.run(100)
    assert adv.model("j").rate(2) == pytest.approx(190.0)


def test_a_short_warm_up_stint_counts_as_untried_a_long_one_as_evidence():
    """A brief stint at 2 nodes (only its stalled warm-up seen) must not flatten the curve.

    Regression: the daemon grew a job to 2 nodes for a second, the rendezvous stall made
    that interval look no faster than 1 node, the fit became flat and the job was never
    regrown. A warm-up stint of at least ``min_warmup_evidence_s`` still counts (replays,
    where every stint lasts the whole warm-up, do better with it), and with nothing clean
    measured at all, warm-up is better than nothing.
    """
    def stint(seconds):
        adv = ProfilingAdvisor(AdvisorSettings(warmup_s=30.0, min_warmup_evidence_s=10.0))
        f = Feed(adv, n=1)
        f.run(100)
        f.rescale(2, 0.0)
        f.run(seconds, step=seconds / 2, rate=100.0)  # stalled: no faster than 1 node
        f.rescale(1, 0.0)
        f.run(100)
        return adv

    short = stint(2.0)
    assert short.measured_sizes("j") == (1,)
    assert short.model("j").rate(2) > short.model("j").rate(1) * 1.5  # untried: optimistic
    long = stint(20.0)
    assert long.measured_sizes("j") == (1, 2)
    assert long.model("j").rate(2) == pytest.approx(long.model("j").rate(1))
    fresh = ProfilingAdvisor(AdvisorSettings(warmup_s=30.0))
    g = Feed(fresh, job="k", n=1)
    g.run(4, step=2.0, rate=80.0)
    assert fresh.model("k").rate(1) == pytest.approx(80.0)


def test_daemon_style_pause_measures_cost_in_allocator_units():
    adv = ProfilingAdvisor(AdvisorSettings(warmup_s=20.0, cost_prior_weight=0.0))
    adv.observe("j", 0.0, 2, 0.0)
    adv.observe("j", 50.0, 2, 50 * 190.0)
    adv.rescaled("j", 50.0, 2, 4)
    # 12 s with no progress, then full speed at 4 nodes; reports every 5 s
    s = 50 * 190.0
    for t in range(55, 200, 5):
        s = 50 * 190.0 + max(0, t - 62) * 340.0
        adv.observe("j", float(t), 4, s)
    up, _ = adv.scale_costs("j")
    # 12 s x 340/s of samples lost, charged at the old rate (190/s)
    assert up == pytest.approx(12 * 340.0 / 190.0, rel=1e-6)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.integers(1, 64),
        st.tuples(st.floats(0.0, 1e4), st.floats(0.1, 100.0)),
        min_size=1,
        max_size=8,
    )
)
def test_fit_is_monotone_concave_and_bounded(rates):
    model = fit_curve(rates, optimism=1.0)
    pts = [(0, 0.0), *model.points]
    for (n0, r0), (n1, r1) in itertools.pairwise(pts):
        assert n1 > n0 and r1 >= r0 - 1e-9
    slopes = [(r1 - r0) / (n1 - n0) for (n0, r0), (n1, r1) in itertools.pairwise(pts)]
    for s0, s1 in itertools.pairwise(slopes):
        assert s1 <= s0 + 1e-6
    assert model.optimistic_slope <= slopes[-1] + 1e-9
    # the fit never falls below the largest measured rate at the largest size
    top = max(rates)
    assert model.rate(top) >= max(r for r, _ in rates.values()) - 1e-6 or len(rates) > 1


def test_unknown_job_prior_is_population_median_then_kind_profile():
    adv = ProfilingAdvisor()
    assert adv.model("new").rate(4) == pytest.approx(4 * 1.0)
    for name, per_node in (("a", 10.0), ("b", 30.0), ("c", 50.0)):
        adv.observe(name, 0.0, 2, 0.0)
        adv.observe(name, 100.0, 2, 100 * 2 * per_node)
    assert adv.model("new").rate(3) == pytest.approx(3 * 30.0)
    adv.register("a", "bert")
    adv.forget("a")
    adv.register("a2", "bert")
    assert adv.model("a2").rate(2) == pytest.approx(20.0)
    assert adv.measured_sizes("a2") == (2,)


def test_profiles_round_trip_and_bad_input_names_the_field():
    adv = ProfilingAdvisor()
    adv.register("j", "resnet")
    f = Feed(adv, n=2)
    f.run(100)
    f.rescale(4, 10.0)
    f.run(100)
    stored = adv.profile_dict("resnet")
    again = ProfilingAdvisor.from_dict(adv.to_dict())
    again.register("k", "resnet")
    assert again.model("k") == adv.model("j")
    assert again.scale_costs("k") == adv.scale_costs("j")
    assert stored is not None
    with pytest.raises(ValueError, match=r"clean: size .x."):
        ProfilingAdvisor().load_profile("r", {**stored, "clean": {"x": [1.0, 1.0]}})
    with pytest.raises(ValueError, match="scale_up_s"):
        ProfilingAdvisor().load_profile("r", {**stored, "scale_up_s": [1.0]})
    with pytest.raises(ValueError, match="version"):
        ProfilingAdvisor().load_profile("r", {**stored, "version": 99})


def test_implicit_rescale_and_out_of_order_reports():
    adv = ProfilingAdvisor(AdvisorSettings(warmup_s=0.0))
    adv.observe("j", 0.0, 1, 0.0)
    adv.observe("j", 10.0, 1, 1000.0)
    adv.observe("j", 5.0, 1, 10.0)  # late report: ignored
    adv.observe("j", 20.0, 2, 1000.0)  # size changed without rescaled(): warm-up interval
    adv.observe("j", 30.0, 2, 3000.0)
    assert adv.model("j").rate(1) == pytest.approx(100.0)
    assert adv.model("j").rate(2) == pytest.approx(200.0)


def test_compound_change_is_not_measured_and_swaps_restart_warmup():
    adv = ProfilingAdvisor(AdvisorSettings(warmup_s=0.0))
    f = Feed(adv, n=4)
    f.run(100)
    # Slurm takes a node, the allocator regrows at the same instant: losses mixed
    f.rescale(3, 12.0)
    f.samples -= 18.0 * TRUE[4]
    adv.rescaled("j", f.t, 3, 4)
    f.n = 4
    f.run(100)
    assert adv.scale_costs("j") == (20.0, 10.0)  # defaults: nothing measurable
    # a swap (same count, other nodes) loses progress but is not a rate sample
    f.samples -= 3.0 * TRUE[4]
    adv.rescaled("j", f.t, 4, 4)
    f.run(10)
    assert adv.model("j").rate(4) == pytest.approx(TRUE[4])


def test_running_jobs_of_one_kind_share_measurements():
    adv = ProfilingAdvisor(EXACT)
    adv.register("a", "resnet")
    adv.register("b", "resnet")
    fa = Feed(adv, job="a", n=2)
    fa.run(100)
    fa.rescale(8, 18.0)
    fa.run(100)
    # b never ran at 8 nodes, but a (same kind, still running) did
    fb = Feed(adv, job="b", n=4)
    fb.run(100)
    model = adv.model("b")
    assert model.rate(8) == pytest.approx(TRUE[8])
    assert model.rate(4) == pytest.approx(TRUE[4])
    assert adv.scale_costs("b")[0] == pytest.approx(18.0)


def test_a_warm_up_stint_does_not_replace_its_kinds_clean_rate():
    """theta23-d100-sia, docs/evaluation.md: a job's 26 s at 64 nodes, all warm-up
    (stall included), replaced its kind's clean hours at 64, and its curve went flat
    beyond 47 for a day. Where the kind measured a size clean, a job's own warm-up there
    does not count; its own clean measurements still do."""
    adv = ProfilingAdvisor(EXACT)
    adv.register("a", "resnet")
    adv.register("b", "resnet")
    fa = Feed(adv, job="a", n=4)
    fa.run(100)
    fa.rescale(8, 18.0)
    fa.run(200)  # a measures 8 nodes clean
    fb = Feed(adv, job="b", n=4)
    fb.run(100)
    fb.rescale(8, 5.0)
    fb.run(20)  # b's own stint at 8: warm-up only, the scale-up's stall in it (415/s)
    fb.rescale(4, 5.0)
    fb.run(100)
    assert adv.model("b").rate(8) == pytest.approx(TRUE[8])
    # once b measured 8 clean itself, its own measurement is what counts
    fb.rescale(8, 18.0)
    fb.run(100, rate=450.0)
    assert adv.model("b").rate(8) == pytest.approx(450.0)


def test_optimistic_below_the_smallest_measured_size():
    adv = ProfilingAdvisor()
    adv.observe("j", 0.0, 8, 0.0)
    adv.observe("j", 100.0, 8, 100 * 317.0)
    model = adv.model("j")
    # between the linear lower bound 317/8 and the flat upper bound 317
    assert 317.0 / 8 < model.rate(1) < 317.0
    assert model.rate(1) == pytest.approx(317.0 / 8**0.5)
    plain = ProfilingAdvisor(AdvisorSettings(optimistic_below=False))
    plain.observe("j", 0.0, 8, 0.0)
    plain.observe("j", 100.0, 8, 100 * 317.0)
    assert plain.model("j").rate(1) == pytest.approx(317.0 / 8)


def test_one_noisy_cost_measurement_cannot_make_every_node_worthless():
    """Measured live: a preemption measured at minutes (a co-located batch job slowed the
    first clean interval) became the job's scale-down cost, and since every reclaim costs
    a scale-down of the whole job, no node whose hole may end looked worth using.
    Measurements are clipped and shrunk towards the default."""
    adv = ProfilingAdvisor(AdvisorSettings(default_scale_down_s=10.0))
    f = Feed(adv, n=4)
    f.run(100)
    f.rescale(2, 500.0)  # the outlier
    f.run(600)
    _, down = adv.scale_costs("j")
    assert down <= (120.0 + 10.0) / 2
    raw = ProfilingAdvisor(AdvisorSettings(max_cost_s=600.0, cost_prior_weight=0.0))
    g = Feed(raw, n=4)
    g.run(100)
    g.rescale(2, 500.0)
    g.run(600)
    assert raw.scale_costs("j")[1] == pytest.approx(500.0)  # what it was before


def test_start_cost_is_measured_from_starts_and_defaults_to_scale_up():
    adv = ProfilingAdvisor(EXACT)
    adv.register("j", "x")
    adv.observe("j", 0.0, 0, 0.0)
    assert adv.start_cost_s("j") == adv.scale_costs("j")[0] == 20.0
    # placed on 2 nodes at t=0; the first samples come 18 s later, then full speed
    adv.rescaled("j", 0.0, 0, 2)
    for t in range(5, 200, 5):
        adv.observe("j", float(t), 2, max(0, t - 18) * TRUE[2])
    assert adv.start_cost_s("j") == pytest.approx(18.0)
    assert adv.scale_costs("j") == (20.0, 10.0)  # a start is not a scale-up
    # stored with the kind's profile: a new job of that kind starts from it
    again = ProfilingAdvisor.from_dict(adv.to_dict(), EXACT)
    again.register("k", "x")
    assert again.start_cost_s("k") == pytest.approx(18.0)


def test_rate_noise_is_zero_for_exact_rates_and_measured_otherwise():
    exact = ProfilingAdvisor()
    Feed(exact, n=2).run(200)
    assert exact.rate_noise("j") == pytest.approx(0.0, abs=1e-12)
    noisy = ProfilingAdvisor()
    f = Feed(noisy, n=2)
    for i in range(40):
        f.run(10, rate=TRUE[2] * (1.1 if i % 2 else 0.9))  # +-10 % per interval
    assert 0.07 < noisy.rate_noise("j") < 0.15
    assert ProfilingAdvisor().rate_noise("unknown") == 0.0

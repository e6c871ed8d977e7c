"""The communication-aware step model (core/comm.py)."""

from __future__ import annotations

import math

import pytest

from malletrain.core.profiling.comm import SHAPES, StepTimes, fit_comm


def times(sync: dict[int, float], compute_s: float = 0.4, per_node: float = 32.0
          ) -> dict[int, StepTimes]:
    return {n: StepTimes(compute_s, s, per_node) for n, s in sync.items()}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_shape_is_recovered_and_predicts_sizes_never_measured(shape: str) -> None:
    g = SHAPES[shape]
    true = {n: 0.05 + 0.2 * g(n) for n in (2, 3, 4, 6, 8, 16)}
    fit = fit_comm(times({n: true[n] for n in (2, 3, 4)}))
    assert fit is not None and fit.shape == shape
    assert fit.sync_a_s == pytest.approx(0.05) and fit.sync_b_s == pytest.approx(0.2)
    for n in (6, 8, 16):
        assert fit.rate(n) == pytest.approx(n * 32.0 / (0.4 + true[n]))


def test_one_node_alone_says_nothing_about_synchronisation() -> None:
    assert fit_comm(times({1: 0.01})) is None
    assert fit_comm({}) is None


def test_one_multi_node_size_grows_like_log2_from_zero() -> None:
    fit = fit_comm(times({1: 0.01, 2: 0.3}))
    assert fit is not None and fit.shape == "log2" and fit.sync_a_s == 0.0
    assert fit.sync_s(2) == pytest.approx(0.3) and fit.sync_s(8) == pytest.approx(0.9)
    assert fit.sync_s(1) == 0.01  # measured on one node: used as it is


def test_sync_falling_with_size_is_not_extrapolated_downwards() -> None:
    fit = fit_comm(times({2: 0.9, 3: 0.6, 4: 0.5}))  # noise: never below what was seen
    assert fit is not None and fit.sync_b_s == 0.0
    assert fit.sync_s(16) == pytest.approx((0.9 + 0.6 + 0.5) / 3)


def test_weights_favour_the_better_measured_sizes_and_residuals_are_reported() -> None:
    base = {n: 0.1 * math.log2(n) for n in (2, 4, 8)}
    noisy = {**{n: StepTimes(0.4, s, 32.0, weight=100.0) for n, s in base.items()},
             3: StepTimes(0.4, 2.0, 32.0, weight=0.01)}  # a short, wild stint
    fit = fit_comm(noisy)
    assert fit is not None
    assert fit.sync_s(16) == pytest.approx(0.4, rel=0.05)
    assert fit.sync_sd_s() > 0


def test_temper_lowers_the_optimistic_extension_where_sync_says_so() -> None:
    from malletrain.core.model import ThroughputModel
    from malletrain.core.profiling.comm import temper

    curve = ThroughputModel(((1, 100.0), (2, 190.0)), optimistic_slope=90.0,
                            measured_max_nodes=2)
    # a step of 0.4 s compute; sync 0.4 s at 2 nodes, growing as log2: 8 nodes ~ 1.2 s
    fit = fit_comm(times({1: 0.0, 2: 0.4}, per_node=40.0))
    tempered = temper(curve, fit)
    assert tempered.rate(2) == 190.0 and tempered.measured_max_nodes == 2
    want_8 = 190.0 * fit.rate(8) / fit.rate(2)
    assert tempered.rate(8) == pytest.approx(want_8) and want_8 < curve.rate(8)
    # a job whose sync is negligible keeps the advisor's optimism
    flat = fit_comm(times({1: 0.0, 2: 0.001}))
    assert temper(curve, flat).rate(8) == pytest.approx(curve.rate(8))
    assert temper(curve, None) is curve


def test_the_advisor_keeps_step_splits_per_kind_and_through_storage() -> None:
    from malletrain.core.profiling.profiler import ProfilingAdvisor

    adv = ProfilingAdvisor()
    adv.register("j1", "bert")
    for t in range(0, 400, 20):  # long enough at 2 nodes to be clean
        adv.observe("j1", float(t), 2, 8.0 * t)
        adv.step_times("j1", 2, step_s=1.0, sync_s=0.5, samples_per_node=4.0)
    before = adv.model("j1").rate(6)
    data = adv.to_dict()
    again = ProfilingAdvisor.from_dict(data)
    again.register("j2", "bert")  # a new job of the kind inherits the split
    for t in range(0, 400, 20):
        again.observe("j2", float(t), 2, 8.0 * t)
    assert again.model("j2").rate(6) == pytest.approx(before)
    untempered = ProfilingAdvisor()
    for t in range(0, 400, 20):
        untempered.observe("j3", float(t), 2, 8.0 * t)
    assert before < untempered.model("j3").rate(6)  # the sync-heavy job looks worse at 6


@pytest.mark.parametrize("bad", [{"2": [1.0, 2.0]}, {"2": [1.0, -1.0, 1.0, 1.0]},
                                 {"x": [1.0, 1.0, 1.0, 1.0]}, [1, 2]])
def test_a_malformed_stored_step_split_is_refused_by_name(bad: object) -> None:
    from malletrain.core.profiling.profile import PROFILE_VERSION, Profile

    with pytest.raises(ValueError, match="steps"):
        Profile.from_dict({"version": PROFILE_VERSION, "steps": bad})

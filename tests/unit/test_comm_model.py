"""The communication-aware step model (core/comm.py)."""

from __future__ import annotations

import math

import pytest

from malletrain.core.comm import SHAPES, StepTimes, fit_comm


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

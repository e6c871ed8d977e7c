"""Online hole-length distribution: Kaplan-Meier with censoring, prior, tracker."""

from __future__ import annotations

import numpy as np
import pytest

from malletrain.core.model import IdleNode
from malletrain.core.scavenging.holes import HoleLengthModel, HoleTracker


def test_learns_exponential_holes():
    model = HoleLengthModel(prior_floor=0.0)
    model.observe_many(np.random.default_rng(0).exponential(200.0, 20_000))
    rem, p_end = model.expected_remaining_s([0.0, 100.0, 300.0], horizon_s=1800.0)
    # memoryless: E[min(L - a, H) | L > a] ~ 200 s at every age, reclaim almost sure
    assert rem == pytest.approx([200.0, 200.0, 200.0], rel=0.1)
    assert (p_end > 0.99).all()


def test_heavy_tail_older_holes_last_longer():
    model = HoleLengthModel()
    rng = np.random.default_rng(1)
    model.observe_many(rng.lognormal(np.log(475.0), 1.8, 20_000))
    rem, p_end = model.expected_remaining_s([10.0, 600.0, 3600.0, 20_000.0], horizon_s=3600.0)
    assert np.all(np.diff(rem) > 0)
    assert np.all(np.diff(p_end) < 0)
    assert (rem <= 3600.0).all()


def test_a_node_idle_past_the_last_bin_keeps_its_window():
    """Philly's day-60 replay: nodes idle since the log's first day (5.2e6 s, past the
    model's last bin edge at 3e6 s) were valued at a window of 0 and a job on 21 of them
    was stopped, its user's part left unused for hours. Past the last edge the survival
    stays at its last value: the window is the horizon, a reclaim within it unlikely."""
    model = HoleLengthModel(prior_floor=0.1)
    model.observe_many(np.random.default_rng(2).lognormal(np.log(475.0), 1.8, 5_000))
    ages = [2.0e6, model.max_s - 1.0, model.max_s + 1.0, 5.2e6]
    rem, p_end = model.expected_remaining_s(ages, horizon_s=1800.0)
    assert rem == pytest.approx([1800.0] * 4, rel=1e-3)
    assert (p_end < 1e-3).all()


def test_censoring_open_holes_lengthens_the_estimate():
    """Holes still open at a large age are evidence that holes can be long."""
    model = HoleLengthModel(prior_weight=0.0, prior_floor=0.0)
    model.observe_many([100.0] * 50)
    short, _ = model.expected_remaining_s([50.0], 3600.0, open_ages_s=np.array([]))
    censored, _ = model.expected_remaining_s([50.0], 3600.0, open_ages_s=np.full(50, 5000.0))
    assert censored[0] > 5 * short[0]


def test_prior_matches_published_numbers_before_any_data():
    model = HoleLengthModel()
    _rem, p_end = model.expected_remaining_s([0.0], horizon_s=300.0, open_ages_s=np.array([]))
    # DESIGN §1: 40% of holes are shorter than 5 minutes
    assert p_end[0] == pytest.approx(0.40, abs=0.03)


def test_tracker_turns_vanished_nodes_into_hole_lengths():
    tracker = HoleTracker(HoleLengthModel(prior_weight=0.0, prior_floor=0.0))
    tracker.update(100.0, [IdleNode("a", None, 30.0), IdleNode("b", None, 0.0)])
    tracker.update(160.0, [IdleNode("b", None, 60.0)])
    # a: idle since t=70, gone at t=160 -> one hole of 90 s
    assert tracker.model.observed == 1.0
    rem, p_end = tracker.model.expected_remaining_s([0.0], 1000.0, open_ages_s=np.array([]))
    assert rem[0] == pytest.approx(90.0, rel=0.15)
    assert p_end[0] == pytest.approx(1.0)


def test_round_trip_and_bad_input():
    model = HoleLengthModel()
    model.observe_many([10.0, 20.0, 3000.0])
    again = HoleLengthModel.from_dict(model.to_dict())
    ages = [0.0, 100.0]
    np.testing.assert_allclose(
        again.expected_remaining_s(ages, 600.0)[0], model.expected_remaining_s(ages, 600.0)[0]
    )
    bad = model.to_dict()
    bad["events"] = bad["events"][:3]
    with pytest.raises(ValueError, match="events"):
        HoleLengthModel.from_dict(bad)


def test_short_holes_cannot_outweigh_the_prior_floor():
    """A run of short holes must not make young unplanned nodes look worthless."""
    learned_only = HoleLengthModel()  # default: no floor
    floored = HoleLengthModel(prior_floor=0.1)
    for model in (learned_only, floored):
        model.observe_many([30.0] * 5000)
    rem0, p0 = learned_only.expected_remaining_s([5.0], 1800.0)
    rem1, p1 = floored.expected_remaining_s([5.0], 1800.0)
    prior_rem, _ = HoleLengthModel().expected_remaining_s([5.0], 1800.0, np.array([]))
    assert rem0[0] < 40.0 and p0[0] > 0.99  # the data alone: gone in seconds, surely
    assert rem1[0] >= 0.1 * prior_rem[0] and p1[0] <= 0.98
    # old holes stay valued by their age, and the floor changes well-learned ages little
    old0, _ = learned_only.expected_remaining_s([20_000.0], 1800.0)
    old1, _ = floored.expected_remaining_s([20_000.0], 1800.0)
    assert old1[0] == pytest.approx(old0[0], rel=0.1) and old1[0] > 1000.0

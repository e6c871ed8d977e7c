"""The loop's pause between ticks: shorter while yielding, longer while Slurm is slow."""

from __future__ import annotations

from malletrain.daemon.service.loop import (
    BACKOFF_FACTOR,
    FOLLOW_UP_TICK_S,
    SLOW_OBSERVE_S,
    next_sleep_s,
)


def test_the_interval_when_slurm_answers_quickly():
    assert next_sleep_s(5.0, False, 0.2) == 5.0
    assert next_sleep_s(5.0, True, 0.2) == FOLLOW_UP_TICK_S
    assert next_sleep_s(0.1, True, 0.2) == 0.1  # never longer than the interval itself


def test_a_slow_slurm_stretches_every_pause_even_while_yielding():
    slow = SLOW_OBSERVE_S + 1.0
    assert next_sleep_s(5.0, False, slow) == BACKOFF_FACTOR * slow
    assert next_sleep_s(5.0, True, slow) == BACKOFF_FACTOR * slow
    assert next_sleep_s(60.0, False, slow) == 60.0  # a long interval is already gentle
    # at most a quarter of the loop's time is spent waiting on slurmctld
    assert slow / (slow + next_sleep_s(1.0, False, slow)) <= 0.25

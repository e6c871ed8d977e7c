"""The job lifecycle table: allowed paths work, everything else is refused, history replays."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from malletrain.core.lifecycle import (
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    JobPhase,
    Lifecycle,
    advance,
    replay,
)

P = JobPhase


def test_happy_path_with_rescales_eviction_and_completion():
    lc = Lifecycle.new(0.0)
    for i, to in enumerate([P.QUEUED, P.STARTING, P.RUNNING, P.EVICTED, P.STARTING,
                            P.RUNNING, P.STALLED, P.RUNNING, P.COMPLETING, P.COMPLETED]):
        lc = advance(lc, to, float(i + 1), f"step {i}")
    assert lc.state is P.COMPLETED
    assert [t.to_state for t in lc.history][:3] == [P.SUBMITTING, P.QUEUED, P.STARTING]
    assert lc.history[-1].reason == "step 9"
    assert lc.since_s() == 10.0
    assert replay(lc.history) == lc


def test_terminal_states_allow_nothing():
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset()
        assert state.terminal and not state.active


def test_cannot_start_a_cancelled_or_complete_a_queued_job():
    lc = advance(Lifecycle.new(0.0), P.CANCELLED, 1.0, "user cancelled")
    with pytest.raises(IllegalTransition, match="cancelled -> starting"):
        advance(lc, P.STARTING, 2.0, "tick")
    queued = advance(Lifecycle.new(0.0), P.QUEUED, 1.0, "slots attached")
    with pytest.raises(IllegalTransition, match="queued -> completed"):
        advance(queued, P.COMPLETED, 2.0, "?")


def test_every_state_has_a_row_and_every_non_terminal_can_fail():
    assert set(TRANSITIONS) == set(JobPhase)
    for state in JobPhase:
        if not state.terminal:
            assert P.FAILED in TRANSITIONS[state] or state is P.COMPLETING


def test_replay_rejects_a_doctored_history():
    lc = advance(Lifecycle.new(0.0), P.QUEUED, 1.0, "ok")
    bad = (*lc.history, lc.history[1])  # queued -> queued again, from "submitting"
    with pytest.raises(IllegalTransition):
        replay(bad)
    with pytest.raises(IllegalTransition):
        replay(lc.history[1:])


@given(st.lists(st.sampled_from(list(JobPhase)), max_size=30))
def test_random_walks_either_follow_the_table_or_raise(targets):
    lc = Lifecycle.new(0.0)
    for i, to in enumerate(targets):
        if to in TRANSITIONS[lc.state]:
            lc = advance(lc, to, float(i), "walk")
        else:
            with pytest.raises(IllegalTransition):
                advance(lc, to, float(i), "walk")
    assert replay(lc.history) == lc
    for t in lc.history[1:]:
        assert t.to_state in TRANSITIONS[t.from_state]

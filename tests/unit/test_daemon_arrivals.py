"""ArrivalProbe: wakes the daemon's loop when a pending job is new since the last snapshot.

(The query against a real cluster: tests/slurm/test_backend_contract.py; the probe runs in
every daemon of the e2e tests.)
"""

from __future__ import annotations

import threading

from malletrain.daemon.arrivals import ArrivalProbe
from malletrain.slurm.errors import SlurmUnavailableError
from malletrain.slurm.parse_text import parse_job_ids


class Slurm:
    """What squeue would answer: a settable set of pending ids, or an error."""

    def __init__(self) -> None:
        self.pending: frozenset[int] = frozenset()
        self.down = False
        self.calls = 0

    def __call__(self) -> frozenset[int]:
        self.calls += 1
        if self.down:
            raise SlurmUnavailableError("squeue: no answer within 20 s")
        return self.pending


def probe(interval_s=0.25):
    slurm, wakes = Slurm(), []
    return ArrivalProbe(slurm, lambda: wakes.append(1), interval_s), slurm, wakes


def test_a_new_pending_job_wakes_the_loop_once():
    p, slurm, wakes = probe()
    p.expect([11, 12], armed=True)  # our slots / jobs the last tick saw
    slurm.pending = frozenset({11, 12})
    assert not p.probe_once() and not wakes
    slurm.pending = frozenset({11, 12, 40})  # a regular job arrives
    assert p.probe_once() and len(wakes) == 1
    assert not p.probe_once() and len(wakes) == 1  # the same arrival wakes once
    p.expect([11, 12, 40], armed=True)  # the woken tick saw it
    slurm.pending = frozenset({11, 12, 40, 41})
    assert p.probe_once() and len(wakes) == 2


def test_no_probe_while_no_node_is_held_or_when_off():
    p, slurm, wakes = probe()
    slurm.pending = frozenset({40})
    p.expect([], armed=False)
    assert not p.probe_once() and slurm.calls == 0
    p.expect([], armed=True)
    p.interval_s = 0  # slurm.arrival_probe_s: 0 after a reload
    assert not p.probe_once() and slurm.calls == 0 and not wakes


def test_a_failed_probe_wakes_nothing_and_the_next_one_works():
    p, slurm, wakes = probe()
    p.expect([], armed=True)
    slurm.down = True
    assert not p.probe_once() and not wakes
    slurm.down, slurm.pending = False, frozenset({40})
    assert p.probe_once() and wakes == [1]


def test_the_thread_probes_until_stopped():
    woken = threading.Event()
    slurm = Slurm()
    slurm.pending = frozenset({40})
    p = ArrivalProbe(slurm, woken.set, interval_s=0.01)
    p.expect([], armed=True)
    p.start()
    try:
        assert woken.wait(5.0)
    finally:
        p.stop()
    calls = slurm.calls
    assert calls >= 1
    threading.Event().wait(0.05)
    assert slurm.calls == calls  # stopped: no more queries


def test_parse_job_ids_keeps_job_ids_and_skips_the_rest():
    assert parse_job_ids("40\n 41 \n\n42_3\nJOBID\n") == {40, 41}
    assert parse_job_ids("") == frozenset()


def test_a_slow_answer_slows_the_probe_down():
    """At a centre's queue size the query itself takes time: the probe waits a multiple of
    it, so it never keeps slurmctld busy more than a fraction of the time."""
    import time

    slurm, wakes = Slurm(), []

    def slow_query() -> frozenset[int]:
        time.sleep(0.2)
        return slurm()

    p = ArrivalProbe(slow_query, lambda: wakes.append(1), 0.25)
    assert p.wait_s() == 0.25
    p.expect([], armed=True)
    p.probe_once()
    assert 0.2 <= p.last_query_s < 0.5
    assert p.wait_s() == p.BACKOFF_FACTOR * p.last_query_s
    slurm.pending = frozenset()
    p.interval_s = 0
    assert p.wait_s() == p.OFF_RECHECK_S

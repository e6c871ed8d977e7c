"""ArrivalProbe: wakes the daemon's loop when a pending job is new since the last snapshot.

(The query against a real cluster: tests/slurm/test_backend_contract.py; the probe runs in
every daemon of the e2e tests.)
"""

from __future__ import annotations

import threading
import time

from malletrain.daemon.observe.arrivals import ArrivalProbe, SubmitNotice
from malletrain.slurm.errors import SlurmUnavailableError
from malletrain.slurm.parsers.parse_text import parse_job_ids


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


# -- the submit notice (slurm/job_submit.lua rewrites it at every submission) ---------------


def turn(p):
    """One turn of the probe's thread, after its pace (1 ms here) has passed."""
    time.sleep(0.002)
    return p.turn()


def notice_probe(tmp_path, interval_s=0.001):
    slurm, wakes = Slurm(), []
    path = tmp_path / "submit-notice"
    path.write_text("1795790618 1\n")
    path.chmod(0o644)
    p = ArrivalProbe(slurm, lambda: wakes.append(1), interval_s, SubmitNotice(path))
    p.expect([11], armed=True)
    return p, slurm, wakes, path


def test_with_a_notice_slurm_is_asked_only_after_a_submission(tmp_path):
    p, slurm, wakes, path = notice_probe(tmp_path)
    slurm.pending = frozenset({11})
    for _ in range(20):  # a quiet queue: the notice does not change, Slurm is not asked
        assert not turn(p)
    assert slurm.calls == 0
    slurm.pending = frozenset({11, 40})  # a regular job arrives; slurmctld writes the notice
    path.write_text("1795790618 2\n")
    assert turn(p) and wakes == [1] and slurm.calls == 1
    for _ in range(5):  # it woke the loop: nothing more is owed
        assert not turn(p)
    assert slurm.calls == 1


def test_a_notice_before_its_job_exists_is_probed_once_more(tmp_path):
    """The lua hook runs before slurmctld creates the job: the first probe may miss it."""
    p, slurm, wakes, path = notice_probe(tmp_path)
    slurm.pending = frozenset({11})
    turn(p)
    path.write_text("1795790618 2\n")
    assert not turn(p) and slurm.calls == 1  # too early: the job is not there yet
    slurm.pending = frozenset({11, 40})
    assert turn(p) and wakes == [1] and slurm.calls == 2
    slurm.pending = frozenset({11, 40, 41})  # a job no notice announced: the tick's to find
    for _ in range(5):
        assert not turn(p)
    assert slurm.calls == 2


def test_forged_notices_cannot_make_the_probe_ask_faster_than_its_pace(tmp_path):
    p, slurm, _wakes, path = notice_probe(tmp_path, interval_s=3600)
    turn(p)
    for i in range(50):
        path.write_text(f"1795790618 {i + 2}\n")
        turn(p)
    assert slurm.calls == 1  # the first; then the pace (arrival_probe_s) holds


def test_an_unusable_notice_falls_back_to_polling_and_says_why_once(tmp_path, caplog):
    p, slurm, _wakes, path = notice_probe(tmp_path)
    path.chmod(0o666)  # anyone could write it
    with caplog.at_level("WARNING", logger="malletrain.daemon.observe.arrivals"):
        for _ in range(3):
            turn(p)
    assert slurm.calls == 3  # polls, as without a notice
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "writable by group or others (mode 666)" in warned[0]
    path.chmod(0o644)  # mended: back to asking only on a change
    turn(p)
    calls = slurm.calls
    for _ in range(5):
        turn(p)
    assert slurm.calls == calls


def test_a_link_a_fifo_or_no_file_is_not_a_notice(tmp_path):
    import os

    target = tmp_path / "target"
    target.write_text("1\n")
    target.chmod(0o644)
    (tmp_path / "link").symlink_to(target)
    os.mkfifo(tmp_path / "fifo", 0o644)
    for name, why in (("link", "cannot be opened"), ("fifo", "is not a regular file"),
                      ("absent", "cannot be opened")):
        notice = SubmitNotice(tmp_path / name)
        assert notice.changed() is None and notice.problem is not None
        assert notice.problem.startswith(why), (name, notice.problem)


def test_the_thread_wakes_the_loop_on_a_notice(tmp_path):
    woken = threading.Event()
    slurm = Slurm()
    path = tmp_path / "submit-notice"
    path.write_text("0 0\n")
    path.chmod(0o644)
    p = ArrivalProbe(slurm, woken.set, 0.01, SubmitNotice(path))
    p.expect([], armed=True)
    p.start()
    try:
        threading.Event().wait(0.3)
        assert slurm.calls == 0 and not woken.is_set()
        slurm.pending = frozenset({40})
        path.write_text("0 1\n")
        assert woken.wait(5.0)
    finally:
        p.stop()


def test_a_notice_caught_half_written_counts_once(tmp_path):
    """lua's io.open(path, "w") truncates, then writes: an empty read is not a notice."""
    p, slurm, wakes, path = notice_probe(tmp_path)
    turn(p)
    path.write_text("")
    assert not turn(p) and slurm.calls == 0
    slurm.pending = frozenset({11, 40})
    path.write_text("1795790618 2\n")
    assert turn(p) and wakes == [1] and slurm.calls == 1

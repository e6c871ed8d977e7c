"""Concurrent scontrol actions made as one scontrol script (slurm/coalesce.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pytest

from malletrain.slurm.coalesce import CoalescedScontrol
from malletrain.slurm.commands import (
    job_list_failures,
    render_act_line,
    render_update_line,
    script_verbs,
)
from malletrain.slurm.errors import SlurmCommandError, SlurmUnavailableError


def wait_for_callers(c: CoalescedScontrol, n: int) -> None:
    """Until ``n`` callers wait in the open batch (the call before it still runs)."""
    batches = c._batches
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with batches._cond:
            if batches._open is not None and batches._open.callers == n:
                return
        time.sleep(0.01)
    raise AssertionError(f"{n} callers never gathered")


# ---------------------------------------------------------------- scontrol scripts

#: what 22.05's scontrol printed on the dev cluster (exit 1 each)
RELEASE_ONE_GONE = "Invalid job id specified for job 999\nslurm_suspend error: No error\n"
REQUEUE_TWO_BAD = ("Job is pending execution for job 3\n"
                   "Invalid job id specified for job 1000000000000\n")
UPDATE_UNKNOWN = ("scontrol: error: Could not load state information for job 999999: Invalid "
                  "job id specified\n")
DOWN = ("scontrol: error: Unable to contact slurm controller (connect failure)\n"
        "slurm_suspend error: Unable to contact slurm controller (connect failure)\n")


def test_slurm_names_the_ids_it_could_not_act_on():
    lines = [render_act_line("release", 1), "update JobId=2 NodeList=n2",
             render_act_line("release", 999)]
    assert lines[0] == "release 1"
    assert script_verbs(lines) == {1: "release", 2: "update", 999: "release"}
    argv = ["scontrol", "script"]
    failed = job_list_failures(argv, [1, 2, 999], 1, RELEASE_ONE_GONE, script_verbs(lines))
    assert list(failed) == [999]
    assert isinstance(failed[999], SlurmCommandError)
    assert str(failed[999]) == "scontrol release 999 failed: Invalid job id specified"
    failed = job_list_failures(argv, [3, 4, 1000000000000], 1, REQUEUE_TWO_BAD,
                               {3: "requeuehold", 4: "update", 1000000000000: "hold"})
    assert sorted(failed) == [3, 1000000000000]
    assert str(failed[3]).startswith("scontrol requeuehold 3 failed: Job is pending execution")
    assert job_list_failures(argv, [1, 2], 0, "") == {}
    # an update line of an unknown job (22.05 on the dev cluster)
    failed = job_list_failures(argv, [1, 999999], 1, UPDATE_UNKNOWN, {999999: "update"})
    assert list(failed) == [999999]
    assert str(failed[999999]) == ("scontrol update 999999 failed: Could not load state "
                                   "information: Invalid job id specified")


def test_a_whole_failure_is_raised_and_never_guessed_per_job():
    argv = ["scontrol", "script"]
    with pytest.raises(SlurmUnavailableError, match="not answering"):
        job_list_failures(argv, [4, 5], 1, DOWN)
    # a line about a job not in the call is not taken as that call's answer
    with pytest.raises(SlurmCommandError):
        job_list_failures(argv, [4, 5], 1, "Invalid job id specified for job 6\n")
    with pytest.raises(ValueError):
        render_act_line("cancel", 1)


class ScontrolScript:
    """``scontrol`` reading a script, knowing jobs below 1000; the first call blocks.
    ``garbled`` lines make the whole call fail without naming a job."""

    def __init__(self, down: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.release = threading.Event()
        self.first_in = threading.Event()
        self.down = down

    def run(self, ids: Sequence[int], lines: Sequence[str]) -> dict[int, Exception]:
        self.calls.append(list(lines))
        if len(self.calls) == 1:
            self.first_in.set()
            assert self.release.wait(10)
        argv = ["scontrol", "script"]
        if self.down:
            return job_list_failures(argv, ids, 1, DOWN)
        if any("garbled" in line for line in lines):
            return job_list_failures(argv, ids, 1, "scontrol: error: Invalid input\n")
        bad = "".join(f"Invalid job id specified for job {i}\n" for i in ids if i >= 1000)
        return job_list_failures(argv, ids, 1 if bad else 0, bad, script_verbs(lines))


def at_once(c: CoalescedScontrol, s: ScontrolScript, ids: list[int],
            call: Callable[[int], None]) -> dict[int, object]:
    """``call(id)`` per id: the first one runs alone and blocks; the rest gather behind it."""
    results: dict[int, object] = {}

    def one(i: int) -> None:
        try:
            call(i)
            results[i] = None
        except (SlurmCommandError, SlurmUnavailableError) as exc:
            results[i] = exc

    first = threading.Thread(target=one, args=(ids[0],))
    first.start()
    assert s.first_in.wait(5)
    rest = [threading.Thread(target=one, args=(i,)) for i in ids[1:]]
    for t in rest:
        t.start()
    wait_for_callers(c, len(rest))
    s.release.set()
    for t in [first, *rest]:
        t.join(10)
    return results


def placements(ids: list[int]) -> dict[int, str]:
    return {i: f"update JobId={i} NodeList=n{i} StartTime=now" for i in ids}


def mixed(c: CoalescedScontrol, lines: dict[int, str]) -> Callable[[int], None]:
    """Each id's call: its update line, or an act where its line is a verb alone."""
    def call(i: int) -> None:
        if lines[i].startswith("update "):
            c.update(i, lines[i])
        else:
            c.act(lines[i], i)
    return call


def test_acts_and_updates_arriving_during_a_call_share_one_script():
    s = ScontrolScript()
    c = CoalescedScontrol(s.run)
    lines = {1: "release", **placements([2, 3]), 4: "requeuehold", 5: "hold"}
    results = at_once(c, s, list(lines), mixed(c, lines))
    assert results == dict.fromkeys(lines)
    assert s.calls[0] == ["release 1"]
    assert sorted(s.calls[1]) == sorted(["update JobId=2 NodeList=n2 StartTime=now",
                                         "update JobId=3 NodeList=n3 StartTime=now",
                                         "requeuehold 4", "hold 5"])
    assert len(s.calls) == 2


def test_an_id_slurm_refuses_fails_its_own_caller_only_and_is_not_repeated():
    s = ScontrolScript()
    c = CoalescedScontrol(s.run)
    lines = {1: "release", 2: "release", 5000: "release", **placements([3, 6000])}
    results = at_once(c, s, list(lines), mixed(c, lines))
    assert results[1] is None and results[2] is None and results[3] is None
    assert isinstance(results[5000], SlurmCommandError) and "release 5000" in str(
        results[5000])
    assert isinstance(results[6000], SlurmCommandError) and "update 6000" in str(
        results[6000])
    assert len(s.calls) == 2  # never repeated alone: the others were acted on already


def test_slurm_down_fails_every_act_and_update_of_the_call():
    s = ScontrolScript(down=True)
    c = CoalescedScontrol(s.run)
    lines = {1: "release", 2: "hold", **placements([3, 4])}
    results = at_once(c, s, list(lines), mixed(c, lines))
    assert all(isinstance(r, SlurmUnavailableError) for r in results.values()), results


def test_a_script_failing_as_a_whole_is_repeated_alone_by_each_update_only():
    """One odd line fails the script without naming a job: each update of the batch is
    made again alone, and only the odd one fails; an act of that batch fails (it may have
    run: a release or park is never repeated blindly)."""
    s = ScontrolScript()
    c = CoalescedScontrol(s.run)
    lines = {**placements([1, 2, 3]), 4: "update JobId=4 garbled", 5: "release"}
    results = at_once(c, s, list(lines), mixed(c, lines))
    assert [results[i] for i in (1, 2, 3)] == [None] * 3
    assert isinstance(results[4], SlurmCommandError)
    assert isinstance(results[5], SlurmCommandError)
    assert sorted(map(tuple, s.calls[2:])) == sorted(
        (lines[i],) for i in (2, 3, 4))


def test_an_update_line_is_the_argv_after_scontrol_or_none_where_blanks_would_split_it():
    assert render_update_line(5, {"NodeList": ["n1", "n2", "n3"], "TimeLimit": 12}) == (
        "update JobId=5 NodeList=n[1-3] TimeLimit=12")
    assert render_update_line(5, {"Comment": "two words"}) is None
    assert render_update_line(5, {"Comment": "it's"}) is None
    assert render_update_line(5, {"Comment": 'say"x"'}) is None
    with pytest.raises(ValueError):
        render_update_line(5, {"NodeList": "n1\nupdate JobId=6 Priority=1"})


def test_a_line_finding_nothing_running_waits_for_the_rest_of_its_wave():
    """With ``gather_s``, lines arriving a moment apart while no script runs share one
    script (without it, the first runs alone: the test above); each waits no more than
    about ``gather_s`` for it."""
    runs: list[list[str]] = []

    def run(ids: Sequence[int], lines: Sequence[str]) -> dict[int, Exception]:
        runs.append(list(lines))
        return {}

    c = CoalescedScontrol(run, gather_s=0.3)
    t0 = time.monotonic()
    first = threading.Thread(target=c.act, args=("release", 1))
    first.start()
    time.sleep(0.05)
    c.update(2, "update JobId=2 NodeList=n2")
    first.join(5)
    assert runs == [["release 1", "update JobId=2 NodeList=n2"]]
    assert 0.25 <= time.monotonic() - t0 < 2.0
    c.act("hold", 3)  # alone: runs once its wait is over
    assert runs[1:] == [["hold 3"]]

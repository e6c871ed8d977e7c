"""``--dependency`` and ``--array`` as Slurm reads them, and what the tick does with them:
a waiting job takes no part in the allocation, a job that never can start fails with the
reason, an array is one malleable job per task with Slurm's variables and its throttle."""

from __future__ import annotations

import dataclasses

import pytest
from tick_scenes import NOW, node, record, slot_job, world

from malletrain.core.cluster import JobState
from malletrain.core.lifecycle import JobPhase, advance
from malletrain.daemon.jobs.array_tasks import task_count, task_spec
from malletrain.daemon.jobs.dependency import (
    Condition,
    DependencyError,
    parse_dependency,
)
from malletrain.daemon.jobs.spec import JobSpec, SpecError
from malletrain.daemon.jobs.store import SlotRecord
from malletrain.daemon.tick.actions import Transit
from malletrain.daemon.tick.screen import screen
from malletrain.daemon.tick.views import job_slots
from malletrain.daemon.tick.waiting import Verdict, judge
from malletrain.elastic.restart.arrays import ArrayError, parse_array
from malletrain.elastic.restart.batchio import expand

P = JobPhase


def test_dependencies_read_as_slurm_reads_them():
    dep = parse_dependency("afterok:m12:13,afterany:7,after:9+5,singleton")
    assert dep.conditions == (
        Condition("afterok", "m12"), Condition("afterok", "m13"),
        Condition("afterany", "m7"), Condition("after", "m9", 300), Condition("singleton"))
    assert not dep.any_of
    assert parse_dependency("afterok:m3?afternotok:m3").any_of


@pytest.mark.parametrize("text, says", [
    ("afterok:m1,afterany:m2?afterok:m3", "cannot be mixed"),
    ("afterwards:m1", "is not one of"),
    ("aftercorr:m1", "array task to array task"),
    ("afterok", "needs a job id"),
    ("afterok:12_3", "not a malleable job id"),
    ("afterok:m1+5", "not a malleable job id"),  # +minutes only after 'after'
    ("singleton:m1", "takes no job id"),
])
def test_a_dependency_slurm_would_refuse_is_refused_with_the_reason(text, says):
    with pytest.raises(DependencyError, match=says):
        parse_dependency(text)


def _ended(job_id, to, seq=1, name="x"):
    rec = record(job_id, P.RUNNING, seq=seq)
    rec = dataclasses.replace(rec, spec=dataclasses.replace(rec.spec, name=name))
    via = {P.COMPLETED: P.COMPLETING, P.CANCELLED: P.CANCELLING}.get(to)
    lc = advance(rec.lifecycle, via, NOW - 60, "test") if via else rec.lifecycle
    return dataclasses.replace(rec, lifecycle=advance(lc, to, NOW - 50, "test"))


def _waiting(dep, seq=9, name="x"):
    rec = record("m9", P.QUEUED, seq=seq)
    spec = dataclasses.replace(rec.spec, dependency=dep, name=name)
    return dataclasses.replace(rec, spec=spec)


@pytest.mark.parametrize("dep, target_state, verdict", [
    ("afterok:m1", P.COMPLETED, Verdict.MET),
    ("afterok:m1", P.FAILED, Verdict.NEVER),
    ("afterok:m1", P.CANCELLED, Verdict.NEVER),
    ("afterok:m1", P.RUNNING, Verdict.WAIT),
    ("afternotok:m1", P.FAILED, Verdict.MET),
    ("afternotok:m1", P.CANCELLED, Verdict.MET),
    ("afternotok:m1", P.COMPLETED, Verdict.NEVER),
    ("afterany:m1", P.CANCELLED, Verdict.MET),
    ("afterany:m1", P.RUNNING, Verdict.WAIT),
    ("after:m1", P.RUNNING, Verdict.MET),  # started
    ("after:m1+60", P.RUNNING, Verdict.WAIT),  # started 399 s ago, not an hour
    ("afterok:m1?afterany:m1", P.FAILED, Verdict.MET),  # one of them is enough
])
def test_each_kind_of_dependency_is_judged_as_slurm_judges_it(dep, target_state, verdict):
    running = target_state is P.RUNNING
    target = record("m1", P.RUNNING) if running else _ended("m1", target_state)
    job = _waiting(dep)
    assert judge(parse_dependency(dep), job, {"m1": target, "m9": job}, NOW)[0] is verdict


def test_singleton_waits_for_the_users_earlier_job_of_the_same_name():
    earlier = record("m1", P.RUNNING, seq=1)
    earlier = dataclasses.replace(earlier, spec=dataclasses.replace(earlier.spec, name="x"))
    job = _waiting("singleton", name="x")
    jobs = {"m1": earlier, "m9": job}
    assert judge(parse_dependency("singleton"), job, jobs, NOW)[0] is Verdict.WAIT
    other_name = _waiting("singleton", name="y")
    assert judge(parse_dependency("singleton"), other_name, jobs, NOW)[0] is Verdict.MET


def test_a_job_whose_target_was_forgotten_counts_it_as_ended():
    job = _waiting("afterany:m1")
    assert judge(parse_dependency("afterany:m1"), job, {"m9": job}, NOW)[0] is Verdict.MET


def _parked(records):
    """Each job with one parked node slot, as a queued job has."""
    jobs = [slot_job(100 + i, r.job_id, 0, JobState.PENDING, "JobHeldUser")
            for i, r in enumerate(records)]
    return jobs, [SlotRecord(r.job_id, 0, 100 + i) for i, r in enumerate(records)]


def test_the_tick_leaves_a_waiting_job_out_and_fails_one_that_never_can_start():
    running = record("m1", P.RUNNING)
    waits = dataclasses.replace(_waiting("afterok:m1"), job_id="m2", seq=2)
    failed = _ended("m3", P.FAILED, seq=3)
    never = dataclasses.replace(_waiting("afterok:m3"), job_id="m4", seq=4)
    free = record("m5", P.QUEUED, seq=5)
    records = [running, waits, failed, never, free]
    w = world([node("n1")], *_parked(records), records)
    out = screen(w, job_slots(w))
    assert [j.job_id for j in out.managed] == ["m1", "m5"]
    assert Transit("m4", P.FAILED, "dependency never satisfied: afterok:m3") in out.actions
    assert not [a for a in out.actions if getattr(a, "job_id", "") == "m2"]
    # the same job without its dependency takes part
    plain = dataclasses.replace(waits, spec=dataclasses.replace(waits.spec, dependency=None))
    w2 = world([node("n1")], *_parked([running, plain]), [running, plain])
    assert [j.job_id for j in screen(w2, job_slots(w2)).managed] == ["m1", "m2"]


def test_a_started_job_is_never_held_back_by_its_dependency_again():
    job = dataclasses.replace(record("m2", P.STARTING, seq=2),
                              spec=JobSpec(script="/x/t.py", max_nodes=2,
                                           dependency="afterok:m1"))
    lc = advance(job.lifecycle, P.QUEUED, NOW - 1, "its first start failed")
    back = dataclasses.replace(job, lifecycle=lc)
    records = [record("m1", P.RUNNING), back]
    w = world([node("n1")], *_parked(records), records)
    assert [j.job_id for j in screen(w, job_slots(w)).managed] == ["m1", "m2"]


# -- arrays ---------------------------------------------------------------------------------

def test_arrays_read_as_sbatch_reads_them():
    assert parse_array("0-3").task_ids == (0, 1, 2, 3)
    assert parse_array("1,3,5-9:2").task_ids == (1, 3, 5, 7, 9)
    a = parse_array("0-15:5%2")
    assert a.task_ids == (0, 5, 10, 15) and a.throttle == 2 and a.step == 5
    assert parse_array("1,2,7").step == 1
    assert parse_array("4-6").env(5, 120) == {
        "SLURM_ARRAY_JOB_ID": "120", "SLURM_ARRAY_TASK_ID": "5",
        "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "4",
        "SLURM_ARRAY_TASK_MAX": "6", "SLURM_ARRAY_TASK_STEP": "1"}


@pytest.mark.parametrize("text", ["", "a-b", "5-2", "0-4:0", "0-3%0", "0-2000", "0-999"])
def test_an_array_slurm_or_malletrain_would_refuse_is_refused(text):
    with pytest.raises(ArrayError):
        parse_array(text)


def test_each_task_is_a_job_named_after_the_first_and_the_throttle_chains_them():
    spec = JobSpec(script="/x/t.sh", array="10-13%2", array_task_id=10,
                   dependency="afterok:m5")
    assert task_count(spec) == 4
    submitted = ["m20", "m21", "m22"]
    first = task_spec(spec, 0, [])
    assert (first.array_task_id, first.array_job_id, first.dependency) == (
        10, None, "afterok:m5")
    third = task_spec(spec, 2, submitted[:2])
    assert (third.array_task_id, third.array_job_id, third.dependency) == (
        12, 20, "afterok:m5,afterany:m20")
    assert task_spec(spec, 3, submitted).dependency == "afterok:m5,afterany:m21"


def test_a_throttle_cannot_join_an_any_of_dependency():
    spec = JobSpec(script="/x/t.sh", array="0-3%1", array_task_id=0,
                   dependency="afterok:m5?afterany:m6")
    with pytest.raises(SpecError, match="cannot be combined"):
        task_spec(spec, 1, ["m7"])


def test_output_names_carry_the_array_job_and_the_task():
    assert expand("log-%A_%a.out", 22, "x", "n1", "alice", (20, 2)) == "log-20_2.out"
    assert expand("log-%A_%4a.out", 22, "x", "n1", "alice", (20, 2)) == "log-20_0002.out"
    assert expand("log-%A_%a.out", 22, "x", "n1", "alice") == "log-22_4294967294.out"

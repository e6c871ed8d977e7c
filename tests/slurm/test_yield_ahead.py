"""decide()'s pool on a REAL snapshot: a held node a regular job is planned onto is given back.

The scene is built in Slurm, not by hand: a malletrain slot job (tagged, scavenger
partition) runs on n1, a regular job runs on n2 with a 1-minute limit, and a 2-node regular
job is pinned to n1,n2. It cannot start yet (n2 is busy with a job Slurm may not preempt),
so Slurm does not preempt the slot either; backfill plans it onto n1 and n2 at the end of
n2's job. That plan, read through the CLI backend and ``earliest_claims``, must make
``decide`` give n1 back when the planned start is within ``yield_ahead_s``, and keep it when
it is further ahead. (Waiting for the claim to come within the default 10 s would take a
minute, so the test widens the horizon instead.)
"""

from __future__ import annotations

import time

import pytest

from malletrain.core.lifecycle import JobPhase, Lifecycle, advance
from malletrain.core.policies import make_policy
from malletrain.core.scavenging.scavenger import earliest_claims
from malletrain.daemon.jobs.slots import slot_tag
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.daemon.jobs.store import JobRecord, SlotRecord
from malletrain.daemon.tick import CoordView, DecideSettings, Registration, World, decide
from malletrain.daemon.tick.actions import Leave
from malletrain.slurm.hostlist import expand_hostlist
from malletrain.slurm.select import select_backend

pytestmark = pytest.mark.slurm


def _running_record(now: float) -> JobRecord:
    lc = Lifecycle.new(now - 100)
    for i, to in enumerate((JobPhase.QUEUED, JobPhase.STARTING, JobPhase.RUNNING)):
        lc = advance(lc, to, now - 90 + i, "test")
    spec = JobSpec(script="/x/train.py", min_nodes=1, max_nodes=1)
    return JobRecord("m1", 1, 1000, "mt-alice", spec, lc, now - 100)


def test_a_held_node_a_pinned_regular_job_is_planned_onto_is_given_back(clean_cluster):
    c = clean_cluster
    slot = c.sbatch("-p", "scavenger", "-N1", "-w", "n1", "--exclusive", "-t", "10",
                    f"--comment={slot_tag('m1', 0)}", user="mt-alice",
                    wrap="exec srun sleep 600")
    blocker = c.sbatch("-p", "batch", "-w", "n2", "-t", "1", user="mt-bob",
                       wrap="srun sleep 300")
    c.wait_until(lambda: c.job_state(slot) == "RUNNING" and c.job_state(blocker) == "RUNNING",
                 what="the slot on n1 and the regular job on n2")
    c.wait_step_running(slot)
    c.wait_step_running(blocker)
    big = c.sbatch("-p", "batch", "-N2", "-w", "n1,n2", "-t", "1", user="mt-bob",
                   wrap="srun true")
    c.wait_until(lambda: "n1" in expand_hostlist(c.scontrol_job(big).get("SchedNodeList", "")),
                 timeout_s=20, what="the backfill plan of the 2-node job")
    assert c.job_state(slot) == "RUNNING"  # Slurm has not preempted it: big cannot start

    snap = select_backend(timeout_s=20).snapshot()
    now = time.time()
    claim_in_s = snap.job(big).start_time - now
    assert 20 < claim_in_s <= 62, claim_in_s  # the end of n2's 1-minute job
    # the claim carries the job's submission (yield_confirm_s counts from it)
    submitted = earliest_claims(snap, now)["n1"].submitted_at
    assert submitted is not None and now - 60 < submitted <= now, submitted

    def plan(**settings: float):
        world = World(
            now_s=now, snapshot=snap, jobs=(_running_record(now),),
            slots={"m1": (SlotRecord("m1", 0, slot, last_status="running", last_node="n1"),)},
            coord={"m1": CoordView(epoch=1, members=("s0-r0",),
                                   live={"s0-r0": Registration("n1", now - 30)},
                                   samples_total=100, progress_at_s=now)},
            models={}, settings=DecideSettings(**settings))
        return decide(world, make_policy("equal-share"))

    kept = plan()  # default: yield_ahead_s=10, the claim is further ahead
    assert kept.targets["m1"] == ("n1",)
    assert not [a for a in kept.actions if isinstance(a, Leave)]

    given = plan(yield_ahead_s=120.0, min_slot_time_s=120.0)
    assert given.targets["m1"] == ()
    assert Leave("m1", 0) in given.actions
    assert [f"n1: given back ahead of job {big}" in n for n in given.notes] == [True]

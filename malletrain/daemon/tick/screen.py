"""Step 2 of a tick: which jobs take part in the allocation, and which are wound down.

A job that is done or going away (completing, cancelling, terminal) gets its slots
cancelled and, once none is busy, its final phase. A managed job that hit a stop condition
(finished, time limit, repeated start failures, slots cancelled behind our back) leaves the
allocation with a transition. The rest are *managed*: the next steps allocate nodes to them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from malletrain.core.lifecycle import JobPhase
from malletrain.daemon.jobs.dependency import parse_dependency
from malletrain.daemon.jobs.slots import SlotStatus
from malletrain.daemon.jobs.store import JobRecord
from malletrain.daemon.tick.actions import Action, Cancel, Transit
from malletrain.daemon.tick.views import JobSlots
from malletrain.daemon.tick.waiting import Verdict, judge
from malletrain.daemon.tick.world import CoordView, DecideSettings, World

P = JobPhase

#: phases whose jobs hold, or wait for, scavenged nodes
MANAGED = (P.QUEUED, P.STARTING, P.RUNNING, P.STALLED, P.EVICTED)
#: slot states from which a slot can still serve its job
USABLE = (SlotStatus.PARKED, SlotStatus.PLACING, SlotStatus.RUNNING, SlotStatus.ENDING,
          SlotStatus.ENDED)


@dataclass(frozen=True)
class Screened:
    managed: tuple[JobRecord, ...]
    actions: tuple[Action, ...]
    #: job id -> what it waits for (``--dependency``): it takes no part this tick
    waiting: Mapping[str, str] = field(default_factory=dict)


def screen(world: World, slots: Mapping[str, JobSlots]) -> Screened:
    managed: list[JobRecord] = []
    actions: list[Action] = []
    by_id = {job.job_id: job for job in world.jobs}
    waiting: dict[str, str] = {}
    for job in world.jobs:
        if job.state in (P.COMPLETING, P.CANCELLING) or job.state.terminal:
            actions += wind_down(job, slots[job.job_id], world.now_s, world.settings)
        elif (held := _held_by_dependency(job, by_id, world.now_s)) is not None:
            why, transit = held
            if transit is None:
                waiting[job.job_id] = why
            else:
                actions.append(transit)  # it never can start: FAILED, with the reason
        elif job.state in MANAGED:
            stop = stop_condition(job, slots[job.job_id], world.coord_of(job.job_id),
                                  world.now_s, world.settings)
            if stop is None:
                managed.append(job)
            else:
                actions.append(stop)
        # else submitting: the user is still submitting the slots
    return Screened(tuple(managed), tuple(actions), waiting)


def _held_by_dependency(job: JobRecord, by_id: Mapping[str, JobRecord], now_s: float
                        ) -> tuple[str, Transit | None] | None:
    """None: the job takes part as usual. Else it is a queued job that never started and
    waits for its ``--dependency`` (what for, None), or that never can start (why, its
    FAILED transition)."""
    if (job.spec.dependency is None or job.state is not P.QUEUED
            or job.lifecycle.first_s(P.STARTING) is not None):
        return None
    verdict, why = judge(parse_dependency(job.spec.dependency), job, by_id, now_s)
    if verdict is Verdict.MET:
        return None
    return why, (None if verdict is Verdict.WAIT else Transit(job.job_id, P.FAILED, why))


def wind_down(job: JobRecord, js: JobSlots, now_s: float, s: DecideSettings) -> list[Action]:
    """Cancel a finishing or cancelled job's slots; its final phase once none is busy."""
    grace_over = now_s - job.lifecycle.since_s() > s.finish_grace_s
    actions: list[Action] = []
    busy = False
    for v in js.views:
        if v.status in (SlotStatus.PARKED, SlotStatus.PLACING) or (
            v.status is SlotStatus.RUNNING and (job.state is not P.COMPLETING or grace_over)
        ):
            actions.append(Cancel(job.job_id, v.slot, v.slurm_job_id))
            busy = True
        elif v.status in (SlotStatus.RUNNING, SlotStatus.ENDING):
            busy = True
    if not busy and job.state is P.COMPLETING:
        actions.append(Transit(job.job_id, P.COMPLETED,
                               f"finished after {job.samples_total} samples"))
    elif not busy and job.state is P.CANCELLING:
        actions.append(Transit(job.job_id, P.CANCELLED, "slot jobs cancelled"))
    return actions


def stop_condition(job: JobRecord, js: JobSlots, cv: CoordView, now_s: float,
                   s: DecideSettings) -> Transit | None:
    """Why a managed job leaves the allocation now, or None."""
    jid = job.job_id
    if cv.finished_samples is not None:
        return Transit(jid, P.COMPLETING, f"stop condition reached: {cv.finished_samples} samples")
    if job.spec.time_limit_s is not None and now_s > job.created_s + job.spec.time_limit_s:
        return Transit(jid, P.CANCELLING, f"time limit of {job.spec.time_limit_s} s reached")
    if cv.state_lost:
        return Transit(jid, P.FAILED, "training state lost: evicted to zero nodes, its snapshot "
                       "could not be saved in MALLETRAIN_STATE_DIR; see the slots' output")
    if len(cv.crashed) >= s.max_start_failures:
        last = f" (last: {cv.failure})" if cv.failure else ""
        return Transit(jid, P.FAILED, f"the training code failed on its own in {len(cv.crashed)} "
                       f"node slots{last}; see their output (--output)")
    if job.start_failures >= s.max_start_failures:
        return Transit(jid, P.FAILED, f"slot jobs failed {job.start_failures} times right after "
                       "starting; see their output (--output)")
    if not any(v.status in USABLE for v in js.views):
        return Transit(jid, P.CANCELLING,
                       "all slot jobs were cancelled or vanished outside malletrain")
    return None

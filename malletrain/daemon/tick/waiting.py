"""Which queued jobs wait for other jobs (``--dependency``), and which never can start.

Judged every tick against the jobs in the store, before the allocation: a job that waits
takes no part in it (it holds no nodes, its node slots stay parked); a job whose dependency
can never be satisfied fails with the reason (Slurm would leave it pending for ever). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum

from malletrain.core.lifecycle import JobPhase
from malletrain.daemon.jobs.dependency import Condition, Dependency
from malletrain.daemon.jobs.store_rows import JobRecord


class Verdict(Enum):
    MET = "met"
    WAIT = "wait"
    NEVER = "never"


def judge(dep: Dependency, job: JobRecord, jobs: Mapping[str, JobRecord],
          now_s: float) -> tuple[Verdict, str]:
    """Whether ``job`` may start now, must wait, or never can; with the reason."""
    verdicts = [(_one(c, job, jobs, now_s), c) for c in dep.conditions]
    met = [c for v, c in verdicts if v is Verdict.MET]
    never = [c for v, c in verdicts if v is Verdict.NEVER]
    waiting = [c for v, c in verdicts if v is Verdict.WAIT]
    if dep.any_of:
        if met:
            return Verdict.MET, ""
        if not waiting:
            return Verdict.NEVER, f"dependency never satisfied: {_show(never)}"
        return Verdict.WAIT, f"waiting for {_show(waiting)}"
    if never:
        return Verdict.NEVER, f"dependency never satisfied: {_show(never)}"
    if waiting:
        return Verdict.WAIT, f"waiting for {_show(waiting)}"
    return Verdict.MET, ""


def _one(c: Condition, job: JobRecord, jobs: Mapping[str, JobRecord], now_s: float
         ) -> Verdict:
    if c.kind == "singleton":
        earlier = (j for j in jobs.values() if j.seq < job.seq and j.uid == job.uid
                   and j.spec.name == job.spec.name and not j.state.terminal)
        return Verdict.WAIT if any(True for _ in earlier) else Verdict.MET
    target = jobs.get(c.job_id or "")
    if target is None:
        return Verdict.MET  # ended and forgotten (keep_ended_jobs): it ended
    state = target.state
    if c.kind == "after":
        started = target.lifecycle.first_s(JobPhase.STARTING)
        if state.terminal or (started is not None and now_s - started >= c.delay_s):
            return Verdict.MET
        return Verdict.WAIT
    if not state.terminal:
        return Verdict.WAIT
    if c.kind == "afterok":
        return Verdict.MET if state is JobPhase.COMPLETED else Verdict.NEVER
    if c.kind == "afternotok":
        return Verdict.NEVER if state is JobPhase.COMPLETED else Verdict.MET
    return Verdict.MET  # afterany


def _show(conditions: Sequence[Condition]) -> str:
    return ", ".join(c.kind if c.job_id is None else f"{c.kind}:{c.job_id}"
                     for c in conditions)

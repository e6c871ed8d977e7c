"""Step 5 of a tick: one job's target nodes against its slots, as actions.

Per slot: a running slot on a target node stays (extended if its limit nears); one off
target is asked to leave at a step boundary (its member is left out of the next membership)
and parked once it has ended, or after ``leave_timeout_s``; a placed slot that is no longer
wanted or did not start in time is held; an ended slot is parked (preempted, failed to
start, or left). Then parked slots are placed on the target nodes no slot covers yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from malletrain.core.cluster import ClusterSnapshot
from malletrain.daemon.jobs.slots import SlotStatus, SlotView, parse_member
from malletrain.daemon.jobs.store import JobRecord, SlotRecord
from malletrain.daemon.tick.actions import Action, ClearMarks, Extend, Hold, Leave, Park, Place
from malletrain.daemon.tick.timing import extension_min, time_limit_min, yield_s
from malletrain.daemon.tick.views import JobSlots, sigtermed, slot_member
from malletrain.daemon.tick.world import CoordView, DecideSettings, World


@dataclass
class SlotDiff:
    """What the slots of one job came to this tick (input of the membership step)."""

    actions: list[Action] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: target nodes a running or placed slot already covers
    covered: set[str] = field(default_factory=set)
    #: members that stay
    survivors: list[str] = field(default_factory=list)
    #: registered newcomers on target nodes: (registered at, member)
    ready: list[tuple[float, str]] = field(default_factory=list)
    #: slots on target nodes whose member has not registered yet
    waiting_for: int = 0
    #: a member must be published out of the membership
    leaving_needed: bool = False
    parked: list[SlotView] = field(default_factory=list)


@dataclass(frozen=True)
class JobContext:
    job: JobRecord
    cv: CoordView
    target: frozenset[str]
    windows: Mapping[str, float | None]
    snapshot: ClusterSnapshot
    now_s: float
    settings: DecideSettings
    #: held nodes given back to Slurm this tick, ahead of a regular job that wants them
    giving_back: frozenset[str] = frozenset()

    @classmethod
    def of(cls, world: World, job: JobRecord, target: Iterable[str],
           windows: Mapping[str, float | None],
           giving_back: Iterable[str] = ()) -> JobContext:
        return cls(job, world.coord_of(job.job_id), frozenset(target), windows,
                   world.snapshot, world.now_s, world.settings, frozenset(giving_back))

    @property
    def stops_slowly(self) -> bool:
        """A restart-mode job stops a generation with the script's ``--signal`` grace
        (seconds to a minute): a regular job must not wait for that. A native job leaves at
        its next step boundary, in a fraction of a second, and keeps its progress."""
        return self.job.spec.mode == "restart"


def reconcile(ctx: JobContext, js: JobSlots) -> SlotDiff:
    d = SlotDiff()
    for v in js.views:
        rec = js.records[v.slot]
        if v.status is SlotStatus.RUNNING:
            _running(ctx, v, rec, d)
        elif v.status is SlotStatus.PLACING:
            _placing(ctx, v, rec, d)
        elif v.status is SlotStatus.ENDED:
            d.actions.append(_park_ended(ctx, v, rec))
        elif v.status is SlotStatus.PARKED:
            if rec.placed_node is not None or rec.leaving_since_s is not None:
                d.actions.append(ClearMarks(ctx.job.job_id, v.slot))
            d.parked.append(v)
    _grow(ctx, d)
    return d


def _running(ctx: JobContext, v: SlotView, rec: SlotRecord, d: SlotDiff) -> None:
    jid, cv, s = ctx.job.job_id, ctx.cv, ctx.settings
    member = slot_member(v.slot, cv.live)
    if v.node in ctx.target and rec.leaving_since_s is None:
        d.covered.add(v.node or "")
        if member is None:
            d.waiting_for += 1
        elif member in cv.members:
            d.survivors.append(member)
        else:
            d.ready.append((cv.live[member].registered_at_s, member))
        extend = extension_min(v, ctx.windows.get(v.node or ""), s, ctx.job, ctx.now_s)
        if extend is not None:
            d.actions.append(Extend(jid, v.slot, v.slurm_job_id, extend))
    elif v.node in ctx.giving_back and ctx.stops_slowly:
        # Slurm's SIGTERM instead of the graceful stop: the script resumes from its last
        # checkpoint, as after a preemption (the e2e benchmark saw regular jobs wait
        # 1.1-1.3 s for such nodes while the script's USR1 stop ran)
        d.actions.append(Park(jid, v.slot, v.slurm_job_id,
                              "given back to a regular job (restart mode: stopped at once)",
                              node=v.node))
        if member is not None and member in cv.members:
            d.leaving_needed = True
    elif rec.leaving_since_s is not None:
        # a restart-mode script may take its --signal grace to checkpoint before it leaves
        if ctx.now_s - rec.leaving_since_s > max(s.leave_timeout_s,
                                                 ctx.job.spec.stop_grace_s + 10.0):
            d.actions.append(Park(jid, v.slot, v.slurm_job_id, "member did not leave in time",
                                  node=v.node))
        elif member is not None and member in cv.members:
            d.leaving_needed = True  # publish (again) without it
    elif member is not None and member in cv.members:
        d.actions.append(Leave(jid, v.slot))
        d.leaving_needed = True
    else:
        preempted = sigtermed(v.slot, cv)
        d.actions.append(Park(
            jid, v.slot, v.slurm_job_id,
            "preempted by Slurm (its member left on SIGTERM)" if preempted
            else "not in the plan (not yet a member)", node=v.node, preempted=preempted,
            yield_s=yield_s(ctx.snapshot, v.node, ctx.now_s) if preempted else None))


def _placing(ctx: JobContext, v: SlotView, rec: SlotRecord, d: SlotDiff) -> None:
    placed_for_us = rec.placed_node is not None and rec.placed_node in ctx.target
    timed_out = (rec.placed_at_s is not None
                 and ctx.now_s - rec.placed_at_s > ctx.settings.place_timeout_s)
    if placed_for_us and not timed_out:
        d.covered.add(rec.placed_node or "")
        d.waiting_for += 1
    else:
        why = "did not start in time" if placed_for_us else "no longer planned"
        d.actions.append(Hold(ctx.job.job_id, v.slot, v.slurm_job_id, why))


def _park_ended(ctx: JobContext, v: SlotView, rec: SlotRecord) -> Park:
    """Why a slot that Slurm shows ended did so: preempted, failed to start, or left."""
    cv = ctx.cv
    unasked = rec.leaving_since_s is None
    ended_at = v.end_time if v.end_time else ctx.now_s
    joined = rec.placed_at_s is not None and any(
        (p := parse_member(m)) is not None and p[0] == v.slot and t >= rec.placed_at_s - 1.0
        for m, t in cv.departed.items())
    start_failed = (unasked and rec.placed_at_s is not None
                    and ended_at - rec.placed_at_s < ctx.settings.start_failure_s
                    and slot_member(v.slot, cv.live) is None and not joined)
    preempted = (rec.last_status == "running" and unasked and not start_failed
                 ) or sigtermed(v.slot, cv)
    why = ("failed right after starting" if start_failed else
           "preempted or ended by Slurm" if preempted else "left the job")
    return Park(ctx.job.job_id, v.slot, v.slurm_job_id, why, preempted=preempted,
                start_failed=start_failed, node=rec.last_node,
                yield_s=yield_s(ctx.snapshot, rec.last_node, v.end_time) if preempted else None,
                gone_member=slot_member(v.slot, cv.live))


def _grow(ctx: JobContext, d: SlotDiff) -> None:
    """Parked slots onto the target nodes nobody covers yet."""
    jid = ctx.job.job_id
    for node in sorted(ctx.target - d.covered):
        if not d.parked:
            d.notes.append(f"{jid}: no parked slot left for {node}")
            break
        v = d.parked.pop(0)
        d.actions.append(Place(jid, v.slot, v.slurm_job_id, node,
                               time_limit_min(ctx.windows.get(node), ctx.settings, ctx.job,
                                              ctx.now_s)))
        d.waiting_for += 1

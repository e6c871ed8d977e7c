"""Step 1 of a tick: every slot job as the daemon sees it, and who lives in it.

A slot is a pending, placed or running single-node Slurm job of the user
(:mod:`malletrain.daemon.jobs.slots`); its member is the worker process that registered from it
with the coordinator. Both are read here once per tick, for every later step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from malletrain.core.cluster import ClusterSnapshot, Job
from malletrain.daemon.jobs.slots import SlotStatus, SlotView, classify, parse_member, parse_tag
from malletrain.daemon.jobs.store import SlotRecord
from malletrain.daemon.tick.world import CoordView, Registration, World

_MARKED = frozenset({SlotStatus.PARKED, SlotStatus.PLACING, SlotStatus.CANCELLED,
                     SlotStatus.GONE})


@dataclass(frozen=True)
class JobSlots:
    """One job's slots: what Slurm shows (views) beside what the store remembers (records)."""

    views: tuple[SlotView, ...]
    records: Mapping[int, SlotRecord]
    #: slot jobs changed outside malletrain (owner, partition, size): no longer used
    changed: tuple[str, ...] = ()


def slot_views(snapshot: ClusterSnapshot, job_id: str, records: Sequence[SlotRecord],
               user: str | None = None, partition: str | None = None
               ) -> tuple[tuple[SlotView, ...], tuple[str, ...]]:
    """Each slot as Slurm shows it, re-checked every tick (not only when it was attached).

    A slot job that no longer is what was attached (another owner, another partition, more
    than one node: changed with ``scontrol update`` after the attach) counts as gone, with a
    note, so the daemon never places, extends or counts it again.
    """
    out = []
    changed = []
    for r in records:
        sj = snapshot.job(r.slurm_job_id)
        # a recycled job id that is not our slot any more counts as gone
        if sj is not None and sj.comment and parse_tag(sj.comment) != (job_id, r.slot):
            sj = None
        problem = None if sj is None else _changed(sj, user, partition)
        if problem is not None:
            changed.append(f"{job_id}: slot job {r.slurm_job_id} {problem}; no longer used")
            sj = None
        status = classify(sj)
        node = sj.nodes[0] if sj is not None and sj.nodes else None
        out.append(SlotView(job_id, r.slot, r.slurm_job_id, status, node,
                            sj.time_limit_s if sj else None, sj.start_time if sj else None,
                            sj.end_time if sj else None))
    return tuple(out), tuple(changed)


def _changed(sj: Job, user: str | None, partition: str | None) -> str | None:
    if user is not None and sj.user != user:
        return f"belongs to {sj.user}, not {user}"
    if partition is not None and sj.partition != partition:
        return f"moved to partition {sj.partition}"
    if sj.node_count > 1 or len(sj.nodes) > 1:
        return f"asks for {max(sj.node_count, len(sj.nodes))} nodes"
    return None


def job_slots(world: World) -> dict[str, JobSlots]:
    """Every job's slots, classified from the snapshot."""
    out = {}
    for j in world.jobs:
        recs = world.slots.get(j.job_id, ())
        views, changed = slot_views(world.snapshot, j.job_id, recs, j.user,
                                    world.settings.scavenger_partition)
        out[j.job_id] = JobSlots(views, {r.slot: r for r in recs}, changed)
    return out


def slot_member(slot: int, live: Mapping[str, Registration]) -> str | None:
    """The newest incarnation of ``slot`` that is registered and has not departed."""
    best: tuple[int, str] | None = None
    for m in live:
        parsed = parse_member(m)
        if parsed is None or parsed[0] != slot:
            continue
        if best is None or parsed[1] > best[0]:
            best = (parsed[1], m)
    return None if best is None else best[1]


def sigtermed(slot: int, cv: CoordView) -> bool:
    """Whether the newest incarnation of ``slot`` that ever registered left on SIGTERM."""
    newest: tuple[int, str] | None = None
    for m in (*cv.live, *cv.departed):
        parsed = parse_member(m)
        if parsed is not None and parsed[0] == slot and (newest is None or parsed[1] > newest[0]):
            newest = (parsed[1], m)
    return newest is not None and newest[1] not in cv.live and newest[1] in cv.sigtermed


#: a slot record's marks to write: (job, slot, fields)
SlotMark = tuple[str, int, dict[str, str | None]]


def seen_slots(slot_views: Mapping[str, Sequence[SlotView]], world: World
               ) -> tuple[dict[str, tuple[str, ...]], list[SlotMark]]:
    """Each job's nodes as its slots were seen running, and the marks that record what
    each slot was seen doing (preemption = running, then ended unasked).

    Not for a ``busy`` job, whose views may predate what its actions just recorded. The
    other jobs' slot records are the world's: only these marks and a job's own actions
    write the fields compared here, and a job with actions in flight is busy.
    """
    nodes: dict[str, tuple[str, ...]] = {}
    marks: list[SlotMark] = []
    for jid, views in slot_views.items():
        if jid in world.busy:
            continue
        recs = {r.slot: r for r in world.slots.get(jid, ())}
        mine = []
        for v in views:
            rec = recs.get(v.slot)
            if rec is None:
                continue
            if v.status is SlotStatus.RUNNING:
                mine.append(v.node or "?")
                if rec.last_status != "running" or rec.last_node != v.node:
                    marks.append((jid, v.slot, {"last_status": "running", "last_node": v.node}))
            elif v.status in _MARKED and rec.last_status != v.status.value:
                marks.append((jid, v.slot, {"last_status": v.status.value}))
        nodes[jid] = tuple(sorted(mine))
    return nodes, marks

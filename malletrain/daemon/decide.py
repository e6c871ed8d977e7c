"""One tick's decision: ``decide(world) -> TickPlan``, a pure function (Ray autoscaler v2 style).

Level-triggered: the plan is recomputed from the WHOLE current view every tick (Slurm
snapshot, store records, coordinator membership/registrations/progress). Nothing depends on
having seen an earlier event, so a restarted daemon, a lost event or a half-applied tick is
repaired by the next tick. A submission or a cancellation only makes the next tick come
sooner.

The steps:

1. classify every slot job (parked, placing, running, ended ... :mod:`slots`);
2. the pool: idle nodes of the scavenger partition with a predicted window of at least
   ``min_slot_time_s`` (:mod:`malletrain.core.scavenger`) plus the nodes the jobs already
   hold, less the held nodes a foreign job is due to take (:func:`yield_ahead`); the policy
   (:mod:`malletrain.core.policies`) decides how many and which nodes each job should hold;
3. per job, the difference becomes actions: place a parked slot on each new node (time limit
   no longer than the node's window), ask the members on dropped nodes to leave at a step
   boundary (publish a membership without them) and requeue-hold their slots once they have
   ended (or after ``leave_timeout_s``), park slots that ended (preempted, time limit) and
   publish newcomers once they have registered (batched over ``publish_batch_s`` so that a
   job growing onto 4 nodes changes its membership once, not 4 times);
4. lifecycle transitions from what is observed (started, running, evicted, stalled, done).

The caller (:mod:`malletrain.daemon.daemon`) applies the actions through the actuator and
records them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from malletrain.core.cluster import ClusterSnapshot, JobState, NodeState
from malletrain.core.lifecycle import JobPhase
from malletrain.core.model import (
    AllocationInput,
    IdleNode,
    MalleableJob,
    Plan,
    Policy,
    ThroughputModel,
)
from malletrain.core.scavenger import UNUSABLE_FLAGS, earliest_claims, idle_nodes, is_idle
from malletrain.daemon.slots import SlotStatus, SlotView, classify, parse_member, parse_tag
from malletrain.daemon.store import JobRecord, SlotRecord
from malletrain.daemon.yielding import (
    RUNNING_STATES,
    Unplanned,
    serve_unplanned,
    stale_plans,
    yield_ahead,
)

P = JobPhase


@dataclass(frozen=True)
class DecideSettings:
    scavenger_partition: str = "scavenger"
    min_slot_time_s: float = 60.0
    max_slot_time_s: float = 3600.0
    #: a released slot that has not started after this long is held again (node taken).
    place_timeout_s: float = 30.0
    #: a member asked to leave whose slot has not ended after this long is requeued anyway.
    leave_timeout_s: float = 20.0
    #: newcomers of one job are published together, waiting at most this long for the rest.
    publish_batch_s: float = 8.0
    #: no progress report for this long: the job is stalled; 4x this long: failed.
    heartbeat_timeout_s: float = 30.0
    #: a finished job's slots still running after this long are cancelled.
    finish_grace_s: float = 15.0
    #: a slot that ends this soon after being placed (and was not asked to) failed to start.
    start_failure_s: float = 30.0
    #: this many start failures and the job fails (its script or environment is broken).
    max_start_failures: int = 5
    #: a running slot whose time limit ends within this is extended, if its node's window
    #: allows (otherwise it ends at its limit and the node goes back to Slurm).
    extend_margin_s: float = 180.0
    #: a held node that a foreign pending job (or a reservation) is planned to take within
    #: this long, or should already have taken, is given back now (:func:`yield_ahead`);
    #: capped at ``min_slot_time_s`` so a node given back is never placed again at once.
    yield_ahead_s: float = 10.0
    #: a claim due the moment its job was submitted is left to Slurm's own preemption for
    #: this long after the submission before its nodes are given back (:func:`yield_ahead`).
    yield_confirm_s: float = 1.0
    #: a regular job pending without a plan up to this long after its submission is served
    #: from held nodes if it needs them (:func:`~malletrain.daemon.yielding.serve_unplanned`).
    yield_unplanned_s: float = 10.0


@dataclass(frozen=True)
class Registration:
    node: str
    registered_at_s: float


@dataclass(frozen=True)
class CoordView:
    """What the coordinator says about one job."""

    epoch: int = 0
    members: tuple[str, ...] = ()
    #: live registrations (not departed since): member -> where and when.
    live: Mapping[str, Registration] = field(default_factory=dict)
    #: member -> time of its latest departure (sigterm, removed, failed...).
    departed: Mapping[str, float] = field(default_factory=dict)
    #: members whose latest departure was a SIGTERM (Slurm preempting or timing out the slot).
    sigtermed: frozenset[str] = frozenset()
    samples_total: int | None = None
    samples_per_s: float = 0.0
    progress_at_s: float | None = None
    finished_samples: int | None = None


@dataclass(frozen=True)
class JobModel:
    throughput: ThroughputModel
    scale_up_s: float
    scale_down_s: float
    #: measured cost of a start from zero nodes (None: the policy uses scale_up_s)
    start_s: float | None = None
    #: relative noise of its measured throughput (the policy's hysteresis scales with it)
    rate_noise: float = 0.0


@dataclass(frozen=True)
class World:
    now_s: float
    snapshot: ClusterSnapshot
    jobs: tuple[JobRecord, ...]
    slots: Mapping[str, tuple[SlotRecord, ...]]
    coord: Mapping[str, CoordView]
    models: Mapping[str, JobModel]
    settings: DecideSettings = DecideSettings()
    #: node -> when its current hole began (idle in Slurm or scavenged by us since then);
    #: kept by the caller from the previous tick's :attr:`TickPlan.hole_start_s`.
    hole_start_s: Mapping[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Place:
    job_id: str
    slot: int
    slurm_job_id: int
    node: str
    time_limit_min: int


@dataclass(frozen=True)
class Park:
    """``scontrol requeuehold``: back into the pool (kills the payload if still running)."""

    job_id: str
    slot: int
    slurm_job_id: int
    why: str
    preempted: bool = False
    start_failed: bool = False
    node: str | None = None
    #: seconds from the claiming job's submission to this slot's end (yield latency).
    yield_s: float | None = None


@dataclass(frozen=True)
class Extend:
    """Raise a running slot's time limit (total minutes) as its node's window allows."""

    job_id: str
    slot: int
    slurm_job_id: int
    time_limit_min: int


@dataclass(frozen=True)
class Hold:
    """``scontrol hold`` a released slot that should not start (any more)."""

    job_id: str
    slot: int
    slurm_job_id: int
    why: str


@dataclass(frozen=True)
class Leave:
    """Mark the slot as leaving (its member is left out of the next membership)."""

    job_id: str
    slot: int


@dataclass(frozen=True)
class ClearMarks:
    job_id: str
    slot: int


@dataclass(frozen=True)
class Publish:
    job_id: str
    members: tuple[str, ...]
    old_size: int


@dataclass(frozen=True)
class Cancel:
    job_id: str
    slot: int
    slurm_job_id: int


@dataclass(frozen=True)
class Transit:
    job_id: str
    to: JobPhase
    reason: str


Action = Place | Park | Extend | Hold | Leave | ClearMarks | Publish | Cancel | Transit


@dataclass(frozen=True)
class TickPlan:
    targets: Mapping[str, tuple[str, ...]]
    actions: tuple[Action, ...]
    slot_views: Mapping[str, tuple[SlotView, ...]]
    allocation: Plan | None = None
    #: nodes idle and usable (free) and held by malleable jobs, for metrics.
    free_nodes: tuple[IdleNode, ...] = ()
    held_nodes: tuple[IdleNode, ...] = ()
    hole_start_s: Mapping[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    #: Held nodes are being given back ahead of a foreign job (:func:`yield_ahead`). Slurm's
    #: backfill plan moves every pass while that job waits, and may name more of our nodes
    #: next: the loop should look again soon instead of after a whole tick interval. Also
    #: while a claim is left to Slurm for ``yield_confirm_s``: its end must be seen in time.
    follow_up: bool = False


# ----------------------------------------------------------------------------- helpers


def slot_views(snapshot: ClusterSnapshot, job_id: str, records: Sequence[SlotRecord]
               ) -> tuple[SlotView, ...]:
    out = []
    for r in records:
        sj = snapshot.job(r.slurm_job_id)
        # a recycled job id that is not our slot any more counts as gone
        if sj is not None and sj.comment and parse_tag(sj.comment) != (job_id, r.slot):
            sj = None
        status = classify(sj)
        node = sj.nodes[0] if sj is not None and sj.nodes else None
        out.append(SlotView(job_id, r.slot, r.slurm_job_id, status, node,
                            sj.time_limit_s if sj else None, sj.start_time if sj else None,
                            sj.end_time if sj else None))
    return tuple(out)


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


def _sigtermed(slot: int, cv: CoordView) -> bool:
    """Whether the newest incarnation of ``slot`` that ever registered left on SIGTERM."""
    newest: tuple[int, str] | None = None
    for m in (*cv.live, *cv.departed):
        parsed = parse_member(m)
        if parsed is not None and parsed[0] == slot and (newest is None or parsed[1] > newest[0]):
            newest = (parsed[1], m)
    return newest is not None and newest[1] not in cv.live and newest[1] in cv.sigtermed


def _yield_s(snapshot: ClusterSnapshot, node: str | None, ended_at: float | None
             ) -> float | None:
    """Seconds from a regular job's submission to our slot freeing the node it now uses.

    Only a job that wants the node after our slot is a candidate: one pending (planned on
    it, or with no plan yet but allowed on it) or one that started when our slot ended or
    later. A job that ran on the node before our slot (Slurm keeps finished jobs for
    MinJobAge) would otherwise be taken for the one we yielded to, and its whole age
    reported as the yield time (CI saw 60-120 s). Of several candidates the shortest wait
    counts: the figure is a lower bound when Slurm's choice is not known.
    """
    if node is None or ended_at is None:
        return None
    partitions = {p for n in snapshot.nodes if n.name == node for p in n.partitions}
    best: float | None = None
    for j in snapshot.jobs:
        if parse_tag(j.comment) is not None or j.submit_time is None:
            continue
        # a job Slurm preempts for need not have planned nodes yet (it may still wait for
        # other nodes): any pending job allowed on the node is a candidate
        unplanned = (j.state is JobState.PENDING and not j.planned_nodes
                     and not partitions.isdisjoint(j.partition.split(",")))
        on_node = node in j.nodes or node in j.planned_nodes or unplanned
        started_before = (j.state is not JobState.PENDING and j.start_time is not None
                          and j.start_time < ended_at - 1.0)
        if (j.state in (JobState.RUNNING, JobState.PENDING, JobState.COMPLETING,
                        JobState.COMPLETED) and on_node and not started_before
                and j.submit_time <= ended_at + 1.0):
            delay = max(0.0, ended_at - j.submit_time)
            best = delay if best is None else min(best, delay)
    return best


def _extension_min(v: SlotView, window_s: float | None, s: DecideSettings, job: JobRecord,
                   now_s: float) -> int | None:
    """The new total time limit (minutes) of a running slot close to its limit, or None."""
    if v.time_limit_s is None or v.start_time is None:
        return None
    remaining = v.start_time + v.time_limit_s - now_s
    if remaining > s.extend_margin_s:
        return None
    more_s = s.max_slot_time_s if window_s is None else min(window_s, s.max_slot_time_s)
    if job.spec.time_limit_s is not None:
        more_s = min(more_s, job.created_s + job.spec.time_limit_s - now_s)
    total_min = math.floor((now_s - v.start_time + more_s) / 60.0)
    if total_min * 60 < v.time_limit_s + s.extend_margin_s:
        return None  # not worth an update: the window ends about when the limit does
    return total_min


def _time_limit_min(window_s: float | None, s: DecideSettings, job: JobRecord, now_s: float
                    ) -> int:
    limit = s.max_slot_time_s if window_s is None else min(window_s, s.max_slot_time_s)
    if job.spec.time_limit_s is not None:
        limit = min(limit, job.created_s + job.spec.time_limit_s - now_s)
    return max(1, math.floor(limit / 60.0))


# ----------------------------------------------------------------------------- decide

_FOREIGN_BUSY = RUNNING_STATES | {JobState.COMPLETING}
_NOT_HOLES = frozenset({NodeState.DOWN, NodeState.DRAINED, NodeState.DRAINING,
                        NodeState.FUTURE, NodeState.RESERVED})
_MANAGED = (P.QUEUED, P.STARTING, P.RUNNING, P.STALLED, P.EVICTED)
_USABLE = (SlotStatus.PARKED, SlotStatus.PLACING, SlotStatus.RUNNING, SlotStatus.ENDING,
           SlotStatus.ENDED)


def decide(world: World, policy: Policy) -> TickPlan:
    s = world.settings
    now = world.now_s
    snap = world.snapshot
    actions: list[Action] = []
    notes: list[str] = []
    views = {j.job_id: slot_views(snap, j.job_id, world.slots.get(j.job_id, ()))
             for j in world.jobs}
    records = {j.job_id: {r.slot: r for r in world.slots.get(j.job_id, ())} for j in world.jobs}

    # -- cleanup of jobs that are done or going away ----------------------------------
    managed: list[JobRecord] = []
    for job in world.jobs:
        cv = world.coord.get(job.job_id, CoordView())
        vs = views[job.job_id]
        if job.state in (P.COMPLETING, P.CANCELLING) or job.state.terminal:
            grace_over = now - job.lifecycle.since_s() > s.finish_grace_s
            busy = False
            for v in vs:
                if v.status in (SlotStatus.PARKED, SlotStatus.PLACING) or (
                    v.status is SlotStatus.RUNNING
                    and (job.state is not P.COMPLETING or grace_over)
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
            continue
        if job.state not in _MANAGED:
            continue  # submitting: the user is still submitting the slots
        if cv.finished_samples is not None:
            actions.append(Transit(job.job_id, P.COMPLETING,
                                   f"stop condition reached: {cv.finished_samples} samples"))
            continue
        if job.spec.time_limit_s is not None and now > job.created_s + job.spec.time_limit_s:
            actions.append(Transit(job.job_id, P.CANCELLING,
                                   f"time limit of {job.spec.time_limit_s} s reached"))
            continue
        if job.start_failures >= s.max_start_failures:
            actions.append(Transit(job.job_id, P.FAILED,
                                   f"slot jobs failed {job.start_failures} times right after "
                                   "starting; see their output (--output)"))
            continue
        if not any(v.status in _USABLE for v in vs):
            actions.append(Transit(job.job_id, P.CANCELLING,
                                   "all slot jobs were cancelled or vanished outside malletrain"))
            continue
        managed.append(job)

    # -- the pool and the allocation --------------------------------------------------
    own_ids = {r.slurm_job_id for recs in world.slots.values() for r in recs}
    claims = earliest_claims(snap, now, exclude_job_ids=own_ids)

    def window(node: str) -> float | None:
        c = claims.get(node)
        return None if c is None else max(0.0, c.start_at - now)

    held: dict[str, list[str]] = {}
    placing: set[str] = set()  # held by a slot not started yet: the cheapest to give back
    freeing: set[str] = set()  # on their way back to Slurm
    for job in managed:
        mine: list[str] = []
        cv = world.coord.get(job.job_id, CoordView())
        for v in views[job.job_id]:
            rec = records[job.job_id][v.slot]
            if v.status is SlotStatus.RUNNING and v.node and rec.leaving_since_s is None:
                mine.append(v.node)
                if _sigtermed(v.slot, cv):
                    freeing.add(v.node)
            elif v.status is SlotStatus.PLACING and rec.placed_node:
                mine.append(rec.placed_node)
                placing.add(rec.placed_node)
            elif v.status in (SlotStatus.RUNNING, SlotStatus.ENDING) and v.node:
                freeing.add(v.node)
        held[job.job_id] = mine
    held_set = {n for ns in held.values() for n in ns}
    regular = [j for j in snap.jobs if parse_tag(j.comment) is None]
    freeing.update(n for j in regular if j.state is JobState.COMPLETING for n in j.nodes)
    # a node Slurm has already given to a regular job is not on its way to anyone else
    freeing -= {n for j in regular if j.state in RUNNING_STATES for n in j.nodes}
    # Held nodes a foreign job is about to take leave the pool: the policy drops them and the
    # difference below asks their members to leave (or parks/holds a slot not yet a member).
    ahead_s = min(s.yield_ahead_s, s.min_slot_time_s)
    # a due plan naming a node another regular job got cannot start as made: its job is
    # served like an unplanned one, and its plan claims nothing to give back ahead of
    stale = stale_plans(snap, now)
    live_claims = (earliest_claims(snap, now, exclude_job_ids=own_ids | stale) if stale
                   else claims)

    def claimed_soon(node: str) -> bool:
        c = live_claims.get(node)
        return c is not None and c.start_at - now <= ahead_s

    ahead = yield_ahead(held_set, live_claims, now, ahead_s, s.yield_confirm_s)
    giving_back = ahead.now
    # the planned start as an absolute time keeps the note the same from tick to tick while
    # the plan stands, so the daemon logs it once
    notes.extend(f"{n}: given back ahead of {c.by} (planned start {c.start_at:.0f})"
                 for n, c in sorted(giving_back.items()))
    unplanned = serve_unplanned(
        snap, now_s=now, confirm_s=s.yield_confirm_s, max_age_s=s.yield_unplanned_s,
        ahead_s=ahead_s, stale=stale,
        held=sorted(held_set - giving_back.keys() - freeing, key=lambda n: (n not in placing, n)),
        freeing=sorted(n for n in freeing - giving_back.keys() if not claimed_soon(n)),
        free=sorted(n.name for n in snap.nodes if is_idle(n) and n.name not in held_set
                    and not claimed_soon(n.name)),
    ) if s.yield_unplanned_s > 0 else Unplanned()
    notes.extend(f"{n}: given back to {c.by} (pending, not planned to start yet)"
                 for n, c in sorted(unplanned.give_back.items()))
    giving_back = {**giving_back, **unplanned.give_back}
    # Nodes our slots occupy in any state are still holes (Slurm did not take them back):
    # the policy's hole-length model must not mistake our own use of a node for its end.
    # A hole lasts until a job that is NOT ours takes the node (or it goes down). Our own
    # use of a node (a slot starting, running, leaving, the node completing after it) must
    # not look like its end to the policy's hole-length model, so every such node stays in
    # the pool: free idle nodes with their windows, held nodes with theirs, and the rest
    # (our leftovers) with a zero window, i.e. worth nothing right now.
    foreign = {n for j in regular if j.state in _FOREIGN_BUSY for n in j.nodes}
    hole_names = {
        n.name for n in snap.nodes
        if s.scavenger_partition in n.partitions and n.name not in foreign
        and not (n.flags & UNUSABLE_FLAGS) and n.state not in _NOT_HOLES
    } | held_set
    idle_now = idle_nodes(snap, now, partitions=[s.scavenger_partition], min_window_s=0.0,
                          claims=claims)
    idle_age = {n.name: n.idle_age_s for n in idle_now}
    holes: dict[str, float] = {
        name: world.hole_start_s.get(name, now - idle_age.get(name, 0.0)) for name in hole_names
    }
    free = tuple(
        IdleNode(n.name, n.window_s, idle_age_s=now - holes[n.name]) for n in idle_now
        if n.name not in held_set and n.name in holes and n.name not in unplanned.withheld
        and (n.window_s is None or n.window_s > s.min_slot_time_s)
    )
    kept = held_set - giving_back.keys()
    held_nodes = tuple(IdleNode(n, window(n), idle_age_s=now - holes[n]) for n in sorted(kept))
    offered = {n.name for n in free} | kept
    leaving_nodes = tuple(IdleNode(n, 0.0, idle_age_s=now - holes[n])
                          for n in sorted(hole_names - offered))
    alloc_jobs = []
    for job in managed:
        usable = sum(1 for v in views[job.job_id]
                     if v.status in (SlotStatus.PARKED, SlotStatus.PLACING, SlotStatus.RUNNING,
                                     SlotStatus.ENDED))
        max_n = min(job.spec.max_nodes, usable)
        if max_n < job.spec.min_nodes:
            continue
        model = world.models.get(job.job_id) or JobModel(ThroughputModel(((1, 1.0),), 1.0),
                                                         3.0, 1.0)
        alloc_jobs.append(MalleableJob(
            job_id=job.job_id, min_nodes=job.spec.min_nodes, max_nodes=max_n,
            nodes=tuple(held[job.job_id]), throughput=model.throughput,
            scale_up_s=model.scale_up_s, scale_down_s=model.scale_down_s,
            submit_order=job.seq, start_s=model.start_s, rate_noise=model.rate_noise))
    allocation: Plan | None = None
    targets: dict[str, tuple[str, ...]] = {}
    if alloc_jobs:
        allocation = policy.decide(AllocationInput(
            now_s=now, nodes=free + held_nodes + leaving_nodes, jobs=tuple(alloc_jobs)))
        # zero-window leftovers are offered to keep the hole model honest, never to be used
        targets = {k: tuple(n for n in v if n in offered)
                   for k, v in allocation.assignments.items()}
    windows = {n.name: n.window_s for n in free + held_nodes}

    # -- per job: the difference ------------------------------------------------------
    for job in managed:
        jid = job.job_id
        cv = world.coord.get(jid, CoordView())
        target = set(targets.get(jid, ()))
        covered: set[str] = set()
        parked: list[SlotView] = []
        survivors: list[str] = []  # members that stay
        ready: list[tuple[float, str]] = []  # registered newcomers on target nodes
        waiting_for = 0  # slots on target nodes whose member has not registered yet
        leaving_needed = False
        for v in views[jid]:
            rec = records[jid][v.slot]
            member = slot_member(v.slot, cv.live)
            if v.status is SlotStatus.RUNNING:
                stays = v.node in target and rec.leaving_since_s is None
                if stays:
                    covered.add(v.node or "")
                    if member is None:
                        waiting_for += 1
                    elif member in cv.members:
                        survivors.append(member)
                    else:
                        ready.append((cv.live[member].registered_at_s, member))
                    extend = _extension_min(v, windows.get(v.node or ""), s, job, now)
                    if extend is not None:
                        actions.append(Extend(jid, v.slot, v.slurm_job_id, extend))
                    continue
                if rec.leaving_since_s is not None:
                    if now - rec.leaving_since_s > s.leave_timeout_s:
                        actions.append(Park(jid, v.slot, v.slurm_job_id,
                                            "member did not leave in time", node=v.node))
                    elif member is not None and member in cv.members:
                        leaving_needed = True  # publish (again) without it
                elif member is not None and member in cv.members:
                    actions.append(Leave(jid, v.slot))
                    leaving_needed = True
                else:
                    preempted = _sigtermed(v.slot, cv)
                    actions.append(Park(
                        jid, v.slot, v.slurm_job_id,
                        "preempted by Slurm (its member left on SIGTERM)" if preempted
                        else "not in the plan (not yet a member)", node=v.node,
                        preempted=preempted,
                        yield_s=_yield_s(snap, v.node, now) if preempted else None))
            elif v.status is SlotStatus.PLACING:
                placed_for_us = rec.placed_node is not None and rec.placed_node in target
                timed_out = (rec.placed_at_s is not None
                             and now - rec.placed_at_s > s.place_timeout_s)
                if placed_for_us and not timed_out:
                    covered.add(rec.placed_node or "")
                    waiting_for += 1
                else:
                    why = "did not start in time" if placed_for_us else "no longer planned"
                    actions.append(Hold(jid, v.slot, v.slurm_job_id, why))
            elif v.status is SlotStatus.ENDED:
                unasked = rec.leaving_since_s is None
                ended_at = v.end_time if v.end_time else now
                joined = rec.placed_at_s is not None and any(
                    (p := parse_member(m)) is not None and p[0] == v.slot
                    and t >= rec.placed_at_s - 1.0 for m, t in cv.departed.items())
                start_failed = (unasked and rec.placed_at_s is not None
                                and ended_at - rec.placed_at_s < s.start_failure_s
                                and slot_member(v.slot, cv.live) is None and not joined)
                preempted = (rec.last_status == "running" and unasked and not start_failed
                             ) or _sigtermed(v.slot, cv)
                node = rec.last_node
                why = ("failed right after starting" if start_failed else
                       "preempted or ended by Slurm" if preempted else "left the job")
                actions.append(Park(
                    jid, v.slot, v.slurm_job_id, why, preempted=preempted,
                    start_failed=start_failed, node=node,
                    yield_s=_yield_s(snap, node, v.end_time) if preempted else None))
            elif v.status is SlotStatus.PARKED:
                if rec.placed_node is not None or rec.leaving_since_s is not None:
                    actions.append(ClearMarks(jid, v.slot))
                parked.append(v)
        # grow: parked slots onto target nodes nobody covers yet
        for node in sorted(target - covered):
            if not parked:
                notes.append(f"{jid}: no parked slot left for {node}")
                break
            v = parked.pop(0)
            actions.append(Place(jid, v.slot, v.slurm_job_id, node,
                                 _time_limit_min(windows.get(node), s, job, now)))
            waiting_for += 1
        # membership
        current = list(cv.members)
        live_current = [m for m in current if m in survivors]
        ready.sort()
        newcomers = [m for _, m in ready]
        publish: tuple[str, ...] | None = None
        if leaving_needed or any(m not in cv.live for m in current):
            publish = tuple(live_current + newcomers)
        elif newcomers:
            oldest = ready[0][0]
            if waiting_for == 0 or now - oldest > s.publish_batch_s:
                publish = tuple(live_current + newcomers)
        if publish is not None and set(publish) != set(current):
            actions.append(Publish(jid, publish, len(current)))
        # lifecycle from what is observed
        size_after = len(publish) if publish is not None else len(current)
        has_slots_busy = bool(covered) or waiting_for > 0
        if job.state in (P.QUEUED, P.EVICTED) and has_slots_busy and size_after == 0:
            actions.append(Transit(jid, P.STARTING, "slots placed on nodes"))
        elif job.state in (P.QUEUED, P.EVICTED, P.STARTING) and size_after > 0:
            if job.state is P.QUEUED:
                actions.append(Transit(jid, P.STARTING, "slots placed on nodes"))
            actions.append(Transit(jid, P.RUNNING, f"training on {size_after} node(s)"))
        elif job.state in (P.RUNNING, P.STALLED) and size_after == 0 and not has_slots_busy:
            actions.append(Transit(jid, P.EVICTED, "holds no node (training state kept)"))
        elif job.state is P.STARTING and size_after == 0 and not has_slots_busy:
            trained = (cv.samples_total or 0) > 0 or job.samples_total > 0
            actions.append(Transit(jid, P.EVICTED if trained else P.QUEUED,
                                   "no slot could be started"))
        elif job.state is P.RUNNING and size_after > 0 and current:
            last = cv.progress_at_s if cv.progress_at_s is not None else job.last_progress_s
            since = job.lifecycle.since_s()
            quiet = now - max(last or since, since)
            if quiet > s.heartbeat_timeout_s:
                actions.append(Transit(jid, P.STALLED,
                                       f"no progress report for {quiet:.0f} s"))
        elif job.state is P.STALLED:
            last = cv.progress_at_s
            since = job.lifecycle.since_s()
            if last is not None and last > since:
                actions.append(Transit(jid, P.RUNNING, "progress reports resumed"))
            elif now - since > 3 * s.heartbeat_timeout_s:
                actions.append(Transit(jid, P.FAILED,
                                       f"hung: no progress for {now - since:.0f} s more"))
    return TickPlan(targets=targets, actions=tuple(actions), slot_views=views,
                    allocation=allocation, free_nodes=free, held_nodes=held_nodes,
                    hole_start_s=holes, notes=tuple(notes),
                    follow_up=bool(giving_back or ahead.waiting or unplanned.waiting))

"""Step 3 of a tick: the nodes on offer, each with its predicted window (the scavenger).

The pool is the idle nodes of the scavenger partition with a window of at least
``min_slot_time_s`` (:mod:`malletrain.core.scavenging.scavenger`), plus the nodes the jobs already
hold, less the held nodes a regular job is due to take (:mod:`.yielding`), plus our own
leftovers at a zero window (so that the policy's hole-length model never mistakes our own
use of a node for the end of its hole).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from malletrain.core.cluster import ClusterSnapshot, Job, JobState, NodeState
from malletrain.core.model import IdleNode
from malletrain.core.scavenging.scavenger import (
    UNUSABLE_FLAGS,
    Claim,
    earliest_claims,
    idle_nodes,
    is_idle,
    node_type,
)
from malletrain.daemon.jobs.slots import SlotStatus, parse_tag
from malletrain.daemon.jobs.store import JobRecord
from malletrain.daemon.tick.views import JobSlots, sigtermed
from malletrain.daemon.tick.world import World
from malletrain.daemon.tick.yielding import (
    RUNNING_STATES,
    Unplanned,
    serve_unplanned,
    stale_plans,
    unserved_jobs,
    yield_ahead,
)

_FOREIGN_BUSY = RUNNING_STATES | {JobState.COMPLETING}
_NOT_HOLES = frozenset({NodeState.DOWN, NodeState.DRAINED, NodeState.DRAINING,
                        NodeState.FUTURE, NodeState.RESERVED})


@dataclass(frozen=True)
class Holdings:
    """The nodes our slots occupy, as far as the allocation is concerned."""

    #: job -> nodes it holds and keeps unless the plan drops them (running or placed).
    held: Mapping[str, tuple[str, ...]]
    #: held by a slot not started yet: the cheapest to give back.
    placing: frozenset[str]
    #: on their way back to Slurm (slots signalled or ending, regular jobs completing).
    freeing: frozenset[str]

    @property
    def held_set(self) -> frozenset[str]:
        return frozenset(n for ns in self.held.values() for n in ns)


@dataclass(frozen=True)
class GiveBack:
    """Held nodes to give back to Slurm this tick, and why."""

    nodes: Mapping[str, Claim]
    #: free nodes kept out of the offer for a regular job about to be served.
    withheld: frozenset[str]
    notes: tuple[str, ...]
    #: a give-back is under way or pending confirmation: look again soon.
    follow_up: bool


@dataclass(frozen=True)
class Pool:
    holdings: Holdings
    free: tuple[IdleNode, ...]
    held: tuple[IdleNode, ...]
    #: our leftovers (zero window): offered to keep the hole model honest, never to be used.
    leaving: tuple[IdleNode, ...]
    hole_start_s: Mapping[str, float]
    give_back: GiveBack
    #: the snapshot's jobs that are not our slots (:func:`regular_jobs`)
    regular: tuple[Job, ...] = ()

    @property
    def offered(self) -> frozenset[str]:
        return frozenset(n.name for n in self.free + self.held)

    @property
    def windows(self) -> dict[str, float | None]:
        return {n.name: n.window_s for n in self.free + self.held}


def regular_jobs(snap: ClusterSnapshot) -> tuple[Job, ...]:
    """The jobs of the snapshot that are not our slots (read once per tick)."""
    return tuple(j for j in snap.jobs if parse_tag(j.comment) is None)


def holdings(world: World, managed: tuple[JobRecord, ...], slots: Mapping[str, JobSlots],
             regular: tuple[Job, ...]) -> Holdings:
    held: dict[str, tuple[str, ...]] = {}
    placing: set[str] = set()
    freeing: set[str] = set()
    for job in managed:
        mine: list[str] = []
        cv = world.coord_of(job.job_id)
        js = slots[job.job_id]
        for v in js.views:
            rec = js.records[v.slot]
            if v.status is SlotStatus.RUNNING and v.node and rec.leaving_since_s is None:
                mine.append(v.node)
                if sigtermed(v.slot, cv):
                    freeing.add(v.node)
            elif rec.placed_node and (v.status is SlotStatus.PLACING or (
                    v.status is SlotStatus.PARKED and job.job_id in world.busy)):
                # (a busy job's placement marked but not yet released: still its node)
                mine.append(rec.placed_node)
                placing.add(rec.placed_node)
            elif v.status in (SlotStatus.RUNNING, SlotStatus.ENDING) and v.node:
                freeing.add(v.node)
        held[job.job_id] = tuple(mine)
    freeing.update(n for j in regular if j.state is JobState.COMPLETING for n in j.nodes)
    # a node Slurm has already given to a regular job is not on its way to anyone else
    freeing -= {n for j in regular if j.state in RUNNING_STATES for n in j.nodes}
    return Holdings(held, frozenset(placing), frozenset(freeing))


def give_back(world: World, h: Holdings, claims: Mapping[str, Claim], own_ids: set[int]
              ) -> GiveBack:
    """Held nodes a regular job is due to take (planned or not): they leave the pool."""
    s, now, snap = world.settings, world.now_s, world.snapshot
    ahead_s = min(s.yield_ahead_s, s.min_slot_time_s)
    # a due plan naming a node another regular job got cannot start as made: its job is
    # served like an unplanned one, and its plan claims nothing to give back ahead of
    stale = stale_plans(snap, now)
    live_claims = (earliest_claims(snap, now, exclude_job_ids=own_ids | stale) if stale
                   else claims)

    def claimed_soon(node: str) -> bool:
        c = live_claims.get(node)
        return c is not None and c.start_at - now <= ahead_s

    held_set = h.held_set
    ahead = yield_ahead(held_set, live_claims, now, ahead_s, s.yield_confirm_s)
    # the planned start as an absolute time keeps the note the same from tick to tick while
    # the plan stands, so the daemon logs it once
    notes = [f"{n}: given back ahead of {c.by} (planned start {c.start_at:.0f})"
             for n, c in sorted(ahead.now.items())]
    pending = unserved_jobs(snap, now_s=now, max_age_s=s.yield_unplanned_s, ahead_s=ahead_s,
                            stale=stale) if s.yield_unplanned_s > 0 else []
    unplanned = serve_unplanned(
        snap, now_s=now, confirm_s=s.yield_confirm_s, max_age_s=s.yield_unplanned_s,
        ahead_s=ahead_s, stale=stale, pending=pending,
        held=sorted(held_set - ahead.now.keys() - h.freeing,
                    key=lambda n: (n not in h.placing, n)),
        freeing=sorted(n for n in h.freeing - ahead.now.keys() if not claimed_soon(n)),
        free=sorted(n.name for n in snap.nodes if is_idle(n) and n.name not in held_set
                    and not claimed_soon(n.name)),
    ) if pending else Unplanned()
    notes += [f"{n}: given back to {c.by} (pending, not planned to start yet)"
              for n, c in sorted(unplanned.give_back.items())]
    nodes = {**ahead.now, **unplanned.give_back}
    return GiveBack(nodes, frozenset(unplanned.withheld), tuple(notes),
                    follow_up=bool(nodes or ahead.waiting or unplanned.waiting))


def hole_names(snap: ClusterSnapshot, partition: str, held: frozenset[str],
               regular: tuple[Job, ...]) -> set[str]:
    """Nodes in a hole: not taken by a regular job (our own use does not end a hole)."""
    foreign = {n for j in regular if j.state in _FOREIGN_BUSY for n in j.nodes}
    return {
        n.name for n in snap.nodes
        if partition in n.partitions and n.name not in foreign
        and not (n.flags & UNUSABLE_FLAGS) and n.state not in _NOT_HOLES
    } | held


def build_pool(world: World, managed: tuple[JobRecord, ...], slots: Mapping[str, JobSlots]
               ) -> Pool:
    s, now, snap = world.settings, world.now_s, world.snapshot
    own_ids = {r.slurm_job_id for recs in world.slots.values() for r in recs}
    claims = earliest_claims(snap, now, exclude_job_ids=own_ids)
    regular = regular_jobs(snap)
    h = holdings(world, managed, slots, regular)
    back = give_back(world, h, claims, own_ids)
    held_set = h.held_set
    names = hole_names(snap, s.scavenger_partition, held_set, regular)
    idle_now = idle_nodes(snap, now, partitions=[s.scavenger_partition], min_window_s=0.0,
                          claims=claims)
    idle_age = {n.name: n.idle_age_s for n in idle_now}
    holes = {name: world.hole_start_s.get(name, now - idle_age.get(name, 0.0))
             for name in names}
    gres = {n.name: n.gres for n in snap.nodes if n.name in holes}
    kind = {name: node_type(g) for name, g in gres.items()}
    free = tuple(
        IdleNode(n.name, n.window_s, idle_age_s=now - holes[n.name], node_type=n.node_type)
        for n in idle_now
        if n.name not in held_set and n.name in holes and n.name not in back.withheld
        and (n.window_s is None or n.window_s > s.min_slot_time_s)
    )
    kept = held_set - back.nodes.keys()

    def window(node: str) -> float | None:
        c = claims.get(node)
        return None if c is None else max(0.0, c.start_at - now)

    held = tuple(IdleNode(n, window(n), idle_age_s=now - holes[n], node_type=kind.get(n, ""))
                 for n in sorted(kept))
    offered = {n.name for n in free} | kept
    leaving = tuple(IdleNode(n, 0.0, idle_age_s=now - holes[n], node_type=kind.get(n, ""))
                    for n in sorted(names - offered))
    return Pool(h, free, held, leaving, holes, back, regular)

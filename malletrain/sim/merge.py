"""Several machines' idle traces side by side, as one centre with several partitions.

A centre rarely runs one machine: malletrain's scavenger takes the idle nodes of
every partition it is given. This lays real traces of different machines (an SWF
replay of Theta, Philly's per-minute log, ...) next to each other: each part's clock
starts at its own ``start_s``, its nodes get its label as a prefix, and events at the
same moment become one event. The merged trace ends when its shortest part does
(after that one part knows nothing). Parts are read lazily, as an SWF replay is.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from malletrain.errors import UserError
from malletrain.sim.trace import IdleTrace, PlannedStart, TraceEvent

#: Pending jobs of part ``i`` get ids ``i * JOB_ID_STRIDE + id`` (ids stay unique).
JOB_ID_STRIDE = 10**9


def _shifted(part: int, trace: IdleTrace, offset: int) -> Iterator[tuple[float, int, TraceEvent]]:
    """``trace``'s events on the merged clock and node indices, tagged for the merge."""
    for ev in trace.events():
        t = ev.time_s - trace.start_s
        planned = None
        if ev.planned is not None:
            planned = tuple(
                PlannedStart(
                    part * JOB_ID_STRIDE + p.job_id,
                    p.start_s - trace.start_s,
                    tuple(offset + i for i in p.nodes),
                )
                for p in ev.planned
            )
        since = ev.idle_since_s
        yield t, part, TraceEvent(
            t,
            tuple(offset + i for i in ev.became_idle),
            tuple(offset + i for i in ev.became_busy),
            planned,
            None if since is None else tuple(s - trace.start_s for s in since),
        )


def _combine(t: float, events: Sequence[TraceEvent],
             plan: tuple[PlannedStart, ...] | None) -> TraceEvent:
    """Events of different parts at one moment as one (their node sets are disjoint)."""
    idle: list[int] = []
    busy: list[int] = []
    since: list[float] = []
    for ev in events:
        idle += ev.became_idle
        busy += ev.became_busy
        since += ev.idle_since_s or (t,) * len(ev.became_idle)
    any_since = any(ev.idle_since_s is not None for ev in events)
    return TraceEvent(t, tuple(idle), tuple(busy), plan, tuple(since) if any_since else None)


@dataclass(frozen=True)
class MergedTrace(IdleTrace):
    """The parts' events on one clock (from 0) and one node list."""

    parts: tuple[IdleTrace, ...] = ()

    def events(self) -> Iterator[TraceEvent]:
        offsets = [0]
        for p in self.parts:
            offsets.append(offsets[-1] + len(p.node_names))
        streams = [_shifted(i, p, offsets[i]) for i, p in enumerate(self.parts)]
        # Every part's latest backfill plan: a part's plan changes only at its own
        # events, and the scavenger must see all of them at every merged event. The
        # joined plan is rebuilt only when one changes (the same object otherwise, which
        # the simulator's view uses to reuse its claims).
        plans: list[tuple[PlannedStart, ...] | None] = [None] * len(self.parts)
        joined: tuple[PlannedStart, ...] | None = None
        pending: list[TraceEvent] = []
        t_pending = 0.0
        for t, part, ev in heapq.merge(*streams, key=lambda x: (x[0], x[1])):
            if t > self.end_s:
                break
            if pending and t != t_pending:
                yield _combine(t_pending, pending, joined)
                pending = []
            if ev.planned is not None:
                plans[part] = ev.planned
                joined = tuple(x for p in plans if p is not None for x in p)
            pending.append(ev)
            t_pending = t
        if pending:
            yield _combine(t_pending, pending, joined)


def merge_traces(parts: Sequence[tuple[str, IdleTrace]]) -> MergedTrace:
    """``(label, trace)`` pairs as one centre; node ``n`` of part ``label`` is ``label-n``.

    Planned starts of the regular workload stay on their own part's nodes, so the
    scavenger predicts each part's holes from its own backfill plan.
    """
    if not parts:
        raise UserError("merge_traces needs at least one trace")
    labels = [label for label, _ in parts]
    if len(set(labels)) != len(labels):
        raise UserError(f"trace labels must differ: {labels}")
    names = tuple(f"{label}-{n}" for label, tr in parts for n in tr.node_names)
    span = min(tr.end_s - tr.start_s for _, tr in parts)
    return MergedTrace(
        source="+".join(f"{label}:{tr.source}" for label, tr in parts),
        node_names=names,
        start_s=0.0,
        end_s=span,
        parts=tuple(tr for _, tr in parts),
    )

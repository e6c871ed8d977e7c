"""What the bounds of :mod:`malletrain.sim.bounds.bound` start from: segments, rates, admissions."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from malletrain.sim.jobs import SimJob
from malletrain.sim.trace import IdleTrace
from malletrain.sim.view import SnapshotView

#: Which count limits the nodes in use (``Bound.nodes``).
NodeCount = Literal["offered", "idle"]


@dataclass(frozen=True)
class IdleSegment:
    """An interval in which the engine's idle set is constant (between two events)."""

    start_s: float
    end_s: float
    #: Idle nodes: what a plan may use (``Simulator._apply_plan`` checks only this).
    idle: int
    #: Idle nodes the scavenger offers the policy at the segment's event (windows
    #: > 0); the registered policies assign only these (``core.placement.assign_nodes``).
    offered: int

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def idle_segments(trace: IdleTrace, until_s: float | None = None) -> list[IdleSegment]:
    """The idle-count timeline exactly as ``Simulator.run`` integrates it.

    Events after ``until`` (``min(until_s, trace.end_s)``) are not applied; each
    event's counts hold until the next event, the last one's until ``until``. The
    offered count asks the same scavenger as ``Simulator._decide`` (same snapshot).
    """
    until = trace.end_s if until_s is None else min(until_s, trace.end_s)
    view = SnapshotView(trace.node_names)
    idle = np.zeros(len(trace.node_names), dtype=bool)
    rows: list[tuple[float, int, int]] = []
    for ev in trace.events():
        if ev.time_s > until:
            break
        if ev.became_idle:
            since = ev.idle_since_s or (ev.time_s,) * len(ev.became_idle)
            idle[list(ev.became_idle)] = True
            view.mark_idle(ev.became_idle, since)
        if ev.became_busy:
            idle[list(ev.became_busy)] = False
        idx = np.flatnonzero(idle)
        offered = len(view.idle_nodes(ev.time_s, idx, ev.planned)) if len(idx) else 0
        rows.append((ev.time_s, len(idx), offered))
    ends = [r[0] for r in rows[1:]] + [until]
    return [IdleSegment(t0, t1, k, o) for (t0, k, o), t1 in zip(rows, ends, strict=True)]


def in_worker_seconds(jobs: Sequence[SimJob]) -> list[SimJob]:
    """The jobs with samples counted in seconds of one worker's work (``rate(1)`` each).

    Samples of different models do not add up; one-worker-seconds do (the summary's
    ``one_worker_seconds_total``: each job's samples over its rate on one node, on its
    fastest type). Losses and progress scale with the rate, so a replay's
    ``one_worker_seconds_total`` is the ``samples_total`` of these jobs replayed on the same
    schedule, and their bound bounds it. Jobs with node types come as their
    :func:`type_envelope`, whose one-node rate is that of the fastest type.
    """
    out = []
    for j in map(type_envelope, jobs):
        unit = j.true_model.rate(1)
        curve = tuple((n, r / unit) for n, r in j.curve)
        out.append(dataclasses.replace(j, curve=curve, total_samples=j.total_samples / unit))
    return out


def type_envelope(job: SimJob) -> SimJob:
    """A job with per-type curves as one curve: at each size, its rate on its fastest type.

    On a typed cluster a job runs at its slowest type's rate for its size
    (``SimJob.rate_on``), never above this envelope, so whatever the bound proves for the
    envelope job holds for the typed one: it is the bound of a cluster whose every node is
    of the job's best type at that size, for every job at once (looser than the typed
    problem: it ignores how many nodes of each type there are). Untyped jobs are returned
    unchanged.
    """
    if not job.type_curves:
        return job
    models = [job.true_model, *job.true_models().values()]
    curve = tuple((n, max(m.rate(n) for m in models)) for n in range(1, job.max_nodes + 1))
    return dataclasses.replace(job, curve=curve, type_curves=())


def job_rates(job: SimJob) -> np.ndarray:
    """``r_j(n)`` for ``n = 0 .. max_nodes`` (0 below ``min_nodes``: not allowed to run)."""
    model = type_envelope(job).true_model
    rates = np.zeros(job.max_nodes + 1)
    for n in range(job.min_nodes, job.max_nodes + 1):
        rates[n] = model.rate(n)
    return rates


def min_duration_s(job: SimJob) -> float:
    """The least time from admission to finish: ``total_samples`` at the peak rate."""
    peak = float(job_rates(job).max())
    return math.inf if peak <= 0 else job.total_samples / peak


@dataclass(frozen=True)
class FinishCost:
    """The fewest node-seconds in which a job can process its ``total_samples``.

    Any schedule's (average rate, average nodes) is a mixture of the points
    ``(r(n), n)`` and ``(0, 0)``, so within ``D`` seconds, i.e. at an average rate of
    at least ``R = T / D``, it needs ``D * h(R)`` node-seconds, ``h`` the lower convex
    envelope of those points (``rates``/``nodes`` are its vertices); infinite when
    even the peak rate is too slow.
    """

    total_samples: float
    rates: tuple[float, ...]
    nodes: tuple[float, ...]

    @classmethod
    def of(cls, job: SimJob) -> FinishCost:
        r = job_rates(job)
        pts = sorted({(0.0, 0)} | {(float(r[n]), n) for n in range(1, len(r)) if r[n] > 0})
        hull: list[tuple[float, int]] = []
        for x, y in pts:
            if hull and x == hull[-1][0]:
                continue  # same rate on more nodes: never cheaper
            # Drop the last vertex while it lies on or above the chord to (x, y).
            while len(hull) >= 2:
                (x0, y0), (x1, y1) = hull[-2], hull[-1]
                if (y1 - y0) * (x - x0) >= (y - y0) * (x1 - x0):
                    hull.pop()
                else:
                    break
            hull.append((x, y))
        return cls(job.total_samples, tuple(x for x, _ in hull), tuple(float(y) for _, y in hull))

    def node_s(self, within_s: float) -> float:
        if within_s <= 0 or self.total_samples / within_s > self.rates[-1]:
            return math.inf
        return within_s * float(np.interp(self.total_samples / within_s, self.rates, self.nodes))


def earliest_starts(
    segments: Sequence[IdleSegment],
    jobs: Sequence[SimJob],
    max_concurrent: int,
    *,
    nodes: NodeCount = "offered",
    submit_origin_s: float | None = None,
) -> list[float]:
    """For each job in submit order, the first segment start at which it can be running.

    Job ``p`` runs only once ``m = p + 1 - K`` jobs before it have finished; that takes
    ``ceil(m / K)`` finishing generations of at least the shortest ``min_duration_s``
    each, and at least the ``m`` cheapest :class:`FinishCost` of the jobs before ``p``
    in node-seconds offered since the start. No job runs before it is submitted.
    Admissions happen at finishes and arrivals, inside segments, so a job counts from
    the start of the segment in which both conditions can first hold. Both get harder
    with ``p`` (admission is in submit order), so the result never decreases. A job
    that can never run gets the end of the replay. Module docstring for the proof.
    ``submit_s`` counts from ``submit_origin_s``, the trace's ``start_s`` as in the
    engine; without it submit times are ignored (valid, possibly looser).
    """
    k = max_concurrent
    start = segments[0].start_s if segments else 0.0
    end = segments[-1].end_s if segments else 0.0
    starts = [s.start_s for s in segments]
    ends = [s.end_s for s in segments]
    used = [s.offered if nodes == "offered" else s.idle for s in segments]
    offered_by_end = np.cumsum([n * s.duration_s for n, s in zip(used, segments, strict=True)])
    costs = _FinishCosts([FinishCost.of(j) for j in jobs])
    out: list[float] = []
    d = math.inf  # shortest min_duration_s among the jobs before p
    lo = 0  # both conditions only get harder with p: the search resumes where p - 1 ended
    for p, job in enumerate(jobs):
        m = p + 1 - k
        earliest = -math.inf if submit_origin_s is None else submit_origin_s + job.submit_s
        if m > 0:
            earliest = max(earliest, start + math.ceil(m / k) * d)
        # The first segment by whose end both conditions hold: the job may be admitted
        # (at a finish or its arrival) somewhere inside it, so it may run in all of it.
        hi = len(segments)
        while lo < hi:
            mid = (lo + hi) // 2
            # (a relative 1e-9 on the node-seconds: rounding may only loosen the bound)
            ok = ends[mid] > earliest and (m <= 0 or costs.cheapest(p, m, ends[mid] - start)
                                          <= offered_by_end[mid] * (1 + 1e-9))
            if ok:
                hi = mid
            else:
                lo = mid + 1
        found = starts[lo] if lo < len(segments) else max(end, earliest)
        out.append(max(found, out[-1]) if out else found)  # admitted after the job ahead
        d = min(d, min_duration_s(job))
    return out


class _FinishCosts:
    """``FinishCost.node_s`` of every job at one horizon at once, cached per horizon."""

    def __init__(self, costs: Sequence[FinishCost]) -> None:
        width = max((len(c.rates) for c in costs), default=1)
        self.totals = np.array([c.total_samples for c in costs])
        # Hull vertices padded with the last one (np.interp per row, vectorised below).
        self.rates = np.array([c.rates + (c.rates[-1],) * (width - len(c.rates)) for c in costs])
        self.nodes = np.array([c.nodes + (c.nodes[-1],) * (width - len(c.nodes)) for c in costs])
        self._cache: dict[float, np.ndarray] = {}

    def node_s(self, within_s: float) -> np.ndarray:
        hit = self._cache.get(within_s)
        if hit is not None:
            return hit
        out = np.full(len(self.totals), math.inf)
        if within_s > 0 and len(out):
            need = self.totals / within_s
            ok = need <= self.rates[:, -1]
            # the hull segment each job's needed rate falls in, then linear interpolation
            i = np.clip((self.rates < need[:, None]).sum(axis=1), 1, self.rates.shape[1] - 1)
            rows = np.arange(len(out))
            r0, r1 = self.rates[rows, i - 1], self.rates[rows, i]
            n0, n1 = self.nodes[rows, i - 1], self.nodes[rows, i]
            frac = np.where(r1 > r0, (need - r0) / np.where(r1 > r0, r1 - r0, 1.0), 1.0)
            out[ok] = (within_s * (n0 + frac * (n1 - n0)))[ok]
        self._cache[within_s] = out
        return out

    def cheapest(self, p: int, m: int, within_s: float) -> float:
        """The sum of the ``m`` smallest node-second costs among jobs ``0 .. p - 1``."""
        if m > p:
            return math.inf
        costs = self.node_s(within_s)[:p]
        return float(np.partition(costs, m - 1)[:m].sum())


def concave_sizes(rates: np.ndarray) -> list[int]:
    """The sizes on the upper concave envelope of ``(0, 0)`` and ``(n, r(n))``.

    Time-sharing other sizes is never better: a size between two envelope sizes is
    matched, in nodes and in running time, by a mix of them with at least its rate.
    """
    hull: list[tuple[int, float]] = [(0, 0.0)]
    for n in np.flatnonzero(rates):
        x, y = int(n), float(rates[n])
        while len(hull) >= 2:
            (x0, y0), (x1, y1) = hull[-2], hull[-1]
            if (y1 - y0) * (x - x0) <= (y - y0) * (x1 - x0):  # hull[-1] on or below the chord
                hull.pop()
            else:
                break
        hull.append((x, y))
    return [x for x, _ in hull[1:]]

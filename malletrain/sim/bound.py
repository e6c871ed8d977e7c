"""A proven upper bound on the samples any policy can make on one replay.

``no-loss-bound`` (``core.baselines.NoLossBound``) is a policy replayed without
rescale costs: a good estimate, but not a bound, because which jobs it gets to run
depends on which of them finish first (malletrain beat it on two mixed job sets).
This module bounds ``samples_total`` of :class:`malletrain.sim.engine.Simulator`
for every policy, from the idle-count timeline and the job set alone (no policy is
run): an LP bound in seconds, and optionally a tighter integer-finish bound (a MILP,
minutes) where submit-order admission is what limits the jobs.

**The replay, as the engine runs it** (``engine.py``). The idle set is constant
between two trace events (events after ``until`` are dropped, the last interval
runs to ``until``, nothing runs before the first event). A job holds only nodes
idle now, ``n_j`` of them with ``n_j = 0`` or ``min_j <= n_j <= max_j``. Every
registered policy hands out only the idle nodes the scavenger offers at the event
(windows > 0; ``core.placement.assign_nodes`` keeps and grows jobs on offered nodes
only), so ``sum n_j <= O(t)``, the offered count of the segment's event; a plan may
in principle name any idle node, so the bound is also given with ``I(t)``, the idle
count (``nodes="idle"``; on Philly, which has no plan, ``O = I``). At most ``K``
(``--max-concurrent-jobs``) jobs are admitted at a time, in submit order, only at
events; an admitted job stays until it finishes. A job's net samples ``done_j`` are
its gross progress ``G_j``, the integral of ``r_j(n_j(t))``, minus its rescale and
reclaim losses, and it stops at exactly ``done_j = T_j`` (``total_samples``), so
``done_j <= min(T_j, G_j)``.

**The bound** (proof sketch). For any weights ``mu_j`` in [0, 1], since
``min(a, b) <= mu a + (1 - mu) b``,

    samples_total = sum_j done_j <= sum_j mu_j T_j + sum_j (1 - mu_j) G_j
                  <= sum_j mu_j T_j + sum over segments of dt * F_mu(O, E),

where ``F_mu(O, E) = max sum_j (1 - mu_j) r_j(n_j)`` over at most ``K`` jobs of
the set ``E`` of jobs that can be running in that segment, ``sum n_j <= O``, each
``n_j`` in ``{0} u [min_j, max_j]``: at every moment the running jobs form such an
allocation, and losses, placement, windows and rescale costs only lower what a
policy makes. Every ``mu`` gives a valid bound. ``mu = 0`` is the plain integral of
``F(O(t))``, which is the whole bound when all jobs are identical (``sia-imagenet-48``:
any ``K`` of them are alike and none can exceed its total). :func:`upper_bound`
finds the best ``mu`` with an LP (:class:`_Master`, column generation over the DP's
allocations; ``mu`` are the duals of the caps), prices every ``mu`` it tries with
the exact DP and keeps the smallest value, so the search only tightens the bound and
its result never rests on the LP solver's accuracy. ``F`` is exact:
a knapsack DP over (jobs x jobs running x nodes), ``r_j`` evaluated at every whole
node count as the engine evaluates the piecewise-linear curve.

**Which jobs can be running** (``E``, :func:`earliest_starts`). Let ``N(t)`` be the
jobs finished by ``t`` and ``A(t)`` the jobs admitted by ``t``. Admitted unfinished
jobs are at most ``K``, so ``A(t) <= K + N(t)``, and job ``p`` (0-based, submit
order) runs at ``t`` only if ``N(t) >= m = p + 1 - K``, all ``m`` finished jobs being
among the jobs before ``p``. Two necessary conditions follow. *Time*: a job's gross
rate is at most its peak, so it needs ``d_j = T_j / max_n r_j(n)`` seconds from
admission to finish; a job finished by ``t`` was admitted by ``t - d``, so
``N(t) <= A(t - d) <= K + N(t - d)``, hence ``N(t) <= K * floor((t - start) / d)``
and ``p`` waits until ``start + ceil(m / K) * d``. *Node-seconds*: finishing job
``q`` within ``D = t - start`` takes at least ``D * h_q(T_q / D)`` node-seconds,
``h_q`` the lower convex envelope of the points ``(r_q(n), n)`` and ``(0, 0)`` (any
schedule's average rate and average node count are a mixture of them), and jobs
never share a node, so the ``m`` cheapest such costs among the jobs before ``p``
cannot exceed the node-seconds offered since ``start``. Jobs are admitted only at
events, so a segment uses job ``p`` only if it starts when both hold (and the job is
submitted).

**Running dry.** The bound holds when the queue empties (fewer jobs only lower what
policies make); :attr:`Bound.can_run_dry` says whether it could empty within the
replay (``K + K * floor((until - start) / d) > jobs``), in which case issue 4's
comparison of ``samples_total`` is not the right one.

**Where the LP bound is loose.** Once a job can run it may run in any segment, next
to any other job that can, even if the finishes that admitted it are not paid for; on
mixed job sets (different curves) that lets it run more high-rate jobs at once than
submit-order admission allows. Admission-order constraints in the LP alone (below,
with a finish counted as ``min(1, G_j / T_j)``) moved the evaluation's bounds by at
most 0.4 %: an LP counts ten jobs at 90 % as nine finishes.

**Integer finishes** (:func:`integer_finish_bound`, a MILP, optional). Cut the
timeline into blocks (one per event, or about ``block_s`` long); let binary
``f[j, b]`` say that job ``j`` finished by the end of block ``b``, which needs
``G_j >= T_j`` by then. Admitted jobs form a prefix ``0 .. A-1`` with ``A <= K + N``,
so the running jobs with index ``>= i`` (``i >= K``) are at most ``A - i <= N - (i -
K)``, which is at most the finished jobs with index ``>= i - K`` (at most ``i - K``
finished jobs have a smaller index). Admissions happen at events, so ``N`` is taken
at the block's last event: its start for a one-event block (``f`` of the block
before), else its end. Allocations are time shares ``u[j, n]`` per block and
capacity ``c`` (at most one size per job at a time, ``sum n u <= c``, ``sum u <= K``),
``n`` on the concave envelope of ``(0, 0)`` and the job's sizes up to ``c``: any
size between two envelope sizes is matched in nodes and running time by a mix of
them with at least its rate. Every real run is a feasible point (``f`` its real
finishes, ``u`` its time shares), so the MILP's optimum, and HiGHS's dual bound on
it when stopped early, bound ``samples_total``, up to HiGHS's floating-point
tolerances (unlike the LP bound, whose value is recomputed exactly by the DP; so read
a MILP bound within a few 1e-6 of a target as undecided). ``Bound.samples`` is the
smaller of the two bounds. (A version with rows scaled by ``T_j`` let HiGHS drop the
small coefficients and report 0: the rows are kept in samples.)

``python -m malletrain.sim.bound`` takes the trace and job flags of ``malletrain
simulate`` and prints both bounds (docs/evaluation.md, "A proven upper bound").
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
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


def job_rates(job: SimJob) -> np.ndarray:
    """``r_j(n)`` for ``n = 0 .. max_nodes`` (0 below ``min_nodes``: not allowed to run)."""
    model = job.true_model
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
    in node-seconds offered since the start. No job runs before it is submitted, nor
    before the job ahead of it could (admission is in submit order), so the result never
    decreases. A job that can never run gets the end of the replay. Module docstring
    for the proof.
    ``submit_s`` counts from ``submit_origin_s``, the trace's ``start_s`` as in the
    engine; without it submit times are ignored (valid, possibly looser).
    """
    k = max_concurrent
    start = segments[0].start_s if segments else 0.0
    end = segments[-1].end_s if segments else 0.0
    starts = [s.start_s for s in segments]
    used = [s.offered if nodes == "offered" else s.idle for s in segments]
    offered_before = np.concatenate(
        ([0.0], np.cumsum([n * s.duration_s for n, s in zip(used, segments, strict=True)]))
    )
    costs = [FinishCost.of(j) for j in jobs]
    out: list[float] = []
    d = math.inf  # shortest min_duration_s among the jobs before p
    for p, job in enumerate(jobs):
        m = p + 1 - k
        earliest = -math.inf if submit_origin_s is None else submit_origin_s + job.submit_s
        if m > 0:
            earliest = max(earliest, start + math.ceil(m / k) * d)
            # Both conditions get easier with time: the first segment where they hold.
            lo, hi = 0, len(segments)
            while lo < hi:
                mid = (lo + hi) // 2
                t = starts[mid]
                need = sorted(c.node_s(t - start) for c in costs[:p])[:m]
                if t >= earliest and sum(need) <= offered_before[mid]:
                    hi = mid
                else:
                    lo = mid + 1
            earliest = starts[lo] if lo < len(segments) else max(end, earliest)
        # Nothing runs before the first event, and job p is admitted after job p - 1.
        out.append(max(earliest, start, out[-1] if out else start))
        d = min(d, min_duration_s(job))
    return out


@dataclass(frozen=True)
class Allocation:
    """The best weighted allocation for every capacity ``c = 0 .. C``."""

    #: ``value[c]``: max of ``sum_j w_j r_j(n_j)`` with ``sum n_j <= c``, at most K jobs.
    value: np.ndarray
    #: ``nodes[c, j]``: ``n_j`` of one maximising allocation at capacity ``c``.
    nodes: np.ndarray


def best_allocations(
    rates: Sequence[np.ndarray],
    weights: Sequence[float],
    max_jobs: int,
    capacity: int,
) -> Allocation:
    """Exact knapsack DP over (jobs x jobs running x nodes), one pass for all capacities.

    ``rates[j][n]`` is job ``j``'s rate on ``n`` nodes (0 where it may not run, so
    ``n = 0`` or the nonzero entries are its allowed sizes).
    """
    jn = len(rates)
    kk = min(max_jobs, jn)
    neg = -np.inf
    dp = np.full((kk + 1, capacity + 1), neg)
    dp[0, :] = 0.0
    choice = np.zeros((jn, kk + 1, capacity + 1), dtype=np.int32)
    for j, (r, w) in enumerate(zip(rates, weights, strict=True)):
        new = dp.copy()
        if kk > 0:
            for size in np.flatnonzero(r[: capacity + 1]):
                n = int(size)
                cand = dp[:-1, : capacity + 1 - n] + w * r[n]
                better = cand > new[1:, n:]
                new[1:, n:][better] = cand[better]
                choice[j, 1:, n:][better] = n
        dp = new
    value = dp.max(axis=0)
    # Backtrack all capacities at once.
    cs = np.arange(capacity + 1)
    ks = dp.argmax(axis=0)
    nodes = np.zeros((capacity + 1, jn), dtype=np.int32)
    for j in range(jn - 1, -1, -1):
        n = choice[j, ks, cs]
        nodes[:, j] = n
        ks = ks - (n > 0)
        cs = cs - n
    return Allocation(value=value, nodes=nodes)


@dataclass(frozen=True)
class Bound:
    """The proven bound for one replay, and what it rests on."""

    #: The bound: no policy's ``samples_total`` exceeds it on this replay.
    samples: float
    #: Which count limits the nodes in use: ``offered`` (valid for policies that assign
    #: only the nodes the scavenger offers, as every registered one does) or ``idle``
    #: (valid for any plan the engine accepts).
    nodes: NodeCount
    #: The LP bound (exact DP, caps by multipliers); ``samples`` is the smaller of it
    #: and the integer-finish bound.
    samples_lp: float
    #: The integer-finish bound (:func:`integer_finish_bound`), None when not run or
    #: when HiGHS proved none in time; whether HiGHS solved that MILP to optimality.
    samples_milp: float | None
    milp_optimal: bool | None
    #: The same LP bound without the ``total_samples`` cap (``mu = 0``), also proven.
    samples_uncapped: float
    #: ``idle node-s x best per-node rate``, the simulator's linear bound.
    samples_linear: float
    idle_node_seconds: float
    offered_node_seconds: float
    start_s: float
    until_s: float
    segments: int
    max_concurrent_jobs: int
    #: Jobs some policy could have running within the replay (a prefix in submit order).
    jobs_admissible: int
    jobs_total: int
    #: Whether the queue could empty before ``until_s`` (the bound still holds).
    can_run_dry: bool
    #: Column-generation rounds run to find the multipliers (0: ``mu = 0`` is optimal).
    rounds: int
    #: Per job in submit order: the earliest time it may run, and its multiplier ``mu_j``.
    earliest_s: tuple[float, ...]
    multipliers: tuple[float, ...]


@dataclass(frozen=True)
class _Phase:
    """Segments that may use the same jobs, as time spent at each node capacity."""

    members: list[int]
    capacity: int
    #: ``seconds[c]``: time during which ``c`` nodes (capped at ``capacity``) could be used.
    seconds: np.ndarray


def _phases(
    segments: Sequence[IdleSegment],
    eligible_from: Sequence[float],
    runs: Sequence[SimJob],
    k: int,
    nodes: NodeCount,
) -> list[_Phase]:
    """Group the segments by the jobs that can run in them (``eligible_from``)."""
    groups: dict[tuple[int, ...], list[IdleSegment]] = {}
    for seg in segments:
        if seg.duration_s <= 0:
            continue
        key = tuple(p for p, t in enumerate(eligible_from) if t <= seg.start_s)
        groups.setdefault(key, []).append(seg)
    out = []
    for key, segs in groups.items():
        counts = np.array([s.offered if nodes == "offered" else s.idle for s in segs])
        maxes = sorted((runs[p].max_nodes for p in key), reverse=True)
        # More nodes than the K largest jobs can take change nothing.
        cap = int(min(counts.max(), sum(maxes[:k])))
        secs = np.bincount(np.minimum(counts, cap), [s.duration_s for s in segs], cap + 1)
        out.append(_Phase(list(key), cap, secs))
    return out


class _Master:
    """The multipliers' LP, solved exactly by column generation.

    Primal: maximise ``sum_j y_j`` with ``y_j <= T_j`` and ``y_j <= G_j``, ``G_j`` the
    gross samples of a time-sharing, in each (phase, capacity), of the allocations
    generated so far. Its duals on ``y_j <= G_j`` are ``1 - mu_j``; its value is a
    lower estimate of the relaxation's optimum, and :func:`upper_bound` stops once the
    best proven bound comes within 1e-7 of it. Every round's ``mu`` is priced by the
    exact DP, so the bound reported never depends on the LP solver's accuracy.
    """

    def __init__(self, phases: Sequence[_Phase], rates: Sequence[np.ndarray], totals: np.ndarray):
        self.phases = phases
        self.rates = rates
        self.totals = totals
        #: one row per (phase, capacity) with time spent there
        self.cells = [(i, c) for i, ph in enumerate(phases) for c in np.flatnonzero(ph.seconds)]
        self.columns: list[tuple[int, np.ndarray]] = []  # (cell row, gross per job)
        self.seen: set[tuple[int, bytes]] = set()

    def add(self, allocs: Sequence[Allocation]) -> bool:
        """Add the allocations not yet in the master; False when there are none."""
        added = False
        for row, (i, c) in enumerate(self.cells):
            ph = self.phases[i]
            nodes = allocs[i].nodes[c]
            key = (row, nodes.tobytes())
            if key in self.seen:
                continue
            self.seen.add(key)
            gross = np.zeros(len(self.totals))
            for col, p in enumerate(ph.members):
                gross[p] = ph.seconds[c] * self.rates[p][nodes[col]]
            self.columns.append((row, gross))
            added = True
        return added

    def solve(self) -> tuple[float, np.ndarray]:
        """(the restricted primal's value, the multipliers ``mu`` from its duals)."""
        from scipy.optimize import linprog
        from scipy.sparse import coo_matrix

        jn, nc, cells = len(self.totals), len(self.columns), len(self.cells)
        # Variables: y_0..y_{J-1}, then one weight per column.
        rows, cols, vals = list(range(jn)), list(range(jn)), [1.0] * jn
        erows, ecols = [], []
        for ci, (cell, gross) in enumerate(self.columns):
            for p in np.flatnonzero(gross):
                rows.append(int(p))
                cols.append(jn + ci)
                vals.append(-float(gross[p]))
            erows.append(cell)
            ecols.append(jn + ci)
        a_ub = coo_matrix((vals, (rows, cols)), shape=(jn, jn + nc)).tocsr()
        a_eq = coo_matrix(([1.0] * nc, (erows, ecols)), shape=(cells, jn + nc)).tocsr()
        cost = np.concatenate((-np.ones(jn), np.zeros(nc)))
        bounds = [(0.0, float(t)) for t in self.totals] + [(0.0, None)] * nc
        res = linprog(cost, A_ub=a_ub, b_ub=np.zeros(jn), A_eq=a_eq, b_eq=np.ones(cells),
                      bounds=bounds, method="highs")
        if res.status != 0:
            raise RuntimeError(f"bound LP failed: {res.message}")
        mu = np.clip(1.0 + np.asarray(res.ineqlin.marginals), 0.0, 1.0)
        return -float(res.fun), mu


@dataclass(frozen=True)
class _Block:
    """Consecutive segments, in time order, in which jobs ``0 .. members-1`` can run."""

    members: int
    capacity: int
    #: ``seconds[c]``: time during which ``c`` nodes (capped at ``capacity``) could be used.
    seconds: np.ndarray
    #: One segment: every job running in it was admitted by its start.
    single: bool

    @property
    def duration_s(self) -> float:
        return float(self.seconds.sum())


def _blocks(
    segments: Sequence[IdleSegment],
    eligible_from: Sequence[float],
    runs: Sequence[SimJob],
    k: int,
    nodes: NodeCount,
    block_s: float,
) -> list[_Block]:
    """Cut the timeline into blocks of about ``block_s`` (and wherever new jobs can run)."""
    out: list[_Block] = []
    cur: list[IdleSegment] = []
    members = 0
    for seg in segments:
        if seg.duration_s <= 0:
            continue
        m = sum(t <= seg.start_s for t in eligible_from)  # a prefix (earliest_starts)
        if cur and (m != members or sum(s.duration_s for s in cur) >= block_s):
            out.append(_make_block(cur, members, runs, k, nodes))
            cur = []
        cur.append(seg)
        members = m
    if cur:
        out.append(_make_block(cur, members, runs, k, nodes))
    return out


def _make_block(
    segs: Sequence[IdleSegment], members: int, runs: Sequence[SimJob], k: int, nodes: NodeCount
) -> _Block:
    counts = np.array([s.offered if nodes == "offered" else s.idle for s in segs])
    maxes = sorted((runs[p].max_nodes for p in range(members)), reverse=True)
    cap = int(min(counts.max(), sum(maxes[:k])))
    secs = np.bincount(np.minimum(counts, cap), [s.duration_s for s in segs], cap + 1)
    return _Block(members, cap, secs, len(segs) == 1)


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


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """HiGHS's MILP prints debugging lines to the process's stdout: send them nowhere."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


@dataclass(frozen=True)
class FinishBound:
    """The integer-finish bound (module docstring, "Integer finishes")."""

    #: HiGHS's proven bound (dual bound), None if it found none within the time limit.
    samples: float | None
    #: Solved to optimality (within HiGHS's gap 1e-4): ``samples`` is the MILP's optimum.
    optimal: bool
    wall_s: float
    blocks: int
    binaries: int


def integer_finish_bound(
    segments: Sequence[IdleSegment],
    runs: Sequence[SimJob],
    max_concurrent_jobs: int,
    eligible_from: Sequence[float],
    *,
    nodes: NodeCount = "offered",
    block_s: float = 3 * 3600.0,
    time_limit_s: float = 120.0,
) -> FinishBound:
    """Bound with whole finishes and submit-order admission (a MILP, HiGHS via SciPy).

    Per block ``b`` and capacity ``c``, ``u[j, n]`` is the share of that time job ``j``
    runs on ``n`` nodes (``n`` on the concave envelope of its sizes up to ``c``):
    ``sum_n u[j, n] <= 1``,
    ``sum n u <= c``, ``sum u <= K``. ``G_j`` sums ``seconds x r_j(n) x u``; ``y_j <=
    min(T_j, G_j)`` is maximised. Binary ``f[j, b]`` says ``j`` finished by the end of
    ``b`` (``T_j f <= G_j`` so far, never undone). Admission: at any time the running
    jobs with index ``>= i`` (``i >= K``) are at most the finished jobs with index
    ``>= i - K``, finished by the block's last admission point: its start for a
    one-segment block (the end of the block before), else its end.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    t0 = time.perf_counter()
    k = max_concurrent_jobs
    blocks = _blocks(segments, eligible_from, runs, k, nodes, block_s)
    ever = max((b.members for b in blocks), default=0)
    totals = [j.total_samples for j in runs]
    rates = [job_rates(j) for j in runs]
    sizes: dict[tuple[int, int], list[int]] = {}  # (job, capacity) -> envelope sizes

    def fits(j: int, cap: int) -> list[int]:
        """Envelope sizes among those that fit: reality uses no more than ``cap`` nodes."""
        if (j, cap) not in sizes:
            sizes[(j, cap)] = concave_sizes(rates[j][: cap + 1])
        return sizes[(j, cap)]
    lo: list[float] = []
    hi: list[float] = []
    cost: list[float] = []
    integral: list[int] = []

    def var(upper: float, c: float = 0.0, binary: bool = False) -> int:
        lo.append(0.0)
        hi.append(upper)
        cost.append(c)
        integral.append(int(binary))
        return len(lo) - 1

    y = [var(totals[j] if j < ever else 0.0, -1.0) for j in range(len(runs))]
    f = {(j, b): var(1.0, binary=True) for b, blk in enumerate(blocks) for j in range(blk.members)}
    # u per block and capacity: {job: [(var, n)]}
    cells: list[dict[int, dict[int, list[tuple[int, int]]]]] = []
    for blk in blocks:
        cells.append({})
        for cap in map(int, np.flatnonzero(blk.seconds)):
            cells[-1][cap] = {
                j: [(var(1.0), n) for n in fits(j, cap)] for j in range(blk.members)
            }
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    upper: list[float] = []

    def row(entries: Iterable[tuple[int, float]], ub: float) -> None:
        r = len(upper)
        for v, a in entries:
            rows.append(r)
            cols.append(v)
            vals.append(a)
        upper.append(ub)

    gross: dict[tuple[int, int], list[tuple[int, float]]] = {}  # (job, block) -> terms
    for b, by_cap in enumerate(cells):
        for cap, jobs_u in by_cap.items():
            secs = float(blocks[b].seconds[cap])
            every = [(v, n) for us in jobs_u.values() for v, n in us]
            row(((v, float(n)) for v, n in every), float(cap))
            row(((v, 1.0) for v, _ in every), float(k))
            for j, us in jobs_u.items():
                if len(us) > 1:
                    row(((v, 1.0) for v, _ in us), 1.0)
                gross.setdefault((j, b), []).extend((v, secs * rates[j][n]) for v, n in us)
    for j in range(ever):
        made = [(v, -a) for b in range(len(blocks)) for v, a in gross.get((j, b), [])]
        row([(y[j], 1.0), *made], 0.0)
    for (j, b), fv in f.items():
        so_far = [(v, -a) for b2 in range(b + 1) for v, a in gross.get((j, b2), [])]
        row([(fv, totals[j]), *so_far], 0.0)
        if (j, b - 1) in f:
            row([(f[(j, b - 1)], 1.0), (fv, -1.0)], 0.0)
    for b, blk in enumerate(blocks):
        ref = b - 1 if blk.single else b
        for i in range(k, blk.members):
            running = [
                (v, float(blk.seconds[cap]))
                for cap, jobs_u in cells[b].items()
                for j, us in jobs_u.items()
                if j >= i
                for v, _ in us
            ]
            done = []
            if ref >= 0:
                done = [(f[(j, ref)], -blk.duration_s) for j in range(i - k, blocks[ref].members)]
            row(running + done, 0.0)
    a = coo_matrix((vals, (rows, cols)), shape=(len(upper), len(lo))).tocsr()
    with _quiet_stdout():
        res = milp(
            np.array(cost),
            constraints=LinearConstraint(a, -np.inf, np.array(upper)),
            integrality=np.array(integral),
            bounds=Bounds(np.array(lo), np.array(hi)),
            options={"time_limit": time_limit_s, "mip_rel_gap": 1e-4},
        )
    dual = getattr(res, "mip_dual_bound", None)
    proven = None if dual is None or not math.isfinite(dual) else -float(dual)
    return FinishBound(
        samples=proven,
        optimal=res.status == 0,
        wall_s=time.perf_counter() - t0,
        blocks=len(blocks),
        binaries=len(f),
    )


def upper_bound(
    segments: Sequence[IdleSegment],
    jobs: Iterable[SimJob],
    max_concurrent_jobs: int = 10,
    *,
    nodes: NodeCount = "offered",
    rounds: int = 200,
    submit_origin_s: float | None = None,
    milp_s: float = 0.0,
    block_s: float = 3 * 3600.0,
) -> Bound:
    """The bound of the module docstring for one replay (``segments`` from :func:`idle_segments`).

    ``rounds`` bounds the rounds of the multiplier search (:class:`_Master`); every
    round's value is a valid bound and the smallest is returned, so fewer rounds give a
    looser, never a wrong, bound. ``submit_origin_s``: the trace's ``start_s``, from
    which jobs' ``submit_s`` count (without it submit times are ignored). ``milp_s > 0``
    also runs :func:`integer_finish_bound` (blocks of ``block_s``) for at most that long.
    """
    runs = sorted(jobs, key=lambda j: j.submit_s)  # the engine's (stable) admission order
    k = max_concurrent_jobs
    start = segments[0].start_s if segments else 0.0
    until = segments[-1].end_s if segments else 0.0
    eligible_from = earliest_starts(
        segments, runs, k, nodes=nodes, submit_origin_s=submit_origin_s
    )
    rates = [job_rates(j) for j in runs]
    totals = np.array([j.total_samples for j in runs])
    phases = _phases(segments, eligible_from, runs, k, nodes)

    def price(mu: np.ndarray) -> tuple[float, list[Allocation]]:
        """The bound at ``mu`` and, per phase, the maximising allocations."""
        total = float(mu @ totals)
        allocs = []
        for ph in phases:
            weights = [1.0 - mu[p] for p in ph.members]
            alloc = best_allocations([rates[p] for p in ph.members], weights, k, ph.capacity)
            total += float(ph.seconds @ alloc.value)
            allocs.append(alloc)
        return total, allocs

    mu = np.zeros(len(runs))
    best, allocs = price(mu)
    uncapped, best_mu, done = best, mu.copy(), 0
    gross = np.zeros(len(runs))
    for ph, alloc in zip(phases, allocs, strict=True):
        for col, p in enumerate(ph.members):
            gross[p] += float(ph.seconds @ rates[p][alloc.nodes[:, col]])
    # No job past its total at mu = 0: T_j - G_j >= 0 is a subgradient there, so
    # mu = 0 is optimal (convexity) and the cap cannot tighten the bound.
    capped = bool((gross > totals).any())
    master = _Master(phases, rates, totals)
    for it in range(rounds if capped else 0):
        if not master.add(allocs):
            break  # mu is optimal for the relaxation
        floor, mu = master.solve()
        value, allocs = price(mu)
        done = it + 1
        if value < best:
            best, best_mu = value, mu.copy()
        if best - floor <= 1e-7 * best:
            break  # proven within 1e-7 of the relaxation's optimum
    d = min((min_duration_s(j) for j in runs), default=math.inf)
    max_finishes = k * math.floor((until - start) / d) if 0 < d < math.inf else 0
    best_rate = max((j.best_per_node_rate() for j in runs), default=0.0)
    idle_ns = sum(s.idle * s.duration_s for s in segments)
    milp = None
    if milp_s > 0 and segments:
        milp = integer_finish_bound(
            segments, runs, k, eligible_from, nodes=nodes, block_s=block_s, time_limit_s=milp_s
        )
    proven = [best] if milp is None or milp.samples is None else [best, milp.samples]
    return Bound(
        samples=min(proven),
        nodes=nodes,
        samples_lp=best,
        samples_milp=None if milp is None else milp.samples,
        milp_optimal=None if milp is None else milp.optimal,
        samples_uncapped=uncapped,
        samples_linear=idle_ns * best_rate,
        idle_node_seconds=idle_ns,
        offered_node_seconds=sum(s.offered * s.duration_s for s in segments),
        start_s=start,
        until_s=until,
        segments=len(segments),
        max_concurrent_jobs=k,
        jobs_admissible=sum(t < until for t in eligible_from),
        jobs_total=len(runs),
        can_run_dry=len(runs) < k + max_finishes,
        rounds=done,
        earliest_s=tuple(eligible_from),
        multipliers=tuple(float(x) for x in best_mu),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m malletrain.sim.bound``: the bound for the replay the flags describe."""
    from malletrain.errors import UserError
    from malletrain.sim.cli_simulate import add_replay_arguments, load_trace
    from malletrain.sim.jobs import parse_jobs

    ap = argparse.ArgumentParser(
        prog="python -m malletrain.sim.bound",
        description="A proven upper bound on samples_total for a replay of "
        "`malletrain simulate` with the same trace and job flags (module docstring).",
    )
    add_replay_arguments(ap)
    ap.add_argument(
        "--rounds", type=int, default=200, help="multiplier LP rounds (default 200)"
    )
    ap.add_argument(
        "--milp-s", type=float, default=0.0, metavar="S",
        help="also run the integer-finish MILP, for at most S seconds per bound (default 0: "
        "the LP bound only, seconds; the MILP can take minutes)",
    )
    ap.add_argument(
        "--block-s", type=float, default=3 * 3600.0, metavar="S",
        help="MILP time blocks on traces with more than 500 events (default 10800; "
        "shorter traces get one block per event)",
    )
    ap.add_argument("--json", metavar="FILE", help="also write both bounds as JSON here")
    args = ap.parse_args(argv)
    try:
        jobs = parse_jobs(args.jobs)
        trace = load_trace(args)
    except UserError as exc:  # TraceError is a PermanentError, reported the same way
        ap.error(str(exc))
    segments = idle_segments(trace, args.until_s)
    if not segments:
        ap.error("the trace has no event before --until-s")
    k = args.max_concurrent_jobs
    block_s = 0.0 if len(segments) <= 500 else args.block_s

    def bound(nodes: NodeCount) -> Bound:
        return upper_bound(
            segments, jobs, k, nodes=nodes, rounds=args.rounds, submit_origin_s=trace.start_s,
            milp_s=args.milp_s, block_s=block_s,
        )

    offered = bound("offered")
    same = all(s.offered == s.idle for s in segments)
    idle = dataclasses.replace(offered, nodes="idle") if same else bound("idle")
    milp = "not run"
    if offered.samples_milp is not None:
        how = "optimal" if offered.milp_optimal else "HiGHS's bound at the time limit"
        milp = f"{offered.samples_milp:.6g} ({how})"
    print(
        f"bound: samples_total <= {offered.samples:.6g} (policies on offered nodes; LP "
        f"{offered.samples_lp:.6g}, integer finishes {milp}), <= {idle.samples:.6g} (any "
        f"plan on idle nodes); LP without the total_samples cap "
        f"{offered.samples_uncapped:.6g}; linear {offered.samples_linear:.6g}; "
        f"{offered.segments} segments, jobs that can run {offered.jobs_admissible} of "
        f"{offered.jobs_total}, can run dry: {'yes' if offered.can_run_dry else 'no'}"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"offered": asdict(offered), "idle": asdict(idle)}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The LP bound's machinery: phases of the timeline, per-phase best allocations (exact DP),
and the multiplier search (column generation; see :mod:`malletrain.sim.bounds.bound`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from malletrain.sim.bounds.bound_inputs import IdleSegment, NodeCount
from malletrain.sim.jobs import SimJob


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
class Phase:
    """Segments that may use the same jobs, as time spent at each node capacity."""

    members: list[int]
    capacity: int
    #: ``seconds[c]``: time during which ``c`` nodes (capped at ``capacity``) could be used.
    seconds: np.ndarray


def make_phases(
    segments: Sequence[IdleSegment],
    eligible_from: Sequence[float],
    runs: Sequence[SimJob],
    k: int,
    nodes: NodeCount,
) -> list[Phase]:
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
        out.append(Phase(list(key), cap, secs))
    return out


class Master:
    """The multipliers' LP, solved exactly by column generation.

    Primal: maximise ``sum_j y_j`` with ``y_j <= T_j`` and ``y_j <= G_j``, ``G_j`` the
    gross samples of a time-sharing, in each (phase, capacity), of the allocations
    generated so far. Its duals on ``y_j <= G_j`` are ``1 - mu_j``; its value is a
    lower estimate of the relaxation's optimum, and :func:`upper_bound` stops once the
    best proven bound comes within 1e-7 of it. Every round's ``mu`` is priced by the
    exact DP, so the bound reported never depends on the LP solver's accuracy.
    """

    def __init__(self, phases: Sequence[Phase], rates: Sequence[np.ndarray], totals: np.ndarray):
        self.phases = phases
        self.rates = rates
        self.totals = totals
        #: one row per (phase, capacity) with time spent there
        self.cells = [(i, c) for i, ph in enumerate(phases) for c in np.flatnonzero(ph.seconds)]
        self.columns: list[tuple[int, np.ndarray]] = []  # (cell row, gross per job)
        self.keys: list[tuple[int, bytes]] = []  # per column: (cell row, allocation)
        self.idle_rounds: list[int] = []  # per column: solves in a row it went unused
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
            self.keys.append(key)
            self.idle_rounds.append(0)
            added = True
        return added

    def prune(self, weights: np.ndarray, keep_idle_rounds: int = 5) -> None:
        """Drop columns unused (weight 0) for ``keep_idle_rounds`` solves in a row.

        The LP's time grows with its columns and most never enter a solution again; a
        dropped allocation that is needed later is generated again by the DP (its key
        leaves ``seen``). The restricted LP's value only feeds the stopping test, whose
        floor it stays below, so the bound is unaffected.
        """
        kept: list[int] = []
        for ci, w in enumerate(weights):
            self.idle_rounds[ci] = 0 if w > 1e-12 else self.idle_rounds[ci] + 1
            if self.idle_rounds[ci] <= keep_idle_rounds:
                kept.append(ci)
            else:
                self.seen.discard(self.keys[ci])
        self.columns = [self.columns[ci] for ci in kept]
        self.keys = [self.keys[ci] for ci in kept]
        self.idle_rounds = [self.idle_rounds[ci] for ci in kept]

    def solve(self) -> tuple[float, np.ndarray, np.ndarray]:
        """(the restricted primal's value, ``mu`` from its duals, each column's weight)."""
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
        return -float(res.fun), mu, np.asarray(res.x[jn:])


def search_multipliers(phases: Sequence[Phase], rates: Sequence[np.ndarray], totals: np.ndarray,
                       k: int, rounds: int, *, gap: float = 1e-5,
                       time_limit_s: float = math.inf
                       ) -> tuple[float, np.ndarray, float, int, float]:
    """The smallest bound over the multipliers tried: (bound, mu, bound at mu=0, rounds, gap).

    ``gap``: ``(bound - floor) / bound``, the floor being the restricted LP's value, which
    no ``mu`` can beat; 0 when the search converged.

    Every ``mu`` priced is a valid bound (exact DP, not the LP's value), so stopping early
    (``rounds``, ``time_limit_s``) gives a looser, never a wrong, bound; it stops once the
    bound is within ``gap`` (relative) of the LP's floor, the most any ``mu`` could give.
    The multipliers priced are the LP's, smoothed towards the best so far (Wentges), which
    damps the zig-zag of plain column generation; when that finds no new column, the LP's
    own are priced.
    """
    deadline = time.monotonic() + time_limit_s

    def price(mu: np.ndarray) -> tuple[float, list[Allocation]]:
        return _price(phases, rates, totals, k, mu)

    mu = np.zeros(len(totals))
    best, allocs = price(mu)
    uncapped, best_mu, done = best, mu.copy(), 0
    # No job past its total at mu = 0: T_j - G_j >= 0 is a subgradient there, so
    # mu = 0 is optimal (convexity) and the cap cannot tighten the bound.
    capped = bool((_gross(phases, rates, allocs, len(totals)) > totals).any())
    master = Master(phases, rates, totals)
    master.add(allocs)
    floor = best if not capped else -math.inf
    for it in range(rounds if capped else 0):
        if time.monotonic() > deadline:
            break
        floor, mu_lp, weights = master.solve()
        done = it + 1
        if best - floor <= gap * best:
            floor = best
            break  # within gap of the relaxation's optimum
        master.prune(weights)
        value, allocs = price(_SMOOTHING * best_mu + (1 - _SMOOTHING) * mu_lp)
        if not master.add(allocs):
            value, allocs = price(mu_lp)
            if not master.add(allocs):
                floor = best
                break  # the LP's mu is optimal for the relaxation
            mu = mu_lp
        else:
            mu = _SMOOTHING * best_mu + (1 - _SMOOTHING) * mu_lp
        if value < best:
            best, best_mu = value, mu.copy()
    rel_gap = max(0.0, (best - floor) / best) if best > 0 and floor > -math.inf else 1.0
    return best, best_mu, uncapped, done, (0.0 if not capped else rel_gap)


def _price(phases: Sequence[Phase], rates: Sequence[np.ndarray], totals: np.ndarray, k: int,
           mu: np.ndarray) -> tuple[float, list[Allocation]]:
    """The bound at ``mu`` and, per phase, the maximising allocations (exact DP)."""
    total = float(mu @ totals)
    allocs = []
    for ph in phases:
        weights = [1.0 - mu[p] for p in ph.members]
        alloc = best_allocations([rates[p] for p in ph.members], weights, k, ph.capacity)
        total += float(ph.seconds @ alloc.value)
        allocs.append(alloc)
    return total, allocs


def _gross(phases: Sequence[Phase], rates: Sequence[np.ndarray], allocs: Sequence[Allocation],
           jobs: int) -> np.ndarray:
    """Each job's gross samples under the phases' allocations."""
    gross = np.zeros(jobs)
    for ph, alloc in zip(phases, allocs, strict=True):
        for col, p in enumerate(ph.members):
            gross[p] += float(ph.seconds @ rates[p][alloc.nodes[:, col]])
    return gross


#: Weight of the best multipliers so far in the ones priced next (Wentges smoothing).
_SMOOTHING = 0.5

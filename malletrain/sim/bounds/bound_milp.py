"""The integer-finish bound: a MILP over finishes per time block (see :mod:`.bound`)."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from malletrain.core.allocation.sparse_rows import SparseRows
from malletrain.sim.bounds.bound_inputs import (
    IdleSegment,
    NodeCount,
    concave_sizes,
    job_rates,
)
from malletrain.sim.jobs import SimJob


@dataclass(frozen=True)
class _Block:
    """Consecutive segments, in time order, in which jobs ``0 .. members-1`` can run."""

    members: int
    capacity: int
    #: ``seconds[c]``: time during which ``c`` nodes (capped at ``capacity``) could be used.
    seconds: np.ndarray

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
    return _Block(members, cap, secs)


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


# Deliberately over 60 lines (tests/unit/test_layering.py names it): one MILP: variables, rows and
# solve read as one formulation (the module docstring is its proof).
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
    ``>= i - K``, finished by the block's end (admissions happen at finishes and
    arrivals, at any time).
    """
    from scipy.optimize import Bounds, milp

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
    rows = SparseRows()

    def row(entries: Iterable[tuple[int, float]], ub: float) -> None:
        rows.add(entries, -np.inf, ub)

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
        ref = b
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
    with _quiet_stdout():
        res = milp(
            np.array(cost),
            constraints=rows.constraint(len(lo)),
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

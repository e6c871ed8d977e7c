"""The baselines malletrain is measured against, behind the same Policy interface.

* :class:`EqualShare`: the nodes split equally over the admitted jobs, clipped
  to each job's [min, max], leftovers first come first served. Needs no curves.
  FreeTrain uses it as the fallback when its MILP fails.
* :class:`FreeTrain`: the per-event MILP of FreeTrain/BFTrainer (DESIGN §2),
  solved with SciPy's HiGHS (imported lazily: core stays importable without scipy).
* :class:`NoLossBound`: not a policy to run on a cluster but a reference for the
  evaluation: the most throughput the admitted jobs can have at each event, rescale
  costs and windows ignored. Replayed with free rescales it estimates what any policy
  can reach on a trace; the proven upper bound is :mod:`malletrain.sim.bounds.bound`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from malletrain.core.allocation.knapsack import solve_counts
from malletrain.core.allocation.placement import assign_nodes
from malletrain.core.allocation.sparse_rows import SparseRows
from malletrain.core.allocation.valuation import rates_upto
from malletrain.core.model import AllocationInput, MalleableJob, Plan

log = logging.getLogger(__name__)


def equal_share_counts(n_nodes: int, jobs: tuple[MalleableJob, ...]) -> dict[str, int]:
    """Water-filling equal share: each job gets ~n_nodes/len(jobs), within [min, max].

    Jobs whose max is below the fair share are capped and their excess is
    re-shared; a job whose share is below its min gets nothing unless the
    leftovers (handed out first come first served) cover its min.
    """
    order = sorted(jobs, key=lambda j: (j.submit_order, j.job_id))
    counts = {j.job_id: 0 for j in order}
    valid = [j for j in order if 0 < j.min_nodes <= j.max_nodes]
    active = list(valid)
    remaining = n_nodes
    # water-fill: settle jobs whose max is at or below the current fair share
    while active:
        share = remaining // len(active)
        capped = [j for j in active if j.max_nodes <= share]
        if not capped:
            break
        for j in capped:
            counts[j.job_id] = j.max_nodes
            remaining -= j.max_nodes
        active = [j for j in active if j.max_nodes > share]
    if active:
        share = remaining // len(active)
        for j in active:
            if share >= j.min_nodes:
                counts[j.job_id] = share
                remaining -= share
    # leftovers, first come first served: start jobs that got nothing, then grow
    for j in valid:
        if counts[j.job_id] == 0 and remaining >= j.min_nodes:
            counts[j.job_id] = j.min_nodes
            remaining -= j.min_nodes
    for j in valid:
        if remaining <= 0:
            break
        if counts[j.job_id] > 0:
            extra = min(remaining, j.max_nodes - counts[j.job_id])
            counts[j.job_id] += extra
            remaining -= extra
    return counts


def hold_caps(counts: Mapping[str, int], jobs: Sequence[MalleableJob],
              caps: Mapping[str, int]) -> dict[str, int]:
    """``counts`` from a rule that knows no limits, held to Slurm's shared ones
    (``AllocationInput.caps``): under a cap that is passed, the jobs submitted last give
    nodes back first (all of them where fewer than their minimum would be left)."""
    out = dict(counts)
    for key in sorted(caps):
        under = sorted((j for j in jobs if key in j.limits),
                       key=lambda j: (-j.submit_order, j.job_id))
        over = sum(out[j.job_id] for j in under) - max(0, caps[key])
        for job in under:
            if over <= 0:
                break
            n = out[job.job_id]
            left = n - min(n, over)
            left = left if left >= job.min_nodes else 0
            over -= n - left
            out[job.job_id] = left
    return out


def _plan_from_counts(inp: AllocationInput,
                      counts_fn: Callable[[int, tuple[MalleableJob, ...]], dict[str, int]]) -> Plan:
    """A plan from a counting rule: counts per job, held to Slurm's limits, then the shared
    node choice."""
    t0 = time.perf_counter()
    counts = counts_fn(len(inp.nodes), inp.jobs)
    if inp.caps:
        counts = hold_caps(counts, inp.jobs, inp.caps)
    assignments = assign_nodes(inp, counts)
    return Plan(assignments=assignments, objective=0.0, decision_s=time.perf_counter() - t0)


@dataclass
class EqualShare:
    """Equal split, keeping jobs on their current nodes where the count allows."""

    name: str = "equal-share"

    def decide(self, inp: AllocationInput) -> Plan:
        return _plan_from_counts(inp, equal_share_counts)


@dataclass(frozen=True)
class MilpResult:
    """A FreeTrain MILP outcome: counts (None when no feasible solution came back)."""

    counts: dict[str, int] | None
    objective: float
    status: str
    solve_s: float
    #: Concrete nodes per job (node-level formulation only).
    nodes: dict[str, tuple[str, ...]] | None = None


def _allowed_counts(job: MalleableJob, n_nodes: int) -> list[int]:
    lo, hi = max(1, job.min_nodes), min(job.max_nodes, n_nodes)
    return [0, *range(lo, hi + 1)] if hi >= lo else [0]


def _count_value(job: MalleableJob, n: int, c: int, rates: np.ndarray, tfwd_s: float) -> float:
    """FreeTrain's objective term: Tfwd x throughput - the rescale cost at the current rate."""
    value = tfwd_s * float(rates[n])
    if c > 0 and n > c:
        value -= job.scale_up_s * float(rates[c])
    elif c > 0 and n < c:
        value -= job.scale_down_s * float(rates[c])
    return value


def freetrain_milp(
    inp: AllocationInput,
    tfwd_s: float = 10.0,
    time_limit_s: float = 10.0,
    node_level: bool = False,
) -> MilpResult:
    """FreeTrain's per-event MILP (DESIGN §2), solved by HiGHS through SciPy.

    Binary x[job, node]; a job runs on 0 or [min, max] nodes; at one event a job
    only grows (keeps all its nodes) or only shrinks (takes no new node); its
    throughput is the piecewise-linear curve, encoded exactly at integer sizes by
    one binary z[job, k] per allowed size k; objective
    sum Tfwd x r_j(n_j) - (scale_up_s or scale_down_s) x r_j(current).

    ``node_level=False`` solves the same problem over the z alone: one size per job
    and ``sum k z[j, k] <= offered nodes``. That is exact, because the objective
    depends on the sizes only and any sizes within the offered count can be routed
    grow-only/shrink-only (a growing job keeps its nodes and takes the free ones and
    those the shrinking jobs release, which together are enough exactly when the sizes
    fit). So the optimum is the literal one while the symmetric node variables (and
    HiGHS's branching on them) disappear; ``node_level=True`` is the literal
    formulation, for the benchmark and the test that they agree.
    """
    t0 = time.perf_counter()
    if not inp.jobs:
        return MilpResult({}, 0.0, "no jobs", time.perf_counter() - t0)
    index = inp.node_index
    holder = np.full(len(index), -1, dtype=np.int64)
    own: list[list[int]] = []
    for j, job in enumerate(inp.jobs):
        idx = [index[n] for n in job.nodes if n in index and holder[index[n]] < 0]
        holder[idx] = j
        own.append(idx)
    z_of, z_val = _sizes(inp, own, tfwd_s)
    rows = SparseRows()
    for j in range(len(inp.jobs)):
        rows.add([(col, 1.0) for col, (jj, _) in enumerate(z_of) if jj == j], 1.0, 1.0)
    if node_level:
        x_cols = _node_level_rows(rows, z_of, holder, own)
    else:
        x_cols = 0
        rows.add([(col, float(k)) for col, (_, k) in enumerate(z_of)], 0.0, float(len(index)))
    sol, objective, status = _solve(rows, z_val, x_cols, time_limit_s)
    solve_s = time.perf_counter() - t0
    if sol is None:
        return MilpResult(None, 0.0, status, solve_s)
    counts = {job.job_id: 0 for job in inp.jobs}
    for col, (j, k) in enumerate(z_of):
        if sol[col] == 1:
            counts[inp.jobs[j].job_id] = k
    nodes_out: dict[str, tuple[str, ...]] | None = None
    if node_level:
        names = [n.name for n in inp.nodes]
        picked: dict[str, list[str]] = {job.job_id: [] for job in inp.jobs}
        for col in range(x_cols):
            if sol[len(z_of) + col] == 1:
                picked[inp.jobs[col // len(names)].job_id].append(names[col % len(names)])
        nodes_out = {k: tuple(v) for k, v in picked.items()}
    return MilpResult(counts, objective, status, solve_s, nodes_out)


def _sizes(inp: AllocationInput, own: list[list[int]],
           tfwd_s: float) -> tuple[list[tuple[int, int]], np.ndarray]:
    """The z variables: every (job, allowed size), and each one's objective value."""
    z_of: list[tuple[int, int]] = []
    z_val: list[float] = []
    for j, job in enumerate(inp.jobs):
        allowed = _allowed_counts(job, len(inp.nodes))
        rates = rates_upto(job.throughput, max(allowed[-1], len(own[j]), 1))
        for k in allowed:
            z_of.append((j, k))
            z_val.append(_count_value(job, k, len(own[j]), rates, tfwd_s))
    return z_of, np.array(z_val)


def _node_level_rows(rows: SparseRows, z_of: list[tuple[int, int]], holder: np.ndarray,
                     own: list[list[int]]) -> int:
    """FreeTrain's literal x[job, node] rows (column ``n_z + j * nodes + i``); their count."""
    n_z, n_nodes = len(z_of), len(holder)
    for j, mine in enumerate(own):
        zc = [col for col, (jj, _) in enumerate(z_of) if jj == j]
        xs = [n_z + j * n_nodes + i for i in range(n_nodes)]
        # nodes taken = chosen size
        rows.add([(c, 1.0) for c in xs] + [(c, -float(z_of[c][1])) for c in zc], 0.0, 0.0)
        grow = [(c, -1.0) for c in zc if z_of[c][1] > len(mine)]
        for i, col in enumerate(xs):
            if holder[i] == j:
                rows.add([(col, 1.0), *grow], 0.0, np.inf)  # growing keeps every own node
            else:
                rows.add([(col, 1.0), *grow], -np.inf, 0.0)  # a new node only when growing
    for i in range(n_nodes):
        rows.add([(n_z + j * n_nodes + i, 1.0) for j in range(len(own))], 0.0, 1.0)
    return len(own) * n_nodes


def _solve(rows: SparseRows, z_val: np.ndarray, x_cols: int,
           time_limit_s: float) -> tuple[np.ndarray | None, float, str]:
    """HiGHS on ``max z_val . z`` over binaries: (solution, objective, status)."""
    from scipy.optimize import Bounds, milp

    n_var = len(z_val) + x_cols
    res = milp(
        np.concatenate((-z_val, np.zeros(x_cols))),
        constraints=[rows.constraint(n_var)],
        integrality=np.ones(n_var),
        bounds=Bounds(np.zeros(n_var), np.ones(n_var)),
        options={"time_limit": float(time_limit_s), "disp": False, "presolve": False},
    )
    if res.x is None:
        return None, 0.0, str(res.message)
    return np.round(res.x).astype(np.int64), -float(res.fun), str(res.message)


@dataclass
class FreeTrain:
    """FreeTrain/BFTrainer: the per-event MILP with a fixed look-ahead, equal share as fallback."""

    name: str = "freetrain"
    tfwd_s: float = 10.0
    time_limit_s: float = 10.0

    def decide(self, inp: AllocationInput) -> Plan:
        t0 = time.perf_counter()
        result = freetrain_milp(inp, self.tfwd_s, self.time_limit_s)
        notes: tuple[str, ...] = ()
        counts = result.counts
        if counts is None:
            log.warning("freetrain: MILP gave no solution (%s); equal share", result.status)
            counts = equal_share_counts(len(inp.nodes), inp.jobs)
            notes = (f"milp failed: {result.status}; equal-share fallback",)
        if inp.caps:  # FreeTrain knows no Slurm limits: held after it (hold_caps)
            counts = hold_caps(counts, inp.jobs, inp.caps)
        assignments = assign_nodes(inp, counts)
        return Plan(
            assignments=assignments,
            objective=result.objective,
            decision_s=time.perf_counter() - t0,
            notes=notes,
        )


def max_throughput_counts(n_nodes: int, jobs: tuple[MalleableJob, ...]) -> dict[str, int]:
    """Counts that maximise the summed throughput ``sum_j r_j(n_j)`` on ``n_nodes`` nodes.

    Each job runs on 0 or [min, max] nodes; exact (the allocator's multiple-choice
    knapsack DP over the value table ``V[j, n] = r_j(n)``), curves need not be concave.
    """
    if not jobs:
        return {}
    width = max(1, max(min(j.max_nodes, n_nodes) for j in jobs))
    values = np.full((len(jobs), width + 1), -np.inf)
    values[:, 0] = 0.0
    for row, job in enumerate(jobs):
        lo, hi = max(1, job.min_nodes), min(job.max_nodes, n_nodes)
        if lo <= hi:
            values[row, lo : hi + 1] = rates_upto(job.throughput, hi)[lo : hi + 1]
    counts, _ = solve_counts(values, n_nodes)
    return {job.job_id: int(n) for job, n in zip(jobs, counts, strict=True)}


@dataclass
class NoLossBound:
    """The loss-free reference: at every event, the counts of highest summed throughput.

    Why it exists: the evaluation's targets are ratios between policies, and one needs
    to know how much any policy could gain on a trace at all. Replayed with every
    rescale and reclaim free (``malletrain simulate --no-rescale-cost``), a policy's
    samples between two events are at most the best summed rate of the admitted jobs
    times the interval, and this policy takes that best at every event, so no policy
    makes more samples on the same admitted jobs. (Which jobs are admitted depends on
    which finish first, so with finishing jobs it is a reference, not a strict bound:
    :mod:`malletrain.sim.bounds.bound` is the proven one.)
    It reads the true curves and ignores costs and windows: a simulator reference only,
    never for a real cluster (its registry entry has ``curves="true"``, which the
    daemon refuses).
    """

    name: str = "no-loss-bound"

    def decide(self, inp: AllocationInput) -> Plan:
        return _plan_from_counts(inp, max_throughput_counts)

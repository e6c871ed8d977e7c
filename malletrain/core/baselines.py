"""The baselines malletrain is measured against, behind the same Policy interface.

* :class:`EqualShare`: the nodes split equally over the admitted jobs, clipped
  to each job's [min, max], leftovers first come first served. Needs no curves.
  FreeTrain uses it as the fallback when its MILP fails.
* :class:`FreeTrain`: the per-event MILP of FreeTrain/BFTrainer (DESIGN §2),
  solved with SciPy's HiGHS (imported lazily: core stays importable without scipy).
* :class:`NoLossBound`: not a policy to run on a cluster but a reference for the
  evaluation: the most throughput the admitted jobs can have at each event, rescale
  costs and windows ignored. Replayed with free rescales it estimates what any policy
  can reach on a trace; the proven upper bound is :mod:`malletrain.sim.bound`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from malletrain.core.knapsack import solve_counts
from malletrain.core.model import AllocationInput, MalleableJob, Plan
from malletrain.core.placement import assign_nodes
from malletrain.core.sparse_rows import SparseRows
from malletrain.core.valuation import rates_upto

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


def _plan_from_counts(inp: AllocationInput,
                      counts_fn: Callable[[int, tuple[MalleableJob, ...]], dict[str, int]]) -> Plan:
    """A plan from a counting rule: counts per job, then the shared node choice."""
    t0 = time.perf_counter()
    assignments = assign_nodes(inp, counts_fn(len(inp.nodes), inp.jobs))
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


# Deliberately over 60 lines (tests/unit/test_layering.py names it): FreeTrain's published MILP,
# kept as one formulation so it reads against the paper line by line.
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

    ``node_level=False`` aggregates x over nodes with the same holder (the free
    pool, or job h's nodes): all nodes of a group are interchangeable in this
    objective, so the optimum is the same while the symmetric node-level
    variables (and HiGHS's branching on them) disappear. ``node_level=True`` is
    the literal formulation, for the benchmark.
    """
    from scipy.optimize import Bounds, milp

    t0 = time.perf_counter()
    jobs = inp.jobs
    names = [n.name for n in inp.nodes]
    index = {n: i for i, n in enumerate(names)}
    n_nodes = len(names)
    holder = np.full(n_nodes, -1, dtype=np.int64)
    own: list[list[int]] = []
    for j, job in enumerate(jobs):
        idx = [index[n] for n in job.nodes if n in index and holder[index[n]] < 0]
        holder[idx] = j
        own.append(idx)
    if not jobs:
        return MilpResult({}, 0.0, "no jobs", time.perf_counter() - t0)

    # z variables: (job, size)
    z_of: list[tuple[int, int]] = []
    z_val: list[float] = []
    for j, job in enumerate(jobs):
        allowed = _allowed_counts(job, n_nodes)
        rates = rates_upto(job.throughput, max(allowed[-1], len(own[j]), 1))
        for k in allowed:
            z_of.append((j, k))
            z_val.append(_count_value(job, k, len(own[j]), rates, tfwd_s))
    n_z = len(z_of)
    # x variables: node level (job, node) or aggregated (job, group)
    if node_level:
        x_of = [(j, i) for j in range(len(jobs)) for i in range(n_nodes)]
        group_size = np.ones(n_nodes)
        group_of_x = [i for _, i in x_of]
        own_group = None
    else:
        groups = [-1, *range(len(jobs))]  # -1: free pool, h: nodes held by job h
        sizes = [float((holder == -1).sum())] + [float(len(o)) for o in own]
        keep = [g for g, size in enumerate(sizes) if size > 0]
        x_of = [(j, g) for j in range(len(jobs)) for g in keep]
        group_size = np.array(sizes)
        group_of_x = [g for _, g in x_of]
        own_group = {j: groups.index(j) for j in range(len(jobs))}
    n_x = len(x_of)
    n_var = n_z + n_x
    rows = SparseRows()
    add_row = rows.add
    z_by_job: dict[int, list[int]] = {}
    for col, (j, _) in enumerate(z_of):
        z_by_job.setdefault(j, []).append(col)
    x_by_job: dict[int, list[int]] = {}
    x_by_group: dict[int, list[int]] = {}
    for col, (j, g) in enumerate(x_of):
        x_by_job.setdefault(j, []).append(n_z + col)
        x_by_group.setdefault(g, []).append(n_z + col)
    for j in range(len(jobs)):
        c = len(own[j])
        zc = z_by_job[j]
        add_row([(col, 1.0) for col in zc], 1.0, 1.0)  # one size per job
        # nodes taken = chosen size
        add_row(
            [(col, 1.0) for col in x_by_job.get(j, [])]
            + [(col, -float(z_of[col][1])) for col in zc],
            0.0,
            0.0,
        )
        grow = [(col, 1.0) for col in zc if z_of[col][1] > c]
        for col in x_by_job.get(j, []):
            g = x_of[col - n_z][1]
            size = float(group_size[g])
            mine = (holder[g] == j) if node_level else (own_group is not None and g == own_group[j])
            if mine:
                # growing keeps every own node: x >= size * grow
                add_row([(col, 1.0)] + [(zc_, -size * v) for zc_, v in grow], 0.0, np.inf)
            else:
                # a node not held yet only when growing: x <= size * grow
                add_row([(col, 1.0)] + [(zc_, -size * v) for zc_, v in grow], -np.inf, 0.0)
    for g, cols in x_by_group.items():
        add_row([(col, 1.0) for col in cols], 0.0, float(group_size[g]))
    cost = np.concatenate((-np.array(z_val), np.zeros(n_x)))
    upper = np.concatenate((np.ones(n_z), np.array([group_size[g] for g in group_of_x])))
    res = milp(
        cost,
        constraints=[rows.constraint(n_var)],
        integrality=np.ones(n_var),
        bounds=Bounds(np.zeros(n_var), upper),
        options={"time_limit": float(time_limit_s), "disp": False},
    )
    solve_s = time.perf_counter() - t0
    if res.x is None:
        return MilpResult(None, 0.0, str(res.message), solve_s)
    sol = np.round(res.x).astype(np.int64)
    counts = {jobs[j].job_id: 0 for j in range(len(jobs))}
    for col, (j, k) in enumerate(z_of):
        if sol[col] == 1:
            counts[jobs[j].job_id] = k
    nodes_out: dict[str, tuple[str, ...]] | None = None
    if node_level:
        picked: dict[str, list[str]] = {job.job_id: [] for job in jobs}
        for col, (j, i) in enumerate(x_of):
            if sol[n_z + col] == 1:
                picked[jobs[j].job_id].append(names[i])
        nodes_out = {k: tuple(v) for k, v in picked.items()}
    return MilpResult(counts, -float(res.fun), str(res.message), solve_s, nodes_out)


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
    :mod:`malletrain.sim.bound` is the proven one.)
    It reads the true curves and ignores costs and windows: a simulator reference only,
    never for a real cluster (its registry entry has ``curves="true"``, which the
    daemon refuses).
    """

    name: str = "no-loss-bound"

    def decide(self, inp: AllocationInput) -> Plan:
        return _plan_from_counts(inp, max_throughput_counts)

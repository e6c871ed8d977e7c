"""Node types: each job runs on nodes of one type, chosen by per-type node prices.

Why one type per job: a synchronous data-parallel step waits for its slowest worker, so a
job spread over two GPU models runs every worker at the slower model's pace (Gavel, OSDI'20,
allocates per type for the same reason). So the plan has two levels:

1. every job gets a node type it may use (``MalleableJob.model_on``);
2. within each type, the exact count problem of
   :mod:`malletrain.core.allocation.allocator` decides the counts and nodes of that type's
   jobs on that type's nodes, with each job's throughput on that type, less the type's price
   (``AllocationInput.prices``) for the node-seconds used.

The type assignment is a Lagrangian relaxation of the types' capacities: each type's value
table is built once for every job that may use it (a move off the type a job runs on costs
a scale-down at its present rate: it leaves every node it holds); at a price per node of
each type every job takes its best (type, count); a type asked for more nodes than it has
gets dearer, by bisection. Step 2 then enforces the capacities exactly. At 5,000 nodes x
500 jobs x 3 types a decision takes about 2.5x the untyped one (benchmarks/allocator.py); a
local search moving one job at a time between exactly solved types took 100x longer at
2,000 x 200 and planned worse on the mixed-cluster replay (benchmarks/hetero.py).

The cost objective (HeterPS's formulation, minimise cost under a throughput target): a job
with ``rate_target`` values throughput only up to that target (:mod:`.targets`), so with
prices the plan meets each target with the cheapest nodes it can and spends nothing beyond.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from malletrain.core.allocation.targets import capped
from malletrain.core.model import AllocationInput, IdleNode, MalleableJob, ThroughputModel

if TYPE_CHECKING:  # the profiler is not needed to plan, only to tell models
    from malletrain.core.profiling.profiler import ProfilingAdvisor

log = logging.getLogger(__name__)

#: Bisection rounds for the per-type node prices (each halves every type's interval).
LAGRANGE_ROUNDS = 40


def is_typed(inp: AllocationInput) -> bool:
    """Whether ``inp`` needs the per-type plan: mixed node types, or jobs or prices that
    name types or targets. A homogeneous cluster takes the plain path, unchanged."""
    if len({n.node_type for n in inp.nodes}) > 1 or inp.prices:
        return True
    return any(j.type_throughput or j.allowed_types is not None or j.rate_target is not None
               for j in inp.jobs)


class CountSolver(Protocol):
    """What the per-type plan needs of the allocator (``MalleTrainPolicy``)."""

    def value_table(self, inp: AllocationInput, price_per_node_s: float = 0.0
                    ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]: ...

    def assign(self, inp: AllocationInput, price_per_node_s: float = 0.0
               ) -> tuple[dict[str, tuple[str, ...]], float]: ...


def decide_by_type(policy: CountSolver, inp: AllocationInput
                   ) -> tuple[dict[str, tuple[str, ...]], float]:
    """(assignments, objective) of the per-type plan (the module docstring says how)."""
    search = _TypeSearch(policy, inp)
    return search.plan(search.choose())


@dataclass
class _TypeSearch:
    policy: CountSolver
    inp: AllocationInput
    pools: dict[str, tuple[IdleNode, ...]] = field(init=False)
    #: views[t][j]: job j as seen on type t (its model there, its nodes of that type)
    views: dict[str, list[MalleableJob | None]] = field(init=False)
    type_of: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        by_type: dict[str, list[IdleNode]] = {}
        for node in self.inp.nodes:
            by_type.setdefault(node.node_type, []).append(node)
        self.pools = {t: tuple(ns) for t, ns in sorted(by_type.items())}
        self.type_of = {n.name: n.node_type for n in self.inp.nodes}
        self.views = {t: [_view(j, t, self.type_of, self._price(t)) for j in self.inp.jobs]
                      for t in self.pools}

    def _current(self, j: int) -> str | None:
        """The type job j runs on now (most of its nodes), if it may stay there."""
        held = Counter(self.type_of[n] for n in self.inp.jobs[j].nodes if n in self.type_of)
        for t, _ in sorted(held.items(), key=lambda kv: (-kv[1], kv[0])):
            if self.views[t][j] is not None:
                return t
        return None

    def _sub(self, t: str, members: Iterable[int],
             caps: Mapping[str, int] | None = None) -> AllocationInput:
        jobs = tuple(v for j in sorted(members) if (v := self.views[t][j]) is not None)
        return AllocationInput(now_s=self.inp.now_s, nodes=self.pools[t], jobs=jobs,
                               queued_jobs=self.inp.queued_jobs, caps=dict(caps or {}))

    def _price(self, t: str) -> float:
        return max(0.0, float(self.inp.prices.get(t, 0.0)))

    def _leave_cost(self, j: int, now: str | None, t: str | None) -> float:
        """A job moved off the type it runs on leaves all its nodes: a scale-down."""
        if now is None or t == now:
            return 0.0
        view = self.views[now][j]
        assert view is not None
        return view.scale_down_s * view.throughput.rate(len(view.nodes))

    def tables(self, now: list[str | None]) -> dict[str, np.ndarray]:
        """Per type, every job's value at every count there (``-inf``: not eligible; count 0
        only on the type it runs on, so that stopping is priced once), less the move's cost."""
        n_jobs = len(self.inp.jobs)
        out: dict[str, np.ndarray] = {}
        for t in self.pools:
            rows = [j for j in range(n_jobs) if self.views[t][j] is not None]
            full = np.full((n_jobs, 1), -np.inf)
            if rows:
                values, _, _ = self.policy.value_table(self._sub(t, rows), self._price(t))
                full = np.full((n_jobs, values.shape[1]), -np.inf)
                full[rows] = values
            for j in range(n_jobs):
                if now[j] is not None and now[j] != t:
                    full[j, 0] = -np.inf
                    full[j, 1:] -= self._leave_cost(j, now[j], t)
            out[t] = full
        return out

    def choose(self) -> list[str | None]:
        """A type per job (None: it can use none of the types offered), by prices per node
        of each type (Lagrange multipliers of the types' capacities, by bisection): each job
        takes the type and count worth most at those prices; a type asked for more nodes
        than it has gets dearer. The counts are then decided exactly, per type (``plan``)."""
        now = [self._current(j) for j in range(len(self.inp.jobs))]
        tables = self.tables(now)
        caps = {t: len(ns) for t, ns in self.pools.items()}
        price = dict.fromkeys(tables, 0.0)
        choice = _best(tables, price)
        if all(d <= caps[t] for t, d in _demand(choice).items()):
            return self._settle(choice, now)
        # a price at which no job wants a single node of the type bounds every bracket
        top = max(float(np.abs(v[np.isfinite(v)]).max(initial=1.0)) for v in tables.values())
        lo, hi = dict.fromkeys(tables, 0.0), dict.fromkeys(tables, top + 1.0)
        for _ in range(LAGRANGE_ROUNDS):
            price = {t: (lo[t] + hi[t]) / 2 for t in tables}
            demand = _demand(_best(tables, price))
            for t in tables:
                if demand.get(t, 0) > caps[t]:
                    lo[t] = price[t]
                else:
                    hi[t] = price[t]
        return self._settle(_best(tables, hi), now)

    @staticmethod
    def _settle(choice: list[tuple[str | None, int]], now: list[str | None]
                ) -> list[str | None]:
        """Each job's type; one that takes no node keeps the type it runs on (it is stopped
        there, which its table there prices)."""
        out: list[str | None] = []
        for j, (t, n) in enumerate(choice):
            out.append(now[j] if n == 0 and now[j] is not None else t)
        return out

    def plan(self, choice: list[str | None]) -> tuple[dict[str, tuple[str, ...]], float]:
        """Node names per job for ``choice``; the objective net of the moves' costs."""
        assignments: dict[str, tuple[str, ...]] = {j.job_id: () for j in self.inp.jobs}
        objective = 0.0
        caps = dict(self.inp.caps)  # Slurm's limits: what one type's jobs took is gone
        for t in self.pools:
            members = [j for j, c in enumerate(choice) if c == t]
            if not members:
                continue
            got, value = self.policy.assign(self._sub(t, members, caps), self._price(t))
            assignments.update(got)
            objective += value
            for j in members:
                job = self.inp.jobs[j]
                for key in job.limits:
                    if key in caps:
                        caps[key] -= len(got.get(job.job_id, ()))
        now = [self._current(j) for j in range(len(choice))]
        objective -= sum(self._leave_cost(j, now[j], c) for j, c in enumerate(choice)
                         if assignments[self.inp.jobs[j].job_id])
        return assignments, objective


def _best(tables: dict[str, np.ndarray], price: dict[str, float]
          ) -> list[tuple[str | None, int]]:
    """Each job's (type, count) worth most at ``price`` per node of each type."""
    best_v: np.ndarray | None = None
    best: list[tuple[str | None, int]] = []
    for t, v in tables.items():
        net = v - price[t] * np.arange(v.shape[1])[None, :]
        n = np.argmax(net, axis=1)
        val = net[np.arange(net.shape[0]), n]
        if best_v is None:
            best_v = np.full(val.shape, -np.inf)
            best = [(None, 0)] * val.shape[0]
        better = val > best_v
        for j in np.flatnonzero(better).tolist():
            best[j] = (t, int(n[j]))
        best_v = np.where(better, val, best_v)
    return [(t if np.isfinite(bv) else None, n) for (t, n), bv in
            zip(best, best_v if best_v is not None else [], strict=True)]


def _demand(choice: list[tuple[str | None, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t, n in choice:
        if t is not None:
            out[t] = out.get(t, 0) + n
    return out


def _view(job: MalleableJob, t: str, type_of: dict[str, str], price: float
          ) -> MalleableJob | None:
    """Job ``job`` as the count problem of type ``t`` sees it: its model there, capped at
    its target (nodes beyond it a small loss where the type is free: a price says so
    otherwise), and only its nodes of that type."""
    model = job.model_on(t)
    if model is None:
        return None
    if job.rate_target is not None:
        model = capped(model, job.rate_target, None if price > 0 else job.max_nodes)
    nodes = tuple(n for n in job.nodes if type_of.get(n) == t)
    return replace(job, throughput=model, nodes=nodes, type_throughput={},
                   allowed_types=None, rate_target=None)


@dataclass
class TypeSpeeds:
    """A prior for the node types a job never ran on, from the jobs that ran on several.

    A job measured on one GPU model says nothing by itself about another; the other jobs
    do: the ratio of their rates on the two (same size) is mostly the hardware's. So a
    type a job has not run on gets the curve of a type it has, times the median ratio over
    the jobs measured on both; with no such job yet, times ``optimism`` (> 1), so that the
    allocator tries the type (optimism under uncertainty) and learns the ratio. Pure: the
    caller (the simulator's LearnedCurves, or the daemon) feeds it the advisor's models.
    """

    optimism: float = 1.25
    #: job -> (type a, type b) -> rate on b / rate on a at a size measured on both
    _ratios: dict[str, dict[tuple[str, str], float]] = field(default_factory=dict)

    def fill(self, job_id: str, models: dict[str, ThroughputModel]) -> dict[str, ThroughputModel]:
        """``models`` (per type, ``measured_max_nodes`` set) with the unmeasured ones filled."""
        measured = {t: m for t, m in models.items() if m.measured_max_nodes}
        mine = self._ratios.setdefault(job_id, {})
        for a, ma in measured.items():
            for b, mb in measured.items():
                n = min(ma.measured_max_nodes or 0, mb.measured_max_nodes or 0)
                if a != b and n > 0 and ma.rate(n) > 0:
                    mine[(a, b)] = mb.rate(n) / ma.rate(n)
        if not measured:
            return dict(models)
        out = dict(models)
        for t in models:
            if t in measured:
                continue
            guesses = []
            for a, ma in measured.items():
                ratio = self._median((a, t))
                factor = self.optimism if ratio is None else ratio
                guesses.append(replace(ma.scaled(factor), measured_max_nodes=0))
            out[t] = max(guesses, key=lambda m: m.rate(1))
        return out

    def _median(self, pair: tuple[str, str]) -> float | None:
        seen = sorted(r[pair] for r in self._ratios.values() if pair in r)
        return seen[len(seen) // 2] if seen else None

    def forget(self, job_id: str) -> None:
        """Keep a finished job's ratios: they describe the hardware, not the job."""
        return None


class TypedProgress:
    """A job's net progress split by the node type it was made on, for per-type profiles.

    The Profiling Advisor measures rates from a cumulative sample count per key; a profile
    per (job, type) must count only what was made on that type, or a job coming back to a
    type would show everything it made elsewhere as one interval there (seen in a replay:
    200,000 samples/s on one node). Each report's progress since the last one is credited
    to the type the job is on now (``None``: on a mix, or types unknown: credited to none).
    """

    def __init__(self) -> None:
        self._done: dict[str, float] = {}
        self._cum: dict[tuple[str, str], float] = {}

    @staticmethod
    def key(job_id: str, node_type: str) -> str:
        return f"{job_id}@{node_type}"

    def observe(self, job_id: str, node_type: str | None, samples_total: float
                ) -> tuple[str, float] | None:
        """(typed key, samples made on that type so far), or None when on no single type."""
        delta = samples_total - self._done.get(job_id, 0.0)
        self._done[job_id] = samples_total
        if node_type is None:
            return None
        cum = self._cum.get((job_id, node_type), 0.0) + delta
        self._cum[(job_id, node_type)] = cum
        return self.key(job_id, node_type), cum

    def keys(self, job_id: str) -> list[str]:
        return [self.key(j, t) for j, t in self._cum if j == job_id]

    def forget(self, job_id: str) -> list[str]:
        """Drop the job; the typed keys it had (for the advisor to forget too)."""
        gone = self.keys(job_id)
        self._done.pop(job_id, None)
        for k in [k for k in self._cum if k[0] == job_id]:
            del self._cum[k]
        return gone


def typed_models(advisor: ProfilingAdvisor, speeds: TypeSpeeds, job_id: str, kind: str | None,
                 types: Iterable[str]) -> dict[str, ThroughputModel]:
    """A job's model per node type (profiled as ``<job>@<type>``, pooled per
    ``<kind>@<type>``); the types it never ran on from the other jobs' speed ratios.
    The daemon's monitor and the simulator's learned curves both tell the policy this."""
    told = {}
    for t in types:
        key = TypedProgress.key(job_id, t)
        advisor.register(key, None if kind is None else f"{kind}@{t}")
        # marked with how far it is measured: the policy explores beyond on free nodes only
        told[t] = advisor.answers(key).model
    return speeds.fill(job_id, told)

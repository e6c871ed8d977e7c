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
(``--max-concurrent-jobs``) jobs are admitted at a time, in submit order, at events,
finishes and arrivals; an admitted job stays until it finishes. A job's net samples ``done_j`` are
its gross progress ``G_j``, the integral of ``r_j(n_j(t))``, minus its rescale and
reclaim losses, and it stops at exactly ``done_j = T_j`` (``total_samples``), so
``done_j <= min(T_j, G_j)``. On a cluster of node types (``SimJob.type_curves``) ``r_j(n)``
is the job's rate on its fastest type at ``n`` (``bound_inputs.type_envelope``): it runs
at its slowest type's, never faster, so the bound holds, looser.

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
finds the best ``mu`` with an LP (:class:`Master`, column generation over the DP's
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
cannot exceed the node-seconds offered since ``start``. Jobs are admitted at finishes
and arrivals too, inside segments, so a segment uses job ``p`` if both hold (and the
job is submitted) by its end.

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

**Integer finishes** (:func:`integer_finish_bound`, a MILP, optional). Cut the timeline
into blocks (one per event, or about ``block_s`` long); let binary ``f[j, b]`` say that
job ``j`` finished by the end of block ``b``, which needs ``G_j >= T_j`` by then.
Admitted jobs form a prefix ``0 .. A-1`` with ``A <= K + N``, so the running jobs with
index ``>= i`` (``i >= K``) are at most ``A - i <= N - (i - K)``, which is at most the
finished jobs with index ``>= i - K`` (at most ``i - K`` finished jobs have a smaller
index). Admissions happen at any time (finishes, arrivals), so ``N`` is taken at the
block's end. Allocations are time shares ``u[j, n]`` per block and capacity ``c`` (at
most one size per job at a time, ``sum n u <= c``, ``sum u <= K``), ``n`` on the concave
envelope of ``(0, 0)`` and the job's sizes up to ``c``: any size between two envelope
sizes is matched in nodes and running time by a mix of them with at least its rate.
Every real run is a feasible point (``f`` its real finishes, ``u`` its time shares), so
the MILP's optimum, and HiGHS's dual bound on it when stopped early, bound
``samples_total``, up to HiGHS's floating-point tolerances (unlike the LP bound, whose
value is recomputed exactly by the DP; so read a MILP bound within a few 1e-6 of a
target as undecided). ``Bound.samples`` is the smaller of the two bounds. (A version
with rows scaled by ``T_j`` let HiGHS drop the small coefficients and report 0: the rows
are kept in samples.)

``python -m malletrain.sim.bounds.cli_bound`` takes the trace and job flags of ``malletrain
simulate`` and prints both bounds (docs/evaluation.md, "A proven upper bound").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from malletrain.errors import PermanentError
from malletrain.sim.bounds.bound_inputs import (
    IdleSegment,
    NodeCount,
    earliest_starts,
    job_rates,
    min_duration_s,
    type_envelope,
)
from malletrain.sim.bounds.bound_lp import make_phases, search_multipliers
from malletrain.sim.bounds.bound_milp import integer_finish_bound
from malletrain.sim.jobs import SimJob


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
    #: How far the LP bound may still be above the best one this method can prove
    #: (relative; 0 when the search converged, larger when stopped by its time limit).
    gap: float
    #: Per job in submit order: the earliest time it may run, and its multiplier ``mu_j``.
    earliest_s: tuple[float, ...]
    multipliers: tuple[float, ...]


def _can_run_dry(runs: Sequence[SimJob], k: int, span_s: float) -> bool:
    """Whether the queue could empty within ``span_s`` (module docstring, "Running dry")."""
    d = min((min_duration_s(j) for j in runs), default=math.inf)
    max_finishes = k * math.floor(span_s / d) if 0 < d < math.inf else 0
    return len(runs) < k + max_finishes


#: Up to this many segments the integer-finish MILP gets one block per event; on longer
#: traces, blocks of about ``block_s`` (one per event would make it too big to solve).
EVENT_BLOCKS_MAX = 500


def milp_block_s(segments: Sequence[IdleSegment], block_s: float = 3 * 3600.0) -> float:
    """The ``block_s`` to pass :func:`upper_bound` for this trace: 0 (one block per
    event) up to :data:`EVENT_BLOCKS_MAX` segments, else ``block_s``."""
    return 0.0 if len(segments) <= EVENT_BLOCKS_MAX else block_s


def one_user(jobs: Sequence[SimJob]) -> None:
    """PermanentError unless ``jobs`` are one user's: ``sim/admission.py`` admits a user's
    first job beyond the limit and out of submit order, which :func:`earliest_starts` rules out."""
    if len({j.user for j in jobs}) > 1:
        raise PermanentError("the proven bound assumes one user's submit-order admission; "
                             "this job set names several users")


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
    time_limit_s: float = math.inf,
) -> Bound:
    """The bound of the module docstring for one replay (``segments`` from :func:`idle_segments`).

    ``rounds`` and ``time_limit_s`` bound the multiplier search (:class:`Master`); every
    round's value is a valid bound and the smallest is returned, so fewer rounds give a
    looser, never a wrong, bound (``Bound.gap`` says how much looser at most).
    ``submit_origin_s``: the trace's ``start_s``, from which jobs' ``submit_s`` count
    (without it submit times are ignored). ``milp_s > 0`` also runs
    :func:`integer_finish_bound` (blocks of ``block_s``) for at most that long.
    """
    # the engine's (stable) admission order; typed jobs as their envelope (a looser bound)
    runs = sorted(map(type_envelope, jobs), key=lambda j: j.submit_s)
    one_user(runs)
    k = max_concurrent_jobs
    start = segments[0].start_s if segments else 0.0
    until = segments[-1].end_s if segments else 0.0
    eligible_from = earliest_starts(segments, runs, k, nodes=nodes, submit_origin_s=submit_origin_s)
    rates = [job_rates(j) for j in runs]
    totals = np.array([j.total_samples for j in runs])
    phases = make_phases(segments, eligible_from, runs, k, nodes)
    best, best_mu, uncapped, done, gap = search_multipliers(phases, rates, totals, k, rounds,
                                                            time_limit_s=time_limit_s)
    best_rate = max((j.best_per_node_rate() for j in runs), default=0.0)
    idle_ns = sum(s.idle * s.duration_s for s in segments)
    milp = integer_finish_bound(segments, runs, k, eligible_from, nodes=nodes, block_s=block_s,
                                time_limit_s=milp_s) if milp_s > 0 and segments else None
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
        can_run_dry=_can_run_dry(runs, k, until - start),
        rounds=done,
        gap=gap,
        earliest_s=tuple(eligible_from),
        multipliers=tuple(float(x) for x in best_mu),
    )



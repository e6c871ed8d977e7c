"""malletrain's Resource Allocator: exact node counts by dynamic programming, then node choice.

Formulation as built (docs/allocator.md has the derivation and the why)
-----------------------------------------------------------------------
Every node ``i`` gets an *effective window* ``w_i``: its predicted remaining idle
time (Slurm's backfill plan, ``IdleNode.window_s``) or, where nothing is planned,
the expected remaining idle time given its idle age from the learned hole-length
distribution (:mod:`malletrain.core.holes`), both capped at the horizon ``H``; and
a *reclaim probability* ``p_i``: the chance that Slurm takes it back within ``H``.

A job ``j`` that holds a set ``A`` of ``n`` nodes keeps running as its nodes are
reclaimed one by one in window order, so with its nodes ranked by descending
window ``w_(1) >= ... >= w_(n)`` its work over the horizon is::

    work_j(A) = r_j(m) * w_(m) + sum_{k=m+1..n} (r_j(k) - r_j(k-1)) * w_(k)

(``m`` = min_nodes: below it the job stops), each reclaim event costs a
scale-down at the rate it had then (``d_j * r_j(k) * p_(k)`` for the last node
``k`` of each event; nodes with the same planned window are one event: a pending
job starts on all of them at once), and changing the
size now costs ``u_j * r_j(c_j)`` (grow) or ``d_j * r_j(c_j)`` (shrink), as in
FreeTrain; starting from zero costs ``s_j * r_j(n)`` (the start-up, where FreeTrain
starts for free), and shrinking a running job counts its forgone work ``1 + margin``
times (hysteresis against trading nodes on measurement noise). With ``w_i = Tfwd``
for all nodes, no reclaims, no start cost and no margin this is exactly FreeTrain's
objective; per-node windows make a node that
will be reclaimed in 40 s worth 40 s of its marginal throughput minus a
scale-down, so a 20 s scale-up onto it does not pay, while a long hole does.

Which nodes a count means is fixed per job, so that the count problem stays a
multiple-choice knapsack that dynamic programming solves *exactly*: a job of
``n <= c`` keeps its ``n`` longest-window nodes (releases those about to be
reclaimed first); a job of ``n > c`` keeps all its nodes and grows onto the
longest windows of the free pool (then nodes others may release, valued at the
shortest window among them, since others release their shortest first), with the
windows merged into one ranking. Every job is valued against
the pool's best windows; the node-choice step then hands the pool out longest
window first in order of the value each job gains per new node, so jobs growing
at the same decision share the top of the pool.

Solving: ``f_j(t)`` = best value of jobs ``1..j`` on at most ``t`` nodes,
``f_j(t) = max(f_{j-1}(t) + V_j(0), max_{n in [min_j, max_j]} f_{j-1}(t-n) + V_j(n))``,
vectorised over ``t`` with numpy: O(jobs x nodes x sizes), no solver.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import numpy as np

from malletrain.core.holes import HoleLengthModel, HoleTracker
from malletrain.core.model import AllocationInput, MalleableJob, Plan, ThroughputModel
from malletrain.core.placement import assign_nodes

log = logging.getLogger(__name__)


@lru_cache(maxsize=4096)
def _rates_cached(points: tuple[tuple[int, float], ...], slope: float, max_n: int) -> np.ndarray:
    ns = np.arange(max_n + 1, dtype=float)
    if not points or max_n <= 0:
        out = np.zeros(max_n + 1)
    else:
        xs = np.array([0.0] + [float(pt[0]) for pt in points])
        ys = np.array([0.0] + [float(pt[1]) for pt in points])
        out = np.interp(ns, xs, ys)
        last_n, last_r = points[-1]
        beyond = ns > last_n
        out[beyond] = last_r + slope * (ns[beyond] - last_n)
        out = np.maximum(out, 0.0)
    out.flags.writeable = False
    return out


def rates_upto(model: ThroughputModel, max_n: int) -> np.ndarray:
    """``model.rate(n)`` for n = 0..max_n, vectorised (same semantics as ThroughputModel.rate)."""
    return _rates_cached(model.points, float(model.optimistic_slope), int(max_n))


def job_value_table(
    jobs: Sequence[MalleableJob],
    own_w: Sequence[np.ndarray],
    own_p: Sequence[np.ndarray],
    own_g: Sequence[np.ndarray],
    grow_w: np.ndarray,
    grow_p: np.ndarray,
    grow_g: np.ndarray,
    grow_n: np.ndarray | None = None,
    *,
    start_s: np.ndarray | None = None,
    keep_margin: float | np.ndarray = 0.0,
) -> np.ndarray:
    """V[j, n] for every job j and count n = 0..K (``-inf`` where n is not allowed).

    ``own_*[j]``: job j's present nodes sorted by descending window: window,
    reclaim probability, reclaim-event key (nodes with equal keys are reclaimed
    together, so the job pays one scale-down for them; NaN never matches).
    ``grow_*`` (jobs x M): the nodes each job would grow onto, sorted by
    descending window; ``grow_n[j]``: how many of job j's row are real nodes
    (default: all). All jobs at once, vectorised over jobs, counts and nodes.

    ``start_s[j]``: seconds of the new rate a job at zero nodes loses when it starts
    (default 0: FreeTrain's free start). ``keep_margin``: a running job's work lost by
    shrinking counts ``1 + keep_margin`` times (hysteresis: another job must gain that
    much more before a node moves away from a running one); a scalar or one per job.
    """
    n_jobs = len(jobs)
    c = np.array([w.size for w in own_w], dtype=np.int64)
    lo = np.array([max(1, j.min_nodes) for j in jobs], dtype=np.int64)
    if grow_n is None:
        grow_n = np.full(n_jobs, grow_w.shape[1], dtype=np.int64)
    hi = np.minimum(np.array([j.max_nodes for j in jobs], dtype=np.int64), c + grow_n)
    big_k = int(max(1, hi.max(initial=0), c.max(initial=0), lo.max(initial=0)))
    rates = np.stack([rates_upto(j.throughput, big_k) for j in jobs])
    up = np.array([j.scale_up_s for j in jobs])
    down = np.array([j.scale_down_s for j in jobs])
    rows = np.arange(n_jobs)
    rate_now = rates[rows, c]
    k = np.arange(1, big_k + 1)[None, :]
    # rank coefficients: work a[k] * w_(k), reclaim cost b[k] * p_(k)
    a = np.where(k > lo[:, None], rates[:, 1:] - rates[:, :-1], 0.0)
    a[rows, lo - 1] = rates[rows, lo]
    b = np.where(k >= lo[:, None], down[:, None] * rates[:, 1:], 0.0)
    # own nodes, zero padded (ow, op), NaN padded keys, -inf padded (owm: never outranks)
    big_c = int(c.max(initial=0))
    width_c = max(big_c, 1)
    ow = np.zeros((n_jobs, width_c))
    op = np.zeros_like(ow)
    og = np.full_like(ow, np.nan)
    owm = np.full_like(ow, -np.inf)
    for j in range(n_jobs):
        ow[j, : c[j]] = own_w[j]
        op[j, : c[j]] = own_p[j]
        og[j, : c[j]] = own_g[j]
        owm[j, : c[j]] = own_w[j]
    m_max = int(max(0, (hi - c).max(initial=0)))
    g = grow_w[:, :m_max]
    gp = grow_p[:, :m_max]
    gg = grow_g[:, :m_max]
    values = np.full((n_jobs, big_k + 1), -np.inf)
    values[:, 0] = np.where(c > 0, -down * rate_now, 0.0)
    # A node pays the reclaim cost only if it is the last of its reclaim event in
    # the job's ranking ("boundary"); along a fixed ranking L, the value of the
    # first n nodes is cumsum(a w - b p boundary)[n] - b_n p_n (1 - boundary_n):
    # the n-th node always pays, whatever follows it in L.
    nxt = np.full_like(og, np.nan)
    nxt[:, :-1] = og[:, 1:]
    running = np.flatnonzero(c > 0)
    if m_max:
        nxt[running, c[running] - 1] = gg[running, 0]
    bound_o = ~(og == nxt)
    pay_o = b[:, :width_c] * op
    keep = np.cumsum(a[:, :width_c] * ow - pay_o * bound_o, axis=1)
    # work of the n longest-window own nodes; shrinking from c to n forgoes W_c - W_n
    work_o = np.cumsum(a[:, :width_c] * ow, axis=1)
    work_c = np.where(c > 0, work_o[rows, np.maximum(c - 1, 0)], 0.0)
    margin = np.broadcast_to(np.asarray(keep_margin, dtype=float), (n_jobs,))
    values[:, 0] -= margin * np.maximum(work_c, 0.0)
    if big_c:
        # n <= c: keep the n longest-window own nodes
        kk = k[:, :big_c]
        ok = (kk <= c[:, None]) & (kk >= lo[:, None]) & (kk <= hi[:, None])
        shrink_cost = np.where(kk < c[:, None], (down * rate_now)[:, None], 0.0)
        last_pays = (pay_o * ~bound_o)[:, :big_c]
        forgone = margin[:, None] * np.maximum(work_c[:, None] - work_o[:, :big_c], 0.0)
        values[:, 1 : big_c + 1] = np.where(
            ok, keep[:, :big_c] - last_pays - shrink_cost - forgone, -np.inf
        )
    if not m_max:
        return values
    # n = c + m: ranking own ++ growth, exact unless a growth node outranks an own node
    ms = np.arange(1, m_max + 1)
    rank_g = np.minimum(c[:, None] + ms[None, :], big_k) - 1
    nxt_g = np.full_like(gg, np.nan)
    nxt_g[:, :-1] = gg[:, 1:]
    bound_g = ~(gg == nxt_g)
    pay_g = np.take_along_axis(b, rank_g, 1) * gp
    pool_term = np.cumsum(np.take_along_axis(a, rank_g, 1) * g - pay_g * bound_g, axis=1)
    base = np.where(c > 0, keep[rows, np.maximum(c - 1, 0)], 0.0)
    grow_val = base[:, None] + pool_term - pay_g * ~bound_g
    # "mixed" jobs (a growth node outranks an own node): merge explicitly, per group
    # of similar (own, growth) sizes so that the padding stays small
    min_own = np.min(np.where(np.isfinite(owm), owm, np.inf), axis=1)
    mixed = np.flatnonzero((c > 0) & (g[:, 0] > min_own))
    span = hi - c
    shape_key = np.ceil(np.log2(np.maximum(c, 1))) * 64 + np.ceil(np.log2(np.maximum(span, 1)))
    a_pad = np.concatenate((a, np.zeros((n_jobs, big_c + m_max))), axis=1)
    b_pad = np.concatenate((b, np.zeros((n_jobs, big_c + m_max))), axis=1)
    for key in np.unique(shape_key[mixed]).tolist():
        grp = mixed[shape_key[mixed] == key]
        grow_val[grp, : int(max(1, span[grp].max()))] = _merged_values(
            grp, c, span, ow, op, og, owm, g, gp, gg, a_pad, b_pad
        )
    grow_val -= np.where(c > 0, up * rate_now, 0.0)[:, None]
    if start_s is not None:
        # a job at zero nodes loses start_s seconds of the rate it starts at
        starting = c == 0
        grow_val[starting] -= start_s[starting, None] * rates[starting, 1 : m_max + 1]
    n_grid = np.arange(1, big_k + 1)[None, :]
    m_idx = np.clip(n_grid - c[:, None] - 1, 0, m_max - 1)
    ok = (n_grid > c[:, None]) & (n_grid >= lo[:, None]) & (n_grid <= hi[:, None])
    values[:, 1:] = np.where(ok, np.take_along_axis(grow_val, m_idx, 1), values[:, 1:])
    return values


def _merged_values(
    grp: np.ndarray,
    c: np.ndarray,
    span: np.ndarray,
    ow: np.ndarray,
    op: np.ndarray,
    og: np.ndarray,
    owm: np.ndarray,
    g: np.ndarray,
    gp: np.ndarray,
    gg: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
) -> np.ndarray:
    """Work minus reclaim cost of own + first m growth nodes, merged by window (m = 1..mm)."""
    cc, mm = int(c[grp].max()), int(max(1, span[grp].max()))
    n_grp = grp.size
    gm = g[grp, :mm]
    # rank (0-based) of growth node l = l + #own nodes with a window >= its window;
    # of own node i = i + min(m, #growth nodes with a longer window) (ties: own first)
    e = (owm[grp, :cc][:, None, :] >= gm[:, :, None]).sum(axis=2)
    rank_g = np.arange(mm)[None, :] + e
    q = (gm[:, None, :] > ow[grp, :cc][:, :, None]).sum(axis=2)
    ms = np.arange(1, mm + 1)
    rank_o = np.arange(cc)[None, None, :] + np.minimum(ms[None, :, None], q[:, None, :])
    width = cc + mm
    w3 = np.zeros((n_grp, mm, width))
    p3 = np.zeros_like(w3)
    k3 = np.full_like(w3, np.nan)
    gi, mi, ii = np.indices((n_grp, mm, cc))
    sel = ii < c[grp][:, None, None]
    dst = (gi[sel], mi[sel], rank_o[sel])
    w3[dst] = ow[grp, :cc][gi[sel], ii[sel]]
    p3[dst] = op[grp, :cc][gi[sel], ii[sel]]
    k3[dst] = og[grp, :cc][gi[sel], ii[sel]]
    gi, mi, li = np.indices((n_grp, mm, mm))
    sel = li <= mi  # growth nodes 0..m-1 are in the set of size c + m
    dst = (gi[sel], mi[sel], rank_g[gi[sel], li[sel]])
    w3[dst] = gm[gi[sel], li[sel]]
    p3[dst] = gp[grp, :mm][gi[sel], li[sel]]
    k3[dst] = gg[grp, :mm][gi[sel], li[sel]]
    bound = np.ones(w3.shape, dtype=bool)
    bound[:, :, :-1] = ~(k3[:, :, :-1] == k3[:, :, 1:])
    a3 = a[grp, :width][:, None, :]
    b3 = b[grp, :width][:, None, :]
    result: np.ndarray = (a3 * w3 - b3 * p3 * bound).sum(axis=2)
    return result


#: Above this many sizes per job the DP updates one size at a time (bounded memory).
_MAX_BLOCK_SIZES = 256


def solve_counts(values: np.ndarray, capacity: int) -> tuple[np.ndarray, float]:
    """Exact multiple-choice knapsack over a value table.

    ``values[j, n]`` is job j's value at count n (``-inf`` = not allowed; count 0
    must be allowed). Chooses one count per job, total <= capacity, maximising
    the sum. Returns (count per job, optimal objective).

    ``f(t)`` = best value of the jobs so far on at most ``t`` nodes. Two exact
    shortcuts keep it fast: an option worth no more than a smaller count of the
    same job is dropped (``f`` is non-decreasing, so it can never be needed), and
    jobs are processed by ascending largest count so that early stages only span
    the capacity the jobs so far can use. Each stage is one strided 2-D update
    over all of a job's sizes (no Python loop over sizes).
    """
    n_jobs, width = values.shape
    finite = np.isfinite(values)
    if not finite[:, 0].all():
        raise ValueError("every job must allow count 0")
    best_below = np.maximum.accumulate(np.where(finite, values, -np.inf), axis=1)
    useful = finite.copy()
    useful[:, 1:] &= values[:, 1:] > best_below[:, :-1]
    cols = np.arange(width)[None, :]
    largest = np.where(useful, cols, 0).max(axis=1)
    smallest = np.where(useful & (cols > 0), cols, width).min(axis=1)
    order = np.argsort(largest, kind="stable")
    capacity = int(max(0, min(capacity, int(largest.sum()))))
    # Row p of `hist` is f after p jobs, preceded by `pad` cells of -inf so that
    # f(t - n) for every size n is a strided view of the row (no copies).
    pad = int(max(1, largest.max(initial=0)))
    hist = np.empty((n_jobs + 1, pad + capacity + 1))
    hist[:, :pad] = -np.inf
    hist[0, pad:] = 0.0
    item = hist.itemsize
    block = np.empty((min(_MAX_BLOCK_SIZES, pad), capacity + 1))
    best = np.empty(capacity + 1)
    reaches = [0]
    reach = 0
    for pos, j in enumerate(order.tolist()):
        lo, hi = int(smallest[j]), int(largest[j])
        row_prev = hist[pos]
        new_reach = min(capacity, reach + hi)
        # f is non-decreasing: beyond its old reach it equals its last value
        row_prev[pad + reach + 1 : pad + new_reach + 1] = row_prev[pad + reach]
        reach = new_reach
        prev = row_prev[pad : pad + reach + 1]
        g = hist[pos + 1, pad : pad + reach + 1]
        np.add(prev, values[j, 0], out=g)
        hi = min(hi, reach)
        if lo <= hi:
            vals = np.where(useful[j, lo : hi + 1], values[j, lo : hi + 1], -np.inf)
            k = hi - lo + 1
            if k <= _MAX_BLOCK_SIZES:
                # rows n = lo..hi: view[i, t] = f(t - lo - i); one add, one max
                view = np.lib.stride_tricks.as_strided(
                    row_prev[pad - lo :], shape=(k, reach + 1), strides=(-item, item)
                )
                tmp = block[:k, : reach + 1]
                np.add(view, vals[:, None], out=tmp)
                out = best[: reach + 1]
                np.max(tmp, axis=0, out=out)
                np.maximum(g, out, out=g)
            else:
                for n, v in zip(range(lo, hi + 1), vals.tolist(), strict=True):
                    if v > -np.inf:
                        np.maximum(g[n:], prev[: reach + 1 - n] + v, out=g[n:])
        reaches.append(reach)
    f = hist[n_jobs, pad : pad + reach + 1]
    t = int(np.argmax(f))
    objective = float(f[t])
    counts = np.zeros(n_jobs, dtype=np.int64)
    for pos in range(n_jobs - 1, -1, -1):
        j = int(order[pos])
        f_before = hist[pos, pad : pad + reaches[pos] + 1]
        target = hist[pos + 1, pad + t]
        ns = np.flatnonzero(useful[j, : t + 1])
        before = f_before[np.minimum(t - ns, f_before.size - 1)]
        chosen = int(ns[np.argmin(np.abs(before + values[j, ns] - target))])
        counts[j] = chosen
        t = min(t - chosen, f_before.size - 1)
    return counts, objective


@dataclass
class MalleTrainPolicy:
    """malletrain's allocator as a :class:`~malletrain.core.model.Policy`.

    Keeps one piece of learned state: the hole-length distribution, fed from the
    idle-node lists it is given (a node that disappears was reclaimed).

    Two terms keep it from moving nodes on noise (measured live on the dev cluster,
    where every move is a real 15-25 s start-up): a job at zero nodes pays its start-up
    (``charge_start``; ``MalleableJob.start_s``, default its scale-up cost) instead of
    starting for free, and a running job's forgone work counts ``1 + m_j`` times, so a
    node moves away from a running job only if the receiver gains ``m_j`` (relative)
    more than the giver loses. ``m_j = keep_margin + noise_margin * rate_noise_j``: the
    hysteresis scales with how noisy the job's measured throughput is (5 sigma of one
    job's rate is ~3.5 sigma of the difference between two such estimates). Learned curves
    of two copies of one model differ by a few percent of measurement noise; without
    these terms the policy swapped whole allocations between them at every decision.
    Where rates are exact (the simulator's replay) the margin is ``keep_margin``
    (default 0): a fixed 5-10 % margin cost up to 3 % of the samples on a Philly replay,
    where it kept nodes on jobs that scale worse. With ``keep_margin=0``,
    ``noise_margin=0`` and ``charge_start=False`` the objective is FreeTrain's.
    """

    name: str = "malletrain"
    horizon_s: float = 1800.0
    holes: HoleTracker = field(default_factory=HoleTracker)
    keep_margin: float = 0.0
    noise_margin: float = 5.0
    charge_start: bool = True
    #: Horizon for windows estimated from the hole model (nodes Slurm plans nothing
    #: for), capped by ``horizon_s``; ``None``: ``horizon_s``. See effective_windows.
    #: The simulator's replays use 300 s (malletrain.sim.cli_simulate.REPLAY_POLICY).
    estimate_horizon_s: float | None = None
    #: Unplanned nodes that turned idle within the same slot of this many seconds share
    #: one reclaim event (0: off; replays: 1 s, to the second; the daemon: off for now).
    reclaim_group_s: float = 0.0

    #: Exploration uses free nodes only: at counts that need nodes another running job
    #: must release (beyond what a job holds plus the free pool), its throughput is
    #: valued without the optimistic extension beyond its largest measured size
    #: (``ThroughputModel.measured_max_nodes``; ``None`` there: the curve is trusted).
    explore_free_only: bool = True

    #: Finish-aware valuation (0: off; replays: 0.5, malletrain.sim.cli_simulate.REPLAY_POLICY):
    #: while jobs wait for an admission slot, a job that can finish within
    #: ``finish_horizon_s`` at its present rate counts its samples ``1 + beta_j`` times,
    #: ``beta_j = finish_weight x sigma / r_j`` (at most ``finish_weight_cap``), ``sigma``
    #: what one more admitted job would add at the plan's node price. See finish_weights.
    finish_weight: float = 0.0
    finish_horizon_s: float = 24 * 3600.0
    finish_weight_cap: float = 1.0

    @staticmethod
    def slot_rate(inp: AllocationInput, counts: np.ndarray) -> float:
        """``sigma``: what one more admitted job would add per second, given a plan's counts.

        The queued job's curve is unknown until it runs, so it is taken as the mean curve
        ``rbar`` of the admitted jobs; it would take ``n`` nodes at the plan's node price
        ``lambda`` (0 if the plan leaves nodes free, else the smallest last-node marginal
        rate among the jobs holding nodes): ``sigma = max_n rbar(n) - lambda n``. Where
        nodes are scarce a slot is worth little (the newcomer only takes nodes from the
        others); where they are left free it is worth a whole job's rate.
        """
        if not inp.jobs:
            return 0.0
        hi = max(j.max_nodes for j in inp.jobs)
        curves = np.stack([rates_upto(j.throughput, hi) for j in inp.jobs])
        lam = 0.0
        if int(counts.sum()) >= len(inp.nodes):
            marg = [
                float(curves[i, n] - curves[i, n - 1]) for i, n in enumerate(counts.tolist()) if n
            ]
            lam = max(0.0, min(marg, default=0.0))
        rbar = curves.mean(axis=0)
        return float(np.max(rbar - lam * np.arange(hi + 1)))

    def finish_weights(self, inp: AllocationInput, sigma: float) -> np.ndarray:
        """``beta_j`` per job of ``inp.jobs``: the extra weight of its samples (0 for most).

        Why: with a concurrency limit and a queue, a job's finish admits the next job,
        which adds ``sigma`` samples/s (:meth:`slot_rate`). A job with ``R`` samples left
        at rate ``r`` finishes in ``R / r`` s; each sample it makes now brings that finish,
        and so the next admission, ``1 / r`` s earlier, worth ``sigma / r`` samples. So a
        sample of job j is worth ``1 + finish_weight x sigma / r_j`` (``finish_weight``
        < 1 discounts the guess; capped at ``finish_weight_cap``). Only jobs whose finish
        is within ``finish_horizon_s`` count: beyond it the allocation the finish time
        assumes will have been re-decided many times, and the slot's worth is discounted to
        nothing. The value table is linear in a job's rates (work and losses alike), so
        weighting its row maximises the weighted samples exactly. Needs
        ``MalleableJob.remaining_samples`` (declared by the user, not learned); jobs
        without it get 0, and so does every job when ``inp.queued_jobs == 0`` (a finish
        admits nobody). Measured in docs/evaluation.md ("Finish-aware valuation").
        """
        beta = np.zeros(len(inp.jobs))
        if self.finish_weight <= 0 or sigma <= 0 or inp.queued_jobs == 0:
            return beta
        for i, job in enumerate(inp.jobs):
            left = job.remaining_samples
            r = job.throughput.rate(len(job.nodes)) if job.nodes else 0.0
            if left is None or r <= 0 or left / r > self.finish_horizon_s:
                continue
            beta[i] = min(self.finish_weight_cap, self.finish_weight * sigma / r)
        return beta

    def state_dict(self) -> dict[str, Any]:
        """What the policy learned (the hole-length distribution), for the daemon's store."""
        return {"holes": self.holes.model.to_dict()}

    def load_state(self, data: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (ValueError if malformed)."""
        if not isinstance(data, dict) or not isinstance(data.get("holes"), dict):
            raise ValueError("malletrain policy state: expected a mapping with 'holes'")
        model = HoleLengthModel.from_dict(data["holes"])
        model.prior_floor = self.holes.model.prior_floor  # a setting, not learned state
        self.holes.model = model

    def effective_windows(self, inp: AllocationInput) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(w_i, p_i, key_i) per node of ``inp.nodes``.

        Capped window, probability of reclaim within the horizon, and the reclaim
        event: nodes with the same predicted window are taken back at the same
        moment (a pending job starting on them), so a job pays one scale-down
        for all of them.

        Nodes without a plan get the hole model's estimate over ``estimate_horizon_s``
        where set (replays: 300 s): beyond a few minutes the estimate extrapolates the
        hole-length tail, and an allocation on a trace that changes every minute or two
        is re-decided long before 30 minutes are up. With ``reclaim_group_s`` > 0 (replays:
        1 s), unplanned nodes that turned idle in the same slot (``now - idle_age``) are
        one reclaim event when they may be reclaimed within that horizon: they were freed
        together (one job ended) and the youngest are taken back first, together, so a job
        that already holds some of them pays one scale-down for more of the same and the
        allocator concentrates the nodes most likely to be reclaimed on few jobs (fewer
        jobs disrupted per reclaim). Measured on Philly slices in docs/evaluation.md
        ("Reducing Philly's losses"). Other estimated nodes are independent events (key
        NaN). Keys never collide: planned ones are windows (>= 0), grouped ones <= -1.
        """
        h = self.horizon_s
        nodes = inp.nodes
        count = len(nodes)
        # vectorised: a per-node loop of numpy scalar stores was ~8 ms at 5,000 nodes
        planned = np.fromiter((n.window_s is not None for n in nodes), dtype=bool, count=count)
        raw = np.fromiter(
            (0.0 if n.window_s is None else n.window_s for n in nodes), dtype=float, count=count
        )
        win = np.maximum(raw, 0.0)
        w = np.minimum(win, h)
        p = np.where(win < h, 1.0, 0.0)
        key = np.where(planned, win, np.nan)
        unknown = np.flatnonzero(~planned)
        if unknown.size:
            ages = np.fromiter(
                (nodes[i].idle_age_s for i in unknown.tolist()), dtype=float, count=unknown.size
            )
            h_est = h if self.estimate_horizon_s is None else min(h, self.estimate_horizon_s)
            rem, p_end = self.holes.model.expected_remaining_s(ages, h_est)
            w[unknown] = rem
            p[unknown] = p_end
            if self.reclaim_group_s > 0:
                slot = np.floor((inp.now_s - ages) / self.reclaim_group_s + 0.5)
                key[unknown] = np.where(p_end > 0.0, -1.0 - (slot - slot.min()), np.nan)
        return w, p, key

    def decide(self, inp: AllocationInput) -> Plan:
        t0 = time.perf_counter()
        self.holes.update(inp.now_s, inp.nodes)
        counts, objective, w, growth_order = self.solve(inp)
        windows = {n.name: float(w[i]) for i, n in enumerate(inp.nodes)}
        assignments = assign_nodes(inp, counts, windows_s=windows, growth_order=growth_order)
        return Plan(
            assignments=assignments, objective=objective, decision_s=time.perf_counter() - t0
        )

    @staticmethod
    def _no_exploration_beyond_free(
        values: np.ndarray,
        jobs: Sequence[MalleableJob],
        own_w: Sequence[np.ndarray],
        own_p: Sequence[np.ndarray],
        own_g: Sequence[np.ndarray],
        grow_w: np.ndarray,
        grow_p: np.ndarray,
        grow_g: np.ndarray,
        grow_n: np.ndarray,
        start: np.ndarray | None,
        margins: np.ndarray,
        n_free: int,
    ) -> None:
        """Overwrite ``values[j, n]`` for counts that need others' nodes with the
        conservative curve ``r(min(n, cap))``, ``cap`` = the job's largest measured size
        (at least its current and minimum size).

        Why: the advisor's optimistic extension is there so that untried sizes get
        tried; paid with free nodes that costs nothing but a scale-up, paid with another
        running job's node it costs that job a scale-down or an eviction, and the guess
        is often wrong, so the node comes back (seen live: an unmeasured job's doubled
        guess evicted a measured job). The second table is built only for the jobs where
        it differs (a measured size below the counts that need others' nodes, and a rate
        that still changes beyond it), so the DP stays exact over the combined table.
        """
        picks: list[int] = []
        cons_jobs: list[MalleableJob] = []
        first_n: list[int] = []
        for j, job in enumerate(jobs):
            model = job.throughput
            if model.measured_max_nodes is None:
                continue
            c = int(own_w[j].size)
            hi = min(job.max_nodes, c + int(grow_n[j]))
            beyond = c + n_free  # counts above this need nodes others release
            cap = max(model.measured_max_nodes, c, job.min_nodes, 1)
            if hi <= beyond or hi <= cap:
                continue
            r = rates_upto(model, hi)
            if not np.any(r[cap + 1 :] != r[cap]):
                continue
            pts = (*(pt for pt in model.points if pt[0] < cap), (cap, float(r[cap])))
            picks.append(j)
            cons_jobs.append(replace(job, throughput=ThroughputModel(pts)))
            first_n.append(max(beyond, cap) + 1)
        if not picks:
            return
        sel = np.array(picks, dtype=np.int64)
        cons = job_value_table(
            cons_jobs,
            [own_w[j] for j in picks],
            [own_p[j] for j in picks],
            [own_g[j] for j in picks],
            grow_w[sel],
            grow_p[sel],
            grow_g[sel],
            grow_n[sel],
            start_s=None if start is None else start[sel],
            keep_margin=margins[sel],
        )
        for i, (j, n0) in enumerate(zip(picks, first_n, strict=True)):
            top = min(values.shape[1], cons.shape[1])
            if n0 < top:
                values[j, n0:top] = cons[i, n0:top]

    def solve(self, inp: AllocationInput) -> tuple[dict[str, int], float, np.ndarray, list[str]]:
        """The count problem alone: (counts, objective, node windows, growth order)."""
        values, w, own_idx = self.value_table(inp)
        if not inp.jobs:
            return {}, 0.0, w, []
        count_arr, objective = solve_counts(values, len(inp.nodes))
        if (
            self.finish_weight > 0
            and inp.queued_jobs != 0
            and any(j.remaining_samples is not None for j in inp.jobs)
        ):
            # finish-aware: price the slot at the unweighted plan, then solve the weighted
            # table (exact for the weighted samples; see finish_weights)
            beta = self.finish_weights(inp, self.slot_rate(inp, count_arr))
            if beta.any():
                values = values * (1.0 + beta)[:, None]
                count_arr, objective = solve_counts(values, len(inp.nodes))
        counts = {job.job_id: int(n) for job, n in zip(inp.jobs, count_arr, strict=True)}
        # growth order: the largest value per new node picks from the pool first
        gain: list[tuple[float, int, str]] = []
        for j, (job, idx) in enumerate(zip(inp.jobs, own_idx, strict=True)):
            n = counts[job.job_id]
            if n > idx.size:
                gain.append((-float(values[j, n]) / n, job.submit_order, job.job_id))
        growth_order = [j for _, _, j in sorted(gain)]
        return counts, objective, w, growth_order

    def value_table(self, inp: AllocationInput) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """(V[job, count], node windows, each job's own node indices by descending window)."""
        w, p, key = self.effective_windows(inp)
        if not inp.jobs:
            return np.zeros((0, 1)), w, []
        index = {n.name: i for i, n in enumerate(inp.nodes)}
        held = np.zeros(len(inp.nodes), dtype=bool)
        own_idx: list[np.ndarray] = []
        for job in inp.jobs:
            idx = np.array([index[n] for n in job.nodes if n in index], dtype=np.int64)
            if idx.size:
                idx = idx[np.argsort(-w[idx], kind="stable")]
                held[idx] = True
            own_idx.append(idx)
        free = np.flatnonzero(~held)
        free = free[np.argsort(-w[free], kind="stable")]
        need = max(
            (j.max_nodes - i.size for j, i in zip(inp.jobs, own_idx, strict=True)), default=0
        )
        m_max = max(0, min(need, len(inp.nodes)))
        grow_w = np.zeros((len(inp.jobs), m_max))
        grow_p = np.zeros_like(grow_w)
        grow_g = np.full_like(grow_w, np.nan)
        n_free = min(free.size, m_max)
        grow_w[:, :n_free] = w[free[:n_free]]
        grow_p[:, :n_free] = p[free[:n_free]]
        grow_g[:, :n_free] = key[free[:n_free]]
        grow_n = np.full(len(inp.jobs), n_free, dtype=np.int64)
        if m_max > free.size:
            # Beyond the free pool a job can only grow onto nodes that others release,
            # and they release their shortest windows first. Valued pessimistically: all
            # at the shortest window (and highest reclaim chance) among those nodes,
            # independent events, ranked below the pool. Valuing them at the others'
            # best windows made two similar jobs trade nodes back and forth, each
            # believing it would get the long ones.
            held_idx = np.flatnonzero(held)
            held_idx = held_idx[np.argsort(w[held_idx], kind="stable")]
            cap = float(w[free[-1]]) if free.size else math.inf
            for j, idx in enumerate(own_idx):
                # among the first (need + own) held nodes at least `need` are others'
                head = held_idx[: m_max - free.size + idx.size]
                others = head[~np.isin(head, idx)][: m_max - free.size]
                if not others.size:
                    continue
                sl = slice(free.size, free.size + others.size)
                grow_w[j, sl] = min(float(w[others].min()), cap)
                grow_p[j, sl] = float(p[others].max())
                grow_g[j, sl] = np.nan
                grow_n[j] = free.size + others.size
        own_w = [w[i] for i in own_idx]
        own_p = [p[i] for i in own_idx]
        own_g = [key[i] for i in own_idx]
        start = None
        if self.charge_start:
            start = np.array(
                [j.scale_up_s if j.start_s is None else j.start_s for j in inp.jobs], dtype=float
            )
        margins = np.array(
            [self.keep_margin + self.noise_margin * max(0.0, j.rate_noise) for j in inp.jobs]
        )
        values = job_value_table(
            inp.jobs,
            own_w,
            own_p,
            own_g,
            grow_w,
            grow_p,
            grow_g,
            grow_n,
            start_s=start,
            keep_margin=margins,
        )
        if self.explore_free_only and m_max > free.size:
            self._no_exploration_beyond_free(
                values, inp.jobs, own_w, own_p, own_g, grow_w, grow_p, grow_g, grow_n,
                start, margins, int(free.size),
            )
        return values, w, own_idx


def malletrain_policy(
    name: str = "malletrain",
    horizon_s: float = 1800.0,
    keep_margin: float = 0.0,
    hole_prior_floor: float = 0.0,
    estimate_horizon_s: float | None = None,
    reclaim_group_s: float = 0.0,
    explore_free_only: bool = True,
    finish_weight: float = 0.0,
    finish_horizon_s: float = 24 * 3600.0,
) -> MalleTrainPolicy:
    return MalleTrainPolicy(
        name=name,
        horizon_s=horizon_s,
        holes=HoleTracker(HoleLengthModel(prior_floor=hole_prior_floor)),
        keep_margin=keep_margin,
        estimate_horizon_s=estimate_horizon_s,
        reclaim_group_s=reclaim_group_s,
        explore_free_only=explore_free_only,
        finish_weight=finish_weight,
        finish_horizon_s=finish_horizon_s,
    )

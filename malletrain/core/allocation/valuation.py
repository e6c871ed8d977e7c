"""What a job is worth at each node count: the value table of the allocator (docs/allocator.md).

``V_j(n)`` is job ``j``'s work over the horizon on ``n`` nodes, its nodes ranked by window,
less the expected reclaim losses and the cost of changing its size now; the formulation is
in :mod:`malletrain.core.allocation.allocator`'s docstring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from malletrain.core.allocation.merged import MergeNodes, merged_values, merged_values_at_span
from malletrain.core.model import AllocationInput, MalleableJob, ThroughputModel


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


# Deliberately over 60 lines (tests/unit/test_layering.py names it): the vectorised value formula
# of the allocator docstring, term by term; split, its numpy temporaries would cross function
# boundaries.
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
    whole_growth_only: bool = False,
    rates: np.ndarray | None = None,
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
    ``whole_growth_only``: only each job's count on all of its ``grow_n`` nodes is read (the
    plan check values the nodes really handed out); a job whose growth outranks its own nodes
    is then merged at that count alone, its counts between left NaN. ``rates``: each job's
    :func:`rates_upto` at some count at least every count here (made once per decision).
    """
    n_jobs = len(jobs)
    c = np.array([w.size for w in own_w], dtype=np.int64)
    lo = np.array([max(1, j.min_nodes) for j in jobs], dtype=np.int64)
    if grow_n is None:
        grow_n = np.full(n_jobs, grow_w.shape[1], dtype=np.int64)
    hi = np.minimum(np.array([j.max_nodes for j in jobs], dtype=np.int64), c + grow_n)
    big_k = int(max(1, hi.max(initial=0), c.max(initial=0), lo.max(initial=0)))
    if rates is None or rates.shape[1] <= big_k:
        rates = np.stack([rates_upto(j.throughput, big_k) for j in jobs])
    else:
        rates = rates[:, : big_k + 1]
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
    if big_c:  # row by row, as the rows' nodes concatenated
        filled = np.arange(width_c)[None, :] < c[:, None]
        ow[filled] = owm[filled] = np.concatenate(own_w)
        op[filled] = np.concatenate(own_p)
        og[filled] = np.concatenate(own_g)
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
    nodes = MergeNodes(c, span, ow, op, og, owm, g, gp, gg, a_pad, b_pad)
    if whole_growth_only:
        # one count per job: one group (its padding costs less than a call per group)
        if mixed.size:
            grow_val[mixed] = np.nan
            grow_val[mixed, np.maximum(span[mixed], 1) - 1] = merged_values_at_span(mixed, nodes)
    else:
        for key in np.unique(shape_key[mixed]).tolist():
            grp = mixed[shape_key[mixed] == key]
            grow_val[grp, : int(max(1, span[grp].max()))] = merged_values(grp, nodes)
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


@dataclass(frozen=True)
class NodeOffer:
    """The nodes each job is valued on: its own, then the pool it would grow onto.

    Per job, its own nodes by descending window (``own_*``: window, reclaim probability,
    reclaim-event key), and per growth step the node it would get (``grow_*``, one row per
    job); ``grow_n[j]`` is how many growth steps are valued for job ``j``.
    """

    own_idx: list[np.ndarray]
    own_w: list[np.ndarray]
    own_p: list[np.ndarray]
    own_g: list[np.ndarray]
    grow_w: np.ndarray
    grow_p: np.ndarray
    grow_g: np.ndarray
    grow_n: np.ndarray
    #: nodes in the free pool (growth beyond it needs nodes others release)
    n_free: int
    #: only each job's count on all its ``grow_n`` nodes is valued (``job_value_table``)
    whole_growth_only: bool = False

    @property
    def beyond_free(self) -> bool:
        return self.grow_w.shape[1] > self.n_free

    def select(self, picks: list[int]) -> NodeOffer:
        sel = np.array(picks, dtype=np.int64)
        return NodeOffer(
            [self.own_idx[j] for j in picks], [self.own_w[j] for j in picks],
            [self.own_p[j] for j in picks], [self.own_g[j] for j in picks],
            self.grow_w[sel], self.grow_p[sel], self.grow_g[sel], self.grow_n[sel], self.n_free,
            self.whole_growth_only)


def _own_nodes(inp: AllocationInput, w: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Each job's node indices by descending window, and the free pool likewise (all jobs
    in one sort: a sort per job was most of this at 500 jobs)."""
    index = inp.node_index
    per_job = [[index[n] for n in job.nodes if n in index] for job in inp.jobs]
    sizes = [len(x) for x in per_job]
    node = np.fromiter((i for x in per_job for i in x), dtype=np.int64, count=sum(sizes))
    job = np.repeat(np.arange(len(per_job)), sizes)
    order = np.lexsort((np.arange(node.size), -w[node], job))  # stable within a job
    own_idx = np.split(node[order], np.cumsum(sizes)[:-1]) if per_job else []
    held = np.zeros(len(inp.nodes), dtype=bool)
    held[node] = True
    free = np.flatnonzero(~held)
    return own_idx, free[np.argsort(-w[free], kind="stable")]


def node_offer(inp: AllocationInput, w: np.ndarray, p: np.ndarray, key: np.ndarray
               ) -> NodeOffer:
    own_idx, free = _own_nodes(inp, w)
    need = max((j.max_nodes - i.size for j, i in zip(inp.jobs, own_idx, strict=True)), default=0)
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
        # Beyond the free pool a job can only grow onto nodes that others release, and
        # they release their shortest windows first. Valued pessimistically: all at the
        # shortest window (and highest reclaim chance) among those nodes, independent
        # events, ranked below the pool. Valuing them at the others' best windows made two
        # similar jobs trade nodes back and forth, each believing it would get the long ones.
        held_idx = np.flatnonzero(~np.isin(np.arange(len(inp.nodes)), free))
        held_idx = held_idx[np.argsort(w[held_idx], kind="stable")]
        cap = float(w[free[-1]]) if free.size else math.inf
        need_others = m_max - free.size
        # plain lists: per job this is a scan of a few nodes, where numpy's per-call cost
        # was most of the time at 500 jobs (benchmarks/load.py)
        held_list = held_idx.tolist()
        held_w = w[held_idx].tolist()
        held_p = p[held_idx].tolist()
        for j, idx in enumerate(own_idx):
            # the others' nodes by ascending window: the first `need_others` not the job's
            mine = set(idx.tolist())
            got, low_w, high_p = 0, math.inf, -math.inf
            for node, node_w, node_p in zip(held_list, held_w, held_p, strict=True):
                if node in mine:
                    continue
                low_w, high_p = min(low_w, node_w), max(high_p, node_p)
                got += 1
                if got == need_others:
                    break
            if not got:
                continue
            sl = slice(free.size, free.size + got)
            grow_w[j, sl] = min(low_w, cap)
            grow_p[j, sl] = high_p
            grow_g[j, sl] = np.nan
            grow_n[j] = free.size + got
    return NodeOffer(own_idx, [w[i] for i in own_idx], [p[i] for i in own_idx],
                     [key[i] for i in own_idx], grow_w, grow_p, grow_g, grow_n, int(free.size))


def offer_value_table(jobs: Sequence[MalleableJob], offer: NodeOffer,
                      start_s: np.ndarray | None, margins: np.ndarray,
                      rates: np.ndarray | None = None) -> np.ndarray:
    return job_value_table(jobs, offer.own_w, offer.own_p, offer.own_g, offer.grow_w,
                           offer.grow_p, offer.grow_g, offer.grow_n, start_s=start_s,
                           rates=rates,
                           keep_margin=margins, whole_growth_only=offer.whole_growth_only)


def no_exploration_beyond_free(values: np.ndarray, jobs: Sequence[MalleableJob],
                               offer: NodeOffer, start: np.ndarray | None,
                               margins: np.ndarray) -> None:
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
        c = int(offer.own_w[j].size)
        hi = min(job.max_nodes, c + int(offer.grow_n[j]))
        beyond = c + offer.n_free  # counts above this need nodes others release
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
    cons = offer_value_table(cons_jobs, offer.select(picks),
                             None if start is None else start[sel], margins[sel])
    for i, (j, n0) in enumerate(zip(picks, first_n, strict=True)):
        top = min(values.shape[1], cons.shape[1])
        if n0 < top:
            values[j, n0:top] = cons[i, n0:top]

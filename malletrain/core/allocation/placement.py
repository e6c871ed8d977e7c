"""Which concrete nodes each job gets, once the counts are decided.

Every policy decides *how many* nodes each job holds; this second step, shared
by all of them so that policy comparisons measure the count decision and not
placement accidents, turns counts into node names:

* a job keeps the nodes it already holds (moving a node costs a rescale);
* a shrinking job releases the nodes about to be reclaimed first (shortest
  predicted window), so the nodes it keeps are the ones that will last;
* growth takes the longest predicted windows, so a grown job is not shrunk
  again a few seconds later; among windows of similar length, nodes on the
  switch where the job already has most nodes come first (a job's nodes stay
  close in the network where the topology is known).

``window_s`` of ``None`` (nothing planned) ranks as the longest window. The
caller may pass its own effective windows (e.g. malletrain's hole estimates).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

import numpy as np

from malletrain.core.model import AllocationInput

log = logging.getLogger(__name__)

#: Windows within this relative distance rank the same, so that the switch decides.
_WINDOW_BUCKET_RATIO = 1.25


def _buckets(w: np.ndarray) -> np.ndarray:
    """Coarse window rank per node: log-spaced buckets so similar windows tie."""
    w = np.maximum(w, 0.0)
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(w), np.inf,
                        np.floor(np.log1p(w) / math.log(_WINDOW_BUCKET_RATIO)))


def _window_array(inp: AllocationInput, windows_s: Mapping[str, float] | None) -> np.ndarray:
    """Each node's window in ``inp.nodes`` order: the caller's (they may name only some
    nodes), the plan's for the others (``None``: infinite; without the caller's, below 0
    counts as 0)."""
    plan = np.array([math.inf if n.window_s is None else n.window_s for n in inp.nodes],
                    dtype=float)
    if windows_s is None:
        return np.maximum(plan, 0.0)
    return np.array([windows_s.get(n.name, w) for n, w in zip(inp.nodes, plan.tolist(),
                                                               strict=True)], dtype=float)


def assign_nodes(
    inp: AllocationInput,
    counts: Mapping[str, int],
    *,
    windows_s: Mapping[str, float] | None = None,
    growth_order: Sequence[str] | None = None,
) -> dict[str, tuple[str, ...]]:
    """Turn per-job node counts into node names (:func:`assign_positions`, named)."""
    return node_names(inp, assign_positions(inp, counts, windows_s=windows_s,
                                            growth_order=growth_order))


def node_names(inp: AllocationInput, positions: Mapping[str, Sequence[int]]
               ) -> dict[str, tuple[str, ...]]:
    """Each job's node positions in ``inp.nodes`` as node names."""
    names = inp.node_names
    return {job_id: tuple([names[i] for i in idx]) for job_id, idx in positions.items()}


def assign_positions(
    inp: AllocationInput,
    counts: Mapping[str, int],
    *,
    windows_s: Mapping[str, float] | None = None,
    growth_order: Sequence[str] | None = None,
    window_array: np.ndarray | None = None,
) -> dict[str, list[int]]:
    """Turn per-job node counts into nodes: each job's node positions in ``inp.nodes``.

    ``counts`` must be feasible (sum <= number of nodes). ``growth_order`` is the
    order in which growing jobs pick from the free pool (first = longest
    windows); by default submit order. ``window_array``: the windows already in
    ``inp.nodes`` order (else from ``windows_s``). O(nodes log nodes + jobs x switches).
    """
    w = _window_array(inp, windows_s) if window_array is None else window_array
    names, index, switch = inp.node_names, inp.node_index, inp.node_switch_id
    bucket_arr = _buckets(w)
    total = sum(max(0, c) for c in counts.values())
    if total > len(names):
        raise ValueError(f"plan asks for {total} nodes but only {len(names)} are available")

    held: dict[str, list[int]] = {}
    taken = np.zeros(len(names), dtype=bool)
    jobs_by_id = {j.job_id: j for j in inp.jobs}
    buckets, windows, rank = bucket_arr.tolist(), w.tolist(), inp.node_name_rank.tolist()
    # 1. every job keeps (up to its count) its current nodes, longest windows first
    for job in inp.jobs:
        want = max(0, counts.get(job.job_id, 0))
        own = [index[n] for n in job.nodes if n in index and n not in job.excluded_nodes]
        own = [i for i in own if not taken[i]]
        if not own or want == 0:
            held[job.job_id] = []
            continue
        if want < len(own):  # shrinking: release the shortest windows first
            home = _home_switch(own, switch)
            own.sort(key=lambda i: (-buckets[i], switch[i] != home, -windows[i], rank[i]))
        keep = own[:want]
        held[job.job_id] = keep
        taken[keep] = True
    # 2. growth from the pool: longest windows first, same switch as the job's nodes
    order = np.lexsort((inp.node_name_rank, -w, -bucket_arr))
    free = order[~taken[order]]
    pool = _Pool(free.tolist(), bucket_arr[free].tolist(), switch, taken.tolist())
    for job_id in _growth_order(inp, growth_order):
        if job_id not in jobs_by_id:
            continue
        have = held.get(job_id, [])
        need = max(0, counts.get(job_id, 0)) - len(have)
        if need <= 0:
            continue
        home = _home_switch(have, switch) if have else pool.next_switch()
        avoid = {index[n] for n in jobs_by_id[job_id].excluded_nodes if n in index}
        got = pool.take_avoiding(need, home, avoid) if avoid else pool.take(need, home)
        held[job_id] = have + got
    return held


def _growth_order(inp: AllocationInput, growth_order: Sequence[str] | None) -> list[str]:
    """The growing jobs' order of picking: ``growth_order`` then the rest, or submit order."""
    if growth_order is None:
        return [j.job_id for j in sorted(inp.jobs, key=lambda j: (j.submit_order, j.job_id))]
    order = list(growth_order)
    seen = set(order)
    return order + [j.job_id for j in inp.jobs if j.job_id not in seen]


class _Pool:
    """Free nodes (positions) in window-bucket order, each bucket split by switch (-1: none);
    taken front first.

    Every node sits in one bucket list and one (bucket, switch) list; pointers
    only move forward, so handing out the whole pool costs O(nodes) after the sort.
    """

    def __init__(self, free: list[int], bucket: list[float], switch: list[int],
                 taken: list[bool]) -> None:
        """``free``: the free nodes in pool order, ``bucket`` their window buckets;
        ``taken``: per node position, whether it is handed out already."""
        self.switch = switch
        self.buckets: list[list[int]] = []
        self.by_switch: list[dict[int, list[int]]] = []
        last: float | None = None
        for n, b in zip(free, bucket, strict=True):
            if last is None or b != last:
                self.buckets.append([])
                self.by_switch.append({})
                last = b
            self.buckets[-1].append(n)
            self.by_switch[-1].setdefault(switch[n], []).append(n)
        self.pos = [0] * len(self.buckets)
        self.sw_pos: list[dict[int, int]] = [dict.fromkeys(d, 0) for d in self.by_switch]
        self.first = 0
        self.taken = taken

    def next_switch(self) -> int:
        """For a job starting from nothing: the switch of the longest free window."""
        for b in range(self.first, len(self.buckets)):
            lst = self.buckets[b]
            for i in range(self.pos[b], len(lst)):
                if not self.taken[lst[i]]:
                    return self.switch[lst[i]]
        return -1

    def take(self, need: int, home: int) -> list[int]:
        out: list[int] = []
        taken = self.taken
        b = self.first
        while need > 0 and b < len(self.buckets):
            if home >= 0 and home in self.by_switch[b]:
                lst = self.by_switch[b][home]
                i = self.sw_pos[b][home]
                while need > 0 and i < len(lst):
                    n = lst[i]
                    i += 1
                    if not taken[n]:
                        taken[n] = True
                        out.append(n)
                        need -= 1
                self.sw_pos[b][home] = i
            lst = self.buckets[b]
            i = self.pos[b]
            while need > 0 and i < len(lst):
                n = lst[i]
                if not taken[n]:
                    taken[n] = True
                    out.append(n)
                    need -= 1
                i += 1
            # skip the taken prefix so later scans start past it
            while i < len(lst) and taken[lst[i]]:
                i += 1
            self.pos[b] = i
            if i >= len(lst) and b == self.first:
                self.first += 1
            b += 1
        return out

    def take_avoiding(self, need: int, home: int, avoid: set[int]) -> list[int]:
        """``take`` for a job that must not get the nodes in ``avoid`` (``--exclude``): a
        plain scan in the same order, leaving the pointers to ``take`` (exclusions are
        rare). It may return fewer than ``need``; those nodes stay free this decision."""
        out: list[int] = []
        for b in range(self.first, len(self.buckets)):
            home_first = self.by_switch[b].get(home, []) if home >= 0 else []
            for n in (*home_first, *self.buckets[b]):
                if need == 0:
                    return out
                if not self.taken[n] and n not in avoid:
                    self.taken[n] = True
                    out.append(n)
                    need -= 1
        return out


def _home_switch(nodes: Sequence[int], switch: Sequence[int]) -> int:
    """The switch holding most of ``nodes`` (the first seen of equals; -1 if no topology
    is known)."""
    seen: dict[int, int] = {}
    for n in nodes:
        s = switch[n]
        if s >= 0:
            seen[s] = seen.get(s, 0) + 1
    return max(seen, key=seen.__getitem__) if seen else -1

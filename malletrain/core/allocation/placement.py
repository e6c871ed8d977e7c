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
    names, index, switch = inp.node_names, inp.node_index, inp.node_switch_id.tolist()
    bucket_arr = _buckets(w)
    total = sum(max(0, c) for c in counts.values())
    if total > len(names):
        raise ValueError(f"plan asks for {total} nodes but only {len(names)} are available")

    held: dict[str, list[int]] = {}
    taken = bytearray(len(names))  # per node position: handed out already
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
        for i in keep:
            taken[i] = True
    # 2. growth from the pool: longest windows first, same switch as the job's nodes
    order = np.lexsort((inp.node_name_rank, -w, -bucket_arr))
    free = order[np.frombuffer(taken, dtype=np.uint8)[order] == 0]
    pool = _Pool(free, bucket_arr[free], inp.node_switch_id, taken)
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
    """Free nodes (positions) in window-bucket order, taken front first; within a bucket,
    the nodes of the job's switch first (-1: no topology).

    The pool is one list in order, a bucket a slice of it; the nodes of one switch in one
    bucket are a chain (``next_same``: each one's next in the list, built in one sort).
    Pointers only move forward, so handing out the whole pool costs O(nodes) after the sort.
    """

    def __init__(self, free: np.ndarray, bucket: np.ndarray, switch: np.ndarray,
                 taken: bytearray) -> None:
        """``free``: the free nodes in pool order, ``bucket`` their window buckets;
        ``switch``: each node's switch by position; ``taken``: per node position, whether
        it is handed out already."""
        self.nodes: list[int] = free.tolist()
        cuts = np.flatnonzero(bucket[1:] != bucket[:-1]) + 1
        self.ends: list[int] = [*cuts.tolist(), len(self.nodes)]
        self.pos: list[int] = [0, *cuts.tolist()]  # each bucket's first node not yet passed
        seg = np.zeros(len(self.nodes), dtype=np.int64)
        seg[cuts] = 1
        seg = np.cumsum(seg)
        sw = switch[free]
        self.n_switch = int(sw.max(initial=-1)) + 2
        chain = np.lexsort((np.arange(len(self.nodes)), sw, seg))
        key = (seg * self.n_switch + sw + 1)[chain]
        same = key[1:] == key[:-1]
        next_same = np.full(len(self.nodes), -1, dtype=np.int64)
        next_same[chain[:-1][same]] = chain[1:][same]
        self.next_same: list[int] = next_same.tolist()
        first = np.concatenate(([True], ~same)) if len(chain) else np.zeros(0, dtype=bool)
        #: (bucket, switch) -> the index in ``nodes`` its chain goes on from
        self.head: dict[int, int] = dict(zip(key[first].tolist(), chain[first].tolist(),
                                             strict=True))
        self.switch = switch
        self.first = 0
        self.taken = taken

    def next_switch(self) -> int:
        """For a job starting from nothing: the switch of the longest free window."""
        for b in range(self.first, len(self.ends)):
            for i in range(self.pos[b], self.ends[b]):
                if not self.taken[self.nodes[i]]:
                    return int(self.switch[self.nodes[i]])
        return -1

    def take(self, need: int, home: int) -> list[int]:
        out: list[int] = []
        taken, nodes = self.taken, self.nodes
        b = self.first
        while need > 0 and b < len(self.ends):
            key = b * self.n_switch + home + 1
            if home >= 0 and key in self.head:
                k = self.head[key]
                while need > 0 and k >= 0:
                    n = nodes[k]
                    k = self.next_same[k]
                    if not taken[n]:
                        taken[n] = True
                        out.append(n)
                        need -= 1
                self.head[key] = k
            i, end = self.pos[b], self.ends[b]
            while need > 0 and i < end:
                n = nodes[i]
                if not taken[n]:
                    taken[n] = True
                    out.append(n)
                    need -= 1
                i += 1
            # skip the taken prefix so later scans start past it
            while i < end and taken[nodes[i]]:
                i += 1
            self.pos[b] = i
            if i >= end and b == self.first:
                self.first += 1
            b += 1
        return out

    def take_avoiding(self, need: int, home: int, avoid: set[int]) -> list[int]:
        """``take`` for a job that must not get the nodes in ``avoid`` (``--exclude``): a
        plain scan in the same order, leaving the pointers to ``take`` (exclusions are
        rare). It may return fewer than ``need``; those nodes stay free this decision."""
        out: list[int] = []
        for b in range(self.first, len(self.ends)):
            home_first: list[int] = []
            k = self.head.get(b * self.n_switch + home + 1, -1) if home >= 0 else -1
            while k >= 0:
                home_first.append(self.nodes[k])
                k = self.next_same[k]
            for n in (*home_first, *self.nodes[self.pos[b]:self.ends[b]]):
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

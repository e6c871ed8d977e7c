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
from collections import Counter
from collections.abc import Mapping, Sequence

from malletrain.core.model import AllocationInput, IdleNode

log = logging.getLogger(__name__)

#: Windows within this relative distance rank the same, so that the switch decides.
_WINDOW_BUCKET_RATIO = 1.25


def node_windows(nodes: Sequence[IdleNode]) -> dict[str, float]:
    """Predicted windows with ``None`` mapped to infinity."""
    return {n.name: math.inf if n.window_s is None else max(0.0, n.window_s) for n in nodes}


def _bucket(window_s: float) -> float:
    """Coarse window rank: log-spaced buckets so similar windows tie."""
    if math.isinf(window_s):
        return math.inf
    return math.floor(math.log(1.0 + window_s) / math.log(_WINDOW_BUCKET_RATIO))


def assign_nodes(
    inp: AllocationInput,
    counts: Mapping[str, int],
    *,
    windows_s: Mapping[str, float] | None = None,
    growth_order: Sequence[str] | None = None,
) -> dict[str, tuple[str, ...]]:
    """Turn per-job node counts into node names.

    ``counts`` must be feasible (sum <= number of nodes). ``growth_order`` is the
    order in which growing jobs pick from the free pool (first = longest
    windows); by default submit order.
    """
    win = dict(windows_s) if windows_s is not None else node_windows(inp.nodes)
    for n in inp.nodes:
        win.setdefault(n.name, math.inf if n.window_s is None else n.window_s)
    switch = {n.name: n.switch for n in inp.nodes}
    known = set(switch)
    total = sum(max(0, c) for c in counts.values())
    if total > len(known):
        raise ValueError(f"plan asks for {total} nodes but only {len(known)} are available")

    result: dict[str, tuple[str, ...]] = {}
    pool: set[str] = set(known)
    jobs_by_id = {j.job_id: j for j in inp.jobs}
    # 1. every job keeps (up to its count) its current nodes, longest windows first
    for job in inp.jobs:
        want = max(0, counts.get(job.job_id, 0))
        own = [n for n in job.nodes if n in pool]
        if not own or want == 0:
            result[job.job_id] = ()
            continue
        home = _home_switch(own, switch)
        own.sort(key=lambda n: (-_bucket(win[n]), switch[n] != home, -win[n], n))
        keep = own[:want]
        result[job.job_id] = tuple(keep)
        pool.difference_update(keep)
    # 2. growth from the pool: longest windows first, same switch as the job's nodes
    order = (
        list(growth_order)
        if growth_order is not None
        else [j.job_id for j in sorted(inp.jobs, key=lambda j: (j.submit_order, j.job_id))]
    )
    order += [j for j in jobs_by_id if j not in set(order)]
    for job_id in order:
        if job_id not in jobs_by_id:
            continue
        have = list(result.get(job_id, ()))
        need = max(0, counts.get(job_id, 0)) - len(have)
        if need <= 0:
            continue
        home = _home_switch(have, switch)
        if home is None:
            home = _best_pool_switch(pool, switch, win, need)
        ranked = sorted(pool, key=lambda n: (-_bucket(win[n]), switch[n] != home, -win[n], n))
        take = ranked[:need]
        pool.difference_update(take)
        result[job_id] = tuple(have + take)
    return result


def _home_switch(nodes: Sequence[str], switch: Mapping[str, str | None]) -> str | None:
    seen = Counter(switch[n] for n in nodes if switch.get(n) is not None)
    return seen.most_common(1)[0][0] if seen else None


def _best_pool_switch(
    pool: set[str], switch: Mapping[str, str | None], win: Mapping[str, float], need: int
) -> str | None:
    """For a job starting from nothing: the switch with the most long-window free nodes."""
    by_switch: Counter[str] = Counter()
    for n in pool:
        s = switch.get(n)
        if s is not None:
            by_switch[s] += 1
    if not by_switch:
        return None
    big_enough = [s for s, c in by_switch.items() if c >= need]
    candidates = big_enough or list(by_switch)
    return max(candidates, key=lambda s: (min(by_switch[s], need), s))

"""The baselines malletrain is measured against, behind the same Policy interface.

* :class:`EqualShare`: the nodes split equally over the admitted jobs, clipped
  to each job's [min, max], leftovers first come first served. Needs no curves.
  FreeTrain uses it as the fallback when its MILP fails.
* :class:`FreeTrain`: the per-event MILP of FreeTrain/BFTrainer (DESIGN §2),
  solved with SciPy's HiGHS (imported lazily: core stays importable without scipy).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from malletrain.core.model import AllocationInput, MalleableJob, Plan
from malletrain.core.placement import assign_nodes

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


@dataclass
class EqualShare:
    """Equal split, keeping jobs on their current nodes where the count allows."""

    name: str = "equal-share"

    def decide(self, inp: AllocationInput) -> Plan:
        t0 = time.perf_counter()
        counts = equal_share_counts(len(inp.nodes), inp.jobs)
        assignments = assign_nodes(inp, counts)
        return Plan(assignments=assignments, objective=0.0, decision_s=time.perf_counter() - t0)

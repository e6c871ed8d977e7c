"""The price of spreading a job across switches, in the count problem.

Why: a data-parallel job whose nodes sit on two switches synchronises its gradients over
the link between them; ``benchmarks/placement.py`` measured its steps 6.4-6.8x slower
across a 200 Mbit/s link. Placement (``core.placement``) keeps a job's nodes on one switch
where it can, but only the count decision can say whether growing beyond what one switch
offers is worth it. So each job's curve is lowered beyond the largest switch's node count
by the factor its own step times measured (``ProfilingAdvisor.spread_factor``): the
allocator grows a job across a switch only where that still pays, and prefers to give the
nodes to a job they help more. Without a topology (one switch, or none known) nothing
changes; a job with no spread measurement keeps factor 1 until it has one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from malletrain.core.model import AllocationInput, MalleableJob


def switch_capacity(inp: AllocationInput) -> int | None:
    """The most offered nodes on one switch; None with fewer than two switches known."""
    per_switch = Counter(n.switch for n in inp.nodes if n.switch)
    if len(per_switch) < 2:
        return None
    return max(per_switch.values())


def with_spread_penalty(inp: AllocationInput) -> AllocationInput:
    """``inp`` with each job's curves lowered beyond one switch's worth of nodes."""
    cap = switch_capacity(inp)
    if cap is None or all(j.spread_factor >= 1.0 for j in inp.jobs):
        return inp
    return replace(inp, jobs=tuple(_penalised(j, cap) for j in inp.jobs))


def _penalised(job: MalleableJob, cap: int) -> MalleableJob:
    f = job.spread_factor
    if f >= 1.0 or job.max_nodes <= cap:
        return job
    return replace(job, throughput=job.throughput.spread_beyond(cap, f),
                   type_throughput={t: m.spread_beyond(cap, f)
                                    for t, m in job.type_throughput.items()})

"""Where a replay's distance to the proven bound goes: admissions, allocation, rescales.

A policy's one-worker-seconds ``W`` over a slice's bound ``B`` splits into three factors,
each measured on the replay itself (``job_nodes.csv``'s node counts, every job's true
curve in one-worker units):

* ``ceiling / B``: ``ceiling`` is the integral over time of the best split of the idle
  nodes among the jobs the policy had admitted at that moment (the bound's exact DP,
  ``bound_lp.best_allocations``; true curves, no rescale cost, no cap at a job's remaining
  work). The bound lets *any* job that finishes could have admitted run, next to any
  other such job; the policy has the jobs its own finishes admitted. Low where many jobs
  finish, or where the policy's finishes left slots to jobs that scale badly.
* ``rate / ceiling``: ``rate`` is the integral of the true rates of the node counts the
  policy really gave its admitted jobs: how well it split the nodes (learned curves,
  windows, margins).
* ``W / rate``: what rescaling cost (scale-up and scale-down pauses).

``W / B`` is their product. The ceiling is not a bound (it is not capped at a job's
remaining work); it is the best any split could have made of that policy's admissions.

Usage: ``.venv/bin/python benchmarks/bound_gap.py [--slice NAME ...] [--policy P ...]``
(default: the slices below 0.93 of the bound, malletrain and equal share); one line each:
``gap slice=S policy=P of_bound=R ceiling_of_bound=C split_of_ceiling=A work_of_rate=L``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import evaluate  # the slices and job sets of the evaluation

from malletrain.core.policies import POLICIES, REPLAY, make_policy
from malletrain.sim.bounds.bound_inputs import idle_segments, in_worker_seconds, job_rates
from malletrain.sim.bounds.bound_lp import best_allocations
from malletrain.sim.curves import provider_for
from malletrain.sim.engine import Simulator
from malletrain.sim.jobs import SimJob
from malletrain.sim.result import Result
from malletrain.sim.trace import IdleTrace

DEFAULT_SLICES = ("theta22-d150-sia", "theta23-d20-gavel", "theta23-d100-sia",
                  "centre-theta-philly-mixed")


def integrals(res: Result, trace: IdleTrace, jobs: list[SimJob], until_s: float
              ) -> tuple[float, float]:
    """(rate, ceiling) of a replay of ``jobs`` on ``trace``, in one-worker-seconds (see the
    module docstring)."""
    rates = {j.name: job_rates(j) for j in in_worker_seconds(jobs)}
    segs = idle_segments(trace, until_s)
    changes = sorted(res.job_nodes, key=lambda c: c.time_s)
    cuts = sorted({s.start_s for s in segs} | {c.time_s for c in changes} | {until_s})
    counts: dict[str, int] = {}
    rate = ceiling = 0.0
    seg_i = change_i = 0
    for t0, t1 in itertools.pairwise(cuts):
        while change_i < len(changes) and changes[change_i].time_s <= t0:
            counts[changes[change_i].job] = changes[change_i].nodes
            change_i += 1
        while seg_i + 1 < len(segs) and segs[seg_i + 1].start_s <= t0:
            seg_i += 1
        admitted = [r.job.name for r in res.jobs if r.admitted_s is not None
                    and r.admitted_s <= t0 and (r.finished_s is None or r.finished_s > t0)]
        rate += (t1 - t0) * sum(rates[n][counts.get(n, 0)] for n in admitted)
        if admitted:  # the bound's own DP, at this moment's idle count
            cap = segs[seg_i].idle
            best = best_allocations([rates[n] for n in admitted], [1.0] * len(admitted),
                                    len(admitted), cap)
            ceiling += (t1 - t0) * float(best.value[cap])
    return rate, ceiling


def gap_line(name: str, policy: str, bound: float) -> str:
    sl = evaluate.BY_NAME[name]
    trace = sl.trace()
    until = trace.start_s + evaluate.SPAN_DAYS * evaluate.DAY
    jobs = evaluate._jobs(sl.jobs)
    res = Simulator(trace, jobs, make_policy(policy, REPLAY),
                    provider_for(POLICIES[policy].curves), until_s=until).run()
    work = float(res.summary()["one_worker_seconds_total"])  # type: ignore[arg-type]
    rate, ceiling = integrals(res, trace, jobs, until)
    return (f"gap slice={name} policy={policy} of_bound={work / bound:.3f} "
            f"ceiling_of_bound={ceiling / bound:.3f} split_of_ceiling={rate / ceiling:.3f} "
            f"work_of_rate={work / rate:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slice", action="append", choices=list(evaluate.BY_NAME))
    ap.add_argument("--policy", action="append")
    ap.add_argument("--bound-time-s", type=float, default=60.0)
    args = ap.parse_args()
    for name in args.slice or DEFAULT_SLICES:
        bound, _ = evaluate.bound(name, args.bound_time_s)
        for policy in args.policy or ("malletrain", "equal-share"):
            print(gap_line(name, policy, bound), flush=True)


if __name__ == "__main__":
    main()

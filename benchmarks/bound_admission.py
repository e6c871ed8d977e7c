"""How much of a slice's proven bound rests on jobs that only a finish admits.

The LP bound (``malletrain.sim.bounds.bound``) lets a job run once finishes *could* have admitted
it (``Bound.earliest_s``), next to any other such job, whether or not those finishes
happen. Beside it this prints the same LP over the first ``K`` jobs alone: what the bound
would be if no job ever finished. That second figure is **not a bound** (a policy that
finishes jobs may pass it); it says how much of the bound's value comes from admissions,
and so how far a slice where every policy finishes few jobs can be from the bound for
reasons that are the bound's, not the policy's (docs/evaluation.md, "Where the bound
shows room").

Usage: ``.venv/bin/python benchmarks/bound_admission.py [--slice NAME ...]`` (default: the
slices below 0.93 of the bound in docs/evaluation.md); one line per slice:
``admission slice=S bound=B first_k=F first_k_share=R admissible=A earliest_h=[...]``
(the earliest start of jobs K+1 to 2K, in hours from the slice's start).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import evaluate  # the slices and job sets of the evaluation

from malletrain.sim.bounds.bound import upper_bound
from malletrain.sim.bounds.bound_inputs import idle_segments, in_worker_seconds

K = 10
DEFAULT = ("theta22-d150-sia", "theta23-d20-gavel", "theta23-d100-sia", "centre-theta-philly-mixed")


def admission_line(name: str, time_s: float) -> str:
    sl = evaluate.BY_NAME[name]
    trace = sl.trace()
    segs = idle_segments(trace, trace.start_s + evaluate.SPAN_DAYS * evaluate.DAY)
    jobs = in_worker_seconds(evaluate._jobs(sl.jobs))
    full = upper_bound(segs, jobs, K, submit_origin_s=trace.start_s, time_limit_s=time_s)
    first = upper_bound(segs, jobs[:K], K, submit_origin_s=trace.start_s, time_limit_s=time_s)
    # when the first jobs beyond K may start (hours into the slice), as finishes allow
    later = [round((e - trace.start_s) / 3600.0, 1)
             for e in full.earliest_s[K:min(full.jobs_admissible, 2 * K)]]
    return (f"admission slice={name} bound={full.samples:.4g} first_k={first.samples:.4g} "
            f"first_k_share={first.samples / full.samples:.3f} "
            f"admissible={full.jobs_admissible} earliest_h={later}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slice", action="append", choices=list(evaluate.BY_NAME))
    ap.add_argument("--bound-time-s", type=float, default=60.0)
    args = ap.parse_args()
    for name in args.slice or DEFAULT:
        print(admission_line(name, args.bound_time_s), flush=True)


if __name__ == "__main__":
    main()

"""The evaluation of docs/evaluation.md: policies on 12 slices of real traces, against the bound.

Each slice is a real trace cut (machine, time of year, load) and a job set of measured
profiles (``configs/sim/``; the ``centre`` slice uses the 1,000 jobs of
``benchmarks/simulate.py``). Every policy replays every slice through the same
``Simulator`` that ``malletrain simulate`` runs; the proven bound
(``malletrain.sim.bounds.bound``) is computed per slice in one-worker-seconds.

**The metric** is ``one_worker_seconds_total``: each job's samples divided by its
samples/s on one node, summed: node-seconds of useful work, comparable across models
(raw samples of different models are not). Its bound is the LP bound of the same jobs
counted in one-worker-seconds (``bound_inputs.in_worker_seconds``).

**Tuning split.** Every other slice (``TUNING``, marked T) is where the knobs of the
preset ``REPLAY`` (``core/options.py``) may be chosen (``--half tuning --set KNOB=V``);
the others (H, held out) only report. docs/evaluation.md says which knob was chosen where.

Usage: ``.venv/bin/python benchmarks/evaluate.py [--slice NAME ...] [--policy NAME ...]
[--workers 2] [--bound-time-s 60] [--bound-milp-s 0]``; prints a table and the last line
``evaluate slices=S min_vs_freetrain=A min_vs_equal=B geomean_vs_freetrain=C
geomean_of_bound=D min_of_bound=E`` (the metric above, malletrain's ratios).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from malletrain.core.options import PolicyOptions
from malletrain.core.policies import POLICIES, REPLAY, make_policy
from malletrain.sim.counts import read_cirrus_jobs, read_helios_minutes, read_philly_minutes
from malletrain.sim.curves import provider_for
from malletrain.sim.engine import Simulator
from malletrain.sim.jobs import SimJob, parse_jobs
from malletrain.sim.swf import swf_trace
from malletrain.sim.trace import IdleTrace, slice_from

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simulate import centre_trace, job_set

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "data" / "traces"
DAY = 86400.0
SPAN_DAYS = 3.0
JOBSETS = {
    "sia": ROOT / "configs/sim/sia-aws-48.yaml",
    "gavel": ROOT / "configs/sim/gavel-v100-48.yaml",
    "imagenet": ROOT / "configs/sim/sia-imagenet-48.yaml",
}


def _swf(name: str, nodes: int, day: float, procs_per_node: int = 1) -> Callable[[], IdleTrace]:
    return lambda: swf_trace(TRACES / name, nodes, day * DAY, (day + SPAN_DAYS) * DAY,
                             procs_per_node)


def _counts(reader: Callable[[Path], IdleTrace], name: str, day: float
            ) -> Callable[[], IdleTrace]:
    def build() -> IdleTrace:
        tr = slice_from(reader(TRACES / name), day * DAY)
        return IdleTrace(tr.source, tr.node_names, tr.start_s, (day + SPAN_DAYS) * DAY,
                         tr.events_list)
    return build


def _centre() -> IdleTrace:
    return centre_trace(SPAN_DAYS)


@dataclass(frozen=True)
class Slice:
    name: str
    trace: Callable[[], IdleTrace]
    jobs: str  # a JOBSETS key, or "centre"


SLICES = [
    Slice("theta22-d150-sia", _swf("alcf-theta-2022.swf", 4360, 150), "sia"),
    Slice("theta22-d30-gavel", _swf("alcf-theta-2022.swf", 4360, 30), "gavel"),
    Slice("theta22-d250-imagenet", _swf("alcf-theta-2022.swf", 4360, 250), "imagenet"),
    Slice("theta23-d20-gavel", _swf("alcf-theta-2023sep-2024jan.swf", 4392, 20), "gavel"),
    Slice("theta23-d100-sia", _swf("alcf-theta-2023sep-2024jan.swf", 4392, 100), "sia"),
    Slice("ricc-d30-imagenet", _swf("RICC-2010-2.swf.gz", 1024, 30, 8), "imagenet"),
    Slice("philly-d14-sia", _counts(read_philly_minutes, "philly-node-usage-per-minute.csv", 14),
          "sia"),
    Slice("philly-d40-gavel",
          _counts(read_philly_minutes, "philly-node-usage-per-minute.csv", 40), "gavel"),
    Slice("philly-d60-imagenet",
          _counts(read_philly_minutes, "philly-node-usage-per-minute.csv", 60), "imagenet"),
    Slice("helios-d17-sia",
          _counts(read_helios_minutes, "helios-earth-vc6YE-usage-per-minute.csv", 17), "sia"),
    Slice("cirrus-d25-gavel",
          _counts(read_cirrus_jobs, "epcc-cirrus-cpu-2024-09-jobs-rigid.csv", 25), "gavel"),
    Slice("centre-theta-philly-mixed", _centre, "centre"),
]
BY_NAME = {s.name: s for s in SLICES}
#: Every other slice: where the preset's knobs may be chosen; the rest only report.
TUNING = {s.name for s in SLICES[0::2]}
DEFAULT_POLICIES = ("malletrain", "freetrain", "equal-share")


def _jobs(key: str) -> list[SimJob]:
    if key == "centre":
        return job_set(1000)
    return parse_jobs(JOBSETS[key])


def replay(slice_name: str, policy: str, options: PolicyOptions = REPLAY) -> dict[str, float]:
    """One policy on one slice (in a worker process): the figures the table shows."""
    sl = BY_NAME[slice_name]
    trace = sl.trace()
    sim = Simulator(trace, _jobs(sl.jobs), make_policy(policy, options),
                    provider_for(POLICIES[policy].curves),
                    until_s=trace.start_s + SPAN_DAYS * DAY)
    t0 = time.perf_counter()
    res = sim.run()
    s = res.summary()
    return {"work": float(s["one_worker_seconds_total"]),  # type: ignore[arg-type]
            "samples": res.samples_total, "idle_used": float(s["idle_used_share"]),  # type: ignore[arg-type]
            "rescales": res.rescales, "finished": float(s["jobs_finished"]),  # type: ignore[arg-type]
            "events": res.events, "nodes": len(trace.node_names),
            "wall_s": time.perf_counter() - t0}


def bound(slice_name: str, time_s: float, milp_s: float = 0.0) -> tuple[float, str]:
    """The proven bound on one-worker-seconds for the slice, and what it rests on.

    ``milp_s`` > 0 also runs the integer-finish MILP (``sim.bound``, as ``cli_bound
    --milp-s``) for at most that long: tighter where many jobs finish, minutes a slice."""
    from malletrain.sim.bounds.bound import milp_block_s, upper_bound
    from malletrain.sim.bounds.bound_inputs import idle_segments, in_worker_seconds

    sl = BY_NAME[slice_name]
    trace = sl.trace()
    segs = idle_segments(trace, trace.start_s + SPAN_DAYS * DAY)
    b = upper_bound(segs, in_worker_seconds(_jobs(sl.jobs)), 10,
                    submit_origin_s=trace.start_s, time_limit_s=time_s, milp_s=milp_s,
                    block_s=milp_block_s(segs))
    what = f"gap {b.gap:.2%}"
    if b.samples_milp is not None and b.samples_milp < b.samples_lp:
        how = "optimal" if b.milp_optimal else f"HiGHS's bound at {milp_s:g} s"
        what = f"integer finishes, {how}; LP {b.samples_lp:.4g}"
    return b.samples, what


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slice", action="append", choices=list(BY_NAME), help="default: all 12")
    ap.add_argument("--policy", action="append", help=f"default: {', '.join(DEFAULT_POLICIES)}")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--bound-time-s", type=float, default=60.0)
    ap.add_argument("--bound-milp-s", type=float, default=0.0, metavar="S",
                    help="also bound with the integer-finish MILP, up to S s a slice")
    ap.add_argument("--half", choices=("tuning", "held-out"), help="only that half's slices")
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                    help="override a PolicyOptions knob of REPLAY (e.g. keep_margin=0.05)")
    args = ap.parse_args()
    slices = args.slice or [s for s in BY_NAME if args.half is None
                            or (s in TUNING) == (args.half == "tuning")]
    options = REPLAY.with_(**{k: float(v) for k, v in (kv.split("=", 1) for kv in args.set)})
    policies = args.policy or list(DEFAULT_POLICIES)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        runs = {(s, p): pool.submit(replay, s, p, options) for s in slices for p in policies}
        bounds = {s: pool.submit(bound, s, args.bound_time_s, args.bound_milp_s)
                  for s in slices}
        res = {k: f.result() for k, f in runs.items()}
        bnd = {s: f.result() for s, f in bounds.items()}
    print("| slice | nodes | events | policy | one-worker-s | ÷ freetrain | ÷ equal-share | "
          "of bound | idle used | rescales | finished | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {"ft": [], "eq": [], "bound": [], "T": [], "H": []}
    for s in slices:
        b, what = bnd[s]
        for p in policies:
            r = res[(s, p)]
            ft = r["work"] / res[(s, "freetrain")]["work"] if (s, "freetrain") in res else math.nan
            eq = (r["work"] / res[(s, "equal-share")]["work"]
                  if (s, "equal-share") in res else math.nan)
            of = r["work"] / b if b > 0 else math.nan
            if p == "malletrain":
                ratios["ft"].append(ft)
                ratios["eq"].append(eq)
                ratios["bound"].append(of)
                ratios["T" if s in TUNING else "H"].append(of)
            half = "T" if s in TUNING else "H"
            print(f"| {s} ({half}) | {r['nodes']:.0f} | {r['events']:.0f} | {p} | "
                  f"{r['work']:.4g} | {ft:.3f} | {eq:.3f} | {of:.3f} | {r['idle_used']:.3f} | "
                  f"{r['rescales']:.0f} | {r['finished']:.0f} | {r['wall_s']:.1f} |")
        print(f"| {s} | | | proven bound ({what}) | {b:.4g} | | | 1 | | | | |")
    print(f"\n({time.perf_counter() - t0:.0f} s in all, {args.workers} workers)")
    print(f"malletrain of bound, geomean: tuning half {_geomean(ratios['T']):.3f}, "
          f"held-out half {_geomean(ratios['H']):.3f}")
    print(f"evaluate slices={len(slices)} "
          f"min_vs_freetrain={min(ratios['ft'], default=math.nan):.3f} "
          f"min_vs_equal={min(ratios['eq'], default=math.nan):.3f} "
          f"geomean_vs_freetrain={_geomean(ratios['ft']):.3f} "
          f"geomean_of_bound={_geomean(ratios['bound']):.3f} "
          f"min_of_bound={min(ratios['bound'], default=math.nan):.3f}")


if __name__ == "__main__":
    main()

"""Node types and cost on a mixed cluster, in simulation on real data (issue 19, part 1).

The cluster: the idle nodes of a real log (default: Microsoft Philly's per-minute node log,
420 nodes, days 14-17, as in docs/evaluation.md), each node given a GPU model in the
shares of P100 and V100 GPUs in Alibaba's 2023 production GPU cluster
(``data/traces/alibaba-gpu-v2023-openb_node_list_gpu_node.csv``: 265 P100, 399 V100), placed
at random (``--seed``). The jobs: Gavel's 16 (model, batch) curves measured on both P100
and V100 (``data/profiles/gavel/simulation_throughputs.json``, unconsolidated), 48 jobs of
24 h of work at their V100 peak, 10 admitted at a time, FreeTrain's rescale costs. A job on
both models at once runs at the slower one's rate for its size (a synchronous step waits
for its slowest worker).

Replays, all with the ``malletrain`` policy learning its curves from progress alone:

1. **type-oblivious**: the policy is not told the node types (one profile per job);
2. **type-aware**: told the types, profiles per job and type, one type per job;
3. **exact curves** (a ceiling): type-aware, told each job's true curves per type
   (``malletrain-known-curves``);
4. **cost objective**: type-aware, with prices per node-second (``--price-p100``,
   ``--price-v100``: an assumed 1:2 ratio) and a throughput target per job: ``--target``
   (0.5) x its best rate (its largest size on its faster type). HeterPS's formulation:
   the target at the lowest price; throughput beyond it is worth nothing.

Throughput is one-worker-seconds (each job's samples over its one-node rate on its fastest
type: node-seconds of useful work, comparable across models). ``cost`` = sum of price x
node-seconds used. Against the targets, a job's work counts up to its target times the time
it was admitted (``on-target`` below, for replays 2 and 3 alike). ``predict_err_unseen`` is
the communication-aware profile's median error at node counts never run
(``benchmarks/comm_predict.py``, fitted at 1-4 nodes).

The proven bound (``malletrain.sim.bounds.bound``, each job at its fastest type at every size:
``bound_inputs.type_envelope``) bounds every policy here, typed or not, so the bound over
replay 1 is the most that any type-aware plan can gain over the type-oblivious one on this
trace and job set.

Last line: ``hetero throughput_ratio=X cost_ratio=Y predict_err_unseen=Z`` (X = replay 2 over
replay 1; Y = replay 4's cost per one-worker-second on target over replay 2's), after a line
with each replay's figures and one comparing replays 4 and 2 on the targets: the share of
the targets each met (work up to target x admitted time, over target x admitted time).

Run: ``.venv/bin/python benchmarks/hetero.py`` (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from comm_predict import cases  # noqa: E402

from malletrain.core.policies import POLICIES, REPLAY, make_policy  # noqa: E402
from malletrain.sim.bounds.bound import upper_bound  # noqa: E402
from malletrain.sim.bounds.bound_inputs import idle_segments, in_worker_seconds  # noqa: E402
from malletrain.sim.counts import read_philly_minutes  # noqa: E402
from malletrain.sim.curves import provider_for  # noqa: E402
from malletrain.sim.engine import Simulator  # noqa: E402
from malletrain.sim.jobs import SimJob  # noqa: E402
from malletrain.sim.nodetypes import NodeTypes, gpu_counts, types_like  # noqa: E402
from malletrain.sim.profiles import build_job_set, gavel_profiles  # noqa: E402
from malletrain.sim.trace import IdleTrace, slice_from  # noqa: E402

DAY = 86400.0
DATA = REPO / "data"
ALIBABA = DATA / "traces" / "alibaba-gpu-v2023-openb_node_list_gpu_node.csv"
GAVEL = DATA / "profiles" / "gavel" / "simulation_throughputs.json"
PHILLY = DATA / "traces" / "philly-node-usage-per-minute.csv"
#: Alibaba's GPU models -> Gavel's worker types
MODELS = {"P100": "p100", "V100M16": "v100", "V100M32": "v100"}


def trace(day: float, days: float) -> IdleTrace:
    tr = slice_from(read_philly_minutes(PHILLY), day * DAY)
    return IdleTrace(tr.source, tr.node_names, tr.start_s, (day + days) * DAY, tr.events_list)


def typed_jobs(count: int, seed: int) -> list[SimJob]:
    """Gavel's jobs with their P100 and V100 curves (only those measured on both)."""
    by_type = {t: {p.name: p.curve for p in gavel_profiles(GAVEL, f"{t}_unconsolidated")}
               for t in ("p100", "v100")}
    base = build_job_set(gavel_profiles(GAVEL, "v100_unconsolidated"), count,
                         hours_at_max=24.0, scale_up_s=18.0, scale_down_s=12.0, seed=seed)
    out = []
    for job in base:
        kind = job.name.rsplit("-", 1)[0]
        if kind not in by_type["p100"]:
            continue
        curves = tuple(sorted((t, by_type[t][kind]) for t in by_type))
        top = max(c[-1][0] for _, c in curves)
        out.append(replace(job, curve=(), type_curves=curves, max_nodes=top))
    return out


def with_targets(jobs: list[SimJob], share: float) -> list[SimJob]:
    """Each job's target: ``share`` x its best rate (its largest size, faster type)."""
    return [replace(j, rate_target=share * max(m.rate(j.max_nodes)
                                               for m in j.true_models().values()))
            for j in jobs]


def replay(args: argparse.Namespace, mode: str) -> dict[str, object]:
    """One replay (in a worker process): its figures."""
    tr = trace(args.day, args.days)
    kinds = types_like(len(tr.node_names), gpu_counts(ALIBABA, MODELS), args.seed)
    prices = {"p100": args.price_p100, "v100": args.price_v100}
    types = NodeTypes(kinds, prices, hidden=mode == "oblivious",
                      objective="cost" if mode == "cost" else "throughput")
    jobs = typed_jobs(args.jobs, args.seed)
    if mode == "cost":
        jobs = with_targets(jobs, args.target)
    policy = "malletrain-known-curves" if mode == "exact" else "malletrain"
    sim = Simulator(tr, jobs, make_policy(policy, REPLAY), provider_for(POLICIES[policy].curves),
                    until_s=tr.start_s + args.days * DAY, types=types)
    t0 = time.perf_counter()
    res = sim.run()
    s = res.summary()
    on_target = asked = 0.0
    for run, job in zip(res.jobs, with_targets([r.job for r in res.jobs], args.target),
                        strict=True):
        if run.admitted_s is not None and job.rate_target is not None:
            due = job.rate_target * ((run.finished_s or res.end_s) - run.admitted_s)
            on_target += min(max(run.done, 0.0), due) / job.unit_rate()
            asked += due / job.unit_rate()
    return {"mode": mode, "work": s["one_worker_seconds_total"], "cost": res.cost,
            "node_s": dict(res.type_node_seconds), "rescales": res.rescales,
            "events": res.events, "nodes": len(tr.node_names), "on_target": on_target,
            "met": on_target / asked if asked else 0.0, "wall_s": time.perf_counter() - t0}


def typed_bound(args: argparse.Namespace) -> dict[str, float]:
    """The proven bound on any policy's one-worker-seconds here, types or not (in a worker).

    Each job counts at its fastest type at every size (``bound_inputs.type_envelope``), so
    it bounds every typed plan, the exact curves' included: the most any type-aware
    allocation could make over the type-oblivious one is this over replay 1.
    """
    tr = trace(args.day, args.days)
    until = tr.start_s + args.days * DAY
    t0 = time.perf_counter()
    b = upper_bound(idle_segments(tr, until), in_worker_seconds(typed_jobs(args.jobs, args.seed)),
                    10, submit_origin_s=tr.start_s, time_limit_s=args.bound_time_s)
    return {"work": b.samples, "gap": b.gap, "wall_s": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--day", type=float, default=14.0, help="first day of the Philly slice")
    ap.add_argument("--days", type=float, default=3.0)
    ap.add_argument("--jobs", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--price-p100", type=float, default=0.01,
                    help="price of a P100 node-second, in one-worker-seconds (policy units)")
    ap.add_argument("--price-v100", type=float, default=0.02)
    ap.add_argument("--target", type=float, default=0.5,
                    help="cost objective: each job's target, as a share of its best rate")
    ap.add_argument("--bound-time-s", type=float, default=300.0,
                    help="time for the bound's multiplier search (stopping early: looser)")
    args = ap.parse_args()
    with ProcessPoolExecutor(2) as pool:
        bound_f = pool.submit(typed_bound, args)
        futures = [pool.submit(replay, args, m) for m in ("aware", "cost", "exact", "oblivious")]
        aware, cost, exact, oblivious = (f.result() for f in futures)
        bound = bound_f.result()
    for r in (oblivious, aware, exact, cost):
        node_s = ", ".join(f"{t} {v / 3600:.0f} h" for t, v in r["node_s"].items())  # type: ignore[attr-defined]
        print(f"{r['mode']:10s} one-worker-s {r['work']:.4g}  cost {r['cost']:.4g}  "
              f"node-hours {node_s}  rescales {r['rescales']}  ({r['wall_s']:.0f} s, "
              f"{r['events']} events, {r['nodes']} nodes)")
    errs = [abs(p - t) / t for _, _, _, t, p, _ in cases((1, 2, 3, 4))]
    work = {r["mode"]: float(r["work"])  # type: ignore[arg-type]
            for r in (oblivious, aware, exact, cost)}
    print(f"type-aware over type-oblivious: learned {work['aware'] / work['oblivious']:.3f}x, "
          f"exact curves {work['exact'] / work['oblivious']:.3f}x; proven bound on any policy "
          f"{bound['work']:.4g} one-worker-s (gap {bound['gap']:.2%}, {bound['wall_s']:.0f} s): "
          f"at most {bound['work'] / work['oblivious']:.3f}x")
    spent = {r["mode"]: float(r["cost"]) for r in (aware, cost)}  # type: ignore[arg-type]
    met = {r["mode"]: float(r["met"]) for r in (aware, cost)}  # type: ignore[arg-type]
    per = {r["mode"]: float(r["cost"]) / float(r["on_target"])  # type: ignore[arg-type]
           for r in (aware, cost)}
    print(f"against the targets (share of target x admitted time met): cost objective "
          f"{met['cost']:.3f}, throughput objective {met['aware']:.3f}; cost per "
          f"one-worker-second on target: {per['cost']:.4g} vs {per['aware']:.4g}; "
          f"whole cost {spent['cost'] / spent['aware']:.3f}x, whole throughput "
          f"{work['cost'] / work['aware']:.3f}x")
    print(f"hetero throughput_ratio={work['aware'] / work['oblivious']:.3f} "
          f"cost_ratio={per['cost'] / per['aware']:.3f} "
          f"predict_err_unseen={statistics.median(errs):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

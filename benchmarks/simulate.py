"""Replay speed on a supercomputer-sized centre: every policy, 1,000 jobs, real data.

The trace is two real machines side by side (``malletrain.sim.merge``), 4 days each:

* ALCF Theta's 2022 job log (4,360 nodes) replayed through FCFS + EASY backfill, days
  150-154 (the replay from day 0 warms the machine up; its backfill plan gives the
  scavenger its windows);
* Microsoft Philly's per-minute idle-node log, days 14-18 (no plan).

That is 4,780 nodes (Summit has 4,608) and about 5,200 idle-set changes (Summit's ~67
an hour). The jobs are 1,000 of the vendored measured profiles (Sia/Pollux on AWS,
Gavel on V100), each 6 hours of work at its peak size, one every 300 s on average, at
most 10 admitted at a time (FreeTrain's set-up): the queue never runs dry.

Each policy runs in a fresh process (its own peak RSS), after the trace is built there;
``wall_s`` is the replay alone, ``build_s`` the trace. The baseline, side by side: the
same replay under ``equal-share`` with a fresh 4,780-node snapshot per decision (a naive
port of the daemon's observe step), the cost the simulator's reduced view avoids.

Usage: ``.venv/bin/python benchmarks/simulate.py [--policy NAME ...] [--jobs 1000]
[--days 4] [--no-baseline] [--bound]``. Last line (the slowest policy's wall and peak
memory): ``simulate nodes=N events=E jobs=J wall_s=W events_per_s=R rss_mb=M``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time
from pathlib import Path

import numpy as np

from malletrain.core.cluster import ClusterSnapshot, Node, NodeState
from malletrain.core.policies import POLICIES, REPLAY, make_policy
from malletrain.sim.counts import read_philly_minutes
from malletrain.sim.curves import provider_for
from malletrain.sim.engine import Simulator
from malletrain.sim.jobs import SimJob
from malletrain.sim.merge import merge_traces
from malletrain.sim.profiles import build_job_set, gavel_profiles, sia_profiles
from malletrain.sim.swf import swf_trace
from malletrain.sim.trace import IdleTrace, slice_from
from malletrain.sim.view import SnapshotView

DATA = Path(__file__).resolve().parents[1] / "data"
DAY = 86400.0
THETA_FROM_DAY = 150
PHILLY_FROM_DAY = 14


def centre_trace(days: float) -> IdleTrace:
    """Theta (SWF replay) and Philly side by side, ``days`` long, events materialised."""
    theta = swf_trace(DATA / "traces" / "alcf-theta-2022.swf", 4360,
                      THETA_FROM_DAY * DAY, (THETA_FROM_DAY + days) * DAY)
    philly = slice_from(read_philly_minutes(DATA / "traces" / "philly-node-usage-per-minute.csv"),
                        PHILLY_FROM_DAY * DAY)
    philly = IdleTrace(philly.source, philly.node_names, philly.start_s,
                       (PHILLY_FROM_DAY + days) * DAY, philly.events_list)
    merged = merge_traces([("theta", theta), ("philly", philly)])
    return IdleTrace(merged.source, merged.node_names, 0.0, merged.end_s, tuple(merged.events()))


def job_set(count: int) -> list[SimJob]:
    profiles = sia_profiles(DATA / "profiles" / "sia-pollux") + gavel_profiles(
        DATA / "profiles" / "gavel" / "simulation_throughputs.json")
    return build_job_set(profiles, count, hours_at_max=6.0, scale_up_s=18.0, scale_down_s=12.0,
                         mean_interarrival_s=300.0, seed=0)


class FullSnapshotView(SnapshotView):
    """Baseline: every node as a new Node object in every decision's snapshot."""

    def idle_nodes(self, now_s, idle, planned):  # type: ignore[no-untyped-def]
        from malletrain.core.scavenging import scavenger

        idle_set = set(idle.tolist())
        nodes = tuple(
            Node(name=n, state=NodeState.IDLE if i in idle_set else NodeState.ALLOCATED,
                 last_busy_at=self._nodes[i].last_busy_at)
            for i, n in enumerate(self.node_names)
        )
        full = ClusterSnapshot(taken_at=now_s, nodes=nodes,
                               jobs=self.snapshot(now_s, idle[:0], planned).jobs)
        return scavenger.idle_nodes(full, now_s)


def replay(policy: str, jobs: int, days: float, full_view: bool) -> dict[str, float]:
    """One policy's replay in this (fresh) process: times, counts, peak RSS."""
    t0 = time.perf_counter()
    trace = centre_trace(days)
    build_s = time.perf_counter() - t0
    pol = make_policy(policy, REPLAY)
    sim = Simulator(trace, job_set(jobs), pol, provider_for(POLICIES[policy].curves))
    if full_view:
        sim.view = FullSnapshotView(trace.node_names)
    t0 = time.perf_counter()
    res = sim.run()
    return {
        "wall_s": time.perf_counter() - t0,
        "build_s": build_s,
        "events": res.events,
        "decisions": res.decisions,
        "nodes": len(trace.node_names),
        "samples": res.samples_total,
        "finished": sum(r.finished_s is not None for r in res.jobs),
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "decision_ms_p50": float(np.median(res.decision_s)) * 1e3,
    }


def in_fresh_process(policy: str, jobs: int, days: float, full_view: bool) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(replay, (policy, jobs, days, full_view))


def bound_of(jobs: int, days: float, time_s: float) -> tuple[float, float, float]:
    from malletrain.sim.bounds.bound import upper_bound
    from malletrain.sim.bounds.bound_inputs import idle_segments

    trace = centre_trace(days)
    t0 = time.perf_counter()
    b = upper_bound(idle_segments(trace), job_set(jobs), 10, submit_origin_s=trace.start_s,
                    time_limit_s=time_s)
    return b.samples, b.gap, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", action="append", help="default: every registered policy")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--days", type=float, default=4.0)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--bound", action="store_true", help="also the proven bound (60 s search)")
    args = ap.parse_args()
    policies = args.policy or list(POLICIES)
    bound = bound_of(args.jobs, args.days, 60.0) if args.bound else None
    if bound is not None:
        print(f"proven bound {bound[0]:.4g} samples (within {bound[1]:.2%}, {bound[2]:.0f} s)")
    runs: dict[str, dict[str, float]] = {}
    print(f"{'policy':<24} {'wall_s':>7} {'build_s':>7} {'decisions':>9} {'dec_ms_p50':>10} "
          f"{'rss_mb':>7} {'samples':>10} {'finished':>8}" + ("  of_bound" if bound else ""))
    for policy in policies:
        r = runs[policy] = in_fresh_process(policy, args.jobs, args.days, False)
        print(f"{policy:<24} {r['wall_s']:>7.1f} {r['build_s']:>7.1f} {r['decisions']:>9.0f} "
              f"{r['decision_ms_p50']:>10.2f} {r['rss_mb']:>7.0f} {r['samples']:>10.4g} "
              f"{r['finished']:>8.0f}"
              + (f"  {r['samples'] / bound[0]:.3f}" if bound else ""), flush=True)
    if not args.no_baseline:
        base = in_fresh_process("equal-share", args.jobs, args.days, True)
        own = runs.get("equal-share") or in_fresh_process("equal-share", args.jobs, args.days,
                                                          False)
        same = abs(base["samples"] - own["samples"]) <= 1e-9 * own["samples"]
        print(f"baseline: equal-share with a full {base['nodes']:.0f}-node snapshot per "
              f"decision: wall {base['wall_s']:.1f} s vs {own['wall_s']:.1f} s "
              f"({base['wall_s'] / own['wall_s']:.2f}x slower), same samples: "
              f"{'yes' if same else 'no'}")
    slow = max(runs.values(), key=lambda r: r["wall_s"])
    print(f"simulate nodes={slow['nodes']:.0f} events={slow['events']:.0f} jobs={args.jobs} "
          f"wall_s={slow['wall_s']:.1f} events_per_s={slow['events'] / slow['wall_s']:.0f} "
          f"rss_mb={max(r['rss_mb'] for r in runs.values()):.0f}")


if __name__ == "__main__":
    main()

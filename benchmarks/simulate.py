"""Replay speed: 3 days of a 4,000-node idle trace with 10 concurrent jobs.

The trace is synthetic but shaped like Summit's (DESIGN §1): ~8% of nodes idle,
hole lengths lognormal with median 475 s (40% under 5 min), changes batched every
30 s. Two runs of the same replay side by side:

* ``view=reduced``: the simulator as built (per event, a snapshot of only the idle
  nodes, Node objects built once and reused);
* ``view=full``: the baseline the simulator avoids, a fresh 4,000-Node
  ClusterSnapshot per event, as a naive port of the daemon's observe step would do.

Usage: ``.venv/bin/python benchmarks/simulate.py [--policy equal-share] [--hours 72]``.
Last line: ``simulate nodes=4000 hours=72 events=E policy=P wall_s=X full_view_wall_s=Y ratio=R``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from malletrain.core.cluster import ClusterSnapshot, Node, NodeState
from malletrain.core.policies import CORE, POLICIES, make_policy
from malletrain.sim.curves import provider_for
from malletrain.sim.engine import Simulator
from malletrain.sim.jobs import SimJob
from malletrain.sim.trace import IdleTrace, TraceEvent
from malletrain.sim.view import SnapshotView


def summit_like_trace(nodes: int, hours: float, seed: int = 0, bin_s: float = 30.0) -> IdleTrace:
    """Alternating busy/idle periods per node; idle ~8%, holes lognormal (median 475 s)."""
    rng = np.random.default_rng(seed)
    end = hours * 3600.0
    hole_median, hole_sigma = 475.0, 1.8
    hole_mean = hole_median * np.exp(hole_sigma**2 / 2)
    busy_mean = hole_mean * (1 - 0.083) / 0.083
    changes: dict[float, tuple[list[int], list[int]]] = {}
    initial: list[int] = []
    for n in range(nodes):
        idle = rng.random() < 0.083
        if idle:
            initial.append(n)
        t = 0.0
        while True:
            if idle:
                t += rng.lognormal(np.log(hole_median), hole_sigma)
            else:
                t += rng.exponential(busy_mean)
            if t >= end:
                break
            idle = not idle
            b = float(np.ceil(t / bin_s) * bin_s)
            changes.setdefault(b, ([], []))[0 if idle else 1].append(n)
    events = [TraceEvent(0.0, tuple(initial), ())]
    state = np.zeros(nodes, dtype=bool)
    state[initial] = True
    for t in sorted(changes):
        to_idle, to_busy = changes[t]
        # A node that flips twice in one bin may end where it started: keep the net change.
        net_idle = sorted({i for i in to_idle if not state[i]} - set(to_busy))
        net_busy = sorted({i for i in to_busy if state[i]} - set(to_idle))
        state[net_idle] = True
        state[net_busy] = False
        if net_idle or net_busy:
            events.append(TraceEvent(t, tuple(net_idle), tuple(net_busy)))
    names = tuple(f"node{i:04d}" for i in range(nodes))
    return IdleTrace("summit-like", names, 0.0, end, tuple(events))


class FullSnapshotView(SnapshotView):
    """Baseline: every node as a new Node object in every event's snapshot."""

    def snapshot(
        self, now_s: float, idle: np.ndarray, planned: object
    ) -> ClusterSnapshot:
        idle_set = set(idle.tolist())
        nodes = tuple(
            Node(name=n, state=NodeState.IDLE if i in idle_set else NodeState.ALLOCATED)
            for i, n in enumerate(self.node_names)
        )
        full = ClusterSnapshot(taken_at=now_s, nodes=nodes)
        # The scavenger would then filter the idle ones out of the full list.
        kept = tuple(n for n in full.nodes if n.state is NodeState.IDLE)
        return ClusterSnapshot(taken_at=now_s, nodes=kept)


def jobs(count: int) -> list[SimJob]:
    # ImageNet on T4s (Sia/Pollux aws, samples/s by workers), a long queue.
    curve = ((1, 217.0), (2, 424.0), (4, 849.0), (8, 1642.0), (16, 3200.0), (32, 6215.0),
             (64, 11777.0))
    return [SimJob(f"imagenet-{i}", 0.0, 1, 64, 1e12, 18.0, 12.0, curve) for i in range(count)]


def run(trace: IdleTrace, policy: str, full: bool) -> tuple[float, int, float]:
    pol = make_policy(policy, CORE)
    sim = Simulator(trace, jobs(30), pol, provider_for(POLICIES[policy].curves))
    if full:
        sim.view = FullSnapshotView(trace.node_names)
    t0 = time.perf_counter()
    res = sim.run()
    return time.perf_counter() - t0, res.events, float(np.median(res.decision_s))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4000)
    ap.add_argument("--hours", type=float, default=72.0)
    ap.add_argument("--policy", default="equal-share")
    args = ap.parse_args()
    t0 = time.perf_counter()
    trace = summit_like_trace(args.nodes, args.hours)
    gen_s = time.perf_counter() - t0
    idle_counts = np.cumsum([len(e.became_idle) - len(e.became_busy) for e in trace.events()])
    print(
        f"trace: {len(trace.events_list)} events, mean idle nodes {idle_counts.mean():.0f}, "
        f"generated in {gen_s:.1f} s"
    )
    wall, events, dec = run(trace, args.policy, full=False)
    print(f"reduced view: wall {wall:.1f} s, {events} events, decision p50 {dec * 1e3:.2f} ms")
    full_wall, _, _ = run(trace, args.policy, full=True)
    print(f"full snapshot per event: wall {full_wall:.1f} s")
    print(
        f"simulate nodes={args.nodes} hours={args.hours:g} events={events} policy={args.policy} "
        f"wall_s={wall:.1f} full_view_wall_s={full_wall:.1f} ratio={full_wall / wall:.2f}"
    )



if __name__ == "__main__":
    main()

"""Allocator decision time: malletrain's exact DP vs FreeTrain's node-level MILP, one run.

Usage: ``.venv/bin/python benchmarks/allocator.py [--decisions 21] [--seed 0]``;
``--against-commit REV [--rounds 3]``: this tree's decision time beside REV's, alternated in
one run (:mod:`allocator_vs`).

Instances are random but shaped like a big scavenging cluster: 5,000 idle nodes
(half with a window predicted by the backfill plan, half unknown with an idle
age), 500 malleable jobs (half running on some of those nodes), sizes min
{1,2,4} / max {4,8,16,32}, concave curves, rescale costs 5-30 s. Every decision
is a full ``MalleTrainPolicy.decide`` (windows, hole model, value table, DP,
node choice) on a fresh instance; the policy keeps its hole model across them,
as in the daemon. The baseline, measured in the same run: FreeTrain's literal
node-level MILP (binary x[job, node], HiGHS via SciPy, 10 s limit) on growing
instances; ``milp_ms`` is the largest one it solves to optimality within 10 s,
and the DP's time on that same instance is printed next to it.

The scarce case (every job running, 8 free nodes, curves measured at 1 node) times
the second, conservative value table of ``explore_free_only`` with the rule on and off.
The typed case gives the same inputs three node types (each job's curve scaled 0.5-3x per
type) and times the per-type plan (``core.hetero``) beside the untyped one. The users case
gives the jobs to 50 users in turn and times the fair-share division
(``core.allocation.fairness``) beside the user-blind DP, interleaved; the limits case adds
Slurm's per-user and per-account caps to it (``AllocationInput.caps``).

Last line: ``allocator nodes=5000 jobs=500 p50_ms=<x> max_ms=<y> milp_ms=<z>``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from malletrain.core.allocation.allocator import malletrain_policy
from malletrain.core.baselines import freetrain_milp
from malletrain.core.model import (
    AllocationInput,
    IdleNode,
    MalleableJob,
    Policy,
    ThroughputModel,
)
from malletrain.core.policies import CORE, REPLAY, make_policy


def instance(
    n_nodes: int,
    n_jobs: int,
    seed: int,
    jobs_seed: int = 0,
    running_share: float = 0.5,
    measured_max_nodes: int | None = None,
) -> AllocationInput:
    """One decision's input: cluster state from ``seed``, job curves from ``jobs_seed``.

    Successive decisions of one benchmark run share the jobs' curves and the node
    names (the same cluster and queue, as between two daemon ticks) while the
    windows, idle ages and who holds what change. ``running_share`` of the jobs run;
    ``measured_max_nodes`` is what every curve says of its measured sizes (None:
    unsaid, the curve is trusted).
    """
    rng = np.random.default_rng(seed)
    curve_rng = np.random.default_rng(jobs_seed)
    nodes = tuple(
        IdleNode(
            f"n{i:05d}",
            None if rng.random() < 0.5 else float(rng.uniform(0.0, 3600.0)),
            float(rng.exponential(900.0)),
            f"sw{i // 36}",
        )
        for i in range(n_nodes)
    )
    names = [n.name for n in nodes]
    rng.shuffle(names)
    taken = 0
    jobs = []
    for j in range(n_jobs):
        hi = int(rng.choice([4, 8, 16, 32]))
        lo = min(int(rng.choice([1, 2, 4])), hi)
        c = int(rng.integers(lo, hi + 1)) if rng.random() < running_share else 0
        c = min(c, n_nodes - taken)
        if c < lo:
            c = 0
        own = tuple(names[taken : taken + c])
        taken += c
        per_node = float(curve_rng.uniform(10.0, 1000.0))
        alpha = float(curve_rng.uniform(0.5, 1.0))  # r(n) = r1 * n^alpha: concave
        pts = tuple((n, per_node * n**alpha) for n in (1, 2, 4, 8, 16, 32))
        jobs.append(
            MalleableJob(
                f"job{j:04d}",
                lo,
                hi,
                own,
                ThroughputModel(pts, measured_max_nodes=measured_max_nodes),
                float(rng.uniform(5.0, 30.0)),
                float(rng.uniform(5.0, 30.0)),
                j,
            )
        )
    return AllocationInput(0.0, nodes, tuple(jobs))


def crowded(inp: AllocationInput, free: int) -> AllocationInput:
    """``inp`` with only the held nodes and ``free`` free ones."""
    held = {n for job in inp.jobs for n in job.nodes}
    spare = [n for n in inp.nodes if n.name not in held][:free]
    return replace(inp, nodes=tuple(n for n in inp.nodes if n.name in held) + tuple(spare))


def typed(inp: AllocationInput, kinds: tuple[str, ...], seed: int) -> AllocationInput:
    """``inp`` on a cluster of node ``kinds`` (in turn), every job's curve scaled per kind by
    a factor from 0.5 to 3 (its speed on that GPU model)."""
    rng = np.random.default_rng(seed)
    nodes = tuple(replace(n, node_type=kinds[i % len(kinds)]) for i, n in enumerate(inp.nodes))
    jobs = tuple(replace(j, type_throughput={k: j.throughput.scaled(float(rng.uniform(0.5, 3.0)))
                                             for k in kinds}) for j in inp.jobs)
    return replace(inp, nodes=nodes, jobs=jobs)


def interleaved_ms(runs: Sequence[tuple[Policy, Sequence[AllocationInput]]]
                   ) -> list[list[float]]:
    """Decision times (ms) of each (policy, inputs) run, interleaved input by input so that
    the machine's noise falls on every run alike; each run's first input warms it up."""
    for pol, inputs in runs:
        pol.decide(inputs[0])
    ms: list[list[float]] = [[] for _ in runs]
    for k in range(1, len(runs[0][1])):
        for out, (pol, inputs) in zip(ms, runs, strict=True):
            t0 = time.perf_counter()
            pol.decide(inputs[k])
            out.append((time.perf_counter() - t0) * 1000)
    return ms


def time_types(inputs: list[AllocationInput], seed: int) -> None:
    """Decision time with 3 node types (core.hetero) against the same inputs untyped."""
    kinds = ("a100", "v100", "t4")
    plain, types = interleaved_ms([
        (make_policy("malletrain", CORE), inputs),
        (make_policy("malletrain", CORE), [typed(inp, kinds, seed) for inp in inputs])])
    print(f"dp with {len(kinds)} node types (one per job, core.hetero): p50 "
          f"{statistics.median(types):.1f} ms, max {max(types):.1f} ms; the same inputs "
          f"without types: p50 {statistics.median(plain):.1f} ms")


def with_users(inp: AllocationInput, users: int) -> AllocationInput:
    """``inp`` with its jobs owned by ``users`` users in turn."""
    return replace(inp, jobs=tuple(replace(j, user=f"u{k % users}")
                                   for k, j in enumerate(inp.jobs)))


def time_users(inputs: list[AllocationInput], users: int) -> None:
    """Decision time with the nodes divided among ``users`` users first (core.allocation.
    fairness) against the user-blind DP on the same inputs, interleaved."""
    owned = [with_users(inp, users) for inp in inputs]
    blind, fair = interleaved_ms([
        (make_policy("malletrain", CORE.with_(fair_share=False)), owned),
        (make_policy("malletrain", CORE), owned)])
    print(f"dp with {users} users' fair shares: p50 {statistics.median(fair):.1f} ms, "
          f"max {max(fair):.1f} ms; the same inputs user-blind: p50 "
          f"{statistics.median(blind):.1f} ms")


def with_caps(inp: AllocationInput, users: int, accounts: int = 5) -> AllocationInput:
    """``inp`` with Slurm's limits as the daemon passes them (``daemon/tick/limits.py``):
    each user in one of ``accounts`` accounts, 40 nodes a user, 600 an account."""
    jobs = tuple(replace(j, limits=(f"assoc:a{i % accounts}/u{i % users}",
                                    f"assoc:a{i % accounts}"))
                 for i, j in enumerate(inp.jobs))
    caps = {k: 40 if "/" in k else 600 for j in jobs for k in j.limits}
    return replace(inp, jobs=jobs, caps=caps)


def time_caps(inputs: list[AllocationInput], users: int) -> None:
    """Decision time with users' shares and Slurm's limits against the shares alone."""
    owned = [with_users(inp, users) for inp in inputs]
    capped = [with_caps(inp, users) for inp in owned]
    pol = make_policy("malletrain", CORE)  # one policy: its hole model sees both
    shares, limited = interleaved_ms([(pol, owned), (pol, capped)])
    print(f"dp with {users} users' shares and {len(capped[0].caps)} limits (40 nodes a user, "
          f"600 an account): p50 {statistics.median(limited):.1f} ms; the shares alone: "
          f"p50 {statistics.median(shares):.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--decisions", type=int, default=21)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--milp-limit-s", type=float, default=10.0)
    ap.add_argument("--against-commit", metavar="REV",
                    help="instead: this tree's decision time beside REV's (allocator_vs.py)")
    ap.add_argument("--rounds", type=int, default=3, help="alternations with --against-commit")
    args = ap.parse_args()
    if args.against_commit:
        from allocator_vs import compare_with  # beside this script
        compare_with(args.against_commit, args.rounds, args.decisions, args.seed)
        return

    n_nodes, n_jobs = 5000, 500
    policy = make_policy("malletrain", CORE)
    inputs = [
        instance(n_nodes, n_jobs, args.seed + k, jobs_seed=args.seed)
        for k in range(args.decisions + 1)
    ]
    policy.decide(inputs[0])  # warm-up: imports, caches
    times_ms = []
    for inp in inputs[1:]:
        t0 = time.perf_counter()
        plan = policy.decide(inp)
        times_ms.append((time.perf_counter() - t0) * 1000)
        assert sum(len(v) for v in plan.assignments.values()) <= n_nodes
    p50 = statistics.median(times_ms)
    print(
        f"dp: {n_nodes} nodes x {n_jobs} jobs, {len(times_ms)} decisions: "
        f"p50 {p50:.1f} ms, max {max(times_ms):.1f} ms"
    )
    time_types(inputs, args.seed)
    time_users(inputs, 50)
    time_caps(inputs, 50)
    # the simulator's replay settings (preset REPLAY): same inputs
    replay = make_policy("malletrain", REPLAY)
    replay.decide(inputs[0])
    replay_ms = []
    for inp in inputs[1:]:
        t0 = time.perf_counter()
        replay.decide(inp)
        replay_ms.append((time.perf_counter() - t0) * 1000)
    print(
        f"dp, replay settings (estimate horizon 300 s, reclaim groups 1 s): "
        f"p50 {statistics.median(replay_ms):.1f} ms, max {max(replay_ms):.1f} ms"
    )
    # Exploration on free nodes only (explore_free_only) builds a second, conservative
    # value table for the jobs whose growth needs others' nodes. Its worst case: every
    # job runs, only 8 free nodes (the rest of the free pool is left out), every curve
    # measured at 1 node only, so all 500 jobs need it; timed with the rule on and off
    # on the same inputs.
    scarce = [
        crowded(
            instance(
                n_nodes, n_jobs, args.seed + k, args.seed, running_share=1.0, measured_max_nodes=1
            ),
            free=8,
        )
        for k in range(args.decisions + 1)
    ]
    # interleaved (off, on) on each input, so that load bursts hit both alike
    pols = {on: malletrain_policy(CORE, explore_free_only=on) for on in (False, True)}
    ms: dict[bool, list[float]] = {False: [], True: []}
    for pol in pols.values():
        pol.decide(scarce[0])
    for inp in scarce[1:]:
        for on, pol in pols.items():
            t0 = time.perf_counter()
            pol.decide(inp)
            ms[on].append((time.perf_counter() - t0) * 1000)
    for on in (False, True):
        print(
            f"dp, {len(scarce[1].nodes)} nodes (8 free) x {n_jobs} jobs, curves measured at "
            f"1 node, explore_free_only={on}: "
            f"p50 {statistics.median(ms[on]):.1f} ms, max {max(ms[on]):.1f} ms"
        )

    # The baseline: FreeTrain's node-level MILP on growing instances, 10 s limit each.
    best: tuple[int, int, float, float] | None = None
    for nodes_k, jobs_k in ((20, 2), (50, 5), (100, 10), (200, 20), (400, 40), (800, 80)):
        inp = instance(nodes_k, jobs_k, args.seed + 1000 + nodes_k, jobs_seed=args.seed + nodes_k)
        res = freetrain_milp(inp, tfwd_s=10.0, time_limit_s=args.milp_limit_s, node_level=True)
        t0 = time.perf_counter()
        make_policy("malletrain", CORE).decide(inp)
        dp_ms = (time.perf_counter() - t0) * 1000
        optimal = res.counts is not None and "Optimal" in res.status
        print(
            f"milp node-level {nodes_k} nodes x {jobs_k} jobs: {res.solve_s * 1000:.0f} ms "
            f"({'optimal' if optimal else res.status}); dp on it {dp_ms:.1f} ms"
        )
        if not optimal or res.solve_s > args.milp_limit_s:
            break
        best = (nodes_k, jobs_k, res.solve_s * 1000, dp_ms)
    if best is None:
        print("milp: solved no instance within the limit")
        milp_ms = float("nan")
    else:
        milp_ms = best[2]
        print(
            f"milp largest solved within {args.milp_limit_s:g} s: {best[0]} nodes x {best[1]} jobs "
            f"in {best[2]:.0f} ms (dp on it: {best[3]:.1f} ms, {best[2] / best[3]:.0f}x faster)"
        )
    print(
        f"allocator nodes={n_nodes} jobs={n_jobs} p50_ms={p50:.1f} max_ms={max(times_ms):.1f} "
        f"milp_ms={milp_ms:.0f}"
    )


if __name__ == "__main__":
    main()

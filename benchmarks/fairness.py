"""Fair shares among users on real traces: the allocator with shares beside the user-blind one.

Issue 47: with a user-blind allocator, user A's 20 jobs held every idle node and user B's one
job got none for hours; admitted first-in-first-out, B's job even waited 7,684-7,941 s for an
admission slot. This replays two multi-user workloads on real traces through the simulator
(``malletrain.sim``: the policy, the Profiling Advisor and the scavenger the daemon runs, with
users admitted fairly by ``sim/admission.py``) under the ``malletrain`` policy (curves learned
online) with the simulator's preset ``REPLAY`` and the daemon's ``LIVE`` (a 10 % keep margin,
rates in samples), fair shares on (the default) and off (``fair_share=False``, the baseline),
side by side in one run:

* ``ab``: the issue's scenario on Philly's per-minute node log, days 14-17 (420 nodes, no
  backfill plan): user A submits 20 jobs at t=0, user B one at t=60 s, all the measured
  ResNet-50/ImageNet profile of ``configs/sim/sia-imagenet-48.yaml`` (one kind, its samples,
  1-8 nodes as in the issue);
* ``ricc-users``: the 48 jobs of ``configs/sim/sia-aws-48.yaml`` (6 models) on RIKEN RICC's
  2010 log, days 30-33, replayed through EASY backfill (the evaluation's ``ricc-d30`` slice,
  1,024 nodes), each job given the user and group (as its account) of one real job of the same
  log and days: the log's submissions in those days, in order, sampled evenly
  (:func:`swf_users`, SWF fields 12-13), so users' shares of the jobs are the centre's own
  (ALCF Theta's logs have no user ids);
* ``philly-vcs``: the same 48 jobs on Philly's node log, days 14-17, each given the virtual
  cluster of one real Philly job submitted in those days (Philly's job log has VCs, no user
  ids; a VC is a team's share, one user here), sampled the same way;
* ``swf-users``: the same on any SWF log with user ids (``--swf FILE --swf-nodes N
  [--swf-procs-per-node P] [--jobs YAML]``, e.g. one of the Parallel Workloads Archive), days
  ``--day`` (default 0) to ``--day + --days``.

Figures per replay: Jain's index over users of their node-seconds (``jain_node_s``), of their
useful work in one-worker-seconds (``jain_work``: normalised throughput, samples divided by the
job's one-node rate), and of their normalised share (``jain_share``: at every decision each
active user's nodes divided by its part, up to 1, the part being its max-min fair part of the
idle nodes for its jobs' useful sizes as the allocator divides them
(``core.allocation.shares.user_caps`` over the jobs' largest sizes held to their useful sizes,
and the nodes users hold; the nodes past every part go where they add the most, so a user
given more than its part counts 1; measured the same way for the user-blind allocator), the
index averaged over time); ``starved``: the share of time in which some user was given nothing while
its part fitted one of its jobs' minimum; when the first idle node was on offer
(``first_idle_s``, from the replay's start); B's wait from its submission to its
first node and to its share (``ab``: 8 nodes, its job's largest size, or its equal part of the
idle nodes if smaller); total useful work (``work``, one-worker-seconds) and its cost against
the user-blind allocator; that work per node-second the jobs held (``work_per_node_s``:
where the nodes went, apart from what moving them cost); what the allocator's size changes
cost in useful work (``lost``,
one-worker-seconds of rescale downtime; ``--free-rescales``: every job's rescale costs 0, to
the allocator too, to tell churn from the division's own cost); size changes the allocator
made (``rescales``, starts included) and those Slurm's jobs forced (``preempted``).

The workloads are built in ``benchmarks/fairness_scenarios.py``.

Usage: ``.venv/bin/python benchmarks/fairness.py [--scenario ab|ricc-users|philly-vcs|swf-users ...]
[--preset replay|live ...] [--days 3] [--day D] [--workers 2] [--free-rescales]
[--set OPTION=VALUE ...]``
(``--set``: a ``PolicyOptions`` field on the preset, both allocators, e.g.
``fair_share_lend_factor=0`` for strict parts under ``REPLAY``);
``--guard-parity SLICE`` instead replays one slice of ``benchmarks/evaluate.py`` with the
report guard on and off; ``--decision-time N`` instead times N decisions of the preset REPLAY
with strict parts and with lending (at ``--set fair_share_lend_factor=F``, else 8).
Last line: ``fairness jain=J worst_first_node_s=W starved_fraction=S throughput_vs_unfair=T``
(the fair replays: the smallest ``jain_share``, the longest wait of a user to its first node,
the largest ``starved``, the smallest ratio of useful work to the user-blind replay's).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from malletrain.core.allocation.allocator import MalleTrainPolicy
from malletrain.core.allocation.fairness import job_useful_sizes
from malletrain.core.allocation.shares import fair_turn, user_caps
from malletrain.core.model import AllocationInput, Plan
from malletrain.core.options import LIVE, PolicyOptions
from malletrain.core.policies import POLICIES, REPLAY, make_policy
from malletrain.core.profiling.plausible import PlausibleRule
from malletrain.sim.curves import LearnedCurves, provider_for
from malletrain.sim.engine import Simulator
from malletrain.sim.result import Result

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fairness_scenarios import JOBS, ROOT, SCENARIOS, Scenario, SwfLog

POLICY = "malletrain"
DAY = 86400.0


def jain(x: Sequence[float]) -> float:
    """Jain's index: 1 when all equal, 1/n when one has everything (nan: nobody)."""
    arr = np.asarray(x, dtype=float)
    if arr.size == 0 or not (arr > 0).any():
        return math.nan
    return float(arr.sum() ** 2 / (arr.size * (arr ** 2).sum()))


def _counts_at(res: Result) -> tuple[list[float], dict[str, list[int]]]:
    """Decision times and every job's node count right after each."""
    times = [s.time_s for s in res.timeline]
    changes: dict[str, list[tuple[float, int]]] = {}
    for ch in res.job_nodes:
        changes.setdefault(ch.job, []).append((ch.time_s, ch.nodes))
    counts: dict[str, list[int]] = {}
    for run in res.jobs:
        seq, k, n, out = changes.get(run.job.name, []), 0, 0, []
        for t in times:
            while k < len(seq) and seq[k][0] <= t:
                n = seq[k][1]
                k += 1
            out.append(n)
        counts[run.job.name] = out
    return times, counts


@dataclass(frozen=True)
class Division:
    """One decision: each user's part as the fair division makes it, and what the plan gave."""

    time_s: float
    parts: dict[str, int]
    given: dict[str, int]
    #: users whose part fits the minimum of one of their jobs
    fits: frozenset[str]


class Recorder:
    """Wraps the policy (fair or user-blind alike): at every decision, each user's part as
    ``core.allocation.fairness`` divides the nodes (:func:`user_caps` over the value table's
    largest finite sizes and the nodes users hold, the odd nodes in the policy's turns), beside
    what the plan gives the user."""

    def __init__(self, policy: MalleTrainPolicy) -> None:
        self.policy = policy
        self.name = policy.name
        self.rows: list[Division] = []

    def decide(self, inp: AllocationInput) -> Plan:
        plan = self.policy.decide(inp)
        values, _, _ = self.policy.value_table(inp)
        finite = np.isfinite(values)
        largest = np.where(finite.any(axis=1),
                           values.shape[1] - 1 - np.argmax(finite[:, ::-1], axis=1), 0)
        useful = job_useful_sizes(inp.jobs, values.shape[1], self.policy.fair_share_min_gain)
        # the division's own demand: each job's useful size (fairness.solve_fair's useful)
        first_of = largest if useful is None else np.minimum(largest, useful)
        first: dict[str, int] = {}
        held: dict[str, int] = {}
        given: dict[str, int] = {}
        for j, job in enumerate(inp.jobs):
            first[job.user] = first.get(job.user, 0) + int(first_of[j])
            held[job.user] = held.get(job.user, 0) + len(job.nodes)
            given[job.user] = given.get(job.user, 0) + plan.count(job.job_id)
        parts = user_caps(first, held, len(inp.nodes),
                          turn=fair_turn(inp.now_s, self.policy.fair_turn_s))
        fits = frozenset(job.user for job in inp.jobs if parts[job.user] >= job.min_nodes)
        self.rows.append(Division(inp.now_s, parts, given, fits))
        return plan


def share_figures(rows: Sequence[Division], end_s: float) -> dict[str, float]:
    """Time-averaged Jain's index of users' nodes over their parts (up to 1: the nodes past
    every part go where they add the most), and the share of time in
    which a user whose part fits one of its jobs was given nothing (decisions of 2+ users)."""
    weighted = starved_s = span_s = jain_s = 0.0
    for i, row in enumerate(rows):
        dt = (rows[i + 1].time_s if i + 1 < len(rows) else end_s) - row.time_s
        ratios = [min(1.0, row.given[u] / row.parts[u]) for u in row.parts if row.parts[u] > 0]
        if dt <= 0 or len(ratios) < 2:
            continue
        span_s += dt
        if any(row.given[u] == 0 for u in row.fits):
            starved_s += dt
        if any(ratios):  # (all at zero: nobody runs, no index)
            jain_s += dt
            weighted += dt * jain(ratios)
    return {"jain_share": weighted / jain_s if jain_s else math.nan,
            "starved": starved_s / span_s if span_s else math.nan}


def waits(res: Result, user: str | None) -> dict[str, float]:
    """The watched user's (or the worst user's) wait to its first node and to its share, and
    when the first node was on offer (from the replay's start)."""
    times, counts = _counts_at(res)
    idle = [s.idle_nodes for s in res.timeline]
    users = sorted({r.job.user for r in res.jobs}) if user is None else [user]
    first, share = 0.0, 0.0
    for u in users:
        runs = [r for r in res.jobs if r.job.user == u]
        submit = res.start_s + min(r.job.submit_s for r in runs)
        starts = [r.started_s for r in runs if r.started_s is not None]
        first = max(first, (min(starts) if starts else res.end_s) - submit)
        want = sum(r.job.max_nodes for r in runs)
        got = res.end_s
        for i, t in enumerate(times):
            n_users = len({r.job.user for r in res.jobs if r.admitted_s is not None
                           and r.admitted_s <= t and (r.finished_s is None or r.finished_s > t)})
            held = sum(counts[r.job.name][i] for r in runs)
            part = min(want, idle[i] // n_users) if n_users else 0
            if t >= submit and part > 0 and held >= part:  # (no part while nodes < users)
                got = t
                break
        share = max(share, got - submit)
    pool = next((t for t, n in zip(times, idle, strict=True) if n > 0), res.end_s)
    return {"first_node_s": first, "share_s": share, "first_idle_s": pool - res.start_s}


PRESETS = {"replay": REPLAY, "live": LIVE}


def replay(scenario: str, preset: str, fair: bool, days: float,
           free_rescales: bool = False, changes: tuple[tuple[str, float], ...] = (),
           day: float | None = None, swf: SwfLog | None = None) -> dict[str, float]:
    """One replay (in a worker process): the figures of the module docstring;
    ``free_rescales``: every job's scale-up and scale-down cost 0 (to the allocator too);
    ``changes``: options set on the preset (``--set``; both allocators); ``day``: the first
    day of the log replayed (``--day``; None: the scenario's); ``swf``: the log of
    ``swf-users``."""
    sc = (SCENARIOS[scenario] if swf is None or scenario != "swf-users"
          else Scenario(scenario, swf.trace, swf.jobs, None, 0.0))
    first = sc.day if day is None else day
    trace = sc.trace(first, days)
    jobs = sc.jobs(first, days)
    if free_rescales:
        jobs = [replace(j, scale_up_s=0.0, scale_down_s=0.0) for j in jobs]
    options = PRESETS[preset].with_(**dict(changes)).with_(fair_share=fair)
    policy = make_policy(POLICY, options)
    assert isinstance(policy, MalleTrainPolicy)
    recorder = Recorder(policy)
    sim = Simulator(trace, jobs, recorder,
                    provider_for(POLICIES[POLICY].curves), until_s=trace.start_s + days * DAY)
    t0 = time.perf_counter()
    res = sim.run()
    wall = time.perf_counter() - t0
    summary = res.summary()
    users = sorted({j.user for j in jobs})
    node_s = [sum(r.node_s for r in res.jobs if r.job.user == u) for u in users]
    work = [sum(r.done / r.job.unit_rate() for r in res.jobs if r.job.user == u) for u in users]
    return {"users": len(users), "jain_node_s": jain(node_s), "jain_work": jain(work),
            **share_figures(recorder.rows, res.end_s), **waits(res, sc.watch),
            "work": float(summary["one_worker_seconds_total"]),  # type: ignore[arg-type]
            "work_per_node_s": sum(work) / max(sum(node_s), 1e-9),
            "lost": sum(r.lost_rescale / r.job.unit_rate() for r in res.jobs),
            "finished": float(summary["jobs_finished"]),  # type: ignore[arg-type]
            "rescales": res.rescales + res.starts, "preempted": res.preemptions,
            "nodes": len(trace.node_names), "events": res.events, "wall_s": wall}


def guard_parity(slice_name: str) -> None:
    """One slice of ``benchmarks/evaluate.py`` with the report guard at its default and off:
    whether holding implausible reports (``core/profiling/plausible.py``) changes a replay."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from evaluate import BY_NAME, SPAN_DAYS, _jobs

    sl = BY_NAME[slice_name]
    rows = []
    for rule in (PlausibleRule(), PlausibleRule(factor=0.0)):
        trace = sl.trace()
        curves = LearnedCurves()
        curves.advisor.settings = replace(curves.advisor.settings, plausible=rule)
        res = Simulator(trace, _jobs(sl.jobs), make_policy(POLICY, REPLAY), curves,
                        until_s=trace.start_s + SPAN_DAYS * DAY).run()
        rows.append((res.summary()["one_worker_seconds_total"], res.rescales))
        print(f"{slice_name} guard factor={rule.factor:g}: one_worker_seconds={rows[-1][0]:.6g} "
              f"rescales={rows[-1][1]}", flush=True)
    print(f"guard_parity {slice_name} identical={rows[0] == rows[1]}")


def decision_time(decisions: int, factor: float, users: int = 50) -> None:
    """Decision time of the preset REPLAY with strict parts and lending at ``factor``
    (``fair_share_lend_factor``), interleaved on ``benchmarks/allocator.py``'s random
    instances (5,000 nodes x 500 jobs) owned by ``users`` users in turn: what lending
    (``core.allocation.fairness.lend_evenly``) adds to a decision."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from allocator import instance, interleaved_ms, with_users

    inputs = [with_users(instance(5000, 500, k, jobs_seed=0), users)
              for k in range(decisions + 1)]
    strict, lend = interleaved_ms([
        (make_policy(POLICY, REPLAY.with_(fair_share_lend_factor=0.0)), inputs),
        (make_policy(POLICY, REPLAY.with_(fair_share_lend_factor=factor)), inputs)])
    print(f"decision time, {users} users, 5000 nodes x 500 jobs, {decisions} decisions: "
          f"lending (factor {factor:g}) p50 {statistics.median(lend):.1f} ms, max "
          f"{max(lend):.1f} ms; strict parts p50 {statistics.median(strict):.1f} ms, max "
          f"{max(strict):.1f} ms")


COLUMNS = ("users", "jain_node_s", "jain_work", "jain_share", "starved", "first_idle_s",
           "first_node_s", "share_s", "work", "work_per_node_s", "lost", "finished", "rescales",
           "preempted", "wall_s")


def _option(text: str) -> tuple[str, float]:
    """``--set OPTION=VALUE``: a numeric field of ``PolicyOptions``."""
    name, sep, value = text.partition("=")
    if not sep or name not in PolicyOptions.__dataclass_fields__:
        raise argparse.ArgumentTypeError(f"expected OPTION=VALUE with a PolicyOptions field, "
                                         f"not {text!r}")
    try:
        return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: not a number: {value!r}") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", action="append", choices=[*sorted(SCENARIOS), "swf-users"])
    ap.add_argument("--swf", type=Path, metavar="FILE",
                    help="scenario swf-users: an SWF log (.swf or .swf.gz) with user ids")
    ap.add_argument("--swf-nodes", type=int, metavar="N", help="--swf's machine size")
    ap.add_argument("--swf-procs-per-node", type=int, default=1, metavar="P")
    ap.add_argument("--jobs", type=Path, default=JOBS,
                    help=f"swf-users' jobs (default {JOBS.relative_to(ROOT)})")
    ap.add_argument("--days", type=float, default=3.0)
    ap.add_argument("--preset", action="append", choices=sorted(PRESETS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--free-rescales", action="store_true",
                    help="every job's rescale costs 0: what fairness costs besides its churn")
    ap.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                    type=_option, help="a PolicyOptions field set on the preset (a number)")
    ap.add_argument("--day", type=float, help="the first day of the log replayed "
                    "(default: ab 14, ricc-users 30, philly-vcs 14)")
    ap.add_argument("--decision-time", type=int, metavar="DECISIONS",
                    help="instead: REPLAY's decision time, strict parts and lending")
    ap.add_argument("--guard-parity", metavar="SLICE",
                    help="instead: an evaluate.py slice with the report guard on and off")
    args = ap.parse_args()
    if args.decision_time:
        decision_time(args.decision_time, dict(args.set).get("fair_share_lend_factor", 8.0))
        return
    if args.guard_parity:
        guard_parity(args.guard_parity)
        return
    swf = None
    if args.swf:
        if not args.swf_nodes:
            ap.error("--swf needs --swf-nodes N (the machine's node count)")
        swf = SwfLog(args.swf, args.swf_nodes, args.swf_procs_per_node, args.jobs)
        swf.jobs(args.day or 0.0, args.days)  # a log without users fails here, not in a worker
    names = args.scenario or (["swf-users"] if swf else list(SCENARIOS))
    if "swf-users" in names and swf is None:
        ap.error("--scenario swf-users needs --swf FILE --swf-nodes N")
    presets = args.preset or list(PRESETS)
    try:  # bad values fail here, not in every worker
        for p in presets:
            PRESETS[p].with_(**dict(args.set))
    except ValueError as err:
        ap.error(str(err))
    runs = [(n, p, fair) for n in names for p in presets for fair in (True, False)]
    with ProcessPoolExecutor(args.workers) as pool:
        results = dict(zip(runs, pool.map(replay, *zip(*runs, strict=True),
                                          [args.days] * len(runs),
                                          [args.free_rescales] * len(runs),
                                          [tuple(args.set)] * len(runs),
                                          [args.day] * len(runs), [swf] * len(runs)),
                                 strict=True))
    print(f"{'scenario':<12} {'preset':<7} {'allocator':<10} "
          + " ".join(f"{c:>12}" for c in COLUMNS))
    worst = {"jain": math.inf, "first": 0.0, "starved": 0.0, "ratio": math.inf}
    for name, preset in ((n, p) for n in names for p in presets):
        fair, blind = results[(name, preset, True)], results[(name, preset, False)]
        for label, r in (("fair", fair), ("user-blind", blind)):
            print(f"{name:<12} {preset:<7} {label:<10} "
                  + " ".join(f"{r[c]:>12.4g}" for c in COLUMNS))
        ratio = fair["work"] / blind["work"] if blind["work"] > 0 else math.nan
        print(f"{name:<12} {preset:<7} throughput fair / user-blind = {ratio:.4f} "
              f"(cost of fairness {100 * (1 - ratio):+.2f} %)")
        worst["jain"] = min(worst["jain"], fair["jain_share"])
        worst["first"] = max(worst["first"], fair["first_node_s"])
        worst["starved"] = max(worst["starved"], fair["starved"])
        worst["ratio"] = min(worst["ratio"], ratio)
    print(f"fairness jain={worst['jain']:.4f} worst_first_node_s={worst['first']:.0f} "
          f"starved_fraction={worst['starved']:.4f} throughput_vs_unfair={worst['ratio']:.4f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""``malletrain simulate``: replay an idle-node trace with malleable jobs under a policy.

The trace is one of: an idle-node CSV (``--idle-trace``), an SWF job log replayed
through FCFS + EASY backfill (``--swf`` with ``--swf-nodes``), or Philly's
per-minute node log (``--philly``). The same core policy, scavenger and profiler
code as the daemon's decide what the jobs get. See ``docs/evaluation.md``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from malletrain.core.policies import policy_names
from malletrain.errors import UserError

if TYPE_CHECKING:
    from malletrain.sim.bounds.bound import Bound
    from malletrain.sim.jobs import SimJob
    from malletrain.sim.nodetypes import NodeTypes
    from malletrain.sim.trace import IdleTrace

log = logging.getLogger(__name__)

def add_replay_arguments(p: argparse.ArgumentParser) -> None:
    """The trace and job flags (shared with ``python -m malletrain.sim.bounds.cli_bound``)."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--idle-trace", metavar="FILE", help="CSV time_s,node,state")
    src.add_argument("--swf", metavar="FILE", help="SWF job log (.swf or .swf.gz)")
    src.add_argument("--philly", metavar="FILE", help="Philly per-minute time,active,total log")
    p.add_argument("--swf-nodes", type=int, metavar="N", help="machine size for --swf")
    p.add_argument("--swf-procs-per-node", type=int, default=1, metavar="P",
                   help="SWF field 5 counts processors: P per node (default 1: it counts nodes)")
    p.add_argument("--jobs", required=True, metavar="FILE", help="jobs YAML")
    p.add_argument("--max-concurrent-jobs", type=int, default=10, metavar="K")
    p.add_argument("--start-s", type=float, default=0.0, metavar="T",
                   help="trace time to start at (SWF: the replay before it only warms the "
                   "machine up)")
    p.add_argument("--until-s", type=float, metavar="T", help="trace time to stop at")


def check_replay_arguments(args: argparse.Namespace) -> None:
    if args.max_concurrent_jobs < 1:
        raise UserError("--max-concurrent-jobs must be at least 1")
    if args.start_s < 0 or (args.until_s is not None and args.until_s <= args.start_s):
        raise UserError("need 0 <= --start-s < --until-s")


def load_trace(args: argparse.Namespace) -> IdleTrace:
    """The trace the flags of :func:`add_replay_arguments` name, sliced at ``--start-s``."""
    from malletrain.sim.counts import read_philly_minutes
    from malletrain.sim.swf import swf_trace
    from malletrain.sim.trace import read_idle_csv, slice_from

    check_replay_arguments(args)
    trace: IdleTrace
    if args.swf:
        if not args.swf_nodes:
            raise UserError("--swf needs --swf-nodes N (the machine's node count)")
        trace = swf_trace(
            args.swf,
            args.swf_nodes,
            start_s=args.start_s,
            until_s=args.until_s,
            procs_per_node=args.swf_procs_per_node,
        )
    elif args.philly:
        trace = read_philly_minutes(args.philly)
    else:
        trace = read_idle_csv(args.idle_trace)
    if not args.swf and args.start_s > 0:
        trace = slice_from(trace, args.start_s)
    return trace


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="replay an idle-node trace with malleable jobs under a policy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_replay_arguments(p)
    p.add_argument(
        "--policy",
        required=True,
        choices=policy_names(),
        help="allocation policy (core/policies.py): %(choices)s",
    )
    p.add_argument("--tfwd-s", type=float, default=10.0, metavar="S", help="FreeTrain look-ahead")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument(
        "--no-rescale-cost",
        action="store_true",
        help="charge nothing for size changes and reclaims (every job's scale_up_s and "
        "scale_down_s set to 0); with --policy no-loss-bound: the loss-free reference",
    )
    p.add_argument(
        "--bound",
        action="store_true",
        help="also compute the proven upper bound on samples_total for this trace and job "
        "set (malletrain.sim.bounds.bound) and print the result as a fraction of it",
    )
    p.add_argument(
        "--bound-time-s",
        type=float,
        default=60.0,
        metavar="S",
        help="time for the bound's multiplier search (default 60); stopping early gives a "
        "looser bound, never a wrong one",
    )
    types = p.add_argument_group("node types (a mixed cluster; jobs give 'curves:' per type)")
    types.add_argument("--node-list", metavar="FILE",
                       help="a GPU node list (Alibaba's sn,cpu_milli,memory_mib,gpu,model): "
                       "the trace's nodes get types in its shares of GPUs, at random")
    types.add_argument("--gpu-models", metavar="MODEL=TYPE,...",
                       help="the list's GPU models to keep, and their type names "
                       "(e.g. P100=p100,V100M16=v100,V100M32=v100; default: every model, "
                       "lower-cased)")
    types.add_argument("--types-seed", type=int, default=0, metavar="N")
    types.add_argument("--hide-types", action="store_true",
                       help="the types set the true rates but the policy is not told them")
    types.add_argument("--prices", metavar="TYPE=PRICE,...",
                       help="price of a node-second per type (summary: cost)")
    types.add_argument("--objective", choices=("throughput", "cost"), default="throughput",
                       help="cost: the policy is told the prices (jobs' rate_target caps)")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None)
    bar.add_argument("--no-progress", dest="progress", action="store_false")
    p.set_defaults(func=run)


def _upper_bound(trace: IdleTrace, jobs: list[SimJob], args: argparse.Namespace) -> Bound | None:
    """The LP bound of :mod:`malletrain.sim.bounds.bound` for this replay, so that the summary
    says how far its policy is from what any policy could reach."""
    from malletrain.sim.bounds.bound import upper_bound
    from malletrain.sim.bounds.bound_inputs import idle_segments

    segments = idle_segments(trace, args.until_s)
    if not segments:
        return None
    return upper_bound(segments, jobs, args.max_concurrent_jobs,
                       submit_origin_s=trace.start_s, time_limit_s=args.bound_time_s)


def _pairs(text: str | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UserError(f"{flag}: expected NAME=VALUE,..., got {item!r}")
        out[key.strip()] = value.strip()
    return out


def node_types(args: argparse.Namespace, n_nodes: int) -> NodeTypes | None:
    """The ``--node-list`` flags as the Simulator's node types (None without a list)."""
    from malletrain.sim.nodetypes import NodeTypes, gpu_counts, types_like

    if not args.node_list:
        if args.gpu_models or args.prices or args.hide_types or args.objective != "throughput":
            raise UserError("--gpu-models, --prices, --hide-types and --objective need "
                            "--node-list")
        return None
    models = _pairs(args.gpu_models, "--gpu-models")
    if not models:
        with open(args.node_list, newline="") as fh:
            models = {m: m.lower() for m in {r.get("model") or "" for r in csv.DictReader(fh)}
                      if m and m != "nan"}
    try:
        prices = {t: float(v) for t, v in _pairs(args.prices, "--prices").items()}
    except ValueError:
        raise UserError(f"--prices: prices are numbers, got {args.prices!r}") from None
    if any(p < 0 for p in prices.values()):
        raise UserError("--prices: a price is not negative")
    kinds = types_like(n_nodes, gpu_counts(args.node_list, models), args.types_seed)
    return NodeTypes(kinds, prices, hidden=args.hide_types, objective=args.objective)


def run(args: argparse.Namespace) -> int:
    from malletrain.core.policies import POLICIES, REPLAY, make_policy
    from malletrain.sim.curves import provider_for
    from malletrain.sim.engine import Simulator
    from malletrain.sim.jobs import parse_jobs
    from malletrain.sim.report import ProgressBar, write_outputs

    if args.policy not in POLICIES:
        raise UserError(f"unknown --policy {args.policy!r}; known: {', '.join(POLICIES)}")
    check_replay_arguments(args)
    if args.tfwd_s <= 0:
        raise UserError("--tfwd-s must be positive")
    jobs = parse_jobs(args.jobs)
    if args.no_rescale_cost:
        jobs = [dataclasses.replace(j, scale_up_s=0.0, scale_down_s=0.0) for j in jobs]
    if args.bound_time_s <= 0:
        raise UserError("--bound-time-s must be positive")
    trace = load_trace(args)
    types = node_types(args, len(trace.node_names))
    bound = _upper_bound(trace, jobs, args) if args.bound else None
    spec = POLICIES[args.policy]
    policy = make_policy(args.policy, REPLAY.with_(tfwd_s=args.tfwd_s))
    until = trace.end_s if args.until_s is None else min(args.until_s, trace.end_s)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    bar = ProgressBar(trace.start_s, until) if show else None
    sim = Simulator(
        trace,
        jobs,
        policy,
        provider_for(spec.curves),
        max_concurrent_jobs=args.max_concurrent_jobs,
        until_s=until,
        progress=bar,
        types=types,
    )
    try:
        result = sim.run()
    finally:
        if bar is not None:
            bar.close()
    result.policy = args.policy
    summary = write_outputs(
        result,
        Path(args.out),
        {
            "curves": spec.curves,
            "tfwd_s": args.tfwd_s,
            "max_concurrent_jobs": args.max_concurrent_jobs,
            "jobs_file": str(args.jobs),
            "rescale_cost": "none" if args.no_rescale_cost else "jobs file",
            "node_list": args.node_list, "node_types_hidden": bool(args.hide_types),
            "objective": args.objective,
            # proven: no policy's samples_total exceeds it on this replay (sim.bound)
            "proven_bound_samples": None if bound is None else bound.samples,
            "proven_bound_gap": None if bound is None else bound.gap,
        },
    )
    print(_result_line(args.policy, summary, bound) + f" -> {args.out}")
    return 0


def _result_line(policy: str, summary: dict[str, object], bound: Bound | None) -> str:
    """The one line ``malletrain simulate`` prints (``of_bound`` with ``--bound``)."""
    line = (
        f"{policy}: samples_total={summary['samples_total']:.6g} "
        f"idle_used_share={summary['idle_used_share']:.3f} rescales={summary['rescales']} "
        f"jobs_finished={summary['jobs_finished']} "
        f"decision_ms_p50={summary['decision_ms_p50']:.2f} "
        f"wall_s={summary['wall_s']:.1f}"
    )
    if bound is not None and bound.samples > 0:
        share = float(summary["samples_total"]) / bound.samples  # type: ignore[arg-type]
        line += f" bound={bound.samples:.6g} of_bound={share:.3f}"
    return line

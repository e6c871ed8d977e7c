"""``python -m malletrain.sim.bounds.cli_bound``: the proven bounds of the replay the flags give.

It takes the trace and job flags of ``malletrain simulate`` and prints both bounds of
:mod:`malletrain.sim.bounds.bound` (docs/evaluation.md, "The proven upper bound").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict

from malletrain.errors import UserError
from malletrain.sim.bounds.bound import Bound, milp_block_s, upper_bound
from malletrain.sim.bounds.bound_inputs import NodeCount, idle_segments
from malletrain.sim.cli_simulate import add_replay_arguments, load_trace
from malletrain.sim.jobs import parse_jobs


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m malletrain.sim.bounds.cli_bound``: the bound of the replay the flags give."""
    ap = argparse.ArgumentParser(
        prog="python -m malletrain.sim.bounds.cli_bound",
        description="A proven upper bound on samples_total for a replay of "
        "`malletrain simulate` with the same trace and job flags (module docstring).",
    )
    add_replay_arguments(ap)
    ap.add_argument(
        "--rounds", type=int, default=200, help="multiplier LP rounds (default 200)"
    )
    ap.add_argument(
        "--time-s", type=float, default=600.0, metavar="S",
        help="time for the multiplier search per bound (default 600; stopping early gives "
        "a looser, never a wrong, bound)",
    )
    ap.add_argument(
        "--milp-s", type=float, default=0.0, metavar="S",
        help="also run the integer-finish MILP, for at most S seconds per bound (default 0: "
        "the LP bound only, seconds; the MILP can take minutes)",
    )
    ap.add_argument(
        "--block-s", type=float, default=3 * 3600.0, metavar="S",
        help="MILP time blocks on traces with more than 500 events (default 10800; "
        "shorter traces get one block per event)",
    )
    ap.add_argument("--json", metavar="FILE", help="also write both bounds as JSON here")
    args = ap.parse_args(argv)
    try:
        jobs = parse_jobs(args.jobs)
        trace = load_trace(args)
    except UserError as exc:  # TraceError is a PermanentError, reported the same way
        ap.error(str(exc))
    segments = idle_segments(trace, args.until_s)
    if not segments:
        ap.error("the trace has no event before --until-s")
    k = args.max_concurrent_jobs
    block_s = milp_block_s(segments, args.block_s)

    def bound(nodes: NodeCount) -> Bound:
        return upper_bound(
            segments, jobs, k, nodes=nodes, rounds=args.rounds, submit_origin_s=trace.start_s,
            milp_s=args.milp_s, block_s=block_s, time_limit_s=args.time_s,
        )

    offered = bound("offered")
    same = all(s.offered == s.idle for s in segments)
    idle = dataclasses.replace(offered, nodes="idle") if same else bound("idle")
    print(_summary(offered, idle))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"offered": asdict(offered), "idle": asdict(idle)}, fh, indent=1)
    return 0


def _summary(offered: Bound, idle: Bound) -> str:
    """The one line ``cli_bound`` prints: both bounds and what they rest on."""
    milp = "not run"
    if offered.samples_milp is not None:
        how = "optimal" if offered.milp_optimal else "HiGHS's bound at the time limit"
        milp = f"{offered.samples_milp:.6g} ({how})"
    return (
        f"bound: samples_total <= {offered.samples:.6g} (policies on offered nodes; LP "
        f"{offered.samples_lp:.6g} within {offered.gap:.2%} of its best, integer finishes "
        f"{milp}), <= {idle.samples:.6g} (any "
        f"plan on idle nodes); LP without the total_samples cap "
        f"{offered.samples_uncapped:.6g}; linear {offered.samples_linear:.6g}; "
        f"{offered.segments} segments, jobs that can run {offered.jobs_admissible} of "
        f"{offered.jobs_total}, can run dry: {'yes' if offered.can_run_dry else 'no'}"
    )


if __name__ == "__main__":
    sys.exit(main())

"""The evaluation of docs/evaluation.md: four policies on real traces, side by side.

Scenarios (trace slice x job set), each run once per policy through the real
``malletrain simulate`` command, outputs under ``out/eval/<scenario>/<policy>/``:

* ``theta-sia``, ``theta-gavel``: ALCF Theta 2022 SWF, replayed through FCFS + EASY
  backfill on 4,360 nodes from day 0, measured on days 150-153;
* ``philly-sia``, ``philly-gavel``: Philly's per-minute idle-node log, days 14-17.

Job sets: ``configs/sim/sia-aws-48.yaml`` and ``configs/sim/gavel-v100-48.yaml``
(48 jobs each, every job 24 h of work at its peak size, all submitted at t=0, 10
admitted at a time: the queue does not run dry within 3 days).

Usage: ``.venv/bin/python benchmarks/evaluate.py [--scenario NAME ...] [--policy NAME ...]
[--plots docs/img]``; prints one Markdown table per scenario (python -m
malletrain.sim.compare) and the last line ``evaluate <scenario>: malletrain/freetrain=<x>
malletrain/equal-share=<y> no-loss-bound/freetrain=<z> no-loss-bound/equal-share=<w>``
per scenario (ratios only for the policies run into that folder).

``no-loss-bound`` is replayed with ``--no-rescale-cost``: the most any policy could make
on the trace with the true curves and free rescales (docs/evaluation.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from malletrain.cli import main as cli
from malletrain.sim.compare import load, table

#: vendored with its source and licence (data/README.md)
DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
THETA = DATA / "alcf-theta-2022.swf"
PHILLY = DATA / "philly-node-usage-per-minute.csv"
DAY = 86400

TRACES: dict[str, list[str]] = {
    "theta": [
        "--swf", str(THETA), "--swf-nodes", "4360",
        "--start-s", str(150 * DAY), "--until-s", str(153 * DAY),
    ],
    "philly": ["--philly", str(PHILLY), "--start-s", str(14 * DAY), "--until-s", str(17 * DAY)],
}
JOBSETS = {
    "sia": "configs/sim/sia-aws-48.yaml",
    "gavel": "configs/sim/gavel-v100-48.yaml",
    "imagenet": "configs/sim/sia-imagenet-48.yaml",
}
POLICIES = ("malletrain", "malletrain-known-curves", "freetrain", "equal-share", "no-loss-bound")
#: Replayed with every rescale and reclaim free: the loss-free reference (docs/evaluation.md).
FREE_RESCALES = {"no-loss-bound"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", action="append", help="e.g. theta-sia (default: all four)")
    ap.add_argument("--policy", action="append", help="default: all five")
    ap.add_argument("--out", default="out/eval")
    ap.add_argument("--plots", help="copy each scenario's timeline PNGs here")
    ap.add_argument("--tfwd-s", default="10")
    args = ap.parse_args()
    scenarios = args.scenario or [f"{t}-{j}" for t in TRACES for j in JOBSETS]
    policies = args.policy or list(POLICIES)
    last: list[str] = []
    for sc in scenarios:
        trace, jobset = sc.split("-", 1)
        for pol in policies:
            out = Path(args.out) / sc / pol
            t0 = time.perf_counter()
            rc = cli(
                [
                    "simulate", *TRACES[trace], "--jobs", JOBSETS[jobset], "--policy", pol,
                    "--tfwd-s", args.tfwd_s, "--out", str(out), "--no-progress",
                    *(["--no-rescale-cost"] if pol in FREE_RESCALES else []),
                ]
            )
            if rc != 0:
                raise SystemExit(f"{sc} {pol}: exit {rc}")
            print(f"  ({sc} {pol}: {time.perf_counter() - t0:.0f} s)", flush=True)
            if args.plots:
                Path(args.plots).mkdir(parents=True, exist_ok=True)
                shutil.copy(out / "timeline.png", Path(args.plots) / f"sim-{sc}-{pol}.png")
        summaries = sorted((Path(args.out) / sc).glob("*/summary.json"))
        print(f"\n### {sc}\n")
        print(table(load(summaries)))
        by = {json.loads(p.read_text())["policy"]: json.loads(p.read_text()) for p in summaries}
        parts = []
        for top in ("malletrain", "no-loss-bound"):
            for base in ("freetrain", "equal-share"):
                if top in by and base in by:
                    ratio = by[top]["samples_total"] / by[base]["samples_total"]
                    parts.append(f"{top}/{base}={ratio:.3f}")
        last.append(f"evaluate {sc}: " + " ".join(parts))
    print()
    print("\n".join(last))


if __name__ == "__main__":
    main()

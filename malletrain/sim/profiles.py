"""Turn measured scaling profiles (Sia/Pollux, Gavel) into simulator job sets.

One simulated node is one data-parallel worker (one GPU in the measurements), so a
curve point ``[n, r]`` is the best measured throughput of the model on ``n`` GPUs.
For Sia/Pollux that is the best over placements and per-GPU batch sizes with ``n``
GPUs in all (as in the data folder's DERIVED file); for Gavel it is steps/s summed
over workers times the per-worker batch size, one curve per (model, batch size).
Curves are made non-decreasing (a job can leave surplus workers idle) and cut at
their peak: a malleable job never wants more workers than that, and a falling curve
is rejected by the jobs reader.

Run ``python -m malletrain.sim.profiles --help`` to write a jobs YAML.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import logging
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from malletrain.errors import UserError
from malletrain.sim.jobs import SimJob, dump_jobs
from malletrain.sim.trace import input_error

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Profile:
    """A measured throughput curve: (workers, samples/s), non-decreasing, cut at its peak."""

    name: str
    curve: tuple[tuple[int, float], ...]


def monotone_envelope(points: dict[int, float]) -> tuple[tuple[int, float], ...]:
    """The running maximum of a measured curve, cut at its peak.

    A job given more workers than help can leave the extra ones idle, so its
    throughput at ``n`` is the best measured at any size up to ``n`` (placements that
    cross a server boundary are often slower than the size below). Beyond the first
    peak more workers never pay, so the curve (and ``max_nodes``) ends there.
    """
    if not points:
        return ()
    peak_n = min(n for n in points if points[n] == max(points.values()))
    out: list[tuple[int, float]] = []
    best = 0.0
    for n in sorted(points):
        if n > peak_n:
            break
        best = max(best, round(points[n], 3))
        out.append((n, best))
    return tuple(out)


def _float(path: Path, line: int, row: dict[str, str], field: str) -> float:
    try:
        return float(row[field])
    except (KeyError, TypeError, ValueError):
        what = f"missing or not a number: {row.get(field)!r}"
        raise input_error(path, line, field, what) from None


def sia_profiles(root: str | Path, cluster: str = "aws") -> list[Profile]:
    """One profile per model from ``<model>/{placements,scalability}-<cluster>.csv``."""
    base = Path(root)
    out: list[Profile] = []
    for model_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        best: dict[int, float] = {}
        for kind in ("placements", "scalability"):
            path = model_dir / f"{kind}-{cluster}.csv"
            if not path.exists():
                continue
            with path.open() as fh:
                for line, row in enumerate(csv.DictReader(fh), start=2):
                    if kind == "placements":
                        placement = row.get("placement", "")
                        if not placement.isdigit():
                            raise input_error(path, line, "placement", f"not digits: {placement!r}")
                        gpus = sum(int(c) for c in placement)
                    else:
                        gpus = int(_float(path, line, row, "num_replicas"))
                    bsz = _float(path, line, row, "local_bsz")
                    step = _float(path, line, row, "step_time")
                    if step <= 0 or gpus <= 0:
                        continue
                    best[gpus] = max(best.get(gpus, 0.0), gpus * bsz / step)
        if best:
            out.append(Profile(f"sia-{model_dir.name}-{cluster}", monotone_envelope(best)))
    if not out:
        raise input_error(base, None, cluster, f"no *-{cluster}.csv profiles found")
    return out


def gavel_profiles(path: str | Path, worker_type: str = "v100_unconsolidated") -> list[Profile]:
    """One profile per (model, batch size) with isolated (``"null"``) throughputs."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise input_error(p, exc.lineno, "json", f"malformed JSON: {exc.msg}") from None
    if worker_type not in data:
        raise input_error(p, None, worker_type, f"no such worker type; have {sorted(data)}")
    curves: dict[tuple[str, int], dict[int, float]] = {}
    for key, entry in data[worker_type].items():
        try:
            label, scale = ast.literal_eval(key)
        except (ValueError, SyntaxError):
            raise input_error(p, None, key, "expected \"('<model> (batch size B)', n)\"") from None
        if "(batch size " not in label or not isinstance(entry, dict) or "null" not in entry:
            continue  # A3C and CycleGAN: no batch size, no samples/s
        model, _, rest = label.partition(" (batch size ")
        bsz = int(rest.rstrip(")"))
        curves.setdefault((model, bsz), {})[int(scale)] = float(entry["null"]) * bsz
    return [
        Profile(f"gavel-{model.lower()}-b{bsz}", monotone_envelope(points))
        for (model, bsz), points in sorted(curves.items())
    ]


def build_job_set(
    profiles: Sequence[Profile],
    count: int,
    *,
    hours_at_max: float,
    scale_up_s: float,
    scale_down_s: float,
    min_max_nodes: int = 2,
    mean_interarrival_s: float = 0.0,
    seed: int = 0,
) -> list[SimJob]:
    """``count`` jobs cycling through the profiles (shuffled with ``seed``).

    Each job's work is ``hours_at_max`` hours at its peak size, so a set does not run
    dry within a trace of known length. Profiles that do not scale to at least
    ``min_max_nodes`` workers are left out (nothing to allocate).
    """
    usable = [p for p in profiles if p.curve and p.curve[-1][0] >= min_max_nodes]
    if not usable:
        raise UserError(f"no profile scales to {min_max_nodes} or more workers")
    rng = random.Random(seed)
    order = list(usable)
    rng.shuffle(order)
    jobs: list[SimJob] = []
    t = 0.0
    for i in range(count):
        prof = order[i % len(order)]
        peak_n, peak_r = prof.curve[-1]
        jobs.append(
            SimJob(
                name=f"{prof.name}-{i:03d}",
                submit_s=round(t, 1),
                min_nodes=1,
                max_nodes=peak_n,
                total_samples=float(round(peak_r * hours_at_max * 3600.0)),
                scale_up_s=scale_up_s,
                scale_down_s=scale_down_s,
                curve=prof.curve,
            )
        )
        if mean_interarrival_s > 0:
            t += rng.expovariate(1.0 / mean_interarrival_s)
    return jobs


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m malletrain.sim.profiles",
        description="Write a simulator jobs YAML from measured Sia/Pollux and Gavel profiles.",
    )
    ap.add_argument("--sia", metavar="DIR", help="scalability-profiles/sia-pollux folder")
    ap.add_argument("--sia-cluster", default="aws", help="Sia cluster profile (default aws)")
    ap.add_argument("--gavel", metavar="FILE", help="gavel/simulation_throughputs.json")
    ap.add_argument("--gavel-worker", default="v100_unconsolidated")
    ap.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="NAME",
        help="leave out profiles whose name contains NAME (repeatable)",
    )
    ap.add_argument("--jobs", type=int, default=40, help="number of jobs (default 40)")
    ap.add_argument("--hours-at-max", type=float, default=24.0)
    ap.add_argument("--scale-up-s", type=float, default=18.0)
    ap.add_argument("--scale-down-s", type=float, default=12.0)
    ap.add_argument("--mean-interarrival-s", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="jobs YAML to write")
    args = ap.parse_args(argv)
    try:
        profiles: list[Profile] = []
        if args.sia:
            profiles += sia_profiles(args.sia, args.sia_cluster)
        if args.gavel:
            profiles += gavel_profiles(args.gavel, args.gavel_worker)
        profiles = [p for p in profiles if not any(x in p.name for x in args.exclude)]
        if not profiles:
            raise UserError("no profiles: give --sia DIR and/or --gavel FILE (and fewer --exclude)")
        jobs = build_job_set(
            profiles,
            args.jobs,
            hours_at_max=args.hours_at_max,
            scale_up_s=args.scale_up_s,
            scale_down_s=args.scale_down_s,
            mean_interarrival_s=args.mean_interarrival_s,
            seed=args.seed,
        )
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    Path(args.out).write_text(dump_jobs(jobs))
    used = sorted({j.name.rsplit("-", 1)[0] for j in jobs})
    print(f"wrote {len(jobs)} jobs from {len(used)} profiles to {args.out}: {', '.join(used)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

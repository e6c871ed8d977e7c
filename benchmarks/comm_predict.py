"""How well a job's throughput at node counts never run is predicted (issue 19, part 3).

Data: Pollux's measured step and sync times of five models on AWS g4dn.12xlarge (4 T4 GPUs
per node; ``data/profiles/sia-pollux/<model>/{placements,scalability}-aws.csv``, vendored
with their source). For every model and local batch size measured at all of 1, 2, 3, 4, 6,
8, 12 and 16 whole nodes (4 GPUs each):

* "measured" = what a job would have run first: 1 to 4 nodes (``--measured``);
* predicted at the rest (6 to 16 nodes) by
  - the communication-aware model (:mod:`malletrain.core.profiling.comm`: compute per step constant,
    sync = a + b g(n), fitted to the measured sync times), and
  - the baseline in the same run: the Profiling Advisor's curve (:func:`fit_curve`: the
    concave fit of the measured rates, extended beyond the last size at the last slope
    times ``optimism`` 1.0, its default);
* error = |predicted - measured| / measured throughput (samples/s = 4 n x batch / step).

Last line: ``comm_predict cases=C err_unseen_median=X baseline_err_median=Y`` (the target
of issue 19: the median within 10 %).

Run: ``.venv/bin/python benchmarks/comm_predict.py`` (a second).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from malletrain.core.profiling.comm import StepTimes, fit_comm  # noqa: E402
from malletrain.core.profiling.profile import fit_curve  # noqa: E402

DATA = REPO / "data" / "profiles" / "sia-pollux"
MODELS = ("bert", "cifar10", "deepspeech2", "imagenet", "yolov3")
GPUS_PER_NODE = 4
SIZES = (1, 2, 3, 4, 6, 8, 12, 16)


def whole_node_rows(model: str) -> dict[tuple[int, int], list[tuple[float, float]]]:
    """(local batch, nodes) -> [(step_s, sync_s)] for placements of whole 4-GPU nodes."""
    rows: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    with open(DATA / model / "placements-aws.csv") as f:
        for r in csv.DictReader(f):
            if set(r["placement"]) == {str(GPUS_PER_NODE)}:
                rows[(int(r["local_bsz"]), len(r["placement"]))].append(
                    (float(r["step_time"]), float(r["sync_time"])))
    with open(DATA / model / "scalability-aws.csv") as f:
        for r in csv.DictReader(f):
            if int(r["num_replicas"]) == GPUS_PER_NODE * int(r["num_nodes"]):
                rows[(int(r["local_bsz"]), int(r["num_nodes"]))].append(
                    (float(r["step_time"]), float(r["sync_time"])))
    return rows


def cases(measured: tuple[int, ...]) -> list[tuple[str, int, int, float, float, float]]:
    """(model, batch, nodes, true rate, comm prediction, baseline prediction) per case."""
    out = []
    for model in MODELS:
        rows = whole_node_rows(model)
        for bsz in sorted({b for b, _ in rows}):
            if not all((bsz, n) in rows for n in SIZES):
                continue
            mean = {n: (statistics.fmean(s for s, _ in rows[(bsz, n)]),
                        statistics.fmean(y for _, y in rows[(bsz, n)])) for n in SIZES}
            per_node = GPUS_PER_NODE * bsz
            rate = {n: n * per_node / mean[n][0] for n in SIZES}
            fit = fit_comm({n: StepTimes(mean[n][0] - mean[n][1], mean[n][1], per_node)
                            for n in measured})
            curve = fit_curve({n: (rate[n], 1.0) for n in measured}, optimism=1.0)
            assert fit is not None
            for n in SIZES:
                if n not in measured:
                    out.append((model, bsz, n, rate[n], fit.rate(n), curve.rate(n)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measured", default="1,2,3,4",
                    help="the node counts the fit sees (the rest are predicted)")
    ap.add_argument("--verbose", action="store_true", help="one line per case")
    args = ap.parse_args()
    measured = tuple(int(x) for x in args.measured.split(","))
    got = cases(measured)
    errs = [abs(p - t) / t for _, _, _, t, p, _ in got]
    base = [abs(b - t) / t for _, _, _, t, _, b in got]
    for model in MODELS:
        e = [abs(p - t) / t for m, _, _, t, p, _ in got if m == model]
        b = [abs(q - t) / t for m, _, _, t, _, q in got if m == model]
        if e:
            print(f"{model:12s} cases={len(e):3d} comm median {statistics.median(e):.3f} "
                  f"max {max(e):.3f} | curve median {statistics.median(b):.3f} "
                  f"max {max(b):.3f}")
    if args.verbose:
        for m, bsz, n, t, p, q in got:
            print(f"  {m} bsz={bsz} n={n}: true {t:.1f} comm {p:.1f} curve {q:.1f}")
    print(f"measured at {measured}, predicted at the other sizes of {SIZES}")
    print(f"comm_predict cases={len(got)} err_unseen_median={statistics.median(errs):.3f} "
          f"baseline_err_median={statistics.median(base):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

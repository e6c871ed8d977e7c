"""Side-by-side table of simulation summaries (the tables in docs/evaluation.md).

``python -m malletrain.sim.compare DIR/*/summary.json`` prints one Markdown row per
policy: samples as a ratio to ``freetrain`` and to ``equal-share`` (when present),
the same for single-worker-seconds (samples divided by each job's one-worker rate,
which weighs models of very different samples/s alike), the share of idle
node-seconds the jobs used, rescales, preemptions, decision times and the linear
upper bound (idle node-seconds x the best per-node throughput of any job).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

ORDER = ("malletrain", "malletrain-known-curves", "freetrain", "equal-share", "no-loss-bound")


def load(paths: Sequence[str | Path]) -> list[dict[str, object]]:
    rows = [json.loads(Path(p).read_text()) for p in paths]
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(rows, key=lambda s: (rank.get(str(s["policy"]), 99), str(s["policy"])))


def _ratio(a: object, b: object) -> str:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or b == 0:
        return "-"
    return f"{a / b:.3f}"


def table(rows: list[dict[str, object]]) -> str:
    by = {str(s["policy"]): s for s in rows}
    ft = by.get("freetrain", {})
    es = by.get("equal-share", {})
    head = (
        "| policy | samples | ÷ freetrain | ÷ equal-share | worker-s ÷ freetrain | "
        "worker-s ÷ equal-share | idle used | of upper bound | rescales | preemptions | "
        "finished | decision p50 / max ms |"
    )
    out = [head, "|" + "---|" * 12]
    for s in rows:
        out.append(
            f"| {s['policy']} | {float(s['samples_total']):.4g} "  # type: ignore[arg-type]
            f"| {_ratio(s['samples_total'], ft.get('samples_total'))} "
            f"| {_ratio(s['samples_total'], es.get('samples_total'))} "
            f"| {_ratio(s['one_worker_seconds_total'], ft.get('one_worker_seconds_total'))} "
            f"| {_ratio(s['one_worker_seconds_total'], es.get('one_worker_seconds_total'))} "
            f"| {float(s['idle_used_share']):.3f} "  # type: ignore[arg-type]
            f"| {_ratio(s['samples_total'], s['upper_bound_samples'])} "
            f"| {s['rescales']} | {s['preemptions']} | {s['jobs_finished']}/{s['jobs_admitted']} "
            f"| {float(s['decision_ms_p50']):.2f} / {float(s['decision_ms_max']):.0f} |"  # type: ignore[arg-type]
        )
    first = rows[0] if rows else {}
    if first:
        out.append("")
        out.append(
            f"idle node-seconds {float(first['idle_node_seconds']):.4g}, "  # type: ignore[arg-type]
            f"linear upper bound {float(first['upper_bound_samples']):.4g} samples, "  # type: ignore[arg-type]
            + (f"proven upper bound {float(proven):.4g} samples (sim.bound), "  # type: ignore[arg-type]
               if (proven := first.get("proven_bound_samples")) is not None else "")
            + f"{first['events']} events"
        )
    return "\n".join(out)


def plot_ratios(paths: Sequence[Path], out: Path) -> None:
    """Grouped bars: samples of each policy / freetrain's, one group per scenario folder."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, dict[str, float]] = {}
    for p in paths:
        s = json.loads(p.read_text())
        groups.setdefault(p.parent.parent.name, {})[str(s["policy"])] = float(s["samples_total"])
    names = sorted(groups)
    fig, ax = plt.subplots(figsize=(8, 3.2), dpi=80)
    width = 0.8 / len(ORDER)
    for k, pol in enumerate(ORDER):
        vals = [
            groups[g][pol] / groups[g]["freetrain"]
            if pol in groups[g] and groups[g].get("freetrain")
            else 0.0
            for g in names
        ]
        offset = (k - (len(ORDER) - 1) / 2) * width
        ax.bar([i + offset for i in range(len(names))], vals, width, label=pol)
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.axhline(1.05, color="grey", linewidth=0.6, linestyle="--")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("samples / freetrain's")
    ax.legend(fontsize=7, ncol=len(ORDER), loc="upper center", bbox_to_anchor=(0.5, 1.18))
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    plot: Path | None = None
    if len(args) >= 2 and args[0] == "--plot":
        plot, args = Path(args[1]), args[2:]
    if not args:
        print(
            "usage: python -m malletrain.sim.compare [--plot FILE.png] DIR/*/summary.json",
            file=sys.stderr,
        )
        return 2
    if plot is not None:
        plot_ratios([Path(a) for a in args], plot)
        return 0
    print(table(load(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

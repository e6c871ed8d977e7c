"""What a simulation leaves behind: summary.json, timeline CSVs, a PNG plot, a progress bar."""

from __future__ import annotations

import csv
import json
import logging
import sys
import time
from pathlib import Path
from typing import TextIO

from malletrain.sim.result import Result

log = logging.getLogger(__name__)


def write_outputs(result: Result, out_dir: Path, extra: dict[str, object]) -> dict[str, object]:
    """Write summary.json, timeline.csv, job_nodes.csv and timeline.png; return the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {**result.summary(), **extra}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    with (out_dir / "timeline.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time_s", "idle_nodes", "used_nodes", "running_jobs", "samples_total"])
        for s in result.timeline:
            w.writerow(
                [_num(s.time_s), s.idle_nodes, s.used_nodes, s.running_jobs,
                 f"{s.samples_total:.6g}"]
            )
    with (out_dir / "job_nodes.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time_s", "job", "nodes", "cause"])
        for c in result.job_nodes:
            w.writerow([_num(c.time_s), c.job, c.nodes, c.cause])
    plot_timeline(result, out_dir / "timeline.png")
    return summary


def _num(x: float) -> str:
    """Seconds with up to microsecond digits, no exponent (``%g`` rounds 1216680 to 1.21668e+06)."""
    return f"{x:.6f}".rstrip("0").rstrip(".")


def plot_timeline(result: Result, path: Path, max_points: int = 4000) -> None:
    """Idle nodes (line) over each job's nodes (stacked steps), hours on the x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    if not result.timeline:
        return
    t = np.array([s.time_s for s in result.timeline])
    idle = np.array([s.idle_nodes for s in result.timeline])
    # Each job's node count at every timeline time (step function from job_nodes).
    names = list(dict.fromkeys(c.job for c in result.job_nodes))
    stack = np.zeros((len(names), len(t)))
    pos = {n: i for i, n in enumerate(names)}
    changes = sorted(result.job_nodes, key=lambda c: c.time_s)
    for name in names:
        ct = np.array([c.time_s for c in changes if c.job == name])
        cn = np.array([c.nodes for c in changes if c.job == name])
        k = np.searchsorted(ct, t, side="right") - 1
        stack[pos[name]] = np.where(k >= 0, cn[np.clip(k, 0, None)], 0)
    step = max(1, len(t) // max_points)
    th = (t[::step] - t[0]) / 3600.0
    fig, ax = plt.subplots(figsize=(8, 3.2), dpi=72)
    if names:
        ax.stackplot(th, stack[:, ::step], step="post", linewidth=0, alpha=0.85)
    ax.step(th, idle[::step], where="post", color="black", linewidth=0.8, label="idle nodes")
    ax.set_xlabel("hours")
    ax.set_ylabel("nodes")
    ax.set_title(f"{result.policy}: idle nodes and each job's nodes", fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    ax.margins(x=0)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


class ProgressBar:
    """A one-line ``[####    ] 42%`` bar on stderr, redrawn at most every ``every_s``."""

    def __init__(
        self, start_s: float, end_s: float, stream: TextIO | None = None, every_s: float = 0.5
    ) -> None:
        self.start_s = start_s
        self.span = max(end_s - start_s, 1e-9)
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = every_s
        self._last = 0.0
        self._wall0 = time.monotonic()

    def __call__(self, sim_t: float) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        frac = min(1.0, max(0.0, (sim_t - self.start_s) / self.span))
        width = 30
        fill = int(frac * width)
        elapsed = now - self._wall0
        eta = elapsed * (1 - frac) / frac if frac > 0 else 0.0
        self.stream.write(
            f"\r[{'#' * fill}{' ' * (width - fill)}] {frac * 100:5.1f}% "
            f"sim {(sim_t - self.start_s) / 3600:7.1f} h  wall {elapsed:6.1f} s  eta {eta:6.1f} s"
        )
        self.stream.flush()

    def close(self) -> None:
        self._last = 0.0
        self.stream.write("\n")
        self.stream.flush()

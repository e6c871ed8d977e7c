"""Communication-aware step model: a step's compute and synchronisation, per node count.

Why: a throughput curve fitted to measured sizes only (:mod:`.profile`) says
nothing about a size never run but an optimistic bound. A data-parallel step splits into
compute (each node's share of the batch: the same per step when each node trains a fixed
local batch, the way DDP and malletrain's workers do) and the gradient all-reduce, whose
time grows with the node count in a known shape. Measuring the two apart at a few sizes
predicts the others (the communication-optimisation survey's model; Pollux's measurements
of step and sync time are its test data here, ``benchmarks/hetero.py``).

The model, per step, with ``n`` nodes::

    step_s(n) = compute_s + sync_s(n),   sync_s(n) = a + b * g(n)
    g(n) = log2(n)        (tree / latency-bound all-reduce)   or
    g(n) = (n - 1) / n    (ring, bandwidth-bound: 2 (n-1)/n of the gradient crosses each link)

fitted over the sizes of two nodes and more (one node synchronises inside the node, if at
all: its own measured time is used for it). ``a, b >= 0`` by weighted least squares on the
sizes' mean sync times, for each shape; the shape with the smaller residual wins (log2 on
a tie: two sizes fit both exactly). With one multi-node size, log2 through the origin
(``a = 0``): it grows without bound, so a prediction errs on the cautious side.
Throughput at ``n`` is ``n * samples_per_step_per_node / step_s(n)``. The fit carries the
residual's standard deviation, so a caller can tell how far to trust it
(:meth:`CommFit.sync_sd_s`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from malletrain.core.model import ThroughputModel

SHAPES: dict[str, Callable[[int], float]] = {
    "log2": lambda n: math.log2(n),
    "ring": lambda n: (n - 1) / n,
}


@dataclass(frozen=True)
class StepTimes:
    """Mean times of one node count's measured steps."""

    compute_s: float
    sync_s: float
    #: samples per step on each node (the local batch)
    samples_per_node: float
    #: how much evidence (steps or seconds): the fit's weight
    weight: float = 1.0


@dataclass(frozen=True)
class CommFit:
    compute_s: float
    sync_a_s: float
    sync_b_s: float
    shape: str
    samples_per_node: float
    #: standard deviation of the sync residuals (seconds); 0 with an exact fit
    residual_s: float
    sizes: tuple[int, ...]
    #: measured sync time on one node (None: not measured; then the fit's a)
    one_node_sync_s: float | None = None

    def sync_s(self, n: int) -> float:
        if n == 1:
            return self.one_node_sync_s if self.one_node_sync_s is not None else self.sync_a_s
        return self.sync_a_s + self.sync_b_s * SHAPES[self.shape](n)

    def step_s(self, n: int) -> float:
        return self.compute_s + self.sync_s(n)

    def rate(self, n: int) -> float:
        """Predicted samples per second of the whole job at ``n`` nodes."""
        if n <= 0:
            return 0.0
        return n * self.samples_per_node / self.step_s(n)

    def sync_sd_s(self) -> float:
        return self.residual_s


def _fit_shape(points: list[tuple[int, float, float]], g: Callable[[int], float]
               ) -> tuple[float, float, float]:
    """Weighted least squares of sync = a + b g(n) with a, b >= 0: (a, b, rms residual)."""
    sw = sum(w for _, _, w in points)
    xs = [(g(n), y, w) for n, y, w in points]
    mx = sum(x * w for x, _, w in xs) / sw
    my = sum(y * w for _, y, w in xs) / sw
    sxx = sum(w * (x - mx) ** 2 for x, _, w in xs)
    b = sum(w * (x - mx) * (y - my) for x, y, w in xs) / sxx if sxx > 0 else 0.0
    b = max(0.0, b)
    a = my - b * mx
    if a < 0:  # refit through the origin
        a = 0.0
        sxx0 = sum(w * x * x for x, _, w in xs)
        b = max(0.0, sum(w * x * y for x, y, w in xs) / sxx0) if sxx0 > 0 else 0.0
    rss = sum(w * (a + b * x - y) ** 2 for x, y, w in xs) / sw
    return a, b, math.sqrt(rss)


def _through_origin(points: list[tuple[int, float, float]], g: Callable[[int], float]
                    ) -> tuple[float, float, float]:
    sxx = sum(w * g(n) ** 2 for n, _, w in points)
    b = sum(w * g(n) * y for n, y, w in points) / sxx if sxx > 0 else 0.0
    sw = sum(w for _, _, w in points)
    rss = sum(w * (b * g(n) - y) ** 2 for n, y, w in points) / sw
    return 0.0, max(0.0, b), math.sqrt(rss)


def fit_comm(measured: Mapping[int, StepTimes]) -> CommFit | None:
    """The model through the measured node counts; None without a size above 1 (a single
    node says nothing about synchronisation across nodes)."""
    sizes = sorted(n for n, t in measured.items() if n > 0 and t.weight > 0)
    multi = [n for n in sizes if n >= 2]
    if not multi:
        return None
    total_w = sum(measured[n].weight for n in sizes)
    compute = sum(measured[n].compute_s * measured[n].weight for n in sizes) / total_w
    per_node = sum(measured[n].samples_per_node * measured[n].weight for n in sizes) / total_w
    points = [(n, measured[n].sync_s, measured[n].weight) for n in multi]
    one = measured[1].sync_s if 1 in sizes else None
    if len(multi) < 2:
        a, b, res = _through_origin(points, SHAPES["log2"])
        return CommFit(compute, a, b, "log2", per_node, res, tuple(sizes), one)
    best: CommFit | None = None
    for shape, g in SHAPES.items():
        a, b, res = _fit_shape(points, g)
        fit = CommFit(compute, a, b, shape, per_node, res, tuple(sizes), one)
        if best is None or res < best.residual_s - 1e-12:
            best = fit
    return best


def temper(model: ThroughputModel, fit: CommFit | None, span: int = 4, most: int = 64
           ) -> ThroughputModel:
    """The curve beyond its last point made no more optimistic than the step model predicts.

    The Profiling Advisor extends a curve past the largest measured size optimistically
    (so that larger sizes get tried). Where the job's measured synchronisation says a size
    will scale worse, the allocator should believe that instead: points are added from
    the last point up to ``span`` times its size (at most ``most`` more), each the lower of
    the optimistic extension and the last point's rate scaled as the model predicts. The
    prediction only lowers the curve, so a poor fit never makes a size look better than
    the advisor thought; ``measured_max_nodes`` is kept, so they stay unmeasured sizes.
    """
    if fit is None or not model.points:
        return model
    n0, r0 = model.points[-1]
    p0 = fit.rate(n0)
    if n0 < 1 or p0 <= 0:
        return model
    pts = list(model.points)
    prev = r0
    for n in range(n0 + 1, min(span * n0, n0 + most) + 1):
        prev = max(prev, min(model.rate(n), r0 * fit.rate(n) / p0))
        pts.append((n, prev))
    return ThroughputModel(tuple(pts), model.optimistic_slope, model.measured_max_nodes)


#: a measured spread factor is never taken below this (one bad report must not make a
#: job worth nothing across switches)
MIN_SPREAD_FACTOR = 0.05


def spread_factor(packed: Mapping[int, StepTimes], spread: Mapping[int, StepTimes]) -> float:
    """A job's rate across switches relative to one switch, from its step times.

    At each size measured spread, its rate per node (samples per node over the step) over
    the packed rate at the same size (measured, else predicted by the packed steps' fit),
    weighted by the spread evidence; 1.0 where nothing compares yet. Clipped to
    [``MIN_SPREAD_FACTOR``, 1]: spreading is never taken to help.
    """
    fit = fit_comm(packed)
    num = den = 0.0
    for n, t in spread.items():
        step = t.compute_s + t.sync_s
        if t.weight <= 0 or step <= 0:
            continue
        p = packed.get(n)
        if p is not None and p.weight > 0 and p.compute_s + p.sync_s > 0:
            packed_rate = p.samples_per_node / (p.compute_s + p.sync_s)
        elif fit is not None and fit.step_s(n) > 0:
            packed_rate = fit.samples_per_node / fit.step_s(n)
        else:
            continue
        if packed_rate <= 0:
            continue
        num += t.weight * (t.samples_per_node / step) / packed_rate
        den += t.weight
    if den <= 0:
        return 1.0
    return min(1.0, max(MIN_SPREAD_FACTOR, num / den))

"""A job kind's measured throughput: rates per node count, and the monotone curve fitted to them.

Kept per kind (the model a job trains) so that a new job of a known kind starts with what
its predecessors measured; persisted by the daemon as a small JSON document.

The model (:func:`fit_curve`): weighted isotonic regression over the measured sizes, then
the least concave majorant through (0, 0); between sizes linear, beyond the largest
measured size an optimistic extension whose slope is the last measured marginal (the most
a concave curve allows) times ``optimism``. The allocator therefore sees untried larger
sizes as worth at most what concavity permits, tries them when that pays, and the
measurement replaces the optimism (optimism in the face of uncertainty, bounded by
concavity).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from malletrain.core.model import ThroughputModel
from malletrain.core.profiling.comm import StepTimes
from malletrain.core.profiling.plausible import PlausibleRule

PROFILE_VERSION = 1


@dataclass
class WeightedSum:
    total: float = 0.0
    weight: float = 0.0

    def add(self, value: float, weight: float = 1.0) -> None:
        self.total += value
        self.weight += weight

    def mean(self) -> float | None:
        return self.total / self.weight if self.weight > 0 else None


@dataclass
class Profile:
    """What is known about one job or one kind of job."""

    #: size -> (samples, seconds) measured after warm-up
    clean: dict[int, WeightedSum] = field(default_factory=dict)
    #: size -> (samples, seconds) measured during warm-up (used only where nothing clean exists)
    dirty: dict[int, WeightedSum] = field(default_factory=dict)
    scale_up_s: WeightedSum = field(default_factory=WeightedSum)
    scale_down_s: WeightedSum = field(default_factory=WeightedSum)
    #: seconds of the new rate lost when the job started from zero nodes
    start_s: WeightedSum = field(default_factory=WeightedSum)
    #: size -> sums of the workers' reported step split, [compute_s, sync_s,
    #: samples per node per step, reports] (the communication-aware model, core/profiling/comm.py)
    steps: dict[int, list[float]] = field(default_factory=dict)
    #: the same, for steps of groups that spanned two or more switches (``steps`` holds
    #: those of groups on one switch, or where the topology is unknown)
    spread_steps: dict[int, list[float]] = field(default_factory=dict)

    def add_step(self, nodes: int, step_s: float, sync_s: float, per_node: float,
                 spread: bool = False) -> None:
        book = self.spread_steps if spread else self.steps
        sums = book.setdefault(nodes, [0.0, 0.0, 0.0, 0.0])
        for k, v in enumerate((max(0.0, step_s - sync_s), sync_s, per_node, 1.0)):
            sums[k] += v

    def step_times(self, spread: bool = False) -> dict[int, StepTimes]:
        """Mean step split per size (for :func:`malletrain.core.profiling.comm.fit_comm`)."""
        book = self.spread_steps if spread else self.steps
        return {n: StepTimes(c / w, y / w, b / w, w)
                for n, (c, y, b, w) in book.items() if w > 0}

    def rates(self, min_warmup_s: float = 0.0) -> dict[int, tuple[float, float]]:
        """size -> (samples/s, seconds of evidence).

        Warm-up ("dirty") intervals carry the rescale's stall, so they understate the
        rate at their size. A size seen only during warm-up counts only with at least
        ``min_warmup_s`` seconds of it, unless nothing clean is known at all (a job
        that never ran a clean interval still needs *some* rate to compete with). Live, a
        stint of a second or two is mostly stall: on the dev cluster one such stint at 2
        nodes, pooled for the kind, made 2 nodes look "no faster" than 1, the fit went flat
        and the daemon never regrew the jobs. Below the threshold the size counts as
        untried, so the fitted curve's optimistic extension gets it measured properly. In
        replays every stint counts (threshold 0): there the warm-up evidence tempers that
        optimism, and dropping short stints cost 0.6 % of the samples on philly-gavel.
        """
        clean = {n: s for n, s in self.clean.items() if s.weight > 0}
        out = {n: (s.total / s.weight, s.weight) for n, s in clean.items()}
        for n, src in self.dirty.items():
            if n in out or src.weight <= 0 or (clean and src.weight < min_warmup_s):
                continue
            out[n] = (src.total / src.weight, src.weight)
        return out

    def merge(self, other: Profile) -> None:
        for mine, theirs in ((self.clean, other.clean), (self.dirty, other.dirty)):
            for n, s in theirs.items():
                mine.setdefault(n, WeightedSum()).add(s.total, s.weight)
        self.scale_up_s.add(other.scale_up_s.total, other.scale_up_s.weight)
        self.scale_down_s.add(other.scale_down_s.total, other.scale_down_s.weight)
        self.start_s.add(other.start_s.total, other.start_s.weight)
        for mine_s, theirs_s in ((self.steps, other.steps),
                                 (self.spread_steps, other.spread_steps)):
            for n, sums in theirs_s.items():
                acc = mine_s.setdefault(n, [0.0, 0.0, 0.0, 0.0])
                for k, v in enumerate(sums):
                    acc[k] += v

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": PROFILE_VERSION,
            "clean": {str(n): [s.total, s.weight] for n, s in sorted(self.clean.items())},
            "dirty": {str(n): [s.total, s.weight] for n, s in sorted(self.dirty.items())},
            "scale_up_s": [self.scale_up_s.total, self.scale_up_s.weight],
            "scale_down_s": [self.scale_down_s.total, self.scale_down_s.weight],
            "start_s": [self.start_s.total, self.start_s.weight],
            "steps": {str(n): list(v) for n, v in sorted(self.steps.items())},
            "spread_steps": {str(n): list(v) for n, v in sorted(self.spread_steps.items())},
        }

    @classmethod
    def from_dict(cls, data: Any) -> Profile:
        """Parse a stored profile; ValueError naming the bad field."""
        if not isinstance(data, dict):
            raise ValueError("profile: expected a mapping")
        if data.get("version") != PROFILE_VERSION:
            raise ValueError(f"profile: unsupported version {data.get('version')!r}")
        prof = cls()
        for key, target in (("clean", prof.clean), ("dirty", prof.dirty)):
            raw = data.get(key, {})
            if not isinstance(raw, dict):
                raise ValueError(f"profile: {key!r} must be a mapping")
            for n_str, pair in raw.items():
                target[_size(n_str, key)] = _pair(pair, f"{key}[{n_str}]")
        prof.scale_up_s = _pair(data.get("scale_up_s", [0.0, 0.0]), "scale_up_s")
        prof.scale_down_s = _pair(data.get("scale_down_s", [0.0, 0.0]), "scale_down_s")
        prof.start_s = _pair(data.get("start_s", [0.0, 0.0]), "start_s")
        for key, book in (("steps", prof.steps), ("spread_steps", prof.spread_steps)):
            steps = data.get(key, {})  # absent in profiles saved before it existed
            if not isinstance(steps, dict):
                raise ValueError(f"profile: {key!r} must be a mapping")
            for n_str, sums in steps.items():
                if not (isinstance(sums, list) and len(sums) == 4 and all(
                        isinstance(v, int | float) and math.isfinite(v) and v >= 0
                        for v in sums)):
                    raise ValueError(f"profile: {key}[{n_str}] must be 4 numbers >= 0")
                book[_size(n_str, key)] = [float(v) for v in sums]
        return prof


def _size(text: str, where: str) -> int:
    try:
        n = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"profile: {where}: size {text!r} is not an integer") from None
    if n <= 0:
        raise ValueError(f"profile: {where}: size {n} must be positive")
    return n


def _pair(value: Any, where: str) -> WeightedSum:
    ok = (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int | float) and math.isfinite(v) for v in value)
        and value[1] >= 0
    )
    if not ok:
        raise ValueError(f"profile: {where} must be [total, weight] with weight >= 0")
    return WeightedSum(float(value[0]), float(value[1]))


def fit_curve(
    rates: dict[int, tuple[float, float]],
    optimism: float,
    explore_fraction: float = 0.0,
    concave: bool = True,
    below: bool = False,
) -> ThroughputModel:
    """Monotone (concave) model through measured (size -> (rate, weight)) points.

    Weighted isotonic regression (pool adjacent violators), then (``concave``)
    the least concave majorant through the origin; beyond the last size the
    slope of the last segment times ``optimism``, but at least
    ``explore_fraction`` x the average rate per node at the last size.
    """
    sizes = sorted(n for n in rates if n > 0)
    if not sizes:
        return ThroughputModel(())
    # pool adjacent violators: non-decreasing in size
    blocks: list[list[float]] = []  # [value, weight, count]
    for n in sizes:
        r, wgt = rates[n]
        blocks.append([max(0.0, r), max(wgt, 1e-9), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, c2 = blocks.pop()
            v1, w1, c1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    iso: list[float] = []
    for v, _, cnt in blocks:
        iso.extend([v] * int(cnt))
    # least concave majorant of (0,0) + points (upper hull, monotone chain)
    hull: list[tuple[float, float]] = [(0.0, 0.0)]
    for n, r in zip(sizes, iso, strict=True):
        pt = (float(n), r)
        while concave and len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            # drop the middle point if it lies on or below the chord
            if (y2 - y1) * (pt[0] - x1) <= (pt[1] - y1) * (x2 - x1):
                hull.pop()
            else:
                break
        hull.append(pt)
    pts = tuple((int(x), y) for x, y in hull[1:])
    if not pts:
        return ThroughputModel(())
    if below and sizes[0] > 1:
        # Below the smallest measured size n0 the rate at 1 node lies between r0/n0
        # (linear scaling, the concave lower bound) and r0 (monotone upper bound).
        # Take their geometric mean: optimistic enough that a job measured only at
        # large sizes is not written off at small ones (Gavel's transformer-b16
        # makes 177/s on 1 GPU, 317/s on 8), concave, and replaced once measured.
        n0, r0 = pts[0]
        pts = ((1, r0 / math.sqrt(n0)), *pts)
    (x0, y0) = hull[-2]
    (x1, y1) = hull[-1]
    slope = (y1 - y0) / (x1 - x0) if x1 > x0 else 0.0
    floor = explore_fraction * y1 / x1 if x1 > 0 else 0.0
    return ThroughputModel(pts, optimistic_slope=max(0.0, slope * optimism, floor))


@dataclass(frozen=True)
class AdvisorSettings:
    #: Progress within this many seconds after a size change is warm-up: not used for rates.
    warmup_s: float = 30.0
    #: Answers may be this many seconds old (the caller's clock) while evidence only grows
    #: at sizes already known (core.answers); 0: always exact (replays). The daemon: 30 s.
    refresh_s: float = 0.0
    #: A size seen only during warm-up needs this many seconds of it to count (Profile.rates).
    #: 0 (every stint counts) for replays, whose warm-up stints temper the optimistic
    #: extension (10 s cost 0.6 % on the philly-gavel replay); the daemon sets 10 s
    #: (``ops.settings.LIVE_MIN_WARMUP_EVIDENCE_S``): a live stint that short is mostly stall.
    min_warmup_evidence_s: float = 0.0
    #: Slope of the optimistic extension, as a fraction of the last measured marginal.
    optimism: float = 1.0
    #: ... but at least this fraction of the average rate per node at the largest size,
    #: so a curve that looks flat (noise, or a step like 1 -> 2 GPUs gaining nothing)
    #: is still probed upwards (a sub-linear curve never gains more than the average).
    explore_fraction: float = 0.5
    #: Fit the least concave majorant (True) or keep the isotonic points (False).
    concave: bool = True
    #: Below the smallest measured size, assume r0 / sqrt(n0) at 1 node, not r0 / n0.
    optimistic_below: bool = True
    #: Costs assumed until measured (FreeTrain's measurements: 12-19 s).
    default_scale_up_s: float = 20.0
    default_scale_down_s: float = 10.0
    #: Measured costs are clipped to this (a stuck job, or a co-located job slowing the
    #: first clean interval, is not a rescale cost). Measured on the 2-core dev cluster:
    #: one preemption measured at several hundred seconds made every node whose hole may
    #: end look worthless (the reclaim term is scale_down_s x the whole job's rate).
    max_cost_s: float = 120.0
    #: The default cost counts as this many measurements in the mean, so that one noisy
    #: measurement cannot swing the costs on its own.
    cost_prior_weight: float = 1.0
    #: Rate assumed per node for a job nobody knows anything about.
    prior_rate_per_node: float = 1.0
    #: A reported rate above this many times the job's own history is held until it repeats
    #: (core.profiling.plausible; factor 0: off).
    plausible: PlausibleRule = field(default_factory=PlausibleRule)


def median_rate_per_node(profiles: Iterable[Profile], min_warmup_evidence_s: float,
                         prior: float) -> float:
    """The median, over ``profiles`` with a rate, of the rate per node at the largest size
    measured: the prior of a job nobody knows anything about (``prior`` without any)."""
    per_node = []
    for prof in profiles:
        rates = prof.rates(min_warmup_evidence_s)
        if rates:
            n = max(rates)
            per_node.append(rates[n][0] / n)
    if not per_node:
        return prior
    per_node.sort()
    return per_node[len(per_node) // 2]

"""Throughput targets (HeterPS's cost objective): a job that needs ``rate_target`` and no more.

A job with a target values throughput only up to it (:func:`capped`), so with node prices
the plan meets each target with the cheapest nodes and spends nothing beyond it; a target is
met on average, so a job behind it asks for more until it has made up (:func:`target_now`).
The per-type plan (:mod:`.hetero`) applies both; the simulator and the daemon
tell it the targets.
"""

from __future__ import annotations

import math

from malletrain.core.model import ThroughputModel

#: A node beyond those that meet a job's rate target counts as this share of the target
#: lost (over at most TARGET_WASTE_NODES nodes): with a scale-down of ``d`` seconds, a node
#: the target does not need is given back when it would be held longer than ``d / 0.01``.
TARGET_WASTE_PER_NODE = 0.01
TARGET_WASTE_NODES = 50
#: a job behind its throughput target asks for enough to be back on it within this
TARGET_CATCH_UP_S = 1800.0


def catch_up_target(target: float, owed: float, horizon_s: float) -> float:
    """The rate to ask for now so that a job behind its target schedule (``owed`` samples
    short of target x time admitted) is back on it within ``horizon_s``: a target is met on
    average, so time without nodes (a reclaim, a busy machine) is made up afterwards."""
    return target + max(0.0, owed) / max(horizon_s, 1.0)


def target_now(target: float | None, since_s: float | None, done: float,
               now_s: float) -> float | None:
    """The throughput target to tell the plan at ``now_s`` for a job that wants ``target``
    on average since ``since_s`` and has done ``done`` samples: raised while it is behind
    (the simulator and the daemon both ask this; None: no target, or not started yet)."""
    if target is None or since_s is None:
        return target
    owed = target * max(0.0, now_s - since_s) - done
    return catch_up_target(target, owed, TARGET_CATCH_UP_S)


def capped(model: ThroughputModel, target: float, max_nodes: int | None = None
           ) -> ThroughputModel:
    """``model`` with its rate held at ``target`` from the fewest nodes that reach it, and
    each node beyond that size (up to ``max_nodes``) counted as a loss of
    :data:`TARGET_WASTE_PER_NODE` of the target: a node a job does not need is given back,
    so that it is not held (and not billed) for nothing where no price says so."""
    reach = _reach(model, target)
    if reach is None:
        return model
    # the rate is only ever read at whole node counts: below the reach it is the model's
    points = [(n, r) for n, r in model.points if n < reach - 1]
    if reach > 1:
        points.append((reach - 1, model.rate(reach - 1)))
    points.append((reach, target))
    return _wasteful_beyond(points, max_nodes, model.measured_max_nodes)


def _reach(model: ThroughputModel, target: float) -> int | None:
    """The fewest nodes at which ``model`` reaches ``target`` (None: never). Below its first
    point a model is proportional, so a curve measured only at 2+ nodes may reach a small
    target on one."""
    prev_n, prev_r = 0, 0.0
    for n, r in model.points:
        if r >= target:
            step = math.ceil((target - prev_r) * (n - prev_n) / (r - prev_r))
            return prev_n + min(n - prev_n, max(1, step))
        prev_n, prev_r = n, r
    if model.optimistic_slope > 0 and model.points:
        return prev_n + max(1, math.ceil((target - prev_r) / model.optimistic_slope))
    return None


def _wasteful_beyond(points: list[tuple[int, float]], max_nodes: int | None,
                     measured_max_nodes: int | None) -> ThroughputModel:
    reach, target = points[-1]
    extra = min((max_nodes or reach) - reach, TARGET_WASTE_NODES)
    if extra > 0:
        points.append((reach + extra, target * (1.0 - TARGET_WASTE_PER_NODE * extra)))
    return ThroughputModel(tuple(points), 0.0, measured_max_nodes)

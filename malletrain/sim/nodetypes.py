"""Clusters of several node types for the simulator: which node is which, and its price.

The daemon reads a node's type from Slurm (``core.scavenger.node_type``: the GPU model of its
GRES); the simulator gives each node of a trace a type here and shows it to the shared
scavenger the same way (``SnapshotView``). A trace that names no types (the SWF and count
logs) gets its types from a real node list (``types_like``): the Alibaba 2023 GPU cluster's
``openb_node_list_gpu_node.csv`` gives the share of each GPU model, in GPUs (one simulated
node is one GPU worker, as in the profiles).
"""

from __future__ import annotations

import csv
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from malletrain.core.allocation.targets import target_now as core_target_now
from malletrain.sim.result import JobRun, Result
from malletrain.sim.trace import input_error


@dataclass(frozen=True)
class NodeTypes:
    """The type of each node of a trace (by index) and the price of a node-second per type.

    ``hidden``: the types still decide the jobs' true rates, but the policy is not told
    them (a type-oblivious baseline). The replay charges ``prices`` for every node-second
    used (``Result.cost``); the policy sees them only with ``objective="cost"``.
    """

    per_node: tuple[str, ...]
    prices: Mapping[str, float] = field(default_factory=dict)
    hidden: bool = False
    objective: str = "throughput"

    def __post_init__(self) -> None:
        if self.objective not in ("throughput", "cost"):
            raise ValueError(f"objective: 'throughput' or 'cost', not {self.objective!r}")


def gpu_counts(path: str | Path, models: Mapping[str, str]) -> dict[str, int]:
    """GPUs per type in an Alibaba node list (``sn,cpu_milli,memory_mib,gpu,model``);
    ``models`` maps its GPU models to types (models not named are left out)."""
    p = Path(path)
    counts: dict[str, int] = {}
    with p.open(newline="") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            kind = models.get(row.get("model") or "")
            if kind is None:
                continue
            try:
                gpus = int(row["gpu"])
            except (KeyError, TypeError, ValueError):
                what = f"not a whole number: {row.get('gpu')!r}"
                raise input_error(p, line, "gpu", what) from None
            counts[kind] = counts.get(kind, 0) + gpus
    if not counts:
        raise input_error(p, None, "model", f"no node of the models {sorted(models)}")
    return counts


def types_like(n_nodes: int, counts: Mapping[str, int], seed: int = 0) -> tuple[str, ...]:
    """Types for ``n_nodes`` nodes in the proportions of ``counts``, placed at random
    (``seed``): a trace's node numbers say nothing about the hardware behind them."""
    total = sum(counts.values())
    kinds = sorted(counts)
    share = [round(n_nodes * counts[k] / total) for k in kinds]
    share[-1] = n_nodes - sum(share[:-1])
    out = [k for k, s in zip(kinds, share, strict=True) for _ in range(s)]
    random.Random(seed).shuffle(out)
    return tuple(out)


def charge(result: Result, types: NodeTypes | None, nodes: list[int], dt_s: float) -> None:
    """Add ``dt_s`` seconds of ``nodes`` to the node-seconds per type and their price."""
    if types is None or dt_s <= 0:
        return
    for i in nodes:
        t = types.per_node[i]
        result.type_node_seconds[t] = result.type_node_seconds.get(t, 0.0) + dt_s
        result.cost += types.prices.get(t, 0.0) * dt_s


def target_now(run: JobRun, t_s: float) -> float | None:
    """The job's throughput target as told at ``t_s``: raised while it is behind it."""
    return core_target_now(run.job.rate_target, run.admitted_s, run.done, t_s)

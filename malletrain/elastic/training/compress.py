"""Gradient compression only where it pays: PowerSGD on a group whose links are slow.

Why: compression trades a little accuracy for less traffic, which pays only where the
links are the bottleneck (FusionLLM compresses across its slow links only;
``benchmarks/placement.py`` measured PowerSGD 2.8x faster than plain DDP across a
200 Mbit/s link, final loss within 0.5 %). Which links a group crosses changes with every
membership, so the decision is made per group, from its own measurement:

1. every group starts uncompressed (DDP's own all-reduce, timed by
   :class:`~malletrain.elastic.training.synctime.SyncTimer`);
2. after ``probe_steps`` committed steps, each rank estimates the bus bandwidth of its
   all-reduces (bytes x 2(n-1)/n over the time the link was busy);
3. at the next step boundary every rank votes (one more slot in the boundary all-reduce,
   so the decision is the same on every rank at the same step): if any rank measured less
   than ``below_mbit_s``, every rank re-wraps its model with torch's PowerSGD hook.

A group whose gradients are smaller than ``min_bytes`` a step is never compressed: its
all-reduce is bound by latency, which PowerSGD (two all-reduces instead of one) makes
worse. PowerSGD keeps the replicas identical (the low-rank factors are all-reduced; each
rank's error feedback corrects only its own contribution). It is opt-in, in the training
script (``ElasticJob(..., compression=SlowLinkCompression())``), as it changes the update.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.parallel import DistributedDataParallel

from malletrain.elastic.training.synctime import SyncTimer
from malletrain.errors import ConfigError


@dataclass(frozen=True)
class SlowLinkCompression:
    """When and how a job compresses its gradients (see the module docstring)."""

    #: a group whose measured bus bandwidth is below this is compressed
    below_mbit_s: float = 1000.0
    #: PowerSGD's approximation rank (placement.py: 32 kept the loss within 0.5 %)
    rank: int = 32
    #: committed steps of a group measured before it votes
    probe_steps: int = 5
    #: gradients smaller than this per step are latency-bound: never compressed
    min_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if not self.below_mbit_s > 0:
            raise ConfigError(f"below_mbit_s must be > 0, got {self.below_mbit_s}")
        if self.rank < 1 or self.probe_steps < 1 or self.min_bytes < 0:
            raise ConfigError("rank and probe_steps must be >= 1 and min_bytes >= 0")


def bus_mbit_s(nbytes: int, busy_s: float, world_size: int) -> float | None:
    """A ring all-reduce's bus bandwidth in Mbit/s (None: nothing to measure)."""
    if world_size < 2 or busy_s <= 0 or nbytes <= 0:
        return None
    return 8 * nbytes * 2 * (world_size - 1) / world_size / busy_s / 1e6


class CompressionSwitch:
    """One group's measurement and decision (reset at every re-formation)."""

    on: bool
    measured_mbit_s: float | None

    def __init__(self, policy: SlowLinkCompression | None) -> None:
        self.policy = policy
        self.new_group()

    def new_group(self) -> None:
        self.on = False
        self._steps, self._bytes, self._busy_s = 0, 0, 0.0
        self.measured_mbit_s = None

    def committed(self, timer: SyncTimer, world_size: int) -> None:
        """Adds the step just committed (its all-reduces, read off the timer)."""
        nbytes, busy_s = timer.last_traffic
        if self.policy is None or self.on or nbytes < self.policy.min_bytes:
            return
        self._steps += 1
        self._bytes += nbytes
        self._busy_s += busy_s
        if self._steps >= self.policy.probe_steps:
            self.measured_mbit_s = bus_mbit_s(self._bytes, self._busy_s, world_size)

    def vote(self) -> int:
        """1 if this rank asks the group to compress, at the next boundary."""
        slow = (self.policy is not None and not self.on and self.measured_mbit_s is not None
                and self.measured_mbit_s < self.policy.below_mbit_s)
        return int(slow)


def wrap(module: torch.nn.Module, device: torch.device, timer: SyncTimer,
         compress: SlowLinkCompression | None = None) -> DistributedDataParallel:
    """This group's DDP wrapper: DDP's all-reduce, or PowerSGD (``compress``), both timed.

    With PowerSGD the gradients go in one bucket: PowerSGD issues its collectives from the
    futures of the buckets before it, and over gloo two buckets deadlocked
    (benchmarks/placement.py).
    """
    ids = [device.index] if device.type == "cuda" else None
    if compress is None:
        ddp = DistributedDataParallel(module, init_sync=False, device_ids=ids)
        ddp.register_comm_hook(None, timer.hook)
        return ddp
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    nbytes = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    ddp = DistributedDataParallel(module, init_sync=False, device_ids=ids,
                                  bucket_cap_mb=nbytes / 2**20 + 1)
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=compress.rank,
                               start_powerSGD_iter=2, random_seed=0)
    ddp.register_comm_hook(state, timer.timed(psgd.powerSGD_hook))
    return ddp

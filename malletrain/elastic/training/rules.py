"""How the global batch size and the learning rate follow the world size (pure).

The runtime asks the rule at every membership change and applies the learning rate to every
param group of the optimizer, so a rule is the one place where a user states the scaling
policy (linear scaling with a fixed per-rank batch, or a fixed global batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


class ScalingRule(Protocol):
    def global_batch(self, world_size: int) -> int:
        """Samples per step over all ranks at this world size."""
        ...

    def learning_rate(self, world_size: int) -> float:
        """Learning rate for every param group at this world size."""
        ...


@dataclass(frozen=True)
class LinearScaling:
    """Fixed per-rank batch; the LR grows linearly with the global batch (Goyal et al.)."""

    per_rank_batch: int
    base_lr: float
    base_world_size: int = 1

    def __post_init__(self) -> None:
        if self.per_rank_batch < 1 or self.base_world_size < 1 or self.base_lr <= 0:
            raise ValueError(f"invalid LinearScaling {self}")

    def global_batch(self, world_size: int) -> int:
        return self.per_rank_batch * world_size

    def learning_rate(self, world_size: int) -> float:
        return self.base_lr * world_size / self.base_world_size


@dataclass(frozen=True)
class SqrtScaling:
    """Fixed per-rank batch; the LR grows with the square root of the global batch."""

    per_rank_batch: int
    base_lr: float
    base_world_size: int = 1

    def __post_init__(self) -> None:
        if self.per_rank_batch < 1 or self.base_world_size < 1 or self.base_lr <= 0:
            raise ValueError(f"invalid SqrtScaling {self}")

    def global_batch(self, world_size: int) -> int:
        return self.per_rank_batch * world_size

    def learning_rate(self, world_size: int) -> float:
        return self.base_lr * math.sqrt(world_size / self.base_world_size)


@dataclass(frozen=True)
class FixedGlobalBatch:
    """Same global batch and LR at every size: the math of the run does not change with W.

    The per-rank share is ``global_batch / W`` (uneven when it does not divide); DDP averages
    gradients over ranks, so use a loss summed over the rank's samples divided by
    ``global_batch / W`` if the chunks are uneven and exactness matters.
    """

    global_batch_size: int
    lr: float

    def __post_init__(self) -> None:
        if self.global_batch_size < 1 or self.lr <= 0:
            raise ValueError(f"invalid FixedGlobalBatch {self}")

    def global_batch(self, world_size: int) -> int:
        return self.global_batch_size

    def learning_rate(self, world_size: int) -> float:
        return self.lr

"""Data position math: which samples each rank trains on at each step (pure, no torch).

The job consumes ONE global stream of samples: data epoch ``k`` is a permutation of the
dataset (seeded by ``(seed, k)``), and the stream is the concatenation of these epochs. The
only position the runtime keeps is ``samples_total``, the number of stream samples consumed by
committed steps. A step takes the next ``global_batch`` stream samples and splits them into
contiguous per-rank chunks, in rank order.

The guarantee that follows (independent of how often the world size changes):

* every committed step consumes exactly the next slice of the stream, so within a data epoch
  every sample is used by exactly one committed step: none skipped, none seen twice;
* a step that fails (a peer died mid-step) is not committed; its slice is consumed again by the
  next committed step, possibly split differently over the new set of ranks;
* a step may straddle two data epochs (its tail comes from the next permutation); batches are
  therefore always full, except the very last one when a ``total_samples`` target cuts it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Slice:
    """Stream positions ``[start, start + count)`` assigned to one rank for one step."""

    start: int
    count: int


def split_step(start: int, global_count: int, world_size: int) -> list[Slice]:
    """Split ``global_count`` stream samples starting at ``start`` over ``world_size`` ranks.

    Chunks are contiguous, in rank order, and as even as possible (the first
    ``global_count % world_size`` ranks take one more); a rank may get 0 samples only when
    ``global_count < world_size``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if global_count < 0 or start < 0:
        raise ValueError(f"negative start/count: {start}, {global_count}")
    base, extra = divmod(global_count, world_size)
    out = []
    pos = start
    for r in range(world_size):
        n = base + (1 if r < extra else 0)
        out.append(Slice(pos, n))
        pos += n
    return out


def step_count(global_batch: int, samples_total: int, total_samples: int | None) -> int:
    """How many samples the next step takes: the global batch, cut at the target."""
    if global_batch < 1:
        raise ValueError(f"global batch must be >= 1, got {global_batch}")
    if total_samples is None:
        return global_batch
    return max(0, min(global_batch, total_samples - samples_total))


class DataStream:
    """Maps stream positions to dataset indices (one shuffled permutation per data epoch)."""

    def __init__(self, dataset_size: int, seed: int = 0, shuffle: bool = True) -> None:
        if dataset_size < 1:
            raise ValueError(f"dataset_size must be >= 1, got {dataset_size}")
        self.dataset_size = dataset_size
        self.seed = seed
        self.shuffle = shuffle
        self._perm_epoch = -1
        self._perm = np.arange(dataset_size, dtype=np.int64)

    def data_epoch(self, position: int) -> int:
        return position // self.dataset_size

    def permutation(self, data_epoch: int) -> np.ndarray:
        """The dataset order of one data epoch (deterministic in seed and epoch)."""
        if not self.shuffle:
            return np.arange(self.dataset_size, dtype=np.int64)
        if data_epoch != self._perm_epoch:
            rng = np.random.Generator(np.random.PCG64([self.seed, data_epoch]))
            self._perm = rng.permutation(self.dataset_size).astype(np.int64)
            self._perm_epoch = data_epoch
        return self._perm

    def indices(self, piece: Slice) -> np.ndarray:
        """Dataset indices of stream positions ``[piece.start, piece.start + piece.count)``."""
        out = np.empty(piece.count, dtype=np.int64)
        done = 0
        pos = piece.start
        while done < piece.count:
            epoch, offset = divmod(pos, self.dataset_size)
            take = min(piece.count - done, self.dataset_size - offset)
            out[done : done + take] = self.permutation(epoch)[offset : offset + take]
            done += take
            pos += take
        return out

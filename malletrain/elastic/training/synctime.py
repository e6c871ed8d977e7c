"""How long each step waits for the gradient all-reduce: a DDP communication hook.

Why: the daemon's communication-aware profile (:mod:`malletrain.core.profiling.comm`) splits a step
into compute and synchronisation, and only the worker can tell them apart. The hook does
what DDP's default does (each bucket divided by the world size, then all-reduced: the
same arithmetic, so replicas stay bit-identical) and notes when each bucket was handed
over and when its all-reduce completed.

A step's synchronisation time is the time it *waits* for communication: from the moment
the last bucket became ready (the backward pass is done then) to the moment the last
all-reduce completed. All-reduces that overlap the backward pass cost nothing here, as they
cost the step nothing. With NCCL the completion is when the collective's work is done on
the host side, which can precede the GPU's end: the figure is a lower bound there.
"""

# no ``from __future__ import annotations``: DDP checks the hook's annotations as objects
# (a string "dist.GradBucket" is refused)
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


class SyncTimer:
    """The hook (:meth:`hook`, for ``DistributedDataParallel.register_comm_hook``) and the
    per-step reading (:meth:`end_step`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ready = 0.0
        self._last_done = 0.0
        #: this step's buckets: (handed over, all-reduced, bytes)
        self._buckets: list[tuple[float, float, int]] = []
        #: the step last ended: (bytes all-reduced, seconds the link was busy with them)
        self.last_traffic: tuple[int, float] = (0, 0.0)

    def hook(self, group: "dist.ProcessGroup | None", bucket: dist.GradBucket
             ) -> torch.futures.Future[torch.Tensor]:
        """DDP's own all-reduce, timed."""
        return self._timed(default_hooks.allreduce_hook, group, bucket)

    def timed(self, inner: Callable[[Any, dist.GradBucket], "torch.futures.Future[torch.Tensor]"]
              ) -> Callable[[Any, dist.GradBucket], "torch.futures.Future[torch.Tensor]"]:
        """Another communication hook (e.g. PowerSGD's), timed the same way."""

        def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            return self._timed(inner, state, bucket)

        return hook

    def _timed(self, inner: Callable[[Any, dist.GradBucket], "torch.futures.Future[torch.Tensor]"],
               state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        ready = time.perf_counter()
        nbytes = bucket.buffer().numel() * bucket.buffer().element_size()
        with self._lock:
            self._last_ready = max(self._last_ready, ready)
        fut = inner(state, bucket)

        def done(f: "torch.futures.Future[Any]") -> torch.Tensor:
            t = time.perf_counter()
            with self._lock:
                self._last_done = max(self._last_done, t)
                self._buckets.append((ready, t, nbytes))
            return f.value()

        return fut.then(done)

    def end_step(self) -> float:
        """Seconds the step just finished waited for its all-reduce (0 without one); its
        traffic is left in :attr:`last_traffic`."""
        with self._lock:
            waited = (max(0.0, self._last_done - self._last_ready)
                      if self._last_ready > 0 else 0.0)
            self.last_traffic = _traffic(self._buckets)
            self._last_ready = self._last_done = 0.0
            self._buckets = []
        return waited


def _traffic(buckets: list[tuple[float, float, int]]) -> tuple[int, float]:
    """Bytes all-reduced and the time the link was busy: the union of the buckets'
    intervals (a bucket queued behind another counts from when the link took it up)."""
    busy, end = 0.0, float("-inf")
    for start, stop, _ in sorted(buckets):
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return sum(n for _, _, n in buckets), busy

"""How long each step waits for the gradient all-reduce: a DDP communication hook.

Why: the daemon's communication-aware profile (:mod:`malletrain.core.comm`) splits a step
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

    def hook(self, group: "dist.ProcessGroup | None", bucket: dist.GradBucket
             ) -> torch.futures.Future[torch.Tensor]:
        ready = time.perf_counter()
        with self._lock:
            self._last_ready = max(self._last_ready, ready)
        fut = default_hooks.allreduce_hook(group, bucket)  # type: ignore[arg-type]

        def done(f: "torch.futures.Future[Any]") -> torch.Tensor:
            t = time.perf_counter()
            with self._lock:
                self._last_done = max(self._last_done, t)
            return f.value()

        return fut.then(done)

    def end_step(self) -> float:
        """Seconds the step just finished waited for its all-reduce (0 without one)."""
        with self._lock:
            waited = (max(0.0, self._last_done - self._last_ready)
                      if self._last_ready > 0 else 0.0)
            self._last_ready = self._last_done = 0.0
        return waited

"""Which errors mean "the group is broken" (heal it) and which mean "the user's code is wrong"."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from malletrain.errors import ConfigError

if TYPE_CHECKING:
    from malletrain.elastic.protocol.config import ElasticConfig

#: substrings of errors raised by gloo/NCCL when a peer dies, hangs or the group is torn down.
_PEER_FAILURE_HINTS = (
    "connection",
    "timed out",
    "timeout",
    "broken pipe",
    "gloo",
    "nccl",
    "socket",
    "peer",
    "closed",
    "abort",
)


#: errors whose text names a peer or NCCL but that no heal can mend: the setup is wrong
#: (measured on an H100: two NCCL ranks on one GPU raised "Duplicate GPU detected" at every
#: re-formation; treated as a peer failure, it re-formed 327 times in 20 s)
_SETUP_ERROR_HINTS = (
    "duplicate gpu",
    "invalid device ordinal",
    "no cuda gpus are available",
)


class SyncError(RuntimeError):
    """The state sync of a new epoch could not complete; the epoch is healed like a failure."""


def is_peer_failure(exc: BaseException) -> bool:
    """True for errors that mean "the group is broken", not "the user's code is wrong"."""
    text = str(exc).lower()
    if any(hint in text for hint in _SETUP_ERROR_HINTS):
        return False
    if isinstance(exc, (dist.DistError, SyncError)):
        return True
    if isinstance(exc, RuntimeError):
        return any(hint in text for hint in _PEER_FAILURE_HINTS)
    return False


def gpu_problem(local_world_size: int, visible: int, index: int | None) -> str | None:
    """Why K NCCL worker processes cannot run on this node's GPUs, or None.

    NCCL needs one GPU per process of a node: checked before any group is formed, so the
    job fails once with this message instead of healing forever."""
    if visible == 0:
        return "a CUDA device was asked for but no GPU is visible to this process"
    if local_world_size > visible:
        return (f"{local_world_size} worker processes on this node but {visible} GPU(s) "
                f"visible: NCCL needs one GPU per process (ask for "
                f"--gpus-per-node={local_world_size}, or run {visible} worker(s) per node)")
    if index is not None and not 0 <= index < visible:
        return f"device cuda:{index} does not exist: {visible} GPU(s) visible"
    return None


def nccl_errors_raise() -> None:
    """torchrun sets TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (TearDown): a timed-out collective
    would kill EVERY survivor. 2 (CleanUpOnly) aborts the communicators and raises in this
    process instead, so the runtime can heal; the watcher also aborts a step that overruns.
    """
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = os.environ.get(
        "MALLETRAIN_NCCL_ASYNC_ERROR_HANDLING", "2"
    )


def backend_for(config: ElasticConfig, device: torch.device) -> str:
    """The process group backend, after checking that this node's GPUs can carry it."""
    backend = config.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        nccl_errors_raise()
    if device.type == "cuda":
        problem = gpu_problem(config.local_world_size, torch.cuda.device_count(), device.index)
        if problem is not None:
            raise ConfigError(problem)
    return backend

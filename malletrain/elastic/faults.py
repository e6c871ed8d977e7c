"""Which errors mean "the group is broken" (heal it) and which mean "the user's code is wrong"."""

from __future__ import annotations

import torch.distributed as dist

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


class SyncError(RuntimeError):
    """The state sync of a new epoch could not complete; the epoch is healed like a failure."""


def is_peer_failure(exc: BaseException) -> bool:
    """True for errors that mean "the group is broken", not "the user's code is wrong"."""
    if isinstance(exc, (dist.DistError, SyncError)):
        return True
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return any(hint in text for hint in _PEER_FAILURE_HINTS)
    return False

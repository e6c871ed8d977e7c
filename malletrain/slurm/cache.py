"""The last good snapshot, kept across failed ticks (submitit's and Ray's habit)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from malletrain.core.cluster import ClusterSnapshot
from malletrain.errors import RetryableError
from malletrain.slurm.backend import SlurmBackend
from malletrain.slurm.errors import SlurmParseError

log = logging.getLogger(__name__)


class SnapshotCache:
    """Keep the last good snapshot across failed ticks (submitit's and Ray's habit).

    ``refresh()`` returns a fresh snapshot, or after a retryable failure (or one that
    does not parse) the last good one with a warning saying how stale it is.  With no good
    snapshot yet, or one older than ``max_age_s``, the error propagates: acting on a very
    old view is worse than pausing.
    """

    def __init__(
        self,
        backend: SlurmBackend,
        *,
        max_age_s: float | None = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.max_age_s = max_age_s
        self._clock = clock
        self.last: ClusterSnapshot | None = None
        self.last_error: Exception | None = None
        self.consecutive_failures = 0

    @property
    def stale(self) -> bool:
        return self.consecutive_failures > 0

    def refresh(self) -> ClusterSnapshot:
        try:
            snap = self.backend.snapshot()
        except (RetryableError, SlurmParseError) as exc:
            self.last_error = exc
            self.consecutive_failures += 1
            log.warning("Slurm snapshot failed (%d in a row): %s", self.consecutive_failures, exc)
            if self.last is None:
                raise
            age_s = self._clock() - self.last.taken_at
            if self.max_age_s is not None and age_s > self.max_age_s:
                raise
            note = f"stale: showing the snapshot of {age_s:.0f} s ago ({exc})"
            return dataclasses.replace(self.last, warnings=(*self.last.warnings, note))
        self.last = snap
        self.last_error = None
        self.consecutive_failures = 0
        return snap

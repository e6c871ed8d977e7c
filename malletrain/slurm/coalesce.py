"""Concurrent lookups of a few jobs, answered by one Slurm query.

Why: every ``malletrain submit`` ends with an ``attach`` that looks up its slot jobs in
Slurm. A hundred users submitting at once made a hundred ``squeue --jobs=`` calls side by
side (``benchmarks/load.py``): each a process and an RPC to the slurmctld that every user
of the machine shares, and their sum made the submissions wait seconds.

Here, while one query runs, the lookups that arrive meanwhile gather into the next batch,
which one of their callers runs as a single query when the first ends: a burst costs a few
queries, and a lone lookup waits for no one. Each caller gets only the jobs it asked for.
If a batch's query fails, each of its callers asks again alone, so that one caller's odd
input (a job id Slurm refuses) fails its own lookup, not its neighbours'.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from malletrain.core.cluster import Job


@dataclass
class _Batch:
    ids: set[int] = field(default_factory=set)
    callers: int = 0
    done: bool = False
    found: dict[int, Job] = field(default_factory=dict)
    error: Exception | None = None


class CoalescedJobs:
    """``jobs(ids)`` for many threads at once, over one ``fetch`` per batch (module doc)."""

    def __init__(self, fetch: Callable[[Sequence[int]], Sequence[Job]]) -> None:
        self._fetch = fetch
        self._cond = threading.Condition()
        self._open: _Batch | None = None  # gathering ids while a query runs
        self._running = False

    def jobs(self, job_ids: Sequence[int]) -> tuple[Job, ...]:
        wanted = [int(i) for i in job_ids]
        if not wanted:
            return ()
        batch = self._join(wanted)
        if not batch.done:  # this caller runs it
            self._run(batch)
        if batch.error is not None:
            if batch.callers == 1:
                raise batch.error
            return tuple(self._fetch(wanted))  # alone: its own error, if any
        return tuple(batch.found[i] for i in wanted if i in batch.found)

    def _join(self, wanted: list[int]) -> _Batch:
        """Add the ids to the open batch; return it once it is done or this caller's turn."""
        with self._cond:
            batch = self._open if self._open is not None else _Batch()
            self._open = batch
            batch.ids.update(wanted)
            batch.callers += 1
            while not batch.done:
                if not self._running and self._open is batch:
                    self._running = True
                    self._open = None
                    break
                self._cond.wait()
            return batch

    def _run(self, batch: _Batch) -> None:
        try:
            batch.found = {j.job_id: j for j in self._fetch(sorted(batch.ids))}
        except Exception as exc:
            batch.error = exc
        with self._cond:
            batch.done = True
            self._running = False
            self._cond.notify_all()


"""Concurrent calls about a few jobs each, made as one Slurm call per batch.

Why: every ``malletrain submit`` ends with an ``attach`` that looks up its slot jobs in
Slurm, and the daemon's action workers release and park slots side by side. A hundred users
submitting at once made a hundred ``squeue --jobs=`` calls, and a busy tick hundreds of
``scontrol release`` and ``requeuehold`` calls (``benchmarks/load.py``): each a process and
an RPC to the slurmctld that every user of the machine shares.

Here, while one call runs, the requests that arrive meanwhile gather into the next batch,
which one of their callers makes as a single call (``squeue --jobs=1,2,3``,
``scontrol release 1,2,3``: both take a list of job ids) when the first ends: a burst costs a
few calls, and a lone request waits for no one. Each caller gets only its own answer:

* :class:`CoalescedJobs` (lookups): if a batch's query fails, each of its callers asks again
  alone, so that one caller's odd input fails its own lookup, not its neighbours'.
* :class:`CoalescedActs` (``scontrol release|requeuehold|hold``): Slurm acts on every id of
  the list it can and names each one it could not (``... for job N``); a caller fails only
  on a line naming its own job, or when the whole call failed (slurmctld down). A call is
  never repeated alone: the other ids of the batch were acted on already.
* :class:`CoalescedUpdates` (``scontrol update``, one per placement: each sets its own
  node): the batch's updates go to one ``scontrol`` reading them as a script, one command a
  line; Slurm names each job whose update it refused, as above. When the call fails as a
  whole, each caller of several repeats its update alone (an update can be repeated: it
  sets the same fields again), so that one job's odd update fails only its own caller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from malletrain.core.cluster import Job

R = TypeVar("R")


@dataclass
class _Batch(Generic[R]):
    ids: set[int] = field(default_factory=set)
    #: the callers' lines, in arrival order (:class:`CoalescedUpdates`' script)
    lines: list[str] = field(default_factory=list)
    callers: int = 0
    done: bool = False
    result: R | None = None
    error: Exception | None = None


class _Coalescer(Generic[R]):
    """The batching of every kind: ``call(ids, lines)`` joins the open batch and returns it
    done; ``run(ids, lines)`` makes a batch's call."""

    def __init__(self, run: Callable[[Sequence[int], Sequence[str]], R]) -> None:
        self._run_batch = run
        self._cond = threading.Condition()
        self._open: _Batch[R] | None = None  # gathering ids while a call runs
        self._running = False

    def call(self, wanted: Sequence[int], lines: Sequence[str] = ()) -> _Batch[R]:
        batch = self._join(wanted, lines)
        if not batch.done:  # this caller runs it
            self._run(batch)
        return batch

    def _join(self, wanted: Sequence[int], lines: Sequence[str]) -> _Batch[R]:
        """Add the ids to the open batch; return it once it is done or this caller's turn."""
        with self._cond:
            batch = self._open if self._open is not None else _Batch[R]()
            self._open = batch
            batch.ids.update(wanted)
            batch.lines.extend(lines)
            batch.callers += 1
            while not batch.done:
                if not self._running and self._open is batch:
                    self._running = True
                    self._open = None
                    break
                self._cond.wait()
            return batch

    def _run(self, batch: _Batch[R]) -> None:
        try:
            batch.result = self._run_batch(sorted(batch.ids), batch.lines)
        except Exception as exc:
            batch.error = exc
        with self._cond:
            batch.done = True
            self._running = False
            self._cond.notify_all()


class CoalescedJobs:
    """``jobs(ids)`` for many threads at once, over one ``fetch`` per batch (module doc)."""

    def __init__(self, fetch: Callable[[Sequence[int]], Sequence[Job]]) -> None:
        self._fetch = fetch
        self._batches = _Coalescer(lambda ids, _: {j.job_id: j for j in fetch(ids)})

    def jobs(self, job_ids: Sequence[int]) -> tuple[Job, ...]:
        wanted = [int(i) for i in job_ids]
        if not wanted:
            return ()
        batch = self._batches.call(wanted)
        if batch.error is not None:
            if batch.callers == 1:
                raise batch.error
            return tuple(self._fetch(wanted))  # alone: its own error, if any
        found = batch.result or {}
        return tuple(found[i] for i in wanted if i in found)


class CoalescedActs:
    """``act(job_id)`` for many threads at once, over one ``run`` per batch (module doc).

    ``run(ids)`` makes the call for the whole list and returns the errors of the ids Slurm
    named as failed; it raises when the call as a whole failed.
    """

    def __init__(self, run: Callable[[Sequence[int]], Mapping[int, Exception]]) -> None:
        self._batches = _Coalescer(lambda ids, _: run(ids))

    def act(self, job_id: int) -> None:
        batch = self._batches.call([int(job_id)])
        if batch.error is not None:
            raise batch.error
        failed = batch.result or {}
        if int(job_id) in failed:
            raise failed[int(job_id)]


class CoalescedUpdates:
    """``update(job_id, line)`` for many threads at once, over one ``run`` per batch (module
    doc). ``run(ids, lines)`` runs the lines as one script and returns the errors of the ids
    Slurm named as failed; it raises when the call as a whole failed."""

    def __init__(self, run: Callable[[Sequence[int], Sequence[str]],
                                     Mapping[int, Exception]]) -> None:
        self._run = run
        self._batches = _Coalescer(run)

    def update(self, job_id: int, line: str) -> None:
        batch = self._batches.call([int(job_id)], [line])
        failed = batch.result or {}
        if batch.error is not None:
            if batch.callers == 1:
                raise batch.error
            failed = self._run([int(job_id)], [line])  # alone: its own error, if any
        if int(job_id) in failed:
            raise failed[int(job_id)]

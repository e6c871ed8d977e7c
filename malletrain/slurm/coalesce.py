"""The action workers' ``scontrol`` calls, made as one ``scontrol`` script per batch.

Why: the daemon's action workers release, park and place slots side by side, and a busy
tick made hundreds of ``scontrol release``, ``requeuehold`` and ``update`` calls
(``benchmarks/load.py``): each a process and an RPC to the slurmctld that every user of the
machine shares.

Here, while one call runs, the lines that arrive meanwhile gather into the next batch,
which one of their callers runs as a single ``scontrol`` reading them as a script, one
command a line (docs/slurm-backend.md §6, fact 14), when the first ends. A line that finds
nothing running waits ``gather_s`` for the rest of its wave: the workers start a tick's
groups together, and each group's next step together when the script before answers;
without the wait, every wave was two calls, its first line alone and then the rest.

Each caller gets only its own answer (:class:`CoalescedScontrol`: ``release``,
``requeuehold``, ``hold`` and the placements' ``update JobId=...``, each for one job).
Slurm names each job a line failed for (``... for job N``) and goes on; a caller fails only
on a line naming its own job, or when the whole call failed. Then an update is repeated
alone by each caller of several (it sets the same fields again), so that one job's odd
update fails only its own caller; a release or a park is not (the batch's other lines may
have acted). A job's release never shares a script with its own update: the action worker
that makes both waits for the update's answer first (in one script a release would run
after its update failed, and the slot would start anywhere).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from malletrain.slurm.commands import render_act_line

#: one script's run: the job ids and lines in, the errors of the ids Slurm named out
RunScript = Callable[[Sequence[int], Sequence[str]], Mapping[int, Exception]]


@dataclass
class _Batch:
    ids: set[int] = field(default_factory=set)
    #: the callers' lines, in arrival order (the batch's script)
    lines: list[str] = field(default_factory=list)
    callers: int = 0
    #: monotonic time before which it does not run (gathering while nothing runs)
    opens_at: float = 0.0
    done: bool = False
    result: Mapping[int, Exception] | None = None
    error: Exception | None = None


class _Coalescer:
    """The batching: ``call(ids, lines)`` joins the open batch and returns it done;
    ``run(ids, lines)`` makes a batch's call. A batch opened while no call runs waits
    ``gather_s`` for company first (0: it runs at once)."""

    def __init__(self, run: RunScript, gather_s: float = 0.0) -> None:
        self._run_batch = run
        self._gather_s = gather_s
        self._cond = threading.Condition()
        self._open: _Batch | None = None  # gathering ids while a call runs
        self._running = False

    def call(self, wanted: Sequence[int], lines: Sequence[str] = ()) -> _Batch:
        batch = self._join(wanted, lines)
        if not batch.done:  # this caller runs it
            self._run(batch)
        return batch

    def _join(self, wanted: Sequence[int], lines: Sequence[str]) -> _Batch:
        """Add the ids to the open batch; return it once it is done or this caller's turn."""
        with self._cond:
            batch = self._open if self._open is not None else _Batch()
            if self._open is None and not self._running:
                batch.opens_at = time.monotonic() + self._gather_s
            self._open = batch
            batch.ids.update(wanted)
            batch.lines.extend(lines)
            batch.callers += 1
            while not batch.done:
                if not self._running and self._open is batch:
                    wait_s = batch.opens_at - time.monotonic()
                    if wait_s <= 0:
                        self._running = True
                        self._open = None
                        break
                    self._cond.wait(wait_s)
                    continue
                self._cond.wait()
            return batch

    def _run(self, batch: _Batch) -> None:
        try:
            batch.result = self._run_batch(sorted(batch.ids), batch.lines)
        except Exception as exc:
            batch.error = exc
        with self._cond:
            batch.done = True
            self._running = False
            self._cond.notify_all()


class CoalescedScontrol:
    """``act(verb, job_id)`` and ``update(job_id, line)`` for many threads at once, over one
    ``scontrol`` script per batch (module doc). ``run(ids, lines)`` runs the lines as one
    script and returns the errors of the ids Slurm named as failed; it raises when the call
    as a whole failed."""

    def __init__(self, run: RunScript, gather_s: float = 0.0) -> None:
        self._run = run
        self._batches = _Coalescer(run, gather_s)

    def act(self, verb: str, job_id: int) -> None:
        """``scontrol VERB JOB``: never repeated alone (a failed batch may have acted)."""
        batch = self._batches.call([int(job_id)], [render_act_line(verb, job_id)])
        if batch.error is not None:
            raise batch.error
        failed = batch.result or {}
        if int(job_id) in failed:
            raise failed[int(job_id)]

    def update(self, job_id: int, line: str) -> None:
        """One ``update JobId=...`` line: repeated alone when its batch failed as a whole
        (it sets the same fields again)."""
        batch = self._batches.call([int(job_id)], [line])
        failed = batch.result or {}
        if batch.error is not None:
            if batch.callers == 1:
                raise batch.error
            failed = self._run([int(job_id)], [line])  # alone: its own error, if any
        if int(job_id) in failed:
            raise failed[int(job_id)]

"""Applying a tick's actions off the tick: one group per job, urgent groups first.

Why: a tick that waits for its own Slurm actions lasts as long as its slowest job's calls.
At 5,000 nodes x 500 jobs (``benchmarks/load.py``) placements go on all the time, each two
``scontrol`` calls, and ticks took seconds: a node wanted back by a regular job waited
behind other jobs' placements, and so did the next look at Slurm. Here the tick hands each
job's actions over and goes on; worker threads apply them.

The rules that keep this level-triggered and safe:

* **A decision sees a settled job.** The daemon offers no actions for a job that had a
  group queued or running when the tick's snapshot was taken (:meth:`busy_jobs`, before
  the snapshot): its view would mix Slurm before the group's calls with the store after
  its marks, and the tick would undo or repeat what the group did. The next tick decides
  for that job again (``World.busy``: the decision gives it none). :meth:`offer` drops a
  busy job's group too.
* **Nodes a queued group will take are marked when it is queued** (the daemon marks each
  placement in the store as it offers it; ``Actuator.reserve``): a placement not yet run
  had no mark, so the next tick offered its node to another job. Withdrawing the queued
  groups at each tick instead made every tick act on a world its predecessor had half
  changed, and the plans swung: ``load.py`` saw three to four times the placements and
  parks of the synchronous tick.
* **One group per job, in order**, on one worker.
* **Urgent groups first.** A group that gives a node back or stops a job (the actuator's
  ``is_urgent``) is taken before any other queued group, whatever their order.
* **Outcomes are collected, not returned**: the daemon takes what finished since its last
  look at the start of each tick (:meth:`take`), so the advisor and the metrics hear it.

``drain`` waits until nothing is queued or running (``close``, when the daemon stops).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, Self, TypeVar

log = logging.getLogger(__name__)


class Mergeable(Protocol):
    def add(self, other: Self) -> None: ...


ActT = TypeVar("ActT")
OutT = TypeVar("OutT", bound=Mergeable)


@dataclass
class _Queued(Generic[ActT]):
    urgent: bool
    seq: int
    actions: Sequence[ActT]


class ActionQueue(Generic[ActT, OutT]):
    """Worker threads that apply one job's group of actions at a time (see the module doc)."""

    def __init__(self, apply_group: Callable[[Sequence[ActT]], OutT],
                 new_outcome: Callable[[], OutT], *, workers: int,
                 job_of: Callable[[ActT], str], urgent: Callable[[ActT], bool]) -> None:
        self._apply = apply_group
        self._new_outcome = new_outcome
        self._job_of = job_of
        self._urgent = urgent
        self._cond = threading.Condition()
        self._queued: dict[str, _Queued[ActT]] = {}
        self._heap: list[tuple[bool, int, str]] = []  # (not urgent, seq, job)
        self._running: set[str] = set()
        self._outcome = new_outcome()
        self._seq = itertools.count()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"actions-{i}", daemon=True)
                         for i in range(max(1, workers))]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ the tick's side

    def offer(self, actions: Sequence[ActT]) -> int:
        """Queue each job's actions; returns how many jobs' groups were dropped (busy)."""
        groups: dict[str, list[ActT]] = {}
        for action in actions:
            groups.setdefault(self._job_of(action), []).append(action)
        dropped = 0
        with self._cond:
            for job, seq_actions in groups.items():
                if job in self._running or job in self._queued:
                    dropped += 1
                    continue
                urgent = any(self._urgent(a) for a in seq_actions)
                q = _Queued(urgent, next(self._seq), seq_actions)
                self._queued[job] = q
                heapq.heappush(self._heap, (not urgent, q.seq, job))
            self._cond.notify_all()
        return dropped

    def busy_jobs(self) -> frozenset[str]:
        """Jobs with a group queued or running."""
        with self._cond:
            return frozenset(self._queued) | frozenset(self._running)

    def take(self) -> OutT:
        """What the groups finished since the last call did."""
        with self._cond:
            out, self._outcome = self._outcome, self._new_outcome()
        return out

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until nothing is queued or running; False if ``timeout_s`` passed first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._queued or self._running:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float | None = None) -> bool:
        """Finish what is queued and running (up to ``timeout_s``), then stop the workers."""
        done = self.drain(timeout_s)
        with self._cond:
            self._closed = True
            if not done:
                log.warning("stopping with %d job(s)' actions not applied: %s",
                            len(self._queued) + len(self._running),
                            ", ".join(sorted(set(self._queued) | self._running)[:5]))
                self._queued.clear()
            self._cond.notify_all()
        return done

    # ------------------------------------------------------------------ the workers' side

    def _next(self) -> tuple[str, Sequence[ActT]] | None:
        with self._cond:
            while True:
                while self._heap:
                    _, seq, job = heapq.heappop(self._heap)
                    q = self._queued.get(job)
                    if q is not None and q.seq == seq:
                        del self._queued[job]
                        self._running.add(job)
                        return job, q.actions
                if self._closed:
                    return None
                self._cond.wait()

    def _work(self) -> None:
        while (item := self._next()) is not None:
            job, actions = item
            try:
                out = self._apply(actions)
            except Exception:  # the group's own errors are the actuator's; this is a bug
                log.exception("applying job %s's actions failed", job)
                out = self._new_outcome()
            with self._cond:
                self._outcome.add(out)
                self._running.discard(job)
                self._cond.notify_all()

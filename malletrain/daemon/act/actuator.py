"""The actuator: applies a tick's actions to Slurm and the coordinator, and records them.

Separate from :mod:`decide` (which is pure) so that what the daemon *wants* and what it
*did* stay apart: each Slurm action is written to the store's action log before it runs and
marked done (or failed, with the error) after, so a ``kill -9`` in the middle leaves a record
that the restarted daemon reports, and the next tick (level-triggered) repairs whatever is
half done. A failed action never stops the others: a retryable error is tried again next
tick because the same difference is still there.

Each job's actions run in order; different jobs' run side by side (:data:`ACTION_WORKERS`),
the jobs that give nodes back first. One after another, the Slurm calls of a tick that
places hundreds of slots (500 jobs submitted at once, ``benchmarks/load.py``) took a
minute, and a node given back to a regular job waited behind them. :meth:`Actuator.apply`
applies a tick's actions and returns; the service applies them off the tick instead
(:mod:`malletrain.daemon.act.action_queue`, one :meth:`Actuator.apply_job` per job).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from malletrain.core.lifecycle import IllegalTransition, JobPhase
from malletrain.daemon.jobs.store import Store
from malletrain.daemon.tick.actions import (
    Action,
    Cancel,
    ClearMarks,
    Extend,
    Hold,
    Leave,
    Park,
    Place,
    Publish,
    Transit,
)
from malletrain.errors import UserError
from malletrain.ops.logs import job_context
from malletrain.slurm.backend import SlurmBackend

log = logging.getLogger(__name__)

#: Jobs whose actions are applied at once. The workers' placements, releases, parks and
#: holds made together share one Slurm call per kind (slurm/coalesce.py): more workers make
#: bigger batches, not more calls (at 5,000 nodes x 500 jobs, ``benchmarks/load.py``).
ACTION_WORKERS = 32
#: Actions that give a node back or stop a job: their jobs go first.
_URGENT = (Park, Leave, Publish, Hold, Cancel)


def is_urgent(action: Action) -> bool:
    """Whether the action gives a node back or stops a job (its job's group goes first)."""
    return isinstance(action, _URGENT)


class MembershipPort(Protocol):
    """What the actuator needs from the coordinator (the elastic Coordinator satisfies it)."""

    def publish(self, job_id: str, members: Sequence[str]) -> int: ...

    def depart(self, job_id: str, member_id: str) -> bool: ...


@dataclass
class Outcome:
    """What applying one tick's actions did (for metrics and logs)."""

    done: int = 0
    failed: int = 0
    placed: int = 0
    parked: int = 0
    published: int = 0
    preemptions: int = 0
    yields_s: list[float] = field(default_factory=list)
    #: (job, old size, new size, when) of each membership published.
    rescales: list[tuple[str, int, int, float]] = field(default_factory=list)
    #: (job, new state) of each transition done.
    transitions: list[tuple[str, JobPhase]] = field(default_factory=list)

    def add(self, other: Outcome) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class Actuator:
    def __init__(
        self,
        backend: SlurmBackend,
        store: Store,
        coordinator: MembershipPort,
        *,
        on_slurm_call: Callable[[str, float, bool], None] | None = None,
        clock: Callable[[], float] = time.time,
        workers: int = ACTION_WORKERS,
    ) -> None:
        self.backend = backend
        self.store = store
        self.coordinator = coordinator
        self._on_call = on_slurm_call
        self._clock = clock
        self.workers = workers

    def apply(self, actions: Sequence[Action]) -> Outcome:
        """Each job's actions in order; jobs side by side, those giving nodes back first."""
        groups: dict[str, list[Action]] = {}
        for action in actions:
            groups.setdefault(action.job_id, []).append(action)
        ordered = sorted(groups.values(),
                         key=lambda seq: not any(is_urgent(a) for a in seq))
        out = Outcome()
        if self.workers <= 1 or len(ordered) <= 1:
            for seq in ordered:
                out.add(self.apply_job(seq))
            return out
        with ThreadPoolExecutor(max_workers=min(self.workers, len(ordered)),
                                thread_name_prefix="actuator") as pool:
            for part in pool.map(self.apply_job, ordered):
                out.add(part)
        return out

    def reserve(self, actions: Sequence[Action]) -> None:
        """Mark the nodes the placements among ``actions`` will take, before they run (for
        actions applied later, off the tick: see action_queue.py). A placement marks its
        slot again when it runs, and clears the mark if Slurm refuses it."""
        for a in actions:
            if isinstance(a, Place):
                self._mark_placed(a)

    def _mark_placed(self, a: Place) -> None:
        self.store.mark_slot(a.job_id, a.slot, placed_node=a.node, placed_at_s=self._clock(),
                             leaving_since_s=None)

    def apply_job(self, actions: Sequence[Action]) -> Outcome:
        """One job's actions, in order; a failed one is logged and the next one runs."""
        out = Outcome()
        for action in actions:
            with job_context(action.job_id):
                try:
                    self._one(action, out)
                    out.done += 1
                except (UserError, IllegalTransition) as exc:
                    out.failed += 1
                    log.warning("action %s failed: %s", type(action).__name__, exc)
        return out

    # ------------------------------------------------------------------ one action

    def _slurm(self, name: str, fn: Callable[[], None], job_id: str, slurm_job_id: int | None,
               detail: str) -> None:
        aid = self.store.begin_action(job_id, slurm_job_id, name, detail)
        t0 = time.monotonic()
        try:
            fn()
        except UserError as exc:
            self.store.end_action(aid, False, str(exc))
            if self._on_call:
                self._on_call(name, time.monotonic() - t0, False)
            raise
        self.store.end_action(aid, True)
        if self._on_call:
            self._on_call(name, time.monotonic() - t0, True)

    def _one(self, a: Action, out: Outcome) -> None:
        handlers: dict[type, Callable[[Any, Outcome], None]] = {
            Place: self._place, Park: self._park, Extend: self._extend, Hold: self._hold,
            Leave: self._leave, ClearMarks: self._clear_marks, Publish: self._publish,
            Cancel: self._cancel, Transit: self._transit,
        }
        handler = handlers.get(type(a))
        if handler is None:  # pragma: no cover - exhaustive
            raise TypeError(f"unknown action {a!r}")
        handler(a, out)

    def _bump(self, job_id: str, counter: str) -> None:
        """Add one to a job's counter (rescales, preemptions, start failures)."""
        rec = self.store.job(job_id)
        if rec is not None:
            self.store.update_job(job_id, **{counter: getattr(rec, counter) + 1})

    def _place(self, a: Place, out: Outcome) -> None:
        # Mark first: if we die after the release, the next tick knows why it runs there.
        self._mark_placed(a)

        def place() -> None:
            self.backend.update(a.slurm_job_id, NodeList=a.node,
                                TimeLimit=a.time_limit_min, StartTime="now")
            self.backend.release(a.slurm_job_id)

        try:
            self._slurm("place", place, a.job_id, a.slurm_job_id,
                        f"slot {a.slot} -> {a.node} for {a.time_limit_min} min")
        except UserError:
            self.store.mark_slot(a.job_id, a.slot, placed_node=None, placed_at_s=None)
            raise
        log.info("placed slot %d (Slurm job %d) on %s, time limit %d min", a.slot,
                 a.slurm_job_id, a.node, a.time_limit_min)
        out.placed += 1

    def _park(self, a: Park, out: Outcome) -> None:
        self._slurm("requeuehold", lambda: self.backend.requeue_hold(a.slurm_job_id),
                    a.job_id, a.slurm_job_id, f"slot {a.slot}: {a.why}")
        self.store.mark_slot(a.job_id, a.slot, placed_node=None, placed_at_s=None,
                             leaving_since_s=None, last_status="parked")
        log.info("slot %d (Slurm job %d) back in the pool: %s", a.slot, a.slurm_job_id, a.why)
        out.parked += 1
        if a.gone_member is not None:
            self._depart(a.job_id, a.gone_member)
        if a.start_failed:
            self._bump(a.job_id, "start_failures")
        if a.preempted:
            out.preemptions += 1
            self._bump(a.job_id, "preemptions")
            if a.yield_s is not None:
                out.yields_s.append(a.yield_s)

    def _depart(self, job_id: str, member: str) -> None:
        """Best effort: a worker waiting for this member to leave waits its timeout else."""
        try:
            if self.coordinator.depart(job_id, member):
                log.info("member %s marked gone (its slot ended without it)", member)
        except (UserError, RuntimeError, OSError) as exc:
            log.warning("could not mark member %s gone: %s", member, exc)

    def _extend(self, a: Extend, out: Outcome) -> None:
        self._slurm("extend", lambda: self.backend.update(a.slurm_job_id,
                                                          TimeLimit=a.time_limit_min),
                    a.job_id, a.slurm_job_id, f"slot {a.slot}: {a.time_limit_min} min")
        log.info("slot %d time limit raised to %d min", a.slot, a.time_limit_min)

    def _hold(self, a: Hold, out: Outcome) -> None:
        self._slurm("hold", lambda: self.backend.hold(a.slurm_job_id), a.job_id,
                    a.slurm_job_id, f"slot {a.slot}: {a.why}")
        self.store.mark_slot(a.job_id, a.slot, placed_node=None, placed_at_s=None,
                             last_status="parked")
        log.info("slot %d held again: %s", a.slot, a.why)

    def _leave(self, a: Leave, out: Outcome) -> None:
        self.store.mark_slot(a.job_id, a.slot, leaving_since_s=self._clock())

    def _clear_marks(self, a: ClearMarks, out: Outcome) -> None:
        self.store.mark_slot(a.job_id, a.slot, placed_node=None, placed_at_s=None,
                             leaving_since_s=None)

    def _publish(self, a: Publish, out: Outcome) -> None:
        aid = self.store.begin_action(a.job_id, None, "publish", ",".join(a.members))
        try:
            epoch = self.coordinator.publish(a.job_id, list(a.members))
        except UserError as exc:
            self.store.end_action(aid, False, str(exc))
            raise
        self.store.end_action(aid, True)
        new = len(a.members)
        if a.old_size and new != a.old_size:
            self._bump(a.job_id, "rescales_up" if new > a.old_size else "rescales_down")
        log.info("membership epoch %d: %d -> %d member(s) %s", epoch, a.old_size, new,
                 list(a.members))
        out.published += 1
        out.rescales.append((a.job_id, a.old_size, new, self._clock()))

    def _cancel(self, a: Cancel, out: Outcome) -> None:
        self._slurm("cancel", lambda: self.backend.cancel(a.slurm_job_id), a.job_id,
                    a.slurm_job_id, f"slot {a.slot}")

    def _transit(self, a: Transit, out: Outcome) -> None:
        rec = self.store.job(a.job_id)
        if rec is not None and rec.state is a.to:
            return
        self.store.transition(a.job_id, a.to, a.reason, self._clock())
        log.info("job is now %s: %s", a.to.value, a.reason)
        out.transitions.append((a.job_id, a.to))

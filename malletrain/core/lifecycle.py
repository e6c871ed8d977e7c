"""The lifecycle of a malleable job: ONE table of allowed transitions, with history (pure).

Why a table: the daemon changes a job's state from many places (a user's submit or cancel,
a tick that places its first slot, a finish record from its workers, a restart that
reconciles). If each place decided for itself what may follow what, a restarted daemon could
"complete" a cancelled job or start a finished one. Every change goes through
:func:`advance`, which refuses anything not in :data:`TRANSITIONS` and appends a
:class:`Transition` to the history, so ``malletrain jobs`` and the store can say when and why
a job got where it is.

States::

    submitting --> queued --> starting --> running <--> stalled
         |            |          |   ^        |            |
         |            |          |   |        v            |
         |            |          |   +---- evicted <-------+
         v            v          v            |
      (cancelling / failed from anywhere not terminal)      completing --> completed
                                                           cancelling --> cancelled

* ``submitting``: the user's ``malletrain submit`` got an id and is submitting its slot jobs.
* ``queued``: slots are parked in Slurm (held); the job holds no node and has never trained.
* ``starting``: slots were placed on nodes; no membership published yet.
* ``running``: a membership is published; the job trains on >= 1 node.
* ``stalled``: running, but no progress report for longer than the heartbeat timeout.
* ``evicted``: it trained before and holds no node now; its state is kept (evicted to zero).
* ``completing``/``cancelling``: the daemon is cleaning up its slot jobs.
* ``completed``, ``cancelled``, ``failed``: terminal.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class JobPhase(StrEnum):
    SUBMITTING = "submitting"
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    STALLED = "stalled"
    EVICTED = "evicted"
    COMPLETING = "completing"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def active(self) -> bool:
        """Whether the daemon still manages the job (places, shrinks, watches it)."""
        return self in _MANAGED


P = JobPhase

TERMINAL = frozenset({P.COMPLETED, P.CANCELLED, P.FAILED})
_MANAGED = frozenset({P.QUEUED, P.STARTING, P.RUNNING, P.STALLED, P.EVICTED})

#: state -> states it may move to. Nothing else is allowed.
TRANSITIONS: dict[JobPhase, frozenset[JobPhase]] = {
    P.SUBMITTING: frozenset({P.QUEUED, P.CANCELLED, P.FAILED}),
    P.QUEUED: frozenset({P.STARTING, P.CANCELLING, P.FAILED}),
    P.STARTING: frozenset({P.RUNNING, P.QUEUED, P.EVICTED, P.COMPLETING, P.CANCELLING,
                           P.FAILED}),
    P.RUNNING: frozenset({P.STALLED, P.EVICTED, P.COMPLETING, P.CANCELLING, P.FAILED}),
    P.STALLED: frozenset({P.RUNNING, P.EVICTED, P.COMPLETING, P.CANCELLING, P.FAILED}),
    P.EVICTED: frozenset({P.STARTING, P.RUNNING, P.COMPLETING, P.CANCELLING, P.FAILED}),
    P.COMPLETING: frozenset({P.COMPLETED, P.FAILED}),
    P.CANCELLING: frozenset({P.CANCELLED, P.FAILED}),
    P.COMPLETED: frozenset(),
    P.CANCELLED: frozenset(),
    P.FAILED: frozenset(),
}


class IllegalTransition(ValueError):
    """A transition the table does not allow (a bug in the caller, or a stale decision)."""


@dataclass(frozen=True)
class Transition:
    from_state: JobPhase | None  # None for the creation of the job
    to_state: JobPhase
    at_s: float
    reason: str


@dataclass(frozen=True)
class Lifecycle:
    """A job's current state and how it got there (oldest first)."""

    state: JobPhase
    history: tuple[Transition, ...]

    @classmethod
    def new(cls, at_s: float, reason: str = "submitted") -> Lifecycle:
        first = Transition(None, P.SUBMITTING, at_s, reason)
        return cls(P.SUBMITTING, (first,))

    def can(self, to: JobPhase) -> bool:
        return to in TRANSITIONS[self.state]

    def since_s(self) -> float:
        """When the current state was entered."""
        return self.history[-1].at_s

    def first_s(self, state: JobPhase) -> float | None:
        """When ``state`` was first entered (None: never), e.g. a job's first start."""
        return next((t.at_s for t in self.history if t.to_state == state), None)


def allowed(from_state: JobPhase, to_state: JobPhase) -> bool:
    return to_state in TRANSITIONS[from_state]


def advance(lc: Lifecycle, to: JobPhase, at_s: float, reason: str) -> Lifecycle:
    """``lc`` moved to ``to``; raises :class:`IllegalTransition` if the table forbids it."""
    if not allowed(lc.state, to):
        raise IllegalTransition(
            f"job lifecycle: {lc.state.value} -> {to.value} is not allowed ({reason}); "
            f"allowed from {lc.state.value}: "
            f"{', '.join(sorted(s.value for s in TRANSITIONS[lc.state])) or 'nothing'}"
        )
    return Lifecycle(to, (*lc.history, Transition(lc.state, to, at_s, reason)))


def replay(transitions: list[Transition] | tuple[Transition, ...]) -> Lifecycle:
    """Rebuild a lifecycle from stored history, checking every step against the table."""
    if not transitions or transitions[0].from_state is not None:
        raise IllegalTransition("job lifecycle: history must start with the creation")
    lc = Lifecycle(transitions[0].to_state, (transitions[0],))
    for t in transitions[1:]:
        if t.from_state is not lc.state:
            raise IllegalTransition(
                f"job lifecycle: history jumps from {lc.state.value} to a transition out of "
                f"{t.from_state.value if t.from_state else 'nothing'}"
            )
        lc = advance(lc, t.to_state, t.at_s, t.reason)
    return lc

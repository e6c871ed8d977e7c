"""The wire protocol between the coordinator and the workers: store keys and records.

Everything an elastic job shares lives in ONE ``torch.distributed.TCPStore`` hosted off the
preemptible nodes (by the daemon, or by ``malletrain coordinator``). Keeping *all* state in
the store (and none in the Python object that wrote it) is what lets a restarted daemon
re-attach: :class:`~malletrain.elastic.coordinator.handle.Coordinator` reads the epochs, the
registrations and the progress back from the keys below.

Keys of job ``J`` (all under ``mt/J/``)::

    latest               hint: the newest epoch number (text int); readers scan upward from it
    cfg/<e>              Membership of epoch e (JSON). Written ONCE with compare_set(key, "", v):
                         whoever writes it first (coordinator publish, or survivors healing
                         after a failure / a SIGTERM) defines epoch e; losers re-read.
    events               counter (store.add) of the append-only event log
    ev/<i>               Event i (JSON): a member registered (its workers are up and waiting)
                         or departed (sigterm / removed / failed / crashed / finished / state_lost)
    progress             the newest ProgressReport (JSON), written by global rank 0
    finished             FinishRecord (JSON) once the job reached its stop condition
    arrive/<e>/<m>/<lr>  "process lr of member m is ready to form epoch e" (pre-rendezvous)
    go/<e>               "go" once all processes of e arrived, or "abort" (a newer epoch
                         appeared / the join timed out) -- compare_set, so all agree
    alive/<e>/<m>/<lr>   "process lr of member m survived a failure of epoch e" (healing)
    pg/<e>/...           the process group rendezvous of epoch e (fresh PrefixStore per epoch)

This module is pure (no torch, no I/O) so the record formats are unit-tested directly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from malletrain.errors import PermanentError

#: job and member ids end up inside store keys: no "/" or spaces allowed.
#: ``\Z``, not ``$``: ``$`` also matches before a trailing newline ("m1\n" is no id).
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
#: the most events a job's log can hold (the coordinator's key limit per job): the daemon
#: refuses a larger ``events`` counter as a bad record instead of reading that many keys
MAX_EVENTS = 100_000
#: the most epochs a job's own processes may write past ``latest`` (a heal or a leave
#: writes the next epoch, then ``latest``): the daemon's scan upward stays this short
MAX_EPOCHS_AHEAD = 8

#: why a member's processes left the job.
#: ``state_lost``: the member held the job's last state and could not save it (evicted to
#: zero nodes, its snapshot not written); the daemon fails the job with that reason
DepartureReason = Literal["sigterm", "removed", "failed", "crashed", "finished", "state_lost"]
#: who wrote a membership epoch: the coordinator (publish), survivors after a failure
#: (heal), or survivors after members announced a SIGTERM at a step boundary (leave).
MembershipSource = Literal["publish", "heal", "leave"]


def check_id(kind: str, value: str) -> str:
    """Return ``value`` if it is a valid job/member id, else raise a one-line error."""
    if not ID_RE.match(value):
        raise PermanentError(
            f"invalid {kind} {value!r}: use 1-128 characters from [A-Za-z0-9._-], "
            "starting with a letter or digit"
        )
    return value


class Keys:
    """Store key names of one job (see the module docstring for the layout)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = check_id("job id", job_id)
        self.root = f"mt/{job_id}/"

    @property
    def latest(self) -> str:
        return self.root + "latest"

    def cfg(self, epoch: int) -> str:
        return f"{self.root}cfg/{epoch}"

    @property
    def events(self) -> str:
        return self.root + "events"

    def event(self, index: int) -> str:
        return f"{self.root}ev/{index}"

    @property
    def progress(self) -> str:
        return self.root + "progress"

    @property
    def finished(self) -> str:
        return self.root + "finished"

    def arrive(self, epoch: int, member_id: str, local_rank: int) -> str:
        return f"{self.root}arrive/{epoch}/{member_id}/{local_rank}"

    def go(self, epoch: int) -> str:
        return f"{self.root}go/{epoch}"

    def alive(self, epoch: int, member_id: str, local_rank: int) -> str:
        return f"{self.root}alive/{epoch}/{member_id}/{local_rank}"

    def pg_prefix(self, epoch: int) -> str:
        return f"{self.root}pg/{epoch}"


@dataclass(frozen=True)
class MemberInfo:
    """A member (one node slot running ``local_world_size`` worker processes)."""

    member_id: str
    node: str
    pid: int
    local_world_size: int
    registered_at_s: float  # unix time of the registration
    #: restart mode: the node slot's Slurm node name, Slurm job id and the agent's private
    #: directory (the batch shell's ``srun`` places a step's tasks in those slots)
    slurm_node: str = ""
    slurm_job: int = 0
    run_dir: str = ""


@dataclass(frozen=True)
class Membership:
    """Who is in the job during one epoch, in rank order.

    Global rank of local rank ``lr`` of ``members[i]`` is
    ``sum(local_world_sizes[:i]) + lr`` (``i * K + lr`` when every member runs K processes).
    """

    epoch: int
    members: tuple[str, ...]
    local_world_sizes: tuple[int, ...]
    source: MembershipSource
    published_at_s: float
    #: members the writer of a "heal"/"leave" epoch dropped, and why they were dropped.
    dropped: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        return sum(self.local_world_sizes)

    def rank_offset(self, member_id: str) -> int:
        i = self.members.index(member_id)
        return sum(self.local_world_sizes[:i])

    def local_world_size(self, member_id: str) -> int:
        return self.local_world_sizes[self.members.index(member_id)]


@dataclass(frozen=True)
class ProgressReport:
    """What global rank 0 reports at most every ``report_interval_s`` (and at the end)."""

    epoch: int
    step: int  # completed optimizer steps since the job started (survives rescales)
    samples_total: int  # samples processed since the job started
    samples_per_s: float  # global throughput over the last report interval
    world_size: int
    step_time_s: float  # mean wall time of one step over the last report interval
    time_s: float  # unix time of the report
    members: tuple[str, ...] = ()
    #: mean seconds a step waited for the gradient all-reduce (None: not measured, e.g.
    #: restart mode, where malletrain does not see the script's steps)
    sync_time_s: float | None = None


@dataclass(frozen=True)
class Departure:
    """A member's processes left (or were found gone). ``seq`` orders the event log."""

    seq: int
    member_id: str
    reason: DepartureReason
    epoch: int | None
    step: int | None
    time_s: float
    #: what failed, in the member's words (restart mode: the step's ``srun: error:`` line)
    detail: str = ""


@dataclass(frozen=True)
class FinishRecord:
    """The job reached its stop condition; ``samples_total`` is exact."""

    step: int
    samples_total: int
    time_s: float


@dataclass(frozen=True)
class Event:
    """One entry of the append-only event log of a job."""

    seq: int
    kind: Literal["register", "depart"]
    member_id: str
    time_s: float
    data: Mapping[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------- event log views


def member_info(ev: Event) -> MemberInfo:
    return MemberInfo(
        member_id=ev.member_id,
        node=str(ev.data.get("node", "")),
        pid=int(ev.data.get("pid", 0)),
        local_world_size=int(ev.data.get("local_world_size", 1)),
        registered_at_s=ev.time_s,
        slurm_node=str(ev.data.get("slurm_node", "")),
        slurm_job=int(ev.data.get("slurm_job", 0)),
        run_dir=str(ev.data.get("run_dir", "")),
    )


def departures(events: Iterable[Event]) -> list[Departure]:
    """The departure events, in log order."""
    out = []
    for ev in events:
        if ev.kind != "depart":
            continue
        epoch = ev.data.get("epoch")
        step = ev.data.get("step")
        out.append(
            Departure(
                seq=ev.seq,
                member_id=ev.member_id,
                reason=ev.data.get("reason", "crashed"),
                epoch=None if epoch is None else int(epoch),
                step=None if step is None else int(step),
                time_s=ev.time_s,
                detail=str(ev.data.get("detail", "")),
            )
        )
    return out


def departed(events: Iterable[Event], reason: DepartureReason | None = None) -> set[str]:
    """The members that departed (for ``reason`` only, if given)."""
    return {d.member_id for d in departures(events) if reason is None or d.reason == reason}


def live_registrations(events: Iterable[Event]) -> dict[str, MemberInfo]:
    """Members whose newest event is a registration (up, not departed since)."""
    latest: dict[str, Event] = {}
    for ev in sorted(events, key=lambda e: e.seq):
        latest[ev.member_id] = ev
    return {m: member_info(ev) for m, ev in latest.items() if ev.kind == "register"}


def waiting_members(
    events: Iterable[Event], current: Membership | None
) -> dict[str, MemberInfo]:
    """Registered members that are not in the current membership (ready to be added)."""
    in_job = set(current.members) if current is not None else set()
    return {m: info for m, info in live_registrations(events).items() if m not in in_job}


def build_membership(
    epoch: int,
    members: Sequence[str],
    sizes: Mapping[str, int],
    source: MembershipSource,
    now_s: float,
    dropped: Sequence[str] = (),
) -> Membership:
    """A Membership for ``members`` (order = rank order), validating the ids."""
    seen: set[str] = set()
    for m in members:
        check_id("member id", m)
        if m in seen:
            raise PermanentError(f"member {m!r} listed twice in the membership")
        seen.add(m)
    missing = [m for m in members if m not in sizes]
    if missing:
        raise PermanentError(
            f"cannot publish unknown member(s) {missing}: they never registered with the "
            "coordinator (their workers are not up)"
        )
    return Membership(
        epoch=epoch,
        members=tuple(members),
        local_world_sizes=tuple(int(sizes[m]) for m in members),
        source=source,
        published_at_s=now_s,
        dropped=tuple(dropped),
    )


def choose_source(table: list[list[int]]) -> tuple[int, int, bool]:
    """Pick the rank whose state everybody adopts: (rank, its step, from a snapshot?).

    ``table[r] = [has_state, step, newest snapshot step or -1, dirty (optional)]`` of rank
    r. The freshest live replica (highest step; among equals a clean one, i.e. one that holds
    no update of an aborted step, then the lowest rank) wins, unless a snapshot of this job
    is newer than every live replica. With no state anywhere (a new job) rank 0's fresh
    initialization is copied so that all replicas start equal (step -1 marks that case).
    """
    live = [(row[1], not (row[3] if len(row) > 3 else 0), -r)
            for r, row in enumerate(table) if row[0]]
    snaps = [(row[2], -r) for r, row in enumerate(table) if row[2] >= 0]
    best_live = max(live) if live else None
    best_snap = max(snaps) if snaps else None
    if best_snap is not None and (best_live is None or best_snap[0] > best_live[0]):
        return -best_snap[1], best_snap[0], True
    if best_live is not None:
        return -best_live[2], best_live[0], False
    return 0, -1, False


#: how far back :func:`previous_members` looks for the last group with members
HOLDER_LOOKBACK_EPOCHS = 16


def _recent(membership_of: Callable[[int], Membership | None],
            cfg: Membership) -> Iterator[Membership]:
    """The epochs before ``cfg``, newest first, up to :data:`HOLDER_LOOKBACK_EPOCHS`."""
    for e in range(cfg.epoch - 1, max(0, cfg.epoch - 1 - HOLDER_LOOKBACK_EPOCHS), -1):
        m = membership_of(e)
        if m is not None:
            yield m


def previous_members(
    membership_of: Callable[[int], Membership | None], cfg: Membership
) -> tuple[str, ...]:
    """The members of the newest epoch before ``cfg`` that had any (the last group; an
    eviction epoch, with no members, in between is skipped)."""
    return next((m.members for m in _recent(membership_of, cfg) if m.members), ())


def last_holders(
    membership_of: Callable[[int], Membership | None], cfg: Membership
) -> list[str]:
    """Members of the :data:`HOLDER_LOOKBACK_EPOCHS` epochs before ``cfg`` that ``cfg``
    leaves out.

    When ``cfg`` holds no state (newcomers only), these are the processes that may still be
    writing the snapshot it needs: the last group's members, and a member an epoch before
    removed while the others left on a SIGTERM (it saves then). Those that left long ago
    have their departure recorded, so waiting for them costs nothing.
    """
    out: list[str] = []
    for m in _recent(membership_of, cfg):
        out += [x for x in m.members if x not in cfg.members and x not in out]
    return out

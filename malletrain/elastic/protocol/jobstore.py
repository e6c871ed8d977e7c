"""Reads and writes of one job's keys in the shared store (used by both sides).

The coordinator (daemon side) and the workers go through this one class so that the
protocol of :mod:`malletrain.elastic.protocol.keys` is implemented exactly once. The store is
duck-typed (:class:`StoreLike`): a ``torch.distributed.TCPStore`` in production, which keeps
this module free of a torch import.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from malletrain.elastic.protocol import keys as p
from malletrain.elastic.protocol import records as r

log = logging.getLogger(__name__)


def epoch_hint(raw: bytes | None) -> int:
    """The ``latest`` key's value as an epoch to scan up from (junk counts as none)."""
    return int(raw) if raw and raw.isdigit() and len(raw) < 19 else 0


class StoreLike(Protocol):
    """The subset of ``torch.distributed.Store`` used here."""

    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str) -> bytes: ...
    def add(self, key: str, amount: int) -> int: ...
    def check(self, keys: list[str]) -> bool: ...
    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...
    def delete_key(self, key: str) -> bool: ...


class JobStore:
    """One job's view of the store. Not thread-safe; callers serialize."""

    def __init__(self, store: StoreLike, job_id: str) -> None:
        self.store = store
        self.keys = p.Keys(job_id)
        self.job_id = job_id
        #: cache of the append-only log, read incrementally; None: a record that failed its
        #: schema (skipped, so that one bad write cannot poison the job's whole log)
        self._events: list[p.Event | None] = []
        #: records of this job refused so far (bad events, progress, memberships...)
        self.bad_records = 0
        #: (events read, live registrations, departures) as of that many events
        self._views: tuple[int, dict[str, p.MemberInfo], list[p.Departure]] | None = None
        #: the highest epoch a batched read found (epochs are never deleted while the
        #: namespace lives; the daemon's handle drops its JobStores when it reconnects)
        self.epoch_floor = 0

    # ------------------------------------------------------------------ memberships

    def get_if_set(self, key: str) -> bytes | None:
        """The key's value, or None when it is not set (``get()`` would block on it)."""
        if not self.store.check([key]):
            return None
        return self.store.get(key)

    def latest_epoch(self) -> int:
        """The newest published epoch, 0 if none. Scans upward from the ``latest`` hint."""
        epoch = epoch_hint(self.get_if_set(self.keys.latest))
        while self.store.check([self.keys.cfg(epoch + 1)]):
            epoch += 1
        return epoch

    def has_epoch(self, epoch: int) -> bool:
        return self.store.check([self.keys.cfg(epoch)])

    def membership(self, epoch: int) -> p.Membership | None:
        raw = self.get_if_set(self.keys.cfg(epoch))
        return None if raw is None else r.decode_membership(raw)

    def current(self) -> p.Membership | None:
        epoch = self.latest_epoch()
        return self.membership(epoch) if epoch > 0 else None

    def propose(self, m: p.Membership) -> tuple[bool, p.Membership]:
        """Try to define epoch ``m.epoch``; return (won, the membership that holds)."""
        mine = r.encode_membership(m)
        held = self.store.compare_set(self.keys.cfg(m.epoch), "", mine)
        won = held.decode() == mine
        if won:
            self.store.set(self.keys.latest, str(m.epoch))
        return won, r.decode_membership(held)

    # ------------------------------------------------------------------ event log

    def append_event(self, kind: str, member_id: str, data: Mapping[str, Any]) -> int:
        seq = self.store.add(self.keys.events, 1) - 1
        self.store.set(self.keys.event(seq), r.encode_event(kind, member_id, time.time(), data))
        return seq

    def events(self) -> list[p.Event]:
        """All events so far (cached; only new ones are read)."""
        count = self.store.add(self.keys.events, 0)
        while len(self._events) < count:
            raw = self.get_if_set(self.keys.event(len(self._events)))
            if raw is None:  # counter bumped, record not written yet: read it next time
                break
            self.absorb_events([raw])
        return self.cached_events()

    def next_event_seq(self) -> int:
        """The first event record not read yet."""
        return len(self._events)

    def absorb_events(self, raws: Sequence[bytes | None]) -> None:
        """Records :meth:`next_event_seq` onwards, in order, as read elsewhere (a batched
        read); stops at the first one not written yet (read it next time)."""
        for raw in raws:
            if raw is None:
                return
            seq = len(self._events)
            try:
                self._events.append(r.decode_event(seq, raw))
            except r.RecordError as exc:
                self.bad_records += 1
                log.warning("job %s: event %d refused: %s", self.job_id, seq, exc)
                self._events.append(None)

    def cached_events(self) -> list[p.Event]:
        """The events read so far (records that failed their schema left out)."""
        return [e for e in self._events if e is not None]

    def event_views(self) -> tuple[dict[str, p.MemberInfo], list[p.Departure]]:
        """The live registrations and the departures of the events read so far, worked out
        again only when an event was added: the daemon asks every tick, for every job, and
        the log rarely grows between two ticks (copies: callers may keep or change them)."""
        if self._views is None or self._views[0] != len(self._events):
            events = self.cached_events()
            self._views = (len(self._events), p.live_registrations(events),
                           p.departures(events))
        return dict(self._views[1]), list(self._views[2])

    def register(self, info: p.MemberInfo) -> int:
        data: dict[str, Any] = {"node": info.node, "pid": info.pid,
                                "local_world_size": info.local_world_size}
        if info.slurm_job:
            data.update(slurm_node=info.slurm_node, slurm_job=info.slurm_job,
                        run_dir=info.run_dir)
        return self.append_event("register", info.member_id, data)

    def depart(
        self, member_id: str, reason: p.DepartureReason, epoch: int | None, step: int | None,
        detail: str = "",
    ) -> int:
        """``detail``: what failed, one line (cut to :data:`records.MAX_DETAIL`)."""
        data: dict[str, object] = {"reason": reason, "epoch": epoch, "step": step}
        if detail:
            data["detail"] = "".join(c if c.isprintable() else " "
                                     for c in detail)[:r.MAX_DETAIL]
        return self.append_event("depart", member_id, data)

    # ------------------------------------------------------------------ progress / finish

    def set_progress(self, report: p.ProgressReport) -> None:
        self.store.set(self.keys.progress, r.encode_progress(report))

    def progress(self) -> p.ProgressReport | None:
        raw = self.get_if_set(self.keys.progress)
        return None if raw is None else r.decode_progress(raw)

    def set_finished(self, record: p.FinishRecord) -> None:
        self.store.set(self.keys.finished, r.encode_finish(record))

    def finished(self) -> p.FinishRecord | None:
        raw = self.get_if_set(self.keys.finished)
        return None if raw is None else r.decode_finish(raw)

    # ------------------------------------------------------------------ per-epoch markers

    def mark(self, key: str) -> None:
        self.store.set(key, "1")

    def all_present(self, keys: Sequence[str]) -> bool:
        return self.store.check(list(keys)) if keys else True

    def present(self, keys: Sequence[str]) -> list[str]:
        return [k for k in keys if self.store.check([k])]

    # ------------------------------------------------------------------ cleanup

    def forget(self) -> int:
        """Delete the job's known keys; returns how many were deleted.

        The process-group rendezvous keys under ``pg/<e>/`` (written by gloo/NCCL, names not
        enumerable in a TCPStore) stay behind: a few hundred bytes per rank and epoch.
        """
        deleted = 0
        latest = self.latest_epoch()
        count = self.store.add(self.keys.events, 0)
        keys: list[str] = []
        for e in range(1, latest + 1):
            m = self.membership(e)
            keys.append(self.keys.go(e))
            if m is not None:
                for member, n in zip(m.members, m.local_world_sizes, strict=True):
                    for lr in range(n):
                        keys += [self.keys.arrive(e, member, lr), self.keys.alive(e, member, lr)]
        keys += [self.keys.cfg(e) for e in range(1, latest + 1)]
        keys += [self.keys.event(i) for i in range(count)]
        keys += [self.keys.latest, self.keys.events, self.keys.progress, self.keys.finished]
        for key in keys:
            if self.store.delete_key(key):
                deleted += 1
        self._events = []
        self._views = None
        return deleted

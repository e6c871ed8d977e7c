"""The daemon's read of every active job's coordinator state in two round trips.

Read one job at a time (:class:`~malletrain.elastic.coordinator.handle.Coordinator`'s per-job
methods), a job cost about a dozen requests (membership, registrations, progress, finish
record, departures): 771 requests and 187 ms of a tick at 100 jobs
(``benchmarks/load.py``). Here the admin session's ``READ_MANY`` (:mod:`.kvserver`) reads
every job's ``latest``, event count, progress and finish record at once, then every job's
newest membership and new event records at once. The records are decoded by the same
strict decoders (:mod:`.records`): a job whose record fails its schema gets its
:class:`~malletrain.elastic.protocol.records.RecordError` in place of a view, the others are read
as usual.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from malletrain.elastic.protocol import keys as p
from malletrain.elastic.protocol import records as r
from malletrain.elastic.protocol.authclient import AuthClient
from malletrain.elastic.protocol.jobstore import JobStore, epoch_hint


@dataclass(frozen=True)
class JobRead:
    """One job's state in the coordinator, as one tick reads it."""

    membership: p.Membership | None
    live: dict[str, p.MemberInfo]
    progress: p.ProgressReport | None
    finished: p.FinishRecord | None
    departures: list[p.Departure]
    #: event records of the job skipped so far for failing their schema
    bad_records: int


def read_jobs(store: AuthClient, job_store: Callable[[str], JobStore],
              job_ids: Sequence[str]) -> dict[str, JobRead | r.RecordError]:
    """Every job's :class:`JobRead` (or the error of its bad record), in two round trips."""
    stores = [job_store(j) for j in job_ids]
    first = store.read_many([k for js in stores for k in (
        js.keys.latest, js.keys.events, js.keys.progress, js.keys.finished)])
    second_keys: list[str] = []
    spans: list[tuple[int, int, int]] = []  # per job: epoch, its keys' start, event count
    for i, js in enumerate(stores):
        latest, count = first[4 * i], first[4 * i + 1]
        epoch = epoch_hint(latest)
        n_events = int(count) if count and count.isdigit() else 0
        spans.append((epoch, len(second_keys), n_events))
        second_keys += [js.keys.cfg(epoch), js.keys.cfg(epoch + 1)]
        second_keys += [js.keys.event(s) for s in range(js.next_event_seq(), n_events)]
    second = store.read_many(second_keys)
    out: dict[str, JobRead | r.RecordError] = {}
    for i, js in enumerate(stores):
        epoch, start, n_events = spans[i]
        n_new = max(0, n_events - js.next_event_seq())
        js.absorb_events(second[start + 2:start + 2 + n_new])
        try:
            out[js.job_id] = _job_read(js, epoch, second[start], second[start + 1],
                                       first[4 * i + 2], first[4 * i + 3])
        except r.RecordError as exc:
            out[js.job_id] = exc
    return out


def _job_read(js: JobStore, epoch: int, cfg: bytes | None, newer: bytes | None,
              progress: bytes | None, finished: bytes | None) -> JobRead:
    if newer is not None:
        membership = js.current()  # epochs were written past the hint: scan as JobStore does
    else:
        membership = _membership(cfg) if epoch > 0 and cfg is not None else None
    live, departures = js.event_views()
    return JobRead(
        membership=membership,
        live=live,
        progress=None if progress is None else r.decode_progress(progress),
        finished=None if finished is None else r.decode_finish(finished),
        departures=departures,
        bad_records=js.bad_records,
    )


@functools.lru_cache(maxsize=4096)
def _membership(raw: bytes) -> p.Membership:
    """A membership record, decoded once: it stays the same for an epoch, read every tick
    (a record that fails its schema raises each time: exceptions are not cached)."""
    return r.decode_membership(raw)

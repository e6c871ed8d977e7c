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

What a job writes cannot make the tick slow for the others: its ``events`` counter must be a
number the coordinator could hold (:data:`~malletrain.elastic.protocol.keys.MAX_EVENTS`,
else that job's read is a :class:`RecordError`), at most :data:`EVENTS_PER_TICK` new event
records are read per job and tick (the rest at the next ticks), and epochs written past the
``latest`` hint are found with one batched read of :data:`EPOCH_WINDOW` keys, never a scan
one request at a time; the highest epoch found is remembered (epochs are never deleted).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from malletrain.elastic.protocol import keys as p
from malletrain.elastic.protocol import records as r
from malletrain.elastic.protocol.authclient import AuthClient
from malletrain.elastic.protocol.jobstore import JobStore, epoch_hint

#: new event records read per job and tick (a job logs a few per rescale)
EVENTS_PER_TICK = 256
#: epochs past the hint read in one batch (a job may write 8 past ``latest``)
EPOCH_WINDOW = 2 * p.MAX_EPOCHS_AHEAD


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
    spans: list[tuple[int, int, int] | r.RecordError] = []  # epoch, keys' start, new events
    for i, js in enumerate(stores):
        try:
            n_events = _event_count(first[4 * i + 1])
        except r.RecordError as exc:
            spans.append(exc)
            continue
        epoch = max(epoch_hint(first[4 * i]), js.epoch_floor)
        n_new = max(0, min(n_events - js.next_event_seq(), EVENTS_PER_TICK))
        spans.append((epoch, len(second_keys), n_new))
        second_keys += [js.keys.cfg(e) for e in range(epoch, epoch + EPOCH_WINDOW + 1)]
        second_keys += [js.keys.event(s) for s in range(js.next_event_seq(),
                                                        js.next_event_seq() + n_new)]
    second = store.read_many(second_keys)
    out: dict[str, JobRead | r.RecordError] = {}
    for i, js in enumerate(stores):
        span = spans[i]
        if isinstance(span, r.RecordError):
            out[js.job_id] = span
            continue
        epoch, start, n_new = span
        cfgs = second[start:start + EPOCH_WINDOW + 1]
        try:
            js.absorb_events(second[start + EPOCH_WINDOW + 1:start + EPOCH_WINDOW + 1 + n_new])
            out[js.job_id] = _job_read(js, epoch, cfgs, first[4 * i + 2], first[4 * i + 3])
        except r.RecordError as exc:
            out[js.job_id] = exc
        except Exception as exc:  # whatever a job's own bytes do, they stay that job's
            out[js.job_id] = r.RecordError(
                f"unreadable record ({type(exc).__name__}: {exc})"[:200])
    return out


def _event_count(raw: bytes | None) -> int:
    """The ``events`` counter, which the job's own processes write: a decimal up to
    :data:`~malletrain.elastic.protocol.keys.MAX_EVENTS`, else a bad record of that job."""
    if raw is None:
        return 0
    if not raw.isdigit() or len(raw) > 7 or int(raw) > p.MAX_EVENTS:
        raise r.RecordError(f"the events counter {raw[:24]!r} is out of range "
                            f"(at most {p.MAX_EVENTS})")
    return int(raw)


def _job_read(js: JobStore, epoch: int, cfgs: Sequence[bytes | None],
              progress: bytes | None, finished: bytes | None) -> JobRead:
    """``cfgs``: the epochs ``epoch`` .. ``epoch + EPOCH_WINDOW`` as read (None: absent)."""
    top = 0
    for k, raw in enumerate(cfgs):
        if raw is not None and epoch + k > 0:
            top = k
        elif k > 0:
            break
    membership = None
    if epoch + top > 0 and cfgs[top] is not None:
        js.epoch_floor = max(js.epoch_floor, epoch + top)
        membership = _membership(cfgs[top])
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

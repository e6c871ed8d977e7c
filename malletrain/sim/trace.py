"""Idle-node traces: what the simulated cluster leaves idle, event by event.

Every trace source (idle-node CSV, Philly's per-minute log, an SWF job log replayed
through FCFS + EASY backfill) becomes the same stream of :class:`TraceEvent` s, so the
replay engine does not care where idleness came from. Nodes are small integers
(indices into :attr:`IdleTrace.node_names`) because a 4,000-node trace changes a few
nodes per event and the engine must not pay per node per event.

Readers are pure parsers over text: a malformed row raises :class:`TraceError` naming
the file, the line and the field, never a traceback.
"""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from malletrain.errors import PermanentError

log = logging.getLogger(__name__)


class TraceError(PermanentError):
    """An input file the simulator cannot use; the message names file, line and field."""


def input_error(path: str | Path, line: int | None, field: str, what: str) -> TraceError:
    where = f"{path}:{line}" if line is not None else str(path)
    return TraceError(f"{where}: field '{field}': {what}")


@dataclass(frozen=True)
class PlannedStart:
    """One pending job of the regular workload as the backfill plan sees it now.

    ``nodes`` are only the plan's nodes that are idle right now (the others are
    busy anyway), which is all the scavenger needs to bound a hole.
    """

    job_id: int
    start_s: float
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class TraceEvent:
    """The cluster at one change time: which nodes turned idle or busy."""

    time_s: float
    became_idle: tuple[int, ...]
    became_busy: tuple[int, ...]
    #: The backfill plan at this time; ``None`` when the source predicts nothing.
    planned: tuple[PlannedStart, ...] | None = None
    #: When each ``became_idle`` node really turned idle, if earlier than ``time_s``
    #: (the first event of a slice: its nodes have been idle for a while).
    idle_since_s: tuple[float, ...] | None = None


@dataclass(frozen=True)
class IdleTrace:
    """A named node set and a time-ordered stream of idle/busy changes.

    The first event (at ``start_s``) turns the initially idle nodes idle. ``events``
    is an iterator factory so long sources (an SWF replay) are produced lazily.
    """

    source: str
    node_names: tuple[str, ...]
    start_s: float
    #: Last time the source knows anything about (the replay stops there at the latest).
    end_s: float
    events_list: tuple[TraceEvent, ...] = ()

    def events(self) -> Iterator[TraceEvent]:
        return iter(self.events_list)


def read_text(path: str | Path) -> str:
    """A trace file's text, or a :class:`TraceError` naming it."""
    p = Path(path)
    try:
        if p.suffix == ".gz":
            import gzip

            return gzip.decompress(p.read_bytes()).decode()
        return p.read_text()
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise TraceError(f"{path}: cannot read: {reason}") from None


def _check_time(path: str, line: int, field: str, text: str, last: float | None) -> float:
    try:
        value = float(text)
    except ValueError:
        raise input_error(path, line, field, f"not a number: {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise input_error(path, line, field, f"not a finite number: {text!r}")
    if value < 0:
        raise input_error(path, line, field, f"negative time {value:g}")
    if last is not None and value < last:
        raise input_error(
            path, line, field, f"rows not sorted by time ({value:g} after {last:g})"
        )
    return value


def csv_rows(name: str, text: str, expected: tuple[str, ...], *, exact: bool
              ) -> Iterator[tuple[int, list[str]]]:
    """(line number, row) of a CSV with the ``expected`` header; blank rows skipped."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    cols = [h.strip() for h in header] if header else []
    if cols[: len(expected)] != list(expected) or (exact and len(cols) != len(expected)):
        raise input_error(name, 1, "header", f"expected '{','.join(expected)}', got {header!r}")
    for lineno, row in enumerate(reader, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < len(expected) or (exact and len(row) != len(expected)):
            raise input_error(name, lineno, "row",
                              f"expected {len(expected)} fields, got {len(row)}")
        yield lineno, row


def _idle_row(name: str, lineno: int, row: list[str], last_t: float | None
              ) -> tuple[float, str, bool]:
    """One ``time_s,node,state`` row, checked: (time, node, idle)."""
    t = _check_time(name, lineno, "time_s", row[0].strip(), last_t)
    node = row[1].strip()
    st = row[2].strip().lower()
    if not node:
        raise input_error(name, lineno, "node", "empty node name")
    if st not in ("idle", "busy"):
        raise input_error(name, lineno, "state", f"expected 'idle' or 'busy', got {row[2]!r}")
    if last_t is None and t != 0:
        raise input_error(name, lineno, "time_s", f"the first rows must be at time 0 (got {t:g})")
    return t, node, st == "idle"


def read_idle_csv(path: str | Path, text: str | None = None) -> IdleTrace:
    """Read ``time_s,node,state`` rows: time-0 rows name every node, later rows are changes.

    Unknown nodes after time 0, unsorted or negative times and states other than
    ``idle``/``busy`` are errors. A row that repeats a node's current state is allowed
    and changes nothing.
    """
    name = str(path)
    index: dict[str, int] = {}
    state: list[bool] = []  # True = idle
    initial_idle: list[int] = []
    last_t: float | None = None
    changes: dict[float, tuple[list[int], list[int]]] = {}  # time -> (became idle, busy)
    rows = csv_rows(name, read_text(path) if text is None else text,
                     ("time_s", "node", "state"), exact=True)
    for lineno, row in rows:
        t, node, idle = _idle_row(name, lineno, row, last_t)
        last_t = t
        if t == 0 and not changes:
            if node in index:
                raise input_error(name, lineno, "node", f"node {node!r} listed twice at time 0")
            index[node] = len(state)
            state.append(idle)
            if idle:
                initial_idle.append(index[node])
            continue
        if node not in index:
            raise input_error(name, lineno, "node", f"unknown node {node!r} (not listed at time 0)")
        became_idle, became_busy = changes.setdefault(t, ([], []))
        i = index[node]
        if state[i] != idle:
            state[i] = idle
            (became_idle if idle else became_busy).append(i)
    if not index:
        raise input_error(name, None, "rows", "no nodes listed at time 0")
    events = [TraceEvent(0.0, tuple(initial_idle), ()),
              *(TraceEvent(t, tuple(a), tuple(b)) for t, (a, b) in changes.items() if a or b)]
    end = last_t if last_t is not None else 0.0
    return IdleTrace(name, tuple(index), 0.0, end, tuple(events))


def slice_from(trace: IdleTrace, start_s: float) -> IdleTrace:
    """The trace from ``start_s`` on; the state at ``start_s`` becomes its first event."""
    since: dict[int, float] = {}
    later: list[TraceEvent] = []
    for ev in trace.events():
        if ev.time_s <= start_s:
            for i in ev.became_idle:
                since.setdefault(i, ev.time_s)
            for i in ev.became_busy:
                since.pop(i, None)
        else:
            later.append(ev)
    idle = tuple(sorted(since))
    first = TraceEvent(start_s, idle, (), None, tuple(since[i] for i in idle))
    return IdleTrace(trace.source, trace.node_names, start_s, trace.end_s, (first, *later))

"""Idle-node traces from logs that count, not name, the idle nodes.

Philly's per-minute node log, a Helios virtual cluster's per-minute GPU log and the
recorded schedule of a job log (Cirrus) all say *how many* nodes are idle, not which.
They become traces the same way (:func:`stack_trace`): the idle set is always the
``k`` lowest-numbered nodes, a stack, so the node that turned idle last is the first
taken back. A node's idle age then predicts how long it stays idle, as it does in
real clusters where long holes outlast short ones. None of them has a backfill plan.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from malletrain.sim.trace import IdleTrace, TraceEvent, csv_rows, input_error, read_text


def stack_trace(source: str, prefix: str, counts: Sequence[tuple[float, int]], end_s: float,
                nodes: int | None = None) -> IdleTrace:
    """``(time, idle count)`` changes (time-ordered, from 0) as a stack-model trace."""
    width = nodes if nodes is not None else max((k for _, k in counts), default=0)
    names = tuple(f"{prefix}-{i:03d}" for i in range(width))
    events: list[TraceEvent] = []
    prev = 0
    for t, k in counts:
        events.append(TraceEvent(t, tuple(range(prev, k)) if k > prev else (),
                                 tuple(range(k, prev)) if k < prev else ()))
        prev = k
    return IdleTrace(source, names, 0.0, end_s, tuple(events))


def _count(name: str, lineno: int, field: str, cell: str) -> int:
    try:
        v = int(float(cell))
    except ValueError:
        raise input_error(name, lineno, field, f"not a number: {cell!r}") from None
    if v < 0:
        raise input_error(name, lineno, field, f"negative count {v}")
    return v


def _minutes(name: str, rows: Sequence[tuple[int, datetime, int]]) -> tuple[list[tuple[float, int]],
                                                                             float]:
    """Per-row (time stamp, idle) as changes in seconds from the first row; the last time."""
    counts: list[tuple[float, int]] = []
    t0: datetime | None = None
    last_t: float | None = None
    for lineno, stamp, idle in rows:
        t0 = stamp if t0 is None else t0
        t = (stamp - t0).total_seconds()
        if t < 0 or (last_t is not None and t < last_t):
            raise input_error(name, lineno, "time", "rows not sorted by time")
        last_t = t
        if not counts or counts[-1][1] != idle:
            counts.append((t, idle))
    if not counts:
        raise input_error(name, None, "rows", "no data rows")
    return counts, last_t or 0.0


def _stamp(name: str, lineno: int, cell: str) -> datetime:
    try:
        return datetime.fromisoformat(cell.strip())
    except ValueError:
        raise input_error(name, lineno, "time", f"not a date-time: {cell!r}") from None


def read_philly_minutes(path: str | Path, text: str | None = None) -> IdleTrace:
    """Philly's per-minute ``time,active,total`` log; idle nodes = total - active."""
    name = str(path)
    rows = []
    for lineno, row in csv_rows(name, read_text(path) if text is None else text,
                                 ("time", "active", "total"), exact=False):
        active = _count(name, lineno, "active", row[1])
        total = _count(name, lineno, "total", row[2])
        if active > total:
            raise input_error(name, lineno, "active", f"{active} active > {total} total nodes")
        rows.append((lineno, _stamp(name, lineno, row[0]), total - active))
    counts, end = _minutes(name, rows)
    return stack_trace(name, "philly", counts, end)


def read_helios_minutes(path: str | Path, text: str | None = None) -> IdleTrace:
    """A Helios VC's per-minute log (``time``, ..., ``total_gpu_num``, ..., ``idle_gpu_num``).

    One node per GPU (a data-parallel worker, as in the measured profiles), all
    ``total_gpu_num`` of them named; idle = ``idle_gpu_num``.
    """
    name = str(path)
    body = read_text(path) if text is None else text
    header = next(csv.reader(io.StringIO(body)), [])
    cols = {c.strip(): i for i, c in enumerate(header)}
    missing = [c for c in ("time", "total_gpu_num", "idle_gpu_num") if c not in cols]
    if missing:
        raise input_error(name, 1, "header", f"missing column(s) {', '.join(missing)}")
    rows = []
    total = 0
    for lineno, row in csv_rows(name, body, tuple(header), exact=True):
        gpus = _count(name, lineno, "total_gpu_num", row[cols["total_gpu_num"]])
        idle = _count(name, lineno, "idle_gpu_num", row[cols["idle_gpu_num"]])
        if idle > gpus:
            raise input_error(name, lineno, "idle_gpu_num", f"{idle} idle > {gpus} GPUs")
        total = max(total, gpus)
        rows.append((lineno, _stamp(name, lineno, row[cols["time"]]), idle))
    counts, end = _minutes(name, rows)
    return stack_trace(name, "gpu", counts, end, nodes=total)


CIRRUS_HEADER = ("ID", "Type", "Submit Time", "Start Time", "End Time", "Wait Time", "Makespan",
                 "Turnaround Time", "Status", "Nodes")


def read_cirrus_jobs(path: str | Path, nodes: int = 280, cores_per_node: int = 36,
                     text: str | None = None) -> IdleTrace:
    """Idle nodes of a recorded schedule (EPCC's rigid-jobs CSV of Cirrus, from ``sacct``).

    ``Nodes`` holds cores there; a job holds ``ceil(cores / cores_per_node)`` whole
    nodes from its start to its end, and idle = ``nodes`` - held (never below 0: small
    jobs shared nodes). Times are seconds from the first submit.
    """
    name = str(path)
    deltas: dict[float, int] = {}
    for lineno, row in csv_rows(name, read_text(path) if text is None else text,
                                 CIRRUS_HEADER, exact=True):
        start = _count(name, lineno, "Start Time", row[3])
        end = _count(name, lineno, "End Time", row[4])
        cores = _count(name, lineno, "Nodes", row[9])
        if end < start:
            raise input_error(name, lineno, "End Time", f"ends ({end}) before it starts ({start})")
        held = -(-cores // cores_per_node)
        deltas[start] = deltas.get(start, 0) + held
        deltas[end] = deltas.get(end, 0) - held
    if not deltas:
        raise input_error(name, None, "rows", "no data rows")
    counts: list[tuple[float, int]] = []
    busy = 0
    for t in sorted(deltas):
        busy += deltas[t]
        idle = max(0, nodes - busy)
        if not counts or counts[-1][1] != idle:
            counts.append((float(t), idle))
    if counts[0][0] != 0.0:
        counts.insert(0, (0.0, nodes))
    return stack_trace(name, "cirrus", counts, float(max(deltas)), nodes=nodes)

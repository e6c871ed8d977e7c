"""Parsers of Slurm's text output (``scontrol show ... -o``, ``squeue --format``): plans,
partitions, reservations, topology, times.

The policy for odd output is :mod:`malletrain.slurm.parsers.parse`'s.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

from malletrain.core.cluster import Partition, Reservation
from malletrain.slurm.errors import SlurmParseError
from malletrain.slurm.hostlist import expand_hostlist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlannedStart:
    """The backfill plan of one pending job: when and where it is expected to start."""

    start_time: float | None
    nodes: tuple[str, ...]


def parse_planned(text: str, warnings: list[str] | None = None) -> dict[int, PlannedStart]:
    """``squeue -h -t PENDING -o "%A %S %Y"`` -> {job id: plan}; jobs with no plan are left out.

    ``%S`` is the expected start (local time, ``N/A`` if none) and ``%Y`` the planned nodes
    (``(null)`` if none), both from the same call so they belong to the same backfill pass.
    """
    warns = warnings if warnings is not None else []
    out: dict[int, PlannedStart] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 3 or not parts[0].isdigit():
            warns.append(f"squeue planned starts: cannot read line {line!r}; skipped")
            continue
        try:
            nodes = expand_hostlist(parts[2])
            start = slurm_time(parts[1])
        except (SlurmParseError, ValueError) as exc:
            warns.append(f"squeue planned start of job {parts[0]}: {exc}; skipped")
            continue
        if nodes:
            out[int(parts[0])] = PlannedStart(start_time=start, nodes=nodes)
    return out


_KEY_RE = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/.]*)=")


def parse_job_ids(text: str) -> frozenset[int]:
    """Job ids, one per line (``squeue --noheader --format=%A``); other lines are skipped.

    The arrival probe between ticks (:data:`~malletrain.slurm.versions.PENDING_IDS_COMMAND`)
    only compares ids with the last snapshot's, so an odd line costs nothing but a wake-up.
    """
    return frozenset(int(t) for t in (line.strip() for line in text.splitlines())
                     if t.isdigit())


def parse_job_gpus(text: str, warnings: list[str] | None = None) -> dict[int, int]:
    """``squeue -O JobID:0|,tres-alloc:0`` (:data:`~malletrain.slurm.versions.JOB_GPUS`)
    -> {job id: GPUs} for the jobs with any. A TRES string names GPUs as ``gres/gpu=N``
    and, where the site accounts GPU types, ``gres/gpu:TYPE=N`` beside it: the untyped
    count where given, else the typed ones summed. An odd line is skipped with a warning
    (the job then counts no GPUs; its nodes and its job still count)."""
    warns = warnings if warnings is not None else []
    out: dict[int, int] = {}
    for line in text.splitlines():
        job_id, sep, tres = line.strip().partition("|")
        if not line.strip():
            continue
        if not sep or not job_id.isdigit():
            warns.append(f"squeue GPUs: cannot read line {line[:80]!r}; skipped")
            continue
        counts = {name: value for name, _, value in (item.partition("=")
                                                      for item in tres.split(","))
                  if name == "gres/gpu" or name.startswith("gres/gpu:")}
        if not all(v.isdigit() for v in counts.values()):
            warns.append(f"squeue GPUs: job {job_id}: a GPU count is not a number in "
                         f"{tres[:80]!r}; no GPUs counted")
            continue
        gpus = (int(counts["gres/gpu"]) if "gres/gpu" in counts
                else sum(int(v) for v in counts.values()))
        if gpus:
            out[int(job_id)] = gpus
    return out


def parse_key_values(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` line -> {key: value}; values may contain spaces."""
    out: dict[str, str] = {}
    matches = list(_KEY_RE.finditer(line))
    ends = [m.start() for m in matches[1:]] + [len(line)]
    for m, end in zip(matches, ends[:len(matches)], strict=True):  # no key: no field
        key = m.group(1)
        if key not in out:
            out[key] = line[m.end():end].strip()
    return out


@functools.lru_cache(maxsize=1024)  # a queue has few distinct limits and many jobs
def duration_s(text: str) -> int | None:
    """Slurm durations (``UNLIMITED``, ``30``, ``05:00``, ``1:00:00``, ``2-00:00:00``) -> s."""
    value = text.strip()
    if value.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A", ""):
        return None
    days = 0
    if "-" in value:
        day_s, value = value.split("-", 1)
        days = int(day_s)
    parts = [int(p) for p in value.split(":")]
    if len(parts) == 1:
        seconds = parts[0] * 60  # a bare number is minutes
    elif len(parts) == 2:
        seconds = parts[0] * 60 + parts[1]
    elif len(parts) == 3:
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    else:
        raise ValueError(f"bad duration {text!r}")
    return days * 86400 + seconds


def slurm_time(text: str) -> float | None:
    """scontrol's local time ``2026-11-22T03:12:14`` -> epoch seconds; unset -> ``None``.

    Fast, because a centre's job list has three per job (50,000 jobs: 0.77 s with
    ``strptime``): the hour's start is converted once (``mktime``, so DST is the system's)
    and minutes and seconds added; a time inside a DST change's hour, which local time
    cannot name unambiguously anyway, may be off by that change.
    """
    value = text.strip()
    if value in ("", "None", "Unknown", "N/A", "(null)", "NONE"):
        return None
    if not _TIME_RE.fullmatch(value):
        raise ValueError(f"time data {value!r} does not match format '%Y-%m-%dT%H:%M:%S'")
    minute, second = int(value[14:16]), int(value[17:19])
    if minute > 59 or second > 61:
        raise ValueError(f"time data {value!r}: minute or second out of range")
    return _hour_start(value[:13]) + minute * 60 + second


_TIME_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}")


@functools.lru_cache(maxsize=4096)
def _hour_start(hour: str) -> float:
    """Epoch seconds of local ``YYYY-MM-DDTHH``:00:00 (validated by ``strptime``)."""
    return time.mktime(time.strptime(hour, "%Y-%m-%dT%H"))


def _records(text: str, what: str, name_key: str) -> Iterator[tuple[str, dict[str, str]]]:
    """(name, fields) per line of ``scontrol show <what> -o``; a line without a name fails."""
    for line in text.splitlines():
        if not line.strip() or line.strip().startswith("No reservations"):
            continue
        kv = parse_key_values(line)
        name = kv.get(name_key)
        if not name:
            raise SlurmParseError(
                f"scontrol show {what} -o: line without {name_key}: {line[:80]!r}"
            )
        yield name, kv


def parse_partitions(text: str, warnings: list[str] | None = None) -> tuple[Partition, ...]:
    """``scontrol show partition -o``: tiers, preempt mode and grace time (not in any JSON)."""
    warns = warnings if warnings is not None else []
    out: list[Partition] = []
    for name, kv in _records(text, "partition", "PartitionName"):
        where = f"scontrol show partition: {name}"
        try:
            nodes = expand_hostlist(kv.get("Nodes", ""))
        except SlurmParseError as exc:
            warns.append(f"{where}: {exc}; no nodes")
            nodes = ()
        try:
            tier = int(kv.get("PriorityTier", "1"))
        except ValueError:
            warns.append(f"{where}: PriorityTier {kv.get('PriorityTier')!r} is not a number")
            tier = 1
        try:
            grace = int(kv.get("GraceTime", "0"))
        except ValueError:
            warns.append(f"{where}: GraceTime {kv.get('GraceTime')!r} is not a number")
            grace = 0
        try:
            max_time = duration_s(kv.get("MaxTime", "UNLIMITED"))
        except ValueError:
            warns.append(f"{where}: MaxTime {kv.get('MaxTime')!r} is not a duration")
            max_time = None
        out.append(
            Partition(
                name=name,
                nodes=nodes,
                priority_tier=tier,
                preempt_mode=kv.get("PreemptMode", "OFF"),
                grace_time_s=grace,
                max_time_s=max_time,
                default=kv.get("Default", "NO").upper() == "YES",
                state=kv.get("State", "UP"),
            )
        )
    return tuple(out)


def parse_reservations(text: str, warnings: list[str] | None = None) -> tuple[Reservation, ...]:
    """``scontrol show reservation -o`` (``No reservations in the system`` -> ``()``)."""
    warns = warnings if warnings is not None else []
    out: list[Reservation] = []
    for name, kv in _records(text, "reservation", "ReservationName"):
        try:
            start = slurm_time(kv.get("StartTime", ""))
            end = slurm_time(kv.get("EndTime", ""))
            nodes = expand_hostlist(kv.get("Nodes", ""))
        except (ValueError, SlurmParseError) as exc:
            warns.append(f"scontrol show reservation: {name}: {exc}; skipped")
            continue
        if start is None or end is None:
            warns.append(f"scontrol show reservation: {name}: no start or end time; skipped")
            continue
        out.append(Reservation(name=name, nodes=nodes, start_time=start, end_time=end))
    return tuple(out)


def parse_topology(text: str, warnings: list[str] | None = None) -> dict[str, str]:
    """``scontrol show topology`` -> {node: leaf switch} (``Level=0`` switches only).

    Without a topology plugin 22.05 prints nothing on stdout (an error on stderr, exit 0),
    which gives ``{}``.
    """
    warns = warnings if warnings is not None else []
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("SwitchName="):
            continue
        kv = parse_key_values(line)
        if kv.get("Level", "0") != "0":
            continue
        try:
            nodes = expand_hostlist(kv.get("Nodes", ""))
        except SlurmParseError as exc:
            warns.append(f"scontrol show topology: switch {kv['SwitchName']}: {exc}; skipped")
            continue
        for node in nodes:
            out.setdefault(node, kv["SwitchName"])
    return out

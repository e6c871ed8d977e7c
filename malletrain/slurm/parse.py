"""Pure parsers: raw Slurm 22.05 output text -> the domain model of :mod:`malletrain.core.cluster`.

No process is run here; :mod:`malletrain.slurm.cli_backend` collects the texts and the
golden-file tests (``tests/golden/slurm/``, recorded from the real dev cluster) feed these
functions directly.  The policy, after submitit:

* The shape we rely on is missing (not JSON, no ``nodes`` list, no ``PartitionName``):
  :class:`SlurmParseError` naming the command and the field.  Waiting will not fix it.
* Slurm answered but reported an error in the JSON (``errors`` non-empty: 22.05's
  ``sinfo --json`` and ``squeue --json`` exit 0 with an empty list and an error entry when
  slurmctld is down): :class:`SlurmUnavailableError`, retryable.
* One odd record (an unknown state, a field of the wrong type, a job without an id): a
  warning string in the snapshot and ``UNKNOWN``/a default/skip, never a crash, so one
  strange node does not blind the daemon.

Facts of 22.05 these parsers encode (see docs/slurm-backend.md):
``--json`` ignores every filter (filter here); ``sinfo --json`` has no partitions
(``scontrol show partition -o``) and ``squeue --json`` has no planned nodes of pending jobs
(``squeue -h -t PENDING -o "%A %S %Y"``); leaf switches come from ``scontrol show topology``;
time limits are minutes, times epoch seconds, 0 means unset; ``scontrol`` prints local time
``YYYY-MM-DDTHH:MM:SS``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from malletrain.core.cluster import (
    ClusterSnapshot,
    Job,
    JobState,
    Node,
    NodeState,
    Partition,
    Reservation,
)
from malletrain.slurm.errors import SlurmParseError, SlurmUnavailableError
from malletrain.slurm.hostlist import expand_hostlist

log = logging.getLogger(__name__)

#: Slurm's "infinite"/"not set" sentinels for 32-bit fields (INFINITE, NO_VAL).
_INFINITE_32 = frozenset({0xFFFFFFFF, 0xFFFFFFFE})

_NODE_BASE_STATES: Mapping[str, NodeState] = {
    "idle": NodeState.IDLE,
    "allocated": NodeState.ALLOCATED,
    "mixed": NodeState.MIXED,
    "completing": NodeState.COMPLETING,
    "down": NodeState.DOWN,
    "future": NodeState.FUTURE,
    "unknown": NodeState.UNKNOWN,
    "error": NodeState.DOWN,
}

#: ``job_state`` in 22.05's JSON is ``job_state_string()``, which names some flags instead
#: of the base state. Map those to what they mean for scheduling.
_JOB_STATE_ALIASES: Mapping[str, JobState] = {
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "SPECIAL_EXIT": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "RESIZING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "UPDATE_DB": JobState.RUNNING,
    "POWER_UP_NODE": JobState.CONFIGURING,
    "STAGE_OUT": JobState.COMPLETING,
    "STOPPED": JobState.SUSPENDED,
    "REVOKED": JobState.CANCELLED,
}


@dataclass(frozen=True)
class SnapshotTexts:
    """The raw outputs of one tick's batched calls (what the golden files hold)."""

    sinfo_json: str
    squeue_json: str
    partitions: str
    reservations: str
    planned: str
    #: ``scontrol show topology`` (empty without a topology plugin).
    topology: str = ""


# ----------------------------------------------------------------------------- JSON helpers


def _load_json(text: str, command: str, list_key: str) -> tuple[dict[str, Any], list[Any]]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        snippet = text.strip()[:80]
        raise SlurmParseError(f"{command}: output is not JSON ({exc}): {snippet!r}") from None
    if not isinstance(data, dict):
        raise SlurmParseError(f"{command}: expected a JSON object, got {type(data).__name__}")
    check_json_errors(data, command)
    records = data.get(list_key)
    if not isinstance(records, list):
        raise SlurmParseError(
            f"{command}: field {list_key!r} is missing or not a list "
            f"(got {type(records).__name__})"
        )
    return data, records


def check_json_errors(data: object, command: str) -> None:
    """Raise :class:`SlurmUnavailableError` if Slurm put errors in its JSON answer.

    22.05's ``sinfo --json``/``squeue --json`` exit 0 with ``"errors": [...]`` and an
    empty list when slurmctld cannot be reached, so the exit status alone says nothing.
    Accepts the parsed object or the raw text (unparsable text is left to the parser).
    """
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            return
    if not isinstance(data, dict):
        return
    errors = data.get("errors") or []
    if errors:
        raise SlurmUnavailableError(
            f"{command}: Slurm answered with an error (is slurmctld running?): "
            f"{_describe_errors(errors)}"
        )


def _describe_errors(errors: object) -> str:
    if not isinstance(errors, list):
        return repr(errors)
    parts = []
    for err in errors:
        if isinstance(err, dict):
            words = [str(err.get(k)) for k in ("error", "description", "source") if err.get(k)]
            parts.append(" / ".join(words) or repr(err))
        else:
            parts.append(repr(err))
    return "; ".join(parts) or "an error"


def _field(rec: Mapping[str, Any], key: str, kind: type, default: Any, where: str,
           warnings: list[str]) -> Any:
    """``rec[key]`` if it has type ``kind``; else ``default`` and a warning naming it."""
    value = rec.get(key, default)
    if value is None:
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, bool):
        value = str(value)  # bool is an int subclass; never accept it as a number
    if not isinstance(value, kind):
        warnings.append(
            f"{where}: field {key!r} should be {kind.__name__}, got {type(value).__name__} "
            f"{value!r}; using {default!r}"
        )
        return default
    return value


def _epoch(value: int) -> float | None:
    """Slurm's epoch seconds, with 0 (unset) and sentinels as ``None``."""
    if value <= 0 or value in _INFINITE_32:
        return None
    return float(value)


def slurm_version(text: str) -> str | None:
    """``"22.05"`` from the ``meta`` of ``sinfo --json`` / ``squeue --json``, or ``None``."""
    try:
        data = json.loads(text)
        version = data["meta"]["Slurm"]["version"]
        return f"{int(version['major'])}.{int(version['minor']):02d}"
    except (ValueError, KeyError, TypeError):
        return None


# ----------------------------------------------------------------------------- nodes


def node_state(base: str, flags: frozenset[str]) -> NodeState:
    """Combine 22.05's base state and flags into one :class:`NodeState`.

    ``idle`` + ``DRAIN`` is drained, ``allocated`` + ``DRAIN`` still draining; an idle node
    flagged ``RESERVED``/``MAINTENANCE`` is reserved; ``NOT_RESPONDING`` counts as down.
    ``PLANNED`` (backfill holds it for a pending job) leaves an idle node idle: that is
    exactly the hole malletrain may use until the planned start.
    """
    state = _NODE_BASE_STATES.get(base.lower(), NodeState.UNKNOWN)
    if state in (NodeState.DOWN, NodeState.FUTURE, NodeState.UNKNOWN):
        return state
    if "NOT_RESPONDING" in flags:
        return NodeState.DOWN
    if "DRAIN" in flags or "FAIL" in flags:
        busy = state in (NodeState.ALLOCATED, NodeState.MIXED, NodeState.COMPLETING)
        return NodeState.DRAINING if busy or "COMPLETING" in flags else NodeState.DRAINED
    if "COMPLETING" in flags:
        return NodeState.COMPLETING
    if state is NodeState.IDLE and flags & {"RESERVED", "MAINTENANCE"}:
        return NodeState.RESERVED
    return state


def parse_sinfo_json(text: str, warnings: list[str] | None = None) -> tuple[Node, ...]:
    """Nodes from ``sinfo --json`` (22.05: openapi/v0.0.38; it lists nodes only)."""
    warns = warnings if warnings is not None else []
    _, records = _load_json(text, "sinfo --json", "nodes")
    nodes: list[Node] = []
    seen: set[str] = set()
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            warns.append(f"sinfo --json: nodes[{i}] is not an object; skipped")
            continue
        name = rec.get("name")
        if not isinstance(name, str) or not name:
            warns.append(f"sinfo --json: nodes[{i}] has no 'name'; skipped")
            continue
        if name in seen:
            warns.append(f"sinfo --json: node {name} listed twice; kept the first")
            continue
        seen.add(name)
        where = f"sinfo --json: node {name}"
        base = _field(rec, "state", str, "unknown", where, warns)
        raw_flags = _field(rec, "state_flags", list, [], where, warns)
        flags = frozenset(str(f).upper() for f in raw_flags)
        state = node_state(base, flags)
        if state is NodeState.UNKNOWN and base.lower() != "unknown":
            warns.append(f"{where}: unknown state {base!r}; treated as unknown")
        partitions = _field(rec, "partitions", list, [], where, warns)
        features = _field(rec, "active_features", str, "", where, warns) or _field(
            rec, "features", str, "", where, warns
        )
        nodes.append(
            Node(
                name=name,
                state=state,
                flags=flags,
                partitions=tuple(str(p) for p in partitions),
                cpus=_field(rec, "cpus", int, 0, where, warns),
                features=tuple(f for f in features.split(",") if f),
                gres=_field(rec, "gres", str, "", where, warns),
                reason=_field(rec, "reason", str, "", where, warns),
                last_busy_at=_epoch(_field(rec, "last_busy", int, 0, where, warns)),
            )
        )
    return tuple(nodes)


# ----------------------------------------------------------------------------- jobs


def job_state(raw: str) -> JobState | None:
    """A :class:`JobState` for 22.05's ``job_state`` string, or ``None`` if unknown."""
    key = raw.strip().upper()
    try:
        return JobState(key)
    except ValueError:
        return _JOB_STATE_ALIASES.get(key)


def parse_squeue_json(
    text: str,
    planned: Mapping[int, PlannedStart] | None = None,
    warnings: list[str] | None = None,
) -> tuple[Job, ...]:
    """Jobs from ``squeue --json``; ``planned`` adds the backfill plan of pending jobs.

    For a pending job ``start_time`` is the scheduler's planned start (``None`` when it has
    none); for a running job the actual start.  ``time_limit_s`` is ``None`` for unlimited.
    When ``planned`` has a plan for a pending job, its start AND nodes both come from it:
    they were read in one call, while the JSON was read a moment earlier, possibly before
    the backfill pass that made the plan (seen: planned nodes with ``start_time`` 0).
    """
    warns = warnings if warnings is not None else []
    plan = planned or {}
    _, records = _load_json(text, "squeue --json", "jobs")
    jobs: list[Job] = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            warns.append(f"squeue --json: jobs[{i}] is not an object; skipped")
            continue
        job_id = rec.get("job_id")
        if not isinstance(job_id, int) or isinstance(job_id, bool) or job_id <= 0:
            warns.append(f"squeue --json: jobs[{i}] has no valid 'job_id' ({job_id!r}); skipped")
            continue
        where = f"squeue --json: job {job_id}"
        raw_state = _field(rec, "job_state", str, "UNKNOWN", where, warns)
        state = job_state(raw_state)
        if state is None:
            warns.append(f"{where}: unknown job state {raw_state!r}; treated as UNKNOWN")
            state = JobState.UNKNOWN
        nodes: tuple[str, ...] = ()
        if state is not JobState.PENDING:
            try:
                nodes = expand_hostlist(_field(rec, "nodes", str, "", where, warns))
            except SlurmParseError as exc:
                warns.append(f"{where}: {exc}; no nodes")
        limit_min = _field(rec, "time_limit", int, 0, where, warns)
        time_limit_s = None if limit_min <= 0 or limit_min in _INFINITE_32 else limit_min * 60
        start = _epoch(_field(rec, "start_time", int, 0, where, warns))
        end = _epoch(_field(rec, "end_time", int, 0, where, warns))
        planned_nodes: tuple[str, ...] = ()
        entry = plan.get(job_id) if state is JobState.PENDING else None
        if entry is not None and entry.nodes:
            planned_nodes = entry.nodes
            start = entry.start_time
            end = None if start is None or time_limit_s is None else start + time_limit_s
        jobs.append(
            Job(
                job_id=job_id,
                name=_field(rec, "name", str, "", where, warns),
                user=_field(rec, "user_name", str, "", where, warns),
                partition=_field(rec, "partition", str, "", where, warns),
                state=state,
                state_reason=_field(rec, "state_reason", str, "", where, warns),
                node_count=_field(rec, "node_count", int, 0, where, warns),
                nodes=nodes,
                planned_nodes=planned_nodes,
                time_limit_s=time_limit_s,
                submit_time=_epoch(_field(rec, "submit_time", int, 0, where, warns)),
                start_time=start,
                end_time=end,
                comment=_field(rec, "comment", str, "", where, warns),
            )
        )
    return tuple(jobs)


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


# ----------------------------------------------------------------------------- scontrol -o

_KEY_RE = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/.]*)=")


def parse_job_ids(text: str) -> frozenset[int]:
    """Job ids, one per line (``squeue --noheader --format=%A``); other lines are skipped.

    The arrival probe between ticks (:data:`~malletrain.slurm.backend.PENDING_IDS_COMMAND`)
    only compares ids with the last snapshot's, so an odd line costs nothing but a wake-up.
    """
    return frozenset(int(t) for t in (line.strip() for line in text.splitlines())
                     if t.isdigit())


def parse_key_values(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` line -> {key: value}; values may contain spaces."""
    out: dict[str, str] = {}
    matches = list(_KEY_RE.finditer(line))
    for m, nxt in zip(matches, [*matches[1:], None], strict=True):
        end = nxt.start() if nxt is not None else len(line)
        key = m.group(1)
        if key not in out:
            out[key] = line[m.end():end].strip()
    return out


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
    """scontrol's local time ``2026-11-22T03:12:14`` -> epoch seconds; unset -> ``None``."""
    value = text.strip()
    if value in ("", "None", "Unknown", "N/A", "(null)", "NONE"):
        return None
    return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))


def parse_partitions(text: str, warnings: list[str] | None = None) -> tuple[Partition, ...]:
    """``scontrol show partition -o``: tiers, preempt mode and grace time (not in any JSON)."""
    warns = warnings if warnings is not None else []
    out: list[Partition] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        kv = parse_key_values(line)
        name = kv.get("PartitionName")
        if not name:
            raise SlurmParseError(
                f"scontrol show partition -o: line without PartitionName: {line[:80]!r}"
            )
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
    for line in text.splitlines():
        if not line.strip() or line.strip().startswith("No reservations"):
            continue
        kv = parse_key_values(line)
        name = kv.get("ReservationName")
        if not name:
            raise SlurmParseError(
                f"scontrol show reservation -o: line without ReservationName: {line[:80]!r}"
            )
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


# ----------------------------------------------------------------------------- snapshot


def build_snapshot(taken_at: float, texts: SnapshotTexts) -> ClusterSnapshot:
    """One :class:`ClusterSnapshot` from one tick's outputs (pure; golden-file tested)."""
    warns: list[str] = []
    nodes = parse_sinfo_json(texts.sinfo_json, warns)
    planned = parse_planned(texts.planned, warns)
    jobs = parse_squeue_json(texts.squeue_json, planned, warns)
    partitions = parse_partitions(texts.partitions, warns)
    reservations = parse_reservations(texts.reservations, warns)
    switches = parse_topology(texts.topology, warns)
    if switches:
        nodes = tuple(
            dataclasses.replace(n, switch=switches[n.name]) if n.name in switches else n
            for n in nodes
        )
    for w in warns:
        log.debug("snapshot warning: %s", w)
    return ClusterSnapshot(
        taken_at=taken_at,
        nodes=nodes,
        partitions=partitions,
        jobs=jobs,
        reservations=reservations,
        warnings=tuple(warns),
    )

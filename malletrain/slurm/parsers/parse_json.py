"""Parsers of Slurm's JSON output (nodes: ``sinfo --json`` on 22.05, ``scontrol show nodes
--json`` on 23.02+; jobs: ``squeue --json``), every tested release into one model.

The policy for odd output is :mod:`malletrain.slurm.parsers.parse`'s; the value shapes of each
release are :mod:`malletrain.slurm.parsers.shapes`'.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from typing import Any

from malletrain.core.cluster import Job, JobState, Node, NodeState
from malletrain.slurm.errors import SlurmParseError, SlurmUnavailableError
from malletrain.slurm.hostlist import expand_hostlist
from malletrain.slurm.parsers import shapes
from malletrain.slurm.parsers.parse_text import PlannedStart

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


def _load_object(text: str, command: str) -> dict[str, Any]:
    """The answer as a JSON object, after the ``errors`` check (retryable when non-empty)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        snippet = text.strip()[:80]
        raise SlurmParseError(f"{command}: output is not JSON ({exc}): {snippet!r}") from None
    if not isinstance(data, dict):
        raise SlurmParseError(f"{command}: expected a JSON object, got {type(data).__name__}")
    check_json_errors(data, command)
    return data


def _command(data: Mapping[str, Any], default: str) -> str:
    """The command that wrote the answer (23.02+ put it in ``meta``), for messages."""
    meta = data.get("meta")
    argv = meta.get("command") if isinstance(meta, dict) else None
    if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
        words = [a for a in argv[:4] if a != "--json"]
        return " ".join([*words, "--json"])
    return default


def _records(data: Mapping[str, Any], source: shapes.Source, list_key: str) -> list[Any]:
    records = data.get(list_key)
    if not isinstance(records, list):
        raise SlurmParseError(
            f"{source}: field {list_key!r} is missing or not a list "
            f"(got {type(records).__name__})"
        )
    return records


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


def parse_nodes_json(text: str, warnings: list[str] | None = None, *,
                     switches: Mapping[str, str] | None = None) -> tuple[Node, ...]:
    """Nodes from 22.05's ``sinfo --json`` or 23.02+'s ``scontrol show nodes --json``;
    ``switches`` names each node's leaf switch (``scontrol show topology``), if known.

    Both list one object per node under ``nodes``; their value shapes differ
    (:mod:`malletrain.slurm.parsers.shapes`). 23.02+'s ``sinfo --json`` lists groups of nodes
    instead and is refused with a line saying which command to use.
    """
    warns = warnings if warnings is not None else []
    data = _load_object(text, "sinfo --json")
    source = shapes.source_of(data, _command(data, "sinfo --json"))
    if "nodes" not in data and isinstance(data.get("sinfo"), list):
        raise SlurmParseError(
            f"{source}: lists groups of nodes ('sinfo'), not nodes; on Slurm 23.02 and "
            "later malletrain reads nodes from `scontrol show nodes --json`"
        )
    records = _records(data, source, "nodes")
    nodes: list[Node] = []
    seen: set[str] = set()
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            warns.append(f"{source.command}: nodes[{i}] is not an object; skipped")
            continue
        name = rec.get("name")
        if not isinstance(name, str) or not name:
            warns.append(f"{source.command}: nodes[{i}] has no 'name'; skipped")
            continue
        if name in seen:
            warns.append(f"{source.command}: node {name} listed twice; kept the first")
            continue
        seen.add(name)
        nodes.append(_node(rec, name, source, warns,
                           switches.get(name) if switches is not None else None))
    return tuple(nodes)


def _node(rec: Mapping[str, Any], name: str, source: shapes.Source, warns: list[str],
          switch: str | None) -> Node:
    """One node record; its state is either shape's (string + flags, or a list)."""
    where = f"{source.command}: node {name}"
    base, *rest = shapes.states(rec, "state", source, where)
    flags = frozenset(rest) | frozenset(
        f.upper() for f in shapes.names(rec, "state_flags", source, where))
    state = node_state(base, flags)
    if state is NodeState.UNKNOWN and base != "UNKNOWN":
        warns.append(f"{where}: unknown state {base.lower()!r}; treated as unknown")
    features = (shapes.names(rec, "active_features", source, where)
                or shapes.names(rec, "features", source, where))
    return Node(
        name=name,
        state=state,
        flags=flags,
        partitions=shapes.names(rec, "partitions", source, where),
        cpus=_field(rec, "cpus", int, 0, where, warns),
        features=features,
        gres=_field(rec, "gres", str, "", where, warns),
        reason=_field(rec, "reason", str, "", where, warns),
        last_busy_at=_epoch(shapes.number(rec, "last_busy", source, where)),
        switch=switch,
    )


@functools.lru_cache(maxsize=256)
def job_state(raw: str) -> JobState | None:
    """A :class:`JobState` for 22.05's ``job_state`` string, or ``None`` if unknown."""
    key = raw.strip().upper()
    try:
        return JobState(key)
    except ValueError:
        return _JOB_STATE_ALIASES.get(key)


#: 22.05's ``job_state_string()`` names the first of these flags a job has instead of its
#: base state; 23.02+ list base and flags, and :func:`job_state_of` applies the same order
#: so that both releases read the same job the same way.
_FLAG_ORDER = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED",
               "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "REVOKED",
               "RESV_DEL_HOLD", "SIGNALING", "POWER_UP_NODE")


def job_state_of(names: tuple[str, ...]) -> tuple[JobState | None, str]:
    """(state, the name it came from) for a ``job_state`` read by :func:`shapes.states`."""
    base, flags = names[0], set(names[1:])
    chosen = next((f for f in _FLAG_ORDER if f in flags), base)
    return job_state(chosen), chosen


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
    data = _load_object(text, "squeue --json")
    source = shapes.source_of(data, "squeue --json")
    jobs: list[Job] = []
    for i, rec in enumerate(_records(data, source, "jobs")):
        if not isinstance(rec, dict):
            warns.append(f"squeue --json: jobs[{i}] is not an object; skipped")
            continue
        job_id = rec.get("job_id")
        if not isinstance(job_id, int) or isinstance(job_id, bool) or job_id <= 0:
            warns.append(f"squeue --json: jobs[{i}] has no valid 'job_id' ({job_id!r}); skipped")
            continue
        jobs.append(_job(rec, job_id, plan, source, warns))
    return tuple(jobs)


def _scheduled(rec: Mapping[str, Any], start: float | None, source: shapes.Source, where: str,
               warns: list[str]) -> PlannedStart | None:
    """The plan 23.02+ write into a pending job's record (``scheduled_nodes``)."""
    text = shapes.text(rec, "scheduled_nodes", source, where)
    if not text or text == "(null)":
        return None
    try:
        return PlannedStart(start_time=start, nodes=expand_hostlist(text))
    except SlurmParseError as exc:
        warns.append(f"{where}: scheduled_nodes: {exc}; no plan")
        return None


def _job(rec: Mapping[str, Any], job_id: int, plan: Mapping[int, PlannedStart],
         source: shapes.Source, warns: list[str]) -> Job:
    """One job record: odd cosmetic fields give a warning; odd shapes of the fields the
    schedule depends on (state, nodes, counts, times) refuse the answer."""
    where = f"squeue --json: job {job_id}"
    state, raw_state = job_state_of(shapes.states(rec, "job_state", source, where))
    if state is None:
        warns.append(f"{where}: unknown job state {raw_state!r}; treated as UNKNOWN")
        state = JobState.UNKNOWN
    nodes: tuple[str, ...] = ()
    node_list = shapes.text(rec, "nodes", source, where)
    if state is not JobState.PENDING:
        try:
            nodes = expand_hostlist(node_list)
        except SlurmParseError as exc:
            warns.append(f"{where}: {exc}; no nodes")
    limit_min = shapes.number(rec, "time_limit", source, where)
    time_limit_s = None if limit_min <= 0 or limit_min in _INFINITE_32 else limit_min * 60
    start = _epoch(shapes.number(rec, "start_time", source, where))
    # An unlimited job's end is "never": 23.02+ write a date centuries ahead, squeue NONE.
    end = _epoch(shapes.number(rec, "end_time", source, where))
    if time_limit_s is None:
        end = None
    planned_nodes: tuple[str, ...] = ()
    claims = state in (JobState.PENDING, JobState.UNKNOWN)  # see core.scavenger
    entry = plan.get(job_id) if claims else None
    if entry is None and claims:
        entry = _scheduled(rec, start, source, where, warns)  # 23.02+: plan in the record
    if entry is not None and entry.nodes:
        planned_nodes = entry.nodes
        start = entry.start_time
        end = None if start is None or time_limit_s is None else start + time_limit_s
    return Job(
        job_id=job_id,
        name=_field(rec, "name", str, "", where, warns),
        user=_field(rec, "user_name", str, "", where, warns),
        partition=_field(rec, "partition", str, "", where, warns),
        state=state,
        # squeue's text (%r) says the description when Slurm wrote one: so does this
        state_reason=(_field(rec, "state_description", str, "", where, warns)
                      or _field(rec, "state_reason", str, "", where, warns)),
        node_count=shapes.number(rec, "node_count", source, where),
        nodes=nodes,
        planned_nodes=planned_nodes,
        time_limit_s=time_limit_s,
        submit_time=_epoch(shapes.number(rec, "submit_time", source, where)),
        start_time=start,
        end_time=end,
        comment=_field(rec, "comment", str, "", where, warns),
        account=_field(rec, "account", str, "", where, warns),
        qos=_field(rec, "qos", str, "", where, warns),
    )

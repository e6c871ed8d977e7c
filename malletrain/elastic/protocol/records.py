"""The coordinator's records on the wire: JSON out, strictly checked JSON in.

Every record in the store was written by a process the daemon does not trust: a worker runs
the user's code, and today anyone who reaches the store can write to it. So a record is
decoded field by field against its schema (types, ranges, finite numbers, ids, size) and
anything else raises :class:`RecordError`, never a ``TypeError`` or ``KeyError`` from deep
inside the daemon. Callers decide what a bad record costs: the daemon ignores it for that
one job (its last good view stands) and counts it; the others never notice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, get_args

from malletrain.elastic.protocol.keys import (
    ID_RE,
    DepartureReason,
    Event,
    FinishRecord,
    Membership,
    MembershipSource,
    ProgressReport,
)

#: the largest record the daemon reads (a membership of 4,096 members is ~150 KB)
MAX_RECORD_BYTES = 256 * 1024
MAX_MEMBERS = 4096
#: counters (steps, samples, epochs, pids) fit in a signed 64-bit integer
MAX_COUNT = 2**62
MAX_LOCAL_WORLD_SIZE = 1024
MAX_NODE_NAME = 255
_SOURCES = frozenset(get_args(MembershipSource))
_REASONS = frozenset(get_args(DepartureReason))


class RecordError(ValueError):
    """A record is not what the protocol allows (a buggy or hostile writer).

    Its message starts with the record it is about ("progress report: ...", "event 7: ...");
    :attr:`record` is that record's kind, without a sequence number (a metric label).
    """

    @property
    def record(self) -> str:
        return str(self).split(":", 1)[0].rstrip("0123456789 ")


def _dumps(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def _load(raw: bytes | str, what: str, keys: frozenset[str], optional: frozenset[str] = frozenset()
          ) -> dict[str, Any]:
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordError(f"{what}: {len(raw)} bytes, more than {MAX_RECORD_BYTES}")
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # "[" x 5000 nests
        raise RecordError(f"{what}: not JSON ({type(exc).__name__}: {exc})"[:200]) from None
    if not isinstance(d, dict):
        raise RecordError(f"{what}: not a JSON object")
    missing = keys - d.keys()
    extra = d.keys() - keys - optional
    if missing or extra:
        raise RecordError(f"{what}: missing {sorted(missing)} / unexpected {sorted(extra)[:5]}")
    return d


def _int(v: Any, key: str, what: str, lo: int = 0, hi: int = MAX_COUNT) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise RecordError(f"{what}: {key} must be an integer from {lo} to {hi}, got {v!r:.40}")
    return v


def _count(d: Mapping[str, Any], key: str, what: str, lo: int = 0, hi: int = MAX_COUNT) -> int:
    return _int(d[key], key, what, lo, hi)


def _number(d: Mapping[str, Any], key: str, what: str, lo: float = 0.0, hi: float = 1e18
            ) -> float:
    v = d[key]
    if (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)
            or not lo <= v <= hi):
        raise RecordError(f"{what}: {key} must be a finite number from {lo:g} to {hi:g}, "
                          f"got {v!r:.40}")
    return float(v)


def _member(v: Any, what: str) -> str:
    if not isinstance(v, str) or not ID_RE.match(v):
        raise RecordError(f"{what}: {v!r:.40} is not a member id")
    return v


def _members(d: Mapping[str, Any], key: str, what: str) -> tuple[str, ...]:
    v = d.get(key, [])
    if not isinstance(v, list) or len(v) > MAX_MEMBERS:
        raise RecordError(f"{what}: {key} must be a list of at most {MAX_MEMBERS} member ids")
    return tuple(_member(x, what) for x in v)


# ---------------------------------------------------------------------------- membership


def encode_membership(m: Membership) -> str:
    return _dumps(asdict(m))


def decode_membership(raw: bytes | str) -> Membership:
    what = "membership"
    d = _load(raw, what, frozenset({"epoch", "members", "local_world_sizes", "source",
                                    "published_at_s"}), frozenset({"dropped"}))
    members = _members(d, "members", what)
    sizes = d["local_world_sizes"]
    if (not isinstance(sizes, list) or len(sizes) != len(members)
            or not all(isinstance(x, int) and not isinstance(x, bool)
                       and 1 <= x <= MAX_LOCAL_WORLD_SIZE for x in sizes)):
        raise RecordError(f"{what}: local_world_sizes must be one size (1-"
                          f"{MAX_LOCAL_WORLD_SIZE}) per member")
    if len(set(members)) != len(members):
        raise RecordError(f"{what}: a member is listed twice")
    if d["source"] not in _SOURCES:
        raise RecordError(f"{what}: source {d['source']!r:.40} is not one of {sorted(_SOURCES)}")
    return Membership(
        epoch=_count(d, "epoch", what, lo=1), members=members, local_world_sizes=tuple(sizes),
        source=d["source"], published_at_s=_number(d, "published_at_s", what),
        dropped=_members(d, "dropped", what),
    )


# ---------------------------------------------------------------------------- progress, finish


def encode_progress(p: ProgressReport) -> str:
    return _dumps(asdict(p))


def decode_progress(raw: bytes | str) -> ProgressReport:
    what = "progress report"
    d = _load(raw, what, frozenset({"epoch", "step", "samples_total", "samples_per_s",
                                    "world_size", "step_time_s", "time_s"}),
              frozenset({"members", "sync_time_s"}))
    return ProgressReport(
        epoch=_count(d, "epoch", what), step=_count(d, "step", what),
        samples_total=_count(d, "samples_total", what),
        samples_per_s=_number(d, "samples_per_s", what),
        world_size=_count(d, "world_size", what, hi=MAX_MEMBERS * MAX_LOCAL_WORLD_SIZE),
        step_time_s=_number(d, "step_time_s", what), time_s=_number(d, "time_s", what),
        members=_members(d, "members", what),
        sync_time_s=(None if d.get("sync_time_s") is None
                     else _number(d, "sync_time_s", what)),
    )


def encode_finish(f: FinishRecord) -> str:
    return _dumps(asdict(f))


def decode_finish(raw: bytes | str) -> FinishRecord:
    what = "finish record"
    d = _load(raw, what, frozenset({"step", "samples_total", "time_s"}))
    return FinishRecord(step=_count(d, "step", what),
                        samples_total=_count(d, "samples_total", what),
                        time_s=_number(d, "time_s", what))


# ---------------------------------------------------------------------------- events


def encode_event(kind: str, member_id: str, time_s: float, data: Mapping[str, Any]) -> str:
    return _dumps({"kind": kind, "member_id": member_id, "time_s": time_s, "data": dict(data)})


def decode_event(seq: int, raw: bytes | str) -> Event:
    what = f"event {seq}"
    d = _load(raw, what, frozenset({"kind", "member_id", "time_s", "data"}))
    data = d["data"]
    if not isinstance(data, dict):
        raise RecordError(f"{what}: data must be an object")
    if d["kind"] == "register":
        _register_data(data, what)
    elif d["kind"] == "depart":
        _depart_data(data, what)
    else:
        raise RecordError(f"{what}: kind {d['kind']!r:.40} is not register or depart")
    return Event(seq=seq, kind=d["kind"], member_id=_member(d["member_id"], what),
                 time_s=_number(d, "time_s", what), data=data)


def _register_data(data: Mapping[str, Any], what: str) -> None:
    if set(data) - {"node", "pid", "local_world_size", "slurm_node", "slurm_job", "run_dir"}:
        raise RecordError(f"{what}: unexpected registration fields {sorted(data)[:5]}")
    for key in ("node", "slurm_node"):
        node = data.get(key, "")
        if (not isinstance(node, str) or len(node) > MAX_NODE_NAME
                or not all(c.isprintable() and not c.isspace() for c in node)):
            raise RecordError(f"{what}: {key} {node!r:.40} is not a host name")
    run_dir = data.get("run_dir", "")
    if (not isinstance(run_dir, str) or len(run_dir) > 1024
            or not (run_dir == "" or run_dir.startswith("/"))
            or not all(c.isprintable() and not c.isspace() for c in run_dir)):
        raise RecordError(f"{what}: run_dir {run_dir!r:.40} is not an absolute path")
    _int(data.get("slurm_job", 0), "slurm_job", what)
    _int(data.get("pid", 0), "pid", what)
    _int(data.get("local_world_size", 1), "local_world_size", what, lo=1,
         hi=MAX_LOCAL_WORLD_SIZE)


#: the longest ``detail`` of a departure (one line of the job's output: what failed)
MAX_DETAIL = 300


def _depart_data(data: Mapping[str, Any], what: str) -> None:
    if set(data) - {"reason", "epoch", "step", "detail"}:
        raise RecordError(f"{what}: unexpected departure fields {sorted(data)[:5]}")
    detail = data.get("detail", "")
    if (not isinstance(detail, str) or len(detail) > MAX_DETAIL
            or not all(c.isprintable() for c in detail)):
        raise RecordError(f"{what}: detail {detail!r:.40} is not one printable line of at "
                          f"most {MAX_DETAIL} characters")
    if data.get("reason", "crashed") not in _REASONS:
        raise RecordError(f"{what}: reason {data.get('reason')!r:.40} is not one of "
                          f"{sorted(_REASONS)}")
    for key in ("epoch", "step"):
        if data.get(key) is not None:
            _count(data, key, what)

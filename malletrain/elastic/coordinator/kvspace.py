"""One job's namespace in the coordinator, and the rules a job's own session lives under.

:class:`JobSpace` holds a job's keys with its byte and key counts (and the server-wide
:class:`Usage`); :func:`check_worker_write` is what a job's processes may not do to their own
job's history (the daemon's session is not checked): ``cfg/<e>`` is written once, by
compare-and-set, and only as a heal/leave epoch of members the job already had; ``ev/<i>`` is
written once; neither, nor ``finished``, is deleted. The server is :mod:`.kvserver`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from malletrain.elastic.protocol import records as r
from malletrain.elastic.protocol.keys import ID_RE
from malletrain.elastic.protocol.wire import Op

_WORKER_WRITABLE_EPOCH_SOURCES = ("heal", "leave")


@dataclass(frozen=True)
class ServerLimits:
    handshake_timeout_s: float = 5.0
    max_pending_handshakes: int = 1024
    max_connections: int = 8192
    max_connections_per_job: int = 2048
    max_job_bytes: int = 16 << 20
    max_job_keys: int = 100_000
    #: all jobs together: the coordinator's memory stays bounded however many jobs a
    #: site admits (its systemd unit has MemoryMax=2G)
    max_total_bytes: int = 1 << 30
    max_wait_s: float = 3600.0


class Refused(Exception):
    """A request this session may not make; answered with REFUSED, the session goes on."""


class Usage:
    """Bytes held by all jobs together (each job space adds and releases its own)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._lock = threading.Lock()

    def change(self, delta: int) -> bool:
        """Add ``delta`` bytes; False (and nothing added) if that would pass the limit."""
        with self._lock:
            if delta > 0 and self.bytes + delta > self.limit:
                return False
            self.bytes += delta
            return True


@dataclass
class JobSpace:
    """One job's keys. ``cond`` guards ``data`` and wakes blocked GET/WAIT requests."""

    usage: Usage
    data: dict[str, bytes] = field(default_factory=dict)
    bytes_used: int = 0
    connections: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)

    def put(self, key: str, value: bytes, limits: ServerLimits) -> None:
        old = self.data.get(key)
        grow = len(key) + len(value) - (0 if old is None else len(key) + len(old))
        if old is None and len(self.data) >= limits.max_job_keys:
            raise Refused(f"the job holds {len(self.data)} keys, the limit")
        if self.bytes_used + grow > limits.max_job_bytes:
            raise Refused(f"the job's keys would exceed {limits.max_job_bytes} bytes")
        if not self.usage.change(grow):
            raise Refused("the coordinator is full (all jobs' keys at the limit)")
        self.data[key] = value
        self.bytes_used += grow
        self.cond.notify_all()

    def pop(self, key: str) -> bool:
        old = self.data.pop(key, None)
        if old is None:
            return False
        self.bytes_used -= len(key) + len(old)
        self.usage.change(-(len(key) + len(old)))
        return True


def split_key(raw: bytes) -> tuple[str, str, str]:
    """``mt/<job>/<rest>`` -> (key, job, rest); anything else is refused."""
    try:
        key = raw.decode()
    except UnicodeDecodeError:
        raise Refused("a key is UTF-8 text") from None
    parts = key.split("/", 2)
    if len(raw) > 1024 or len(parts) != 3 or parts[0] != "mt" or not parts[2]:
        raise Refused(f"key {key[:80]!r} is not mt/<job>/<name>")
    if not ID_RE.match(parts[1]):
        raise Refused(f"key {key[:80]!r}: bad job id")
    return key, parts[1], parts[2]


def parse_int(raw: bytes, what: str) -> int:
    if not raw or len(raw) > 20 or not raw.lstrip(b"-").isdigit():
        raise Refused(f"{what} is not an integer")
    return int(raw)


def check_worker_write(code: Op, key: str, rest: str, args: list[bytes],
                        space: JobSpace) -> None:
    """A job's own processes may not rewrite its history (see the module docstring)."""
    if code in (Op.GET,):
        return
    history = rest.startswith(("cfg/", "ev/")) or rest == "finished"
    if code == Op.DELETE and history:
        raise Refused(f"{rest!r} is not deleted by a job")
    if rest.startswith("ev/") and (code != Op.SET or key in space.data):
        raise Refused(f"{rest!r} is written once")
    if rest.startswith("cfg/"):
        if code != Op.COMPARE_SET or args[0] != b"":
            raise Refused(f"{rest!r} is written once, by compare-and-set")
        if key not in space.data:
            check_worker_epoch(key, args[1], space)


def check_worker_epoch(key: str, raw: bytes, space: JobSpace) -> None:
    """A job may shrink itself (heal, leave) but only the daemon adds members or evicts.

    One exception: into a namespace with no epoch at all (a restarted coordinator lost the
    job's keys) a job's rank 0 puts back the epoch it is in (``reseed``).
    """
    try:
        m = r.decode_membership(raw)
    except r.RecordError as exc:
        raise Refused(f"{key}: {exc}") from None
    prefix = key.rsplit("/", 1)[0] + "/"
    known: set[str] = set()
    for k, v in space.data.items():
        if k.startswith(prefix):
            try:
                known.update(r.decode_membership(v).members)
            except r.RecordError:
                continue
    if not known and not any(k.startswith(prefix) for k in space.data):
        return  # the reseed of a lost store
    if m.source not in _WORKER_WRITABLE_EPOCH_SOURCES:
        raise Refused(f"{key}: a job writes only heal/leave epochs, not {m.source!r}")
    unknown = [mid for mid in m.members if mid not in known]
    if unknown:
        raise Refused(f"{key}: members {unknown[:4]} were never published")

"""One job's namespace in the coordinator, and the rules a job's own session lives under.

:class:`JobSpace` holds a job's keys with its byte and key counts (and the server-wide
:class:`Usage`); :func:`check_worker_write` is what a job's processes may not do to their own
job's history (the daemon's session is not checked): ``cfg/<e>`` is written once, by
compare-and-set, and only as a heal/leave epoch of members the job already had; ``ev/<i>`` is
written once; neither, nor ``finished``, is deleted. The server is :mod:`.kvserver`.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

from malletrain.elastic.protocol import records as r
from malletrain.elastic.protocol.keys import ID_RE, MAX_EPOCHS_AHEAD, MAX_EVENTS
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


_INT_RE = re.compile(rb"-?[0-9]{1,19}\Z")
#: what ADD may make of a counter: an int64, as torch's TCPStore keeps it
INT64 = 1 << 63


def parse_int(raw: bytes, what: str) -> int:
    """A decimal int64 (``--5``, ``1e3``, 20 digits: refused, never a ValueError)."""
    if not _INT_RE.match(raw) or not -INT64 <= int(raw) < INT64:
        raise Refused(f"{what} is not an integer")
    return int(raw)


def check_worker_write(code: Op, key: str, rest: str, args: list[bytes],
                        space: JobSpace) -> list[bytes]:
    """A job's own processes may not rewrite its history (see the module docstring), nor
    set the counters the daemon reads every tick to values that would stall it: ``events``
    only grows by ADD of 0 or 1 up to :data:`MAX_EVENTS`; ``latest`` is SET only to an
    epoch that exists, and never moves back (the larger value is kept). Returns the
    arguments to apply."""
    if code in (Op.GET,):
        return args
    if rest in ("events", "latest"):
        return _check_counter(code, key, rest, args, space)
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
    return args


def _check_counter(code: Op, key: str, rest: str, args: list[bytes],
                   space: JobSpace) -> list[bytes]:
    old = space.data.get(key, b"0")
    if rest == "events":
        if code != Op.ADD or parse_int(args[0], "the amount") not in (0, 1):
            raise Refused("'events' only grows by ADD of 0 or 1")
        if parse_int(old, "events") + int(args[0]) > MAX_EVENTS:
            raise Refused(f"the job's log holds {MAX_EVENTS} events, the limit")
        return args
    if code != Op.SET:
        raise Refused("'latest' is only SET")
    new = parse_int(args[0], "'latest'")
    if new < 1 or f"{key[:-len('latest')]}cfg/{new}" not in space.data:
        raise Refused("'latest' names an epoch that was not written")
    return [str(max(new, parse_int(old, "'latest'"))).encode()]


def _check_epoch_number(key: str, space: JobSpace) -> None:
    """A job writes epoch ``e`` only within :data:`MAX_EPOCHS_AHEAD` of ``latest`` (so a
    reader scanning upward from ``latest`` reads a few keys, not a job's 100,000)."""
    try:
        epoch = parse_int(key.rsplit("/", 1)[1].encode(), "the epoch")
    except Refused:
        raise Refused(f"{key}: not an epoch number") from None
    latest = space.data.get(key.split("/cfg/")[0] + "/latest", b"0")
    if not 1 <= epoch <= parse_int(latest, "'latest'") + MAX_EPOCHS_AHEAD:
        raise Refused(f"{key}: more than {MAX_EPOCHS_AHEAD} epochs past 'latest'")


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
    _check_epoch_number(key, space)
    if m.source not in _WORKER_WRITABLE_EPOCH_SOURCES:
        raise Refused(f"{key}: a job writes only heal/leave epochs, not {m.source!r}")
    unknown = [mid for mid in m.members if mid not in known]
    if unknown:
        raise Refused(f"{key}: members {unknown[:4]} were never published")

"""One job's namespace in the coordinator, and the rules a job's own session lives under.

:class:`JobSpace` holds a job's keys with its byte and key counts (and the server-wide
:class:`Usage`); :func:`check_worker_write` is what a job's processes may not do to their own
job's history (the daemon's session is not checked): ``cfg/<e>`` is written once, by
compare-and-set, and only as a heal/leave epoch of members the job already had; ``ev/<i>`` is
written once; neither, nor ``finished``, is deleted. The server is :mod:`.kvserver`.
"""

from __future__ import annotations

import re
import resource
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from malletrain.elastic.protocol import records as r
from malletrain.elastic.protocol.keys import ID_RE, MAX_EPOCHS_AHEAD, MAX_EVENTS
from malletrain.elastic.protocol.wire import Op
from malletrain.errors import ConfigError

_WORKER_WRITABLE_EPOCH_SOURCES = ("heal", "leave")


#: bytes a key costs the server beyond its key and value (dict slot, bytes objects):
#: 100,000 small keys counted 1.03 MB without it and grew the RSS by 10.4 MB (issue 49)
KEY_OVERHEAD = 128
#: file descriptors the process needs beyond its connections (listener, logs, imports)
FD_HEADROOM = 64


@dataclass(frozen=True)
class ServerLimits:
    """Every bound of the coordinator (docs/security.md, "Resource model")."""

    #: the WHOLE handshake (not each read): a byte every few seconds does not hold it open
    handshake_timeout_s: float = 5.0
    #: a frame, once its first byte came, arrives whole within this (a stalled frame ends
    #: its connection); its bytes count against the job's quota while it is read
    frame_timeout_s: float = 30.0
    max_pending_handshakes: int = 1024
    #: authenticated job sessions in all, and per job
    max_connections: int = 6144
    max_connections_per_job: int = 1024
    #: per user (the daemon says whose each job is): one user's jobs cannot fill the room
    max_connections_per_user: int = 2048
    #: the daemon's sessions: beyond the jobs' room, so jobs cannot lock the daemon out
    max_admin_connections: int = 16
    max_job_bytes: int = 16 << 20
    max_job_keys: int = 100_000
    #: all jobs together: the coordinator's memory stays bounded however many jobs a
    #: site admits (its systemd unit has MemoryMax=2G)
    max_total_bytes: int = 1 << 30
    max_wait_s: float = 3600.0

    @property
    def max_sockets(self) -> int:
        """Sockets (= threads) the server may hold at once: sessions, handshakes, admin."""
        return self.max_connections + self.max_pending_handshakes + self.max_admin_connections

    def check_fds(self) -> int:
        """Raise the soft ``RLIMIT_NOFILE`` to what :attr:`max_sockets` needs; refuse to
        start (ConfigError) where the hard limit cannot hold them: limits that run out of
        descriptors first never apply (issue 49, finding 5). Returns the soft limit."""
        need = self.max_sockets + FD_HEADROOM
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < need:
            if hard != resource.RLIM_INFINITY and hard < need:
                raise ConfigError(
                    f"the coordinator's limits need {need} file descriptors and "
                    f"RLIMIT_NOFILE allows {hard} (set LimitNOFILE, or lower the limits)")
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
            soft = need
        return soft


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
    #: bytes of this job's frames being read or handled (counted before they are read)
    inflight: int = 0
    #: the job was forgotten: blocked reads end, nothing is stored here any more
    ended: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)

    def reserve(self, n: int, limits: ServerLimits) -> str | None:
        """Count ``n`` bytes of a frame about to be read (until it is decoded); else why
        not: over the job's quota or the total (the frame is then discarded unbuffered)."""
        with self.cond:
            if self.bytes_used + self.inflight + n > limits.max_job_bytes:
                return f"the job's keys would exceed {limits.max_job_bytes} bytes"
            if not self.usage.change(n):
                return "the coordinator is full (all jobs' keys at the limit)"
            self.inflight += n
            return None

    def release(self, n: int) -> None:
        with self.cond:
            self.inflight -= n
        self.usage.change(-n)

    def put(self, key: str, value: bytes, limits: ServerLimits) -> None:
        old = self.data.get(key)
        grow = len(value) - (len(old) if old is not None else -len(key) - KEY_OVERHEAD)
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
        self.bytes_used -= len(key) + len(old) + KEY_OVERHEAD
        self.usage.change(-(len(key) + len(old) + KEY_OVERHEAD))
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


def read_many(existing: Callable[[str], JobSpace | None], f: list[bytes],
              max_bytes: int) -> list[bytes]:
    """READ_MANY's answer (admin only): present/absent and value of each key, values up to
    ``max_bytes`` (the rest marked "ask again"); never creates a job space."""
    out: list[bytes] = []
    size = 0
    for raw in f:
        key, key_job, _rest = split_key(raw)
        space = existing(key_job)
        value = None
        if space is not None:
            with space.cond:
                value = space.data.get(key)
        if value is not None and size + len(value) > max_bytes and size > 0:
            out += [b"-", b""]
            continue
        size += len(value or b"")
        out += [b"0", b""] if value is None else [b"1", value]
    return out


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

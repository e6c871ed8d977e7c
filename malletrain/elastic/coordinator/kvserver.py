"""The coordinator's key-value server: per-job namespaces behind an authenticated wire.

It serves the operations of ``torch.distributed.Store`` (enough for the membership protocol of
:mod:`.protocol` and for gloo/NCCL to form a process group) to clients that proved a key in
the handshake of :mod:`.wire`:

* a **job session** (job ``J``'s secret) may only name keys under ``mt/J/`` and may not
  rewrite the job's history (:mod:`.kvspace`: it can shrink the job, never grow it);
* the **admin session** (the daemon) may name any job's keys, forget a job, list the jobs.

Requests and their fields (all bytes; integers as ASCII)::

    SET key value | GET key timeout_ms | ADD key amount | CHECK key... | WAIT timeout_ms key...
    NUM_KEYS | DELETE key | COMPARE_SET key expected desired | FORGET_JOB job | JOBS | REALM r
    READ_MANY key... -> per key two fields: b"1" value (present), b"0" b"" (absent) or
                        b"-" b"" (not read: the answer is full, ask again)
    ADMIT final job... (final b"1": the daemon has named all its live jobs; :mod:`.registry`)

Bounded (:class:`ServerLimits`, docs/security.md "Resource model"): sockets and threads (job
sessions in all and per job, the daemon's own room, handshakes in progress: the oldest
unfinished handshake is dropped first, so a flood of idle connections cannot keep a real
client out), sized to the file descriptors the process really has; the whole handshake and
each whole frame in time; bytes (frames being read included) and keys per job, bytes of all
jobs together, wait times. A bad request or a broken frame ends that connection only;
nothing a client sends can stop the server's accept loop, and nothing it sends is logged
more than a few times (counts in :attr:`KVServer.counts`).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import socket
import threading

from malletrain.elastic.coordinator.kvspace import (
    INT64,
    JobSpace,
    Refused,
    ServerLimits,
    Usage,
    check_worker_write,
    parse_int,
    read_many,
    split_key,
)
from malletrain.elastic.coordinator.registry import Registry, parse_admit
from malletrain.elastic.protocol import wire
from malletrain.elastic.protocol.keys import ID_RE
from malletrain.elastic.protocol.wire import Op, Status

log = logging.getLogger(__name__)

#: Value bytes one READ_MANY answer carries at most (the rest is marked "ask again"); the
#: frame limit is one value's largest size plus headroom.
READ_MANY_BYTES = wire.MAX_VALUE_BYTES // 2

__all__ = ["KVServer", "Refused", "ServerLimits"]

#: fields each fixed-size request takes (CHECK and WAIT take any number)
_ARITY = {Op.SET: 2, Op.GET: 2, Op.ADD: 2, Op.NUM_KEYS: 0, Op.DELETE: 1, Op.COMPARE_SET: 3,
          Op.FORGET_JOB: 1, Op.JOBS: 0, Op.REALM: 1}
_ADMIN_ONLY = (Op.FORGET_JOB, Op.JOBS, Op.REALM, Op.READ_MANY, Op.ADMIT)


class KVServer:
    """Serve authenticated store sessions on ``(host, port)`` in background threads."""

    def __init__(self, master: bytes, host: str = "127.0.0.1", port: int = 0,
                 limits: ServerLimits | None = None, *, open_jobs: bool = False) -> None:
        self._master = master
        self.limits = limits or ServerLimits()
        self.fd_limit = self.limits.check_fds()
        self._sock = socket.create_server((host, port), backlog=1024, reuse_port=False)
        self.port: int = self._sock.getsockname()[1]
        self._lock = threading.Lock()  # guards the fields below
        self._jobs: dict[str, JobSpace] = {}
        self.usage = Usage(self.limits.max_total_bytes)
        self._pending: collections.OrderedDict[int, socket.socket] = collections.OrderedDict()
        self._sockets = 0  # accepted and not yet closed
        #: authenticated sessions: "job", "admin", and per owner ("uid:N" / "job:J")
        self._sessions = collections.Counter[str]()
        self._closed = False
        #: the realm and the jobs the daemon admitted (set by the daemon's session)
        self.registry = Registry(open_jobs=open_jobs)
        self.counts: collections.Counter[str] = collections.Counter()
        self._thread = threading.Thread(target=self._accept_loop, name="kv-accept", daemon=True)

    @property
    def realm(self) -> str | None:
        return self.registry.realm

    def start(self) -> KVServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def admit(self, realm: str, jobs: list[str], uid: int = -1) -> None:
        """In-process: what the daemon's session does over the wire (REALM, ADMIT)."""
        if self.registry.set_realm(realm):
            self._forget_all()
        self.registry.admit([(j, uid) for j in jobs], final=True)

    # ------------------------------------------------------------------ connections

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _addr = self._sock.accept()
            except OSError as exc:
                if self._closed:
                    return
                self._count("accept_errors", f"accept failed: {exc}")
                threading.Event().wait(0.05)  # EMFILE and friends: let connections drain
                continue
            with self._lock:
                if self._sockets >= self.limits.max_sockets:
                    conn.close()  # cannot happen while the handshakes' room is shed
                    self.counts["refused_full"] += 1
                    continue
                self._sockets += 1
            try:
                threading.Thread(target=self._serve, args=(conn,), name="kv-conn",
                                 daemon=True).start()
            except RuntimeError:  # cannot start a thread: drop this one, keep accepting
                self._release(conn)

    def _count(self, what: str, message: str, *, trace: bool = False) -> None:
        self.counts[what] += 1
        n = self.counts[what]
        if n & (n - 1) == 0:  # 1, 2, 4, 8...: a flood does not flood the log
            log.warning("coordinator: %s (%s so far: %d)", message, what, n, exc_info=trace)

    def _release(self, conn: socket.socket) -> None:
        with self._lock:
            self._sockets -= 1
            self._pending.pop(id(conn), None)
        conn.close()

    def _authenticate(self, conn: socket.socket) -> tuple[str | None, wire.Session] | None:
        with self._lock:
            self._pending[id(conn)] = conn
            while len(self._pending) > self.limits.max_pending_handshakes:
                _, oldest = self._pending.popitem(last=False)
                self.counts["dropped_handshakes"] += 1
                with contextlib.suppress(OSError):
                    oldest.shutdown(socket.SHUT_RDWR)  # its thread sees EOF and ends
        try:
            job, session = wire.server_handshake(conn, self._master, self.registry.admission,
                                                 self.limits.handshake_timeout_s)
        except (wire.WireError, OSError, ValueError) as exc:
            self._count("auth_failures", f"handshake refused: {exc}")
            return None
        finally:
            with self._lock:
                self._pending.pop(id(conn), None)
        session.frame_timeout_s = self.limits.frame_timeout_s
        return job, session

    def _admit_session(self, job: str | None) -> JobSpace | bool | None:
        """Count an authenticated session: its job's space (None: admin), False if full."""
        lim = self.limits
        space = None if job is None else self._space(job)
        caps = ([("admin", lim.max_admin_connections)] if job is None else
                [("job", lim.max_connections),
                 (self.registry.owner(job), lim.max_connections_per_user)])
        with self._lock:
            if any(self._sessions[kind] >= cap for kind, cap in caps) or (
                    space is not None and space.connections >= lim.max_connections_per_job):
                return False
            for kind, _cap in caps:
                self._sessions[kind] += 1
            if space is not None:
                space.connections += 1
        return space

    def _unsession(self, job: str | None, owner: str, counted: JobSpace | bool | None) -> None:
        with self._lock:
            for kind in (["admin"] if job is None else ["job", owner]):
                self._sessions[kind] -= 1
                if self._sessions[kind] <= 0:
                    del self._sessions[kind]
            if isinstance(counted, JobSpace):
                counted.connections -= 1

    def _serve(self, conn: socket.socket) -> None:
        counted: JobSpace | bool | None = False
        job: str | None = None
        owner = ""
        try:
            auth = self._authenticate(conn)
            if auth is None:
                return
            job, session = auth
            owner = "" if job is None else self.registry.owner(job)
            counted = self._admit_session(job)
            if counted is False:
                self._count("refused_job_full", f"job {job or '<admin>'}: too many connections")
                return
            if job is not None:
                self.registry.attach(job, conn)
            self._session_loop(job, session,
                               counted if isinstance(counted, JobSpace) else None)
        except Exception:  # a bug serving one client must not take the others down
            self._count("errors", "connection failed", trace=True)
        finally:
            if counted is not False:
                self._unsession(job, owner, counted)
            if job is not None:
                self.registry.detach(job, conn)
            self._release(conn)

    def _session_loop(self, job: str | None, session: wire.Session,
                      space: JobSpace | None) -> None:
        held = [0]
        why = [""]

        def reserve(n: int) -> bool:  # a job's frame counts from before it is buffered
            if space is None:
                return True
            why[0] = space.reserve(n, self.limits) or ""
            held[0] = 0 if why[0] else n
            return not why[0]

        while True:
            try:
                code, fields = session.recv(reserve)
            except wire.FrameRefused:
                self.counts["refused"] += 1
                session.send(Status.REFUSED, [why[0].encode()])
                continue
            except (wire.WireError, OSError) as exc:
                if not isinstance(exc, ConnectionError):
                    self._count("bad_frames", f"job {job or '<admin>'}: {exc}")
                return
            finally:
                if space is not None and held[0]:  # decoded (or failed): the fields count
                    space.release(held[0])
                    held[0] = 0
            try:
                status, answer = self.handle(job, code, fields)
            except Refused as exc:
                self.counts["refused"] += 1
                status, answer = Status.REFUSED, [str(exc).encode()[:512]]
            session.send(status, answer)

    # ------------------------------------------------------------------ requests

    def _space(self, job: str) -> JobSpace:
        with self._lock:
            space = self._jobs.get(job)
            if space is None:
                space = self._jobs[job] = JobSpace(self.usage)
            return space

    def _target(self, job: str | None, raw: bytes) -> tuple[str, str, JobSpace]:
        key, key_job, rest = split_key(raw)
        if job is not None and key_job != job:
            raise Refused(f"key {key[:80]!r} is outside this session's job")
        return key, rest, self._space(key_job)

    def handle(self, job: str | None, code: int, f: list[bytes]) -> tuple[Status, list[bytes]]:
        """One request of a session of ``job`` (None: admin) -> (status, answer fields)."""
        if code in _ARITY and len(f) != _ARITY[Op(code)]:
            raise Refused(f"request {code} takes {_ARITY[Op(code)]} fields, got {len(f)}")
        if code in _ADMIN_ONLY and job is not None:
            raise Refused("only the daemon may do that")
        if job is not None and not self.registry.admitted(job):
            raise Refused("the job has ended")  # its sessions are being closed
        if code == Op.REALM:
            realm = f[0].decode(errors="replace")
            if realm and not ID_RE.match(realm):
                raise Refused("bad realm")
            if self.registry.set_realm(realm):
                self._forget_all()
            return Status.OK, []
        if code == Op.ADMIT:
            jobs, final = parse_admit(f)
            return Status.OK, [str(self.registry.admit(jobs, final=final)).encode()]
        if code == Op.CHECK:
            return self._check(job, f)
        if code == Op.READ_MANY:
            return Status.OK, read_many(self._existing, f, READ_MANY_BYTES)
        if code == Op.WAIT:
            return self._wait(job, f)
        if code == Op.NUM_KEYS:
            spaces = [self._space(job)] if job is not None else list(self._jobs.values())
            return Status.OK, [str(sum(len(s.data) for s in spaces)).encode()]
        if code == Op.FORGET_JOB:
            return Status.OK, [str(self.forget(f[0].decode(errors="replace"))).encode()]
        if code == Op.JOBS:
            with self._lock:
                return Status.OK, [f"{j} {len(s.data)} {s.bytes_used}".encode()
                                   for j, s in sorted(self._jobs.items())]
        if code not in (Op.SET, Op.GET, Op.ADD, Op.DELETE, Op.COMPARE_SET):
            raise Refused(f"unknown request {code}")
        key, rest, space = self._target(job, f[0])
        with space.cond:
            return self._keyed(job, Op(code), key, rest, f[1:], space)

    def _keyed(self, job: str | None, code: Op, key: str, rest: str, args: list[bytes],
               space: JobSpace) -> tuple[Status, list[bytes]]:
        if job is not None:
            args = check_worker_write(code, key, rest, args, space)
        if code == Op.SET:
            space.put(key, args[0], self.limits)
            return Status.OK, []
        if code == Op.GET:
            timeout_s = self._timeout(args[0])
            if not space.cond.wait_for(lambda: key in space.data or space.ended,
                                       timeout=timeout_s):
                return Status.TIMEOUT, [key.encode()]
            if space.ended:
                raise Refused("the job has ended")
            return Status.OK, [space.data[key]]
        if code == Op.ADD:
            old = space.data.get(key, b"0")
            value = parse_int(old, f"the value of {key!r}") + parse_int(args[0], "the amount")
            if not -INT64 <= value < INT64:
                raise Refused(f"{key!r} would pass an int64")
            space.put(key, str(value).encode(), self.limits)
            return Status.OK, [str(value).encode()]
        if code == Op.DELETE:
            return Status.OK, [b"1" if space.pop(key) else b"0"]
        expected, desired = args  # COMPARE_SET, as TCPStore does it
        current = space.data.get(key)
        if (current is None and expected == b"") or (current is not None and current == expected):
            space.put(key, desired, self.limits)
            return Status.OK, [desired]
        return Status.OK, [current if current is not None else expected]

    def _timeout(self, raw: bytes) -> float:
        ms = parse_int(raw, "the timeout")
        return min(max(ms, 0) / 1000.0, self.limits.max_wait_s)

    def _check(self, job: str | None, f: list[bytes]) -> tuple[Status, list[bytes]]:
        for raw in f:
            key, _rest, space = self._target(job, raw)
            with space.cond:
                if key not in space.data:
                    return Status.OK, [b"0"]
        return Status.OK, [b"1"]

    def _existing(self, job: str) -> JobSpace | None:
        with self._lock:
            return self._jobs.get(job)

    def _wait(self, job: str | None, f: list[bytes]) -> tuple[Status, list[bytes]]:
        if not f:
            raise Refused("WAIT takes a timeout and keys")
        timeout_s = self._timeout(f[0])
        targets = [self._target(job, raw) for raw in f[1:]]
        spaces = {id(s): s for _k, _r, s in targets}
        if len(spaces) > 1:
            raise Refused("WAIT names keys of one job only")
        for key, _rest, space in targets:
            with space.cond:
                if not space.cond.wait_for(
                        lambda k=key, s=space: k in s.data or s.ended,  # type: ignore[misc]
                        timeout=timeout_s):
                    return Status.TIMEOUT, [key.encode()]
                if space.ended:
                    raise Refused("the job has ended")
        return Status.OK, []

    def _forget_all(self) -> None:
        """A new realm: every namespace belonged to the old one."""
        with self._lock:
            jobs = list(self._jobs)
        for j in jobs:
            self.forget(j)

    def forget(self, job: str) -> int:
        """Drop every key of ``job`` (its namespace goes; the daemon calls it at job end);
        its secret is refused from now on and its sessions are closed."""
        self.registry.end(job)
        with self._lock:
            space = self._jobs.pop(job, None)
        if space is None:
            return 0
        with space.cond:
            n = len(space.data)
            space.data.clear()
            self.usage.change(-space.bytes_used)
            space.bytes_used = 0
            space.ended = True  # wakes its blocked GET/WAIT: they end with a refusal
            space.cond.notify_all()
        return n

    def job_bytes(self) -> dict[str, int]:
        with self._lock:
            return {j: s.bytes_used for j, s in self._jobs.items()}

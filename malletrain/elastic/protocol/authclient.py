"""``AuthClient``: a session with the coordinator over its authenticated wire (no torch).

The operations of ``torch.distributed.Store`` (set, get, add, check, wait, compare_set,
delete) plus the admin ones, over :mod:`.wire`. The daemon talks to the coordinator with
this alone, so that it does not import torch (1.0-1.4 s and about 100 MB, measured with
``python -X importtime`` and the load benchmark's RSS); workers wrap it in
:class:`.authstore.AuthStore`, a real ``torch.distributed.Store``. Errors: a lost or
refused connection is :class:`CoordinatorUnreachable`, a key not there in time
:class:`KeyTimeout`, a refused request :class:`StoreRefused` (all ``RuntimeError``).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from datetime import timedelta

from malletrain.elastic.protocol import wire
from malletrain.elastic.protocol.wire import Op, Status

DEFAULT_TIMEOUT_S = 300.0


class CoordinatorUnreachable(RuntimeError):
    """The connection could not be made, or was lost (torch's ``DistNetworkError``)."""


class AuthenticationRefused(CoordinatorUnreachable):
    """The key was refused at the handshake: ``proven`` when the coordinator proved who it
    is (the job has ended: final), else an unproven refusal that lasted the whole connect
    timeout (a wrong secret, or something else answering on the port)."""

    def __init__(self, message: str, *, proven: bool = False) -> None:
        super().__init__(message)
        self.proven = proven


class KeyTimeout(RuntimeError):
    """A ``get``/``wait`` saw no key within its timeout (torch's ``DistStoreError``)."""


class StoreRefused(RuntimeError):
    """The coordinator refused a request (not this job's key, history rewrite, a quota)."""


def _bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, list):
        return bytes(value)
    raise TypeError(f"store values are bytes or str, got {type(value).__name__}")


class AuthClient:
    """One authenticated session (thread-safe: one request at a time)."""

    def __init__(self, host: str, port: int, job: str | None, secret: bytes, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, connect_timeout_s: float = 10.0) -> None:
        self._addr = (host, port)
        self._job = job
        self._secret = secret
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._session = self._open(connect_timeout_s)

    def _open(self, timeout_s: float) -> wire.Session:
        """Connect and authenticate. A connection dropped mid-handshake (a flood of other
        clients makes the coordinator shed the oldest handshakes), a coordinator still
        waiting for the daemon ("retry") and an unproven refusal (anyone can answer on the
        port while the coordinator is down) are tried again until ``timeout_s``; a refusal
        the coordinator proved is final at once."""
        deadline = time.monotonic() + timeout_s
        while True:
            sock = self._dial(max(deadline - time.monotonic(), 0.0))
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(max(deadline - time.monotonic(), 1.0))
                session = wire.client_handshake(sock, self._job, self._secret)
                sock.settimeout(None)
                return session
            except (OSError, wire.WireError) as exc:
                sock.close()
                where = f"coordinator at {self._addr[0]}:{self._addr[1]}"
                if isinstance(exc, wire.AuthRefused):
                    raise AuthenticationRefused(f"{where}: {exc}", proven=True) from exc
                over = time.monotonic() > deadline
                if isinstance(exc, wire.Unproven) and not exc.retry and over:
                    raise AuthenticationRefused(f"{where}: {exc}") from exc
                if over or (isinstance(exc, wire.WireError)
                            and not isinstance(exc, wire.Unproven)):
                    raise CoordinatorUnreachable(f"{where}: {exc}") from exc
                time.sleep(0.2 if isinstance(exc, wire.Unproven) else 0.05)

    def _dial(self, timeout_s: float) -> socket.socket:
        """Connect, retrying a refused connection until ``timeout_s`` (as TCPStore waits for
        a server that is still starting)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                return socket.create_connection(self._addr, timeout=max(left, 0.1))
            except OSError as exc:
                if left <= 0 or not isinstance(exc, ConnectionRefusedError):
                    raise CoordinatorUnreachable(
                        f"cannot reach the coordinator at {self._addr[0]}:{self._addr[1]}: "
                        f"{exc}") from exc
                time.sleep(min(0.1, max(left, 0.01)))

    def clone(self) -> AuthClient:
        """A new session with the same credentials (for a thread or backend of its own)."""
        return AuthClient(*self._addr, self._job, self._secret, timeout_s=self._timeout_s)

    def close(self) -> None:
        self._session.close()

    def _call(self, op: Op, fields: Sequence[bytes]) -> tuple[Status, list[bytes]]:
        with self._lock:
            try:
                self._session.send(op, fields)
                code, answer = self._session.recv()
            except (OSError, wire.WireError) as exc:
                raise CoordinatorUnreachable(f"coordinator connection lost: {exc}") from exc
        status = Status(code) if code in Status._value2member_map_ else None
        if status is Status.REFUSED:
            reason = answer[0].decode(errors="replace") if answer else "refused"
            raise StoreRefused(f"the coordinator refused {op.name}: {reason}")
        if status is None:
            raise CoordinatorUnreachable(f"coordinator answered with status {code}")
        return status, answer

    def _ok(self, op: Op, fields: Sequence[bytes]) -> list[bytes]:
        status, answer = self._call(op, fields)
        if status is Status.TIMEOUT:
            key = answer[0].decode(errors="replace") if answer else "?"
            raise KeyTimeout(f"timed out waiting for key {key!r}")
        return answer

    def _ms(self, timeout: timedelta | float | None) -> bytes:
        if timeout is None:
            seconds = self._timeout_s
        elif isinstance(timeout, timedelta):
            seconds = timeout.total_seconds()
        else:
            seconds = float(timeout)
        return str(int(seconds * 1000)).encode()

    # ------------------------------------------------------------------ the Store API

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        self._timeout_s = value

    def set(self, key: str, value: object) -> None:
        self._ok(Op.SET, [key.encode(), _bytes(value)])

    def get(self, key: str) -> bytes:
        return self._ok(Op.GET, [key.encode(), self._ms(None)])[0]

    def add(self, key: str, amount: int) -> int:
        return int(self._ok(Op.ADD, [key.encode(), str(int(amount)).encode()])[0])

    def check(self, keys: Sequence[str]) -> bool:
        return self._ok(Op.CHECK, [k.encode() for k in keys])[0] == b"1"

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        self._ok(Op.WAIT, [self._ms(timeout), *(k.encode() for k in keys)])

    def num_keys(self) -> int:
        return int(self._ok(Op.NUM_KEYS, [])[0])

    def delete_key(self, key: str) -> bool:
        return self._ok(Op.DELETE, [key.encode()])[0] == b"1"

    def compare_set(self, key: str, expected: object, desired: object) -> bytes:
        return self._ok(Op.COMPARE_SET, [key.encode(), _bytes(expected), _bytes(desired)])[0]

    # ------------------------------------------------------------------ admin only

    def forget_job(self, job_id: str) -> int:
        """Drop every key of ``job_id`` on the server (admin session only)."""
        return int(self._ok(Op.FORGET_JOB, [job_id.encode()])[0])

    def set_realm(self, realm: str) -> None:
        """Derive job secrets in ``realm`` from now on (admin session only)."""
        self._ok(Op.REALM, [realm.encode()])

    def admit(self, jobs: Sequence[str | tuple[str, int]], *, final: bool,
              per_request: int = 4096) -> None:
        """Serve ``jobs``' secrets (admin only): ids, or (id, the owner's uid) so that the
        coordinator caps sessions per user; ``final``: these are all the live jobs."""
        fields = [(j if isinstance(j, str) else f"{j[0]}:{j[1]}" if j[1] >= 0 else j[0]).encode()
                  for j in jobs]
        for start in range(0, max(len(fields), 1), per_request):
            last = start + per_request >= len(fields)
            flag = b"1" if final and last else b"0"
            self._ok(Op.ADMIT, [flag, *fields[start:start + per_request]])

    def read_many(self, keys: Sequence[str], per_request: int = 1024) -> list[bytes | None]:
        """The value of each key, ``None`` where absent, in few round trips (admin only)."""
        out: list[bytes | None] = [None] * len(keys)
        todo = list(range(len(keys)))
        while todo:
            batch, todo = todo[:per_request], todo[per_request:]
            answer = self._ok(Op.READ_MANY, [keys[i].encode() for i in batch])
            if len(answer) != 2 * len(batch):
                raise CoordinatorUnreachable("coordinator: malformed READ_MANY answer")
            again = []
            for i, flag, value in zip(batch, answer[0::2], answer[1::2], strict=True):
                if flag == b"1":
                    out[i] = value
                elif flag == b"-":
                    again.append(i)
            if again and len(again) == len(batch):
                raise CoordinatorUnreachable("coordinator: READ_MANY read nothing")
            todo = again + todo
        return out

    def jobs(self) -> dict[str, tuple[int, int]]:
        """``{job: (keys, bytes)}`` held by the server (admin session only)."""
        out = {}
        for line in self._ok(Op.JOBS, []):
            job, keys, size = line.decode().split()
            out[job] = (int(keys), int(size))
        return out

"""The submit channel: a Unix stream socket; the kernel tells the daemon who is calling.

Why a Unix socket: ``SO_PEERCRED`` gives the uid of the process at the other end, so a user
cannot act for someone else and no password or token is needed. The daemon never trusts a
user name or uid sent in a request, only the peer credentials.

Protocol: one request per connection, one JSON object per line each way, at most
:data:`MAX_REQUEST_BYTES`. Requests ``{"op": "submit"|"attach"|"jobs"|"cancel", ...}``;
answers ``{"ok": true, ...}`` or ``{"ok": false, "error": "...", "retryable": bool}`` (and
``"busy": true`` when refused unread: a client may send it again). A
malformed request gets an error answer, never a crash of the daemon.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import pwd
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from malletrain.errors import PermanentError, RetryableError, UserError

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 1 << 20
CLIENT_TIMEOUT_S = 60.0
#: a whole request must arrive within this (a client trickling bytes is cut off)
_SERVER_READ_TIMEOUT_S = 10.0
#: connections served at once, per calling uid and in all: a user opening connections
#: without end gets "busy" answers, and everyone else is still served (issue 15)
MAX_CONNECTIONS_PER_UID = 16
MAX_CONNECTIONS = 256
#: the answer to a connection refused unread (the client may send it again)
_BUSY = b'{"ok": false, "error": "the daemon is busy with your other requests; try again", ' \
        b'"retryable": true, "busy": true}\n'
#: accept() errors that mean "out of resources right now" (file descriptors, memory)
_TRANSIENT_ACCEPT_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS,
                                      errno.ENOMEM, errno.ECONNABORTED, errno.EPROTO})


@dataclass(frozen=True)
class Peer:
    """Who is at the other end, as the kernel says."""

    uid: int
    gid: int
    pid: int
    user: str


def peer_of(conn: socket.socket) -> Peer:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return Peer(uid=uid, gid=gid, pid=pid, user=user)


Handler = Callable[[Peer, Mapping[str, Any]], dict[str, Any]]


class ChannelServer:
    """Serves requests on ``path`` in a background thread; one short thread per connection."""

    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self._handler = handler
        self._stop = threading.Event()
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            path.unlink()  # a socket file left by a killed daemon
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        # Everyone may connect; who they are comes from SO_PEERCRED, not from the file mode.
        os.chmod(path, 0o666)
        self._sock.listen(64)
        self._sock.settimeout(0.5)
        self._thread = threading.Thread(target=self._serve, name="submit-channel", daemon=True)
        self._lock = threading.Lock()
        self._open: dict[int, int] = {}  # uid -> connections being served
        self._last_full_log = 0.0

    def start(self) -> ChannelServer:
        self._thread.start()
        log.info("submit channel listening on %s", self.path)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _serve(self) -> None:
        """Accept forever: no error of one connection, and no shortage, ends this thread."""
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                self._log_full(f"submit channel: accept failed ({exc}); retrying")
                time.sleep(0.05 if exc.errno in _TRANSIENT_ACCEPT_ERRORS else 0.5)
                continue
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        try:
            peer = peer_of(conn)
        except OSError:
            conn.close()
            return
        with self._lock:
            mine = self._open.get(peer.uid, 0)
            full = mine >= MAX_CONNECTIONS_PER_UID or sum(self._open.values()) >= MAX_CONNECTIONS
            if not full:
                self._open[peer.uid] = mine + 1
        if full:
            self._log_full(f"submit channel: too many connections; refusing uid {peer.uid}")
            with conn, contextlib.suppress(OSError):
                conn.setblocking(False)
                conn.send(_BUSY)
            return
        threading.Thread(target=self._one, args=(conn, peer), name="submit-conn",
                         daemon=True).start()

    def _log_full(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_full_log > 10.0:  # a flood must not flood the log too
            self._last_full_log = now
            log.warning("%s", message)

    def _one(self, conn: socket.socket, peer: Peer) -> None:
        try:
            with conn:
                try:
                    request = _read_message(conn, deadline_s=_SERVER_READ_TIMEOUT_S)
                    answer = self._dispatch(peer, request)
                except (OSError, ValueError) as exc:
                    answer = {"ok": False, "error": f"bad request: {exc}", "retryable": False}
                try:
                    conn.settimeout(_SERVER_READ_TIMEOUT_S)
                    conn.sendall((json.dumps(answer) + "\n").encode())
                except OSError as exc:
                    log.warning("submit channel: could not answer %s: %s", peer, exc)
        finally:
            with self._lock:
                self._open[peer.uid] -= 1
                if not self._open[peer.uid]:
                    del self._open[peer.uid]

    def _dispatch(self, peer: Peer, request: Any) -> dict[str, Any]:
        if not isinstance(request, dict) or not isinstance(request.get("op"), str):
            return {"ok": False, "error": "bad request: expected an object with 'op'",
                    "retryable": False}
        try:
            answer = self._handler(peer, request)
        except RetryableError as exc:
            return {"ok": False, "error": str(exc), "retryable": True}
        except UserError as exc:
            return {"ok": False, "error": str(exc), "retryable": False}
        except Exception as exc:  # the daemon must survive any request
            log.exception("submit channel: request %r from %s failed", request.get("op"), peer)
            return {"ok": False, "error": f"internal error: {type(exc).__name__}",
                    "retryable": True}
        return {"ok": True, **answer}


def _read_message(conn: socket.socket, deadline_s: float | None = None) -> Any:
    """One JSON line; with ``deadline_s``, the whole line must arrive within it."""
    buf = bytearray()
    end = None if deadline_s is None else time.monotonic() + deadline_s
    while b"\n" not in buf:
        if end is not None:
            left = end - time.monotonic()
            if left <= 0:
                raise ValueError(f"no whole request within {deadline_s:.0f} s")
            conn.settimeout(left)
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_REQUEST_BYTES:
            raise ValueError(f"request larger than {MAX_REQUEST_BYTES} bytes")
    line = bytes(buf).split(b"\n", 1)[0]
    if not line:
        raise ValueError("empty request")
    try:
        return json.loads(line.decode("utf-8"))
    except RecursionError:  # "[" x 5000 nests past the stack: a bad request, not a traceback
        raise ValueError("request nested too deeply") from None


# ----------------------------------------------------------------------------- client


class DaemonUnavailable(RetryableError):
    """The daemon's socket is missing or not answering."""


class _NotActedOn(DaemonUnavailable):
    """The daemon cannot have acted on the request: not reached, or refused it as busy."""


#: how long the command-line tools keep trying a daemon that restarts or is busy
CLIENT_RETRY_S = 30.0


def call(path: Path, request: Mapping[str, Any], timeout_s: float = CLIENT_TIMEOUT_S,
         retry_s: float = 0.0, idempotent: bool = False,
         on_retry: Callable[[UserError], None] | None = None) -> dict[str, Any]:
    """Send one request, return the answer; raise UserError subclasses on failure.

    With ``retry_s``, a call the daemon cannot have acted on (no socket, refused, answered
    busy: a restart or a flood) is tried again, with a growing pause, until ``retry_s`` has
    passed, as ``sbatch`` retries a slurmctld that is not answering. A call that reached the
    daemon and got no answer is tried again only if ``idempotent`` (a read, a cancel): a
    submit may have been done. ``on_retry`` is told of each failure that is retried.
    """
    end = time.monotonic() + retry_s
    pause_s = 0.2
    while True:
        try:
            return _call_once(path, request, timeout_s)
        except DaemonUnavailable as exc:
            again = isinstance(exc, _NotActedOn) or idempotent
            if not again or time.monotonic() + pause_s > end:
                raise
            if on_retry is not None:
                on_retry(exc)
        time.sleep(pause_s)
        pause_s = min(2.0, pause_s * 2)


def _call_once(path: Path, request: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        sock.close()
        raise _NotActedOn(
            f"the malletrain daemon is not running (no socket at {path}: {exc.strerror}); "
            "set MALLETRAIN_SOCKET or ask your administrator"
        ) from None
    except OSError as exc:
        sock.close()
        raise _NotActedOn(f"cannot reach the malletrain daemon at {path}: {exc}") from None
    with sock:
        sent: OSError | None = None
        try:
            sock.sendall((json.dumps(dict(request)) + "\n").encode())
        except OSError as exc:
            # a daemon that refuses a connection (busy) answers and closes at once: the
            # request can then meet a closed socket (EPIPE) while the answer waits unread
            sent = exc
        try:
            answer = _read_message(sock)
        except (OSError, ValueError) as exc:
            raise DaemonUnavailable(
                f"the malletrain daemon did not answer: {sent or exc}") from None
    if not isinstance(answer, dict):
        raise DaemonUnavailable("the malletrain daemon sent a malformed answer")
    if not answer.get("ok"):
        message = str(answer.get("error", "unknown error"))
        if answer.get("busy") is True:
            raise _NotActedOn(message)
        if answer.get("retryable"):
            raise RetryableError(message)
        raise PermanentError(message)
    return answer

"""Which jobs the coordinator serves, in which realm: what the daemon has told it.

A job's secret is derivable from the master key for ANY job id, so a secret alone must not
open a namespace: a job that ended (or that the daemon never admitted) would otherwise keep a
working secret forever, and each such secret would re-create a namespace with a fresh quota
(issue 49, finding 3). So the daemon's session *admits* each job when it hands out the
job's secret (and all live jobs again after every reconnection), and *ends* it when the job
is done: a session of an ended job is closed, and its secret refused at the handshake.

Until the daemon has said its realm and admitted its jobs since this coordinator started,
the coordinator is *not ready*: a job's handshake is answered "retry" (never "authentication
failed", which a worker takes as the end: finding 10). A new realm (the daemon's database was
reset, job ids restart at m1) ends every job of the old one, and the server drops their
namespaces (finding 6).

``open``: the hand-run coordinator with no daemon (``malletrain coordinator --open``) serves
every job whose secret it can derive in the empty realm, as before.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterable

from malletrain.elastic.coordinator.kvspace import Refused
from malletrain.elastic.protocol.keys import ID_RE


class Registry:
    """The realm and the admitted jobs, and the open sessions of each job (to end them)."""

    def __init__(self, *, open_jobs: bool = False) -> None:
        self._lock = threading.Lock()
        self.open = open_jobs
        #: None: not told yet; job secrets are derived in it
        self.realm: str | None = "" if open_jobs else None
        self.ready = open_jobs
        self._admitted: set[str] = set()
        #: job -> its user's uid (-1: not said); sessions are capped per user too
        self._owner: dict[str, int] = {}
        self._sessions: dict[str, set[socket.socket]] = {}

    def admission(self, job: str) -> tuple[str | None, bool]:
        """What a handshake of ``job`` gets (:func:`~..protocol.wire.server_handshake`)."""
        with self._lock:
            if not self.ready:
                return None, False
            return self.realm, self.open or job in self._admitted

    def admitted(self, job: str) -> bool:
        with self._lock:
            return self.open or job in self._admitted

    def set_realm(self, realm: str) -> bool:
        """The daemon's realm. True if it replaced another one: every job of the old realm
        has ended (the caller drops their namespaces), and the server is not ready until
        the daemon has admitted its jobs."""
        with self._lock:
            changed = self.realm is not None and realm != self.realm
            if changed:  # (an open coordinator stays open for sessions of its own realm)
                self.open = False
                self._admitted.clear()
                self._owner.clear()
                self.ready = False
                ended = [s for group in self._sessions.values() for s in group]
            self.realm = realm
        if changed:
            _shut(ended)
        return changed

    def admit(self, jobs: Iterable[tuple[str, int]], *, final: bool) -> int:
        """Serve ``jobs`` (id, owner's uid or -1); ``final``: the daemon has named all its
        live jobs (ready)."""
        with self._lock:
            for job, uid in jobs:
                self._admitted.add(job)
                if uid >= 0 or job not in self._owner:
                    self._owner[job] = uid
            if final and self.realm is not None:
                self.ready = True
            return len(self._admitted)

    def end(self, job: str) -> None:
        """The job is done: its secret is refused from now on, its sessions are closed."""
        with self._lock:
            self._admitted.discard(job)
            self._owner.pop(job, None)
            ended = list(self._sessions.get(job, ()))
        _shut(ended)

    def owner(self, job: str) -> str:
        """Who a job's sessions count against: its user, or the job itself if unknown."""
        with self._lock:
            uid = self._owner.get(job, -1)
        return f"uid:{uid}" if uid >= 0 else f"job:{job}"

    def attach(self, job: str, sock: socket.socket) -> None:
        with self._lock:
            self._sessions.setdefault(job, set()).add(sock)

    def detach(self, job: str, sock: socket.socket) -> None:
        with self._lock:
            group = self._sessions.get(job)
            if group is not None:
                group.discard(sock)
                if not group:
                    del self._sessions[job]


def parse_admit(f: list[bytes]) -> tuple[list[tuple[str, int]], bool]:
    """ADMIT's fields: a final flag (b"1"/b"0"), then ``job`` or ``job:uid`` each."""
    if not f or f[0] not in (b"0", b"1"):
        raise Refused("ADMIT takes a final flag and job ids")
    jobs = []
    for raw in f[1:]:
        job, _, uid = raw.decode(errors="replace").partition(":")
        if not ID_RE.match(job) or (uid and not uid.isdigit()) or len(uid) > 10:
            raise Refused(f"bad job id {raw[:80]!r}")
        jobs.append((job, int(uid) if uid else -1))
    return jobs, f[0] == b"1"


def _shut(socks: Iterable[socket.socket]) -> None:
    """Wake each session's thread (it sees the connection end and cleans up)."""
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)

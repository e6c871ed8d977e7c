"""The elastic coordinator: the daemon's handle on the membership of malleable jobs.

The coordinator is a key-value store (:mod:`.kvserver`, behind the authenticated wire of
:mod:`.wire`) that lives OFF the preemptible nodes, plus this typed API over its keys
(layout in :mod:`malletrain.elastic.protocol.keys`). All state is in
the store, none in this object, so:

* the daemon can host the store in-process (:meth:`Coordinator.start`), or
* run it in a separate process that survives a ``kill -9`` of the daemon
  (``malletrain coordinator --port 29400 --key-file K --address-file F``) and connect with
  :meth:`Coordinator.attach`; a restarted daemon attaches again and reads the current
  epoch, membership, registrations, departures and progress back.

Daemon usage (one job)::

    coord = Coordinator.attach("login1:29400", master)  # or Coordinator.start("0.0.0.0", 0, master)
    coord.job_secret("job42")                           # hex, for job42's processes ONLY
    # start Slurm slot jobs with the env contract below; their workers register
    waiting = coord.registered("job42")                 # {member_id: MemberInfo}
    epoch = coord.publish("job42", ["m0", "m1"])        # grow / shrink / planned leave
    coord.progress("job42")                             # ProgressReport | None, ~1/s
    coord.departures("job42")                           # SIGTERM'd / failed / removed members
    coord.is_finished("job42"); coord.forget("job42")

Membership semantics:

* ``publish(job, members)`` defines the next epoch; ``members`` is the full new list, in rank
  order. Workers switch at their next step boundary, all at once. Members that were in the job
  and are not in the list leave cleanly at that boundary (exit code 0, departure reason
  ``removed``): that is a planned leave, no step is lost. ``publish(job, [])`` evicts the job
  to zero: the last members save the state to ``MALLETRAIN_STATE_DIR`` first.
* Survivors also write epochs themselves, without waiting for the daemon: after a member
  announced SIGTERM at a step boundary (``source="leave"``) and after a failure (crash,
  SIGKILL, frozen member; ``source="heal"``). Each epoch is written once (compare-and-set), so
  :meth:`publish` and a heal cannot both define the same epoch; :meth:`publish` retries on the
  next number and returns the epoch it got.
* Only members that registered and have not departed since can be published
  (:class:`MemberUnavailable` otherwise, a retryable error: re-plan on the next tick).

Worker environment contract (set by the daemon on each Slurm slot job; one slot = one member =
one node running ``torchrun --nnodes=1 --nproc-per-node=K script.py``):

=========================  ==================================================================
``MALLETRAIN_COORDINATOR``  ``host:port`` of the store (required)
``MALLETRAIN_JOB_ID``       the job id, ``[A-Za-z0-9._-]{1,128}`` (required)
``MALLETRAIN_JOB_SECRET``   the job's secret, 64 hex digits (required; :meth:`job_secret`).
                            Private to the job's user: never on a command line.
``MALLETRAIN_MEMBER_ID``    this slot's member id, unique within the job, same charset (required)
``MALLETRAIN_STATE_DIR``    directory for the evicted-to-zero snapshot; must be reachable from
                            every node the job may run on (login node / parallel FS). Optional:
                            without it, eviction to zero loses the training state (warned).
``LOCAL_RANK``,             set by torchrun; default 0 and 1 without torchrun. Global rank =
``LOCAL_WORLD_SIZE``        sum of the local world sizes of the members before this one in the
                            membership + LOCAL_RANK (= member index * K + LOCAL_RANK).
=========================  ==================================================================

Optional tuning (seconds): ``MALLETRAIN_STEP_TIMEOUT_S`` (collective timeout during steps,
bounds a frozen member, default 10), ``MALLETRAIN_SYNC_TIMEOUT_S`` (process group formation and
state broadcast, default 120), ``MALLETRAIN_JOIN_TIMEOUT_S`` (how long the members of a new epoch
wait for each other before the ones present drop the missing, default 30),
``MALLETRAIN_HEAL_WAIT_S`` (after a failure, how long survivors wait for each other's "alive"
marks, default 2), ``MALLETRAIN_SIGTERM_DEADLINE_S`` (after SIGTERM the process is forced out
after this long whatever it is doing, default 4; set it a little under Slurm's GraceTime),
``MALLETRAIN_BACKEND`` (``gloo``/``nccl``; default: nccl for a CUDA device).

Trust: every session proves a key (docs/security.md). A job's processes prove the job's secret
and can name only that job's keys, and can shrink the job (heal, leave) but not grow it or
evict it; the daemon proves the admin key derived from the master key. Frames are MAC-checked,
not encrypted.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from malletrain.elastic.coordinator.batchread import JobRead, read_jobs
from malletrain.elastic.coordinator.kvserver import KVServer, ServerLimits
from malletrain.elastic.protocol import keys as p
from malletrain.elastic.protocol import wire
from malletrain.elastic.protocol.authclient import (
    AuthClient,
    AuthenticationRefused,
    CoordinatorUnreachable,
)
from malletrain.elastic.protocol.config import parse_address
from malletrain.elastic.protocol.jobstore import JobStore
from malletrain.elastic.protocol.keys import (
    Departure,
    FinishRecord,
    MemberInfo,
    Membership,
    ProgressReport,
)
from malletrain.elastic.protocol.records import RecordError
from malletrain.errors import RetryableError

log = logging.getLogger(__name__)
T = TypeVar("T")
#: the daemon's live jobs, ids or (id, the owner's uid) (read at every reconnection)
LiveJobs = Callable[[], Iterable[str | tuple[str, int]]]

__all__ = [
    "Coordinator",
    "Departure",
    "FinishRecord",
    "MemberInfo",
    "MemberUnavailable",
    "Membership",
    "ProgressReport",
]


class CoordinatorKeyMismatch(RetryableError):
    """Something at the address refused the daemon's key. Retryable: the refusal is not
    proven (a coordinator with another master key cannot prove anything, and neither can
    another user's process that took the port while the coordinator was down), so it is
    never a reason to give up for good (issue 49, finding 7)."""


class MemberUnavailable(RetryableError):
    """A member passed to :meth:`Coordinator.publish` is not registered (or departed)."""


class Coordinator:
    """Typed access to the membership store. Thread-safe (one lock around store calls)."""

    def __init__(self, store: AuthClient, host: str, port: int, master: bytes,
                 realm: str = "", live_jobs: LiveJobs | None = None) -> None:
        self._store = store
        self._host = host
        self._port = port
        self._master = master
        self._realm = realm
        self._server: KVServer | None = None  # set when this object hosts the store
        self._lock = threading.Lock()
        self._jobs: dict[str, JobStore] = {}
        #: the daemon's live jobs, admitted again at every (re)connection (registry.py)
        self._live_jobs = live_jobs
        #: jobs admitted on this session (their secrets handed out or read every tick),
        #: with their owners' uids (-1: not known here)
        self._admitted: dict[str, int] = {}

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def start(cls, host: str = "127.0.0.1", port: int = 0, master: bytes | None = None,
              limits: ServerLimits | None = None, realm: str = "",
              live_jobs: LiveJobs | None = None) -> Coordinator:
        """Host a new store in this process (``port=0``: pick a free port; see ``address``).

        ``host`` is the address to bind AND the one advertised in :attr:`address`; pass the
        login node's cluster-facing name or IP (``0.0.0.0`` binds everywhere but is
        advertised as the machine's hostname). ``master``: the key every job secret derives
        from (:mod:`.wire`); a random one when not given (tests, one-off runs).
        """
        master = os.urandom(wire.SECRET_BYTES) if master is None else master
        server, advertised = serve(host, port, master, limits)
        local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        coord = cls.attach(f"{local}:{server.port}", master, realm=realm, live_jobs=live_jobs)
        coord._server = server
        coord._host = advertised
        return coord

    @classmethod
    def attach(cls, address: str, master: bytes, timeout_s: float = 10.0,
               realm: str = "", live_jobs: LiveJobs | None = None) -> Coordinator:
        """Connect to a store hosted elsewhere (e.g. by ``malletrain coordinator``).

        ``realm`` names the daemon's database; job secrets are derived in it (:mod:`.wire`).
        At every (re)connection the session sets it and admits ``live_jobs()`` and every job
        admitted before (a restarted coordinator forgot them, and answers workers "retry"
        until then: :mod:`.registry`). Raises :class:`RetryableError` if it cannot be
        reached within ``timeout_s``, :class:`CoordinatorKeyMismatch` (also retryable) if
        what answers refuses ``master``.
        """
        host, port = parse_address(address)
        coord = cls(cls._dial(host, port, master, timeout_s), host, port, master, realm,
                    live_jobs)
        with coord._lock:
            coord._register()
        return coord

    @staticmethod
    def _dial(host: str, port: int, master: bytes, timeout_s: float) -> AuthClient:
        try:
            return AuthClient(host, port, None, wire.admin_secret(master),
                              timeout_s=timeout_s, connect_timeout_s=timeout_s)
        except AuthenticationRefused as exc:
            raise CoordinatorKeyMismatch(
                f"what answers at {host}:{port} refuses this daemon's key (a coordinator "
                f"that has another key, or not the coordinator at all): {exc}") from exc
        except RuntimeError as exc:
            raise RetryableError(f"cannot reach the coordinator at {host}:{port}: {exc}") from exc

    def _register(self) -> None:
        """Tell the coordinator the realm and every live job (under the lock)."""
        jobs = dict(self._admitted)
        for j in (self._live_jobs() if self._live_jobs is not None else ()):
            job, uid = (j, -1) if isinstance(j, str) else j
            jobs[job] = uid if uid >= 0 else jobs.get(job, -1)
        try:
            self._store.set_realm(self._realm)
            self._store.admit(sorted(jobs.items()), final=True)
        except RuntimeError as exc:
            raise RetryableError(f"cannot register the jobs with the coordinator: {exc}") from exc
        self._admitted = jobs

    @property
    def address(self) -> str:
        """``host:port`` to put into ``MALLETRAIN_COORDINATOR``."""
        return f"{self._host}:{self._port}"

    @property
    def store(self) -> AuthClient:
        """The daemon's admin session (tests and tools; not needed for normal use)."""
        return self._store

    def job_secret(self, job_id: str, owner: int = -1) -> str:
        """Job ``job_id``'s secret, hex: hand it to that job's processes only. The
        coordinator serves it from now on, until :meth:`forget` (the job's end), and
        counts its sessions against ``owner`` (the user's uid) as well as the job."""
        secret = wire.job_secret(self._master, job_id, self._realm).hex()
        try:
            self._admit([job_id], owner)
        except (RuntimeError, RetryableError) as exc:  # the coordinator is restarting
            # the job is live in the daemon's store: admitted at the session's reconnection
            log.warning("job %s: not admitted yet (%s); at the next reconnection", job_id, exc)
        return secret

    def _admit(self, job_ids: Sequence[str], owner: int = -1) -> None:
        def run() -> None:
            new = [j for j in job_ids if j not in self._admitted
                   or (owner >= 0 and self._admitted[j] != owner)]
            if new:
                self._store.admit([(j, owner) for j in new], final=True)
                self._admitted.update(dict.fromkeys(new, owner))

        self._run(run)

    def close(self) -> None:
        """Drop the session. If this object hosts the store, the server stops."""
        with self._lock:
            self._jobs.clear()
            self._store.close()
            if self._server is not None:
                self._server.close()

    def _job(self, job_id: str) -> JobStore:
        js = self._jobs.get(job_id)
        if js is None:
            js = self._jobs[job_id] = JobStore(self._store, job_id)
        return js

    def _run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` under the lock; on a lost connection, reconnect once and run it again
        (a restarted coordinator lost its keys; the workers write their epoch again)."""
        with self._lock:
            try:
                return fn()
            except CoordinatorUnreachable as exc:
                log.warning("coordinator connection lost (%s); reconnecting", exc)
                host = "127.0.0.1" if self._server is not None else self._host
                self._store = self._dial(host, self._port, self._master, 5.0)
                self._jobs.clear()
                self._register()
                return fn()

    # ------------------------------------------------------------------ per job

    def registered(self, job_id: str) -> dict[str, MemberInfo]:
        """Members whose workers are up and waiting to join (not in the current epoch)."""
        def read() -> dict[str, MemberInfo]:
            js = self._job(job_id)
            return p.waiting_members(js.events(), js.current())
        return self._run(read)

    def live_members(self, job_id: str) -> dict[str, MemberInfo]:
        """Every registered member that has not departed since (in the job or waiting)."""
        return self._run(lambda: p.live_registrations(self._job(job_id).events()))

    def publish(self, job_id: str, members: Sequence[str]) -> int:
        """Publish the next membership epoch of ``job_id``; returns its number.

        Raises :class:`MemberUnavailable` if a member never registered or departed since.
        """
        return self._run(lambda: self._publish(self._job(job_id), list(members)))

    def _publish(self, js: JobStore, members: list[str]) -> int:
        events = js.events()
        live = p.live_registrations(events)
        departed = p.departed(events)
        current = js.current()
        # members of the current epoch are valid even without a registration in the log
        # (a restarted coordinator store: the workers re-publish their epoch first)
        sizes: dict[str, int] = {}
        if current is not None:
            sizes.update(zip(current.members, current.local_world_sizes, strict=True))
        sizes = {m: n for m, n in sizes.items() if m not in departed}
        sizes.update((m, info.local_world_size) for m, info in live.items())
        gone = [m for m in members if m not in sizes]
        if gone:
            raise MemberUnavailable(
                f"job {js.job_id}: member(s) {gone} are not registered or have departed"
            )
        while True:
            epoch = js.latest_epoch() + 1
            wanted = p.build_membership(epoch, members, sizes, "publish", time.time())
            won, _held = js.propose(wanted)
            if won:
                log.info("job %s: published epoch %d = %s", js.job_id, epoch, members)
                return epoch
            log.info("job %s: epoch %d was taken by the workers; retrying", js.job_id, epoch)

    def depart(self, job_id: str, member_id: str) -> bool:
        """Record that ``member_id`` is gone (its slot ended without it saying so: SIGKILL,
        a node lost). Workers waiting for the last group to leave stop waiting for it
        (:meth:`.statesync.StateSync._awaited_last_holders`). False if it had departed."""
        def run() -> bool:
            js = self._job(job_id)
            if member_id in p.departed(js.events()):
                return False
            js.depart(member_id, "failed", None, None)
            return True

        return self._run(run)

    def membership(self, job_id: str) -> Membership | None:
        """The newest epoch of the job (None before the first publish)."""
        return self._run(lambda: self._job(job_id).current())

    def epoch(self, job_id: str, epoch: int) -> Membership | None:
        """One specific epoch (history), None if it does not exist."""
        return self._run(lambda: self._job(job_id).membership(epoch))

    def progress(self, job_id: str) -> ProgressReport | None:
        """The newest progress report of the job (global rank 0 writes it about 1/s)."""
        return self._run(lambda: self._job(job_id).progress())

    def departures(self, job_id: str) -> list[Departure]:
        """Every departure so far, in order (``seq`` grows; keep the last one you saw)."""
        return self._run(lambda: p.departures(self._job(job_id).events()))

    def is_finished(self, job_id: str) -> bool:
        """True once the job reached its stop condition (see :meth:`result`)."""
        return self.result(job_id) is not None

    def result(self, job_id: str) -> FinishRecord | None:
        return self._run(lambda: self._job(job_id).finished())

    def read_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRead | RecordError]:
        """Every job's state at once, in two round trips (:mod:`.batchread`): the daemon's
        tick. A job whose record fails its schema gets the error instead of a view."""
        self._admit(job_ids)  # a job the daemon reads is live: its secret is served
        return self._run(lambda: read_jobs(self._store, self._job, job_ids))

    def bad_records(self, job_id: str) -> int:
        """Event records of the job skipped so far for failing their schema."""
        with self._lock:
            return self._job(job_id).bad_records

    def forget(self, job_id: str) -> None:
        """Drop all of the job's keys, its process groups' too (after its workers exited)."""
        n = self._run(lambda: self._store.forget_job(p.check_id("job id", job_id)))
        with self._lock:
            self._jobs.pop(job_id, None)
            self._admitted.pop(job_id, None)
        log.info("job %s: forgot %d keys", job_id, n)

    def held_bytes(self) -> dict[str, int]:
        """Bytes of keys the coordinator holds per job (metrics, the store-growth check)."""
        return self._run(lambda: {j: b for j, (_k, b) in self._store.jobs().items()})


def serve(host: str, port: int, master: bytes, limits: ServerLimits | None = None, *,
          open_jobs: bool = False) -> tuple[KVServer, str]:
    """Start a :class:`KVServer`; returns it and the host name it is advertised as."""
    try:
        server = KVServer(master, host, port, limits, open_jobs=open_jobs).start()
    except OSError as exc:
        raise RuntimeError(f"cannot listen on {host}:{port}: {exc}") from exc
    advertised = socket.getfqdn() if host in ("0.0.0.0", "::", "") else host
    log.info("coordinator store listening on %s:%d (%d file descriptors)", advertised,
             server.port, server.fd_limit)
    return server, advertised

"""The worker's link to the job coordinator: the ONE place a worker talks to it.

Every client of the coordinator's store a worker opens is made here: the main thread's
(rendezvous, announcements; blocking, reconnected on failure), the watcher thread's own
(:mod:`.watcher`), and a throw-away one for a last word after SIGTERM. Each is an
:class:`~.authstore.AuthStore` session that proves the job's secret.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from malletrain.elastic.protocol import keys as p
from malletrain.elastic.protocol.authstore import AuthStore
from malletrain.elastic.protocol.config import ElasticConfig
from malletrain.elastic.protocol.jobstore import JobStore
from malletrain.errors import ConfigError

log = logging.getLogger(__name__)

#: errors a store call raises when the coordinator is unreachable or restarting
STORE_ERRORS = (RuntimeError, OSError)


class CoordinatorLink:
    def __init__(self, config: ElasticConfig) -> None:
        self.config = config
        host, port_text = config.coordinator.rsplit(":", 1)
        self._host, self._port = host, int(port_text)
        self._store: AuthStore | None = None
        self._js: JobStore | None = None
        self._lock = threading.Lock()

    def _client(self, timeout_s: float) -> AuthStore:
        if not self.config.secret:
            raise ConfigError("no job secret: set MALLETRAIN_JOB_SECRET")
        return AuthStore(self._host, self._port, self.config.job_id, self.config.secret,
                         timeout_s=timeout_s, connect_timeout_s=timeout_s)

    def connect(self, first: bool) -> None:
        """The main thread's client (the first connection waits up to 30 s)."""
        try:
            store = self._client(30 if first else 2)
        except (RuntimeError, ValueError) as exc:
            if first:
                raise ConfigError(
                    f"cannot reach the coordinator MALLETRAIN_COORDINATOR="
                    f"{self.config.coordinator}: {exc}"
                ) from exc
            raise
        store.set_timeout(timedelta(seconds=max(10.0, self.config.sync_timeout_s)))
        with self._lock:
            self._store = store
            self._js = JobStore(store, self.config.job_id)

    @property
    def connected(self) -> bool:
        return self._js is not None

    @property
    def js(self) -> JobStore:
        assert self._js is not None
        return self._js

    @property
    def store(self) -> dist.Store:
        """The raw store, for the process group's rendezvous (under an epoch's prefix)."""
        assert self._store is not None
        return self._store

    def reconnect(self, exc: BaseException) -> bool:
        """A main-thread store call failed: reconnect, blocking. True if reconnected.

        Only the re-forming path gets here; it cannot proceed without the coordinator anyway.
        Steps never call the store from the main thread (see :mod:`.watcher`).
        """
        log.warning("coordinator call failed (%s); reconnecting", exc)
        try:
            self.connect(first=False)
            return True
        except (RuntimeError, ValueError, OSError) as again:
            log.warning("coordinator still unreachable: %s", again)
            time.sleep(1.0)
            return False

    def call_with_retry(self, fn: Callable[[], object], what: str, deadline_s: float) -> bool:
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                fn()
                return True
            except STORE_ERRORS as exc:
                if time.monotonic() > deadline:
                    log.error("could not send %s to the coordinator: %s", what, exc)
                    return False
                self.reconnect(exc)

    def own_client(self, timeout_s: float) -> JobStore:
        """A client of its own, for another thread (never share the main thread's)."""
        return JobStore(self._client(timeout_s), self.config.job_id)

    def member_info(self) -> p.MemberInfo:
        return p.MemberInfo(
            member_id=self.config.member_id,
            node=socket.gethostname(),
            pid=os.getpid(),
            local_world_size=self.config.local_world_size,
            registered_at_s=time.time(),
        )

    def announce(self, reason: p.DepartureReason, epoch: int | None, step: int,
                 *, own_client: bool = False) -> None:
        """Best effort: tell the coordinator this member leaves (local rank 0 only)."""
        if self.config.local_rank != 0 or (not own_client and self._js is None):
            return
        try:
            js = self.own_client(1.0) if own_client else self.js
            js.depart(self.config.member_id, reason, epoch, step)
        except (RuntimeError, ValueError, OSError) as exc:
            log.warning("could not announce departure (%s): %s", reason, exc)

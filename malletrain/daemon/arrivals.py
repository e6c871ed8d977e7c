"""Wake the daemon's loop early when a job arrives at Slurm: an event source, not a decision.

The loop ticks every ``allocator.tick_interval_s`` (5 s by default). A regular job submitted
just after a tick's snapshot is first seen up to a whole tick later, and whatever the daemon
would give back to it waits that long (e2e run 15: Slurm preempted one slot too few for a
2-node job in a burst; the daemon first saw the job 1.07 s after its submission and gave
back a node then; 1.04 s added wait). Between ticks, while the daemon holds scavenged nodes,
:class:`ArrivalProbe` asks Slurm for the ids of pending jobs (one short ``squeue`` answer,
:meth:`~malletrain.slurm.backend.SlurmBackend.pending_job_ids`) and wakes the loop when one
is not in the last snapshot. The woken tick recomputes everything from a whole snapshot
(level-triggered); the probe only moves it earlier, so a failed or odd probe costs nothing
but a probe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from malletrain.errors import UserError

log = logging.getLogger(__name__)


class ArrivalProbe:
    """Polls ``query`` every ``interval_s`` while armed; calls ``wake`` on a new pending job.

    ``interval_s`` may change while it runs (a reloaded config); 0 turns probing off.
    """

    #: how often an idle (interval 0) probe thread looks whether it was turned back on
    OFF_RECHECK_S = 1.0
    #: a probe waits at least this many times its last query's duration: on a centre's
    #: queue (50,000 jobs: ~0.3 s a query) it must not keep slurmctld busy
    BACKOFF_FACTOR = 4.0

    def __init__(self, query: Callable[[], frozenset[int]], wake: Callable[[], None],
                 interval_s: float) -> None:
        self._query = query
        self._wake = wake
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._known: frozenset[int] = frozenset()
        self._armed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: wall seconds of the last query (its pace follows slurmctld's: :meth:`wait_s`)
        self.last_query_s = 0.0

    def expect(self, known_job_ids: Iterable[int], *, armed: bool) -> None:
        """After each tick: the job ids its snapshot saw, and whether probing is worth it
        (only while the daemon holds nodes can a new job's start wait for it)."""
        with self._lock:
            self._known = frozenset(known_job_ids)
            self._armed = armed

    def probe_once(self) -> bool:
        """One probe; True if a pending job unknown to the last snapshot woke the loop."""
        with self._lock:
            if not self._armed or self.interval_s <= 0:
                return False
            known = self._known
        t0 = time.monotonic()
        try:
            pending = self._query()
        except UserError as exc:  # the next tick reports Slurm's state; wait for it
            log.debug("arrival probe failed: %s", exc)
            return False
        finally:
            self.last_query_s = time.monotonic() - t0
        new = pending - known
        if not new:
            return False
        with self._lock:
            self._known = self._known | new  # wake once per arrival, not once per probe
        log.debug("arrival probe: new pending job(s) %s, waking the loop", sorted(new))
        self._wake()
        return True

    def wait_s(self) -> float:
        """Seconds until the next probe: the interval, or more while Slurm answers slowly."""
        if self.interval_s <= 0:
            return self.OFF_RECHECK_S
        return max(self.interval_s, self.BACKOFF_FACTOR * self.last_query_s)

    def _run(self) -> None:
        while not self._stop.wait(self.wait_s()):
            try:
                self.probe_once()
            except Exception:  # never let the probe thread die silently mid-service
                log.exception("arrival probe failed unexpectedly")

    def start(self) -> ArrivalProbe:
        self._thread = threading.Thread(target=self._run, name="arrival-probe", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

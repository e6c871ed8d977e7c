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

Where slurmctld runs ``slurm/job_submit.lua`` (``slurm.submit_notice``), it rewrites a small
file at every submission, and the probe asks Slurm only when that file changed
(:class:`SubmitNotice`): the same wake-up, without two ``squeue`` calls a second on a quiet
queue. The lua hook runs before slurmctld creates the job, so a probe that finds nothing new
after a notice probes once more.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from malletrain.errors import UserError

log = logging.getLogger(__name__)


class SubmitNotice:
    """The file ``slurm/job_submit.lua`` rewrites at every submission: a wake-up hint.

    Only a change of its content matters (slurmctld's clock and a counter; its time stamps
    are too coarse for submissions a millisecond apart). It is checked at every read: a
    regular file (no link, no FIFO), not writable by group or others, so that only its owner
    (slurmctld's user, or root) can write a notice. Even a forged notice costs no more than
    polling: the probe keeps its pace (:meth:`ArrivalProbe.wait_s`).
    """

    MAX_BYTES = 64

    def __init__(self, path: Path) -> None:
        self.path = path
        self._last: bytes | None = None
        #: why the notice cannot be used now (None: usable); logged when it changes
        self.problem: str | None = "has not been read yet"

    def changed(self) -> bool | None:
        """Whether the content changed since the last call; None while unusable."""
        data = self._read()
        if data is None:
            return None
        if not data:  # slurmctld is between truncating and writing it: look again later
            return False
        changed = self._last is not None and data != self._last
        self._last = data
        return changed

    def _read(self) -> bytes | None:
        data, problem = self._checked_read()
        if problem is not None:
            if problem != self.problem:
                log.warning("submit notice %s %s: probing Slurm every arrival_probe_s "
                            "instead", self.path, problem)
            self.problem = problem
            self._last = None  # usable again, its first read only sets the baseline
            return None
        if self.problem is not None:
            log.info("submit notice %s is usable: probing Slurm only when it changes", self.path)
            self.problem = None
        return data

    def _checked_read(self) -> tuple[bytes, str | None]:
        """The content, or why the file cannot be trusted as a notice."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            return b"", f"cannot be opened ({exc.strerror})"
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return b"", "is not a regular file"
            if st.st_mode & 0o022:
                return b"", f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
            return os.read(fd, self.MAX_BYTES), None
        except OSError as exc:
            return b"", f"cannot be read ({exc.strerror})"
        finally:
            os.close(fd)


class ArrivalProbe:
    """Polls ``query`` every ``interval_s`` while armed; calls ``wake`` on a new pending job.

    ``interval_s`` may change while it runs (a reloaded config); 0 turns probing off.
    """

    #: how often an idle (interval 0) probe thread looks whether it was turned back on
    OFF_RECHECK_S = 1.0
    #: how often the submit notice is read (one small read; no Slurm call)
    NOTICE_POLL_S = 0.05
    #: probes owed to one notice: the lua hook runs before the job exists, so one probe may
    #: come too early (never seen on the dev cluster, but slurmctld allows it)
    NOTICE_PROBES = 2
    #: a probe waits at least this many times its last query's duration: on a centre's
    #: queue (50,000 jobs: ~0.3 s a query) it must not keep slurmctld busy
    BACKOFF_FACTOR = 4.0

    def __init__(self, query: Callable[[], frozenset[int]], wake: Callable[[], None],
                 interval_s: float, notice: SubmitNotice | None = None) -> None:
        self._query = query
        self._wake = wake
        self.interval_s = interval_s
        self._notice = notice
        #: probes owed to the notices seen, and when the last probe ended (monotonic)
        self._owed = 0
        self._last_probe_end = float("-inf")
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

    def turn(self) -> bool:
        """One turn of the probe's thread: a probe if one is due; True if it woke the loop.

        Without a usable notice every turn probes (the thread waits :meth:`wait_s`); with
        one, a turn probes only while a notice is owed probes and the pace allows."""
        if self._notice is None:
            return self.probe_once()
        changed = self._notice.changed()
        if changed:
            self._owed = self.NOTICE_PROBES
        due = (changed is None or self._owed > 0) and (
            time.monotonic() >= self._last_probe_end + self.wait_s())
        if not due:
            return False
        woke = self.probe_once()
        self._last_probe_end = time.monotonic()
        self._owed = 0 if woke else max(0, self._owed - 1)
        return woke

    def _turn_wait_s(self) -> float:
        if self._notice is None or self.interval_s <= 0:
            return self.wait_s()
        return self.NOTICE_POLL_S

    def _run(self) -> None:
        while not self._stop.wait(self._turn_wait_s()):
            try:
                self.turn()
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

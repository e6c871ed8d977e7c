"""The daemon's periodic Slurm answers, read again off the tick.

Why: the nodes' whole records (``sinfo --json``, ~5 MB at 5,000 nodes) are read every
60 s, the partitions, reservations and topology every 15-300 s (``versions.PERIODIC_S``).
Read on the tick that found them due, they made that tick the slowest of the minute
(``benchmarks/load.py``: the tick p99 was the one that read and parsed the records). Once
the daemon has an answer of each, a due one is read on a thread of its own while the
ticks go on with the answer they have, and parsed there too (which warms the parse memo
the ticks use: ``parse.check_periodic``). An answer is kept only once it parsed: an odd
one (slurmctld restarting, a broken wrapper) is asked again when a tick finds it still due,
never reused for its period. One read at a time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger(__name__)

#: ``fetch(commands)``: each command's output, by key (raises when a call failed)
Fetch = Callable[[Mapping[str, Sequence[str]]], dict[str, str]]
#: ``check(texts)``: every periodic answer, by key; raises on one that does not parse
Check = Callable[[Mapping[str, str]], None]


class BackgroundRefresh:
    """Reads due periodic answers on a thread; :meth:`take` hands over those that parsed."""

    def __init__(self, fetch: Fetch, check: Check, clock: Callable[[], float]) -> None:
        self._fetch = fetch
        self._check = check
        self._clock = clock
        self._lock = threading.Lock()
        self._running: threading.Thread | None = None
        self._done: dict[str, tuple[float, str]] = {}
        #: the last read's error (None after one that parsed), for tests and logs
        self.last_error: Exception | None = None

    def start(self, commands: Mapping[str, Sequence[str]], kept: Mapping[str, str]) -> bool:
        """Read ``commands`` on a thread, unless a read runs already; ``kept`` is every
        periodic answer the ticks use now (the new ones are checked beside them)."""
        with self._lock:
            if self._running is not None:
                return False
            self._running = threading.Thread(
                target=self._read, args=(dict(commands), dict(kept)), daemon=True,
                name="slurm-periodic")
            self._running.start()
            return True

    def take(self) -> dict[str, tuple[float, str]]:
        """The answers read and parsed since the last call: key -> (read at, text)."""
        with self._lock:
            done, self._done = self._done, {}
            return done

    def wait(self, timeout_s: float | None = None) -> None:
        """Until the read in progress, if any, has ended (tests; the daemon never waits)."""
        with self._lock:
            thread = self._running
        if thread is not None:
            thread.join(timeout_s)

    def _read(self, commands: dict[str, Sequence[str]], kept: dict[str, str]) -> None:
        try:
            read_at = self._clock()
            fresh = self._fetch(commands)
            self._check({**kept, **fresh})
            with self._lock:
                self._done.update({k: (read_at, text) for k, text in fresh.items()})
            self.last_error = None
        except Exception as exc:  # asked again when a tick finds it still due
            self.last_error = exc
            log.info("periodic Slurm read (%s) failed, asked again next tick: %s",
                     ", ".join(commands), exc)
        finally:
            with self._lock:
                self._running = None

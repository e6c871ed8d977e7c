"""The cyclic garbage collector of a long-running loop: between ticks, over what is new.

Why: the daemon keeps a large heap from one tick to the next (the store's records, the
parse memos, the last snapshot, the profiles), and CPython's collector walks all of it
again and again while finding next to nothing, since the heap is freed by reference
counting. Measured on ``benchmarks/load.py`` (5,000 nodes, 500 jobs; ``gc.callbacks`` in
the daemon, the process's CPU time of each pass): in 125 s, 566 young, 51 middle and 5 full
passes took 0.75 s of CPU, 0.6 % of a core and 7 % of the daemon's; a full pass took
44-62 ms, inside a tick or a submit request; and they freed nothing.

So after each tick everything alive is put out of the collector's sight (``gc.freeze``,
which moves the generations aside in constant time), and the young generation is collected
after ``YOUNG_THRESHOLD`` new containers rather than 700: a tick makes tens of thousands,
among them the snapshot's large tuples and dicts, which every young pass walked again
(with the freeze alone, timed beside a soak, the young and middle passes still took 60 %
of the wall time they had taken). With both, a steady load run made no pass at all between
its start-up and its end. Once every ``full_every_s``, between ticks, the frozen objects
are given back and the whole heap is collected once, so a cycle that became garbage after
it was frozen is freed within that time.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: how long a cycle that became garbage after a freeze may wait for a full collection
FULL_EVERY_S = 600.0
#: new containers (less those freed) between two young passes; CPython's default is 700
YOUNG_THRESHOLD = 50_000


class BetweenTicks:
    """Call :meth:`after_tick` at the end of each tick (and once after start-up)."""

    def __init__(self, full_every_s: float = FULL_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.full_every_s = full_every_s
        self._clock = clock
        self._thresholds = gc.get_threshold()
        gc.set_threshold(YOUNG_THRESHOLD, *self._thresholds[1:])
        self._last_full_s = clock()
        #: full collections made, and the objects the last one freed (logs, tests)
        self.full_collections = 0
        self.last_freed = 0

    def after_tick(self, failed: bool = False) -> None:
        """``failed``: the tick raised. Its frames are then often in a cycle with the error
        (a frame that kept it), holding whatever they held, a whole snapshot perhaps: what
        the tick made is collected before the freeze (the frozen heap is not scanned)."""
        now = self._clock()
        if now - self._last_full_s >= self.full_every_s:
            gc.unfreeze()
            self.last_freed = gc.collect()
            self.full_collections += 1
            self._last_full_s = now
            log.debug("full collection: %d objects freed", self.last_freed)
        elif failed:
            gc.collect()
        gc.freeze()

    def close(self) -> None:
        """Give the frozen objects back to the collector and its thresholds back (a
        stopping loop, tests)."""
        gc.unfreeze()
        gc.set_threshold(*self._thresholds)

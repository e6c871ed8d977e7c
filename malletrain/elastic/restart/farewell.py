"""A preempted node agent's last words, sent while its tasks are being stopped.

On Slurm's SIGTERM a regular job waits for the node: every millisecond from the signal to the
slot's end is that job's. The agent used to announce its departure first (on its one
coordinator connection, retried up to 10 s) and only then stop its tasks, so a slow
coordinator (a 2-core node shared by 12 training processes) held the node for it. Now the
tasks are signalled at once, and the words go out meanwhile from a thread of their own, on a
client of their own (the agent's connection is never used from two threads):

1. the departure (``sigterm``): the daemon re-forms the other nodes without this one;
2. once the tasks are gone (:meth:`Farewell.stopped`), this node's ``<epoch>:stop`` record
   (:mod:`.handover`): the other nodes start the next generation only after it, so that they
   read the checkpoint the stopped one wrote.

The agent waits for them at most :data:`WORDS_AFTER_STOP_S` after its tasks are gone, then
exits whatever the coordinator does (the thread is a daemon thread; ``os._exit`` ends it).
Words not sent cost goodput, never the regular job: the daemon sees the slot end in Slurm
(a departure it records itself), and the others wait for the missing ``stop`` at most their
handover bound.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from malletrain.elastic.protocol.jobstore import JobStore
from malletrain.elastic.protocol.link import STORE_ERRORS
from malletrain.elastic.restart import handover

log = logging.getLogger(__name__)

#: after the tasks are gone, how long the exit waits for the words still on their way; a
#: coordinator that answers at all answers within this on the shared dev machine
WORDS_AFTER_STOP_S = 0.3
#: the words' own client: connect and call timeout (the thread is abandoned at the exit)
CLIENT_TIMEOUT_S = 1.0


class Farewell:
    """The departure, then the stop record, sent from a thread; the main thread only
    starts it, says when the tasks are gone and waits a bounded time for it."""

    def __init__(self, open_client: Callable[[float], JobStore], member_id: str,
                 epoch: int | None) -> None:
        self._open = open_client
        self.member_id = member_id
        self.epoch = epoch
        self._tasks_gone = threading.Event()
        self._thread = threading.Thread(target=self._send, name="farewell", daemon=True)
        self.departed_s: float | None = None  # monotonic time the departure was sent
        self.recorded_s: float | None = None  # monotonic time the stop record was sent

    def start(self) -> Farewell:
        self._thread.start()
        return self

    def stopped(self) -> None:
        """The node's tasks are gone: the stop record may go out."""
        self._tasks_gone.set()

    def wait(self, timeout_s: float = WORDS_AFTER_STOP_S) -> bool:
        """Wait at most ``timeout_s`` for the words; True if all went out."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive() and self.departed_s is not None and (
            self.epoch is None or self.recorded_s is not None)

    def _send(self) -> None:
        try:
            js = self._open(CLIENT_TIMEOUT_S)
            js.depart(self.member_id, "sigterm", self.epoch, 0)
            self.departed_s = time.monotonic()
            if self.epoch is None:
                return
            self._tasks_gone.wait()
            handover.record(js, self.member_id, self.epoch, "stop")
            self.recorded_s = time.monotonic()
        except (*STORE_ERRORS, ValueError) as exc:
            log.warning("could not send the departure or stop record: %s", exc)

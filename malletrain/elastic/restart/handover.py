"""One generation after another: a node starts the next one only once the last has stopped.

A restart-mode script resumes from its own checkpoint, which the stopping generation may
still be writing in its ``--signal`` grace (``USR1@60``). A node that starts the next
generation before every other node of the last one has stopped reads an older checkpoint
(and redoes the steps since), or a half-written one; its old and new generations may even
write the checkpoint at the same time. Each agent therefore records, under
``gen/<member>``, which generation runs on its node (``<epoch>:run``) and when it has
stopped (``<epoch>:stop``), and waits for the others before it starts.

A member whose slot ended without a word (SIGKILL, a node lost: the daemon records its
departure as ``failed``) runs nothing any more, nor does one whose batch shell failed (its
agent departs ``crashed`` once what the shell started has ended there, and records its stop
first); an agent that died before writing its stop is waited for up to the bound the caller
gives (the stop grace and the kill stages).

A preempted node's last words (:class:`Farewell`), sent while its tasks are being stopped.
On Slurm's SIGTERM a regular job waits for the node: every millisecond from the signal to the
slot's end is that job's. Announcing the departure first, on the agent's one connection
with retries up to 10 s, would let a slow coordinator hold the node (it took 30-85 ms before
the stop on the loaded dev machine). So the tasks are signalled at once, and the words go
out meanwhile from a thread of their own, on a client of their own (the agent's connection
is never used from two threads):

1. the departure (``sigterm``): the daemon re-forms the other nodes without this one;
2. once the tasks are gone (:meth:`Farewell.stopped`), this node's ``<epoch>:stop`` record
   (above): the other nodes start the next generation only after it, so that they
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

from malletrain.elastic.protocol import keys as p
from malletrain.elastic.protocol.jobstore import JobStore

log = logging.getLogger(__name__)


def generation_key(js: JobStore, member_id: str) -> str:
    return f"{js.keys.root}gen/{member_id}"


def record(js: JobStore, member_id: str, epoch: int, state: str) -> None:
    """This node's generation ``epoch`` is running (``run``) or has stopped (``stop``)."""
    js.store.set(generation_key(js, member_id), f"{epoch}:{state}")


def running_before(raw: bytes | None, epoch: int) -> bool:
    """Whether a ``gen/`` value says a generation older than ``epoch`` is still running."""
    if raw is None:
        return False
    text = raw.decode("ascii", "replace")
    e, _, state = text.partition(":")
    return state == "run" and e.isdigit() and int(e) < epoch


def still_running(js: JobStore, m: p.Membership, me: str) -> list[str]:
    """The other members of the last generation whose part of it has not stopped yet."""
    others = [x for x in p.previous_members(js.membership, m) if x != me]
    if not others:
        return []
    events = js.events()
    gone = p.departed(events, "failed") | p.departed(events, "crashed")
    busy = []
    for x in others:
        if x in gone:
            continue
        if running_before(js.get_if_set(generation_key(js, x)), m.epoch):
            busy.append(x)
    return busy


def wait_for_last_generation(js: JobStore, m: p.Membership, me: str, timeout_s: float,
                             poll_s: float, cut_short: Callable[[], bool]) -> list[str]:
    """Wait until every other node of the last generation has stopped, at most
    ``timeout_s`` (or until ``cut_short()``); returns those still running."""
    deadline = time.monotonic() + timeout_s
    t0 = time.monotonic()
    busy = still_running(js, m, me)
    while busy and time.monotonic() < deadline and not cut_short():
        time.sleep(poll_s)
        busy = still_running(js, m, me)
    waited = time.monotonic() - t0
    if busy:
        log.warning("epoch %d: %s still running the last generation after %.1f s; "
                    "starting anyway", m.epoch, busy, waited)
    elif waited > poll_s:
        log.info("epoch %d: waited %.1f s for the last generation to stop", m.epoch, waited)
    return busy

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
            record(js, self.member_id, self.epoch, "stop")
            self.recorded_s = time.monotonic()
        except (RuntimeError, OSError, ValueError) as exc:  # link.STORE_ERRORS, a bad secret
            log.warning("could not send the departure or stop record: %s", exc)

"""One generation after another: a node starts the next one only once the last has stopped.

A restart-mode script resumes from its own checkpoint, which the stopping generation may
still be writing in its ``--signal`` grace (``USR1@60``). A node that starts the next
generation before every other node of the last one has stopped reads an older checkpoint
(and redoes the steps since), or a half-written one; its old and new generations may even
write the checkpoint at the same time. Each agent therefore records, under
``gen/<member>``, which generation runs on its node (``<epoch>:run``) and when it has
stopped (``<epoch>:stop``), and waits for the others before it starts.

A member whose slot ended without a word (SIGKILL, a node lost: the daemon records its
departure as ``failed``) runs nothing any more; an agent that died before writing its stop
is waited for up to the bound the caller gives (the stop grace and the kill stages).
"""

from __future__ import annotations

import logging
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
    gone = p.departed(js.events(), "failed")
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

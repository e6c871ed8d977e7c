"""SIGTERM in a worker: a flag for the next step boundary, a hard deadline, a fast exit.

Slurm preempts a slot with SIGTERM and kills it after its GraceTime: the worker must leave
at a step boundary (so the survivors lose nothing) and be gone before the grace ends, even
when its main thread is stuck in a collective or the interpreter hangs at exit.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from malletrain.elastic.worker import watchdog

log = logging.getLogger(__name__)


class SigtermWatch:
    """SIGTERM sets :attr:`at` (acted on at the next step boundary), plus a hard deadline.

    The Python-level handler runs only when the main thread returns to the interpreter,
    which a blocked collective may not do for ``step_timeout_s``. The wakeup fd is written
    by the C-level handler at once, so a helper thread starts the deadline immediately.
    After ``deadline_s`` the process is forced out (``os._exit``) whatever it does, having
    called ``last_word`` (the departure announcement) if the step loop had not ended. And
    if even that thread cannot run (C code holding the GIL), the watchdog process
    (:mod:`.watchdog`) sends SIGKILL a second later.
    """

    def __init__(self, deadline_s: float, last_word: Callable[[], None]) -> None:
        self.deadline_s = deadline_s
        self.last_word = last_word
        #: monotonic time of the first SIGTERM (None: none yet)
        self.at: float | None = None
        #: set when the step loop has ended
        self.exited = threading.Event()

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("ElasticJob not on the main thread: SIGTERM handling disabled")
            return
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        # the watchdog process reads the wakeup pipe (it needs no GIL of ours) and passes
        # the bytes on to the thread below through a second pipe
        fwd_read, fwd_write = os.pipe()
        if watchdog.start(read_fd, fwd_write, self.deadline_s):
            os.close(read_fd)
            read_fd = fwd_read
        else:
            os.close(fwd_read)
        os.close(fwd_write)

        def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
            if self.at is None:
                self.at = time.monotonic()

        signal.signal(signal.SIGTERM, _on_sigterm)
        threading.Thread(target=self._watch, args=(read_fd,), daemon=True).start()

    def _watch(self, read_fd: int) -> None:
        while True:
            data = os.read(read_fd, 64)
            if not data:
                return
            if signal.SIGTERM in data:
                break
        if self.at is None:
            self.at = time.monotonic()
        # Kernel-level backstop: if even the forced exit below cannot run (the interpreter
        # is finalizing, daemon threads are frozen), SIGALRM's default action ends us.
        signal.alarm(math.ceil(self.deadline_s) + 1)
        deadline = self.at + self.deadline_s
        if not self.exited.wait(max(0.0, deadline - time.monotonic())):
            log.error("still training %.1f s after SIGTERM; forcing exit", self.deadline_s)
            self.last_word()
        else:
            # The loop has ended; the script may still finish up, but the process must be
            # gone before Slurm's GraceTime whatever happens at interpreter shutdown.
            time.sleep(max(0.0, deadline - time.monotonic()))
            log.error("process still alive %.1f s after SIGTERM; forcing exit", self.deadline_s)
        os._exit(0)


def exit_now() -> None:
    """Leave at interpreter exit without running C++ static destructors.

    Registered after a SIGTERM / eviction / planned (``removed``) leave, when the node must
    be given back at once: in torch 2.13 the exit of such a worker hung in
    ``TorchLibraryInit::~TorchLibraryInit`` (a dispatcher table walk that never ended) in 3 of
    5 runs of the eviction test, after the Python code had finished; and even when it ends,
    a normal interpreter exit after a gloo group took 1.4-2.6 s on the shared 2-core machine
    (a removed member's slot ended 2.5 s after its last log line in the e2e benchmark, while
    the regular job waiting for that node sat pending). Being registered late, this runs
    before torch's own atexit handlers: the script's code after the step loop still runs,
    ``atexit`` hooks registered before the leave do not; stdio and logging are flushed
    first. The exit status is 0, as for any leave the runtime asked for.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)

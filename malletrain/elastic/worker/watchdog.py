"""The SIGTERM deadline kept by a second process: a worker ends in time whatever it does.

Why a process: Python runs signal handlers, and any other thread, only when it can take the
GIL. A worker whose main thread is stuck in C code that holds it (measured on an H100: the
DDP/NCCL teardown after a peer stalled; reproduced on CPU by a ``ctypes.PyDLL`` call) never
runs its handler nor the deadline thread, so it ignored SIGTERM until SIGKILL, and kept the
node from the regular job Slurm was preempting for. The C-level signal handler still writes
the signal number to the wakeup fd (``signal.set_wakeup_fd``), without the GIL; this tiny
process (``python -I -S``, no torch, a few MB) reads that pipe, passes each byte on to the
worker's own deadline thread (:class:`~.signals.SigtermWatch`, which announces the departure
and exits cleanly when it can run), and after ``deadline_s`` + :data:`MARGIN_S` sends the
worker SIGKILL. It ends by itself when the worker is gone (the pipe reads end-of-file).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

log = logging.getLogger(__name__)

#: after the worker's own forced exit should have happened
MARGIN_S = 1.0

_CODE = """\
import os, signal, sys, time
wake, forward, worker, deadline_s = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                     float(sys.argv[4]))
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # Slurm signals the whole step: act on the pipe
signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    data = os.read(wake, 64)
    if not data:
        sys.exit(0)
    try:
        os.write(forward, data)
    except OSError:
        pass
    if signal.SIGTERM in data:
        break
end = time.monotonic() + deadline_s
while time.monotonic() < end:
    time.sleep(0.05)
    if os.getppid() != worker:
        sys.exit(0)
try:
    os.kill(worker, signal.SIGKILL)
except OSError:
    pass
"""


def start(wake_read_fd: int, forward_write_fd: int, deadline_s: float) -> bool:
    """Start the watchdog on the read end of the wakeup pipe; False if it could not start
    (the caller then reads the pipe itself, as before)."""
    argv = [sys.executable, "-I", "-S", "-c", _CODE, str(wake_read_fd), str(forward_write_fd),
            str(os.getpid()), str(deadline_s + MARGIN_S)]
    try:
        subprocess.Popen(argv, pass_fds=(wake_read_fd, forward_write_fd),
                         stdin=subprocess.DEVNULL, start_new_session=False)
    except OSError as exc:
        log.warning("SIGTERM watchdog not started (%s): a worker stuck in C code may "
                    "outlive its SIGTERM deadline", exc)
        return False
    return True

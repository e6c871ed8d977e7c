"""Every process a generation started, found and ended: the node agent's process tree.

A launch is a tree: the batch shell, torchrun's agent, its workers, their data loaders. Not
all of it stays in one process group (torchrun dies on a signal it does not handle and
leaves its workers running; a script may ``setsid``), so the agent makes itself a *child
subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``, as systemd and tini do): whatever the
generation starts stays a descendant of the agent, orphans included, and is found by a walk
of the agent's children. That is how Slurm's step containment behaves too: nothing of a
stopped generation outlives it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import time
from collections.abc import Callable

import psutil

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux). False where the kernel or libc refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants() -> list[psutil.Process]:
    """The live processes below this one (zombies left out)."""
    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def reap_orphans(keep: int | None) -> None:
    """Collect adopted children that exited (never ``keep``, whose status a Popen waits
    for): a subreaper that does not reap fills the process table with zombies."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == keep:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)


def signal_all(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)


def wait_gone(deadline_s: float, keep: int | None,
              cut_short: Callable[[], bool] = lambda: False) -> bool:
    """Wait until no descendant is alive (reaping as it goes); True if none is left.
    ``cut_short()`` ends the wait early (Slurm's SIGTERM during a graceful stop)."""
    end = time.monotonic() + deadline_s
    while True:
        reap_orphans(keep)
        if not descendants():
            return True
        if time.monotonic() >= end or cut_short():
            return False
        time.sleep(0.05)

"""SIGTERM is honoured within the deadline even when the worker's main thread is stuck in C
code that holds the GIL (issue 17, item 2: a stalled NCCL peer hung the survivor's DDP
teardown and the process ignored SIGTERM; here the stuck C call is a ``ctypes.PyDLL`` one,
which keeps the GIL as such a teardown does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
from elastic_harness import REPO

STUCK = """
import ctypes, os, sys
from malletrain.elastic.worker.signals import SigtermWatch
w = SigtermWatch(2.0, last_word=lambda: print("last word", flush=True))
w.install()
print("ready", *[c.pid for c in __import__("psutil").Process().children()], flush=True)
if sys.argv[1] == "stuck":
    # C code holding the GIL that a signal does not interrupt (as a spinning NCCL teardown):
    # SIGTERM is blocked in this thread, so the kernel hands it to another thread, whose
    # Python code cannot run without the GIL
    import signal
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    ctypes.PyDLL(None).sleep(60)
print("exiting on its own", flush=True)
"""


def _start(mode: str) -> tuple[subprocess.Popen, list[int]]:
    p = subprocess.Popen([sys.executable, "-c", STUCK, mode], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.stdout is not None
    words = p.stdout.readline().split()
    assert words[0] == "ready", words
    return p, [int(w) for w in words[1:]]


def test_a_worker_stuck_in_c_holding_the_gil_is_ended_within_the_deadline():
    p, watchdogs = _start("stuck")
    assert len(watchdogs) == 1
    time.sleep(0.3)  # inside the C call
    t = time.monotonic()
    p.send_signal(signal.SIGTERM)
    rc = p.wait(20)
    elapsed = time.monotonic() - t
    # deadline 2 s + the watchdog's 1 s margin; without the watchdog this took 60 s
    assert rc == -signal.SIGKILL and elapsed < 4.5, (rc, elapsed)


def test_the_watchdog_leaves_with_a_worker_that_ends_normally():
    p, watchdogs = _start("free")
    assert p.wait(20) == 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(psutil.pid_exists(w) and
                                              psutil.Process(w).status() != "zombie"
                                              for w in watchdogs):
        time.sleep(0.1)
    assert not any(psutil.pid_exists(w) and psutil.Process(w).status() != "zombie"
                   for w in watchdogs)

"""The tick's Slurm read on a thread of its own (daemon/background.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from malletrain.daemon.act.background import Background


def test_the_result_or_the_error_comes_back_to_the_caller():
    started = threading.Event()

    def slow() -> int:
        started.set()
        time.sleep(0.1)
        return 7

    call = Background(slow, "slurm-read")
    assert started.wait(5)  # runs while the caller does its own part
    assert call.result() == 7

    def broken() -> int:
        raise TimeoutError("sinfo: no answer within 20 s")

    with pytest.raises(TimeoutError, match="no answer"):
        Background(broken, "slurm-read").result()


def test_a_read_in_flight_does_not_hold_the_process_at_exit():
    """A slurmctld that does not answer must not delay the daemon's stop by the backend's
    timeout: the process exits while the read still waits."""
    code = ("import time\nfrom malletrain.daemon.act.background import Background\n"
            "Background(lambda: time.sleep(60), 'slurm-read')\nprint('leaving')\n")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, check=True)
    assert out.stdout.strip() == "leaving" and time.monotonic() - t0 < 10


def test_wait_ends_with_the_call_and_keeps_its_error_for_result():
    gate = threading.Event()

    def blocked() -> int:
        gate.wait(5)
        raise OSError("sinfo: could not run")

    call = Background(blocked, "slurm-read")
    threading.Timer(0.1, gate.set).start()
    t0 = time.monotonic()
    call.wait()  # no error here: the tick's own failure is what propagates
    assert 0.05 < time.monotonic() - t0 < 5
    with pytest.raises(OSError, match="could not run"):
        call.result()

"""A preempted node's stop (:mod:`malletrain.elastic.restart.stopping`), on real processes:
SIGKILL comes ``PREEMPT_KILL_AFTER_S`` after Slurm's SIGTERM, on the clock (a process that
ignores SIGTERM gets that long, and no more), however long the agent took to notice."""

from __future__ import annotations

import subprocess
import sys
import time

from malletrain.elastic.restart.stopping import PREEMPT_KILL_AFTER_S, PREEMPTED, NodeStopper

_STUBBORN = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "print('ready', flush=True); time.sleep(60)")


def _stubborn() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", _STUBBORN], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def _kill_at(stages: list[str]) -> float:
    return next(float(s.split("+")[1]) for s in stages if s.startswith("SIGKILL"))


def test_sigkill_follows_slurms_sigterm_on_the_clock(tmp_path):
    stopper = NodeStopper(tmp_path, tmp_path / "srun", lambda: True)
    proc = _stubborn()
    took_s = stopper.stop(proc, 1, PREEMPTED, slurm_term_age_s=0.0)
    assert proc.poll() is not None  # killed: it would have slept 60 s
    assert _kill_at(stopper.stages) >= PREEMPT_KILL_AFTER_S - 0.01  # its 0.1 s to exit
    assert took_s < 2.0, stopper.stages

    proc = _stubborn()
    t0 = time.monotonic()
    stopper.stop(proc, 2, PREEMPTED, slurm_term_age_s=PREEMPT_KILL_AFTER_S)  # noticed late
    assert proc.poll() is not None
    # Slurm's SIGTERM is already 0.1 s old: SIGKILL without waiting another 0.1 s
    assert _kill_at(stopper.stages) < PREEMPT_KILL_AFTER_S, stopper.stages
    assert time.monotonic() - t0 < 2.0

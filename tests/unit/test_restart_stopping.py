"""A preempted node's stop (:mod:`malletrain.elastic.restart.stopping`), on real processes:
SIGKILL comes ``PREEMPT_KILL_AFTER_S`` after Slurm's SIGTERM, on the clock (a process that
ignores SIGTERM gets that long, and no more), however long the agent took to notice."""

from __future__ import annotations

import subprocess
import sys
import time

from malletrain.elastic.restart import stopping
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


_CLIENT = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "print('ready', flush=True); time.sleep(float(sys.argv[1])); "
           "open(sys.argv[2], 'w').write('ended by itself')")


def _client(shim, marker, after_s: float) -> subprocess.Popen[bytes]:
    """Stands for the batch shell's ``srun``: it ends once its step's tasks have (here:
    ``after_s``); the shim's path is on its command line, as the agent finds it."""
    proc = subprocess.Popen([sys.executable, "-c", _CLIENT, str(after_s), str(marker),
                             str(shim)], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def test_a_preemption_spares_the_step_clients_until_their_steps_end(tmp_path, monkeypatch):
    monkeypatch.setattr(stopping, "STEP_CLIENTS_S", 0.6)
    stopper = NodeStopper(tmp_path, tmp_path / "srun", lambda: True)
    task = _stubborn()
    client = _client(tmp_path / "srun", tmp_path / "client-1", 0.4)
    stopper.stop(task, 1, PREEMPTED, slurm_term_age_s=0.0)
    assert task.poll() is not None and client.poll() is not None
    assert (tmp_path / "client-1").read_text() == "ended by itself"  # not SIGKILLed

    hung = _client(tmp_path / "srun", tmp_path / "client-2", 30.0)  # its step never ends
    t0 = time.monotonic()
    took_s = stopper.stop(None, 2, PREEMPTED, slurm_term_age_s=0.0)
    assert hung.poll() is not None and not (tmp_path / "client-2").exists()
    assert 0.5 < took_s < 3.0 and time.monotonic() - t0 < 3.0, stopper.stages
    assert any(s.startswith("clients SIGKILL") for s in stopper.stages), stopper.stages

    # a stop without Slurm's signal (the job finished elsewhere) spares nothing
    client = _client(tmp_path / "srun", tmp_path / "client-3", 30.0)
    stopper.stop(None, 3, PREEMPTED)
    assert client.poll() is not None and not (tmp_path / "client-3").exists()

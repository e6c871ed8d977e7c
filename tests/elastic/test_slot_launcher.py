"""The slot's torchrun agent, as rendered by the daemon, is gone as soon as its workers are.

Slurm's preemption SIGTERM reaches every process of the slot's step (proctrack/linuxproc);
the node is free only when the step's task, the agent, has exited. Plain
``python -m torch.distributed.run`` took 2.3 s after the SIGTERM here (traceback, then a
normal interpreter exit with torch imported) while its workers had left in 0.05 s.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from malletrain.daemon.jobs.slots import render_slot
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.elastic.coordinator.handle import Coordinator

SECRET = "ab" * 32

pytestmark = pytest.mark.torch

WORKER = """\
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
# one write (< PIPE_BUF, so atomic): the two workers share the agent's stdout, and print()
# may write the words separately (a run saw "upup 0 2", then " 1 2")
os.write(1, f"up {os.environ['LOCAL_RANK']} {os.environ['LOCAL_WORLD_SIZE']}\\n".encode())
if sys.argv[1] == "wait":
    time.sleep(120)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def coord():
    """The job's coordinator: the agent's rendezvous goes through it (torchrun_rdzv)."""
    c = Coordinator.start("127.0.0.1", 0)
    yield c
    c.close()


def _agent_argv(tmp_path: Path, *args: str) -> list[str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    spec = JobSpec(script=str(script), args=args, name="t", min_nodes=1, max_nodes=1,
                   nproc_per_node=2, python=sys.executable, kind="worker.py")
    spec = dataclasses.replace(spec, launcher="torchrun")
    text = render_slot(spec, "m1", 0, coordinator="c:1", secret=SECRET,
                       state_dir=str(tmp_path),
                       partition="scavenger").script
    argv = json.loads(text.split("argv = ", 1)[1].split("\n", 1)[0])
    assert argv[:4] == ["srun", "--nodes=1", "--ntasks=1", "--kill-on-bad-exit=1"]
    return argv[4:]  # what srun starts as the step's one task


def _env(coord: Coordinator) -> dict[str, str]:
    """What the slot's script puts in the environment before it runs the argv."""
    return dict(os.environ, MALLETRAIN_COORDINATOR=coord.address, MALLETRAIN_JOB_ID="m1",
                MALLETRAIN_JOB_SECRET=coord.job_secret("m1"))


def test_torchrun_agent_exits_right_after_sigterm(tmp_path, coord):
    proc = subprocess.Popen(_agent_argv(tmp_path, "wait"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=_env(coord))
    try:
        up = set()
        seen: list[str] = []
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while len(up) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:  # the agent exited before both workers were up: say why
                break
            seen.append(line)
            if line.startswith("up "):
                up.add(tuple(line.split()[1:]))
        assert up == {("0", "2"), ("1", "2")}, (
            f"agent exit {proc.poll()}, output:\n{''.join(seen)[-3000:]}")
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)  # like slurmstepd: every process of the step
        rc = proc.wait(30)
        exit_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 128 + signal.SIGTERM
    assert exit_s < 1.0, f"agent alive {exit_s:.2f} s after SIGTERM"


@pytest.mark.parametrize(("code", "expect"), [("0", 0), ("3", 1)])
def test_torchrun_agent_keeps_torchrun_exit_status(tmp_path, code, expect, coord):
    res = subprocess.run(_agent_argv(tmp_path, code), capture_output=True, text=True,
                         timeout=120, check=False, env=_env(coord))
    assert res.returncode == expect, res.stderr[-2000:]

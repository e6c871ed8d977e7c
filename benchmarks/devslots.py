"""Restart-mode node agents in real node slots, for the benchmarks that need them.

A restart-mode job's batch shell places its steps in the node slots through Slurm's own
``srun`` (malletrain/elastic/restart/srun.py), so its agents must run as slots do: each a
single-node Slurm job whose step is the agent. :func:`cluster` starts a dev cluster of its
own (slurm/dev-cluster, in a temporary directory, torn down at the end), :class:`Slot`
submits one agent there, as the daemon's slot would run it.
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEV_CLUSTER = REPO / "slurm" / "dev-cluster"
_ENDED = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "")


def free_port_base(count: int = 16) -> int:
    """A port base whose range is free now (the shared test cluster picks its own)."""
    for base in random.Random().sample(range(40000, 60000, 100), 50):
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise SystemExit("no free port range for a dev cluster")


@contextlib.contextmanager
def cluster(nodes: int) -> Iterator[dict[str, str]]:
    """A dev cluster of ``nodes`` nodes; yields the environment its clients need."""
    base = Path(tempfile.mkdtemp(prefix="mt-bench-cluster-", dir="/tmp"))
    base.chmod(0o755)
    env = dict(os.environ, MALLETRAIN_DEVCLUSTER_DIR=str(base / "c"),
               MALLETRAIN_DEVCLUSTER_PORT=str(free_port_base()))
    subprocess.run([str(DEV_CLUSTER), "up", "--nodes", str(nodes), "--users", ""], env=env,
                   check=True, capture_output=True, timeout=600)
    env["SLURM_CONF"] = str(base / "c" / "etc" / "slurm.conf")
    try:
        yield env
    finally:
        subprocess.run([str(DEV_CLUSTER), "down"], env=env, capture_output=True, timeout=120)
        subprocess.run(["rm", "-rf", str(base)], check=False)


class Slot:
    """One node slot running a restart-mode agent (``agent_args``) on node ``node``."""

    def __init__(self, env: dict[str, str], node: str, member: str, *, coordinator: str,
                 job: str, secret: str, script: Path, agent_args: list[str], log: Path
                 ) -> None:
        self.env = env
        exports = {"PYTHONPATH": str(REPO), "MALLETRAIN_COORDINATOR": coordinator,
                   "MALLETRAIN_JOB_ID": job, "MALLETRAIN_JOB_SECRET": secret,
                   "MALLETRAIN_MEMBER_ID": member, "OMP_NUM_THREADS": "1",
                   "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
        text = "#!/bin/bash\n" + "".join(f"export {k}={shlex.quote(v)}\n"
                                         for k, v in exports.items())
        text += f'export MALLETRAIN_SCRIPT_TEXT="$(cat {shlex.quote(str(script))})"\n'
        agent = [sys.executable, "-m", "malletrain.elastic.restart.agent", *agent_args]
        text += ("exec srun --nodes=1 --ntasks=1 --kill-on-bad-exit=1 "
                 + " ".join(shlex.quote(a) for a in agent) + "\n")
        res = subprocess.run(["sbatch", "--parsable", f"--nodelist={node}", "--exclusive",
                              f"--output={log}", f"--chdir={script.parent}"], input=text,
                             env=env, capture_output=True, text=True, check=True, timeout=60)
        self.job_id = int(res.stdout.strip().split(";")[0])

    def state(self) -> str:
        res = subprocess.run(["squeue", "-h", "-j", str(self.job_id), "-o", "%T"],
                             env=self.env, capture_output=True, text=True, timeout=30)
        return res.stdout.strip()

    def wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.state() in _ENDED:
                return
            time.sleep(0.2)
        raise SystemExit(f"slot job {self.job_id} did not end within {timeout_s} s")

    def terminate(self) -> None:
        subprocess.run(["scancel", str(self.job_id)], env=self.env, capture_output=True,
                       timeout=30)

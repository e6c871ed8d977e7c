"""Drive a real ``malletrain daemon`` process against the dev cluster, the way an operator would.

Everything goes through the real interfaces: the daemon is a child process started with
``malletrain daemon --config FILE``; users submit with ``malletrain submit`` run AS mt-alice /
mt-bob (setpriv); state is read back with ``malletrain jobs --json``. Nothing is faked.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "elastic_train.py"
PYTHON = sys.executable


def as_user(user: str | None, argv: list[str]) -> list[str]:
    if user is None:
        return argv
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *argv]


#: The example's step emulates an accelerator-bound step (the sleep) on a large per-rank batch,
#: so that throughput grows with nodes as on a real cluster. With short steps (0.05 s, 16
#: samples) the gloo collectives of 8 emulated nodes sharing 2 cores make 2 nodes barely
#: faster than 1, and the `malletrain` policy, which learns that, rightly declines to grow.
STEP_SLEEP_S = 0.25
BATCH_PER_RANK = 64


def check_python_reachable(user: str, env: dict[str, str]) -> None:
    """The workers run this interpreter as ``user``: fail clearly if they cannot."""
    res = subprocess.run(as_user(user, [PYTHON, "-c", "import torch, malletrain"]),
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    if res.returncode != 0:
        raise AssertionError(
            f"{user} cannot run {PYTHON} with torch and malletrain (the slot jobs run as the "
            f"submitting user): {res.stderr.strip()[-300:]}. Make the virtualenv readable by "
            "other users (e.g. chmod o+x on its parent directories)."
        )


class Daemon:
    """A ``malletrain daemon`` child process with its own config and state directory."""

    def __init__(self, base: Path, slurm_conf: Path, env: dict[str, str], *,
                 tick_s: float = 1.0, extra_args: tuple[str, ...] = (),
                 policy: str = "malletrain") -> None:
        self.base = base
        self.env = dict(env)
        self.state = base / "state"
        self.state.mkdir(parents=True, exist_ok=True)
        base.chmod(0o755)
        self.state.chmod(0o755)
        self.out = base / "out"
        self.out.mkdir(exist_ok=True)
        self.out.chmod(0o1777)
        self.socket = self.state / "submit.sock"
        self.config = base / "malletrain.yaml"
        self.log_path = base / "daemon.log"
        self.extra_args = extra_args
        self.config.write_text(yaml.safe_dump({
            "slurm": {"scavenger_partition": "scavenger", "partitions": ["batch"],
                      "slurm_conf": str(slurm_conf), "min_slot_time_s": 60,
                      "max_slot_time_s": 900, "command_timeout_s": 10},
            "allocator": {"tick_interval_s": tick_s, "policy": policy},
            "state": {"database_path": str(self.state / "state.db"),
                      "snapshot_dir": str(self.state / "snapshots")},
            "coordinator": {"host": "127.0.0.1", "port": 0, "heartbeat_timeout_s": 60},
            "submit": {"socket_path": str(self.socket)},
            "metrics": {"enabled": True, "address": "127.0.0.1:0"},
            "logging": {"level": "INFO", "format": "text"},
        }))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Daemon:
        self.socket.unlink(missing_ok=True)  # a killed daemon leaves its socket file behind
        logf = open(self.log_path, "ab")  # noqa: SIM115 - lives with the process
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "malletrain.cli", "daemon", "--config", str(self.config),
             *self.extra_args],
            env=self.env, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
            start_new_session=True,
        )
        logf.close()
        wait_until(self._answers, 90, what="the daemon to answer on its socket",
                   on_timeout=lambda: self.log()[-2000:])
        return self

    def _answers(self) -> bool:
        if not self.alive():
            raise AssertionError(f"the daemon exited:\n{self.log()[-3000:]}")
        if not self.socket.exists():
            return False
        res = self.cli(None, "jobs", "--socket", str(self.socket), check=False)
        return res.returncode == 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def stop_coordinator(self) -> None:
        pid_file = self.state / "coordinator.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGTERM)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # -- users -----------------------------------------------------------------------
    def cli(self, user: str | None, *args: str, check: bool = True,
            timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        argv = as_user(user, [PYTHON, "-m", "malletrain.cli", *args])
        res = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                             timeout=timeout_s, check=False, cwd=str(self.out))
        if check and res.returncode != 0:
            raise AssertionError(f"{args[:2]} failed ({res.returncode}): {res.stderr}"
                                 f"\n--- daemon log tail ---\n{self.log()[-3000:]}")
        return res

    def submit(self, user: str, *args: str, check: bool = True
               ) -> subprocess.CompletedProcess[str]:
        return self.cli(user, "submit", "--socket", str(self.socket), *args, check=check)

    def submit_example(self, user: str, tag: str, nodes: str, samples: int,
                       step_sleep: float = STEP_SLEEP_S, launcher: str = "torchrun") -> str:
        res = self.submit(
            user, "--parsable", "-N", nodes, "-J", tag, "--launcher", launcher,
            "-o", str(self.out / f"{tag}-%j.out"),
            "-D", str(self.out), str(EXAMPLE), "--total-samples", str(samples),
            "--step-sleep", str(step_sleep), "--batch", str(BATCH_PER_RANK),
            "--results", str(self.out / f"{tag}.json"),
        )
        return res.stdout.strip()

    def jobs(self) -> dict[str, dict]:
        res = self.cli(None, "jobs", "--all", "--json", "--socket", str(self.socket))
        return {row["job_id"]: row for row in json.loads(res.stdout)}

    def result(self, tag: str) -> dict | None:
        path = self.out / f"{tag}.json"
        return json.loads(path.read_text()) if path.exists() else None


def wait_until(predicate: Callable[[], object], timeout_s: float, period_s: float = 0.5,
               what: str = "condition", on_timeout: Callable[[], str] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            extra = on_timeout() if on_timeout else ""
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{extra}")
        time.sleep(period_s)

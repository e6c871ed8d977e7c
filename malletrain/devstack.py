"""A whole malletrain stack on one machine: the demo, the e2e benchmark and the e2e tests.

All three need the same things, done the way an operator and users would do them: a Slurm
dev cluster in a directory of its own (``slurm/dev-cluster up|down``), a ``malletrain
daemon`` child process started with a config file (the real CLI, the real config schema),
and users who submit and look at jobs with ``malletrain submit`` / ``malletrain jobs``, run
*as* those users (``setpriv``) so that their slot jobs run under their identity. Keeping
this in one place means the demo a newcomer runs, the benchmark's figures and the tests
exercise the same start-up and shutdown paths.

Nothing here is faked, and nothing here is needed in production: it is a development tool
(it expects root, the test users and the Debian Slurm packages that ``make setup`` installs).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DEV_CLUSTER = REPO / "slurm" / "dev-cluster"
EXAMPLE = REPO / "examples" / "elastic_train.py"
PYTHON = sys.executable
TEST_USERS = ("mt-alice", "mt-bob")

#: The example's step emulates an accelerator-bound step (a sleep) on a large per-rank batch,
#: so that throughput grows with nodes as on a real cluster. With short steps (0.05 s, 16
#: samples) the gloo collectives of 8 emulated nodes sharing 2 cores make 2 nodes barely
#: faster than 1, and the `malletrain` policy, which learns that, rightly declines to grow.
STEP_SLEEP_S = 0.25
BATCH_PER_RANK = 64


class StackError(RuntimeError):
    """A part of the local stack failed to start or answer (the message says which and why)."""


def as_user(user: str | None, argv: list[str]) -> list[str]:
    """``argv`` run as ``user`` (with that user's groups); unchanged for ``None``."""
    if user is None:
        return argv
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *argv]


def run(argv: list[str], env: Mapping[str, str], *, check: bool = True, timeout_s: float = 120,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command (an argument list, never a shell string); StackError if it fails."""
    res = subprocess.run(argv, env=dict(env), capture_output=True, text=True,
                         timeout=timeout_s, check=False, cwd=None if cwd is None else str(cwd))
    if check and res.returncode != 0:
        raise StackError(f"{' '.join(argv[:5])} failed ({res.returncode}): "
                         f"{res.stderr.strip()[-800:]}")
    return res


class LocalCluster:
    """The Slurm dev cluster in ``base`` (its own munged, slurmctld, N slurmd, ports)."""

    def __init__(self, base: Path, port: int, nodes: int = 8) -> None:
        self.base = base
        self.nodes = nodes
        self.env = dict(os.environ, MALLETRAIN_DEVCLUSTER_DIR=str(base),
                        MALLETRAIN_DEVCLUSTER_PORT=str(port),
                        SLURM_CONF=str(base / "etc" / "slurm.conf"))

    @property
    def slurm_conf(self) -> str:
        return self.env["SLURM_CONF"]

    def up(self, *, accounting: bool = True, users: tuple[str, ...] = TEST_USERS,
           epilog: bool = False, gpus: str = "") -> None:
        """Start it (wiping any previous state). ``epilog``: run a site-like Epilog
        (``dev-cluster up --epilog``; docs/slurm-backend.md §9). ``gpus``: fake GPUs on
        every node, ``TYPE:COUNT[,...]`` (``dev-cluster up --gpus``)."""
        argv = [str(DEV_CLUSTER), "up", "--nodes", str(self.nodes)]
        if gpus:
            argv += ["--gpus", gpus]
        if accounting:
            argv.append("--accounting")
        if epilog:
            argv.append("--epilog")
        if users:
            argv += ["--users", ",".join(users)]
        run(argv, self.env, timeout_s=600)

    def down(self) -> None:
        run([str(DEV_CLUSTER), "down"], self.env, check=False, timeout_s=120)

    def squeue(self) -> list[dict[str, Any]]:
        """Every job (``squeue --all --json``); [] when Slurm does not answer."""
        res = run(["squeue", "--all", "--json"], self.env, check=False)
        try:
            return list(json.loads(res.stdout)["jobs"])
        except (ValueError, KeyError, TypeError):
            return []


def check_python_reachable(user: str, env: Mapping[str, str]) -> None:
    """Slot jobs run this interpreter as ``user``: say clearly what to do if they cannot."""
    res = run(as_user(user, [PYTHON, "-c", "import torch, malletrain"]), env, check=False,
              timeout_s=60)
    if res.returncode != 0:
        raise StackError(
            f"{user} cannot run {PYTHON} with torch and malletrain (slot jobs run as the "
            f"submitting user): {res.stderr.strip()[-300:]}. Make the virtualenv reachable by "
            "other users, e.g. `chmod o+x` on its parent directories (`make user-access`)."
        )


class LocalDaemon:
    """A ``malletrain daemon`` child process with its config, state and job output in ``work``.

    ``work/malletrain.yaml`` is its config, ``work/state`` its SQLite store, snapshots and
    submit socket, ``work/out`` (world-writable, sticky) where users' jobs write, and
    ``work/daemon.log`` its log. ``slurm`` and ``state`` entries override those sections of
    the config; ``snapshot_dir`` puts evicted jobs' state elsewhere (as a real cluster's
    parallel file system is elsewhere than the login node's disk).
    """

    def __init__(self, work: Path, env: Mapping[str, str], slurm_conf: str, *,
                 policy: str = "malletrain", tick_s: float = 1.0, log_level: str = "INFO",
                 slurm: Mapping[str, Any] | None = None, extra_args: tuple[str, ...] = (),
                 coordinator_port: int = 0, snapshot_dir: Path | None = None,
                 state: Mapping[str, Any] | None = None) -> None:
        self.work = work
        self.env = dict(env)
        self.state = work / "state"
        self.out = work / "out"
        for d in (work, self.state, self.out):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o755)  # the users' slot jobs read the config and reach the socket
        self.out.chmod(0o1777)
        self.socket = self.state / "submit.sock"
        self.config = work / "malletrain.yaml"
        self.log_path = work / "daemon.log"
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        # the dev cluster's slurmctld writes it (slurm/job_submit.lua; docs/install.md)
        notice = Path(slurm_conf).parents[1] / "run" / "submit-notice"
        self.config.write_text(yaml.safe_dump({
            "slurm": {"scavenger_partition": "scavenger", "partitions": ["batch"],
                      "slurm_conf": slurm_conf, "min_slot_time_s": 60, "max_slot_time_s": 900,
                      "command_timeout_s": 10, "submit_notice": str(notice), **(slurm or {})},
            "allocator": {"tick_interval_s": tick_s, "policy": policy},
            "state": {"database_path": str(self.state / "state.db"),
                      "snapshot_dir": str(snapshot_dir or self.state / "snapshots"),
                      **(state or {})},
            "coordinator": {"host": "127.0.0.1", "port": coordinator_port,
                            "heartbeat_timeout_s": 60},
            "submit": {"socket_path": str(self.socket)},
            "metrics": {"enabled": True, "address": "127.0.0.1:0"},
            "logging": {"level": log_level, "format": "text"},
        }))

    # -- the process -------------------------------------------------------------------
    def start(self, wait_s: float = 90.0) -> LocalDaemon:
        """Start the daemon and wait until it answers ``malletrain jobs`` on its socket."""
        self.socket.unlink(missing_ok=True)  # a killed daemon leaves its socket file behind
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                [PYTHON, "-m", "malletrain.cli", "daemon", "--config", str(self.config),
                 *self.extra_args],
                env=self.env, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                start_new_session=True,
            )
        deadline = time.monotonic() + wait_s
        while not self._answers():
            if time.monotonic() > deadline:
                raise StackError(f"the daemon did not answer within {wait_s:.0f} s:\n"
                                 f"{self.log()[-2000:]}")
            time.sleep(0.2)
        return self

    def _answers(self) -> bool:
        if not self.alive():
            raise StackError(f"the daemon exited:\n{self.log()[-3000:]}")
        if not self.socket.exists():
            return False
        return self.cli(None, "jobs", "--socket", str(self.socket), check=False).returncode == 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait (SIGKILL after ``timeout_s``); the daemon's exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def stop_coordinator(self) -> None:
        """The coordinator outlives the daemon by design (training goes on): stop it too."""
        pid_file = self.state / "coordinator.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGTERM)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # -- users -------------------------------------------------------------------------
    def cli(self, user: str | None, *args: str, check: bool = True, timeout_s: float = 60
            ) -> subprocess.CompletedProcess[str]:
        """``malletrain ARGS`` as ``user`` (None: as the caller), from ``work/out``."""
        res = run(as_user(user, [PYTHON, "-m", "malletrain.cli", *args]), self.env,
                  check=False, timeout_s=timeout_s, cwd=self.out)
        if check and res.returncode != 0:
            raise StackError(f"malletrain {' '.join(args[:2])} failed ({res.returncode}): "
                             f"{res.stderr}\n--- daemon log tail ---\n{self.log()[-3000:]}")
        return res

    def submit(self, user: str, *args: str, check: bool = True
               ) -> subprocess.CompletedProcess[str]:
        return self.cli(user, "submit", "--socket", str(self.socket), *args, check=check)

    def submit_example(self, user: str, tag: str, nodes: str, samples: int, *,
                       step_sleep_s: float = STEP_SLEEP_S, batch_per_rank: int = BATCH_PER_RANK,
                       launcher: str = "srun", step_log: bool = False,
                       options: Sequence[str] = ()) -> str:
        """Submit ``examples/elastic_train.py`` as ``user``; its malletrain job id.

        ``options``: more ``malletrain submit`` options (e.g. ``--rate-target=5``).

        ``step_log``: the workers also write one JSON line per step event to
        ``out/TAG.log`` (``--jsonl``), e.g. to count steps that failed and were redone.
        """
        script_args = ["--total-samples", str(samples), "--step-sleep", str(step_sleep_s),
                       "--batch", str(batch_per_rank), "--results", str(self.out / f"{tag}.json")]
        if step_log:
            script_args += ["--jsonl", str(self.step_log(tag))]
        res = self.submit(
            user, "--parsable", "-N", nodes, "-J", tag, "--launcher", launcher,
            "-o", str(self.out / f"{tag}-%j.out"), "-D", str(self.out), *options, str(EXAMPLE),
            *script_args,
        )
        return res.stdout.strip()

    def step_log(self, tag: str) -> Path:
        """Where ``submit_example(..., step_log=True)`` has the workers write their steps."""
        return self.out / f"{tag}.log"

    def jobs(self) -> dict[str, dict[str, Any]]:
        """``malletrain jobs --all --json``, by job id (in the daemon's order)."""
        res = self.cli(None, "jobs", "--all", "--json", "--socket", str(self.socket))
        return {row["job_id"]: row for row in json.loads(res.stdout)}

    def result(self, tag: str) -> dict[str, Any] | None:
        """What the example wrote at the end (``--results``), if it has."""
        path = self.out / f"{tag}.json"
        return json.loads(path.read_text()) if path.exists() else None

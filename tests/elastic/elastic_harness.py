"""Real worker processes around an in-process coordinator, for the elastic tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from malletrain.elastic.coordinator.handle import Coordinator
from malletrain.elastic.coordinator.keyfile import ensure_key

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "elastic_train.py"


@dataclass
class Worker:
    member_id: str
    proc: subprocess.Popen
    log: Path
    stderr: Path

    def records(self) -> list[dict]:
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a line being written
                out.append(json.loads(line))
        return out

    def steps(self) -> list[dict]:
        return [r for r in self.records() if r["event"] == "step"]

    def epochs(self) -> list[dict]:
        return [r for r in self.records() if r["event"] == "epoch"]

    def exit_record(self) -> dict | None:
        ex = [r for r in self.records() if r["event"] == "exit"]
        return ex[-1] if ex else None

    def last_step(self) -> int:
        s = self.steps()
        return s[-1]["step"] if s else -1


@dataclass
class Cluster:
    tmp: Path
    job_id: str = "job1"
    coord: Coordinator = field(default_factory=lambda: Coordinator.start("127.0.0.1", 0))
    workers: dict[str, Worker] = field(default_factory=dict)
    state_dir: Path | None = None
    env_extra: dict[str, str] = field(default_factory=dict)
    #: the training script every member runs (its JSON-lines log is elastic_train.py's)
    script: Path = EXAMPLE

    def launch(self, member_id: str, *args: str, env: dict[str, str] | None = None,
               nproc: int = 1) -> Worker | list[Worker]:
        """Start a member: one process, or ``torchrun --nproc-per-node=nproc`` (a list)."""
        if nproc > 1:
            return self._launch_torchrun(member_id, nproc, args, env)
        log = self.tmp / f"{member_id}.{len(self.workers)}.jsonl"
        err = self.tmp / f"{member_id}.{len(self.workers)}.stderr"
        e = self._env(member_id, env)
        cmd = [sys.executable, str(self.script), "--jsonl", str(log), *args]
        with open(err, "w") as err_file:
            proc = subprocess.Popen(cmd, env=e, stdout=subprocess.DEVNULL, stderr=err_file)
        w = Worker(member_id, proc, log, err)
        self.workers[f"{member_id}.{len(self.workers)}"] = w
        return w

    def _env(self, member_id: str, env: dict[str, str] | None) -> dict[str, str]:
        e = dict(os.environ)
        e.update(
            MALLETRAIN_COORDINATOR=self.coord.address,
            MALLETRAIN_JOB_ID=self.job_id,
            MALLETRAIN_JOB_SECRET=self.coord.job_secret(self.job_id),
            MALLETRAIN_MEMBER_ID=member_id,
            MALLETRAIN_LOG_LEVEL="INFO",
            PYTHONPATH=str(REPO),
            OMP_NUM_THREADS="1",
            TORCH_DISTRIBUTED_DEBUG=os.environ.get("TORCH_DISTRIBUTED_DEBUG", "OFF"),
        )
        e.pop("LOCAL_RANK", None)
        e.pop("LOCAL_WORLD_SIZE", None)
        if self.state_dir is not None:
            e["MALLETRAIN_STATE_DIR"] = str(self.state_dir)
        e.update(self.env_extra)
        e.update(env or {})
        return e

    def _launch_torchrun(self, member_id: str, nproc: int, args: tuple[str, ...],
                         env: dict[str, str] | None) -> list[Worker]:
        n = len(self.workers)
        log = self.tmp / f"{member_id}.{n}.{{local_rank}}.jsonl"
        err = self.tmp / f"{member_id}.{n}.stderr"
        e = self._env(member_id, env)
        # as a native slot runs it (daemon/jobs/slots.py): rendezvous via the coordinator
        cmd = [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend=malletrain",
               "--nnodes=1",
               f"--nproc-per-node={nproc}", str(self.script), "--jsonl", str(log), *args]
        with open(err, "w") as err_file:
            proc = subprocess.Popen(cmd, env=e, stdout=subprocess.DEVNULL, stderr=err_file)
        out = []
        for lr in range(nproc):
            w = Worker(member_id, proc, Path(str(log).replace("{local_rank}", str(lr))), err)
            self.workers[f"{member_id}.{n}.{lr}"] = w
            out.append(w)
        return out

    def wait_registered(self, *members: str, timeout_s: float = 60) -> None:
        wait_for(lambda: set(members) <= set(self.coord.registered(self.job_id)), timeout_s,
                 f"registration of {members}", self)

    def wait_step(self, w: Worker, step: int, timeout_s: float = 60) -> None:
        wait_for(lambda: w.last_step() >= step, timeout_s, f"{w.member_id} to reach {step}", self)

    def wait_epoch(self, w: Worker, epoch: int, timeout_s: float = 60) -> dict:
        wait_for(lambda: any(r["epoch"] >= epoch for r in w.epochs()), timeout_s,
                 f"{w.member_id} to form epoch {epoch}", self)
        return next(r for r in w.epochs() if r["epoch"] >= epoch)

    def stderr_tail(self) -> str:
        parts = []
        for name, w in self.workers.items():
            text = w.stderr.read_text() if w.stderr.exists() else ""
            parts.append(f"--- {name} rc={w.proc.poll()}\n{text[-3000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for w in self.workers.values():
            if w.proc.poll() is None:
                try:
                    os.kill(w.proc.pid, signal.SIGCONT)
                    w.proc.kill()
                except ProcessLookupError:
                    pass
                w.proc.wait(10)
        self.coord.close()


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str,
             cluster: Cluster | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    detail = cluster.stderr_tail() if cluster is not None else ""
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{detail}")


def checksums_at(workers: list[Worker], epoch: int) -> set[str]:
    """Checksums logged by the given workers when they formed ``epoch``."""
    out = set()
    for w in workers:
        for r in w.epochs():
            if r["epoch"] == epoch:
                out.add(r["checksum"])
    return out


def committed_steps(workers: list[Worker]) -> dict[int, dict]:
    """step index -> one record (rank 0's), checking that every rank agrees on n and ws."""
    by_step: dict[int, dict] = {}
    for w in workers:
        for r in w.steps():
            prev = by_step.get(r["step"])
            if prev is None or r["rank"] == 0:
                by_step[r["step"]] = r
    return by_step


def start_coordinator(tmp: Path, port: int = 0) -> tuple[subprocess.Popen, str]:
    """A standalone `malletrain coordinator` process (as root) and its address.

    Its master key is ``tmp/coordinator.key`` (created on first use): see :func:`attach`.
    """
    address_file = tmp / f"coord-{time.monotonic_ns()}.addr"
    proc = subprocess.Popen(
        [sys.executable, "-m", "malletrain.cli", "coordinator", "--port", str(port),
         "--key-file", str(tmp / "coordinator.key"), "--address-file", str(address_file)],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.DEVNULL)
    wait_for(address_file.exists, 60, "the coordinator to listen")
    return proc, address_file.read_text().strip()


def attach(tmp: Path, address: str, live_jobs: list[str] | None = None) -> Coordinator:
    """The daemon's session with a coordinator of :func:`start_coordinator`; ``live_jobs``:
    the jobs the daemon knows (a restarted coordinator serves only the jobs it is told)."""
    return Coordinator.attach(address, ensure_key(tmp / "coordinator.key"),
                              live_jobs=lambda: list(live_jobs or ()))

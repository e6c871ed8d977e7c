"""The GPU check of the elastic runtime: faults and hangs on one real GPU (issue 17).

Runs ``examples/elastic_train.py`` workers around a real coordinator process, on one GPU:

* ``evict-restore``: one NCCL rank trains, is evicted (``publish([])``: it saves its
  snapshot), a fresh member restores it: same step, samples and checksum; exact at the end.
* ``kill-step``: two members on the GPU (gloo with CUDA tensors: NCCL refuses two ranks on
  one GPU), the second is killed with SIGKILL mid-step; the first heals alone and finishes.
* ``stop-peer``: the second member is frozen (SIGSTOP); the first drops it after the step
  timeout and finishes.
* ``sigterm-hang``: the second member is frozen, then the first gets SIGTERM while its
  collective waits for the frozen peer: it must be gone within its SIGTERM deadline.
* ``duplicate-gpu`` (GPU only): one member asks for two NCCL processes on one GPU: one clear
  error, a non-zero exit, and no group formed again and again.

Each scenario ``--runs`` times (default 5). Without CUDA it says so and stops; ``--cpu`` runs
the same scenarios (but the GPU-only one) on CPU/gloo, as CI's machines can. Last line:
``gpu_check device=<name> scenarios=S runs=R passed=P failed=F``.

Run: ``.venv/bin/python benchmarks/gpu_check.py`` (on a GPU machine; a few minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rescale import EXAMPLE, child_env, records, start_coordinator

TOTAL = 2400
SIGTERM_DEADLINE_S = 4.0


@dataclass
class Run:
    """One scenario run: its coordinator, its workers, its verdict."""

    tmp: Path
    device: str
    backend: str
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.coord_proc, self.coord = start_coordinator(self.tmp)
        self.job = "gpu-check"

    def launch(self, member: str, *extra: str, backend: str | None = None) -> None:
        self.logs[member] = self.tmp / f"{member}.jsonl"
        env = child_env(MALLETRAIN_COORDINATOR=self.coord.address, MALLETRAIN_JOB_ID=self.job,
                        MALLETRAIN_JOB_SECRET=self.coord.job_secret(self.job),
                        MALLETRAIN_MEMBER_ID=member, MALLETRAIN_STATE_DIR=str(self.tmp / "st"),
                        MALLETRAIN_BACKEND=backend or self.backend,
                        MALLETRAIN_STEP_TIMEOUT_S="5",
                        MALLETRAIN_SIGTERM_DEADLINE_S=str(SIGTERM_DEADLINE_S))
        cmd = [sys.executable, str(EXAMPLE), "--device", self.device, "--total-samples",
               str(TOTAL), "--dataset-size", "256", "--batch", "4", "--hidden", "256",
               "--lr", "0.001", "--step-sleep", "0.02", "--jsonl", str(self.logs[member]),
               *extra]
        with open(self.tmp / f"{member}.err", "w") as err:
            self.procs[member] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                                  stderr=err)

    def steps(self, member: str) -> int:
        return sum(1 for r in records(self.logs[member]) if r["event"] == "step")

    def wait(self, cond: Callable[[], bool], timeout_s: float, what: str) -> None:
        end = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > end:
                raise AssertionError(f"timed out after {timeout_s:.0f} s: {what}")
            time.sleep(0.05)

    def start(self, *members: str) -> None:
        self.wait(lambda: set(members) <= set(self.coord.registered(self.job)), 120,
                  "registration")
        self.coord.publish(self.job, list(members))
        self.wait(lambda: self.steps(members[0]) >= 10, 120, "10 steps")

    def finished_exact(self) -> None:
        self.wait(lambda: self.coord.is_finished(self.job), 240, "the job to finish")
        result = self.coord.result(self.job)
        assert result is not None and result.samples_total == TOTAL, result

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait(30)
        self.coord.close()
        self.coord_proc.terminate()
        self.coord_proc.wait(10)


def evict_restore(r: Run) -> None:
    r.launch("m0")
    r.start("m0")
    r.coord.publish(r.job, [])
    assert r.procs["m0"].wait(60) == 0
    ex = [x for x in records(r.logs["m0"]) if x["event"] == "exit"][-1]
    assert ex["reason"] == "evicted", ex
    r.launch("m1")
    r.start("m1")
    first = next(x for x in records(r.logs["m1"]) if x["event"] == "epoch")
    assert (first["step"], first["samples_total"], first["checksum"]) == (
        ex["step"], ex["samples_total"], ex["checksum"]), (first, ex)
    r.finished_exact()


def kill_step(r: Run) -> None:
    r.launch("m0")
    r.launch("m1")
    r.start("m0", "m1")
    r.procs["m1"].kill()
    r.finished_exact()
    assert r.procs["m0"].wait(60) == 0


def stop_peer(r: Run) -> None:
    r.launch("m0")
    r.launch("m1")
    r.start("m0", "m1")
    r.procs["m1"].send_signal(signal.SIGSTOP)
    before = r.steps("m0")
    r.wait(lambda: r.steps("m0") >= before + 20, 90, "m0 to train on without the frozen m1")
    r.finished_exact()


def sigterm_hang(r: Run) -> None:
    r.launch("m0")
    r.launch("m1")
    r.start("m0", "m1")
    r.procs["m1"].send_signal(signal.SIGSTOP)
    time.sleep(1.0)  # m0 is now inside a collective that waits for m1
    t = time.monotonic()
    r.procs["m0"].send_signal(signal.SIGTERM)
    r.procs["m0"].wait(60)
    gone_s = time.monotonic() - t
    assert gone_s <= SIGTERM_DEADLINE_S + 1.5, f"m0 took {gone_s:.1f} s after SIGTERM"


def duplicate_gpu(r: Run) -> None:
    log = r.tmp / "dup.err"
    env = child_env(MALLETRAIN_COORDINATOR=r.coord.address, MALLETRAIN_JOB_ID=r.job,
                    MALLETRAIN_JOB_SECRET=r.coord.job_secret(r.job), MALLETRAIN_MEMBER_ID="m0",
                    MALLETRAIN_BACKEND="nccl")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2", str(EXAMPLE), "--device", "cuda:0", "--total-samples",
           str(TOTAL)]
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
    # the check before any group refuses it at once; if a version of the runtime registered
    # anyway, publish it so that NCCL meets the duplicate GPU
    r.wait(lambda: "m0" in r.coord.registered(r.job) or proc.poll() is not None, 120,
           "registration or exit")
    if proc.poll() is None:
        r.coord.publish(r.job, ["m0"])
    rc = proc.wait(120)
    text = log.read_text()
    assert rc != 0, "two NCCL ranks on one GPU did not fail"
    assert "GPU" in text, text[-2000:]
    epochs = r.coord.membership(r.job)
    assert epochs is None or epochs.epoch <= 1, f"re-formed {epochs.epoch} times"


SCENARIOS: dict[str, tuple[Callable[[Run], None], str | None, bool]] = {
    # name: (check, backend on the GPU (None: the device's default), GPU only)
    "evict-restore": (evict_restore, None, False),
    "kill-step": (kill_step, "gloo", False),
    "stop-peer": (stop_peer, "gloo", False),
    "sigterm-hang": (sigterm_hang, "gloo", False),
    "duplicate-gpu": (duplicate_gpu, "nccl", True),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), action="append")
    ap.add_argument("--cpu", action="store_true", help="the CPU/gloo dry run")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here: nothing checked (--cpu runs the CPU dry run)")
        return 0
    device = "cpu" if args.cpu else "cuda"
    name = "cpu" if args.cpu else torch.cuda.get_device_name(0)
    chosen = args.scenario or [s for s, (_, _, gpu) in SCENARIOS.items()
                               if not (gpu and args.cpu)]
    passed = failed = 0
    for scenario in chosen:
        check, backend, _ = SCENARIOS[scenario]
        for run in range(args.runs):
            tmp = Path(tempfile.mkdtemp(prefix=f"mt-gpu-{scenario}-"))
            r = Run(tmp, device, "gloo" if args.cpu else (backend or "nccl"))
            t = time.monotonic()
            try:
                check(r)
                passed += 1
                verdict = "ok"
            except (AssertionError, subprocess.TimeoutExpired) as exc:
                failed += 1
                verdict = f"FAILED: {str(exc)[:300]} (logs {tmp})"
            finally:
                r.close()
            print(f"{scenario} run {run + 1}: {verdict} in {time.monotonic() - t:.1f} s",
                  flush=True)
            if verdict == "ok" and not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
    print(f"gpu_check device={name.replace(' ', '_')} scenarios={len(chosen)} "
          f"runs={args.runs} passed={passed} failed={failed}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

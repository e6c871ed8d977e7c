"""Stand-in for the public training programs that the corpus's batch scripts start.

Those programs (``multinode_torchrun.py``, ``mnist_ddp.py``, ``ddp_visiontransformer.py``,
``torch-distributed-gpu-test.py``, ...) need CUDA and their datasets; this one trains a small
MLP on synthetic data with DDP over gloo on CPU, so the batch scripts around it run unchanged
on the dev cluster. It is copied to each path a script runs and accepts any arguments
(recorded, not used). It finds its rank and peers the way its launcher hands them over:

* torchrun / accelerate / a script's own exports: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
  ``MASTER_PORT`` (``LOCAL_RANK`` too);
* a bare ``srun python``, as Lightning's ``SLURMEnvironment`` reads it: ``SLURM_PROCID``,
  ``SLURM_NTASKS``, the first node of ``SLURM_STEP_NODELIST`` (else ``SLURM_NODELIST``)
  as the master, ``MASTER_PORT`` or ``15000 + the last 4 digits of SLURM_JOB_ID``.

Like the real programs it checkpoints every epoch in its working directory (``ckpt.pt``),
resumes from it, and on SIGTERM/SIGUSR1 saves at the next step and exits. Rank 0 writes one
JSON line per event to ``train.jsonl`` there (start, step, epoch, stopped, done; each with
the world size, the step's node count and samples so far), which the tests read.
``STANDIN_EPOCHS`` (default 3) and ``STANDIN_STEP_SLEEP`` (seconds, default 0.05) set the
length.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

DATASET = 4096
BATCH_PER_RANK = 16


def _first_host(nodelist: str) -> str:
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0]


def rendezvous() -> tuple[int, int, str, str]:
    """(rank, world size, master address, master port) from whichever launcher ran us."""
    env = os.environ
    if env.get("RANK") and env.get("WORLD_SIZE") and env.get("MASTER_ADDR"):
        return (int(env["RANK"]), int(env["WORLD_SIZE"]), env["MASTER_ADDR"],
                env.get("MASTER_PORT") or "29500")
    nodelist = env.get("SLURM_STEP_NODELIST") or env["SLURM_NODELIST"]
    port = env.get("MASTER_PORT") or str(15000 + int(env["SLURM_JOB_ID"][-4:]))
    return (int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), _first_host(nodelist), port)


class Stop:
    """SIGTERM/SIGUSR1: save at the next step and exit."""

    requested = False

    @classmethod
    def install(cls) -> None:
        def handler(_signum: int, _frame: object) -> None:
            cls.requested = True
        signal.signal(signal.SIGUSR1, handler)
        signal.signal(signal.SIGTERM, handler)


def save(path: Path, state: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def main() -> int:
    Stop.install()
    torch.set_num_threads(1)
    epochs = int(os.environ.get("STANDIN_EPOCHS", "3"))
    sleep_s = float(os.environ.get("STANDIN_STEP_SLEEP", "0.05"))
    rank, world, addr, port = rendezvous()
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=world)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(DATASET, 32, generator=g)
    y = torch.tanh(x @ (torch.randn(32, 32, generator=g) / 32**0.5))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ckpt = Path("ckpt.pt")
    epoch, offset, samples = 0, 0, 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        epoch, offset, samples = state["epoch"], state["offset"], state["samples"]
    ddp = DistributedDataParallel(model)
    log = open("train.jsonl", "a", buffering=1) if rank == 0 else None  # noqa: SIM115

    nodes = int(os.environ.get("SLURM_STEP_NUM_NODES") or os.environ.get("SLURM_NNODES") or 0)

    def write(**record: object) -> None:
        if log is not None:
            log.write(json.dumps(dict(record, t=time.time(), world=world, nodes=nodes)) + "\n")

    def state() -> dict[str, object]:
        return {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch,
                "offset": offset, "samples": samples}

    write(event="start", epoch=epoch, samples=samples, argv=sys.argv, program=sys.argv[0])
    flag = torch.zeros(1)
    while epoch < epochs:
        order = torch.randperm(DATASET, generator=torch.Generator().manual_seed(epoch))
        while offset < DATASET:
            flag[0] = 1.0 if Stop.requested else 0.0
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag[0] > 0:  # some rank was asked to stop: all save at this same step
                if rank == 0:
                    save(ckpt, state())
                write(event="stopped", epoch=epoch, samples=samples)
                dist.destroy_process_group()
                return 0
            mine = order[offset:offset + BATCH_PER_RANK * world][rank::world]
            loss = ((ddp(x[mine]) - y[mine]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(sleep_s)
            step = min(BATCH_PER_RANK * world, DATASET - offset)
            offset, samples = offset + step, samples + step
            write(event="step", epoch=epoch, samples=samples)
        epoch, offset = epoch + 1, 0
        if rank == 0:
            save(ckpt, state())
        write(event="epoch", epoch=epoch, samples=samples)
    write(event="done", epoch=epoch, samples=samples)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

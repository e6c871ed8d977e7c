"""A plain torchrun DDP training script with its own checkpointing (no malletrain in it).

Written the way elastic torchrun users write them today: it resumes from ``--checkpoint``
when the file exists, saves it at the end of every epoch, and on SIGUSR1 or SIGTERM (the
batch system asking it to stop) saves it at the next step and exits. Every rank learns of a
stop request at the same step (one all-reduce of a flag per step), so the checkpoint is
consistent whichever node got the signal. The same MLP and synthetic data as
``examples/elastic_train.py``, so the two modes can be compared on one model.

Run by hand::

    torchrun --standalone --nproc-per-node=2 examples/restart/train_ddp.py \\
        --epochs 3 --checkpoint /tmp/ckpt.pt --jsonl /tmp/train.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--dataset-size", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step")
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--jsonl", type=Path, default=None, help="JSON lines written by rank 0")
    ap.add_argument("--results", type=Path, default=None, help="written by rank 0 at the end")
    return ap.parse_args(argv)


class Stop:
    """SIGUSR1/SIGTERM: finish the current step, save, exit."""

    requested = False

    @classmethod
    def install(cls) -> None:
        def handler(_signum: int, _frame: object) -> None:
            cls.requested = True
        signal.signal(signal.SIGUSR1, handler)
        signal.signal(signal.SIGTERM, handler)


def checksum(model: nn.Module) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def save(path: Path, state: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    Stop.install()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(args.dataset_size, args.dim, generator=g)
    w = torch.randn(args.dim, args.dim, generator=g) / args.dim**0.5
    y = torch.tanh(x @ w) + 0.05 * torch.randn(args.dataset_size, args.dim, generator=g)
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(args.dim, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.dim))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    epoch, offset, samples, step = 0, 0, 0, 0
    if args.checkpoint.exists():
        ckpt = torch.load(args.checkpoint, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        epoch, offset, samples, step = ckpt["epoch"], ckpt["offset"], ckpt["samples"], ckpt["step"]
    ddp = DistributedDataParallel(model)
    log = open(args.jsonl, "a", buffering=1) if args.jsonl and rank == 0 else None  # noqa: SIM115

    def write(**record: object) -> None:
        if log is not None:
            log.write(json.dumps(dict(record, t=time.time(), world=world)) + "\n")

    def state() -> dict[str, object]:
        return {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch,
                "offset": offset, "samples": samples, "step": step}

    write(event="start", epoch=epoch, samples=samples, step=step, checksum=checksum(model))
    flag = torch.zeros(1)
    while epoch < args.epochs:
        order = torch.randperm(args.dataset_size, generator=torch.Generator().manual_seed(epoch))
        while offset < args.dataset_size:
            flag[0] = 1.0 if Stop.requested else 0.0
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag[0] > 0:  # some rank was asked to stop: all save at this same step
                if rank == 0:
                    save(args.checkpoint, state())
                write(event="stopped", epoch=epoch, samples=samples, step=step)
                dist.barrier()
                dist.destroy_process_group()
                return 0
            batch = order[offset:offset + args.batch * world]
            mine = batch[rank::world]
            out = ddp(x[mine])
            loss = ((out - y[mine]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            offset += len(batch)
            samples += len(batch)
            step += 1
            write(event="step", epoch=epoch, samples=samples, step=step, loss=float(loss.detach()))
        epoch, offset = epoch + 1, 0
        if rank == 0:
            save(args.checkpoint, state())
        write(event="epoch", epoch=epoch, samples=samples, step=step)
    if rank == 0 and args.results is not None:
        args.results.write_text(json.dumps({"epochs": epoch, "samples": samples, "step": step,
                                            "checksum": checksum(model)}))
    write(event="done", epoch=epoch, samples=samples, step=step)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

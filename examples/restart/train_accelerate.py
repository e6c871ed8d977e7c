"""A Hugging Face Accelerate training script with its own checkpointing (no malletrain in it).

Written the way Accelerate users write them: ``accelerator.prepare`` the model and
optimiser, ``accelerator.save_state`` / ``load_state`` for the checkpoint (its progress
registered with ``register_for_checkpointing``), and on SIGUSR1 or SIGTERM (the batch system
asking it to stop) save at the next step and exit; every process learns of a stop request
at the same step (one reduce of a flag per step). The same MLP and synthetic data as
``train_ddp.py``, so the launchers can be compared on one model.

Run by hand (``--multi_gpu`` is Accelerate's torchrun launcher; on CPU nodes the processes
join over gloo)::

    accelerate launch --multi_gpu --num_processes 2 examples/restart/train_accelerate.py \\
        --epochs 3 --checkpoint /tmp/ckpt --jsonl /tmp/train.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--dataset-size", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16, help="samples per process per step")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step")
    ap.add_argument("--checkpoint", type=Path, required=True, help="a directory")
    ap.add_argument("--jsonl", type=Path, default=None, help="JSON lines of the main process")
    ap.add_argument("--results", type=Path, default=None, help="written at the end")
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


class Progress:
    """Where training is, saved with the checkpoint (``register_for_checkpointing``)."""

    def __init__(self) -> None:
        self.epoch = self.offset = self.samples = self.step = 0

    def state_dict(self) -> dict[str, int]:
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, int]) -> None:
        vars(self).update(state)


def checksum(model: nn.Module) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def save(acc: Accelerator, path: Path) -> None:
    """``save_state`` into a new directory, then swapped in: a stop in the middle of a
    save leaves the previous checkpoint whole (``.old`` while the swap runs)."""
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    acc.save_state(str(tmp))
    acc.wait_for_everyone()
    if acc.is_main_process:
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()


def resume(acc: Accelerator, path: Path) -> None:
    for candidate in (path, path.with_name(path.name + ".old")):
        if candidate.is_dir():
            acc.load_state(str(candidate))
            return


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    Stop.install()
    torch.set_num_threads(1)
    acc = Accelerator(cpu=not torch.cuda.is_available())
    rank, world = acc.process_index, acc.num_processes
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(args.dataset_size, args.dim, generator=g)
    w = torch.randn(args.dim, args.dim, generator=g) / args.dim**0.5
    y = torch.tanh(x @ w) + 0.05 * torch.randn(args.dataset_size, args.dim, generator=g)
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(args.dim, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.dim))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, opt = acc.prepare(model, opt)
    p = Progress()
    acc.register_for_checkpointing(p)
    resume(acc, args.checkpoint)
    log = (open(args.jsonl, "a", buffering=1)  # noqa: SIM115
           if args.jsonl and acc.is_main_process else None)

    def write(**record: object) -> None:
        if log is not None:
            log.write(json.dumps(dict(record, t=time.time(), world=world)) + "\n")

    write(event="start", epoch=p.epoch, samples=p.samples, step=p.step,
          checksum=checksum(acc.unwrap_model(model)))
    while p.epoch < args.epochs:
        order = torch.randperm(args.dataset_size,
                               generator=torch.Generator().manual_seed(p.epoch))
        while p.offset < args.dataset_size:
            flag = acc.reduce(torch.tensor([1.0 if Stop.requested else 0.0]), "sum")
            if flag.item() > 0:  # some process was asked to stop: all save at this step
                save(acc, args.checkpoint)
                write(event="stopped", epoch=p.epoch, samples=p.samples, step=p.step)
                acc.end_training()
                return 0
            batch = order[p.offset:p.offset + args.batch * world]
            mine = batch[rank::world]
            loss = ((model(x[mine]) - y[mine]) ** 2).mean()
            opt.zero_grad()
            acc.backward(loss)
            opt.step()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            p.offset += len(batch)
            p.samples += len(batch)
            p.step += 1
            write(event="step", epoch=p.epoch, samples=p.samples, step=p.step,
                  loss=float(loss.detach()))
        p.epoch, p.offset = p.epoch + 1, 0
        save(acc, args.checkpoint)
        write(event="epoch", epoch=p.epoch, samples=p.samples, step=p.step)
    if acc.is_main_process and args.results is not None:
        args.results.write_text(json.dumps({
            "epochs": p.epoch, "samples": p.samples, "step": p.step,
            "checksum": checksum(acc.unwrap_model(model))}))
    write(event="done", epoch=p.epoch, samples=p.samples, step=p.step)
    acc.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())

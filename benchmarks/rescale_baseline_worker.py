"""The classic elastic worker for the baseline of benchmarks/rescale.py.

What a torchrun-elastic user writes today: torchrun (re)starts this script on every membership
change; it initializes the process group from torchrun's env, reloads the last checkpoint
written with ``torch.save`` to local disk, wraps DDP (which broadcasts rank 0's parameters) and
trains; rank 0 writes a checkpoint every ``--ckpt-every`` steps (atomic rename).
Same model, data and optimizer as examples/elastic_train.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    t_start = time.time()
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=12288)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ckpt", type=Path, required=True)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--jsonl", type=Path, required=True)
    ap.add_argument("--max-steps", type=int, default=10_000)
    ap.add_argument("--device", default="cpu", help="cpu or cuda:N (gloo with CUDA tensors)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.dim, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.dim)).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.001 * world, momentum=0.9)
    step = 0
    load_s = 0.0
    if args.ckpt.exists():
        t0 = time.time()
        state = torch.load(args.ckpt, map_location=args.device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        for g in opt.param_groups:
            g["lr"] = 0.001 * world
        step = int(state["step"])
        load_s = time.time() - t0
    ddp = DistributedDataParallel(model)
    g = torch.Generator().manual_seed(rank)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    with open(args.jsonl, "a", buffering=1) as log:
        log.write(json.dumps({"event": "start", "rank": rank, "ws": world, "step": step,
                              "load_s": load_s, "t": t_start, "restart": restart}) + "\n")
        while step < args.max_steps:
            t0 = time.time()
            x = torch.randn(args.batch, args.dim, generator=g).to(args.device)
            loss = (ddp(x) - x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            log.write(json.dumps({"event": "step", "rank": rank, "ws": world, "step": step,
                                  "t0": t0, "t": time.time(), "restart": restart}) + "\n")
            if rank == 0 and step % args.ckpt_every == 0:
                tmp = args.ckpt.with_name(args.ckpt.name + ".tmp")
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "step": step}, tmp)
                os.replace(tmp, args.ckpt)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

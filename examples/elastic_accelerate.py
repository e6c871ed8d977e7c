"""A Hugging Face Accelerate training loop made elastic in process (native mode).

The loop is Accelerate's (``Accelerator``, ``accelerator.autocast``, ``accelerator.backward``,
``accelerator.gather``, ``is_main_process``); :class:`malletrain.elastic.AcceleratedJob`
gives it its steps and re-forms the group when malletrain grows or shrinks the job, without
restarting the surviving processes or writing a checkpoint. The model, data and log are
those of ``examples/elastic_train.py``, so the two can be compared step for step.

Submit it like any native job (``malletrain submit --nodes 1-4 --launcher torchrun
examples/elastic_accelerate.py --total-samples 20000``); by hand, as
``examples/elastic_train.py`` shows.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from elastic_train import JsonLog, checksum, make_dataset, parse_args
from torch import nn

from malletrain.elastic import AcceleratedJob, LinearScaling
from malletrain.errors import UserError


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    accelerator = Accelerator(cpu=args.device == "cpu")
    x, y = (t.to(accelerator.device)
            for t in make_dataset(args.dataset_size, args.dim, args.data_seed))
    model = nn.Sequential(nn.Linear(args.dim, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.dim)).to(accelerator.device)
    optimizer = accelerator.prepare_optimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9))
    try:
        job = AcceleratedJob(accelerator, model, optimizer, dataset_size=args.dataset_size,
                             rule=LinearScaling(per_rank_batch=args.batch, base_lr=args.lr),
                             seed=args.seed, total_samples=args.total_samples)
    except UserError as exc:
        print(f"elastic_accelerate: error: {exc}", file=sys.stderr)
        return exc.exit_code
    out = JsonLog(Path(args.jsonl.replace("{local_rank}", os.environ.get("LOCAL_RANK", "0")))
                  if args.jsonl else None)
    out.write(event="start", pid=os.getpid(), member=job.member_id)
    for step in job.steps():
        if step.first_of_epoch:
            out.write(event="epoch", epoch=step.epoch, rank=step.rank, ws=step.world_size,
                      step=step.index, samples_total=job.samples_total,
                      checksum=checksum(model), reconfig=job.last_reconfig)
        with step, accelerator.autocast():
            idx = torch.from_numpy(step.indices).to(accelerator.device)
            # summed over this rank's samples over the mean share: DDP's average of the
            # gradients is then the mean over the global batch, however it was split
            share = step.global_count / step.world_size
            loss = ((job.model(x[idx]) - y[idx]) ** 2).sum() / max(share, 1e-9)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            # Accelerate's own collective, at this membership's size
            seen = accelerator.gather(torch.tensor([len(idx)], device=accelerator.device))
            if args.step_sleep:
                time.sleep(args.step_sleep)
        if not step.failed:
            out.write(event="step", step=step.index, epoch=step.epoch, rank=step.rank,
                      ws=step.world_size, n=step.global_count, loss=float(loss.detach()),
                      t0=step.started_at_s, acc_rank=accelerator.process_index,
                      acc_ws=accelerator.num_processes, acc_main=accelerator.is_main_process,
                      gathered=int(seen.sum()), gathered_from=int(seen.numel()))
    out.write(event="exit", reason=str(job.exit_reason), step=job.step,
              samples_total=job.samples_total, checksum=checksum(model), rank=job.rank,
              reconfig=job.last_reconfig)
    return 1 if job.exit_reason == "state_lost" else 0


if __name__ == "__main__":
    sys.exit(main())

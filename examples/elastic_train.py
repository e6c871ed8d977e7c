"""A complete elastic training script: an MLP regressor on a synthetic dataset.

Run by hand on one machine (CPU, gloo)::

    malletrain coordinator --open --port 29400 --key-file ~/.mt.key &   # the membership store
    export MALLETRAIN_JOB_SECRET=$(malletrain coordinator --key-file ~/.mt.key --job-secret demo)
    for m in m0 m1; do
      MALLETRAIN_COORDINATOR=127.0.0.1:29400 MALLETRAIN_JOB_ID=demo MALLETRAIN_MEMBER_ID=$m \\
      MALLETRAIN_STATE_DIR=/tmp/demo-state \\
      torchrun --standalone --nnodes=1 --nproc-per-node=1 examples/elastic_train.py \\
          --total-samples 20000 --results /tmp/demo-results.json &
    done
    python -c "from malletrain.elastic.coordinator.handle import Coordinator as C; \\
               from malletrain.elastic.coordinator.keyfile import read_key; \\
               from pathlib import Path; \\
               k = read_key(Path.home() / '.mt.key'); \\
               print(C.attach('127.0.0.1:29400', k).publish('demo', ['m0', 'm1']))"

Under the daemon, each Slurm slot job runs the same torchrun line with the env set for it.
The job stops after EXACTLY ``--total-samples`` samples; global rank 0 writes them to
``--results`` (and the coordinator's final progress report / finish record).

The dataset is synthetic (no downloads): ``y = tanh(x @ W)`` plus noise, for a fixed
``--data-seed``, generated identically in every process.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

from malletrain.elastic import ElasticJob, LinearScaling, SlowLinkCompression, Step
from malletrain.errors import UserError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--total-samples", type=int, default=None,
                    help="stop after exactly this many samples (default: run until removed)")
    ap.add_argument("--dataset-size", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=32, help="input and output width")
    ap.add_argument("--hidden", type=int, default=64, help="hidden width of the MLP")
    ap.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    ap.add_argument("--lr", type=float, default=0.01, help="learning rate at world size 1")
    ap.add_argument("--seed", type=int, default=0, help="model init and data order seed")
    ap.add_argument("--data-seed", type=int, default=1234)
    ap.add_argument("--step-sleep", type=float, default=0.0,
                    help="extra seconds per step (to slow a tiny model down in tests)")
    ap.add_argument("--jsonl", default=None,
                    help="JSON-lines log of this process (one record per step and event); "
                         "'{local_rank}' in the path is replaced (torchrun, K > 1)")
    ap.add_argument("--device", default="cpu",
                    help="cpu, or cuda (this process's GPU: cuda:LOCAL_RANK)")
    ap.add_argument("--stall-at-step", type=int, default=None,
                    help="fault injection: stall once, inside step N, after its collectives")
    ap.add_argument("--stall-s", type=float, default=0.0, help="how long the stall lasts")
    ap.add_argument("--log-indices", action="store_true",
                    help="also log the sample indices of every committed step")
    ap.add_argument("--compress-below-mbit", type=float, default=None,
                    help="PowerSGD on a group whose all-reduce measures below this many "
                         "Mbit/s (malletrain.elastic.training.compress; default: never)")
    ap.add_argument("--compress-rank", type=int, default=32,
                    help="PowerSGD's approximation rank")
    ap.add_argument("--results", type=Path, default=None,
                    help="JSON file global rank 0 writes when the job finishes")
    return ap.parse_args(argv)


def make_dataset(n: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    w = torch.randn(dim, dim, generator=g) / dim**0.5
    y = torch.tanh(x @ w) + 0.05 * torch.randn(n, dim, generator=g)
    return x, y


def checksum(model: nn.Module) -> str:
    """Exact fingerprint of the parameters: equal on every replica iff they are identical."""
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class JsonLog:
    def __init__(self, path: Path | None) -> None:
        self.f = open(path, "a", buffering=1) if path else None  # noqa: SIM115 (lives all run)

    def write(self, **record: object) -> None:
        if self.f is not None:
            self.f.write(json.dumps(dict(record, t=time.time())) + "\n")


def train_step(job: ElasticJob, step: Step, x: torch.Tensor, y: torch.Tensor,
               opt: torch.optim.Optimizer) -> float:
    idx = torch.from_numpy(step.indices).to(x.device)
    out = job.model(x[idx])
    # Sum over this rank's samples, divided by the mean share: DDP averages the gradients
    # over ranks, so the update is exactly the mean over the global batch even when the
    # last step is split unevenly (or gives this rank no sample at all).
    share = step.global_count / step.world_size
    loss = ((out - y[idx]) ** 2).sum() / max(share, 1e-9)
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
    return float(loss.detach()) / max(len(idx), 1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=os.environ.get("MALLETRAIN_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    x, y = (t.to(device) for t in make_dataset(args.dataset_size, args.dim, args.data_seed))
    model = nn.Sequential(nn.Linear(args.dim, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.dim)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    compression = None
    if args.compress_below_mbit is not None:
        compression = SlowLinkCompression(below_mbit_s=args.compress_below_mbit,
                                          rank=args.compress_rank)
    try:
        job = ElasticJob(model, opt, dataset_size=args.dataset_size,
                         rule=LinearScaling(per_rank_batch=args.batch, base_lr=args.lr),
                         seed=args.seed, total_samples=args.total_samples, device=device,
                         compression=compression)
    except UserError as exc:  # e.g. a missing MALLETRAIN_* variable: one line, no traceback
        print(f"elastic_train: error: {exc}", file=sys.stderr)
        return exc.exit_code
    log_path = None
    if args.jsonl:
        log_path = Path(args.jsonl.replace("{local_rank}", os.environ.get("LOCAL_RANK", "0")))
    out = JsonLog(log_path)
    out.write(event="start", pid=os.getpid(), member=job.member_id)
    try:
        for step in job.steps():
            if step.first_of_epoch:
                out.write(event="epoch", epoch=step.epoch, rank=step.rank, ws=step.world_size,
                          step=step.index, samples_total=job.samples_total,
                          checksum=checksum(model), reconfig=job.last_reconfig)
            with step:
                loss = train_step(job, step, x, y, opt)
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                if step.index == args.stall_at_step and args.stall_s > 0:
                    time.sleep(args.stall_s)  # a hung step: the watcher aborts the group
                    args.stall_s = 0.0
            if not step.failed:
                record: dict[str, object] = dict(
                    event="step", step=step.index, epoch=step.epoch, rank=step.rank,
                    ws=step.world_size, n=step.global_count, loss=loss, t0=step.started_at_s)
                if args.log_indices:
                    record["indices"] = step.indices.tolist()
                if compression is not None:
                    record["compressed"] = job.compression.on
                    record["link_mbit_s"] = job.compression.measured_mbit_s
                out.write(**record)
            else:
                out.write(event="failed_step", step=step.index, epoch=step.epoch,
                          error=str(step.error)[:200])
    except UserError as exc:  # e.g. the coordinator cannot be reached: one line
        print(f"elastic_train: error: {exc}", file=sys.stderr)
        return exc.exit_code
    # diagnostics: if this process is still alive 10 s from now, print every thread's stack
    faulthandler.dump_traceback_later(10, exit=False)
    with torch.no_grad():  # the model's loss over the whole data set, as trained
        full_loss = float(((model(x) - y) ** 2).mean())
    out.write(event="exit", reason=str(job.exit_reason), step=job.step,
              samples_total=job.samples_total, checksum=checksum(model), rank=job.rank,
              reconfig=job.last_reconfig, full_loss=full_loss)
    if args.results is not None and job.rank == 0 and job.exit_reason == "finished":
        tmp = args.results.with_name(args.results.name + ".tmp")
        tmp.write_text(json.dumps({"samples_total": job.samples_total, "step": job.step,
                                   "checksum": checksum(model)}))
        tmp.replace(args.results)
    return 1 if job.exit_reason == "state_lost" else 0


if __name__ == "__main__":
    sys.exit(main())

"""Hugging Face Accelerate in native mode: an Accelerate loop rescaled in process.

Usage (``examples/elastic_accelerate.py`` is a complete script)::

    accelerator = Accelerator()                      # mixed_precision=..., as usual
    model = model.to(accelerator.device)             # not prepare()d: the job wraps it
    optimizer = accelerator.prepare_optimizer(optimizer)   # optional (fp16's GradScaler)
    job = AcceleratedJob(accelerator, model, optimizer, dataset_size=len(dataset),
                         rule=LinearScaling(per_rank_batch=32, base_lr=0.01),
                         total_samples=args.total_samples)
    for step in job.steps():
        with step, accelerator.autocast():
            x, y = dataset[step.indices]             # this rank's samples of this step
            loss = loss_fn(job.model(x), y)          # job.model: this membership's DDP
            accelerator.backward(loss)
            optimizer.step(); optimizer.zero_grad()

Everything :class:`~malletrain.elastic.worker.job.ElasticJob` does (the group across the job's
node slots, re-formed at every grow and shrink without restarting the survivors or writing a
checkpoint; newcomers get the state from the freshest replica) holds, and Accelerate follows
the membership: after each formation its shared state (``PartialState`` and
``AcceleratorState``) names this membership's rank and size, so ``num_processes``,
``process_index``, ``is_main_process``, ``gather``, ``reduce``, ``wait_for_everyone``,
``print`` and saving on the main process are right at every size. The process group
``Accelerator()`` formed over torchrun's node-local store is replaced by the job's.

What the adapter does not take (refused at construction, with the reason): a model already
wrapped for data parallelism (``accelerator.prepare(model)``: the job wraps it, and
re-wraps it at every membership), gradient accumulation above 1 (an ElasticJob step is one
optimizer step over the global batch), and DeepSpeed, FSDP, Megatron-LM or XLA plugins
(their state is sharded; the state transfer sends whole replicas).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from malletrain.elastic.training.rules import ScalingRule
from malletrain.elastic.worker.job import ElasticJob
from malletrain.elastic.worker.transfer import Stateful
from malletrain.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["AcceleratedJob"]

#: Accelerate's distributed types whose state is a whole replica per process
_REPLICATED = {"NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_MUSA",
               "MULTI_XPU", "MULTI_HPU", "MULTI_SDAA"}


class AcceleratedJob(ElasticJob):
    """An :class:`ElasticJob` whose Accelerate state follows the job's membership."""

    def __init__(self, accelerator: Any, model: torch.nn.Module, optimizer: Any, *,
                 dataset_size: int, rule: ScalingRule,
                 extra_state: Mapping[str, Stateful] | None = None, **kwargs: Any) -> None:
        _refuse_unsupported(accelerator, model)
        self.accelerator = accelerator
        #: what the loop calls ``step()`` on (an AcceleratedOptimizer steps fp16's scaler)
        self.loop_optimizer = optimizer
        raw = getattr(optimizer, "optimizer", optimizer)  # AcceleratedOptimizer wraps one
        state: dict[str, Stateful] = dict(extra_state or {})
        if accelerator.scaler is not None:  # fp16: the loss scale travels with the weights
            state.setdefault("accelerate_grad_scaler", accelerator.scaler)
        if dist.is_available() and dist.is_initialized():
            # Accelerator() formed a group over torchrun's node-local store; the job forms
            # its own across the slots, at every membership
            dist.destroy_process_group()
        kwargs.setdefault("device", accelerator.device)
        super().__init__(model, raw, dataset_size=dataset_size, rule=rule,
                         extra_state=state, **kwargs)

    def _on_formed(self) -> None:
        from accelerate.state import AcceleratorState, DistributedType, PartialState

        kind = (DistributedType.MULTI_GPU if self.device.type == "cuda"
                else DistributedType.MULTI_CPU)
        view = {"num_processes": self.world_size, "process_index": self.rank,
                "distributed_type": kind, "backend": self.backend}
        for shared in (PartialState._shared_state, AcceleratorState._shared_state):
            if shared:  # initialised by Accelerator(); updated in place (Accelerate's rule)
                shared.update(view)
        log.debug("Accelerate's state follows the membership: rank %d of %d", self.rank,
                  self.world_size)


def _refuse_unsupported(accelerator: Any, model: torch.nn.Module) -> None:
    kind = getattr(accelerator.distributed_type, "name", str(accelerator.distributed_type))
    if kind not in _REPLICATED:
        raise ConfigError(f"AcceleratedJob: Accelerate's {kind} shards the training state; "
                          "malletrain's native mode moves whole replicas (use restart mode: "
                          "docs/user-guide.md)")
    if accelerator.gradient_accumulation_steps != 1:
        raise ConfigError("AcceleratedJob: gradient_accumulation_steps must be 1 (one "
                          "elastic step is one optimizer step over the global batch; raise "
                          "the per-rank batch or the scaling rule's instead)")
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise ConfigError("AcceleratedJob: pass the model itself, not accelerator.prepare(model)"
                          ": the job wraps it for data parallelism at every membership")

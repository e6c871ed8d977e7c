"""Values in each job's own work: rates divided by its one-node rate (``PolicyOptions.
work_units``). Samples of different models do not add up, and in samples a model with a high
rate per node would outbid every other. Pure."""

from __future__ import annotations

from dataclasses import replace

from malletrain.core.model import AllocationInput


def in_work_units(inp: AllocationInput) -> AllocationInput:
    """``inp`` with each job's rates (and remaining samples) divided by its one-node rate.

    Every value the policy forms is linear in the job's rate (throughput over a window,
    rescale losses, finish weights), so this changes units, not the model: the plan
    maximises node-seconds of useful work. A job whose model gives no one-node rate is
    left in samples.
    """
    jobs = []
    for job in inp.jobs:
        # one unit per job across its node types: its best one-node rate on any of them
        unit = max([m.rate(1) for m in job.type_throughput.values()] + [job.throughput.rate(1)])
        if unit <= 0:
            jobs.append(job)
            continue
        left = None if job.remaining_samples is None else job.remaining_samples / unit
        target = None if job.rate_target is None else job.rate_target / unit
        by_type = {t: m.scaled(1.0 / unit) for t, m in job.type_throughput.items()}
        jobs.append(replace(job, throughput=job.throughput.scaled(1.0 / unit),
                            remaining_samples=left, type_throughput=by_type,
                            rate_target=target))
    return replace(inp, jobs=tuple(jobs))

"""A job array as malleable jobs: one spec per task, as ``malletrain submit`` sends them.

Slurm makes an array one job record with many tasks; malletrain makes each task a
malleable job of its own (each with its own node slots and its own share of the idle
nodes), named after the first: task ``i`` carries ``array_job_id`` = the first task's job
number, so its batch shell sees the ``SLURM_ARRAY_JOB_ID`` and ``%A`` Slurm would give it.
A throttle ``%K`` becomes a dependency: task ``i`` waits for the end (``afterany``) of task
``i - K``, so that at most K tasks hold nodes at once. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from malletrain.daemon.jobs.spec import JobSpec, SpecError
from malletrain.elastic.restart.arrays import parse_array
from malletrain.elastic.restart.generation import job_number


def task_count(spec: JobSpec) -> int:
    """How many jobs ``spec`` submits: its array's tasks, or 1."""
    return len(parse_array(spec.array).task_ids) if spec.array else 1


def task_spec(spec: JobSpec, index: int, submitted: Sequence[str]) -> JobSpec:
    """The spec of the array's ``index``-th task, given the job ids of the tasks before it."""
    if spec.array is None:
        return spec
    array = parse_array(spec.array)
    deps = [spec.dependency] if spec.dependency else []
    if array.throttle is not None and index >= array.throttle:
        if spec.dependency and "?" in spec.dependency:
            raise SpecError(f"--array={spec.array} with a throttle cannot be combined with "
                            f"a '?' (any) dependency: {spec.dependency}")
        deps.append(f"afterany:{submitted[index - array.throttle]}")
    return replace(spec, array_task_id=array.task_ids[index],
                   array_job_id=job_number(submitted[0]) if submitted else None,
                   dependency=",".join(deps) or None)

"""sbatch's job arrays: ``--array=0-15:2%4`` read as Slurm reads it, and the variables each
task's batch shell gets. Pure.

A malleable job array is one malleable job per task, all submitted at once; task ``i``'s
batch shell sees ``SLURM_ARRAY_JOB_ID`` (the first task's job number, as Slurm names the
array after its first job), ``SLURM_ARRAY_TASK_ID`` and the array's count, min, max and
step, and sbatch's ``%A``/``%a`` name its output. ``%K`` (at most K tasks at once) is kept
by making each task wait for the end of the task K places before it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise

#: Slurm's default MaxArraySize is 1001 (task ids 0-1000); a bigger array is refused here too
MAX_TASK_ID = 1000
MAX_TASKS = 256  # each task is a malleable job with its own node slots
_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


class ArrayError(ValueError):
    """An ``--array`` expression Slurm would refuse, or one too big for malletrain."""


@dataclass(frozen=True)
class ArraySpec:
    """An array as sbatch reads ``--array``: its task ids, in order, and its throttle."""

    task_ids: tuple[int, ...]
    throttle: int | None = None  # ``%K``: at most K tasks run at once

    @property
    def step(self) -> int:
        """``SLURM_ARRAY_TASK_STEP``: the stride of an evenly spaced array, else 1."""
        ids = self.task_ids
        steps = {b - a for a, b in pairwise(ids)}
        return steps.pop() if len(steps) == 1 else 1

    def env(self, task_id: int, array_job: int) -> dict[str, str]:
        """The ``SLURM_ARRAY_*`` variables of one task's batch shell."""
        return {"SLURM_ARRAY_JOB_ID": str(array_job), "SLURM_ARRAY_TASK_ID": str(task_id),
                "SLURM_ARRAY_TASK_COUNT": str(len(self.task_ids)),
                "SLURM_ARRAY_TASK_MIN": str(min(self.task_ids)),
                "SLURM_ARRAY_TASK_MAX": str(max(self.task_ids)),
                "SLURM_ARRAY_TASK_STEP": str(self.step)}


def parse_array(text: str) -> ArraySpec:
    """``0-15``, ``1,3,5``, ``0-15:4``, ``0-7%2`` -> the task ids and the throttle."""
    body, pct, limit = text.strip().partition("%")
    throttle = None
    if pct:
        if not limit.isdigit() or int(limit) < 1:
            raise ArrayError(f"--array={text}: %{limit} must be a positive task count")
        throttle = int(limit)
    ids: list[int] = []
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise ArrayError(f"--array={text}: {part!r} is not N, N-M or N-M:S")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        stride = int(m.group(3)) if m.group(3) is not None else 1
        if last < first or stride < 1:
            raise ArrayError(f"--array={text}: {part!r} is an empty range")
        ids.extend(range(first, last + 1, stride))
    ids = sorted(set(ids))
    if ids[-1] > MAX_TASK_ID:
        raise ArrayError(f"--array={text}: task ids run to {ids[-1]}; Slurm's default "
                         f"MaxArraySize allows 0-{MAX_TASK_ID}")
    if len(ids) > MAX_TASKS:
        raise ArrayError(f"--array={text}: {len(ids)} tasks; a malleable job array holds at "
                         f"most {MAX_TASKS} (each task is a job with its own node slots)")
    return ArraySpec(tuple(ids), throttle)


def array_env_text(spec: ArraySpec, task_id: int, array_job: int) -> str:
    """What a node slot passes its agent: ``JOB:TASK:COUNT:MIN:MAX:STEP``."""
    e = spec.env(task_id, array_job)
    return ":".join(e[k] for k in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
                                   "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN",
                                   "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP"))


def env_from_text(text: str) -> dict[str, str]:
    """:func:`array_env_text`'s string -> the ``SLURM_ARRAY_*`` variables ({} if none)."""
    parts = text.split(":") if text else []
    if len(parts) != 6 or not all(p.isdigit() for p in parts):
        return {}
    keys = ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT",
            "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP")
    return dict(zip(keys, parts, strict=True))

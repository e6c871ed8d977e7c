"""Where a generation's batch shell writes: the user's ``--output``/``--error``, as sbatch
names them, appended across generations with a line at each size change."""

from __future__ import annotations

import os
import pwd
import re
import time
from dataclasses import dataclass

_PATTERN = re.compile(r"%(%|\d*[AajxuNnst])")


@dataclass(frozen=True)
class BatchIO:
    """The job's own naming, from its spec."""

    job_name: str
    submit_dir: str
    output: str | None = None  # sbatch's --output pattern; None: slurm-%j.out
    error: str | None = None  # --error; None: with the output
    #: a task of a job array: (SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID), for %A and %a
    array: tuple[int, int] | None = None


def expand(pattern: str, job_number: int, name: str, first_node: str, user: str,
           array: tuple[int, int] | None = None) -> str:
    """sbatch's filename pattern: %j (job id), %A and %a (the array's job id and the task's
    id; outside an array the job id and 4294967294, as sbatch), %x (name), %u (user), %N
    (first node), %n %t (node and task 0), %s (the batch step), %% (a %); a number after %
    zero-pads (``%8j``)."""
    array_job, task = array or (job_number, 4294967294)

    def one(m: re.Match[str]) -> str:
        token = m.group(1)
        if token == "%":
            return "%"
        width, code = token[:-1], token[-1]
        value = {"j": str(job_number), "A": str(array_job), "a": str(task),
                 "x": name, "u": user, "N": first_node, "n": "0", "t": "0",
                 "s": "batch"}[code]
        return value.zfill(int(width)) if width and code in "jAant" else value
    return _PATTERN.sub(one, pattern)


def open_streams(io: BatchIO, job_number: int, first_node: str) -> tuple[int, int]:
    """File descriptors for the batch shell's stdout and stderr (appending, 0644 as
    sbatch creates them under the usual umask; never through a final symlink of someone
    else's making: O_NOFOLLOW)."""
    user = pwd.getpwuid(os.getuid()).pw_name
    fds: list[tuple[int, str]] = []
    for pattern in (io.output or "slurm-%j.out", io.error or io.output or "slurm-%j.out"):
        path = expand(pattern, job_number, io.job_name, first_node, user, io.array)
        if not path.startswith("/"):
            path = os.path.join(io.submit_dir, path)
        if fds and path == fds[0][1]:
            fds.append((os.dup(fds[0][0]), path))
            continue
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        fds.append((fd, path))
    return fds[0][0], fds[1][0]


def size_line(job_id: str, epoch: int, nodelist: str, count: int) -> bytes:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    return (f"malletrain: {stamp} job {job_id}: generation {epoch} starts on {count} "
            f"node(s): {nodelist}\n").encode()

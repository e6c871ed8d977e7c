"""The plain job list of Slurm 23.02+ (:data:`~malletrain.slurm.versions.JOBS_PLAIN`).

One line per job, ``|``-separated, of fields Slurm or the site writes (never a name or a
comment, which users control), so a line cannot be forged by a job and a ``|`` or a
newline never appears inside a field. Lines of any other shape are refused one by one
(a warning each); several odd lines in a row mean the format changed, which fails the
answer rather than reading a centre's queue half-way.
"""

from __future__ import annotations

import logging

from malletrain.core.cluster import Job, JobState
from malletrain.slurm.errors import SlurmParseError
from malletrain.slurm.hostlist import expand_hostlist
from malletrain.slurm.parse_json import job_state
from malletrain.slurm.parse_text import duration_s, slurm_time
from malletrain.slurm.versions import JOB_FIELDS

log = logging.getLogger(__name__)

#: Odd lines tolerated (each a warning) before the whole answer is refused.
MAX_ODD_LINES = 20
_NULL = ("", "(null)", "N/A")


def parse_jobs_plain(text: str, warnings: list[str] | None = None) -> tuple[Job, ...]:
    """Jobs from the plain list; pending jobs carry their plan (start, nodes) of one pass."""
    warns = warnings if warnings is not None else []
    jobs: list[Job] = []
    odd = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            jobs.append(_job(line))
        except (ValueError, SlurmParseError) as exc:
            odd += 1
            warns.append(f"squeue job list: {exc}; line {line[:80]!r} skipped")
            if odd > MAX_ODD_LINES:
                raise SlurmParseError(
                    f"squeue job list: more than {MAX_ODD_LINES} lines not of the form "
                    f"{'|'.join(JOB_FIELDS)!r} (first: {warns[-odd]})"
                ) from None
    return tuple(jobs)


def _job(line: str) -> Job:
    parts = line.split("|")
    if len(parts) != len(JOB_FIELDS):
        raise ValueError(f"{len(parts)} fields, not {len(JOB_FIELDS)}")
    job_id, state_name, count, limit, start, end, submit, user, partition, nodes, plan = parts
    if not job_id.isdigit() or int(job_id) <= 0:
        raise ValueError(f"job id {job_id!r} is not a number")
    state = job_state(state_name)
    if state is None:
        raise ValueError(f"job {job_id}: unknown state {state_name!r}")
    planned = () if state is not JobState.PENDING or plan in _NULL else expand_hostlist(plan)
    return Job(
        job_id=int(job_id),
        name="",
        user=user,
        partition=partition,
        state=state,
        node_count=int(count) if count.isdigit() else 0,
        nodes=() if nodes in _NULL else expand_hostlist(nodes),
        planned_nodes=planned,
        time_limit_s=duration_s(limit) if limit not in ("INVALID", "NOT_SET") else None,
        submit_time=slurm_time(submit),
        start_time=slurm_time(start),
        end_time=slurm_time(end),
    )

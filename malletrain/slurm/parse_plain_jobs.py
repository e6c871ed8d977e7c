"""The daemon's job list (:data:`~malletrain.slurm.versions.JOBS_PLAIN`), any release.

Each record is ``TOKEN`` + the ``|``-separated fields Slurm or the site writes + ``TOKEN``
+ the job's name + ``TOKEN`` + its comment + a newline, where ``TOKEN`` is random and new
for every call. A name or a comment may hold anything, newlines and ``|`` included (users
write them), but not the token, so splitting at the token gives back every record whole:
no user can forge, split or hide another's record. The Slurm-written fields never hold
``|`` or a newline. A record of any other shape is skipped with a warning; more than a few
mean the format changed, which fails the answer rather than reading a queue half-way.
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

#: Odd records tolerated (each a warning) before the whole answer is refused.
MAX_ODD_RECORDS = 20
_NULL = ("", "(null)", "N/A")


def parse_jobs_plain(text: str, token: str, warnings: list[str] | None = None
                     ) -> tuple[Job, ...]:
    """Jobs from one call's job list; pending jobs carry their plan (start, nodes)."""
    warns = warnings if warnings is not None else []
    if not text.strip():
        return ()
    if len(token) < 16 or not text.startswith(token):
        raise SlurmParseError(
            "squeue job list: the answer does not start with this call's token "
            f"(is SQUEUE_FORMAT honoured?): {text[:60]!r}")
    parts = text.split(token)[1:]
    if len(parts) % 3:
        raise SlurmParseError(f"squeue job list: {len(parts)} fields between tokens, "
                              "not a multiple of 3 (name, comment)")
    jobs: list[Job] = []
    odd = 0
    for i in range(0, len(parts), 3):
        safe, name, comment = parts[i], parts[i + 1], parts[i + 2].removesuffix("\n")
        try:
            jobs.append(_job(safe, name, "" if comment == "(null)" else comment, warns))
        except (ValueError, SlurmParseError) as exc:
            odd += 1
            warns.append(f"squeue job list: {exc}; record {safe[:80]!r} skipped")
            if odd > MAX_ODD_RECORDS:
                raise SlurmParseError(
                    f"squeue job list: more than {MAX_ODD_RECORDS} records not of the form "
                    f"{'|'.join(JOB_FIELDS)!r} (first: {warns[-odd]})"
                ) from None
    return tuple(jobs)


def _job(safe: str, name: str, comment: str, warns: list[str]) -> Job:
    parts = safe.split("|")
    if len(parts) != len(JOB_FIELDS) or "\n" in safe:
        raise ValueError(f"{len(parts)} fields, not {len(JOB_FIELDS)}")
    job_id, state_name, count, limit, start, end, submit, user, partition, nodes, plan, \
        reason = parts
    if not job_id.isdigit() or int(job_id) <= 0:
        raise ValueError(f"job id {job_id!r} is not a number")
    state = job_state(state_name)
    if state is None:  # a newer Slurm's state: kept, never dropped (its plan still claims)
        warns.append(f"squeue job list: job {job_id}: unknown state {state_name!r}; "
                     "treated as UNKNOWN")
        state = JobState.UNKNOWN
    planned = (() if state not in (JobState.PENDING, JobState.UNKNOWN) or plan in _NULL
               else expand_hostlist(plan))
    time_limit_s = duration_s(limit) if limit not in ("INVALID", "NOT_SET") else None
    return Job(
        job_id=int(job_id),
        name=name,
        user=user,
        partition=partition,
        state=state,
        state_reason=reason,
        node_count=int(count) if count.isdigit() else 0,
        nodes=() if nodes in _NULL else expand_hostlist(nodes),
        planned_nodes=planned,
        time_limit_s=time_limit_s,
        submit_time=slurm_time(submit),
        start_time=slurm_time(start),
        end_time=None if time_limit_s is None else slurm_time(end),
        comment=comment,
    )

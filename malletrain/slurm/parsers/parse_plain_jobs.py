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
from malletrain.slurm.parsers.parse_json import job_state
from malletrain.slurm.parsers.parse_text import duration_s, slurm_time
from malletrain.slurm.versions import JOB_FIELDS

log = logging.getLogger(__name__)

#: Odd records tolerated (each a warning) before the whole answer is refused.
MAX_ODD_RECORDS = 20
_NULL = ("", "(null)", "N/A")


class RecordMemo:
    """The job each record of the last list became, to skip the records seen again.

    Most of a queue is unchanged from one tick to the next, and a record that is the same
    text is the same :class:`Job` (frozen; no clock is read): at 2,500 jobs, parsing every
    record cost the daemon ~0.1 s a tick (``benchmarks/load.py``). Only the records of the
    last list are kept, so the memo is never bigger than one queue. Its values are keyed by
    the exact text, so parses that overlap (none do in the daemon) only lose hits.
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, str, str], Job] = {}
        self._next: dict[tuple[str, str, str], Job] = {}

    def start(self) -> None:
        self._next = {}

    def get(self, key: tuple[str, str, str]) -> Job | None:
        job = self._last.get(key)
        if job is not None:
            self._next[key] = job
        return job

    def put(self, key: tuple[str, str, str], job: Job) -> None:
        self._next[key] = job

    def done(self) -> None:
        self._last, self._next = self._next, {}


def parse_jobs_plain(text: str, token: str, warnings: list[str] | None = None,
                     memo: RecordMemo | None = None) -> tuple[Job, ...]:
    """Jobs from one call's job list; pending jobs carry their plan (start, nodes).

    With ``memo`` (the daemon's tick), records unchanged since the last list are not
    parsed again.
    """
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
    if memo is not None:
        memo.start()
    for i in range(0, len(parts), 3):
        safe, name, comment = parts[i], parts[i + 1], parts[i + 2].removesuffix("\n")
        key = (safe, name, comment)
        known = memo.get(key) if memo is not None else None
        if known is not None:
            jobs.append(known)
            continue
        try:
            n_warns = len(warns)
            job = _job(safe, name, "" if comment == "(null)" else comment, warns)
            jobs.append(job)
            if memo is not None and len(warns) == n_warns:  # warned again on every list
                memo.put(key, job)
        except (ValueError, SlurmParseError) as exc:
            odd += 1
            warns.append(f"squeue job list: {exc}; record {safe[:80]!r} skipped")
            if odd > MAX_ODD_RECORDS:
                raise SlurmParseError(
                    f"squeue job list: more than {MAX_ODD_RECORDS} records not of the form "
                    f"{'|'.join(JOB_FIELDS)!r} (first: {warns[-odd]})"
                ) from None
    if memo is not None:
        memo.done()
    return tuple(jobs)


def _job(safe: str, name: str, comment: str, warns: list[str]) -> Job:
    parts = safe.split("|")
    if len(parts) != len(JOB_FIELDS) or "\n" in safe:
        raise ValueError(f"{len(parts)} fields, not {len(JOB_FIELDS)}")
    job_id, state_name, count, limit, start, end, submit, user, partition, nodes, plan, \
        reason, account, qos = parts
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
        account="" if account in _NULL else account,
        qos="" if qos in _NULL else qos,
    )

"""Users' requests on the submit channel: submit, attach, abort, cancel, jobs.

Each request comes with its sender's identity from ``SO_PEERCRED``
(:mod:`malletrain.daemon.submit.channel`); a user acts on their own jobs only (root on any).
Requests run on the channel's threads: they touch the store (SQLite, thread-safe), never
Slurm or the tick's own objects. An attach only records the slot job ids; the next tick
checks them against its snapshot (:mod:`malletrain.daemon.submit.submissions`).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from malletrain.core.accounting import SiteLimits
from malletrain.core.lifecycle import JobPhase
from malletrain.daemon.jobs.array_tasks import task_count
from malletrain.daemon.jobs.dependency import parse_dependency
from malletrain.daemon.jobs.spec import JobSpec, SpecError
from malletrain.daemon.jobs.store import JobRecord, Store
from malletrain.daemon.submit.channel import Peer
from malletrain.errors import PermanentError, RetryableError
from malletrain.ops.settings import Settings
from malletrain.slurm.privacy import Privacy

log = logging.getLogger(__name__)

#: Slurm job ids are 32-bit; a larger one would fail the whole batched lookup it joins
#: before each caller's retry alone isolates it.
MAX_SLURM_JOB_ID = 2**32
#: A submission counts against its user's ``limits.max_jobs_per_user`` (and the total) for
#: at least this long, even if it is aborted or fails at once: submit + abort in a loop is
#: then at most that many submissions a minute per user, whatever it costs the daemon
#: (a spec of up to 1 MiB decoded and written, its rows; issue 49).
SUBMISSION_HOLD_S = 60.0


@dataclass(frozen=True)
class JobRow:
    """One line of ``malletrain jobs``."""

    job_id: str
    user: str
    name: str
    state: str
    nodes: tuple[str, ...]
    #: members of the current membership (nodes actually training; <= len(nodes))
    members: int
    min_nodes: int
    max_nodes: int
    samples_total: int
    samples_per_s: float
    profile_points: int
    rescales_up: int
    rescales_down: int
    preemptions: int
    message: str
    #: the job's ``--rate-target`` in samples/s (None: none)
    rate_target: float | None = None
    #: why it has the nodes it has, as the last tick saw it (``daemon.tick.reasons``)
    reason: str = ""
    #: the nodes the job's user holds now, and the user's entitlement, by the last tick:
    #: the user's fair part of the nodes on offer under its limits (``tick.reasons``)
    user_nodes: int = 0
    user_entitled: int = 0
    #: the training code's last failure on a node (restart mode: the step that failed and
    #: why, e.g. ``srun: error: ...``); "" if none
    failure: str = ""


class RequestHandler:
    def __init__(self, settings: Settings, store: Store, *, coordinator: Any, state_dir: Path,
                 rows: Callable[[], list[JobRow]], wake: Callable[[], None],
                 privacy: Callable[[], Privacy] = Privacy,
                 site_limits: Callable[[], SiteLimits | None] = lambda: None) -> None:
        self.settings = settings  # replaced on reload
        self.store = store
        self.coordinator = coordinator
        self.state_dir = state_dir
        self.rows = rows
        self.wake = wake
        #: Slurm's PrivateData and operators (the daemon's cache; open by default in tests)
        self.privacy = privacy
        #: Slurm's associations and QOS as last read (``--qos`` is checked against them)
        self.site_limits = site_limits

    def handle(self, peer: Peer, req: Mapping[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "submit":
            return self._submit(peer, req)
        if op == "attach":
            return self._attach(peer, req)
        if op == "abort":
            return self._abort(peer, req)
        if op == "jobs":
            return {"jobs": [asdict(row) for row in self._visible_rows(peer)]}
        if op == "cancel":
            return self._cancel(peer, req)
        raise PermanentError(f"unknown request {op!r}")

    def _visible_rows(self, peer: Peer) -> list[JobRow]:
        """Every job, or only the caller's own where Slurm keeps jobs private."""
        rows = self.rows()
        if self.privacy().sees_all(peer.user, peer.uid):
            return rows
        return [row for row in rows if row.user == peer.user]

    def _submit(self, peer: Peer, req: Mapping[str, Any]) -> dict[str, Any]:
        spec = JobSpec.from_dict(req.get("spec"))
        self._check_limits(peer, spec)
        qos = self._check_qos(peer, spec)
        if spec.qos is not None and spec.qos != qos:  # the site's scavenger QOS holds
            spec = replace(spec, qos=qos)
        self._check_dependency(peer, spec)
        rec = self.store.create_job(peer.uid, peer.user, spec)
        log.info("job %s submitted by %s (uid %d): %s, %d-%d nodes", rec.job_id, peer.user,
                 peer.uid, spec.name, spec.min_nodes, spec.max_nodes)
        slurm = self.settings.slurm
        return {
            "job_id": rec.job_id,
            "coordinator": self.coordinator.address,
            # private to the submitting user: this answer goes to their socket only, then
            # into their slots' batch scripts (readable by them and Slurm's operators)
            "job_secret": self.coordinator.job_secret(rec.job_id, owner=peer.uid),
            "state_dir": str(self.state_dir),
            "partition": slurm.scavenger_partition,
            "qos": qos,
            "account": slurm.account,
        }

    def _check_qos(self, peer: Peer, spec: JobSpec) -> str | None:
        """The QOS the job's slots run under: the site's scavenger QOS, or the job's
        ``--qos`` where the user's association may use it (sbatch's own check)."""
        site = self.settings.slurm.qos
        if spec.qos is None or site is not None:
            # a site's scavenger QOS (slurm.qos) is what Slurm's preemption relies on: the
            # slots run under it whatever the script says (`malletrain submit` warns)
            return site
        limits = self.site_limits()
        why = limits.qos_refusal(peer.user, spec.account, spec.qos) if limits else None
        if why:
            raise SpecError(why)
        return spec.qos

    def _check_limits(self, peer: Peer, spec: JobSpec) -> None:
        lim = self.settings.limits
        if spec.max_nodes > lim.max_nodes_per_job:
            raise SpecError(f"--max-nodes {spec.max_nodes} is above this site's limit of "
                            f"{lim.max_nodes_per_job}")
        if lim.max_time_s is not None and (spec.time_limit_s is None
                                           or spec.time_limit_s > lim.max_time_s):
            raise SpecError(f"--time must be at most {lim.max_time_s:.0f} s at this site")
        since_s = time.time() - SUBMISSION_HOLD_S
        # an array's first task answers for the whole array (each task is a malleable job):
        # refused before any task is submitted, as sbatch refuses an array past MaxSubmitJobs
        tasks = task_count(spec) if spec.array and spec.array_job_id is None else 1
        if tasks > lim.max_jobs_per_user:
            raise SpecError(f"--array={spec.array} is {tasks} malleable jobs, more than one "
                            f"user may have at this site ({lim.max_jobs_per_user}, "
                            "limits.max_jobs_per_user): split it")
        have = self.store.count_jobs(peer.uid, since_s=since_s)
        if have + tasks > lim.max_jobs_per_user:
            raise RetryableError(
                f"you already have {have} malleable jobs, or submitted that many in the last "
                f"{SUBMISSION_HOLD_S:.0f} s; {tasks} more would pass limits.max_jobs_per_user "
                f"({lim.max_jobs_per_user}): wait for one to finish")
        if self.store.count_jobs(since_s=since_s) + tasks > lim.max_jobs_total:
            raise RetryableError("the daemon is full (limits.max_jobs_total); try later")

    def _check_dependency(self, peer: Peer, spec: JobSpec) -> None:
        """A dependency names the user's own malleable jobs: another user's job is as
        unknown as one that never was (``PrivateData=jobs``: no probing others' ids)."""
        if spec.dependency is None:
            return
        for job_id in parse_dependency(spec.dependency).job_ids:
            rec = self.store.job(job_id)
            if rec is None or (rec.uid != peer.uid and peer.uid != 0):
                raise SpecError(f"--dependency: no malleable job {job_id} of yours (as "
                                "sbatch, a job waits only for jobs the daemon knows)")

    def _own(self, peer: Peer, req: Mapping[str, Any]) -> JobRecord:
        job_id = req.get("job_id")
        if not isinstance(job_id, str) or len(job_id) > 64:
            raise PermanentError("job_id: expected a job id like m12")
        rec = self.store.job(job_id)
        if rec is None:
            raise PermanentError(f"no job {job_id}")
        if rec.uid != peer.uid and peer.uid != 0:
            raise PermanentError(f"job {job_id} belongs to {rec.user}, not to you")
        return rec

    def _attach(self, peer: Peer, req: Mapping[str, Any]) -> dict[str, Any]:
        """Record the slot job ids the user's ``malletrain submit`` made; the next tick checks
        them (module doc) and queues or fails the job. Sent again (its answer was lost),
        the same ids get the same answer."""
        rec = self._own(peer, req)
        if rec.uid != peer.uid:
            raise PermanentError("only the job's owner attaches its slot jobs")
        ids = req.get("slots")
        attached = [s.slurm_job_id for s in self.store.slots(rec.job_id)]
        if attached:
            if isinstance(ids, list) and ids == attached:
                return {"job_id": rec.job_id}
            raise PermanentError(f"job {rec.job_id} has its slot jobs attached already")
        if rec.state is not JobPhase.SUBMITTING:
            raise PermanentError(f"job {rec.job_id} is {rec.state.value}, not submitting")
        if (not isinstance(ids, list) or len(ids) != rec.spec.max_nodes
                or not all(isinstance(i, int) and not isinstance(i, bool)
                           and 0 < i < MAX_SLURM_JOB_ID for i in ids) or len(set(ids)) != len(ids)):
            raise PermanentError(f"slots: expected {rec.spec.max_nodes} distinct Slurm job ids")
        try:
            self.store.add_slots(rec.job_id, list(ids))
        except sqlite3.IntegrityError:
            # An id another job holds: this attach sent twice at once, or another user's
            # claim on the caller's slot job, which the tick's check lets go of (retried).
            if [s.slurm_job_id for s in self.store.slots(rec.job_id)] == ids:
                return {"job_id": rec.job_id}
            raise RetryableError("slots: a slot job id is attached to another job") from None
        log.info("job %s: %d slot jobs attached by %s, checked at the next tick", rec.job_id,
                 len(ids), peer.user)
        self.wake()
        return {"job_id": rec.job_id}

    def _abort(self, peer: Peer, req: Mapping[str, Any]) -> dict[str, Any]:
        rec = self._own(peer, req)
        if rec.state is JobPhase.SUBMITTING:
            self.store.transition(rec.job_id, JobPhase.CANCELLED, "submission aborted")
        return {"job_id": rec.job_id}

    def _cancel(self, peer: Peer, req: Mapping[str, Any]) -> dict[str, Any]:
        rec = self._own(peer, req)
        if rec.state.terminal or rec.state in (JobPhase.CANCELLING, JobPhase.COMPLETING):
            return {"job_id": rec.job_id, "state": rec.state.value}
        to = JobPhase.CANCELLED if rec.state is JobPhase.SUBMITTING else JobPhase.CANCELLING
        self.store.transition(rec.job_id, to, f"cancelled by {peer.user}")
        self.wake()
        return {"job_id": rec.job_id, "state": to.value}

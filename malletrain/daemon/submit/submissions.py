"""Jobs still being submitted: their attached slot jobs checked, or their submission expired.

``malletrain submit`` submits the slot jobs itself, as the user, then attaches their ids
(:mod:`malletrain.daemon.submit.requests`). The attach only records the ids; the tick checks them
here against its own snapshot, which lists every job anyway, so a submission costs Slurm
no extra query. Checking at the attach asked Slurm once per batch of attaches, and with a
hundred users submitting at once (``benchmarks/load.py``) the attach round trip was
2.3-2.8 s at p99, nearly all of it that ``squeue`` waiting for a CPU.

Nothing acts on attached slots before they pass: a submitting job is neither allocated nor
wound down (:mod:`malletrain.daemon.tick.screen`). A job whose slots fail is failed with
the reason; winding it down cancels only the slots that are what they claim (the user's
own, tagged for it: :func:`malletrain.daemon.tick.views.slot_views`), never another user's
job named in the attach.

The check needs a snapshot newer than the attach. The tick reads the store before asking
Slurm, so any snapshot of its own is; a snapshot kept from an earlier tick (Slurm failed
this one) may predate the slots, and then no judgement is made.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from malletrain.core.cluster import ClusterSnapshot, Job, JobState
from malletrain.core.lifecycle import JobPhase
from malletrain.daemon.jobs.slots import parse_tag, slot_tag
from malletrain.daemon.jobs.store import JobRecord, SlotRecord, Store
from malletrain.errors import UserError
from malletrain.slurm.backend import SlurmBackend

log = logging.getLogger(__name__)

#: A submission whose slots were never attached is failed after this many seconds.
SUBMIT_TIMEOUT_S = 600.0


def attach_problem(snapshot: ClusterSnapshot, job: JobRecord, slots: Sequence[SlotRecord],
                   partition: str) -> str | None:
    """Why the slot jobs attached to ``job`` cannot be its slots (None: they can): one per
    slot, each the user's own, tagged for its slot, a pending single-node job of
    ``partition``."""
    if sorted(r.slot for r in slots) != list(range(job.spec.max_nodes)):
        return f"{len(slots)} slot jobs attached for {job.spec.max_nodes} slots"
    for rec in sorted(slots, key=lambda r: r.slot):
        sj = snapshot.job(rec.slurm_job_id)
        problem = ("is unknown to Slurm" if sj is None
                   else _not_owned(sj, job, rec) or _not_a_fresh_slot(sj, partition))
        if problem:
            return f"slot job {rec.slurm_job_id} {problem}"
    return None


def _not_owned(sj: Job, job: JobRecord, rec: SlotRecord) -> str | None:
    if sj.user != job.user:
        return f"belongs to {sj.user}, not to {job.user}"
    if sj.comment != slot_tag(job.job_id, rec.slot):
        return f"is not tagged {slot_tag(job.job_id, rec.slot)!r}"
    return None


def _not_a_fresh_slot(sj: Job, partition: str) -> str | None:
    if sj.partition != partition:
        return f"is in partition {sj.partition}, not the scavenger partition"
    if sj.state is not JobState.PENDING or sj.node_count > 1:
        return "is not a pending single-node job"
    return None


def _own_slot(snapshot: ClusterSnapshot, job: JobRecord, rec: SlotRecord) -> bool:
    sj = snapshot.job(rec.slurm_job_id)
    return sj is not None and _not_owned(sj, job, rec) is None


def admit_attached(store: Store, jobs: Sequence[JobRecord],
                   slots: Mapping[str, Sequence[SlotRecord]], snapshot: ClusterSnapshot,
                   partition: str) -> list[JobRecord]:
    """Queue each submitting job whose attached slots pass, fail each whose do not; the
    jobs as they are now (a queued job is allocated in this same tick)."""
    out = []
    for job in jobs:
        recs = slots.get(job.job_id, ())
        if job.state is not JobPhase.SUBMITTING or not recs:
            out.append(job)
            continue
        problem = attach_problem(snapshot, job, recs, partition)
        ids = sorted(r.slurm_job_id for r in recs)
        if problem is None:
            store.transition(job.job_id, JobPhase.QUEUED,
                             f"{len(recs)} slot jobs attached ({ids[0]}..{ids[-1]})")
        else:
            log.warning("job %s of %s refused: %s", job.job_id, job.user, problem)
            # other users' jobs (or jobs not tagged for this one) are let go at once: their
            # owners may be attaching them; the user's own are cancelled by the wind-down
            store.drop_slots(job.job_id, [r.slurm_job_id for r in recs
                                          if not _own_slot(snapshot, job, r)])
            store.transition(job.job_id, JobPhase.FAILED, f"refused at attach: {problem}")
        now = store.job(job.job_id)
        out.append(now if now is not None else job)
    return out


def expire_submissions(store: Store, backend: SlurmBackend, jobs: Sequence[JobRecord],
                       slots: Mapping[str, Sequence[SlotRecord]], snapshot: ClusterSnapshot,
                       now_s: float) -> None:
    """Fail a submission never attached within :data:`SUBMIT_TIMEOUT_S`, cancelling the slot
    jobs its user tagged for it (a client that died between its sbatch calls and attach)."""
    for job in jobs:
        if (job.state is not JobPhase.SUBMITTING or slots.get(job.job_id)
                or now_s - job.created_s <= SUBMIT_TIMEOUT_S):
            continue
        for sj in snapshot.jobs:
            tag = parse_tag(sj.comment)
            if tag and tag[0] == job.job_id and sj.user == job.user and sj.state.is_active:
                try:
                    backend.cancel(sj.job_id)
                except UserError as exc:  # the next tick's wind-down has none to cancel
                    log.warning("job %s: cancelling its slot job %d: %s", job.job_id,
                                sj.job_id, exc)
        store.transition(job.job_id, JobPhase.FAILED,
                         "the submit command never attached its slot jobs")

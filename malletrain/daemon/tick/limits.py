"""Slurm's limits in the tick: which caps each managed job's nodes count against. Pure.

From the site's limits (:class:`~malletrain.core.accounting.SiteLimits`: ``sacctmgr``'s
associations and QOS, read every ``accounting.refresh_s``, or the settings' per-user cap)
each job gets

* a cap on its own size: ``MaxTRES`` of its association and of its QOS (Slurm's limits
  per job; a malleable job is one job to its user);
* the keys of the caps its nodes count against with the other jobs under them: its
  user's association (``GrpTRES``, ``GrpJobs``, ``MaxJobs``), its account and the
  account's parents (``GrpTRES``, ``GrpJobs``), its QOS per user, per account and in total
  (``MaxTRESPerUser``, ``MaxJobsPerUser``, ``MaxTRESPerAccount``, ``GrpTRES``, ...), and the
  settings' ``accounting.user_max_nodes``.

Node and GPU counts become nodes by the job's GPUs per node; job counts are nodes too,
since each node slot is one Slurm job (:meth:`TresLimit.node_cap`). Slurm counts the
running regular jobs of the same association and QOS against the same limits, so what
they hold (nodes and jobs from each tick's job list, GPUs from squeue's ``tres-alloc``
where the site holds a GPU limit: :func:`regular_usage`) comes off the caps first, and
so does what a regular job waiting at such a limit asks for: where
``AccountingStorageEnforce`` holds limits, Slurm's preemption does not free a limit, so
slots under it would keep the regular job waiting for as long as they run. The
allocation holds the caps (:mod:`malletrain.core.allocation.fairness`) and ``malletrain
jobs`` says ``AccountLimit`` or ``QOSLimit`` for a job held at one (:func:`limited_jobs`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from malletrain.core.accounting import SiteLimits, TresLimit
from malletrain.core.cluster import Job, JobState
from malletrain.daemon.jobs.store import JobRecord

ACCOUNT_LIMIT = "AccountLimit"
QOS_LIMIT = "QOSLimit"


@dataclass(frozen=True)
class JobLimits:
    """One job's limits: its own largest size and the caps it shares."""

    account: str = ""
    qos: str = ""
    #: the most nodes the job may hold (``None``: no limit) and the reason that says so
    max_nodes: int | None = None
    max_reason: str = ""
    #: key -> the nodes the jobs under it may hold together (for this job's GPUs per node)
    caps: Mapping[str, int] = field(default_factory=dict)


def _reason(key: str) -> str:
    return QOS_LIMIT if key.startswith("qos:") else ACCOUNT_LIMIT


@dataclass(frozen=True)
class Usage:
    """What regular jobs hold (or wait at the limit for) under one limit's key."""

    nodes: int = 0
    jobs: int = 0
    gpus: int = 0


NO_USE = Usage()
#: squeue's reasons for a pending job held at a node, job-count or GPU limit that running
#: jobs of its association or QOS fill (``AssocGrpNodeLimit``, ``QOSMaxJobsPerUserLimit``,
#: ``AssocGrpGRES``...); not a limit on the job alone (``...PerJob...``, ``...PerNode``)
#: nor on minutes used
_HELD_AT_SHARED_LIMIT = re.compile(
    r"^(Assoc|QOS)(Grp|Max)(Node|Jobs|GRES)(Limit|Per(User|Account)(Limit)?)?$")


def _add(caps: dict[str, int], key: str, limit: TresLimit, gpus_per_node: int,
         used: Mapping[str, Usage]) -> None:
    held = used.get(key, NO_USE)
    cap = limit.less(held.nodes, held.jobs, held.gpus).node_cap(gpus_per_node)
    if cap is not None:
        caps[key] = cap


def _shared(site: SiteLimits, user: str, account: str, qos_name: str
            ) -> list[tuple[str, TresLimit]]:
    """The limits shared by every running job of ``user`` in ``account`` under
    ``qos_name``, by key: its association's, its account's and the parents', its QOS's per
    user, per account and in total."""
    out: list[tuple[str, TresLimit]] = []
    assoc = site.association(user, account)
    if assoc is not None:
        out.append((f"assoc:{account}/{user}", assoc.total))
    out += [(f"assoc:{a.account}", a.total) for a in site.account_chain(account)]
    qos = site.qos.get(qos_name)
    if qos is not None:
        out += [(f"qos:{qos_name}/user:{user}", qos.per_user),
                (f"qos:{qos_name}/account:{account}", qos.per_account),
                (f"qos:{qos_name}", qos.total)]
    return out


def regular_usage(regular: Iterable[Job], site: SiteLimits | None) -> dict[str, Usage]:
    """key -> the nodes and jobs the ``regular`` jobs (the snapshot's jobs that are not
    malletrain's slots: ``pool.regular_jobs``) hold under it: the running ones, then those
    waiting at a limit they share that would fit in it beside them were the slots gone
    (submit order), which the slots give way to. One that cannot fit even so (a 1,000-node
    job under a 64-node ``GrpTRES``) waits for regular work or forever, not for the slots,
    and takes nothing from them."""
    used: dict[str, Usage] = {}
    if site is None or not site.from_accounting:
        return used
    regular = tuple(regular)
    running = [j for j in regular if j.state is JobState.RUNNING]
    waiting = sorted((j for j in regular if j.state is JobState.PENDING
                      and _HELD_AT_SHARED_LIMIT.match(j.state_reason)),
                     key=lambda j: (j.submit_time or 0.0, j.job_id))
    for job in running:
        _count(used, job, _job_keys(site, job), fits_only=False)
    for job in waiting:
        _count(used, job, _job_keys(site, job), fits_only=True)
    return used


def _job_keys(site: SiteLimits, job: Job) -> list[tuple[str, TresLimit]]:
    account = job.account or site.account_of(job.user, None)
    return _shared(site, job.user, account, job.qos or site.qos_of(job.user, account, None))


def _count(used: dict[str, Usage], job: Job, keys: list[tuple[str, TresLimit]],
           fits_only: bool) -> None:
    """Add ``job`` under its ``keys`` (``fits_only``: only if it fits every limit)."""
    after = {}
    for key, _ in keys:
        was = used.get(key, NO_USE)
        after[key] = Usage(was.nodes + job.node_count, was.jobs + 1, was.gpus + job.gpus)
    if fits_only and any(lim.exceeded_by(after[key].nodes, after[key].jobs, after[key].gpus)
                         for key, lim in keys):
        return
    used.update(after)


def job_limits(job: JobRecord, site: SiteLimits, used: Mapping[str, Usage] | None = None
               ) -> JobLimits:
    """The limits of one job under the site's associations and QOS, less what regular
    jobs hold or wait for under each (``used``: :func:`regular_usage`)."""
    user, gpn, used = job.user, job.spec.gpus_per_node, used or {}
    caps: dict[str, int] = {}
    if site.user_max_nodes is not None:  # malletrain's own cap: on its slots alone
        caps[f"site:user:{user}"] = site.user_max_nodes
    account = site.account_of(user, job.spec.account)
    qos_name = site.qos_of(user, account, job.spec.qos)
    for key, limit in _shared(site, user, account, qos_name):
        _add(caps, key, limit, gpn, used)
    per_job: list[tuple[int, str]] = []
    assoc = site.association(user, account)
    if assoc is not None and (n := assoc.per_job.node_cap(gpn)) is not None:
        per_job.append((n, ACCOUNT_LIMIT))
    qos = site.qos.get(qos_name)
    if qos is not None and (n := qos.per_job.node_cap(gpn)) is not None:
        per_job.append((n, QOS_LIMIT))
    biggest, why = min(per_job) if per_job else (None, "")
    return JobLimits(account=account, qos=qos_name, max_nodes=biggest, max_reason=why,
                     caps=caps)


def all_limits(jobs: Iterable[JobRecord], site: SiteLimits | None,
               used: Mapping[str, Usage] | None = None) -> dict[str, JobLimits]:
    """job id -> its limits (none without a site's limits)."""
    if site is None:
        return {}
    return {j.job_id: job_limits(j, site, used) for j in jobs}


def shared_caps(limits: Mapping[str, JobLimits], pinned: Mapping[str, Sequence[str]]
                ) -> dict[str, int]:
    """The caps the policy holds: each key's tightest cap among its jobs (GPU limits are
    tighter for jobs with more GPUs a node), less the nodes of the ``pinned`` jobs (busy
    this tick) under it, which the policy does not see."""
    caps: dict[str, int] = {}
    for lim in limits.values():
        for key, cap in lim.caps.items():
            caps[key] = min(cap, caps.get(key, cap))
    for job_id, nodes in pinned.items():
        for key in limits[job_id].caps if job_id in limits else ():
            caps[key] -= len(nodes)
    return {k: max(0, v) for k, v in caps.items()}


def limited_jobs(limits: Mapping[str, JobLimits], targets: Mapping[str, Sequence[str]],
                 caps: Mapping[str, int]) -> dict[str, str]:
    """job id -> ``AccountLimit``/``QOSLimit`` for each job a limit holds after the plan:
    at its own cap, or under a key whose jobs (pinned ones too: ``targets`` has them) hold
    its whole cap (``caps``: :func:`shared_caps` with nothing pinned)."""
    used: dict[str, int] = {}
    for job_id, lim in limits.items():
        for key in lim.caps:
            used[key] = used.get(key, 0) + len(targets.get(job_id, ()))
    out: dict[str, str] = {}
    for job_id, lim in limits.items():
        if lim.max_nodes is not None and len(targets.get(job_id, ())) >= lim.max_nodes:
            out[job_id] = lim.max_reason
            continue
        full = sorted(k for k in lim.caps if k in caps and used.get(k, 0) >= caps[k])
        if full:
            out[job_id] = _reason(full[0])
    return out


def most_nodes(jobs: Iterable[JobRecord], limits: Mapping[str, JobLimits]) -> dict[str, int]:
    """job id -> the most nodes it may hold: its ``--nodes`` maximum under its own cap."""
    out = {}
    for job in jobs:
        cap = limits[job.job_id].max_nodes if job.job_id in limits else None
        out[job.job_id] = job.spec.max_nodes if cap is None else min(cap, job.spec.max_nodes)
    return out

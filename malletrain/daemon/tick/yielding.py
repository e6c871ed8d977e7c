"""Which held nodes to give back to Slurm before it asks: pure functions of one tick's view.

Slurm takes a scavenged node back by preempting its slot: a signal, the slot's exit, the
node's epilog, then a scheduling pass starts the regular job. The daemon can save that round
when it knows a regular job wants a node, by giving the node back first (the slot's member
leaves at a step boundary, like any shrink). Two cases, two functions:

* :func:`yield_ahead`: a pending job's backfill plan (or a reservation) names a held node
  and is due within seconds;
* :func:`serve_unplanned`: a pending job that Slurm has neither started nor planned to start
  soon, seconds after its submission, while the nodes it could use are ours. Slurm 22.05 does this
  in bursts: while the victims of earlier preemptions are completing, its passes plan the
  next job instead of preempting for it (docs/slurm-backend.md §9), so the job waited 2-3 s
  for a plan before anything was given back (e2e runs).

Both leave the first ``confirm_s`` after a submission to Slurm: a job it can start by
preemption is served by its own next pass, often on other nodes than a plan names, and
giving back as well left both sets to one job (an e2e run: three nodes idle ~10 s). Slurm
reports submission times in whole seconds (truncated), so the real wait is between
``confirm_s - 1`` and ``confirm_s``: with the default 1 s, at most one Slurm pass, so that a
job Slurm will not serve by itself pays at most about a second for it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from malletrain.core.cluster import ClusterSnapshot, Job, JobState
from malletrain.core.scavenging.scavenger import Claim
from malletrain.daemon.jobs.slots import parse_tag

#: Reasons of a pending job that waits only for nodes (or for its turn): the jobs Slurm
#: would start as soon as nodes are free. Held jobs, dependencies, limits... are not.
WAITING_REASONS = frozenset({"", "None", "Resources", "Priority"})
#: States in which a job occupies its nodes (not on their way back to Slurm).
RUNNING_STATES = frozenset({JobState.RUNNING, JobState.CONFIGURING, JobState.SUSPENDED})
#: Slurm's times are whole seconds: a plan waiting for a job at its time limit starts at that
#: job's end_time, give or take this.
STALE_MARGIN_S = 1.0


def stale_plans(snapshot: ClusterSnapshot, now_s: float) -> frozenset[int]:
    """Pending regular jobs whose plan is due but cannot start as made.

    A plan is stale when it is due and names a node that a regular job runs on which is
    expected to end after the planned start (``end_time``: its start plus its time limit):
    Slurm made the plan before that job took the node, and re-plans only at its next backfill
    pass. Acting on it gives back the plan's other nodes and leaves the job waiting for that
    pass (e2e run 13: job 31's plan, made while job 30 was pending, named a node job 30 then
    got; the daemon gave back the other one and the job waited 2.3 s). Such a job is served
    like an unplanned one (:func:`serve_unplanned`), its plan's nodes first. A plan that
    waits for a job at its time limit is not stale (:func:`yield_ahead` is for it), nor is
    one on our own slots' nodes (Slurm preempts them) or on a job with no known end.
    """
    ends: dict[str, float] = {}  # node -> when the regular jobs on it are expected to end
    for j in snapshot.jobs:
        if j.state in RUNNING_STATES and j.end_time is not None and parse_tag(j.comment) is None:
            for n in j.nodes:
                ends[n] = max(ends.get(n, j.end_time), j.end_time)
    return frozenset(
        j.job_id for j in snapshot.jobs
        if j.state is JobState.PENDING and j.start_time is not None and j.start_time <= now_s
        and any(ends.get(n, j.start_time) > j.start_time + STALE_MARGIN_S
                for n in j.planned_nodes)
    )


@dataclass(frozen=True)
class GiveBack:
    """What :func:`yield_ahead` found: nodes to give back now, and nodes left to Slurm."""

    #: held node -> the claim it is given back to, this tick.
    now: dict[str, Claim]
    #: held node -> a claim due at once whose job Slurm may still preempt for by itself.
    waiting: dict[str, Claim]


def yield_ahead(held: Collection[str], claims: Mapping[str, Claim], now_s: float,
                ahead_s: float, confirm_s: float = 0.0) -> GiveBack:
    """The held nodes to give back to Slurm now, each with the claim that wants it.

    A node is given back when the earliest claim on it (a foreign pending job's backfill
    plan or a reservation; :func:`~malletrain.core.scavenging.scavenger.earliest_claims` without our
    own slot jobs) starts within ``ahead_s`` or is overdue. Why: the slot's time limit was
    set inside the node's window, but the plan moves: a pending job due now but blocked on
    another node (still running or completing a regular job) takes ours by preemption the
    moment it can start, so its start then waits for one more round (signal, the slot's
    exit, the node's epilog, a scheduling pass). Leaving first, while it still waits for the
    other node, takes that round off its wait. A claim further ahead is left alone: backfill
    itself starts jobs in such holes, and if the blocking job ends early Slurm preempts at
    once, which no daemon tick can beat.

    Except in the first ``confirm_s`` after the claiming job's submission, when its claim
    is already due: such nodes are reported as ``waiting`` (module docstring); past
    ``confirm_s`` without Slurm starting the job, it is blocked elsewhere and they go back.
    """
    now: dict[str, Claim] = {}
    waiting: dict[str, Claim] = {}
    for node in held:
        claim = claims.get(node)
        if claim is None or claim.start_at - now_s > ahead_s:
            continue
        fresh = claim.submitted_at is not None and now_s - claim.submitted_at < confirm_s
        if fresh and claim.start_at <= now_s:
            waiting[node] = claim
        else:
            now[node] = claim
    return GiveBack(now, waiting)


@dataclass(frozen=True)
class Unplanned:
    """What :func:`serve_unplanned` found."""

    #: held node -> the unplanned job it is given back to, this tick (``start_at`` is the
    #: job's submission: there is no planned start).
    give_back: dict[str, Claim] = field(default_factory=dict)
    #: free nodes such a job is about to take: not offered to the policy (no growth there).
    withheld: frozenset[str] = frozenset()
    #: a job younger than ``confirm_s`` would need held nodes: look again soon.
    waiting: bool = False


def _is_unserved(job: Job, now_s: float, ahead_s: float, max_age_s: float,
                 stale: Collection[int]) -> bool:
    """A fresh regular job waiting for nodes that no valid plan starts within ahead_s."""
    due_soon = (bool(job.planned_nodes) and job.start_time is not None
                and job.start_time - now_s <= ahead_s and job.job_id not in stale)
    return (
        job.state is JobState.PENDING and not due_soon
        and parse_tag(job.comment) is None
        and job.state_reason in WAITING_REASONS
        and job.submit_time is not None and 0.0 <= now_s - job.submit_time <= max_age_s
    )


def _first(nodes: list[str], preferred: Collection[str]) -> list[str]:
    """``nodes`` with the ``preferred`` ones first, each part in its given order."""
    return [n for n in nodes if n in preferred] + [n for n in nodes if n not in preferred]


@dataclass
class _Left:
    """The nodes not yet promised to a job, by kind (free, on their way back, held)."""

    free: list[str]
    freeing: list[str]
    held: list[str]

    def take(self, job: Job, parts: Mapping[str, tuple[str, ...]], stale: Collection[int]
             ) -> tuple[list[str], list[str]] | None:
        """The free and held nodes ``job`` takes (freeing ones first), or None to skip it."""
        allowed = frozenset(p for p in job.partition.split(",") if p)
        need = max(1, job.node_count)
        planned = frozenset(job.planned_nodes)
        f, g, h = (_first([n for n in nodes if not allowed.isdisjoint(parts.get(n, ()))],
                          planned) for nodes in (self.free, self.freeing, self.held))
        if len(f) + len(g) + len(h) < need:
            return None
        if job.planned_nodes and job.job_id not in stale and len(f) + len(g) >= need:
            return None  # Slurm planned it later although enough nodes are free: not ours
        take_free = f[:need]
        take_freeing = g[:need - len(take_free)]
        take_held = h[:need - len(take_free) - len(take_freeing)]
        self.free = [n for n in self.free if n not in take_free]
        self.freeing = [n for n in self.freeing if n not in take_freeing]
        self.held = [n for n in self.held if n not in take_held]
        return take_free, take_held


def unserved_jobs(snapshot: ClusterSnapshot, *, now_s: float, max_age_s: float,
                  ahead_s: float = 0.0, stale: Collection[int] = ()) -> list[Job]:
    """The regular jobs :func:`serve_unplanned` serves, in the order it serves them (most
    ticks: none, and the give-back need not look at the nodes at all)."""
    return sorted((j for j in snapshot.jobs if _is_unserved(j, now_s, ahead_s, max_age_s, stale)),
                  key=lambda j: (j.submit_time or 0.0, j.job_id))


def serve_unplanned(snapshot: ClusterSnapshot, *, now_s: float, held: Sequence[str],
                    freeing: Collection[str], free: Collection[str], confirm_s: float,
                    max_age_s: float, ahead_s: float = 0.0,
                    stale: Collection[int] = (), pending: Sequence[Job] | None = None
                    ) -> Unplanned:
    """Give back held nodes to regular jobs Slurm has neither started nor planned to start.

    ``held``: the nodes our slots hold (running members not leaving, placed slots), in the
    order to give them back (cheapest first); ``freeing``: nodes that are ours or a regular
    job's but on their way back to Slurm (members leaving, slots Slurm signalled or
    completing, regular jobs completing); ``free``: idle nodes. Neither ``freeing`` nor
    ``free`` may hold nodes a valid plan due within ``ahead_s`` names: they go to that plan's
    job (e2e run 14: a 2-node job was counted as served by two leaving nodes another job's
    due plan named, and waited 1.1 s for its own plan). ``stale``: jobs whose due plan
    cannot start as made (:func:`stale_plans`), served like unplanned ones.

    Pending regular jobs submitted at most ``max_age_s`` ago, waiting only for nodes, with no
    plan or a plan not due within ``ahead_s`` (:func:`yield_ahead` acts on a due one), are
    served in submission order (Slurm's priority within a tier, as far as the
    snapshot tells): each takes free nodes first (withheld from the policy: Slurm's next
    pass starts it there), then freeing ones (Slurm has already preempted for someone), and
    only then held ones, given back once the job is ``confirm_s`` old. A job the offered
    nodes cannot hold even with all of ours is left alone (Slurm plans it later, and
    :func:`yield_ahead` acts on the plan); so is one older than ``max_age_s`` (Slurm has
    had its passes: something else blocks it). A plan that is not due is often stale: made
    while a node it could have was still being freed (e2e run 8: such a plan kept a job
    waiting 2.3 s); such a job is served only if it needs held nodes (with enough free ones
    something else holds it back), and the nodes its plan names are taken first; a job with
    a stale due plan is served in full (its free nodes withheld, held ones given back).
    Partitions bound which nodes a job may use; what else narrows its choice
    (``--nodelist``, features) is not in the snapshot. ``pending``: :func:`unserved_jobs`,
    if the caller has it.
    """
    if pending is None:
        pending = unserved_jobs(snapshot, now_s=now_s, max_age_s=max_age_s, ahead_s=ahead_s,
                                stale=stale)
    if not pending:
        return Unplanned()
    parts = {n.name: n.partitions for n in snapshot.nodes}
    left = _Left(list(free), list(freeing), list(held))
    withheld: set[str] = set()
    give_back: dict[str, Claim] = {}
    waiting = False
    for job in pending:
        take = left.take(job, parts, stale)
        if take is None:
            continue
        take_free, take_held = take
        withheld.update(take_free)
        if not take_held:
            continue
        assert job.submit_time is not None  # _is_unserved
        if now_s - job.submit_time < confirm_s:
            waiting = True
            continue
        claim = Claim(job.submit_time, f"job {job.job_id}", job.submit_time)
        give_back.update(dict.fromkeys(take_held, claim))
    return Unplanned(give_back, frozenset(withheld), waiting)

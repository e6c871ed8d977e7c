"""Why each job has the nodes it has: ``malletrain jobs``'s REASON, as squeue has one. Pure.

For the jobs that wait for or hold scavenged nodes, after the tick's allocation:

* ``Dependency``: it waits for its ``--dependency`` (it takes no part in the allocation);
* ``MaxNodes``: it is planned at its ``--nodes`` maximum;
* ``AccountLimit`` / ``QOSLimit``: a limit of its association or account (or the
  settings' ``accounting.user_max_nodes``) / of its QOS holds it where it is
  (``daemon.tick.limits``);
* ``UserShare``: its user's jobs hold the user's part of the nodes on offer while other
  users have jobs too (``core.allocation.fairness``);
* ``Resources``: every node on offer is planned for a job;
* ``Value``: idle nodes are left, but more of them are not worth their cost to this job now
  (short windows, a flat curve, the rescale or start cost; ``docs/allocator.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from malletrain.core.allocation.fairness import job_useful_sizes
from malletrain.core.allocation.shares import tree_caps, useful_first, user_caps
from malletrain.core.model import MalleableJob
from malletrain.daemon.jobs.store import JobRecord


def job_reasons(managed: Sequence[JobRecord], targets: Mapping[str, tuple[str, ...]],
                offered: int, waiting: Mapping[str, str],
                limited: Mapping[str, str] | None = None) -> dict[str, str]:
    """job id -> reason, for ``managed`` jobs and the ``waiting`` ones (their own reason);
    ``limited``: the jobs a Slurm limit holds (``daemon.tick.limits.limited_jobs``)."""
    limited = limited or {}
    out = {job_id: f"Dependency ({why})" for job_id, why in waiting.items()}
    held: dict[str, int] = {}
    for job in managed:
        held[job.user] = held.get(job.user, 0) + len(targets.get(job.job_id, ()))
    share = offered // max(1, len(held))
    planned = sum(held.values())
    at_max = {j.job_id for j in managed if len(targets.get(j.job_id, ())) >= j.spec.max_nodes}
    # users with a job that could take more: a share is what holds the others back only
    # while one of them could use the nodes (not when all are at a limit or their maximum)
    wanting = {j.user for j in managed if j.job_id not in at_max and j.job_id not in limited}
    for job in managed:
        if job.job_id in at_max:
            out[job.job_id] = "MaxNodes"
        elif job.job_id in limited:
            out[job.job_id] = limited[job.job_id]
        elif len(held) > 1 and held[job.user] >= share and wanting - {job.user}:
            out[job.job_id] = "UserShare"
        elif planned >= offered:
            out[job.job_id] = "Resources"
        else:
            out[job.job_id] = "Value"
    return out


def entitlements(managed: Sequence[JobRecord], targets: Mapping[str, tuple[str, ...]],
                 offered: int, most: Mapping[str, int],
                 weights: Mapping[str, float] | None = None,
                 accounts: Mapping[str, str] | None = None,
                 account_weights: Mapping[str, float] | None = None,
                 turn: int | None = None,
                 account_parents: Mapping[str, str] | None = None,
                 useful: Mapping[str, int] | None = None) -> dict[str, int]:
    """user -> the nodes the user is entitled to now (``malletrain jobs --json``): the
    user's max-min fair part of the ``offered`` nodes (weighted by ``weights``) for the
    most each of its jobs may hold (``most``: job id -> its ``--nodes`` maximum under its
    own limits), what other users cannot use included. With ``useful`` (job id -> its
    useful size, :func:`useful_most`), as the division does: the parts for the useful sizes
    first, then what no one took for the rest of ``most``. The knapsack then holds a user at
    or below it; shared limits (an account's, a QOS's) may hold a user lower still. With
    ``account_weights``, the accounts' parts first (``accounts``: job id -> its account),
    then each account's users' (:func:`tree_caps`, down ``account_parents``' tree); a user in
    two accounts: the sum.
    ``turn``: the policy's turn for odd nodes (:func:`.shares.fair_turn`), so that with fewer
    nodes than users the entitled users are the ones the policy serves this turn."""
    tree = bool(account_weights)
    accounts, useful = accounts or {}, useful or {}
    demand: dict[str, int] = {}
    first: dict[str, int] = {}  # the demand of useful sizes
    held: dict[str, int] = {}
    least: dict[str, int] = {}  # the fewest nodes one of its jobs runs on (raised in turns)
    parents: dict[str, str] = {}
    for job in managed:
        key = f"{accounts.get(job.job_id, '')}/{job.user}" if tree else job.user
        parents[key] = accounts.get(job.job_id, "")
        n = most.get(job.job_id, job.spec.max_nodes)
        demand[key] = demand.get(key, 0) + n
        first[key] = first.get(key, 0) + min(n, useful.get(job.job_id, n))
        held[key] = held.get(key, 0) + len(targets.get(job.job_id, ()))
        least[key] = min(least.get(key, job.spec.min_nodes), job.spec.min_nodes)
    weights = weights or {}
    key_weights = {k: weights.get(k.split("/", 1)[1], 1.0) for k in demand} if tree else weights

    def divide(wants: dict[str, int], nodes: int) -> dict[str, int]:
        return (tree_caps(wants, held, nodes, key_weights, parents, dict(account_weights or {}),
                          turn, least, account_parents) if tree else
                user_caps(wants, held, nodes, dict(key_weights), turn, least))

    parts = useful_first(first, demand, offered, divide)
    out: dict[str, int] = {}
    for key, part in parts.items():
        user = key.split("/", 1)[1] if tree else key
        out[user] = out.get(user, 0) + part
    return out


def useful_most(jobs: Sequence[MalleableJob], min_gain: float) -> dict[str, int]:
    """job id -> the policy job's useful size (``fair_share_min_gain``: what the division
    counts of the job first; empty where it is 0), for :func:`entitlements`."""
    width = 1 + max((max(j.max_nodes, j.min_nodes) for j in jobs), default=0)
    sizes = job_useful_sizes(jobs, width, min_gain)
    return {} if sizes is None else {j.job_id: int(n) for j, n in zip(jobs, sizes.tolist(),
                                                                      strict=True)}

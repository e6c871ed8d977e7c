"""Slurm's limits on users, accounts and QOS, as the daemon holds them (issue 47). Pure data.

Read from Slurm's accounting (``sacctmgr show assoc | qos | user``:
:mod:`malletrain.slurm.parsers.parse_limits`) or, on a site without accounting, made from
the settings (``accounting.user_max_nodes``). The tick turns them into node caps on each
user's and account's share of the nodes on offer (``daemon/tick/limits.py``), which the
fair division intersects with (:mod:`malletrain.core.allocation.fairness`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property


@dataclass(frozen=True)
class TresLimit:
    """One Slurm limit's node, GPU and running-job counts (``None``: no limit)."""

    nodes: int | None = None
    gpus: int | None = None
    jobs: int | None = None

    def node_cap(self, gpus_per_node: int) -> int | None:
        """The nodes this limit allows to slots of ``gpus_per_node`` GPUs each.

        Why a job count caps nodes: each node slot of a malleable job is one single-node
        Slurm job of the user (docs/architecture.md), so Slurm counts a job on ``n`` nodes as
        ``n`` running jobs against ``MaxJobs``/``GrpJobs``/``MaxJobsPerUser``."""
        caps = [c for c in (self.nodes, self.jobs) if c is not None]
        if self.gpus is not None and gpus_per_node > 0:
            caps.append(self.gpus // gpus_per_node)
        return min(caps) if caps else None

    def less(self, nodes: int, jobs: int, gpus: int = 0) -> TresLimit:
        """What this limit leaves once running jobs hold ``nodes`` nodes and ``gpus`` GPUs
        in ``jobs`` jobs (Slurm counts every running job of the association or QOS,
        regular ones too)."""
        return TresLimit(None if self.nodes is None else max(0, self.nodes - nodes),
                         None if self.gpus is None else max(0, self.gpus - gpus),
                         None if self.jobs is None else max(0, self.jobs - jobs))

    def exceeded_by(self, nodes: int, jobs: int, gpus: int) -> bool:
        """Whether running jobs holding so much together would be past this limit."""
        return any(cap is not None and used > cap for cap, used in
                   ((self.nodes, nodes), (self.jobs, jobs), (self.gpus, gpus)))


NO_LIMIT = TresLimit()


@dataclass(frozen=True)
class Association:
    """One line of ``sacctmgr show assoc``: an account's own (``user`` empty) or a user's in
    an account. Slurm copies an account's ``MaxTRES``/``MaxJobs`` into its users' lines (as
    shown); ``GrpTRES``/``GrpJobs`` bind the whole sub-tree and are not copied."""

    account: str
    user: str = ""
    partition: str = ""
    parent: str = ""
    #: ``MaxTRES``: each job of the association (a malleable job is one job to its user)
    per_job: TresLimit = NO_LIMIT
    #: ``GrpTRES``/``GrpJobs``, and on a user's line ``MaxJobs``: all running jobs together
    total: TresLimit = NO_LIMIT
    qos: tuple[str, ...] = ()
    default_qos: str = ""


@dataclass(frozen=True)
class Qos:
    """One line of ``sacctmgr show qos``."""

    name: str
    per_user: TresLimit = NO_LIMIT      # MaxTRESPerUser, MaxJobsPerUser
    per_account: TresLimit = NO_LIMIT   # MaxTRESPerAccount, MaxJobsPerAccount
    total: TresLimit = NO_LIMIT         # GrpTRES, GrpJobs
    per_job: TresLimit = NO_LIMIT       # MaxTRES


@dataclass(frozen=True)
class FairShare:
    """One line of ``sshare``: an account's own (``user`` empty, no ``factor``) or a user's
    association in an account. ``factor`` is Slurm's fair-share factor in [0, 1] (1: the
    association used nothing of its share; its past usage decays with
    ``PriorityDecayHalfLife``, so the factor already carries Slurm's decay)."""

    account: str
    user: str = ""
    raw_shares: int | None = None      # None: ``parent`` or the root
    norm_shares: float = 0.0
    raw_usage: int = 0
    effective_usage: float = 0.0
    factor: float | None = None


#: The least share weight a user gets from Slurm's fair-share factor: a user who used far
#: more than its share (factor near 0) still gets a part of the idle nodes, so nobody
#: starves (``accounting.fair_share_floor``).
DEFAULT_FAIR_SHARE_FLOOR = 0.05


def fair_share_weights(rows: tuple[FairShare, ...], default_accounts: Mapping[str, str],
                       floor: float = DEFAULT_FAIR_SHARE_FLOOR) -> dict[str, float]:
    """user -> share weight: the fair-share factor of the user's association in its default
    account (else the highest of its associations), never below ``floor``. A user ``sshare``
    does not list is left out of the map: it weighs ``floor`` (:meth:`SiteLimits.weight`)."""
    own: dict[str, float] = {}
    best: dict[str, float] = {}
    for row in rows:
        if not row.user or row.factor is None:
            continue
        best[row.user] = max(best.get(row.user, 0.0), row.factor)
        if default_accounts.get(row.user) == row.account:
            own[row.user] = row.factor
    return {user: max(floor, own.get(user, factor)) for user, factor in best.items()}


@dataclass(frozen=True)
class SiteLimits:
    """Everything the decision holds of the site's limits: one cluster's associations, its
    QOS and its users' default accounts, or the settings' fallback for a site without
    accounting."""

    associations: tuple[Association, ...] = ()
    qos: Mapping[str, Qos] = field(default_factory=dict)
    default_accounts: Mapping[str, str] = field(default_factory=dict)
    #: ``accounting.user_max_nodes``: every user's node cap where accounting sets none
    user_max_nodes: int | None = None
    #: whether associations were read (a user without one may then use no QOS at all)
    from_accounting: bool = False
    #: ``accounting.share_weights``: users' weights in the fair division (absent: 1)
    share_weights: Mapping[str, float] = field(default_factory=dict)
    #: the weight of a user ``share_weights`` does not name: 1, or with
    #: ``accounting.share_weights_from: sshare`` the floor (a user sshare does not list)
    default_weight: float = 1.0
    #: ``accounting.account_weights``: where set, nodes go to accounts first, then users
    account_weights: Mapping[str, float] = field(default_factory=dict)

    def weight(self, user: str) -> float:
        """The user's weight in the fair division of the idle nodes."""
        return self.share_weights.get(user, self.default_weight)

    def account_of(self, user: str, asked: str | None) -> str:
        """The account a job runs under: its ``--account``, else the user's default."""
        return asked or self.default_accounts.get(user, "")

    @cached_property
    def _users(self) -> dict[tuple[str, str], Association]:
        """(user, account) -> the user's association (the one for all partitions first):
        a tick asks per job, and a site has thousands of associations."""
        out: dict[tuple[str, str], Association] = {}
        for a in sorted(self.associations, key=lambda a: a.partition != ""):
            if a.user:
                out.setdefault((a.user, a.account), a)
        return out

    @cached_property
    def account_parents(self) -> dict[str, str]:
        """account -> its parent account (Slurm's account tree; the top's parent is "")."""
        return {a: assoc.parent for a, assoc in self._accounts.items()}

    @cached_property
    def _accounts(self) -> dict[str, Association]:
        return {a.account: a for a in self.associations if not a.user}

    def association(self, user: str, account: str) -> Association | None:
        """The user's association in ``account`` (the one for all partitions first)."""
        return self._users.get((user, account))

    def account_chain(self, account: str) -> tuple[Association, ...]:
        """The account's own association and its parents' up to the root."""
        own = self._accounts
        chain: list[Association] = []
        while account in own and own[account] not in chain:
            chain.append(own[account])
            account = own[account].parent
        return tuple(chain)

    @cached_property
    def holds_gpus(self) -> bool:
        """Whether any limit on running jobs together counts GPUs (``GrpTRES`` of an
        association, a QOS's per user, per account or total): then the regular jobs' GPUs
        are read each tick (:data:`~malletrain.slurm.versions.JOB_GPUS`). A per-job
        ``MaxTRES`` needs no one else's GPUs."""
        limits = [a.total for a in self.associations]
        limits += [lim for q in self.qos.values()
                   for lim in (q.per_user, q.per_account, q.total)]
        return any(lim.gpus is not None for lim in limits)

    def qos_of(self, user: str, account: str, asked: str | None) -> str:
        """The QOS a job runs under: its ``--qos``, else the association's default (Slurm
        takes ``normal`` where the association names none and may use it)."""
        if asked:
            return asked
        assoc = self.association(user, account)
        if assoc is None:
            return ""
        if assoc.default_qos:
            return assoc.default_qos
        return "normal" if "normal" in assoc.qos else ""

    def qos_refusal(self, user: str, account: str | None, qos: str) -> str | None:
        """Why ``user`` may not submit with ``--qos=qos`` (sbatch's check), or None."""
        if not self.from_accounting:
            return None
        acct = self.account_of(user, account)
        assoc = self.association(user, acct)
        if assoc is None:
            return (f"user {user!r} has no association in account {acct!r} "
                    "(sacctmgr show assoc): Slurm would refuse the job")
        if qos not in assoc.qos:
            allowed = ",".join(assoc.qos) or "none"
            return (f"Invalid qos specification: {qos!r} is not among the QOS of user "
                    f"{user!r} in account {acct!r} ({allowed})")
        return None

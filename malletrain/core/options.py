"""The allocation policies' knobs, declared once, and the presets every caller starts from.

The daemon's settings (``allocator.*`` in malletrain.yaml), the simulator's command line,
the benchmarks and the tests all build a :class:`PolicyOptions` from one of the presets
below, changing only what they expose (e.g. ``horizon_s`` from the settings, ``tfwd_s``
from ``--tfwd-s``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class PolicyOptions:
    """Knobs a caller may set; each policy reads the ones that concern it."""

    #: FreeTrain's look-ahead (seconds): the value of one second of throughput.
    tfwd_s: float = 10.0
    #: malletrain's cap on any node's window (seconds): beyond it nothing is predictable.
    horizon_s: float = 1800.0
    #: Wall-clock limit for one MILP solve (FreeTrain).
    milp_time_limit_s: float = 10.0
    #: malletrain's fixed hysteresis on top of the one from measured rate noise (0 on
    #: exact replays; the daemon's preset :data:`LIVE` sets it).
    keep_margin: float = 0.0
    #: malletrain's hole-model prior floor (HoleLengthModel.prior_floor).
    hole_prior_floor: float = 0.0
    #: malletrain's horizon for windows estimated from idle age (no plan), capped by
    #: ``horizon_s``; None = ``horizon_s``. Replays set 120 s and the grouping below
    #: (preset :data:`REPLAY`); the daemon keeps both off for now.
    estimate_horizon_s: float | None = None
    #: malletrain: an unplanned node idle for ``a`` seconds is valued over at least
    #: ``estimate_age_factor x a`` (capped by ``horizon_s``; 0: off; replays: 3).
    estimate_age_factor: float = 0.0
    #: malletrain: unplanned nodes that turned idle within one slot of this many seconds
    #: share one reclaim event (0: off).
    reclaim_group_s: float = 0.0
    #: malletrain's finish-aware valuation (MalleTrainPolicy.finish_weight; 0: off, in every
    #: preset) and the horizon within which a finish counts. Needs
    #: MalleableJob.remaining_samples (declared by the user) and AllocationInput.queued_jobs.
    finish_weight: float = 0.0
    finish_horizon_s: float = 24 * 3600.0
    #: malletrain's finish-aware valuation prices a slot at no less than its average over
    #: this many seconds (MalleTrainPolicy.finish_outlook_s; 0: as of now; replays: 24 h)
    finish_outlook_s: float = 0.0
    #: malletrain values throughput in each job's one-node rate, not in samples
    #: (MalleTrainPolicy.work_units; replays: on).
    work_units: bool = False
    #: malletrain divides the nodes among users before jobs (MalleTrainPolicy.fair_share;
    #: every preset: jobs without a user are one user's, so single-user replays are as before)
    fair_share: bool = True
    #: malletrain: when fewer nodes are on offer than users holding none, the odd nodes go
    #: in turns of this many seconds of the decision's clock (core.allocation.shares.
    #: fair_turn; 0: to the holders, who keep them while their jobs run)
    fair_turn_s: float = 600.0
    #: malletrain: >= 1: a user's part of the nodes is lent where other users' jobs gain that
    #: many times more from a node than its own jobs lose, the nodes lent divided among the
    #: others as their parts are (core.allocation.fairness.lend); 0: never (every preset:
    #: on RICC's users it bought throughput only with Jain's index of users' work below 0.95,
    #: docs/allocator-measured.md). Each user keeps the nodes that run one of its jobs.
    fair_share_lend_factor: float = 0.0
    #: malletrain: > 0: a node past a job's minimum that adds less than this times the job's
    #: rate per node at its minimum is offered to the other users before its own user's job
    #: (core.allocation.fairness.useful_sizes); 0: a user's part is its jobs' to use. Every
    #: preset: strict parts cost 17 % of the work on Philly's VCs, and 5.3 % on RICC's users;
    #: 0.5 cost up to 6.5 % on three of sixteen replays, 0.6 at most 4.1 % (benchmarks/
    #: fairness.py, docs/evaluation.md)
    fair_share_min_gain: float = 0.6
    #: malletrain: a user that Slurm took nodes from waits up to a turn (fair_turn_s) for
    #: nodes other users hold above their parts while within this many nodes of its own
    #: (core.allocation.shares.within_slack); 0: no waiting. Every preset: on Philly's VCs
    #: (days 14-60, both presets) parts that followed the pool node by node cost 5.25 % of
    #: the work on average, 4.32 % with it (docs/evaluation.md)
    fair_share_slack_nodes: int = 2

    def __post_init__(self) -> None:
        if self.fair_share_slack_nodes < 0 or self.fair_share_slack_nodes != int(
                self.fair_share_slack_nodes):
            raise ValueError(f"fair_share_slack_nodes must be a whole number >= 0, not "
                             f"{self.fair_share_slack_nodes!r}")
        if not 0.0 <= self.fair_share_min_gain <= 1.0:
            raise ValueError(f"fair_share_min_gain must be within [0, 1], not "
                             f"{self.fair_share_min_gain!r}")
        if not (self.fair_share_lend_factor == 0.0 or self.fair_share_lend_factor >= 1.0):
            raise ValueError(f"fair_share_lend_factor must be 0 (never lend) or at least 1, "
                             f"not {self.fair_share_lend_factor!r}")

    def with_(self, **changes: float | bool | None) -> PolicyOptions:
        return replace(self, **changes)  # type: ignore[arg-type]


#: The presets: every caller (daemon settings, simulator, benchmarks, tests) starts from one.
#: ``CORE``: the allocator as specified, nothing added (unit tests, the allocator benchmark).
CORE = PolicyOptions()
#: ``LIVE``: what a live cluster needs beyond a replay (docs/allocator.md, "Live
#: robustness"): a fixed 10 % keep margin on top of the measured rate noise (co-location and
#: placement make live rates move between measurements; without it two jobs traded nodes on
#: the dev cluster) and a hole-model prior floor (a small cluster's few holes are not
#: representative). Measured: the e2e test passed with these; without them the jobs did not
#: regrow after the batch job.
LIVE = PolicyOptions(keep_margin=0.1, hole_prior_floor=0.1)
#: ``REPLAY``: the simulator's (docs/evaluation.md): unplanned nodes valued over 120 s or three
#: times their idle age if longer (both chosen on the tuning half of benchmarks/evaluate.py)
#: and grouped into reclaim events of 1 s, throughput in work units. The finish-aware
#: valuation is off (finish_weight 0, chosen on the tuning half: 0 and 0.25 tie, 0.5 is worse);
#: ``--set finish_weight=0.5`` turns it on within 24 h, a slot priced at its 24 h average.
REPLAY = PolicyOptions(estimate_horizon_s=120.0, estimate_age_factor=3.0, reclaim_group_s=1.0,
                       finish_weight=0.0, finish_horizon_s=86400.0, finish_outlook_s=86400.0,
                       work_units=True)
PRESETS = {"core": CORE, "live": LIVE, "replay": REPLAY}

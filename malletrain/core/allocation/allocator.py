"""malletrain's Resource Allocator: exact node counts by dynamic programming, then node choice.

Formulation as built (docs/allocator.md has the derivation and the why)
-----------------------------------------------------------------------
Every node ``i`` gets an *effective window* ``w_i``: its predicted remaining idle
time (Slurm's backfill plan, ``IdleNode.window_s``) or, where nothing is planned,
the expected remaining idle time given its idle age from the learned hole-length
distribution (:mod:`malletrain.core.scavenging.holes`), both capped at the horizon ``H``; and
a *reclaim probability* ``p_i``: the chance that Slurm takes it back within ``H``.

A job ``j`` that holds a set ``A`` of ``n`` nodes keeps running as its nodes are
reclaimed one by one in window order, so with its nodes ranked by descending
window ``w_(1) >= ... >= w_(n)`` its work over the horizon is::

    work_j(A) = r_j(m) * w_(m) + sum_{k=m+1..n} (r_j(k) - r_j(k-1)) * w_(k)

(``m`` = min_nodes: below it the job stops), each reclaim event costs a
scale-down at the rate it had then (``d_j * r_j(k) * p_(k)`` for the last node
``k`` of each event; nodes with the same planned window are one event: a pending
job starts on all of them at once), and changing the
size now costs ``u_j * r_j(c_j)`` (grow) or ``d_j * r_j(c_j)`` (shrink), as in
FreeTrain; starting from zero costs ``s_j * r_j(n)`` (the start-up, where FreeTrain
starts for free), and shrinking a running job counts its forgone work ``1 + margin``
times (hysteresis against trading nodes on measurement noise). With ``w_i = Tfwd``
for all nodes, no reclaims, no start cost and no margin this is exactly FreeTrain's
objective; per-node windows make a node that
will be reclaimed in 40 s worth 40 s of its marginal throughput minus a
scale-down, so a 20 s scale-up onto it does not pay, while a long hole does.

Which nodes a count means is fixed per job, so that the count problem stays a
multiple-choice knapsack that dynamic programming solves *exactly*: a job of
``n <= c`` keeps its ``n`` longest-window nodes (releases those about to be
reclaimed first); a job of ``n > c`` keeps all its nodes and grows onto the
longest windows of the free pool (then nodes others may release, valued at the
shortest window among them, since others release their shortest first), with the
windows merged into one ranking. Every job is valued against
the pool's best windows; the node-choice step then hands the pool out longest
window first in order of the value each job gains per new node, so jobs growing
at the same decision share the top of the pool. Where that sharing makes a plan shrink
running jobs for growers that will not get those windows, the plan check
(:mod:`malletrain.core.allocation.plan_check`) values it on the nodes really handed out.

Solving: ``f_j(t)`` = best value of jobs ``1..j`` on at most ``t`` nodes,
``f_j(t) = max(f_{j-1}(t) + V_j(0), max_{n in [min_j, max_j]} f_{j-1}(t-n) + V_j(n))``,
vectorised over ``t`` with numpy: O(jobs x nodes x sizes), no solver.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from malletrain.core.allocation.fairness import FairRule, input_counts
from malletrain.core.allocation.finish import SlotOutlook, finish_weights, slot_rate
from malletrain.core.allocation.hetero import decide_by_type, is_typed
from malletrain.core.allocation.placement import node_names
from malletrain.core.allocation.plan_check import (
    Solution,
    TableOf,
    better_plan,
    weighted,
)
from malletrain.core.allocation.spread import with_spread_penalty
from malletrain.core.allocation.valuation import (
    NodeOffer,
    no_exploration_beyond_free,
    node_offer,
    offer_value_table,
    rates_upto,
)
from malletrain.core.allocation.work_units import in_work_units
from malletrain.core.model import AllocationInput, Plan
from malletrain.core.options import PolicyOptions
from malletrain.core.scavenging.holes import HoleLengthModel, HoleTracker

log = logging.getLogger(__name__)


@dataclass
class MalleTrainPolicy:
    """malletrain's allocator as a :class:`~malletrain.core.model.Policy`.

    Keeps one piece of learned state: the hole-length distribution, fed from the
    idle-node lists it is given (a node that disappears was reclaimed).

    Two terms keep it from moving nodes on noise (measured live on the dev cluster,
    where every move is a real 15-25 s start-up): a job at zero nodes pays its start-up
    (``charge_start``; ``MalleableJob.start_s``, default its scale-up cost) instead of
    starting for free, and a running job's forgone work counts ``1 + m_j`` times, so a
    node moves away from a running job only if the receiver gains ``m_j`` (relative)
    more than the giver loses. ``m_j = keep_margin + noise_margin * rate_noise_j``: the
    hysteresis scales with how noisy the job's measured throughput is (5 sigma of one
    job's rate is ~3.5 sigma of the difference between two such estimates). Learned curves
    of two copies of one model differ by a few percent of measurement noise; without
    these terms the policy swapped whole allocations between them at every decision.
    Where rates are exact (the simulator's replay) the margin is ``keep_margin``
    (default 0): a fixed 5-10 % margin cost up to 3 % of the samples on a Philly replay,
    where it kept nodes on jobs that scale worse. With ``keep_margin=0``,
    ``noise_margin=0`` and ``charge_start=False`` the objective is FreeTrain's.
    """

    name: str = "malletrain"
    horizon_s: float = 1800.0
    holes: HoleTracker = field(default_factory=HoleTracker)
    keep_margin: float = 0.0
    noise_margin: float = 5.0
    charge_start: bool = True
    #: Horizon for windows estimated from the hole model (nodes Slurm plans nothing
    #: for), capped by ``horizon_s``; ``None``: ``horizon_s``. See effective_windows.
    #: The simulator's replays use 120 s (preset malletrain.core.options.REPLAY).
    estimate_horizon_s: float | None = None
    #: An unplanned node idle for ``a`` seconds is valued over at least
    #: ``estimate_age_factor x a`` (still capped by ``horizon_s``; 0: off; replays: 3).
    #: See effective_windows.
    estimate_age_factor: float = 0.0
    #: Unplanned nodes that turned idle within the same slot of this many seconds share
    #: one reclaim event (0: off; replays: 1 s, to the second; the daemon: off for now).
    reclaim_group_s: float = 0.0

    #: Exploration uses free nodes only: at counts that need nodes another running job
    #: must release (beyond what a job holds plus the free pool), its throughput is
    #: valued without the optimistic extension beyond its largest measured size
    #: (``ThroughputModel.measured_max_nodes``; ``None`` there: the curve is trusted).
    explore_free_only: bool = True

    #: Finish-aware valuation (0: off; replays: 0.5, preset malletrain.core.options.REPLAY):
    #: while jobs wait for an admission slot, a job that can finish within
    #: ``finish_horizon_s`` at its present rate counts its samples ``1 + beta_j`` times,
    #: ``beta_j = finish_weight x sigma / r_j`` (at most ``finish_weight_cap``), ``sigma``
    #: what one more admitted job would add at the plan's node price. See finish_weights.
    finish_weight: float = 0.0
    finish_horizon_s: float = 24 * 3600.0
    finish_weight_cap: float = 1.0
    #: > 0: a slot is worth at least its average over about this many seconds
    #: (:class:`~malletrain.core.allocation.finish.SlotOutlook`); 0: as of now.
    finish_outlook_s: float = 0.0
    outlook: SlotOutlook | None = field(default=None, repr=False, compare=False)

    def finish_weights(self, inp: AllocationInput, sigma: float) -> np.ndarray:
        """``beta_j`` per job (:func:`malletrain.core.allocation.finish.finish_weights`)."""
        if self.finish_outlook_s > 0:
            if self.outlook is None:
                self.outlook = SlotOutlook(self.finish_outlook_s)
            sigma = self.outlook.update(inp.now_s, sigma)
        return finish_weights(inp, sigma, self.finish_weight, self.finish_horizon_s,
                              self.finish_weight_cap)

    def state_dict(self) -> dict[str, Any]:
        """What the policy learned (the hole-length distribution), for the daemon's store."""
        return {"holes": self.holes.model.to_dict()}

    def load_state(self, data: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (ValueError if malformed)."""
        if not isinstance(data, dict) or not isinstance(data.get("holes"), dict):
            raise ValueError("malletrain policy state: expected a mapping with 'holes'")
        model = HoleLengthModel.from_dict(data["holes"])
        model.prior_floor = self.holes.model.prior_floor  # a setting, not learned state
        self.holes.model = model

    def effective_windows(self, inp: AllocationInput) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(w_i, p_i, key_i) per node of ``inp.nodes``.

        Capped window, probability of reclaim within the horizon, and the reclaim
        event: nodes with the same predicted window are taken back at the same
        moment (a pending job starting on them), so a job pays one scale-down
        for all of them.

        Nodes without a plan get the hole model's estimate over ``estimate_horizon_s``
        where set (replays: 120 s): beyond a few minutes the estimate extrapolates the
        hole-length tail, and an allocation on a trace that changes every minute or two
        is re-decided long before 30 minutes are up. A node idle for ``a`` seconds is
        valued over ``estimate_age_factor x a`` if that is longer: its age is evidence for
        as long again (a hole's remaining length grows with its age), and with a short
        horizon on every node a job that lost one node to a reclaim never took a free
        long-idle node back: 18 s of scale-up against 120 s of one node's gain (Philly,
        docs/evaluation.md). With ``reclaim_group_s`` > 0 (replays:
        1 s), unplanned nodes that turned idle in the same slot (``now - idle_age``) are
        one reclaim event when they may be reclaimed within that horizon: they were freed
        together (one job ended) and the youngest are taken back first, together, so a job
        that already holds some of them pays one scale-down for more of the same and the
        allocator concentrates the nodes most likely to be reclaimed on few jobs (fewer
        jobs disrupted per reclaim). Measured on Philly slices in docs/evaluation.md
        ("Reducing Philly's losses"). Other estimated nodes are independent events (key
        NaN). Keys never collide: planned ones are windows (>= 0), grouped ones <= -1.
        """
        h = self.horizon_s
        nodes = inp.nodes
        count = len(nodes)
        # vectorised: a per-node loop of numpy scalar stores was ~8 ms at 5,000 nodes
        planned = np.fromiter((n.window_s is not None for n in nodes), dtype=bool, count=count)
        raw = np.fromiter(
            (0.0 if n.window_s is None else n.window_s for n in nodes), dtype=float, count=count
        )
        win = np.maximum(raw, 0.0)
        w = np.minimum(win, h)
        p = np.where(win < h, 1.0, 0.0)
        key = np.where(planned, win, np.nan)
        unknown = np.flatnonzero(~planned)
        if unknown.size:
            ages = np.fromiter(
                (nodes[i].idle_age_s for i in unknown.tolist()), dtype=float, count=unknown.size
            )
            h_est: float | np.ndarray = (
                h if self.estimate_horizon_s is None else min(h, self.estimate_horizon_s)
            )
            if self.estimate_age_factor > 0:
                h_est = np.clip(ages * self.estimate_age_factor, h_est, h)
            rem, p_end = self.holes.model.expected_remaining_s(ages, h_est)
            w[unknown] = rem
            p[unknown] = p_end
            if self.reclaim_group_s > 0:
                slot = np.floor((inp.now_s - ages) / self.reclaim_group_s + 0.5)
                key[unknown] = np.where(p_end > 0.0, -1.0 - (slot - slot.min()), np.nan)
        return w, p, key

    #: Value throughput in each job's own one-node rate (node-seconds of useful work)
    #: instead of samples: samples of different models do not add up, and in samples a
    #: model with a high rate per node would outbid every other (preset ``REPLAY``).
    work_units: bool = False

    #: Divide the nodes among users before jobs (:mod:`.fairness`); off: user-blind.
    fair_share: bool = True
    #: The odd nodes' turn length when there are fewer than users (:func:`.fair_turn`).
    fair_turn_s: float = 600.0
    #: >= 1: a user's part is lent where other users' jobs gain that many times more from
    #: it than its own lose (:func:`.fairness.lend`); 0: never.
    fair_share_lend_factor: float = 0.0
    #: > 0: a node past a job's minimum that adds less than this times its rate per node
    #: there is offered to the other users first (:func:`.fairness.useful_sizes`).
    fair_share_min_gain: float = 0.0
    #: A user Slurm took nodes from waits within this many of its part (:func:`.within_slack`)
    fair_share_slack_nodes: int = 0
    #: job id -> (the nodes it held that its last plan kept, when Slurm last took one)
    _kept: dict[str, tuple[frozenset[str], float]] = field(default_factory=dict, repr=False)

    def decide(self, inp: AllocationInput) -> Plan:
        t0 = time.perf_counter()
        inp = with_spread_penalty(inp)
        if self.work_units:
            inp = in_work_units(inp)
        self.holes.update(inp.now_s, inp.nodes)
        self._note_reclaims(inp)
        if is_typed(inp):
            # several node types, or jobs that see types: one type per job (core.hetero)
            assignments, objective = decide_by_type(self, inp)
        else:
            assignments, objective = self.assign(inp)
        self._kept = {j.job_id: (frozenset(j.nodes).intersection(assignments.get(j.job_id, ())),
                                 self._kept.get(j.job_id, (frozenset(), -math.inf))[1])
                      for j in inp.jobs}
        return Plan(assignments, objective, decision_s=time.perf_counter() - t0)

    #: Price the plan on the nodes the placement step really hands out, beside the plan in
    #: which no running job gives a node up, and keep the better (:mod:`.plan_check`).
    check_plans: bool = True

    def assign(self, inp: AllocationInput, price_per_node_s: float = 0.0
               ) -> tuple[dict[str, tuple[str, ...]], float]:
        """Counts and node names for ``inp`` without learning from it: (assignments, objective)."""
        sol = self._solution(inp, price_per_node_s)
        positions = sol.place(inp, sol.counts)
        objective = sol.objective
        if self.check_plans and sol.shrinks(inp):
            positions, objective = better_plan(inp, sol, positions, fair=self.fair_share)
        return node_names(inp, positions), objective

    def solve(self, inp: AllocationInput, price_per_node_s: float = 0.0
              ) -> tuple[dict[str, int], float, np.ndarray, list[str]]:
        """The count problem alone: (counts, objective, node windows, growth order).

        ``price_per_node_s``: each node a job holds costs this per second of its window (a
        job at ``n`` nodes is charged for the ``n`` longest windows: an upper estimate).
        """
        sol = self._solution(inp, price_per_node_s)
        return sol.counts, sol.objective, sol.w, sol.growth_order(inp, sol.counts)

    def _solution(self, inp: AllocationInput, price_per_node_s: float) -> Solution:
        values, w, p, key, offer, table, unexplored = self._tables(inp, price_per_node_s)
        if offer is None:
            return Solution({}, 0.0, w, p, key, values, None, table)
        count_arr, objective = self._counts(inp, values, offer, unexplored)
        if (
            self.finish_weight > 0
            and inp.queued_jobs != 0
            and any(j.remaining_samples is not None for j in inp.jobs)
        ):
            # finish-aware: price the slot at the unweighted plan, then solve the weighted
            # table (exact for the weighted samples; see finish_weights)
            beta = self.finish_weights(inp, slot_rate(inp, count_arr))
            if beta.any():
                values = values * (1.0 + beta)[:, None]
                if unexplored is not None:
                    unexplored = unexplored * (1.0 + beta)[:, None]
                count_arr, objective = self._counts(inp, values, offer, unexplored)
                table = weighted(table, 1.0 + beta)
        counts = {job.job_id: int(n) for job, n in zip(inp.jobs, count_arr, strict=True)}
        return Solution(counts, objective, w, p, key, values, offer, table)

    def _note_reclaims(self, inp: AllocationInput) -> None:
        """A job without a node it held and its last plan kept lost it to Slurm now (a grow
        the daemon has not placed yet is not a loss: those nodes were not held)."""
        for j in inp.jobs:
            kept, _ = self._kept.get(j.job_id, (frozenset(), -math.inf))
            if not kept.issubset(j.nodes):
                self._kept[j.job_id] = (kept, inp.now_s)

    def _counts(self, inp: AllocationInput, values: np.ndarray, offer: NodeOffer,
                unexplored: np.ndarray | None = None) -> tuple[np.ndarray, float]:
        """The counts and their objective (:func:`.fairness.input_counts`)."""
        turn_s = self.fair_turn_s
        reclaimed = frozenset(k for k, (_, t) in self._kept.items() if inp.now_s - t < turn_s)
        return input_counts(inp, values, offer.n_free, unexplored, FairRule(
            self.fair_share, turn_s, self.fair_share_lend_factor,
            self.fair_share_min_gain, self.fair_share_slack_nodes), reclaimed)

    def value_table(self, inp: AllocationInput, price_per_node_s: float = 0.0
                    ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """(V[job, count], node windows, each job's own node indices by descending window);
        ``price_per_node_s`` as in :meth:`solve`."""
        values, w, _, _, offer, _, _ = self._tables(inp, price_per_node_s)
        return values, w, [] if offer is None else offer.own_idx

    def _tables(self, inp: AllocationInput, price_per_node_s: float
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, NodeOffer | None,
                           TableOf, np.ndarray | None]:
        """The value table on the pool's offer, the function that values any other offer the
        same way (the plan check values the nodes really handed out), and the table before
        ``explore_free_only`` where that rule changed it (else None)."""
        w, p, key = self.effective_windows(inp)
        start = None
        if self.charge_start:
            start = np.array(
                [j.scale_up_s if j.start_s is None else j.start_s for j in inp.jobs], dtype=float
            )
        margins = np.array(
            [self.keep_margin + self.noise_margin * max(0.0, j.rate_noise) for j in inp.jobs]
        )
        weights = np.array([j.weight for j in inp.jobs], dtype=float)
        # every job's rates up to any count a table asks (once: the plan check asks again)
        top = max((max(min(j.max_nodes, len(j.nodes) + len(inp.nodes)), j.min_nodes,
                       len(j.nodes)) for j in inp.jobs), default=0)
        rates = np.stack([rates_upto(j.throughput, top) for j in inp.jobs]) if inp.jobs else None

        def table(offer: NodeOffer, rows: np.ndarray | None = None,
                  unexplored: list[np.ndarray] | None = None) -> np.ndarray:
            jobs = inp.jobs if rows is None else [inp.jobs[j] for j in rows.tolist()]
            first = start if start is None or rows is None else start[rows]
            margin = margins if rows is None else margins[rows]
            weight = weights if rows is None else weights[rows]
            values = offer_value_table(jobs, offer, first, margin,
                                       None if rates is None else
                                       rates if rows is None else rates[rows])
            if (weight != 1.0).any():  # --nice: within the user's part (MalleableJob.weight)
                values *= weight[:, None]
            if self.explore_free_only and offer.beyond_free:
                if unexplored is not None:
                    unexplored.append(values.copy())
                no_exploration_beyond_free(values, jobs, offer, first, margin)
            if price_per_node_s > 0 and values.shape[1] > 1:
                longest = np.sort(w)[::-1][: values.shape[1] - 1]
                charge = np.concatenate(([0.0], np.cumsum(longest)))
                for priced in (values, *(unexplored or ())):
                    priced[:, : charge.size] -= price_per_node_s * charge
            return values

        if not inp.jobs:
            return np.zeros((0, 1)), w, p, key, None, table, None
        offer = node_offer(inp, w, p, key)
        unexplored: list[np.ndarray] = []
        values = table(offer, unexplored=unexplored)
        return values, w, p, key, offer, table, unexplored[0] if unexplored else None


def malletrain_policy(options: PolicyOptions, name: str = "malletrain",
                      explore_free_only: bool = True) -> MalleTrainPolicy:
    """The policy ``make_policy("malletrain", options)`` builds (the knobs: PolicyOptions)."""
    return MalleTrainPolicy(
        name=name,
        horizon_s=options.horizon_s,
        holes=HoleTracker(HoleLengthModel(prior_floor=options.hole_prior_floor)),
        keep_margin=options.keep_margin,
        estimate_horizon_s=options.estimate_horizon_s,
        estimate_age_factor=options.estimate_age_factor,
        reclaim_group_s=options.reclaim_group_s,
        explore_free_only=explore_free_only,
        finish_weight=options.finish_weight,
        finish_horizon_s=options.finish_horizon_s,
        finish_outlook_s=options.finish_outlook_s,
        work_units=options.work_units,
        fair_share=options.fair_share,
        fair_turn_s=options.fair_turn_s,
        fair_share_lend_factor=options.fair_share_lend_factor,
        fair_share_min_gain=options.fair_share_min_gain,
        fair_share_slack_nodes=int(options.fair_share_slack_nodes),
    )

"""Fair shares among users: the jobs sized within each user's part of the nodes.

:mod:`.shares` divides the nodes on offer among users (and accounts): max-min fair,
work-conserving, odd nodes and raised minimums in turns. Within its part, a user's jobs are
sized by the same exact count problem as before (:func:`~.knapsack.solve_counts`), so rescale
costs, margins and throughput decide among one user's jobs: a user who submits twenty jobs
gets one user's part, not twenty jobs' worth, and a job whose reports claim a higher rate
moves nodes only within its own user's part. Only the nodes past every user's part for its
jobs' useful sizes go across users by what they add (:mod:`.across`). Slurm's limits
(``AllocationInput.caps``: ``MaxTRESPerUser``, ``GrpTRES``, ...) cap what the users and
accounts they bind may hold together before the division, so what a capped user cannot hold
goes to the others too; a part its owner's jobs gain far less from than others' may be lent
(:func:`lend_evenly`, off but in the replays). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from malletrain.core.allocation.across import lend, per_node_rates, rest_by_value
from malletrain.core.allocation.knapsack import solve_counts, solve_many
from malletrain.core.allocation.shares import (
    FairTree,
    Unit,
    fair_tree,
    fair_turn,
    member_shares,
    tree_caps,
    user_caps,
    within_slack,
)
from malletrain.core.allocation.valuation import rates_upto
from malletrain.core.model import AllocationInput, MalleableJob


@dataclass(frozen=True)
class FairRule:
    """How the allocator divides the nodes among users (``MalleTrainPolicy``'s ``fair_*``
    knobs, :class:`~malletrain.core.options.PolicyOptions` documents each)."""

    on: bool = True          # off: user-blind (Slurm's limits are still held)
    turn_s: float = 600.0    # the odd nodes' turns (:func:`.shares.fair_turn`)
    lend_factor: float = 0.0  # :func:`lend_evenly` (0: never)
    min_gain: float = 0.0    # :func:`useful_sizes` (0: strict parts)
    slack_nodes: int = 0     # :func:`.shares.within_slack`


def input_counts(inp: AllocationInput, values: np.ndarray, n_free: int,
                 unexplored: np.ndarray | None, rule: FairRule,
                 reclaimed: frozenset[str] = frozenset()) -> tuple[np.ndarray, float]:
    """The counts of ``inp``'s jobs on the value table ``values`` and their objective: one
    count problem (one user, no limits), else each user's jobs within its part
    (:func:`solve_fair`); ``unexplored``: ``values`` before ``explore_free_only`` (a user
    may explore onto the nodes its part moves to it); ``n_free``: the free pool;
    ``reclaimed``: the jobs Slurm took nodes from within the last turn (their users wait,
    :func:`.shares.within_slack`)."""
    tree = fair_tree(inp) if rule.on and inp.account_weights else None
    users = tree.members if tree else [j.user if rule.on else "" for j in inp.jobs]
    if not inp.caps and len(set(users)) <= 1:
        return solve_counts(values, len(inp.nodes))
    return solve_fair(
        values, users, [len(j.nodes) for j in inp.jobs],
        len(inp.nodes), [j.limits for j in inp.jobs], inp.caps,
        tree.weights if tree else inp.user_weights, tree, fair_turn(inp.now_s, rule.turn_s),
        rule.lend_factor if rule.on else 0.0, unexplored if rule.on else None, n_free,
        job_useful_sizes(inp.jobs, values.shape[1], rule.min_gain if rule.on else 0.0),
        rule.slack_nodes if rule.on else 0,
        frozenset(k for k, j in zip(users, inp.jobs, strict=True) if j.job_id in reclaimed),
        _rest_scale(inp, users, tree))


def _rest_scale(inp: AllocationInput, users: Sequence[str], tree: FairTree | None
                ) -> np.ndarray:
    """Per job, the unit the rest is compared in (:func:`.across.rest_by_value`): its rate
    per node at its minimum (:func:`.across.per_node_rates`), over its user's share
    (:func:`.shares.member_shares`) where users are weighted. Weighted by Slurm's fair-share
    factor (``tests/e2e/test_sshare.py``), bob entitled to 6 of 8 nodes held 3 and alice
    kept 5: both jobs' early curves made their useful sizes ~3, and valued alike the 2
    nodes past them stayed where keeping costs nothing."""
    rates = per_node_rates(inp.jobs)
    if tree is None and not inp.user_weights:
        return rates
    share = member_shares(users, tree.weights if tree else inp.user_weights, tree)
    return np.asarray(rates / np.array([share[u] for u in users]), dtype=float)


def cap_demand(demand: Mapping[Unit, int], held: Mapping[Unit, int],
               caps: Mapping[str, int]) -> dict[Unit, int]:
    """Each unit's demand held to the caps on its keys: the units carrying a key share the
    key's cap max-min (the most specific keys first), so the units under every key add up
    to at most its cap, whatever each unit's jobs are then given within its demand."""
    out = dict(demand)
    carriers: dict[str, list[Unit]] = {}
    for unit in demand:
        for key in unit[1]:
            if key in caps:
                carriers.setdefault(key, []).append(unit)
    for key in sorted(carriers, key=lambda k: (len(carriers[k]), k)):
        units = carriers[key]
        share = user_caps({u: out[u] for u in units}, held, max(0, caps[key]))
        for u in units:
            out[u] = min(out[u], share[u])
    return out


def _unit_caps(demand: Mapping[Unit, int], held: Mapping[Unit, int],
               user_cap: Mapping[str, int]) -> dict[Unit, int]:
    """A user's fair part divided among its units (jobs under different limits), max-min."""
    by_user: dict[str, list[Unit]] = {}
    for unit in demand:
        by_user.setdefault(unit[0], []).append(unit)
    out: dict[Unit, int] = {}
    for user, units in by_user.items():
        if len(units) == 1:
            out[units[0]] = min(user_cap[user], demand[units[0]])
        else:
            out.update(user_caps({u: demand[u] for u in units}, held, user_cap[user]))
    return out


def _least_sizes(finite: np.ndarray, units: Mapping[Unit, list[int]]) -> dict[str, int]:
    """Per user: the fewest nodes one of its jobs can run on (``finite``: its allowed counts)."""
    smallest = np.where(finite[:, 1:].any(axis=1), 1 + np.argmax(finite[:, 1:], axis=1), 0)
    least: dict[str, int] = {}
    for u, idx in units.items():
        runs = [int(n) for n in smallest[idx] if n > 0]
        if runs:
            least[u[0]] = min(least.get(u[0], runs[0]), *runs)
    return least


def _units(users: Sequence[str], keys: Sequence[tuple[str, ...]] | None,
           caps: Mapping[str, int]) -> dict[Unit, list[int]]:
    """The jobs of each unit: one user under one set of the ``caps``' keys."""
    units: dict[Unit, list[int]] = {}
    for j, user in enumerate(users):
        own = tuple(sorted(k for k in keys[j] if k in caps)) if keys and caps else ()
        units.setdefault((user, own), []).append(j)
    return units


def solve_fair(values: np.ndarray, users: Sequence[str], held: Sequence[int], capacity: int,
               keys: Sequence[tuple[str, ...]] | None = None,
               caps: Mapping[str, int] | None = None, weights: Mapping[str, float] | None = None,
               tree: FairTree | None = None, turn: int | None = None,
               lend_factor: float = 0.0, unexplored: np.ndarray | None = None,
               n_free: int = 0, useful: np.ndarray | None = None,
               slack: int = 0, waiting: frozenset[str] = frozenset(),
               scale: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """:func:`solve_counts` with each user's jobs held to the user's fair share and to the
    ``caps`` on their ``keys``.

    ``users[j]``, ``held[j]``: job j's user and the nodes it holds now; ``keys[j]``: the
    limits its nodes count against (``AllocationInput.caps``: Slurm's per-user, per-account
    and QOS limits); ``weights``: users' share weights (``AllocationInput.user_weights``);
    ``tree``: accounts above users (``users`` are then its members, :func:`.shares.tree_caps`);
    ``turn``: the odd nodes' turn (:func:`.shares.user_caps`); ``lend_factor``:
    :func:`lend_evenly`; ``unexplored``, ``n_free``: :func:`_unit_rows`; ``useful[j]``: the
    largest size of job j the division counts (:func:`useful_sizes`; the nodes past it go
    where they add the most once every user's part is met); ``scale[j]``: job j's rate per
    node at its minimum, what the rest is compared in (:func:`.across.rest_by_value`);
    ``slack``, ``waiting``: a user Slurm took nodes from may wait for nodes held above
    others' parts while within ``slack`` of its part (:func:`.shares.within_slack`). One
    user and no caps: exactly :func:`solve_counts`. The jobs of one user under the same keys
    are one *unit*, sized by one exact count problem. Each round solves every unit within
    its cap; a unit whose best plan uses fewer nodes gives the rest back, and the parts are
    divided again (at most one round per unit); the nodes no unit took then go where they
    add the most (:func:`.across.rest_by_value`)."""
    caps = caps or {}
    units = _units(users, keys, caps)
    if len({u[0] for u in units}) <= 1 and not any(u[1] for u in units):
        return solve_counts(values, capacity)
    finite = np.isfinite(values)
    largest = np.where(finite.any(axis=1), values.shape[1] - 1 - np.argmax(finite[:, ::-1],
                                                                            axis=1), 0)
    holding = {u: int(sum(held[j] for j in idx)) for u, idx in units.items()}
    wants = cap_demand({u: int(largest[idx].sum()) for u, idx in units.items()}, holding, caps)
    demand = wants if useful is None else cap_demand(
        {u: int(np.minimum(largest[idx], useful[idx]).sum()) for u, idx in units.items()},
        holding, caps)
    parts_of = _divider(tree, weights, turn, _least_sizes(finite, units))
    solved: dict[tuple[Unit, int], tuple[np.ndarray, float]] = {}
    rows = None if unexplored is None else values.copy()  # as each unit was sized
    most = _by_user(wants, holding)[0]
    kept = (parts_of if slack <= 0 else
            lambda d, h, n: within_slack(parts_of(d, h, n), h, slack, waiting, most))
    counts, total = _rounds(units, holding, demand, (kept, parts_of), solved,
                            lambda u, idx, cap: _unit_rows(values, unexplored, idx, held,
                                                           n_free, cap - holding[u]),
                            capacity, rows, wants, scale)
    if lend_factor < 1.0:  # (0: never lend)
        return counts, total
    fair = _Fair(values if rows is None else rows, tuple(users), tuple(held), capacity, keys,
                 caps, weights, tree, turn, scale)
    return lend_evenly(fair, units, counts, total, wants, lend_factor, solved)


#: divides nodes among users: (each user's demand, what it holds, the nodes) -> its part
PartsOf = Callable[[dict[str, int], dict[str, int], int], dict[str, int]]


def _divider(tree: FairTree | None, weights: Mapping[str, float] | None, turn: int | None,
             least: Mapping[str, int]) -> PartsOf:
    """The division among users (``tree``: down the account tree) as :data:`PartsOf`."""
    def parts_of(user_demand: dict[str, int], user_held: dict[str, int],
                 nodes: int) -> dict[str, int]:
        return (tree_caps(user_demand, user_held, nodes, weights, tree.parents,
                          tree.account_weights, turn, least, tree.account_parents) if tree else
                user_caps(user_demand, user_held, nodes, weights, turn, least))
    return parts_of


#: a unit's rows of the value table when sized within a cap: (unit, its jobs, cap) -> rows
UnitRows = Callable[[Unit, list[int], int], np.ndarray]


def _by_user(demand: Mapping[Unit, int], holding: Mapping[Unit, int]
             ) -> tuple[dict[str, int], dict[str, int]]:
    """The units' demand and holdings summed per user."""
    user_demand: dict[str, int] = {}
    user_held: dict[str, int] = {}
    for u in demand:
        user_demand[u[0]] = user_demand.get(u[0], 0) + demand[u]
        user_held[u[0]] = user_held.get(u[0], 0) + holding[u]
    return user_demand, user_held


def _rounds(units: Mapping[Unit, list[int]], holding: Mapping[Unit, int],
            demand: dict[Unit, int], dividers: tuple[PartsOf, PartsOf],
            solved: dict[tuple[Unit, int], tuple[np.ndarray, float]],
            unit_rows: UnitRows, capacity: int,
            rows: np.ndarray | None, wants: Mapping[Unit, int] | None = None,
            scale: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Divide (``dividers[0]`` of the users' demand and holdings), size each unit within its
    part on its ``unit_rows`` (written into ``rows`` unless None), lower the demand of a unit
    that used less, again, until no unit gives back; then what no unit took goes where it
    adds the most, up to each unit's ``wants`` (:func:`.across.rest_by_value`), each unit
    explored up to its part of it by ``dividers[1]`` (:func:`_rest_parts`): (counts,
    objective)."""
    parts_of, rest_parts_of = dividers
    counts = np.zeros(sum(len(idx) for idx in units.values()), dtype=int)
    objective: dict[Unit, float] = {}
    sized: dict[tuple[Unit, int], np.ndarray] = {}  # the rows each (unit, cap) is sized on

    def rows_at(u: Unit, cap: int) -> np.ndarray:
        if (u, cap) not in sized:
            sized[(u, cap)] = unit_rows(u, units[u], cap)
        return sized[(u, cap)]

    def size(u: Unit, cap: int) -> tuple[np.ndarray, float]:
        if (u, cap) not in solved:
            solved[(u, cap)] = solve_counts(rows_at(u, cap), cap)
        return solved[(u, cap)]

    def size_all(caps: Mapping[Unit, int]) -> None:  # (side by side: knapsack.solve_many)
        new = [(u, cap) for u, cap in caps.items() if (u, cap) not in solved]
        solved.update(zip(new, solve_many([(rows_at(u, cap), cap) for u, cap in new]),
                          strict=True))

    wants = dict(demand if wants is None else wants)  # (what the rest is offered up to)
    cap_of: dict[Unit, int] = {}  # the cap of each unit's plan
    for _ in range(len(units)):
        cap_of = _unit_caps(demand, holding, parts_of(*_by_user(demand, holding), capacity))
        size_all(cap_of)
        gave_back = False
        for u, idx in units.items():
            counts[idx], objective[u] = size(u, cap_of[u])
            if int(counts[idx].sum()) < cap_of[u]:
                demand[u] = int(counts[idx].sum())  # more is worth nothing to it now
                gave_back = True
        if not gave_back:
            break
    reach = _rest_parts(units, counts, wants, holding, rest_parts_of, capacity)
    rest_by_value(units, wants, {u: rows_at(u, max(cap_of[u], reach[u])) for u in units},
                  capacity, scale, (counts, objective))
    if rows is not None:
        for u, idx in units.items():
            rows[idx] = rows_at(u, cap_of[u])
    return counts, float(sum(objective.values()))


def _rest_parts(units: Mapping[Unit, list[int]], counts: np.ndarray,
                wants: Mapping[Unit, int], holding: Mapping[Unit, int], parts_of: PartsOf,
                capacity: int) -> dict[Unit, int]:
    """Per unit, what it takes in the rounds (``counts``) plus its part of what no unit took,
    divided by ``parts_of``: the plain weighted division, without a reclaimed user's slack
    (which compares parts to whole holdings: here they are parts of the rest, and ``malletrain
    jobs`` shows the division without it too): the rest values each unit's
    sizes up to there as the rounds value a part (explored onto the nodes the division moves to
    it, :func:`_unit_rows`), and only its measured sizes past it. On the dev cluster
    (``tests/e2e/test_sshare.py``) bob, weighted 2 to alice's 1 and entitled to 6 of 8 nodes,
    held 5: his 6th, unmeasured, was valued at a flat curve (7k) against alice's 3rd (157k), so
    alice kept 3, above the 2 she was shown. (Exploring only each job's next size instead, at
    ``423c38a``: Philly's eight cells cost 3.4 % on average against 1.5 %, worst 10.3 % against
    6.5 %; RICC days 30-33 ``LIVE`` was better, fair 7.4 % ahead against a cost of 5.1 %. Not
    kept.)"""
    took = {u: int(counts[idx].sum()) for u, idx in units.items()}
    left = capacity - sum(took.values())
    more = {u: wants[u] - took[u] for u in units if wants[u] > took[u]}
    if left <= 0 or not more:
        return took
    extra = _unit_caps(more, holding, parts_of(*_by_user(more, holding), left))
    return {u: took[u] + extra.get(u, 0) for u in units}


def _unit_rows(values: np.ndarray, unexplored: np.ndarray | None, idx: Sequence[int],
               held: Sequence[int], n_free: int, moved: int) -> np.ndarray:
    """A unit's rows of ``values``, but ``unexplored``'s (the table before
    ``explore_free_only``) up to each job's size plus the free pool (``n_free``) plus the
    nodes the division ``moved`` to the unit from other users. The rule values a size beyond
    the measured ones at the measured rate where its nodes come from another running job (an
    unmeasured guess must not evict a measured job: the node comes back); across users the
    node does not come back, it is the unit's by the division. Measured live: a user below
    its part stayed there while the other user's jobs held the rest."""
    rows = values[idx]
    if unexplored is None or moved <= 0:
        return rows
    reach = np.asarray(held)[idx] + n_free + moved
    cols = np.arange(values.shape[1])[None, :]
    return np.where(cols <= reach[:, None], unexplored[idx], rows)


@dataclass(frozen=True)
class _Fair:
    """One :func:`solve_fair` problem as given (the lending divides a part of it again)."""

    values: np.ndarray
    users: tuple[str, ...]
    held: tuple[int, ...]
    capacity: int
    keys: Sequence[tuple[str, ...]] | None
    caps: Mapping[str, int]
    weights: Mapping[str, float] | None
    tree: FairTree | None
    turn: int | None
    scale: np.ndarray | None


def lend_evenly(fair: _Fair, units: Mapping[Unit, Sequence[int]], counts: np.ndarray,
                total: float, limit: Mapping[Unit, int], factor: float,
                solved: dict[tuple[Unit, int], tuple[np.ndarray, float]]
                ) -> tuple[np.ndarray, float]:
    """The fair plan ``counts`` (worth ``total``) with what :func:`lend` finds worth lending
    lent: the lenders keep what the lending plan gives them, and the other users' jobs divide
    the rest as :func:`solve_fair` divides any nodes (max-min), so the nodes lent go to no one
    user alone: a job claiming a steep curve gets its user's part of them, no more. Kept
    only if worth more than ``counts`` and within every unit's ``limit`` (its demand held to
    Slurm's caps)."""
    values = fair.values
    lent = lend(values, units, counts, fair.capacity, factor, solved)
    lenders = [j for u, idx in units.items() if lent[idx].sum() < counts[idx].sum()
               for j in idx]
    if not lenders or len(lenders) == len(fair.users):
        return counts, total
    rest = np.setdiff1d(np.arange(len(fair.users)), lenders).tolist()
    sub, _ = solve_fair(values[rest], [fair.users[j] for j in rest],
                        [fair.held[j] for j in rest], fair.capacity - int(lent[lenders].sum()),
                        [fair.keys[j] for j in rest] if fair.keys else None, fair.caps,
                        fair.weights, fair.tree, fair.turn,
                        scale=None if fair.scale is None else fair.scale[rest])
    lent[rest] = sub
    value = float(values[np.arange(len(fair.users)), lent].sum())
    if value <= total or any(int(lent[idx].sum()) > limit[u] for u, idx in units.items()):
        return counts, total
    return lent, value


def job_useful_sizes(jobs: Sequence[MalleableJob], width: int, min_gain: float
                     ) -> np.ndarray | None:
    """:func:`useful_sizes` of ``jobs`` over counts below ``width`` (None: ``min_gain`` 0)."""
    if min_gain <= 0 or not jobs:
        return None
    rates = np.stack([rates_upto(j.throughput, width - 1) for j in jobs])
    return useful_sizes(rates, np.array([j.min_nodes for j in jobs]), min_gain)


def useful_sizes(rates: np.ndarray, min_nodes: np.ndarray, min_gain: float) -> np.ndarray:
    """Per job (``rates[j, n]``: its rate on ``n`` nodes, :func:`.valuation.rates_upto`),
    the largest size up to which every node past its minimum adds at least ``min_gain``
    times its rate per node at its minimum: beyond it a node adds little to that job (its
    curve flattens), and the division offers it to the other users first (``useful`` of
    :func:`solve_fair`)."""
    lo = np.maximum(min_nodes, 1)
    per_node = rates[np.arange(rates.shape[0]), np.minimum(lo, rates.shape[1] - 1)] / lo
    sizes = np.arange(rates.shape[1])[None, :]
    gain = np.diff(rates, axis=1, prepend=0.0)
    low = (sizes > lo[:, None]) & (gain < min_gain * per_node[:, None])
    first_low = np.where(low.any(axis=1), np.argmax(low, axis=1), rates.shape[1])
    return np.asarray(np.maximum(first_low - 1, lo), dtype=np.int64)

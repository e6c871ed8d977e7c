"""Fair shares among users: the nodes are divided among users before jobs.

Every user with a job in the decision is entitled to an equal part of the nodes on offer;
what a user cannot use (its jobs' largest useful sizes add up to less, or it needs fewer
nodes than its part to reach its best value) goes to the others, again in equal parts
(max-min fair, work-conserving). Within its part, a user's jobs are sized by the same exact
count problem as before (:func:`~.knapsack.solve_counts`), so rescale costs, margins and
throughput decide among one user's jobs, never across users: a user who submits twenty jobs
gets one user's part, not twenty jobs' worth, and a job whose reports claim a higher rate
moves nodes only within its own user's part. A node left over after the equal division goes
to the users holding the most nodes now, so that a steady state does not trade nodes back
and forth; but when fewer nodes are left than users holding none (a part of 0), they go in
turns (:func:`fair_turn`): each turn a fixed order of those users that starts one user later,
so a user with a runnable job waits a bounded number of turns and nothing moves within one.
Slurm's limits (``AllocationInput.caps``: ``MaxTRESPerUser``, ``GrpTRES``, ...)
cap what the users and accounts they bind may hold together before the division, so what
a capped user cannot hold goes to the others too. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from malletrain.core.allocation.knapsack import solve_counts
from malletrain.core.model import AllocationInput

#: The jobs of one user under one set of limits (user, the keys of the caps they count
#: against): sized together by one count problem.
Unit = tuple[str, tuple[str, ...]]
K = TypeVar("K", str, Unit)


def fair_turn(now_s: float, turn_s: float) -> int | None:
    """The turn of the decision's clock ``now_s`` (turns of ``turn_s`` seconds; 0: none).

    A pure function of the clock, so every decision within one turn (and ``malletrain
    jobs``'s entitlements) divides the odd nodes the same way, with no state to keep."""
    return int(now_s // turn_s) if turn_s > 0 else None


def user_caps(demand: Mapping[K, int], held: Mapping[K, int], capacity: int,
              weights: Mapping[K, float] | None = None,
              turn: int | None = None, minimum: Mapping[K, int] | None = None) -> dict[K, int]:
    """Max-min fair integer shares of ``capacity`` nodes, none above a user's ``demand``;
    with ``weights``, in proportion to them (a user not named: 1). ``turn``
    (:func:`fair_turn`): when fewer odd nodes are left than users with none, they go to
    those users in name order starting at the ``turn``-th (mod their number): a fixed set of
    ``u`` such users gets a node within ``u`` turns (``u - odd + 1`` with ``odd`` nodes
    throughout). None: to the holders (a user with none may wait as long as they run).
    ``minimum``: the fewest nodes any job of the user can run on; a part below it is raised
    in turns (:func:`_minimums_in_turn`)."""
    caps = _max_min(demand, held, capacity, weights, turn)
    if turn is None or not minimum:
        return caps
    return _minimums_in_turn(caps, demand, held, capacity, weights, turn, minimum)


def _minimums_in_turn(caps: dict[K, int], demand: Mapping[K, int], held: Mapping[K, int],
                      capacity: int, weights: Mapping[K, float] | None, turn: int,
                      minimum: Mapping[K, int]) -> dict[K, int]:
    """A part smaller than every job of its user can run on is worth nothing to that user,
    and given back it went to nobody who could use it either: 10 idle nodes and four users
    whose jobs need 4 each left every node idle, at every decision. So, in turn order (all
    users by name, from the ``turn``-th), a user whose part is below its ``minimum`` gets
    its minimum while the nodes last and no user whose part runs a job loses that, and the
    others divide the rest again: where only such users wait, each waits at most as many
    turns as there are users, and nothing moves within a turn. Minimums of one node are the
    odd nodes' turns' already."""
    names = sorted(demand)
    k = turn % len(names)
    runs = {v for v in names if demand[v] > 0 and caps[v] >= max(1, minimum.get(v, 1))}
    raised: dict[K, int] = {}
    for u in names[k:] + names[:k]:
        need = minimum.get(u, 0)
        left = capacity - sum(raised.values()) - need
        if need <= 1 or caps[u] >= need or need > demand[u] or left < 0:
            continue  # a part of 0 against a minimum of 1: the odd nodes' turns (_max_min)
        rest = {v: d for v, d in demand.items() if v not in raised and v != u}
        again = {**_max_min(rest, held, left, weights, turn), **raised, u: need}
        if any(again[v] < max(1, minimum.get(v, 1)) for v in runs if v != u):
            continue  # never at the cost of a user whose part runs one of its jobs
        raised[u] = need
        caps = again
    return caps


def _max_min(demand: Mapping[K, int], held: Mapping[K, int], capacity: int,
             weights: Mapping[K, float] | None, turn: int | None) -> dict[K, int]:
    caps = dict.fromkeys(demand, 0)
    left = capacity
    # ties: whoever holds more now keeps the odd node (then by name: deterministic)
    active = sorted((u for u in demand if demand[u] > 0), key=lambda u: (-held.get(u, 0), u))
    while left > 0 and active:
        share = _shares(active, left, weights)
        if not any(share.values()):
            if weights:  # the odd nodes to users with none first (a light user is not
                # rounded down to nothing), then to the heaviest
                active.sort(key=lambda u: (caps[u] > 0, -weights.get(u, 1.0)))
            if turn is not None:
                active = _rotation(active, caps, left, turn)
            for u in active[:left]:
                caps[u] += 1
            break
        still: list[K] = []
        for u in active:
            give = min(share[u], demand[u] - caps[u])
            caps[u] += give
            left -= give
            if caps[u] < demand[u]:
                still.append(u)
        active = still
    return caps


def _rotation(active: list[K], caps: Mapping[K, int], left: int, turn: int) -> list[K]:
    """``active`` with the users holding no part first in turn order when ``left`` odd nodes
    cannot give each of them one (else unchanged: nobody is left with nothing)."""
    none = sorted(u for u in active if caps[u] == 0)
    if len(none) <= left:
        return active
    k = turn % len(none)
    return none[k:] + none[:k]


def _shares(active: Sequence[K], left: int, weights: Mapping[K, float] | None
            ) -> dict[K, int]:
    if not weights:
        return dict.fromkeys(active, left // len(active))
    total = sum(weights.get(u, 1.0) for u in active)
    return {u: int(left * weights.get(u, 1.0) / total) for u in active}


@dataclass(frozen=True)
class FairTree:
    """Slurm's fair-share tree: accounts (nested, ``account_parents``) above their users. A
    member is one user in one account (``account/user``: a user with jobs in two accounts
    is a member of each, as in Slurm's tree), ``weights`` its user's weight, ``parents`` its
    account."""

    members: tuple[str, ...]             # per job: its member
    weights: Mapping[str, float]         # member -> its user's weight
    parents: Mapping[str, str]           # member -> account
    account_weights: Mapping[str, float]  # account -> weight (absent: 1)
    account_parents: Mapping[str, str] = field(default_factory=dict)  # account -> parent


def fair_tree(inp: AllocationInput) -> FairTree:
    """The jobs' members of the account tree (``AllocationInput.account_weights`` set)."""
    members = tuple(f"{j.account}/{j.user}" for j in inp.jobs)
    weights = {m: inp.user_weights.get(j.user, 1.0)
               for m, j in zip(members, inp.jobs, strict=True)}
    parents = {m: j.account for m, j in zip(members, inp.jobs, strict=True)}
    return FairTree(members, weights, parents, inp.account_weights, inp.account_parents)


def tree_caps(demand: Mapping[str, int], held: Mapping[str, int], capacity: int,
              weights: Mapping[str, float] | None, parents: Mapping[str, str],
              account_weights: Mapping[str, float], turn: int | None = None,
              minimum: Mapping[str, int] | None = None,
              account_parents: Mapping[str, str] | None = None) -> dict[str, int]:
    """Nested max-min down the account tree: ``capacity`` divided among the top accounts
    (weighted by ``account_weights``, each at most its sub-tree's demand), each account's
    part among its child accounts and its members (members weighted by ``weights``), and so
    on down (``account_parents``; none: one level of accounts), odd nodes in ``turn`` and
    minimums raised (:func:`user_caps`) at every level. Work-conserving at every level: a
    part never exceeds what its sub-tree can use, so the members use it all."""
    up = _acyclic(account_parents or {}, {parents.get(m, "") for m in demand})
    children: dict[str, set[str]] = {}  # "" is the top
    for m in demand:
        children.setdefault(parents.get(m, ""), set()).add(m)
    for account, parent in up.items():
        children.setdefault(parent, set()).add(account)
    out: dict[str, int] = {}
    _divide("", capacity, children, demand, held, weights or {}, account_weights, turn,
            minimum or {}, out)
    return out


def _acyclic(up: Mapping[str, str], accounts: set[str]) -> dict[str, str]:
    """Each of ``accounts`` and their ancestors -> its parent ("" at the top), a cycle (a
    garbled read) broken where the walk meets it again: that account hangs from the top."""
    eff: dict[str, str] = {}
    for start in sorted(a for a in accounts if a):
        path: list[str] = []
        node = start
        while node and node not in eff and node not in path:
            path.append(node)
            node = up.get(node, "")
        for i, account in enumerate(path):
            nxt = path[i + 1] if i + 1 < len(path) else node
            eff[account] = "" if nxt in path[: i + 1] else nxt
    return eff


def _divide(account: str, capacity: int, children: Mapping[str, set[str]],
            demand: Mapping[str, int], held: Mapping[str, int], weights: Mapping[str, float],
            account_weights: Mapping[str, float], turn: int | None,
            minimum: Mapping[str, int], out: dict[str, int]) -> None:
    """``capacity`` among ``account``'s children; members' parts into ``out``."""
    kids = sorted(children.get(account, ()))
    totals = {k: _subtree(k, children, demand, held, minimum) for k in kids}
    parts = user_caps({k: t[0] for k, t in totals.items()},
                      {k: t[1] for k, t in totals.items()}, capacity,
                      {k: (weights.get(k, 1.0) if k in demand else account_weights.get(k, 1.0))
                       for k in kids}, turn,
                      {k: t[2] for k, t in totals.items() if t[2] > 0})
    for k in kids:
        if k in demand:
            out[k] = parts[k]
        else:
            _divide(k, parts[k], children, demand, held, weights, account_weights, turn,
                    minimum, out)


def _subtree(node: str, children: Mapping[str, set[str]], demand: Mapping[str, int],
             held: Mapping[str, int], minimum: Mapping[str, int]) -> tuple[int, int, int]:
    """(demand, held, least minimum) of ``node``'s sub-tree (a member: its own)."""
    if node in demand:
        return demand[node], held.get(node, 0), minimum.get(node, 0)
    total = [0, 0, 0]
    for k in children.get(node, ()):
        d, h, m = _subtree(k, children, demand, held, minimum)
        total[0] += d
        total[1] += h
        if m > 0:
            total[2] = m if total[2] == 0 else min(total[2], m)
    return total[0], total[1], total[2]


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
               lend_factor: float = 0.0) -> tuple[np.ndarray, float]:
    """:func:`solve_counts` with each user's jobs held to the user's fair share and to the
    ``caps`` on their ``keys``.

    ``users[j]``, ``held[j]``: job j's user and the nodes it holds now; ``keys[j]``: the
    limits its nodes count against (``AllocationInput.caps``: Slurm's per-user, per-account
    and QOS limits); ``weights``: users' share weights (``AllocationInput.user_weights``);
    ``tree``: accounts above users (``users`` are then its members, :func:`tree_caps`);
    ``turn``: the odd nodes' turn (:func:`user_caps`); ``lend_factor``: :func:`lend_evenly`.
    One user and no caps: exactly :func:`solve_counts`. The jobs of one user under the same
    keys are one *unit*, sized by one exact count problem. Each round solves every unit
    within its cap; a unit whose best plan uses fewer nodes gives the rest back, and the
    parts are divided again (at most one round per unit)."""
    caps = caps or {}
    units = _units(users, keys, caps)
    if len({u[0] for u in units}) <= 1 and not any(u[1] for u in units):
        return solve_counts(values, capacity)
    finite = np.isfinite(values)
    largest = np.where(finite.any(axis=1), values.shape[1] - 1 - np.argmax(finite[:, ::-1],
                                                                            axis=1), 0)
    least = _least_sizes(finite, units)
    holding = {u: int(sum(held[j] for j in idx)) for u, idx in units.items()}
    demand = cap_demand({u: int(largest[idx].sum()) for u, idx in units.items()}, holding,
                        caps)
    limit = dict(demand)  # (before the rounds lower it to what a unit's plan uses)
    counts = np.zeros(values.shape[0], dtype=int)
    objective: dict[Unit, float] = {}
    solved: dict[tuple[Unit, int], tuple[np.ndarray, float]] = {}
    for _ in range(len(units)):
        user_demand: dict[str, int] = {}
        user_held: dict[str, int] = {}
        for u in units:
            user_demand[u[0]] = user_demand.get(u[0], 0) + demand[u]
            user_held[u[0]] = user_held.get(u[0], 0) + holding[u]
        parts = (tree_caps(user_demand, user_held, capacity, weights, tree.parents,
                           tree.account_weights, turn, least, tree.account_parents) if tree else
                 user_caps(user_demand, user_held, capacity, weights, turn, least))
        unit_cap = _unit_caps(demand, holding, parts)
        gave_back = False
        for u, idx in units.items():
            key = (u, unit_cap[u])
            if key not in solved:
                solved[key] = solve_counts(values[idx], unit_cap[u])
            c, obj = solved[key]
            counts[idx] = c
            objective[u] = obj
            if int(c.sum()) < unit_cap[u]:
                demand[u] = int(c.sum())  # more is worth nothing to this unit now
                gave_back = True
        if not gave_back:
            break
    total = float(sum(objective.values()))
    if lend_factor < 1.0:  # (0: never lend)
        return counts, total
    return lend_evenly(_Fair(values, tuple(users), tuple(held), capacity, keys, caps, weights,
                             tree, turn), units, counts, total, limit, lend_factor, solved)


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
                        fair.weights, fair.tree, fair.turn)
    lent[rest] = sub
    value = float(values[np.arange(len(fair.users)), lent].sum())
    if value <= total or any(int(lent[idx].sum()) > limit[u] for u, idx in units.items()):
        return counts, total
    return lent, value


def unit_floor(values: np.ndarray, counts: np.ndarray) -> int:
    """The nodes a unit keeps whatever it lends: the smallest size at which one of the jobs
    its fair plan ``counts`` runs is worth more than at 0 nodes (``values``), so that its
    best plan there still runs a job: a user whose part fits a job's minimum and whose start
    pays gets nodes (the bound of docs/allocator.md holds whatever is lent)."""
    floor = int(counts.sum())
    for j in np.flatnonzero(counts).tolist():
        gains = np.flatnonzero(values[j, 1:int(counts[j]) + 1] > values[j, 0])
        if gains.size:
            floor = min(floor, int(gains[0]) + 1)
    return floor


def lend(values: np.ndarray, units: Mapping[Unit, Sequence[int]], counts: np.ndarray,
         capacity: int, factor: float,
         solved: dict[tuple[Unit, int], tuple[np.ndarray, float]]) -> np.ndarray:
    """Which nodes of the fair plan ``counts`` are worth lending: each unit's jobs are sized
    on its :func:`unit_floor` alone (its own best plan there), then every other node goes
    to one count problem over all jobs' sizes above their floor sizes, in which a job's own
    nodes up to its fair size count ``factor`` times. So a node of a user's part moves to
    another user's job only where that job gains more than ``factor`` times what the owner's
    jobs lose (rescale costs included): a part is lent only where its owner's marginal value
    per node is far below the others'. The counts of that problem (the caller keeps the
    lenders' and divides the rest fairly again)."""
    base = np.zeros_like(counts)
    for u, idx in units.items():
        key = (u, unit_floor(values[idx], counts[idx]))
        if key not in solved:
            solved[key] = solve_counts(values[idx], key[1])
        base[idx] = solved[key][0]
    width = values.shape[1]
    rows = np.arange(values.shape[0])[:, None]
    cols = np.arange(width)[None, :] + base[:, None]
    shifted = np.where(cols < width, values[rows, np.minimum(cols, width - 1)], -np.inf)
    if factor > 1.0:
        own = np.minimum(np.minimum(cols, np.maximum(counts, base)[:, None]), width - 1)
        shifted += (factor - 1.0) * (values[rows, own] - values[rows, base[:, None]])
    extra, _ = solve_counts(shifted, capacity - int(base.sum()))
    return base + extra

"""How many nodes each user (and account) is entitled to: the division before the jobs.

Every user with a job in the decision is entitled to an equal part (weighted) of the nodes on
offer; what a user cannot use (its jobs' largest sizes add up to less) goes to the others,
again in equal parts: max-min fair, work-conserving (:func:`user_caps`). An odd node left after
the equal division stays with the users holding the most now, so that a steady state does not
trade nodes back and forth; fewer nodes than users holding none, and parts below every one of
a user's jobs' minimums, go in turns (:func:`fair_turn`), so a user with a runnable job waits a
bounded number of turns and nothing moves within one. Slurm's account tree divides level by
level (:func:`tree_caps`). Nodes move from one user to another only to bring a user within a
slack of its part (:func:`within_slack`). Pure; :mod:`.fairness` sizes the jobs within these
parts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

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
    exact = {u: left * weights.get(u, 1.0) / total for u in active}
    # a share within 1e-4 of a whole node is that node: sshare prints factors to six
    # places, and its 0.333333 of 6 nodes (1.999998) made a part of 1, the odd node then
    # going to the heavier user; the plain floors where that would give out more than left
    near = {u: int(x + 1e-4) for u, x in exact.items()}
    return near if sum(near.values()) <= left else {u: int(x) for u, x in exact.items()}


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


def useful_first(first: Mapping[K, int], demand: Mapping[K, int], nodes: int,
                 divide: Callable[[dict[K, int], int], dict[K, int]]) -> dict[K, int]:
    """The parts as :func:`.fairness.solve_fair` divides ``nodes`` where jobs have useful
    sizes (``fair_share_min_gain``): ``divide`` for each user's useful demand (``first``),
    then what no one took, divided again for the rest of each user's ``demand``. For those
    who show the division (``malletrain jobs``' entitlements, the fairness benchmark's
    parts); the allocation sizes the jobs between the two phases."""
    parts = divide(dict(first), nodes)
    more = {k: demand[k] - parts[k] for k in demand if demand[k] > parts[k]}
    left = nodes - sum(parts.values())
    if more and left > 0:
        for k, n in divide(more, left).items():
            parts[k] += n
    return parts


def within_slack(parts: Mapping[K, int], held: Mapping[K, int], slack: int,
                 waiting: Collection[K], most: Mapping[K, int]) -> dict[K, int]:
    """The ``parts`` with each user holding more than its part keeping up to ``slack`` nodes
    more (never past the ``most`` its jobs may hold under Slurm's caps: a user whose limit
    fell would keep nodes it must give back anyway), taken from the parts of the ``waiting``
    users (whose jobs Slurm took nodes from within the last turn) that hold less than theirs
    and more than nothing, none of them lowered below what it holds or more than ``slack``
    below its part.

    The parts follow the pool: on Philly's minute-by-minute idle count every reclaim moved
    nodes between users, each move a shrink of one user's job and a grow of another's
    (under ``LIVE``, 5,520 rescales against the user-blind allocator's 3,603 and 6.4 % of
    the work). So a user that Slurm took a node from waits up to a turn for nodes held by
    users above their parts, unless it is more than ``slack`` below its part or holds
    nothing: every other user, and every user after a turn, gets its whole part after one
    decision and the shrinks it orders (the bound of docs/allocator.md). The sum is
    unchanged."""
    out = dict(parts)
    if slack <= 0 or not waiting:
        return out
    extra = {u: min(held.get(u, 0), parts[u] + slack, most.get(u, 0)) - parts[u]
             for u in parts if min(held.get(u, 0), most.get(u, 0)) > parts[u]}
    room = {u: parts[u] - max(held.get(u, 0), parts[u] - slack)
            for u in parts if u in waiting and 0 < held.get(u, 0) < parts[u]}
    for _ in range(min(sum(extra.values()), sum(room.values()))):
        # one node at a time, from the user with the most room to the one keeping the
        # most (ties by name: deterministic), so the shortfall is spread evenly
        u = max(room, key=lambda k: (room[k], k))
        v = max(extra, key=lambda k: (extra[k], k))
        room[u], extra[v] = room[u] - 1, extra[v] - 1
        out[u], out[v] = out[u] - 1, out[v] + 1
    return out


def member_shares(members: Collection[str], weights: Mapping[str, float] | None,
                  tree: FairTree | None) -> dict[str, float]:
    """Each member's fraction of the nodes were every member to want them all: its weight
    among the members' (``weights``), or down the account ``tree`` (its account's fraction
    times its own among the account's children). The nodes past users' useful parts are
    valued in it (:func:`.across.rest_by_value`): what a node adds to a job there counts in
    proportion to its user's share, so Slurm's fair-share weights hold past the parts too
    (equal weights: every user's gain counts alike)."""
    names = sorted(set(members))
    nodes = 1 << 20  # (integer parts: fine enough for fractions)
    demand = dict.fromkeys(names, nodes)
    parts = (tree_caps(demand, {}, nodes, weights, tree.parents, tree.account_weights,
                       account_parents=tree.account_parents) if tree else
             user_caps(demand, {}, nodes, weights))
    return {m: max(parts[m], 1) / nodes for m in names}

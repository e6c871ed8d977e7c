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
and forth. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from malletrain.core.allocation.knapsack import solve_counts


def user_caps(demand: Mapping[str, int], held: Mapping[str, int], capacity: int
              ) -> dict[str, int]:
    """Max-min fair integer shares of ``capacity`` nodes, none above a user's ``demand``."""
    caps = dict.fromkeys(demand, 0)
    left = capacity
    # ties: whoever holds more now keeps the odd node (then by name: deterministic)
    active = sorted((u for u in demand if demand[u] > 0), key=lambda u: (-held.get(u, 0), u))
    while left > 0 and active:
        share = left // len(active)
        if share == 0:
            for u in active[:left]:
                caps[u] += 1
            break
        still: list[str] = []
        for u in active:
            give = min(share, demand[u] - caps[u])
            caps[u] += give
            left -= give
            if caps[u] < demand[u]:
                still.append(u)
        active = still
    return caps


def solve_fair(values: np.ndarray, users: Sequence[str], held: Sequence[int],
               capacity: int) -> tuple[np.ndarray, float]:
    """:func:`solve_counts` with each user's jobs held to the user's fair share.

    ``users[j]`` and ``held[j]``: job j's user and the nodes it holds now. One user: exactly
    :func:`solve_counts`. Each round solves every user's jobs within the user's cap; a user
    whose best plan uses fewer nodes than its cap gives the rest back, and the caps are
    divided again (at most one round per user).
    """
    groups: dict[str, list[int]] = {}
    for j, user in enumerate(users):
        groups.setdefault(user, []).append(j)
    if len(groups) <= 1:
        return solve_counts(values, capacity)
    finite = np.isfinite(values)
    largest = np.where(finite.any(axis=1), values.shape[1] - 1 - np.argmax(finite[:, ::-1],
                                                                            axis=1), 0)
    demand = {u: int(largest[idx].sum()) for u, idx in groups.items()}
    holding = {u: int(sum(held[j] for j in idx)) for u, idx in groups.items()}
    counts = np.zeros(values.shape[0], dtype=int)
    objective: dict[str, float] = {}
    solved: dict[tuple[str, int], tuple[np.ndarray, float]] = {}
    for _ in range(len(groups)):
        caps = user_caps(demand, holding, capacity)
        gave_back = False
        for u, idx in groups.items():
            key = (u, caps[u])
            if key not in solved:
                solved[key] = solve_counts(values[idx], caps[u])
            c, obj = solved[key]
            counts[idx] = c
            objective[u] = obj
            if int(c.sum()) < min(caps[u], demand[u]):
                demand[u] = int(c.sum())  # more is worth nothing to this user now
                gave_back = True
        if not gave_back:
            break
    return counts, float(sum(objective.values()))

"""The exact multiple-choice knapsack behind every allocation: one count per job, vectorised."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: Above this many sizes per job the DP updates one size at a time (bounded memory).
_MAX_BLOCK_SIZES = 256
#: Scarce nodes: the DP first spans the capacities within capacity / this of the
#: capacity, in problems of at least this many jobs (a second, full solve costs less
#: than the first saves where the best plan uses nearly every node).
_FLOOR_SLACK_DIV = 16
_MIN_JOBS_FLOOR = 64


def solve_counts(values: np.ndarray, capacity: int) -> tuple[np.ndarray, float]:
    """Exact multiple-choice knapsack over a value table.

    ``values[j, n]`` is job j's value at count n (``-inf`` = not allowed; count 0
    must be allowed). Chooses one count per job, total <= capacity, maximising
    the sum. Returns (count per job, optimal objective).

    ``f(t)`` = best value of the jobs so far on at most ``t`` nodes. Three exact
    shortcuts keep it fast: an option worth no more than a smaller count of the
    same job is dropped (``f`` is non-decreasing, so it can never be needed); jobs
    are processed by ascending largest count so that early stages only span the
    capacity the jobs so far can use; and where the nodes are scarce (the jobs could
    use more than ``capacity``), each stage first spans only the capacities the
    jobs still to come can fill up to near ``capacity`` (:func:`_solve`'s ``floor``),
    solving again in full where the best plan turns out to leave more nodes unused.
    Each stage is one strided 2-D update over all of a job's sizes.
    """
    useful, smallest, largest = _useful_options(values)
    total = int(largest.sum())
    capacity = int(max(0, min(capacity, total)))
    if capacity < total and values.shape[0] >= _MIN_JOBS_FLOOR:
        solved = _solve(values, useful, smallest, largest, capacity,
                        capacity - max(1, capacity // _FLOOR_SLACK_DIV))
        if solved is not None:
            return solved
    solved = _solve(values, useful, smallest, largest, capacity, 0)
    assert solved is not None  # with no floor the first argmax is always found
    return solved


def solve_many(problems: Sequence[tuple[np.ndarray, int]]) -> list[tuple[np.ndarray, float]]:
    """:func:`solve_counts` of each (values, capacity), the same answers: problems of fewer
    than ``_MIN_JOBS_FLOOR`` jobs side by side, in batches of similar capacity (a stage per
    job position for the whole batch). Users' parts are many problems of a few jobs each,
    where numpy's per-call costs were most of the time."""
    out: list[tuple[np.ndarray, float] | None] = [None] * len(problems)
    small: list[tuple[int, int, np.ndarray, np.ndarray]] = []  # (capacity, i, useful, largest)
    by_width: dict[int, list[int]] = {}  # the small problems, by table width
    for i, (values, capacity) in enumerate(problems):
        if 0 < values.shape[0] < _MIN_JOBS_FLOOR:
            by_width.setdefault(values.shape[1], []).append(i)
        else:
            out[i] = solve_counts(values, capacity)
    for same in by_width.values():  # one pass over each width's rows (rows are independent)
        useful, _, largest = _useful_options(np.concatenate([problems[i][0] for i in same]))
        cuts = np.cumsum([problems[i][0].shape[0] for i in same])[:-1]
        for i, u, big in zip(same, np.split(useful, cuts), np.split(largest, cuts),
                             strict=True):
            small.append((int(max(0, min(problems[i][1], int(big.sum())))), i, u, big))
    small.sort(key=lambda x: (x[0], x[1]))
    start = 0
    while start < len(small):
        end = start + 1  # a batch spans capacities up to twice its smallest (padding)
        while end < len(small) and small[end][0] <= 2 * small[start][0] + 32:
            end += 1
        batch = small[start:end]
        answers = _solve_side_by_side([problems[i][0] for _, i, _, _ in batch], batch)
        for (_, i, _, _), answer in zip(batch, answers, strict=True):
            out[i] = answer
        start = end
    done = [answer for answer in out if answer is not None]
    assert len(done) == len(problems)  # every problem answered, in order
    return done


def _solve_side_by_side(tables: list[np.ndarray],
                        batch: list[tuple[int, int, np.ndarray, np.ndarray]]
                        ) -> list[tuple[np.ndarray, float]]:
    """The DP of several problems at once: ``hist[u, p, t]``, problem ``u``'s ``f`` after
    ``p`` jobs, over every capacity up to the batch's largest (``f`` beyond a problem's reach
    is the same maximum over the same plans, so the same floats as :func:`_solve`'s). A
    problem of fewer jobs starts with jobs that only run at 0 (worth 0.0: ``f`` unchanged);
    each answer is :func:`_backtrack`'s on its own rows."""
    n_probs = len(tables)
    sizes = [t.shape[0] for t in tables]
    n_pos = max(sizes)
    capacity = max(b[0] for b in batch)
    pad = int(max(1, max(int(b[3].max(initial=0)) for b in batch)))
    hist = np.empty((n_probs, n_pos + 1, pad + capacity + 1))
    hist[:, :, :pad] = -np.inf
    hist[:, 0, pad:] = 0.0
    opts = np.full((n_probs, n_pos, pad + 1), -np.inf)
    largest_at = np.zeros((n_probs, n_pos), dtype=np.int64)  # each position's largest count
    orders = []
    for u, (table, (_, _, useful, largest)) in enumerate(zip(tables, batch, strict=True)):
        order = np.argsort(largest, kind="stable")
        orders.append(order)
        first = n_pos - sizes[u]
        opts[u, :first, 0] = 0.0
        width = min(table.shape[1], pad + 1)
        opts[u, first:, :width] = np.where(useful, table, -np.inf)[order, :width]
        largest_at[u, first:] = largest[order]
    item = hist.itemsize
    for pos in range(n_pos):
        k = int(largest_at[:, pos].max()) + 1
        # view[u, n, t] = hist[u, pos, pad + t - n]
        view = np.ndarray((n_probs, k, capacity + 1), dtype=hist.dtype, buffer=hist,
                          offset=pos * hist.strides[1] + pad * item,
                          strides=(hist.strides[0], -item, item))
        np.maximum.reduce(view + opts[:, pos, :k, None], axis=1, out=hist[:, pos + 1, pad:])
    # each row's reach as _solve has it (0 for the leading jobs that only run at 0)
    reaches = np.zeros((n_probs, n_pos + 1), dtype=np.int64)
    for u, (cap, _, _, largest) in enumerate(batch):
        reaches[u, n_pos - sizes[u] + 1 :] = np.minimum(cap, np.cumsum(largest[orders[u]]))
    t = np.array([int(np.argmax(hist[u, n_pos, pad : pad + b[0] + 1]))
                  for u, b in enumerate(batch)], dtype=np.int64)
    chosen = _backtrack_side_by_side(hist, opts, reaches, pad, t)
    answers = []
    for u, order in enumerate(orders):
        counts = np.zeros(sizes[u], dtype=np.int64)
        counts[order] = chosen[u, n_pos - sizes[u] :]
        answers.append((counts, float(hist[u, n_pos, pad + t[u]])))
    return answers


def _backtrack_side_by_side(hist: np.ndarray, opts: np.ndarray, reaches: np.ndarray,
                            pad: int, t: np.ndarray) -> np.ndarray:
    """:func:`_backtrack` of every problem at once, position by position from the last: each
    job's count is the smallest whose sum in the DP is the DP's own value at ``t`` (the sums
    are the forward pass's, so the match is exact), ``t`` then clipped to the reach before
    it. Returns the count at each (problem, position)."""
    n_probs, n_pos = opts.shape[:2]
    probs = np.arange(n_probs)
    sizes = np.arange(opts.shape[2])
    chosen = np.zeros((n_probs, n_pos), dtype=np.int64)
    for pos in range(n_pos - 1, -1, -1):
        last = reaches[:, pos]
        target = hist[probs, pos + 1, pad + t]
        cells = pad + np.minimum(t[:, None] - sizes[None, :], last[:, None])
        sums = hist[probs[:, None], pos, cells] + opts[:, pos, :]
        n = np.argmax(sums == target[:, None], axis=1)
        chosen[:, pos] = n
        t = np.minimum(t - n, last)
    return chosen


def _solve(values: np.ndarray, useful: np.ndarray, smallest: np.ndarray, largest: np.ndarray,
           capacity: int, floor: int) -> tuple[np.ndarray, float] | None:
    """The DP with ``f`` after each job computed only from ``floor`` less what the jobs
    still to come can take (below that, no plan that uses more than ``floor`` nodes passes);
    None where the best plan may use ``floor`` nodes or fewer (``f(floor)`` is already
    optimal: the first optimum, which the answer's ties follow, lies below the span)."""
    n_jobs = values.shape[0]
    order = np.argsort(largest, kind="stable")
    # after[p]: the largest counts of the jobs from position p of the order on
    after = np.concatenate((np.cumsum(largest[order][::-1])[::-1], [0]))
    # Row p of `hist` is f after p jobs, preceded by `pad` cells of -inf so that
    # f(t - n) for every size n is a strided view of the row (no copies).
    pad = int(max(1, largest.max(initial=0)))
    hist = np.empty((n_jobs + 1, pad + capacity + 1))
    hist[:, :pad] = -np.inf
    hist[0, pad:] = 0.0
    block = np.empty((min(_MAX_BLOCK_SIZES, pad + 1), capacity + 1))
    options = np.where(useful, values, -np.inf)[:, :, None]  # count 0 is always allowed
    reaches = [0]
    reach = 0
    lows = np.minimum(np.maximum(0, floor - after[1:]), capacity).tolist()
    for pos, (j, lo, hi) in enumerate(zip(order.tolist(), smallest[order].tolist(),
                                          largest[order].tolist(), strict=True)):
        row_prev = hist[pos]
        new_reach = min(capacity, reach + hi)
        if new_reach > reach:  # f is non-decreasing: beyond its old reach, its last value
            row_prev[pad + reach + 1 : pad + new_reach + 1] = row_prev[pad + reach]
        reach = new_reach
        low = min(lows[pos], reach)
        g = hist[pos + 1, pad + low : pad + reach + 1]
        hi = min(hi, reach)
        if lo <= hi:
            _stage(hist, pos, g, options[j, : hi + 1], low, reach, pad, block)
        else:  # no size of this job fits yet: count 0
            np.add(row_prev[pad + low : pad + reach + 1], values[j, 0], out=g)
        reaches.append(reach)
    f = hist[n_jobs, pad + floor : pad + reaches[-1] + 1]
    t = int(np.argmax(f))
    if floor and t == 0:
        return None
    return _backtrack(values, useful, order, hist, reaches, pad, floor + t)


def _useful_options(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(useful[j, n], smallest useful n > 0, largest useful n) per job.

    An option worth no more than a smaller count of the same job is never needed.
    """
    width = values.shape[1]
    finite = np.isfinite(values)
    if not finite[:, 0].all():
        raise ValueError("every job must allow count 0")
    best_below = np.maximum.accumulate(np.where(finite, values, -np.inf), axis=1)
    useful = finite.copy()
    useful[:, 1:] &= values[:, 1:] > best_below[:, :-1]
    cols = np.arange(width)[None, :]
    largest = np.where(useful, cols, 0).max(axis=1)
    smallest = np.where(useful & (cols > 0), cols, width).min(axis=1)
    return useful, smallest, largest


def _stage(hist: np.ndarray, pos: int, g: np.ndarray, vals: np.ndarray, low: int,
           reach: int, pad: int, block: np.ndarray) -> None:
    """``g(t) = max_n f(t - n) + vals[n, 0]`` for ``t`` in ``low..reach`` and the counts ``n``
    from 0 (``-inf``: not allowed), ``f`` being row ``pos`` of ``hist``. Called once per
    job: numpy's per-call overheads are most of its time at 500 jobs, hence one add and one
    max over a strided view built in place, the ufuncs called directly."""
    k = vals.shape[0]
    span = reach - low + 1
    if k <= _MAX_BLOCK_SIZES:
        # rows n = 0..hi: view[n, t - low] = f(t - n)
        item = hist.itemsize
        view = np.ndarray((k, span), dtype=hist.dtype, buffer=hist,
                          offset=(pos * hist.shape[1] + pad + low) * item,
                          strides=(-item, item))
        tmp = block[:k, :span]
        np.add(view, vals, out=tmp)
        np.maximum.reduce(tmp, axis=0, out=g)
        return
    np.add(hist[pos, pad + low : pad + reach + 1], vals[0, 0], out=g)
    for n, v in enumerate(vals[:, 0].tolist()):
        if n and v > -np.inf:
            prev = hist[pos, pad + low - n : pad + reach + 1 - n]
            np.maximum(g, prev + v, out=g)


def _backtrack(values: np.ndarray, useful: np.ndarray, order: np.ndarray, hist: np.ndarray,
               reaches: list[int], pad: int, t: int) -> tuple[np.ndarray, float]:
    """The counts behind the final value at ``t`` nodes, job by job from the last stage.

    In plain Python over each job's few useful sizes: per-job numpy calls were most of the
    time of the many small problems of users' shares."""
    n_jobs = values.shape[0]
    objective = float(hist[n_jobs, pad + t])
    rows, cols = np.nonzero(useful)
    starts = np.searchsorted(rows, np.arange(n_jobs + 1)).tolist()
    sizes = cols.tolist()
    table = values.tolist()
    counts = [0] * n_jobs
    jobs = order.tolist()
    for pos in range(n_jobs - 1, -1, -1):
        j = jobs[pos]
        last = reaches[pos]  # f before this job is flat beyond its reach
        target = float(hist[pos + 1, pad + t])
        row = table[j]
        mine = sizes[starts[j] : starts[j + 1]]
        # f before this job at t - n for this job's sizes n (clipped to its reach)
        first = min(max(0, t - mine[-1]), last)
        before = hist[pos, pad + first : pad + min(t, last) + 1].tolist()
        chosen, err = 0, math.inf
        for n in mine:
            if n > t:
                break
            e = abs(before[min(t - n, last) - first] + row[n] - target)
            if e < err:
                chosen, err = n, e
                if e == 0.0:  # the DP's own sum: no later size can be closer
                    break
        counts[j] = chosen
        t = min(t - chosen, last)
    return np.array(counts, dtype=np.int64), objective

"""The exact multiple-choice knapsack behind every allocation: one count per job, vectorised."""

from __future__ import annotations

import math

import numpy as np

#: Above this many sizes per job the DP updates one size at a time (bounded memory).
_MAX_BLOCK_SIZES = 256


def solve_counts(values: np.ndarray, capacity: int) -> tuple[np.ndarray, float]:
    """Exact multiple-choice knapsack over a value table.

    ``values[j, n]`` is job j's value at count n (``-inf`` = not allowed; count 0
    must be allowed). Chooses one count per job, total <= capacity, maximising
    the sum. Returns (count per job, optimal objective).

    ``f(t)`` = best value of the jobs so far on at most ``t`` nodes. Two exact
    shortcuts keep it fast: an option worth no more than a smaller count of the
    same job is dropped (``f`` is non-decreasing, so it can never be needed), and
    jobs are processed by ascending largest count so that early stages only span
    the capacity the jobs so far can use. Each stage is one strided 2-D update
    over all of a job's sizes (no Python loop over sizes).
    """
    n_jobs = values.shape[0]
    useful, smallest, largest = _useful_options(values)
    order = np.argsort(largest, kind="stable")
    capacity = int(max(0, min(capacity, int(largest.sum()))))
    # Row p of `hist` is f after p jobs, preceded by `pad` cells of -inf so that
    # f(t - n) for every size n is a strided view of the row (no copies).
    pad = int(max(1, largest.max(initial=0)))
    hist = np.empty((n_jobs + 1, pad + capacity + 1))
    hist[:, :pad] = -np.inf
    hist[0, pad:] = 0.0
    block = np.empty((min(_MAX_BLOCK_SIZES, pad), capacity + 1))
    best = np.empty(capacity + 1)
    options = np.where(useful, values, -np.inf)
    reaches = [0]
    reach = 0
    for pos, j in enumerate(order.tolist()):
        lo, hi = int(smallest[j]), int(largest[j])
        row_prev = hist[pos]
        new_reach = min(capacity, reach + hi)
        # f is non-decreasing: beyond its old reach it equals its last value
        row_prev[pad + reach + 1 : pad + new_reach + 1] = row_prev[pad + reach]
        reach = new_reach
        g = hist[pos + 1, pad : pad + reach + 1]
        np.add(row_prev[pad : pad + reach + 1], values[j, 0], out=g)
        hi = min(hi, reach)
        if lo <= hi:
            _stage(hist, pos, g, options[j, lo : hi + 1], lo, reach, pad, block, best)
        reaches.append(reach)
    return _backtrack(values, useful, order, hist, reaches, pad)


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


def _stage(hist: np.ndarray, pos: int, g: np.ndarray, vals: np.ndarray, lo: int, reach: int,
           pad: int, block: np.ndarray, best: np.ndarray) -> None:
    """``g(t) = max(g(t), max_n f(t - n) + vals[n - lo])`` for the sizes ``lo..``, ``f`` being
    row ``pos`` of ``hist``. Called once per job: numpy's per-call overheads are most of its
    time at 500 jobs, hence the ufuncs called directly and the view built in place."""
    k = vals.size
    if k <= _MAX_BLOCK_SIZES:
        # rows n = lo..hi: view[i, t] = f(t - lo - i); one add, one max
        item = hist.itemsize
        view = np.ndarray((k, reach + 1), dtype=hist.dtype, buffer=hist,
                          offset=(pos * hist.shape[1] + pad - lo) * item, strides=(-item, item))
        tmp = block[:k, : reach + 1]
        np.add(view, vals[:, None], out=tmp)
        out = best[: reach + 1]
        np.maximum.reduce(tmp, axis=0, out=out)
        np.maximum(g, out, out=g)
        return
    prev = hist[pos, pad : pad + reach + 1]
    for n, v in zip(range(lo, lo + k), vals.tolist(), strict=True):
        if v > -np.inf:
            np.maximum(g[n:], prev[: reach + 1 - n] + v, out=g[n:])


def _backtrack(values: np.ndarray, useful: np.ndarray, order: np.ndarray, hist: np.ndarray,
               reaches: list[int], pad: int) -> tuple[np.ndarray, float]:
    """The counts behind the best final value, job by job from the last stage.

    In plain Python over each job's few useful sizes: per-job numpy calls were most of the
    time of the many small problems of users' shares."""
    n_jobs = values.shape[0]
    f = hist[n_jobs, pad : pad + reaches[-1] + 1]
    t = int(np.argmax(f))
    objective = float(f[t])
    rows, cols = np.nonzero(useful)
    starts = np.searchsorted(rows, np.arange(n_jobs + 1)).tolist()
    sizes = cols.tolist()
    table = values.tolist()
    counts = [0] * n_jobs
    for pos in range(n_jobs - 1, -1, -1):
        j = int(order[pos])
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
        counts[j] = chosen
        t = min(t - chosen, last)
    return np.array(counts, dtype=np.int64), objective

"""A job's value where nodes it would grow onto outrank nodes it holds: the ranking merged.

The value formula (:mod:`.allocator`'s docstring) ranks a job's nodes by window. Where every
growth node's window is at most the job's shortest own window, growth appends to the
ranking and :func:`.valuation.job_value_table` sums it along each row; otherwise the ranking
of own + first ``m`` growth nodes is merged here, per ``m``, for a group of such jobs at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MergeNodes:
    """Per job (rows of the value table): its own nodes zero padded (``ow`` windows, ``op``
    reclaim probabilities, ``og`` reclaim-event keys NaN padded, ``owm`` windows -inf
    padded), its growth nodes (``g``, ``gp``, ``gg``), own counts ``c``, growth counts
    ``span``, and the rank coefficients ``a`` (work) and ``b`` (reclaim cost), zero padded."""

    c: np.ndarray
    span: np.ndarray
    ow: np.ndarray
    op: np.ndarray
    og: np.ndarray
    owm: np.ndarray
    g: np.ndarray
    gp: np.ndarray
    gg: np.ndarray
    a: np.ndarray
    b: np.ndarray


def _ranks(grp: np.ndarray, nodes: MergeNodes) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(own width, growth width, e, q) of the rows ``grp``: the rank (0-based) of growth node
    ``l`` is ``l + e[l]`` (own nodes with a window >= its window), of own node ``i`` with
    ``m`` growth nodes ``i + min(m, q[i])`` (growth nodes with a longer window; ties: own
    first)."""
    cc, mm = int(nodes.c[grp].max()), int(max(1, nodes.span[grp].max()))
    gm = nodes.g[grp, :mm]
    e = (nodes.owm[grp, :cc][:, None, :] >= gm[:, :, None]).sum(axis=2)
    q = (gm[:, None, :] > nodes.ow[grp, :cc][:, :, None]).sum(axis=2)
    return cc, mm, e, q


def merged_values(grp: np.ndarray, nodes: MergeNodes) -> np.ndarray:
    """Work minus reclaim cost of own + first m growth nodes, merged by window (m = 1..mm)."""
    cc, mm, e, q = _ranks(grp, nodes)
    n_grp = grp.size
    width = cc + mm
    # the cell of row (job, m) and rank r of the flat (job, m, rank) arrays
    row = (np.arange(n_grp)[:, None] * mm + np.arange(mm)[None, :]) * width
    ms = np.arange(1, mm + 1)
    rank_o = np.arange(cc)[None, None, :] + np.minimum(ms[None, :, None], q[:, None, :])
    sel_o = np.broadcast_to((np.arange(cc)[None, :] < nodes.c[grp][:, None])[:, None, :],
                            rank_o.shape)
    cell_o = (row[:, :, None] + rank_o)[sel_o]
    # growth nodes 0..m-1 are in the set of size c + m
    rank_g = np.arange(mm)[None, :] + e
    sel_g = np.broadcast_to(np.arange(mm)[None, None, :] <= np.arange(mm)[None, :, None],
                            (n_grp, mm, mm))
    cell_g = (row[:, :, None] + rank_g[:, None, :])[sel_g]
    w3 = np.zeros((n_grp, mm, width))
    p3 = np.zeros_like(w3)
    k3 = np.full_like(w3, np.nan)
    for cells, own, grow in ((w3, nodes.ow, nodes.g), (p3, nodes.op, nodes.gp),
                             (k3, nodes.og, nodes.gg)):
        flat = cells.reshape(-1)  # (a view: the arrays are new, contiguous)
        flat[cell_o] = np.broadcast_to(own[grp, :cc][:, None, :], sel_o.shape)[sel_o]
        flat[cell_g] = np.broadcast_to(grow[grp, :mm][:, None, :], sel_g.shape)[sel_g]
    bound = np.ones(w3.shape, dtype=bool)
    bound[:, :, :-1] = ~(k3[:, :, :-1] == k3[:, :, 1:])
    a3 = nodes.a[grp, :width][:, None, :]
    b3 = nodes.b[grp, :width][:, None, :]
    result: np.ndarray = (a3 * w3 - b3 * p3 * bound).sum(axis=2)
    return result


def merged_values_at_span(grp: np.ndarray, nodes: MergeNodes) -> np.ndarray:
    """:func:`merged_values` at each row's own growth count ``max(span, 1)`` alone, without
    the other counts' rows (bit for bit the same sums where ``grp`` is the same group)."""
    cc, mm, e, q = _ranks(grp, nodes)
    n_grp = grp.size
    m_row = np.maximum(nodes.span[grp], 1)
    rank_g = np.arange(mm)[None, :] + e
    rank_o = np.arange(cc)[None, :] + np.minimum(m_row[:, None], q)
    width = cc + mm
    w2 = np.zeros((n_grp, width))
    p2 = np.zeros_like(w2)
    k2 = np.full_like(w2, np.nan)
    gi, ii = np.indices((n_grp, cc))
    sel = ii < nodes.c[grp][:, None]
    dst = (gi[sel], rank_o[sel])
    w2[dst] = nodes.ow[grp, :cc][sel]
    p2[dst] = nodes.op[grp, :cc][sel]
    k2[dst] = nodes.og[grp, :cc][sel]
    gi, li = np.indices((n_grp, mm))
    sel = li < m_row[:, None]  # growth nodes 0..m-1 are in the set of size c + m
    dst = (gi[sel], rank_g[sel])
    w2[dst] = nodes.g[grp, :mm][sel]
    p2[dst] = nodes.gp[grp, :mm][sel]
    k2[dst] = nodes.gg[grp, :mm][sel]
    bound = np.ones(w2.shape, dtype=bool)
    bound[:, :-1] = ~(k2[:, :-1] == k2[:, 1:])
    result: np.ndarray = (nodes.a[grp, :width] * w2 - nodes.b[grp, :width] * p2 * bound
                          ).sum(axis=1)
    return result

"""Constraint rows of a MILP, built one at a time and handed to SciPy as one sparse matrix.

Shared by FreeTrain's MILP (:mod:`malletrain.core.baselines`) and the integer-finish bound
(:mod:`malletrain.sim.bounds.bound_milp`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


class SparseRows:
    def __init__(self) -> None:
        self._r: list[int] = []
        self._c: list[int] = []
        self._v: list[float] = []
        self._lo: list[float] = []
        self._hi: list[float] = []

    def add(self, entries: Iterable[tuple[int, float]], lo: float, hi: float) -> None:
        """The row ``lo <= sum(value * x[column]) <= hi`` over ``(column, value)`` entries."""
        r = len(self._lo)
        for col, val in entries:
            self._r.append(r)
            self._c.append(col)
            self._v.append(val)
        self._lo.append(lo)
        self._hi.append(hi)

    def constraint(self, n_vars: int) -> Any:
        """A ``scipy.optimize.LinearConstraint`` (SciPy is the ``sim`` extra: imported here)."""
        import scipy.sparse as sp
        from scipy.optimize import LinearConstraint

        a = sp.csr_array((self._v, (self._r, self._c)), shape=(len(self._lo), n_vars))
        return LinearConstraint(a, np.array(self._lo), np.array(self._hi))

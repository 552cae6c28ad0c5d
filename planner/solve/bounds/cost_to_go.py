"""Lower bounds on the recompute a DP state still has to pay, for pruning without losing exactness."""

from __future__ import annotations

import math
import numpy as np

from planner.memory_model import NEED_TOL_BYTES
from planner.solve.problem import Frontiers

__all__ = ["CostToGo", "MaxBound"]


class CostToGo:
    """U_k(S): a lower bound on the recompute still to come, from key k with S bytes discarded.

    Computed backward over the same tree recursion as the forward DP, on a
    grid of ``grid`` buckets of width eps. Every rounding is optimistic (a
    state counts as holding the top of its bucket, a discard d moves it up
    ceil(d / eps) buckets, and a bucket meets a need if its top does), so U is
    a valid lower bound, yet it keeps integrality, nesting and every
    intermediate constraint: far tighter than a fractional relaxation.
    U is infinite where no completion can meet the remaining needs.
    """

    def __init__(self, fr: Frontiers, keyneed: np.ndarray, eps: float, grid: int):
        m = len(fr.d)
        self.fr, self.grid = fr, grid
        self.eps = float(eps)
        self.inv_eps = 1.0 / self.eps
        # bucket g < grid holds [g eps, (g + 1) eps) and meets a need if its top
        # does; the last bucket holds everything from grid * eps on and meets
        # every need (grid * eps is at least the largest one)
        need = np.asarray(keyneed, dtype=np.float64) - NEED_TOL_BYTES
        first = np.ceil(need * self.inv_eps) - 1.0
        self.first = np.clip(first, 0, grid).astype(np.int64).tolist()  # first bucket meeting key k's need
        self.U: list[np.ndarray | None] = [None] * (m + 1)
        self.U[m] = self._gate(np.zeros(grid + 1), self.first[m])
        self._shifts = [self._point_shifts(c) for c in range(m)]
        self.U[0] = self._back(0, m, self.U[m])

    @classmethod
    def sized(cls, fr: Frontiers, keyneed: np.ndarray, top_bytes: float, min_grid: int,
              cells: float, memory_cells: float, max_grid: int = 2**17) -> "CostToGo":
        """The finest grid whose build work and tables fit ``cells`` and ``memory_cells``.

        The bucket width is a power of two bytes (tensor sizes are mostly
        multiples of large powers of two, so discards then round by a few
        bytes only) and at most top_bytes / min_grid.
        """
        m = len(fr.d)
        passes = sum(len(d) for d in fr.d) + 12 * m + 1  # about the array passes per bucket in _back
        cap = max(min(cells / passes, memory_cells / (m + 1), float(max_grid)), float(min_grid))
        top = max(float(top_bytes), 1.0)
        eps = 2.0 ** math.ceil(math.log2(top / cap))
        grid = max(int(math.ceil(top / eps)), 1)
        return cls(fr, keyneed, eps, grid)

    @staticmethod
    def _gate(u: np.ndarray, first: int) -> np.ndarray:
        """u where the bucket meets the need, infinite below it (a copy)."""
        out = u.copy()
        out[:first] = np.inf
        return out

    def _point_shifts(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Per distinct bucket shift of candidate c's points, the cheapest recompute."""
        # every shift past the top bucket lands on it, so clamp (bounds the padding too)
        sh = np.minimum(np.ceil(self.fr.d[c] / self.eps), self.grid).astype(np.int64)
        best: dict[int, float] = {}
        for k, v in zip(sh.tolist(), self.fr.rc[c].tolist()):
            if v < best.get(k, np.inf):
                best[k] = v
        keys = np.array(sorted(best), dtype=np.int64)
        return keys, np.array([best[k] for k in keys.tolist()])

    def _take(self, c: int, u_next: np.ndarray) -> np.ndarray:
        """T[g] = min over c's points of rc + u_next[min(G, g + shift)]: c checkpointed."""
        shifts, rc = self._shifts[c]
        if len(shifts) == 0:
            return np.full(self.grid + 1, np.inf)
        # u_next padded with its last value, so shifting past the top stays there
        n = self.grid + 1
        padded = np.concatenate([u_next, np.full(int(shifts[-1]), u_next[-1])])
        out = np.full(n, np.inf)
        tmp = np.empty(n)
        for sh, cost in zip(shifts.tolist(), rc.tolist()):  # one cache-sized pass per shift
            np.add(padded[sh:sh + n], cost, out=tmp)
            np.minimum(out, tmp, out=out)
        return out

    def _back(self, lo: int, hi: int, u_hi: np.ndarray) -> np.ndarray:
        u, k = u_hi, hi
        while k > lo:
            r = k - 1
            a = self.fr.starts[r]
            take = self._take(r, u)
            if a == r:
                u = self._gate(np.minimum(u, take), self.first[r])
            else:
                skip_root = self._gate(u, self.first[r])
                self.U[r] = skip_root
                below = self._back(a, r, skip_root)
                u = np.minimum(below, self._gate(take, max(self.first[a:r + 1])))
            self.U[a] = u
            k = a
        return u

    def __call__(self, k: int, s: np.ndarray) -> np.ndarray:
        g = (np.asarray(s) * self.inv_eps).astype(np.int64)
        np.minimum(g, self.grid, out=g)
        return self.U[k][g]


class MaxBound:
    """The larger of two lower bounds on the recompute still to come."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __call__(self, k: int, s: np.ndarray) -> np.ndarray:
        return np.maximum(self.a(k, s), self.b(k, s))

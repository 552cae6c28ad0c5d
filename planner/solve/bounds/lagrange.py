"""Lagrangian bounds for the module-level problem, from its hull LP.

The LP relaxation replaces each candidate's frontier by its lower convex
hull. Its memory-row duals ``mu_j >= 0`` give, for *any* plan, the valid
lower bound (weak duality, evaluated on the exact frontier points)

    recompute >= sum_j mu_j * need_j + sum_c [rc_c - Lambda_c * d_c],
    Lambda_c = sum of mu_j over the keys j after candidate c finishes,

minimised over the real choices (one frontier point or none per candidate,
no nesting). Restricted to what is still to come from a DP state (key k,
S bytes discarded) this is an affine bound ``G_k + C_k - M_k * S``, exact up
to the relaxation's gap. On stacks of similar blocks that gap is tiny
(Shapley-Folkman: the non-convexity of a handful of modules, whatever the
depth), so the bound prunes far harder than a gridded one.

The same duals fix frontier points: a point whose reduced cost alone lifts
the bound above a known plan's recompute can be in no better plan, and is
dropped before the exact search.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_array

from planner.memory_model import MIB

__all__ = ["HullLP", "Lagrange"]


class HullLP:
    """The budget-independent part of the hull LP (variables, rows, costs)."""

    def __init__(self, hulls: list[tuple[np.ndarray, np.ndarray]], chains: list[list[int]]):
        m = len(hulls)
        sizes = [len(h[0]) for h in hulls]
        off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        nx = int(off[-1])
        self.m, self.nx = m, nx
        # variables: hull-point weights x (nx), then running sums S_0..S_m (MiB)
        self.cost = np.concatenate([np.concatenate([h[1] for h in hulls]) if nx else np.zeros(0), np.zeros(m + 1)])
        rows, cols, vals = [0], [nx], [1.0]  # S_0 = 0
        for i in range(m):  # S_{i+1} - S_i - sum_p d_p x_ip = 0
            r = i + 1
            rows += [r, r]
            cols += [nx + i + 1, nx + i]
            vals += [1.0, -1.0]
            rows += [r] * sizes[i]
            cols += list(range(off[i], off[i + 1]))
            vals += (-hulls[i][0]).tolist()
        self.a_eq = coo_array((vals, (rows, cols)), shape=(m + 1, nx + m + 1)).tocsr()
        rows, cols = [], []
        for r, chain in enumerate(chains):  # at most one checkpoint per chain
            for i in chain:
                rows += [r] * sizes[i]
                cols += list(range(off[i], off[i + 1]))
        self.a_ub = coo_array((np.ones(len(rows)), (rows, cols)), shape=(len(chains), nx + m + 1)).tocsr()
        self.n_chains = len(chains)

    def duals(self, keyneed: np.ndarray) -> tuple[str, np.ndarray | None]:
        """("ok", mu per key in ms per MiB, >= 0) at the LP optimum, ("infeasible", None) or ("failed", None)."""
        need = np.maximum(np.asarray(keyneed, dtype=np.float64) / MIB, 0.0)
        bounds = np.empty((self.nx + len(need), 2))  # as an array: linprog reads a list of pairs one by one
        bounds[:, 0], bounds[:, 1] = 0.0, np.inf
        bounds[self.nx:, 0] = need
        res = linprog(self.cost, A_ub=self.a_ub if self.n_chains else None,
                      b_ub=np.ones(self.n_chains) if self.n_chains else None,
                      A_eq=self.a_eq, b_eq=np.zeros(self.m + 1), bounds=bounds, method="highs")
        if res.status == 2:
            return "infeasible", None
        if res.status != 0:
            return "failed", None
        mu = np.asarray(res.lower.marginals[self.nx:], dtype=np.float64)
        return "ok", np.where(np.isfinite(mu), np.maximum(mu, 0.0), 0.0)


class Lagrange:
    """The affine bound L_k(S) = G_k + C_k - M_k * S for every DP key, for one budget.

    ``starts[i]``: first candidate of candidate i's subtree (post-order);
    ``d``/``rc``: each candidate's frontier points (bytes, ms).
    """

    def __init__(self, mu: np.ndarray, keyneed: np.ndarray, starts: list[int],
                 d: list[np.ndarray], rc: list[np.ndarray]):
        m = len(d)
        self.m, self.starts = m, starts
        # every S is >= 0, so a need below zero is a constraint S >= 0 (tighter, still valid)
        need = np.maximum(np.asarray(keyneed, dtype=np.float64), 0.0) / MIB
        mu = np.asarray(mu, dtype=np.float64)
        # M_k = sum_{j > k} mu_j; C_k = sum_{j > k} mu_j need_j
        self.M = np.concatenate([np.cumsum(mu[::-1])[::-1][1:], [0.0]])
        self.C = np.concatenate([np.cumsum((mu * need)[::-1])[::-1][1:], [0.0]])
        self.lam = self.M[:m].copy()  # price of a MiB discarded by candidate i: keys j > i
        mib: dict[int, np.ndarray] = {}  # candidates with the same frontier share its arrays: divided once
        self.v = [rc[i] - self.lam[i] * (mib[id(d[i])] if id(d[i]) in mib else mib.setdefault(id(d[i]), d[i] / MIB))
                  for i in range(m)]
        self.vbest = np.array([float(v.min()) if len(v) else math.inf for v in self.v])
        self.G = np.zeros(m + 1)
        self.G[m] = 0.0
        self._back(0, m, 0.0)
        # the bound on the whole problem (state: key 0, nothing discarded)
        self.lower = float(self.G[0] + self.C[0])

    def _back(self, lo: int, hi: int, g_hi: float) -> float:
        g, k = g_hi, hi
        while k > lo:
            r = k - 1
            a = self.starts[r]
            take = self.vbest[r] + g
            if a == r:
                g = min(g, take)
            else:
                self.G[r] = g  # inside r's subtree r itself is no longer a choice
                g = min(self._back(a, r, g), take)
            self.G[a] = g
            k = a
        return g

    def __call__(self, k: int, s: np.ndarray) -> np.ndarray:
        return self.G[k] + self.C[k] - self.M[k] * (np.asarray(s, dtype=np.float64) / MIB)

    def penalties(self) -> list[np.ndarray]:
        """Per candidate and point: how much choosing it lifts the Lagrangian bound at least."""
        m, starts = self.m, self.starts
        parent = [-1] * m
        stack: list[int] = []  # enclosing candidates, innermost last
        for i in range(m - 1, -1, -1):  # reverse post-order: a parent comes before its subtree
            while stack and starts[stack[-1]] > i:
                stack.pop()
            parent[i] = stack[-1] if stack else -1
            stack.append(i)
        f = np.zeros(m)  # best value inside each subtree
        child_sum = np.zeros(m)
        for i in range(m):  # post-order: children first
            f[i] = min(child_sum[i], self.vbest[i]) if i != starts[i] else min(0.0, self.vbest[i])
            if parent[i] >= 0:
                child_sum[parent[i]] += f[i]
        total = float(sum(f[i] for i in range(m) if parent[i] < 0))
        out = np.zeros(m)  # best value outside i's subtree with no ancestor of i chosen
        for i in range(m - 1, -1, -1):
            p = parent[i]
            out[i] = (total if p < 0 else out[p] + child_sum[p]) - f[i]
        # choosing point q of i: out(i) + v_i(q) (nothing inside i's subtree) against the free optimum
        return [out[i] + self.v[i] - total for i in range(m)]

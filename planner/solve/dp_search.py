"""The DP's search: non-dominated (discarded bytes, recompute ms) states, extended candidate by candidate.

The memory constraints are a chain (each one bounds the discard accumulated by
the candidates finishing before a module), so a list of non-dominated states,
extended along the forward post-order with each candidate's frontier points,
holds every optimal plan. A candidate's subtree is searched twice: with the
candidate checkpointed (its submodules then stay unchosen) and without.
States whose cost plus a lower bound on what is still to come exceeds an upper
bound are dropped; :mod:`planner.solve.dp` drives the search.
"""

from __future__ import annotations

import math
import time

import numpy as np

from planner.memory_model import MIB, NEED_TOL_BYTES
from planner.solve.bounds.cost_to_go import CostToGo, MaxBound
from planner.solve.problem import Frontiers, Problem
from planner.solve.trace import TraceTable

__all__ = ["SearchGaveUp", "SearchTimedOut", "StateSearch", "beam_plan"]

_TOL = 1e-9


class SearchGaveUp(Exception):
    """The state lists outgrew their limit, or the search its work allowance."""


class SearchTimedOut(Exception):
    """The search passed its deadline."""


class StateSearch:
    """One pass of the search below ``upper`` (``beam``: at most that many states a step, for a quick real plan).

    ``solve()`` returns (recompute, candidate -> point) of the cheapest plan
    under ``upper``, None if there is none; it raises :class:`SearchGaveUp`
    past ``state_limit`` states or ``work_limit`` pairs, and
    :class:`SearchTimedOut` past ``deadline``.
    """

    def __init__(self, prob: Problem, fr: Frontiers, keyneed: np.ndarray, lb: CostToGo,
                 upper: float, beam: int | None, state_limit: int, deadline: float = math.inf,
                 held_need: dict[int, float] | None = None):
        self.prob, self.fr, self.keyneed, self.lb = prob, fr, keyneed, lb
        self.deadline = deadline
        self.upper, self.beam, self.state_limit = upper, beam, state_limit
        self.work, self.work_limit = 0, math.inf
        m = len(prob.candidates)
        # candidate -> the discard its subtree's start must reach when it is checkpointed (problem.held_needs)
        self.held_need = {i: v for i, v in (held_need or {}).items() if v > keyneed[fr.starts[i]]}
        reach = keyneed.copy()
        for i, v in self.held_need.items():  # states are capped at what is still needed: held needs included
            reach[fr.starts[i]] = max(reach[fr.starts[i]], v)
        self.cap = np.maximum(np.maximum.accumulate(reach[::-1])[::-1], 0.0)
        self.start = fr.starts
        self.traces = TraceTable()
        self.m = m

    # A state is five parallel arrays: discarded bytes, cost, trace id, and the
    # (candidate, point) added at this step (-1 if none), turned into a trace
    # entry only if the state survives pruning.
    def _filter(self, st, k: int, need: float | None = None):
        ok = st[0] >= (self.keyneed[k] if need is None else need) - NEED_TOL_BYTES
        return tuple(a[ok] for a in st)

    def _checkpointed(self, st, r: int):
        """States extended with candidate r checkpointed (its subtree's keys already met): its held inputs too."""
        if r in self.held_need:
            st = self._filter(st, r, self.held_need[r])
        return self._extend(st, r, with_none=False)

    def _prune(self, st, k: int):
        if time.perf_counter() > self.deadline:
            raise SearchTimedOut
        if len(st[0]) == 0:
            return st
        s = np.minimum(st[0], math.ceil(self.cap[k]))
        c = st[1]
        order = np.lexsort((c, -s))
        s, c, t, nc, npt = s[order], c[order], st[2][order], st[3][order], st[4][order]
        best = np.minimum.accumulate(c)
        keep = np.ones(len(c), bool)
        keep[1:] = c[1:] < best[:-1] - _TOL * (1 + np.abs(best[:-1]))
        s, c, t, nc, npt = s[keep], c[keep], t[keep], nc[keep], npt[keep]
        if self.beam is None and math.isfinite(self.upper) and isinstance(self.lb, MaxBound):
            lim = self.upper + _TOL * (1 + abs(self.upper))
            ok = np.flatnonzero(c + self.lb.a(k, s) <= lim)  # cheap Lagrangian part first
            ok = ok[c[ok] + self.lb.b(k, s[ok]) <= lim]
        else:
            bound = c + self.lb(k, s)
            ok = bound <= self.upper + _TOL * (1 + abs(self.upper)) if math.isfinite(self.upper) else np.isfinite(bound)
            bound = bound[ok]
        s, c, t, nc, npt = s[ok], c[ok], t[ok], nc[ok], npt[ok]
        if self.beam is not None and len(s) > self.beam:
            # Half by best bound, half spread evenly over discarded bytes, so
            # the beam keeps states able to meet later, larger needs.
            best = np.argsort(bound, kind="stable")[: self.beam // 2]
            spread = np.linspace(0, len(s) - 1, self.beam - len(best)).astype(np.int64)
            sel = np.unique(np.concatenate([best, spread]))
            s, c, t, nc, npt = s[sel], c[sel], t[sel], nc[sel], npt[sel]
        if len(s) > self.state_limit:
            raise SearchGaveUp
        new = nc >= 0
        if new.any():
            t = t.copy()
            t[new] = self.traces.add(t[new], nc[new], npt[new])
        none = np.full(len(s), -1)
        return s, c, t, none, none

    def _extend(self, st, i: int, with_none: bool):
        s, c, t = st[0], st[1], st[2]
        d, rc = self.fr.d[i], self.fr.rc[i]
        if len(s) * (len(d) + 1) > 40 * self.state_limit:
            raise SearchGaveUp
        self.work += len(s) * len(d)
        if self.work > self.work_limit:
            raise SearchGaveUp
        if math.isfinite(self.upper) and isinstance(self.lb, MaxBound):
            # The Lagrangian part is separable (state term + point term): a cheap
            # first filter, so pairs are formed and the gridded bound looked up
            # only for its survivors.
            lim = self.upper + _TOL * (1 + abs(self.upper))
            lag, k = self.lb.a, i + 1
            slope = lag.M[k] / MIB
            lag_b = (c - slope * s)[:, None] + (rc - slope * d + (lag.G[k] + lag.C[k]))[None, :]
            row, col = np.nonzero(lag_b <= lim)
            s2, c2 = s[row] + d[col], c[row] + rc[col]
            ok = c2 + self.lb.b(k, s2) <= lim
            row, col, s2, c2 = row[ok], col[ok], s2[ok], c2[ok]
        else:
            # the state must still be able to meet later needs (and, with an upper bound, beat it)
            s2 = (s[:, None] + d[None, :]).ravel()
            c2 = (c[:, None] + rc[None, :]).ravel()
            bound = c2 + self.lb(i + 1, s2)
            ok = bound <= self.upper + _TOL * (1 + abs(self.upper)) if math.isfinite(self.upper) else np.isfinite(bound)
            flat = np.flatnonzero(ok)
            row, col, s2, c2 = flat // len(d), flat % len(d), s2[flat], c2[flat]
        new = (s2, c2, t[row], np.full(len(row), i), col)
        if with_none:
            return tuple(np.concatenate([a, b]) for a, b in zip(st, new))
        return new

    def run(self, lo: int, hi: int, st):
        i = lo
        while i < hi:
            r = max(j for j in range(i, hi) if self.start[j] == i)
            if r == i and r not in self.held_need:
                st = self._extend(st, r, with_none=True)
            elif r == i:
                st = tuple(np.concatenate([a, b]) for a, b in zip(st, self._checkpointed(st, r)))
            else:
                below = self.run(i, r, st)
                skip = st
                for k in range(i + 1, r + 1):
                    skip = self._filter(skip, k)
                skip = self._checkpointed(skip, r)
                st = tuple(np.concatenate([a, b]) for a, b in zip(below, skip))
            st = self._prune(self._filter(st, r + 1), r + 1)
            i = r + 1
        return st

    def solve(self):
        st = (np.zeros(1, np.int64), np.zeros(1), np.full(1, -1), np.full(1, -1), np.full(1, -1))
        st = self._filter(st, 0)
        st = self.run(0, self.m, st)
        s, c, t = st[0], st[1], st[2]
        if len(s) == 0:
            return None
        j = int(np.argmin(c))
        return float(c[j]), self.traces.choices(int(t[j]))


def beam_plan(prob: Problem, fr: Frontiers, keyneed: np.ndarray, lb: CostToGo, width: int,
              state_limit: int, held_need: dict[int, float] | None = None) -> tuple[float, dict[int, int]] | None:
    """A real plan from a beam pass (no deadline: its width bounds the work)."""
    try:
        return StateSearch(prob, fr, keyneed, lb, math.inf, width, state_limit, held_need=held_need).solve()
    except (SearchGaveUp, SearchTimedOut):
        return None

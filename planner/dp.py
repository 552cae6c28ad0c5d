"""Exact bounded dynamic program for the module-level problem.

Same model as the MILP in :mod:`planner.milp`, solved along the forward
post-order: the memory constraints are a chain (each one bounds the discard
accumulated by the candidates finishing before a module), so a list of
non-dominated (discarded bytes, recompute ms) states, extended module by
module with the module's exact frontier, holds every optimal plan.

Two bounds keep the lists short without losing exactness:

* an upper bound from a narrow beam pass of the same DP (a real plan);
* a lower bound on what the remaining modules must still cost to reach the
  largest remaining need: the fractional knapsack over their frontiers'
  convex hulls (a relaxation: it ignores nesting and integrality).

States whose cost plus that lower bound exceeds the upper bound cannot lead
to a better plan and are dropped. If the lists still outgrow ``state_limit``
the DP gives up and the caller falls back to the MILP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.milp import Problem, Solution, _frontier, _reduced_keyneeds

__all__ = ["solve_dp"]

_TOL = 1e-9


@dataclass
class _Frontiers:
    d: list[np.ndarray]  # per candidate: discarded bytes of useful points, ascending (int64)
    rc: list[np.ndarray]  # recompute ms, ascending
    point: list[np.ndarray]  # index of each point in the module's Frontier
    seg_len: list[np.ndarray]  # convex hull segments from (0, 0): lengths in bytes
    seg_slope: list[np.ndarray]  # and ms per byte


class _GiveUp(Exception):
    pass


def _prepare(prob: Problem) -> _Frontiers | None:
    out = _Frontiers([], [], [], [], [])
    for cand in prob.candidates:
        m = prob.stats.module(cand.fqn)
        f = _frontier(prob._frontiers, m)
        if f is None:
            return None
        d = cand.act_saved_bytes - f.saved_bytes[::-1]
        rc = f.recompute_ms[::-1]
        idx = np.arange(len(f))[::-1]
        keep = d > 0
        d, rc, idx = d[keep].astype(np.int64), rc[keep], idx[keep]
        out.d.append(d), out.rc.append(rc), out.point.append(idx)
        lens, slopes = _hull_segments(d, rc)
        out.seg_len.append(lens), out.seg_slope.append(slopes)
    return out


def _hull_segments(d: np.ndarray, rc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xs = np.concatenate([[0.0], d.astype(np.float64)])
    ys = np.concatenate([[0.0], rc])
    hull: list[int] = []
    for i in range(len(xs)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (ys[b] - ys[a]) * (xs[i] - xs[a]) >= (ys[i] - ys[a]) * (xs[b] - xs[a]):
                hull.pop()
            else:
                break
        hull.append(i)
    lens = np.array([xs[b] - xs[a] for a, b in zip(hull, hull[1:])])
    slopes = np.array([(ys[b] - ys[a]) / (xs[b] - xs[a]) for a, b in zip(hull, hull[1:])])
    return lens, slopes


class _LowerBound:
    """LB_k(x): least cost for candidates k.. to discard x more bytes (fractional, convex hulls)."""

    def __init__(self, fr: _Frontiers):
        m = len(fr.d)
        self.cum_len: list[np.ndarray] = [None] * (m + 1)  # type: ignore[list-item]
        self.cum_cost: list[np.ndarray] = [None] * (m + 1)  # type: ignore[list-item]
        self.slopes: list[np.ndarray] = [None] * (m + 1)  # type: ignore[list-item]
        lens = np.zeros(0)
        slopes = np.zeros(0)
        self._set(m, lens, slopes)
        for k in range(m - 1, -1, -1):
            lens = np.concatenate([lens, fr.seg_len[k]])
            slopes = np.concatenate([slopes, fr.seg_slope[k]])
            order = np.argsort(slopes, kind="stable")
            lens, slopes = lens[order], slopes[order]
            self._set(k, lens, slopes)

    def _set(self, k: int, lens: np.ndarray, slopes: np.ndarray) -> None:
        self.cum_len[k] = np.concatenate([[0.0], np.cumsum(lens)])
        self.cum_cost[k] = np.concatenate([[0.0], np.cumsum(lens * slopes)])
        self.slopes[k] = slopes

    def __call__(self, k: int, x: np.ndarray) -> np.ndarray:
        cl, cc, sl = self.cum_len[k], self.cum_cost[k], self.slopes[k]
        x = np.maximum(np.asarray(x, dtype=np.float64), 0.0)
        if len(sl) == 0:
            return np.where(x > 1.0, np.inf, 0.0)
        j = np.clip(np.searchsorted(cl, x, side="right") - 1, 0, len(sl) - 1)
        out = cc[j] + (x - cl[j]) * sl[j]
        out[x > cl[-1] + 1.0] = np.inf
        # Float sums of slopes can overshoot the true bound by a hair.
        return out * (1 - 1e-12)


class _DP:
    def __init__(self, prob: Problem, fr: _Frontiers, keyneed: np.ndarray, lb: _LowerBound,
                 upper: float, beam: int | None, state_limit: int):
        self.prob, self.fr, self.keyneed, self.lb = prob, fr, keyneed, lb
        self.upper, self.beam, self.state_limit = upper, beam, state_limit
        m = len(prob.candidates)
        self.cap = np.maximum(np.maximum.accumulate(keyneed[::-1])[::-1], 0.0)
        self.start = _subtree_starts(prob)
        # trace table: (previous trace, candidate, point); -1 = none
        self.t_prev: list[np.ndarray] = []
        self.t_cand: list[np.ndarray] = []
        self.t_point: list[np.ndarray] = []
        self.n_traces = 0
        self.m = m

    def _new_traces(self, prev: np.ndarray, cand: np.ndarray, point: np.ndarray) -> np.ndarray:
        ids = np.arange(self.n_traces, self.n_traces + len(prev))
        self.t_prev.append(prev), self.t_cand.append(cand), self.t_point.append(point)
        self.n_traces += len(prev)
        return ids

    # A state is five parallel arrays: discarded bytes, cost, trace id, and the
    # (candidate, point) added at this step (-1 if none), turned into a trace
    # entry only if the state survives pruning.
    def _filter(self, st, k: int):
        ok = st[0] >= self.keyneed[k] - 0.5
        return tuple(a[ok] for a in st)

    def _prune(self, st, k: int):
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
        bound = c + self.lb(k, self.cap[k] - s)
        ok = bound <= self.upper + _TOL * (1 + abs(self.upper)) if math.isfinite(self.upper) else np.isfinite(bound)
        s, c, t, nc, npt, bound = s[ok], c[ok], t[ok], nc[ok], npt[ok], bound[ok]
        if self.beam is not None and len(s) > self.beam:
            sel = np.sort(np.argsort(bound, kind="stable")[: self.beam])
            s, c, t, nc, npt = s[sel], c[sel], t[sel], nc[sel], npt[sel]
        if len(s) > self.state_limit:
            raise _GiveUp
        new = nc >= 0
        if new.any():
            t = t.copy()
            t[new] = self._new_traces(t[new], nc[new], npt[new])
        none = np.full(len(s), -1)
        return s, c, t, none, none

    def _extend(self, st, i: int, with_none: bool):
        s, c, t = st[0], st[1], st[2]
        d, rc = self.fr.d[i], self.fr.rc[i]
        if len(s) * (len(d) + 1) > 40 * self.state_limit:
            raise _GiveUp
        s2 = (s[:, None] + d[None, :]).ravel()
        c2 = (c[:, None] + rc[None, :]).ravel()
        # Cheap pre-filter: the state must still be able to meet later needs.
        bound = c2 + self.lb(i + 1, self.cap[i + 1] - s2)
        ok = bound <= self.upper + _TOL * (1 + abs(self.upper)) if math.isfinite(self.upper) else np.isfinite(bound)
        flat = np.flatnonzero(ok)
        new = (s2[flat], c2[flat], t[flat // len(d)], np.full(len(flat), i), flat % len(d))
        if with_none:
            return tuple(np.concatenate([a, b]) for a, b in zip(st, new))
        return new

    def run(self, lo: int, hi: int, st):
        i = lo
        while i < hi:
            r = max(j for j in range(i, hi) if self.start[j] == i)
            if r == i:
                st = self._extend(st, r, with_none=True)
            else:
                below = self.run(i, r, st)
                skip = st
                for k in range(i + 1, r + 1):
                    skip = self._filter(skip, k)
                skip = self._extend(skip, r, with_none=False)
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
        return float(c[j]), self._choices(int(t[j]))

    def _choices(self, tid: int) -> dict[int, int]:
        prev = np.concatenate(self.t_prev) if self.t_prev else np.zeros(0, np.int64)
        cand = np.concatenate(self.t_cand) if self.t_cand else np.zeros(0, np.int64)
        point = np.concatenate(self.t_point) if self.t_point else np.zeros(0, np.int64)
        out = {}
        while tid >= 0:
            out[int(cand[tid])] = int(point[tid])
            tid = int(prev[tid])
        return out


def _subtree_starts(prob: Problem) -> list[int]:
    """For each candidate (post-order index), the first candidate index of its subtree."""
    idx = {c.fqn: i for i, c in enumerate(prob.candidates)}
    start = list(range(len(prob.candidates)))
    for i, c in enumerate(prob.candidates):
        p = prob.stats.module(c.fqn).parent
        while p is not None:
            if p in idx:
                start[idx[p]] = min(start[idx[p]], start[i])
            p = prob.stats.module(p).parent
    return start


def solve_dp(prob: Problem, budget_bytes: float, *, state_limit: int = 200_000, beam: int = 64) -> Solution | None:
    """Exact plan by bounded DP; None when the DP does not apply or gives up (use the MILP)."""
    fr = _prepare(prob)
    if fr is None:
        return None
    keyneed = _reduced_keyneeds(prob, budget_bytes)
    if keyneed[0] > 0:
        return Solution("infeasible", "modules before any checkpointable module already exceed the budget")
    lb = _LowerBound(fr)
    try:
        heuristic = _DP(prob, fr, keyneed, lb, math.inf, beam, state_limit).solve()
        if heuristic is None:
            # The beam can lose every feasible state; an unbounded exact pass settles it.
            upper = math.inf
        else:
            upper = heuristic[0]
        exact = _DP(prob, fr, keyneed, lb, upper, None, state_limit).solve()
    except _GiveUp:
        return None
    if exact is None:
        return Solution("infeasible", "no plan fits the budget")
    _, choices = exact
    decisions = {}
    for i, j in choices.items():
        cand = prob.candidates[i]
        f = _frontier(prob._frontiers, prob.stats.module(cand.fqn))
        k = int(fr.point[i][j])
        decisions[cand.fqn] = (f.save_list(k), int(f.saved_bytes[k]), float(f.saved_ms[k]))
    discarded = {f: prob.stats.module(f).act_saved_bytes - sb for f, (_, sb, _) in decisions.items()}
    peak = prob.model.peak_bytes(discarded)
    recompute = math.fsum(prob.stats.module(f).op_ms - sm for f, (_, _, sm) in decisions.items())
    return Solution("optimal", "optimal plan found (exact bounded DP)", peak, recompute, 0.0, 0.0, decisions)

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
import time
from dataclasses import dataclass

import numpy as np

from planner.hull import lower_hull
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
    starts: list[int] | None = None  # first candidate of each candidate's subtree
    subtree_hulls: list[tuple[np.ndarray, np.ndarray]] | None = None


class _GiveUp(Exception):
    pass


class _Timeout(Exception):
    pass


def _prepare(prob: Problem) -> _Frontiers | None:
    """Budget-independent DP inputs, computed once per Problem (a sweep shares them)."""
    if prob._dp is None:
        prob._dp = (_build(prob),)
    return prob._dp[0]


def _build(prob: Problem) -> _Frontiers | None:
    out = _Frontiers([], [], [], [], [])
    memo: dict[tuple, tuple] = {}
    for cand in prob.candidates:
        key = (cand.ops_key, cand.act_saved_bytes)
        if key in memo:
            for lst, v in zip((out.d, out.rc, out.point, out.seg_len, out.seg_slope), memo[key]):
                lst.append(v)
            continue
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
        lens, slopes = _hull_segments(d.astype(np.float64), rc)
        out.seg_len.append(lens), out.seg_slope.append(slopes)
        memo[key] = (d, rc, idx, lens, slopes)
    out.starts = _subtree_starts(prob)
    out.subtree_hulls = _subtree_hulls(prob, out, out.starts)
    return out


def _hull_segments(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges (lengths, slopes) of the lower hull of (0, 0) and the points; slopes clipped at 0."""
    hx, _, slopes = lower_hull(np.concatenate([[0.0], xs]), np.concatenate([[0.0], ys]))
    # past the cheapest point a module need not discard more, so no edge falls
    return np.diff(hx), np.maximum(slopes, 0.0)


class _Greedy:
    """H(x): least cost to discard x bytes with a set of hull segments (fractional knapsack)."""

    def __init__(self, lens: np.ndarray, slopes: np.ndarray):
        order = np.argsort(slopes, kind="stable")
        lens, slopes = lens[order], slopes[order]
        self.cum_len = np.concatenate([[0.0], np.cumsum(lens)])
        self.cum_cost = np.concatenate([[0.0], np.cumsum(lens * slopes)])
        self.slopes = slopes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        cl, cc, sl = self.cum_len, self.cum_cost, self.slopes
        x = np.maximum(x, 0.0)
        if len(sl) == 0:
            return np.where(x > 1.0, np.inf, 0.0)
        j = np.clip(np.searchsorted(cl, x, side="right") - 1, 0, len(sl) - 1)
        out = cc[j] + (x - cl[j]) * sl[j]
        out[x > cl[-1] + 1.0] = np.inf
        # Float sums of slopes can overshoot the true bound by a hair.
        return out * (1 - 1e-12)


def _subtree_hulls(prob: Problem, fr: _Frontiers, start: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per candidate: hull of its subtree's exclusive options (itself, or its candidate children together)."""
    m = len(prob.candidates)
    children: list[list[int]] = [[] for _ in range(m)]
    for c in range(m):
        parent = max((p for p in range(c + 1, m) if start[p] <= start[c]), default=None, key=lambda p: -p)
        if parent is not None:
            children[parent].append(c)
    hulls: list[tuple[np.ndarray, np.ndarray]] = [None] * m  # type: ignore[list-item]
    memo: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    for c in range(m):  # post-order: children first
        cand = prob.candidates[c]
        key = (cand.ops_key, cand.act_saved_bytes, tuple(id(hulls[q]) for q in children[c]))
        if key in memo:
            hulls[c] = memo[key]
            continue
        xs = [np.zeros(1), fr.d[c].astype(np.float64)]
        ys = [np.zeros(1), fr.rc[c]]
        if children[c]:
            lens = np.concatenate([hulls[q][0] for q in children[c]])
            slopes = np.concatenate([hulls[q][1] for q in children[c]])
            order = np.argsort(slopes, kind="stable")
            xs.append(np.cumsum(lens[order]))
            ys.append(np.cumsum(lens[order] * slopes[order]))
        hulls[c] = memo[key] = _hull_segments(np.concatenate(xs), np.concatenate(ys))
    return hulls


class _LowerBound:
    """LB_k(S): least cost the candidates from position k on must still add, from discarded bytes S.

    The larger of: the final requirement met by every subtree lying wholly
    after k, and each of the next rising requirements met only by the
    subtrees lying wholly between k and it. Each term relaxes integrality,
    and a subtree's hull already makes its module and its submodules
    exclusive, so the bound is valid and does not double-count.
    """

    LOOKAHEAD = 2

    def __init__(self, prob: Problem, fr: _Frontiers, keyneed: np.ndarray, cap: np.ndarray, start: list[int]):
        m = len(fr.d)
        hulls = fr.subtree_hulls
        maximal_root = [max(p for p in range(c, m) if start[p] <= c and p >= c) if True else c for c in range(m)]
        del maximal_root

        def greedy(lo: int, hi: int) -> _Greedy:
            # subtrees wholly inside [lo, hi), taking only the outermost ones
            roots, c = [], hi - 1
            while c >= lo:
                if start[c] >= lo:
                    roots.append(c)
                    c = start[c] - 1
                else:
                    c -= 1
            lens = np.concatenate([hulls[r][0] for r in roots] or [np.zeros(0)])
            slopes = np.concatenate([hulls[r][1] for r in roots] or [np.zeros(0)])
            return _Greedy(lens, slopes)

        self.terms: list[list[tuple[float, _Greedy]]] = []
        for k in range(m + 1):
            terms = [(float(cap[k]), greedy(k, m))]
            running = -np.inf
            for k2 in range(k + 1, m + 1):
                if len(terms) > self.LOOKAHEAD:
                    break
                if keyneed[k2] > running and keyneed[k2] > 0:
                    running = keyneed[k2]
                    terms.append((float(keyneed[k2]), greedy(k, k2)))
            self.terms.append(terms)

    def __call__(self, k: int, s: np.ndarray, first_only: bool = False) -> np.ndarray:
        s = s.astype(np.float64)
        out = np.zeros(len(s))
        for need, h in self.terms[k][:1] if first_only else self.terms[k]:
            np.maximum(out, h(need - s), out=out)
        return out


class _DP:
    def __init__(self, prob: Problem, fr: _Frontiers, keyneed: np.ndarray, lb: _LowerBound,
                 upper: float, beam: int | None, state_limit: int, deadline: float = math.inf):
        self.prob, self.fr, self.keyneed, self.lb = prob, fr, keyneed, lb
        self.deadline = deadline
        self.upper, self.beam, self.state_limit = upper, beam, state_limit
        m = len(prob.candidates)
        self.cap = np.maximum(np.maximum.accumulate(keyneed[::-1])[::-1], 0.0)
        self.start = fr.starts
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
        if time.perf_counter() > self.deadline:
            raise _Timeout
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
        bound = c + self.lb(k, s)
        ok = bound <= self.upper + _TOL * (1 + abs(self.upper)) if math.isfinite(self.upper) else np.isfinite(bound)
        s, c, t, nc, npt, bound = s[ok], c[ok], t[ok], nc[ok], npt[ok], bound[ok]
        if self.beam is not None and len(s) > self.beam:
            # Half by best bound, half spread evenly over discarded bytes, so
            # the beam keeps states able to meet later, larger needs.
            best = np.argsort(bound, kind="stable")[: self.beam // 2]
            spread = np.linspace(0, len(s) - 1, self.beam - len(best)).astype(np.int64)
            sel = np.unique(np.concatenate([best, spread]))
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
        bound = c2 + self.lb(i + 1, s2, first_only=True)
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


def solve_dp(prob: Problem, budget_bytes: float, *, time_limit_s: float = 60.0, state_limit: int = 200_000,
             beam: int = 64) -> Solution | None:
    """Plan by bounded DP; None when the DP does not apply or gives up (use the MILP).

    ``optimal`` when the exact pass finishes within ``time_limit_s``; otherwise
    the beam pass's plan as ``feasible`` with its proven gap.
    """
    deadline = time.perf_counter() + time_limit_s
    fr = _prepare(prob)
    if fr is None:
        return None
    keyneed = _reduced_keyneeds(prob, budget_bytes)
    if keyneed[0] > 0:
        return Solution("infeasible", "modules before any checkpointable module already exceed the budget")
    cap = np.maximum(np.maximum.accumulate(keyneed[::-1])[::-1], 0.0)
    lb = _LowerBound(prob, fr, keyneed, cap, fr.starts)
    lower = float(lb(0, np.zeros(1))[0])
    if not math.isfinite(lower):
        return Solution("infeasible", "no plan fits the budget")
    try:
        # The beam is bounded by its width, so it always runs to the end: a
        # short time limit still yields a plan.
        heuristic = _DP(prob, fr, keyneed, lb, math.inf, beam, state_limit).solve()
    except (_GiveUp, _Timeout):
        heuristic = None
    upper = math.inf if heuristic is None else heuristic[0]
    try:
        exact = _DP(prob, fr, keyneed, lb, upper, None, state_limit, deadline).solve()
        status, message, gap = "optimal", "optimal plan found (exact bounded DP)", 0.0
    except (_GiveUp, _Timeout) as exc:
        if heuristic is None:
            return None
        exact = heuristic
        gap = max(0.0, (upper - lower) / upper) if upper > 0 else 0.0
        why = "time limit reached" if isinstance(exc, _Timeout) else "state limit reached"
        status, message = "feasible", f"{why}; best plan found, with its proven gap"
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
    return Solution(status, message, peak, recompute, gap, 0.0, decisions)

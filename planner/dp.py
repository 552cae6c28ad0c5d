"""Exact bounded dynamic program for the module-level problem.

Same model as the MILP in :mod:`planner.milp`, solved along the forward
post-order: the memory constraints are a chain (each one bounds the discard
accumulated by the candidates finishing before a module), so a list of
non-dominated (discarded bytes, recompute ms) states, extended module by
module with the module's exact frontier, holds every optimal plan.

Two bounds keep the lists short without losing exactness:

* a lower bound on the recompute still to come from each state: the same
  DP run backward on a coarse grid of discarded memory, rounding every step
  optimistically (:class:`planner.cost_to_go.CostToGo`);
* an upper bound from a narrow beam pass of the forward DP guided by that
  lower bound (a real plan).

States whose cost plus that lower bound exceeds the upper bound cannot lead
to a better plan and are dropped. If the lists still outgrow ``state_limit``
the DP gives up and the caller falls back to the MILP.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from planner.cost_to_go import CostToGo, MaxBound
from planner.lagrange import HullLP, Lagrange, hull_vertices
from planner.knapsack import GroupClasses, best_saved_within
from planner.memory_model import NEED_TOL_BYTES
from planner.milp import _FRONTIER_LIMIT, Problem, Solution, _frontier, _reduced_keyneeds
from planner.op_policy import Frontier, FrontierTooLarge, capped_frontier, frontier_hull
from planner.min_peak import subtree_starts
from planner.stack import StackResult, find_stack, solve_stack

__all__ = ["solve_dp"]

_TOL = 1e-9
_MIB = float(2**20)
# Stacks of at least this many identical blocks are planned by the count-space
# relaxation first (planner/stack.py). Measured while tuning 0.4.0 on copies
# of the L12 sample's block (bench/synthetic.py, 8 to 200 blocks): from 16
# blocks on it is faster at most budgets, below it the DP is. Shorter stacks
# still reach it as a fallback when the DP cannot close its gap.
_STACK_FIRST_BLOCKS = 16
_STACK_WORK = 2e7  # label extensions / tail pairs the relaxation may spend (about a second at most)


@dataclass
class _Frontiers:
    d: list[np.ndarray]  # per candidate: discarded bytes of useful points, ascending (int64)
    rc: list[np.ndarray]  # recompute ms, ascending
    point: list[np.ndarray]  # index of each point in the module's Frontier
    starts: list[int]  # first candidate of each candidate's subtree
    hulls: list[tuple[np.ndarray, np.ndarray]]  # lower hull vertices per candidate (MiB, ms)
    lp: HullLP | None = None
    fid: list[int] = field(default_factory=list)  # equal for candidates with the same frontier
    stack: object = None  # planner.stack.Stack, or False when the candidates form no stack
    max_d: list[int] = field(default_factory=list)  # per candidate: its largest discard
    # Candidates whose whole frontier is too long to list (a module spanning a
    # whole model): no points here; per budget :func:`_for_budget` lists the
    # part a plan can use into ``capped`` (candidate -> its Frontier object).
    giants: dict[int, str] = field(default_factory=dict)
    capped: dict[int, "Frontier | _Points"] = field(default_factory=dict)


class _GiveUp(Exception):
    pass


class _Timeout(Exception):
    pass


def _prepare(prob: Problem) -> _Frontiers | None:
    """Budget-independent DP inputs, computed once per Problem (a sweep shares them)."""
    if prob._dp is None:
        prob._dp = (_build(prob),)
    return prob._dp[0]


def _build(prob: Problem) -> _Frontiers:
    out = _Frontiers([], [], [], subtree_starts(prob), [])
    memo: dict[tuple, tuple] = {}
    fids: dict[tuple, int] = {}
    for i, cand in enumerate(prob.candidates):
        key = (cand.ops_key, cand.act_saved_bytes)
        if key not in memo:
            m = prob.stats.module(cand.fqn)
            f = _frontier(prob._frontiers, m)
            if f is None:  # too long to list: points per budget (_for_budget), the hull from the knapsack's greedy
                hd, hrc = frontier_hull(m.ops, m.force_store_random, act_saved_bytes=cand.act_saved_bytes)
                none = np.zeros(0, np.int64)
                memo[key] = (none, np.zeros(0), none, hull_vertices(hd, hrc), int(hd[-1]) if len(hd) else 0, True)
            else:
                d = cand.act_saved_bytes - f.saved_bytes[::-1]
                keep = d > 0  # a point that frees nothing is never part of a plan
                d, rc = d[keep].astype(np.int64), f.recompute_ms[::-1][keep]
                memo[key] = (d, rc, np.arange(len(f))[::-1][keep], hull_vertices(d, rc),
                             int(d[-1]) if len(d) else 0, False)
        out.fid.append(fids.setdefault(key, len(fids)))
        d, rc, point, hull, max_d, giant = memo[key]
        for lst, v in zip((out.d, out.rc, out.point, out.hulls, out.max_d), (d, rc, point, hull, max_d)):
            lst.append(v)
        if giant:
            out.giants[i] = cand.fqn
    return out


def _for_budget(prob: Problem, fr: _Frontiers, keyneed: np.ndarray) -> _Frontiers | None:
    """``fr`` with its giant candidates' usable points listed for this budget; None if still too many.

    A checkpointed candidate c blocks its whole subtree, so the keys from its
    subtree's start to c itself see only the discards of candidates before
    that start: if their largest possible sum cannot meet a need there, c is
    never part of a plan. Otherwise c's discard only helps keys after c,
    so no plan uses more of it than the largest need after c, and the
    frontier capped there (:func:`planner.op_policy.capped_frontier`) holds
    every point a plan can use.
    """
    if not fr.giants:
        return fr
    out = _Frontiers(list(fr.d), list(fr.rc), list(fr.point), fr.starts, fr.hulls, fr.lp, fr.fid, fr.stack,
                     fr.max_d, fr.giants, {})
    most = np.concatenate([[0], np.cumsum(np.asarray(fr.max_d, dtype=np.float64))])  # over-estimates: nesting ignored
    for i, fqn in fr.giants.items():
        a = fr.starts[i]
        after = keyneed[i + 1:]
        cap = float(np.max(after))
        if float(np.max(keyneed[a:i + 1])) > most[a] + NEED_TOL_BYTES or cap <= 0:
            continue  # never part of a plan at this budget: no points
        # Less than this discard leaves some key after i short whatever the others discard.
        least = float(np.max(after - most[a] - (most[i + 1:] - most[i + 1])))
        m = prob.stats.module(fqn)
        if least >= cap - NEED_TOL_BYTES:  # one useful point: the cheapest decision discarding at least cap
            f = _cheapest_discarding(prob.candidates[i].classes, m.act_saved_bytes, cap)
        else:
            try:
                f = capped_frontier(m.ops, m.force_store_random, act_saved_bytes=m.act_saved_bytes,
                                    max_discard_bytes=cap, max_points=_FRONTIER_LIMIT)
            except FrontierTooLarge:
                return None
        d = m.act_saved_bytes - f.saved_bytes[::-1]
        keep = d > 0
        out.d[i], out.rc[i] = d[keep].astype(np.int64), (m.op_ms - f.saved_ms[::-1])[keep]
        out.point[i] = np.arange(len(f))[::-1][keep]
        out.capped[i] = f
    return out


@dataclass
class _Points:
    """A few decisions of one module, shaped like a Frontier for :func:`_solution`."""

    saved_bytes: np.ndarray
    saved_ms: np.ndarray
    lists: list[list[int]]

    def __len__(self) -> int:
        return len(self.saved_bytes)

    def save_list(self, k: int) -> list[int]:
        return self.lists[k]


def _cheapest_discarding(classes: GroupClasses, act_saved_bytes: int, cap: float) -> _Points:
    """The decision recomputing least among those discarding at least ``cap`` bytes (no point if there is none).

    One exact integer program over op-group classes (interchangeable groups
    counted): :func:`planner.knapsack.best_saved_within`.
    """
    counts = best_saved_within(classes, math.floor(act_saved_bytes - cap))
    if counts is None:
        return _Points(np.zeros(0, np.int64), np.zeros(0), [])
    saved_bytes = classes.always_saved_bytes + int(counts @ classes.class_bytes)
    saved_ms = classes.always_saved_ms + float(counts @ classes.class_ms)
    return _Points(np.array([saved_bytes], np.int64), np.array([saved_ms]), [classes.save_list(counts)])


class _DP:
    def __init__(self, prob: Problem, fr: _Frontiers, keyneed: np.ndarray, lb: CostToGo,
                 upper: float, beam: int | None, state_limit: int, deadline: float = math.inf):
        self.prob, self.fr, self.keyneed, self.lb = prob, fr, keyneed, lb
        self.deadline = deadline
        self.upper, self.beam, self.state_limit = upper, beam, state_limit
        self.work, self.work_limit = 0, math.inf
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
        ok = st[0] >= self.keyneed[k] - NEED_TOL_BYTES
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
        self.work += len(s) * len(d)
        if self.work > self.work_limit:
            raise _GiveUp
        if math.isfinite(self.upper) and isinstance(self.lb, MaxBound):
            # The Lagrangian part is separable (state term + point term): a cheap
            # first filter, so pairs are formed and the gridded bound looked up
            # only for its survivors.
            lim = self.upper + _TOL * (1 + abs(self.upper))
            lag, k = self.lb.a, i + 1
            slope = lag.M[k] / _MIB
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


def _beam(prob: Problem, fr: _Frontiers, keyneed: np.ndarray, lb: CostToGo, width: int,
          state_limit: int) -> tuple[float, dict[int, int]] | None:
    """A real plan from a beam pass (no deadline: its width bounds the work)."""
    try:
        return _DP(prob, fr, keyneed, lb, math.inf, width, state_limit).solve()
    except (_GiveUp, _Timeout):
        return None


def solve_dp(prob: Problem, budget_bytes: float, *, time_limit_s: float = 60.0, state_limit: int = 200_000,
             beam: int = 32, grid: int = 8192, first_gap: float = 1e-5,
             mip_rel_gap: float = 1e-6, work_limit: float = 1e7, grid_cells: float = 1e7,
             grid_memory: float = 2.0**25, finish_cells: float = 1e9) -> Solution | None:
    """Plan by bounded DP; None when the DP does not apply or finds nothing (use the MILP).

    The hull LP's duals give an affine lower bound on what every DP state
    still has to recompute (:class:`planner.lagrange.Lagrange`). The search
    then guesses how far above that bound the optimum lies (``first_gap``,
    relative, growing fourfold per round): frontier points whose penalty
    alone breaks the guess are dropped, a beam pass finds a plan, and the
    exact pass keeps only states whose cost plus bound (the larger of the
    Lagrangian and the gridded cost-to-go) stays within the guess. If the
    exact pass returns a plan it is optimal; if it returns nothing, no plan
    costs less than the guess, which becomes the proven lower bound.

    ``mip_rel_gap`` is spent in two halves: near-duplicate frontier points
    (a few bytes and nanoseconds apart) are absorbed into a neighbour that
    discards at least as much, and the last pass only looks for plans
    cheaper than the best one by the other half. The plan is ``optimal``
    when its proven gap is within ``mip_rel_gap``; when ``work_limit``
    (state-point pairs over all exact passes), ``state_limit`` or
    ``time_limit_s`` stop the search first, the best plan comes back as
    ``feasible`` with its proven gap.
    """
    deadline = time.perf_counter() + time_limit_s
    fr = _prepare(prob)
    if fr is None:
        return None
    keyneed = _reduced_keyneeds(prob, budget_bytes)
    if keyneed[0] > 0:
        return Solution("infeasible", "modules before any checkpointable module already exceed the budget")
    _hull_lp(fr, prob)  # budget-independent: built once, on the shared frontiers
    fr = _for_budget(prob, fr, keyneed)
    if fr is None:
        return None
    status, mu = _hull_lp(fr, prob).duals(keyneed)
    if status == "infeasible":
        return Solution("infeasible", "no plan fits the budget (even the convex relaxation is infeasible)")
    if status != "ok":
        return None
    lag = Lagrange(mu, keyneed, fr.starts, fr.d, fr.rc)
    lower = lag.lower
    cap0 = float(np.maximum(np.max(keyneed), 0.0))
    # Half the requested gap may go to absorbing near-duplicate points: a
    # point q is dropped when a kept point of the same module discards at
    # least as much for at most eps more recompute. Swapping every chosen
    # point of a plan for its absorber keeps the plan feasible (more discard)
    # and costs at most ``slack`` more, so the cheapest plan over the kept
    # points is within ``slack`` of the optimum.
    slack = 0.5 * mip_rel_gap * max(lower, 0.0)
    best: tuple[float, dict[int, int], _Frontiers] | None = None
    stack_lower = -math.inf  # the count-space relaxation's bound, when the candidates form a stack
    stack = _stack_of(_prepare(prob))
    # Deep stacks go to the count-space relaxation first: the DP's state lists
    # explode there. Short ones are the DP's (fast, and the relaxation's
    # integrality gap is wide); the relaxation is their fallback below.
    stack_tried = stack is not None and len(stack.blocks) >= _STACK_FIRST_BLOCKS
    if stack_tried:
        res = _stack_pass(fr, stack, keyneed, slack, deadline)
        if res is not None:
            stack_lower = res.lower
            if res.choices is not None:
                best = (res.cost, res.choices, fr)
                if res.cost - res.lower <= mip_rel_gap * abs(res.cost):
                    return _stack_solution(prob, fr, res)
    base_fr = fr
    fr, pen = _absorb(fr, lag.penalties(), slack / max(len(fr.d), 1))
    exc: Exception | None = None
    exact = None
    work = 0
    searched = -math.inf  # no plan over the kept points costs less (raised by every exact pass)

    def proven() -> float:  # no plan at all costs less
        return max(lower, searched - slack, stack_lower)

    guess = lower + first_gap * max(abs(lower), 1e-9)
    while True:
        if best is not None and time.perf_counter() > deadline:
            exc = _Timeout()  # out of time with a plan in hand (the stack pass's): no further round
            break
        sub, n_fixed = _fix(fr, lag, pen, guess)
        if n_fixed == 0:
            guess = math.inf  # nothing left to fix: search everything
        level = guess  # every kept-point plan costing at most this uses only sub's points
        bound = MaxBound(lag, CostToGo.sized(sub, keyneed, cap0, grid, grid_cells, grid_memory))
        # a beam pass for a plan, unless the exact pass below searches up to the best one anyway
        h = None if best is not None and guess >= best[0] else _beam(prob, sub, keyneed, bound, beam, state_limit)
        if h is not None and (best is None or h[0] < best[0]):
            best = (h[0], h[1], sub)
            if best[0] < guess:  # a better plan fixes more points
                tighter, _ = _fix(fr, lag, pen, best[0])
                moved = _remap(h[1], sub, tighter)
                if moved is not None:
                    sub, best, level = tighter, (h[0], moved, tighter), h[0]
                    bound = MaxBound(lag, CostToGo.sized(sub, keyneed, cap0, grid, grid_cells, grid_memory))
        # The gridded bound at the root holds for every plan over sub's points,
        # so no kept-point plan costs less than it or than sub's level.
        root = float(bound(0, np.zeros(1))[0])
        searched = max(searched, min(level, root))
        if best is not None and best[0] - proven() <= mip_rel_gap * abs(best[0]):
            break  # within the requested gap
        upper = guess if best is None else min(guess, best[0])
        # at the known plan, look only for plans better by the other half of the gap
        target = upper if best is None or upper < best[0] else best[0] - 0.5 * mip_rel_gap * abs(best[0])
        if root > target + _TOL * (1 + abs(target)):
            exact = None  # the bound alone rules out every plan the pass admits
        else:
            search = _DP(prob, sub, keyneed, bound, target, None, state_limit, deadline)
            search.work_limit = work_limit - work
            try:
                exact = search.solve()
            except (_Timeout, _GiveUp) as e:
                exc = e
                break
            finally:
                work += search.work
        if exact is not None and (best is None or exact[0] < best[0]):
            best = (exact[0], exact[1], sub)
        # the pass admits every kept-point plan up to min(target, guess) and returns the cheapest
        searched = max(searched, exact[0] if exact is not None else min(target, guess))
        if best is not None and best[0] <= guess:
            break  # every plan costing less lies inside the guess and was searched
        if not math.isfinite(guess):
            break  # searched everything: no plan
        # widen the guess (never past a known plan, which bounds the search exactly)
        guess = lower + 4 * (guess - lower)
        if best is not None and guess >= lower + 0.5 * (best[0] - lower):
            guess = best[0]  # close to the known plan: search up to it at once
    if (best is not None and exc is not None and not isinstance(exc, _Timeout) and finish_cells > 0
            and best[0] - proven() > mip_rel_gap * abs(best[0])
            and time.perf_counter() + finish_cells / 1e9 < deadline):  # about a second per 1e9 cells
        # The search ran out of work before closing the gap (deep stacks of
        # near-equal layers). Finish on a finer grid over the points a better
        # plan may use: its root bound certifies a tighter gap, and a beam
        # guided by it often finds a better plan.
        sub, _ = _fix(fr, lag, pen, best[0])
        fine = CostToGo.sized(sub, keyneed, cap0, grid, finish_cells, grid_memory, max_grid=2**18)
        bound = MaxBound(lag, fine)
        searched = max(searched, min(best[0], float(bound(0, np.zeros(1))[0])))
        if time.perf_counter() < deadline:
            h = _beam(prob, sub, keyneed, bound, beam, state_limit)
            if h is not None and h[0] < best[0]:
                best = (h[0], h[1], sub)
    if (not stack_tried and stack is not None and best is not None and exc is not None
            and best[0] - proven() > mip_rel_gap * abs(best[0])):
        res = _stack_pass(base_fr, stack, keyneed, slack, deadline)  # a short stack the DP could not close
        if res is not None:
            stack_lower = res.lower
            if res.choices is not None and res.cost < best[0]:
                best = (res.cost, res.choices, base_fr)
            if best[0] - proven() <= mip_rel_gap * abs(best[0]):
                exc = None
    if best is None:
        if exc is not None:
            return None
        return Solution("infeasible", "no plan fits the budget")
    cost, choices, sub = best
    gap = min(1.0, max(0.0, (cost - proven()) / cost)) if cost > 0 else 0.0
    if exc is None or gap <= mip_rel_gap * (1 + 1e-9):
        gap = min(gap, mip_rel_gap)
        status, message = "optimal", "optimal plan found (exact bounded DP)"
    else:
        why = "time limit reached" if isinstance(exc, _Timeout) else "search work limit reached"
        status, message = "feasible", f"{why}; best plan found, with its proven gap"
    return _solution(prob, sub, choices, status, message, gap)


def _solution(prob: Problem, fr: _Frontiers, choices: dict[int, int], status: str, message: str,
              gap: float) -> Solution:
    """A plan from (candidate -> index into fr's frontier) choices, its peak and recompute re-derived."""
    decisions = {}
    for i, j in choices.items():
        cand = prob.candidates[i]
        f = fr.capped.get(i) or _frontier(prob._frontiers, prob.stats.module(cand.fqn))
        k = int(fr.point[i][j])
        decisions[cand.fqn] = (f.save_list(k), int(f.saved_bytes[k]), float(f.saved_ms[k]))
    discarded = {f: prob.stats.module(f).act_saved_bytes - sb for f, (_, sb, _) in decisions.items()}
    peak = prob.model.peak_bytes(discarded)
    recompute = math.fsum(prob.stats.module(f).op_ms - sm for f, (_, _, sm) in decisions.items())
    return Solution(status, message, peak, recompute, gap, 0.0, decisions)


def _stack_of(base: _Frontiers):
    """The stack structure of the candidates (cached on the budget-independent frontiers), or None."""
    if base.stack is None:
        stack = find_stack(base)
        if stack is not None and any(base.starts[stack.blocks[0]] <= i <= stack.blocks[-1] for i in base.giants):
            stack = None  # a block's points would change with the budget
        base.stack = stack or False
    return base.stack or None


def _stack_pass(fr: _Frontiers, stack, keyneed: np.ndarray, slack: float,
                deadline: float = math.inf) -> StackResult | None:
    """The count-space relaxation (bound and, often, an optimal plan) of a stack of identical blocks."""
    if fr.giants:
        stack._other_options.clear()  # a giant among the other subtrees lists other points per budget
    return solve_stack(fr, stack, keyneed, math.inf, eps=slack / len(stack.blocks), work_limit=_STACK_WORK,
                       deadline=deadline)


def _stack_solution(prob: Problem, fr: _Frontiers, res: StackResult) -> Solution:
    gap = max(res.cost - res.lower, 0.0) / res.cost if res.cost > 0 else 0.0
    return _solution(prob, fr, res.choices, "optimal",
                     "optimal plan found (exact count-space relaxation of a stack of identical blocks)", gap)


def _remap(choices: dict[int, int], old: _Frontiers, new: _Frontiers) -> dict[int, int] | None:
    """The same plan's choices as indices into ``new``; None if ``new`` lost a chosen point."""
    out = {}
    for i, j in choices.items():
        k = int(old.point[i][j])
        pos = int(np.searchsorted(-new.point[i], -k))  # point indices are descending
        if pos >= len(new.point[i]) or new.point[i][pos] != k:
            return None
        out[i] = pos
    return out


def _absorb(fr: _Frontiers, pen: list[np.ndarray], eps: float) -> tuple[_Frontiers, list[np.ndarray]]:
    """Drop each point that a kept point of the same module beats on discard for at most ``eps`` more ms."""
    out = _Frontiers([], [], [], fr.starts, fr.hulls, giants=fr.giants, capped=fr.capped)
    memo: dict[int, np.ndarray] = {}
    kept_pen = []
    for i in range(len(fr.d)):
        if id(fr.rc[i]) not in memo:  # modules with the same op list share their arrays
            rc = fr.rc[i].tolist()  # ascending, as d is
            keep = np.zeros(len(rc), bool)
            last = math.inf
            for j in range(len(rc) - 1, -1, -1):
                if last - rc[j] > eps:
                    keep[j] = True
                    last = rc[j]
            memo[id(fr.rc[i])] = keep
        keep = memo[id(fr.rc[i])]
        out.d.append(fr.d[i][keep])
        out.rc.append(fr.rc[i][keep])
        out.point.append(fr.point[i][keep])
        kept_pen.append(pen[i][keep])
    return out, kept_pen


def _fix(fr: _Frontiers, lag: Lagrange, pen: list[np.ndarray], upper: float) -> tuple[_Frontiers, int]:
    """The frontiers without points that cannot be part of a plan costing at most ``upper``, and how many went."""
    tol = 1e-7 * (1.0 + abs(upper))
    out = _Frontiers([], [], [], fr.starts, fr.hulls, giants=fr.giants, capped=fr.capped)
    fixed = 0
    for i in range(len(fr.d)):
        keep = lag.lower + pen[i] <= upper + tol
        fixed += len(keep) - int(keep.sum())
        out.d.append(fr.d[i][keep])
        out.rc.append(fr.rc[i][keep])
        out.point.append(fr.point[i][keep])
    return out, fixed


def _hull_lp(fr: _Frontiers, prob: Problem) -> HullLP:
    if fr.lp is None:
        fr.lp = HullLP(fr.hulls, prob.chains)
    return fr.lp

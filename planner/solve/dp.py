"""Exact bounded dynamic program for the module-level problem: the default engine.

Same model as the MILP in :mod:`planner.solve.milp`, solved along the forward
post-order by the state search of :mod:`planner.solve.dp_search`. Two bounds
keep its lists short without losing exactness:

* a lower bound on the recompute still to come from each state: the larger of
  the Lagrangian bound of the hull LP (:mod:`planner.solve.bounds.lagrange`)
  and the same DP run backward on a coarse grid of discarded memory
  (:mod:`planner.solve.bounds.cost_to_go`);
* an upper bound from a narrow beam pass of the forward DP guided by that
  lower bound (a real plan).

States whose cost plus that lower bound exceeds the upper bound cannot lead
to a better plan and are dropped. Deep stacks of identical blocks go to the
count-space relaxation (:mod:`planner.solve.stack`) first. If the lists still
outgrow ``state_limit`` the DP gives up and the caller falls back to the MILP.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from planner.memory_model import NEED_TOL_BYTES
from planner.solve.bounds.cost_to_go import CostToGo, MaxBound
from planner.solve.bounds.lagrange import HullLP, Lagrange
from planner.solve.dp_search import SearchGaveUp, SearchTimedOut, StateSearch, beam_plan
from planner.solve.giants import for_budget
from planner.solve.points import absorbed
from planner.solve.problem import Frontiers, Problem, held_needs, key_needs
from planner.solve.solution import Solution
from planner.solve.stack.relaxation import Stack, StackResult, find_stack, solve_stack

__all__ = ["STACK_FIRST_BLOCKS", "DPSettings", "hull_lp", "plan_from_choices", "solve_dp", "stack_of"]

_TOL = 1e-9
# Stacks of at least this many identical blocks are planned by the count-space
# relaxation first (planner/solve/stack). Measured while tuning 0.4.0 on copies
# of the L12 sample's block (bench/synthetic.py, 8 to 200 blocks): from 16
# blocks on it is faster at most budgets, below it the DP is. Shorter stacks
# still reach it as a fallback when the DP cannot close its gap.
STACK_FIRST_BLOCKS = 16
_STACK_WORK = 2e7  # label extensions / tail pairs the relaxation may spend (about a second at most)


@dataclass(frozen=True)
class DPSettings:
    """The DP's effort knobs (see :func:`solve_dp`)."""

    state_limit: int = 200_000
    beam: int = 32
    grid: int = 8192
    first_gap: float = 1e-5
    mip_rel_gap: float = 1e-6
    work_limit: float = 1e7
    grid_cells: float = 1e7
    grid_memory: float = 2.0**25
    finish_cells: float = 1e9


def solve_dp(prob: Problem, budget_bytes: float, *, time_limit_s: float = 60.0, **settings) -> Solution | None:
    """Plan by bounded DP; None when the DP does not apply or finds nothing (use the MILP).

    It does not apply when a candidate is called more than once and the stats
    describe every call (``Problem.repeat_counts``): each call's discard is in
    effect over its own span, so a moment's memory depends on which module
    discarded, not only on how much was discarded before it.

    The hull LP's duals give an affine lower bound on what every DP state
    still has to recompute (:class:`planner.solve.bounds.lagrange.Lagrange`).
    The search then guesses how far above that bound the optimum lies
    (``first_gap``, relative, growing fourfold per round): frontier points
    whose penalty alone breaks the guess are dropped, a beam pass finds a
    plan, and the exact pass keeps only states whose cost plus bound (the
    larger of the Lagrangian and the gridded cost-to-go) stays within the
    guess. If the exact pass returns a plan it is optimal; if it returns
    nothing, no plan costs less than the guess, which becomes the proven
    lower bound.

    ``mip_rel_gap`` is spent in two halves: near-duplicate frontier points
    (a few bytes and nanoseconds apart) are absorbed into a neighbour that
    discards at least as much, and the last pass only looks for plans
    cheaper than the best one by the other half. The plan is ``optimal``
    when its proven gap is within ``mip_rel_gap``; when ``work_limit``
    (state-point pairs over all exact passes), ``state_limit`` or
    ``time_limit_s`` stop the search first, the best plan comes back as
    ``feasible`` with its proven gap. ``settings``: the fields of
    :class:`DPSettings`.
    """
    if prob.repeat_counts():
        return None  # later calls of a module discard too: the needs are no chain over running sums (the MILP's)
    cfg = DPSettings(**settings)
    deadline = time.perf_counter() + time_limit_s
    keyneed = key_needs(prob, budget_bytes)
    if keyneed[0] > 0:
        return Solution.infeasible("modules before any checkpointable module already exceed the budget")
    lp = hull_lp(prob)  # budget-independent: built once, on the shared frontiers
    fr = for_budget(prob, prob.frontiers(), keyneed)
    if fr is None:
        return None
    status, mu = lp.duals(keyneed)
    if status == "infeasible":
        return Solution.infeasible("no plan fits the budget (even the convex relaxation is infeasible)")
    if status != "ok":
        return None
    search = _Search(prob, fr, keyneed, Lagrange(mu, keyneed, fr.starts, fr.d, fr.rc), cfg, deadline)
    search.held_need, search.budget_bytes = held_needs(prob, budget_bytes), budget_bytes
    return search.run()


def hull_lp(prob: Problem) -> HullLP:
    """The budget-independent hull LP of the problem's frontiers (built once per problem)."""
    return prob.derived("hull_lp", lambda p: HullLP(p.frontiers().hulls, p.chains))


def stack_of(prob: Problem) -> Stack | None:
    """The stack structure of the candidates (built once per problem), or None."""
    def build(p: Problem) -> Stack | None:
        base = p.frontiers()
        stack = find_stack(base)
        if stack is not None and any(base.starts[stack.blocks[0]] <= i <= stack.blocks[-1] for i in base.giants):
            return None  # a block's points would change with the budget
        return stack
    return prob.derived("stack", build)


def plan_from_choices(prob: Problem, fr: Frontiers, choices: dict[int, int], status, message: str,
                      gap: float) -> Solution:
    """A plan from (candidate -> index into fr's points) choices, its peak and recompute re-derived.

    The same choices (the same frontier points, in the same order: the peak's sums follow it) give the same plan,
    so a problem keeps each plan it derived: a search checks a plan against the held inputs, then returns it,
    and a sweep's budgets often pick the same one. Points of a budget's capped giants are never kept.
    """
    memo = prob.derived("plans_from_choices", lambda p: {})
    key = None if any(i in fr.capped for i in choices) else \
        tuple((i, int(fr.point[i][j])) for i, j in choices.items())
    planned = memo.get(key) if key is not None else None
    if planned is None:
        decisions = {}
        save_lists: dict[tuple[int, int], list[int]] = {}  # repeated layers often take the same point
        for i, j in choices.items():
            cand = prob.candidates[i]
            f = fr.capped.get(i) or prob.frontier(cand.fqn)
            k = int(fr.point[i][j])
            save = save_lists.get((id(f), k))
            if save is None:
                save = save_lists[(id(f), k)] = f.save_list(k)
            decisions[cand.fqn] = (save, int(f.saved_bytes[k]), float(f.saved_ms[k]))
        planned = Solution.planned(prob, decisions, status, message, gap)
        if key is not None:
            memo[key] = planned
    return planned.with_status(status, message, gap)


class _Search:
    """One budget's search: rounds of growing guesses, then the finishing grid and the stack fallback."""

    def __init__(self, prob: Problem, fr: Frontiers, keyneed: np.ndarray, lag: Lagrange, cfg: DPSettings,
                 deadline: float):
        self.prob, self.keyneed, self.lag, self.cfg, self.deadline = prob, keyneed, lag, cfg, deadline
        self.lower = lag.lower
        self.cap0 = float(np.maximum(np.max(keyneed), 0.0))
        # Half the requested gap may go to absorbing near-duplicate points: a
        # point q is dropped when a kept point of the same module discards at
        # least as much for at most eps more recompute. Swapping every chosen
        # point of a plan for its absorber keeps the plan feasible (more discard)
        # and costs at most ``slack`` more, so the cheapest plan over the kept
        # points is within ``slack`` of the optimum.
        self.slack = 0.5 * cfg.mip_rel_gap * max(self.lower, 0.0)
        self.base_fr = fr
        self.fr, self.pen = fr, []  # the absorbed points and their penalties, once the search needs them
        self.best: tuple[float, dict[int, int], Frontiers] | None = None
        self.stack_lower = -math.inf  # the count-space relaxation's bound, when the candidates form a stack
        self.searched = -math.inf  # no plan over the kept points costs less (raised by every exact pass)
        self.stopped: Exception | None = None
        self.work = 0
        # what the search's filters add for the inputs checkpointed modules hold (the bounds leave it out: they
        # stay lower bounds), and the budget the stack relaxation's plans are checked against (it leaves it out)
        self.held_need: dict[int, float] = {}
        self.budget_bytes = math.inf

    def proven(self) -> float:
        """No plan at all costs less."""
        return max(self.lower, self.searched - self.slack, self.stack_lower)

    def closed(self) -> bool:
        return self.best is not None and self.best[0] - self.proven() <= self.cfg.mip_rel_gap * abs(self.best[0])

    def run(self) -> Solution | None:
        stack = stack_of(self.prob)
        # Deep stacks go to the count-space relaxation first: the DP's state lists
        # explode there. Short ones are the DP's (fast, and the relaxation's
        # integrality gap is wide); the relaxation is their fallback below.
        stack_first = stack is not None and len(stack.blocks) >= STACK_FIRST_BLOCKS
        if stack_first:
            res = self._stack_pass(stack)
            if (res is not None and res.choices is not None and res.cost - res.lower <= self.cfg.mip_rel_gap * abs(res.cost)
                    and self._holds(res.choices)):
                gap = max(res.cost - res.lower, 0.0) / res.cost if res.cost > 0 else 0.0
                return plan_from_choices(self.prob, self.base_fr, res.choices, "optimal", "optimal plan found "
                                         "(exact count-space relaxation of a stack of identical blocks)", gap)
        self.fr, self.pen = _absorb(self.base_fr, self.lag.penalties(), self.slack / max(len(self.base_fr.d), 1))
        self._rounds()
        if (self.best is not None and self.stopped is not None and not isinstance(self.stopped, SearchTimedOut)
                and self.cfg.finish_cells > 0 and not self.closed()
                and time.perf_counter() + self.cfg.finish_cells / 1e9 < self.deadline):  # ~1 s per 1e9 cells
            self._finish()
        if (not stack_first and stack is not None and self.best is not None and self.stopped is not None
                and not self.closed()):
            self._stack_pass(stack)  # a short stack the DP could not close
            if self.closed():
                self.stopped = None
        return self._result()

    def _stack_pass(self, stack: Stack) -> StackResult | None:
        """The count-space relaxation (bound and, often, an optimal plan) of a stack of identical blocks."""
        # half the gap goes to absorbing points (eps), most of the other half to the count search
        res = solve_stack(self.base_fr, stack, self.keyneed, math.inf, eps=self.slack / len(stack.blocks),
                          work_limit=_STACK_WORK, deadline=self.deadline, rel_gap=0.4 * self.cfg.mip_rel_gap,
                          held_need=self.held_need)
        if res is not None:
            self.stack_lower = res.lower  # it keeps the held inputs' needs only where it can: still a lower bound
            if res.choices is not None and (self.best is None or res.cost < self.best[0]) and self._holds(res.choices):
                self.best = (res.cost, res.choices, self.base_fr)
        return res

    def _holds(self, choices: dict[int, int]) -> bool:
        """Whether the stack relaxation's plan meets the budget with the inputs its modules hold."""
        if not self.held_need:
            return True
        plan = plan_from_choices(self.prob, self.base_fr, choices, "feasible", "", 0.0)
        return plan.peak_bytes <= self.budget_bytes + NEED_TOL_BYTES

    def _bound(self, sub: Frontiers, cells: float, max_grid: int = 2**17) -> MaxBound:
        cfg = self.cfg
        return MaxBound(self.lag, CostToGo.sized(sub, self.keyneed, self.cap0, cfg.grid, cells, cfg.grid_memory,
                                                 max_grid=max_grid))

    def _rounds(self) -> None:
        """Exact passes below growing guesses until a plan lies under one, or a limit stops the search."""
        cfg, lower = self.cfg, self.lower
        guess = lower + cfg.first_gap * max(abs(lower), 1e-9)
        while True:
            if self.best is not None and time.perf_counter() > self.deadline:
                self.stopped = SearchTimedOut()  # out of time with a plan in hand (the stack pass's): no further round
                return
            done = self._round(guess)
            if done:
                return
            # widen the guess (never past a known plan, which bounds the search exactly)
            guess = lower + 4 * (guess - lower)
            if self.best is not None and guess >= lower + 0.5 * (self.best[0] - lower):
                guess = self.best[0]  # close to the known plan: search up to it at once

    def _round(self, guess: float) -> bool:
        """One guess: fix points, a beam pass, an exact pass. True when the search is over."""
        cfg, best = self.cfg, self.best
        sub, n_fixed = _fix(self.fr, self.lag, self.pen, guess)
        if n_fixed == 0:
            guess = math.inf  # nothing left to fix: search everything
        level = guess  # every kept-point plan costing at most this uses only sub's points
        bound = self._bound(sub, cfg.grid_cells)
        # a beam pass for a plan, unless the exact pass below searches up to the best one anyway
        h = None if best is not None and guess >= best[0] else beam_plan(self.prob, sub, self.keyneed, bound,
                                                                         cfg.beam, cfg.state_limit, self.held_need)
        if h is not None and (best is None or h[0] < best[0]):
            self.best = best = (h[0], h[1], sub)
            if best[0] < guess:  # a better plan fixes more points
                tighter, _ = _fix(self.fr, self.lag, self.pen, best[0])
                moved = _remap(h[1], sub, tighter)
                if moved is not None:
                    sub, level = tighter, h[0]
                    self.best = best = (h[0], moved, tighter)
                    bound = self._bound(sub, cfg.grid_cells)
        # The gridded bound at the root holds for every plan over sub's points,
        # so no kept-point plan costs less than it or than sub's level.
        root = float(bound(0, np.zeros(1))[0])
        self.searched = max(self.searched, min(level, root))
        if self.closed():
            return True  # within the requested gap
        upper = guess if best is None else min(guess, best[0])
        # at the known plan, look only for plans better by the other half of the gap
        target = upper if best is None or upper < best[0] else best[0] - 0.5 * cfg.mip_rel_gap * abs(best[0])
        exact = None
        if root <= target + _TOL * (1 + abs(target)):  # else the bound alone rules out every plan the pass admits
            search = StateSearch(self.prob, sub, self.keyneed, bound, target, None, cfg.state_limit, self.deadline,
                                 held_need=self.held_need)
            search.work_limit = cfg.work_limit - self.work
            try:
                exact = search.solve()
            except (SearchTimedOut, SearchGaveUp) as e:
                self.stopped = e
                return True
            finally:
                self.work += search.work
        if exact is not None and (best is None or exact[0] < best[0]):
            self.best = best = (exact[0], exact[1], sub)
        # the pass admits every kept-point plan up to min(target, guess) and returns the cheapest
        self.searched = max(self.searched, exact[0] if exact is not None else min(target, guess))
        if best is not None and best[0] <= guess:
            return True  # every plan costing less lies inside the guess and was searched
        return not math.isfinite(guess)  # searched everything: no plan

    def _finish(self) -> None:
        """The search ran out of work before closing the gap (deep stacks of near-equal layers).

        Finish on a finer grid over the points a better plan may use: its root
        bound certifies a tighter gap, and a beam guided by it often finds a
        better plan.
        """
        best = self.best
        sub, _ = _fix(self.fr, self.lag, self.pen, best[0])
        bound = self._bound(sub, self.cfg.finish_cells, max_grid=2**18)
        self.searched = max(self.searched, min(best[0], float(bound(0, np.zeros(1))[0])))
        if time.perf_counter() < self.deadline:
            h = beam_plan(self.prob, sub, self.keyneed, bound, self.cfg.beam, self.cfg.state_limit, self.held_need)
            if h is not None and h[0] < best[0]:
                self.best = (h[0], h[1], sub)

    def _result(self) -> Solution | None:
        if self.best is None:
            if self.stopped is not None:
                return None
            return Solution.infeasible()
        cost, choices, sub = self.best
        mip_rel_gap = self.cfg.mip_rel_gap
        gap = min(1.0, max(0.0, (cost - self.proven()) / cost)) if cost > 0 else 0.0
        if self.stopped is None or gap <= mip_rel_gap * (1 + 1e-9):
            return plan_from_choices(self.prob, sub, choices, "optimal", "optimal plan found (exact bounded DP)",
                                     min(gap, mip_rel_gap))
        why = "time limit reached" if isinstance(self.stopped, SearchTimedOut) else "search work limit reached"
        return plan_from_choices(self.prob, sub, choices, "feasible", f"{why}; best plan found, with its proven gap",
                                 gap)


def _remap(choices: dict[int, int], old: Frontiers, new: Frontiers) -> dict[int, int] | None:
    """The same plan's choices as indices into ``new``; None if ``new`` lost a chosen point."""
    out = {}
    for i, j in choices.items():
        k = int(old.point[i][j])
        pos = int(np.searchsorted(-new.point[i], -k))  # point indices are descending
        if pos >= len(new.point[i]) or new.point[i][pos] != k:
            return None
        out[i] = pos
    return out


def _absorb(fr: Frontiers, pen: list[np.ndarray], eps: float) -> tuple[Frontiers, list[np.ndarray]]:
    """Drop each point that a kept point of the same module beats on discard for at most ``eps`` more ms."""
    memo: dict[int, np.ndarray] = {}
    d, rc, point, kept_pen = [], [], [], []
    for i in range(len(fr.d)):
        if id(fr.rc[i]) not in memo:  # modules with the same op list share their arrays
            memo[id(fr.rc[i])] = absorbed(fr.rc[i].tolist(), eps)
        keep = memo[id(fr.rc[i])]
        d.append(fr.d[i][keep]), rc.append(fr.rc[i][keep]), point.append(fr.point[i][keep])
        kept_pen.append(pen[i][keep])
    return fr.with_points(d, rc, point), kept_pen


def _fix(fr: Frontiers, lag: Lagrange, pen: list[np.ndarray], upper: float) -> tuple[Frontiers, int]:
    """The frontiers without points that cannot be part of a plan costing at most ``upper``, and how many went."""
    tol = 1e-7 * (1.0 + abs(upper))
    d, rc, point = [], [], []
    fixed = 0
    for i in range(len(fr.d)):
        keep = lag.lower + pen[i] <= upper + tol
        fixed += len(keep) - int(keep.sum())
        d.append(fr.d[i][keep]), rc.append(fr.rc[i][keep]), point.append(fr.point[i][keep])
    return fr.with_points(d, rc, point), fixed

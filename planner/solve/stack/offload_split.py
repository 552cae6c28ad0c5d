"""Offload on deep stacks where the relaxation's credit binds: the first blocks in count space, the last ones exact.

The stack relaxation (:mod:`planner.solve.stack.offload_stack`) credits a
module's offload at its own end. The full model credits window j's offload
only from the end of window j+1 on, so at every moment of block j+1 (its
MLP's backward, say) the previous block's offload and the block's own are
still on the device. Near a stack's end, where the needs grow faster than a
block frees, that is what binds: the relaxation's plan misses the budget
there, every block offloading all it can, and its bound is not tight. The
cheapest fix recomputes instead of offloading in the last few blocks, which
the relaxation cannot see (an option offloading less at the same freed bytes
costs more in it, and is not even listed).

So the stack is split, with K the last member blocks:

* **The prefix**, the first n = len(blocks) - K member blocks, is relaxed as
  in count space: everything it frees (discards and offloads) counts as freed
  once it ends (``x`` bytes), its own memory constraints are dropped, and its
  cost is at least ``n h(x / n)``, h the lower convex hull of one block's
  options (freed bytes, recompute + stall: the stack's block items). Each
  block costs at least h of what it frees and h is convex, so the blocks
  together cost at least that; and at every moment kept (before the prefix,
  and after it) the full model credits at most x of it: nothing before it,
  at most all of it after it (the last block's offload only later still).
  Every plan's prefix is therefore feasible here, at no more than its cost.
* **Everything else** (the modules before the stack, the last K blocks and
  what follows them) is the MILP of :mod:`planner.solve.milp_offload`, exact:
  each free op group saved, recomputed or offloaded, each window's offload
  credited one window late, each window's stall on its total, every memory
  row from the prefix's end on counting ``x``.

Its optimum is a lower bound on every plan (HiGHS's dual bound where it
stops early). Its plan, with the prefix blocks taking the cheapest multiset
of block options reaching ``x`` (on a hull vertex, one option for all,
costing exactly ``n h(x / n)``), is checked on the full model: optimal when
it meets the budget and costs within the gap of the bound. Where the
relaxation's credit binds only near the stack's end, the prefix takes its
relaxed optimum and the bound is the optimum (Llama-3 70B FSDP2 x32 at its
smallest recompute-only budget: the last 6 layers recompute part of what the
others offload).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds

from planner.highs import quiet_milp
from planner.memory_model import NEED_TOL_BYTES
from planner.solve.milp import HIGHS_TOLERANCES, BudgetMatrix, budget_need_rows
from planner.solve.milp_rows import discard_entries
from planner.solve.milp_offload import decode_offload
from planner.solve.offload import OffloadSetup, offload_plan
from planner.solve.points import lower_hull
from planner.solve.problem import Problem, held_needs, key_needs
from planner.solve.solution import Solution
from planner.solve.stack.multiset import CountWorkLimit, min_cost_counts
from planner.solve.stack.options import back_to_back
from planner.solve.stack.offload_stack import (OffloadStack, StackOffloadResult, better, evaluate, fits_budget,
                                               judged, stack_items)
from planner.solve.stack.relaxation import exchange_order

__all__ = ["SUFFIX_BLOCKS", "SplitResult", "solve_split", "split_first"]

# K tried in turn while not proven (at most all blocks but one): the last member blocks solved exactly. Llama-3
# 70B FSDP2 x32 at 52.4 GiB needs 6 (with 5, the prefix's early credit at its end lowers the bound by 2.5e-5)
SUFFIX_BLOCKS = (6, 16)


_HOW = ("the stack's first blocks in count space, its last blocks and the rest exactly by MILP, offload credited "
        "one window late there; its plan meets the bound on the full model")


def split_first(prob: Problem, setup: OffloadSetup, stacked: StackOffloadResult | None, budget_bytes: float, *,
                mip_rel_gap: float, deadline: float) -> StackOffloadResult | None:
    """``stacked`` (the stack engine's answer, not proven) with the split's (:func:`solve_split`, K from
    :data:`SUFFIX_BLOCKS` while not proven, in a third of the time left before ``deadline``): the better bound and
    the cheaper plan. ``stacked`` as it is where the split does not apply."""
    model = stack_items(prob, setup)
    if model.stack is None or len(model.stack.blocks) < 2:
        return stacked
    best = stacked
    # at most a third of the time left: the MILP after it keeps the rest where the split does not prove
    now = time.perf_counter()
    deadline = min(deadline, now + (deadline - now) / 3)
    for k in sorted({min(k, len(model.stack.blocks) - 1) for k in SUFFIX_BLOCKS}):
        split = solve_split(prob, setup, model, budget_bytes, k, mip_rel_gap=mip_rel_gap, deadline=deadline)
        if split is None:
            break
        lower = -math.inf if split.lower is None else split.lower
        plan = None if split.plan is None else judged(split.plan, lower, mip_rel_gap, _HOW)
        best = better(best, StackOffloadResult(lower, plan), mip_rel_gap, _HOW)
        if best.plan is not None and best.plan.status == "optimal":
            break
    return best


@dataclass(frozen=True)
class SplitResult:
    """A bound (None: none proven) and a plan meeting the budget on the full model (or None), unjudged."""

    lower: float | None
    plan: Solution | None = None


def solve_split(prob: Problem, setup: OffloadSetup, model: OffloadStack, budget_bytes: float, suffix_blocks: int, *,
                mip_rel_gap: float, deadline: float) -> SplitResult | None:
    """The split's bound and plan with the last ``suffix_blocks`` member blocks exact (see the module
    docstring); None where it does not apply (no stack of back-to-back blocks longer than the suffix, a
    module spanning the prefix, a memory row tying a prefix module to a later moment).

    ``model``: the stack relaxation's items (:func:`planner.solve.stack.offload_stack.stack_items`), whose block
    options bound the prefix.
    """
    fr, stack = model.frontiers, model.stack
    if stack is None or len(stack.blocks) <= suffix_blocks or not back_to_back(fr, stack):
        return None
    prefix = stack.blocks[:-suffix_blocks]
    lo, hi = fr.starts[prefix[0]], prefix[-1] + 1  # the prefix's candidates: lo .. hi - 1
    if any(fr.starts[i] < hi for i in range(hi, len(fr.d))):
        return None  # an ancestor of prefix blocks: its choice would be tied to theirs
    # the moments whose running sum holds part of the prefix go (the prefix's own constraints), before the rows
    # are made: else a row after the prefix implied by one inside it would go with it
    need = prob.model.base_bytes - budget_bytes
    need = np.where((prob.node_key > lo) & (prob.node_key < hi), -np.inf, need)
    plain, multi = budget_need_rows(prob, need, setup)
    rows = [(k, j, v) for k, j, v in plain if v > 0]
    multi = [(k, j, terms, v) for k, j, terms, v in multi if v + sum(terms["held"].values()) > 0]
    for _, _, terms, _ in multi:
        if any(lo <= i < hi for i in (*terms["held"], *(t for t in terms if t != "held"))):
            return None
    # (the subtrees before the blocks stay exact: relaxed like the blocks, their hull point rarely is a real
    # option, and the plan then costs more than the bound by more than the gap)
    hull = lower_hull(np.asarray(stack.d, dtype=np.float64), np.asarray(stack.rc, dtype=np.float64))
    mat = BudgetMatrix(prob, with_peak=False, offload=setup)
    x_col, z_col, m_col = _add_prefix(mat, prob, lo, hi, len(prefix), hull[0][-1])
    lb = np.zeros(mat.n_var)
    lb[z_col] = -np.inf
    margin = -NEED_TOL_BYTES  # as the MILP: its optimum then bounds every plan meeting the needs to the byte
    extra = [(discard_entries(mat, k, terms, prob.unit, j), (v + margin) / prob.unit, np.inf)
             for k, j, terms, v in multi]
    for k, j, v in rows:
        if j == 0:
            lb[mat.s0 + k - 1] = max(lb[mat.s0 + k - 1], (v + margin) / prob.unit)
        else:
            extra.append((discard_entries(mat, k, {"held": {}}, prob.unit, j), (v + margin) / prob.unit, np.inf))
    n = len(prefix)
    for x0, y0, s in zip(hull[0][:-1].tolist(), hull[1][:-1].tolist(), hull[2].tolist()):  # z >= n h(x / n)
        extra.append(([(z_col, 1.0), (x_col, -s * prob.unit)], n * (y0 - s * x0), np.inf))
    extra += _top_rows(stack, n, hull, prob.unit, x_col, z_col, m_col)
    left = deadline - time.perf_counter()
    if left <= 0:
        return None
    res = _solve(mat, lb, mat.constraint(extra), left, mip_rel_gap)
    bound = getattr(res, "mip_dual_bound", None)
    lower = float(bound) if bound is not None and math.isfinite(bound) else None
    if res.x is None or res.status not in (0, 1):
        return SplitResult(lower)
    return SplitResult(lower, _plan(prob, setup, model, budget_bytes, mat, res.x, prefix,
                                    float(res.x[x_col]) * prob.unit))


# HiGHS's large-neighbourhood heuristics (RENS, RINS) and feasibility jump spend most of the time on these small
# models and find nothing the search does not: Llama-3 70B FSDP2 x32 at 52.4 GiB, 1.53 s a plan with them, 0.72 s
# without (the same optimum). Options a HiGHS build lacks are left out.
_QUIET_HEURISTICS = {"mip_heuristic_run_rens": False, "mip_heuristic_run_rins": False,
                     "mip_heuristic_run_feasibility_jump": False}


def _solve(mat: BudgetMatrix, lb: np.ndarray, constraint, time_limit_s: float, mip_rel_gap: float):
    options = {"time_limit": time_limit_s, "mip_rel_gap": mip_rel_gap, "presolve": True, **HIGHS_TOLERANCES}
    with warnings.catch_warnings():  # HiGHS options scipy does not name are passed on verbatim, with a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            return quiet_milp(mat.cost, integrality=mat.integrality, bounds=Bounds(lb, mat.ub),
                              constraints=[constraint], options={**options, **_QUIET_HEURISTICS})
        except AttributeError:  # an older HiGHS without one of them
            return quiet_milp(mat.cost, integrality=mat.integrality, bounds=Bounds(lb, mat.ub),
                              constraints=[constraint], options=options)


def _top_rows(stack, n: int, hull, unit: float, x_col: int, z_col: int, m_col: int) -> list:
    """Rows with m, the prefix blocks not at the option freeing the most (D bytes at C ms, the hull's last
    vertex): ``x + m (D - D2) <= n D`` (D2: the most any other option frees) and ``z + m (C - c) >= n C`` (c: the
    least any option costs). Every multiset of block options meets both with its own m. Without them the hull
    lets the solver free a hair less than n D for a hair less than n C, where every real multiset still costs n
    C: 70B FSDP2 x64 at 40.08 GiB, a 4.5e-6 gap that no suffix length closed."""
    d, rc = np.asarray(stack.d, dtype=np.float64), np.asarray(stack.rc, dtype=np.float64)
    most, cost = float(hull[0][-1]), float(hull[1][-1])
    below = d[d < most]
    if len(below) == 0:
        return []
    step, save = most - float(below.max()), cost - float(rc.min())
    return [([(x_col, 1.0), (m_col, step / unit)], -np.inf, n * most / unit),
            ([(z_col, 1.0), (m_col, save)], n * cost, np.inf)]


def _add_prefix(mat: BudgetMatrix, prob: Problem, lo: int, hi: int, n: int,
                most_bytes: float) -> tuple[int, int, int]:
    """Fix the prefix's columns (candidates lo .. hi - 1) at 0, and add x (what its n blocks free, in units, at
    most n times ``most_bytes``; counted in the running sum from its last candidate on), z (their cost, ms) and
    m (how many of them are not at the option freeing the most, :func:`_top_rows`). Returns their columns."""
    for i in range(lo, hi):
        mat.ub[mat.y0 + i] = 0.0
        mat.ub[mat.k0 + mat.k_off[i]: mat.k0 + mat.k_off[i + 1]] = 0.0
    for (i, _), col in mat.off.f_col.items():
        if lo <= i < hi:
            mat.ub[col] = 0.0
    x_col, z_col, m_col = mat.n_var, mat.n_var + 1, mat.n_var + 2
    mat.n_var += 3
    mat.cost = np.concatenate([mat.cost, [0.0, 1.0, 0.0]])
    mat.ub = np.concatenate([mat.ub, [n * float(most_bytes) / prob.unit, np.inf, float(n)]])
    mat.integrality = np.concatenate([mat.integrality, [0.0, 0.0, 1.0]])
    # S_{hi-1} - S_{hi-2} - D_{hi-1} = 0 becomes ... - x = 0
    mat.rows.append(mat.running_rows[hi - 1]), mat.cols.append(x_col), mat.vals.append(-1.0)
    return x_col, z_col, m_col


def _plan(prob: Problem, setup: OffloadSetup, model: OffloadStack, budget_bytes: float, mat: BudgetMatrix,
          x: np.ndarray, prefix: list[int], freed_bytes: float) -> Solution | None:
    """The full plan: the rest as the solver says, the prefix blocks at the cheapest multiset of block options
    freeing the solver's x (dealt in the exchange order), or else all at the option freeing the most (it frees at
    least as much at every moment after the prefix); the cheaper of those meeting the budget, or None."""
    stack, fr = model.stack, model.frontiers
    n = len(prefix)
    multisets = [{int(np.lexsort((stack.rc, -np.asarray(stack.d)))[0]): n}]  # all at the most freed, cheapest
    try:
        sol, _ = min_cost_counts(stack.d, stack.rc, n, np.array([freed_bytes - NEED_TOL_BYTES]), np.zeros(1), math.inf)
    except CountWorkLimit:
        sol = None
    if sol is not None and sol.counts != multisets[0]:
        multisets.insert(0, sol.counts)
    decided, offloads = decode_offload(prob, mat, mat.off, x)
    needs, held = key_needs(prob, budget_bytes), held_needs(prob, budget_bytes)
    rep = stack.blocks[0]
    plans = []
    for counts in multisets:
        order = exchange_order(fr, stack, [p for p, c in counts.items() for _ in range(c)], needs, held)
        head = evaluate(prob, model, fr, {i + root - rep: j for root, p in zip(prefix, order)
                                          for i, j in stack.choices[p]})
        lists = {**offloads.modules, **(head.offload.modules if head.offload is not None else {})}
        plan = Solution.planned(prob, {**decided, **head.decisions}, "feasible", "", 0.0,
                                offload=offload_plan(prob, setup.windows, {f: v for f, v in lists.items() if any(v)}))
        if fits_budget(prob, plan, budget_bytes):
            plans.append(plan)
    return min(plans, key=lambda p: p.overhead_ms, default=None)

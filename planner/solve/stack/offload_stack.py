"""Offload on deep stacks: the count-space relaxation on modules whose offload counts as an early discard.

With ``offload='on'`` a checkpointed module's free op groups are saved,
recomputed or offloaded; an offload of window j is off the device only from
the end of window j+1 on (:mod:`planner.solve.offload`), and the window pays
``stall(O_j)`` for all of it. Relax both, for every module that may offload:

* its offloaded bytes count as discarded at its own end, like its recompute's
  (earlier than window j+1's end: more memory freed at every moment);
* it pays its own offload's stall, ``stall_j(o_c)``, as if it had the window's
  link to itself (the stall is convex and 0 at 0, so the modules' stalls add
  up to at most the window's: ``sum stall(o_c) <= stall(sum o_c)``).

Each module is then a list of (bytes freed, recompute + stall) points
(:func:`planner.solve.stack.offload_items.offload_points`): today's problem,
which the stack relaxation (:func:`planner.solve.stack.relaxation.solve_stack`)
bounds exactly. Its bound is a lower bound on every offloading plan. Its plan,
with the offloads back in their windows, is checked against the full model
(the memory model with the window credits, the windows' stalls): when it fits
the budget and costs what the bound says, it is optimal. That is the common
case: an optimum rarely offloads past a window's copy capacity, and the peak
sits where every offload but the last windows' is credited anyway. Otherwise the
caller falls back to the MILP, with the bound.

When that plan meets the budget but costs more than the bound, modules sharing
a window (a layer's attention and MLP) may be why: their own stalls add up to
less than the window's. Then it runs again with each window's stall on its
total (``offload_stack(joint=True)``: the stack's block items and the subtrees
before the blocks from :mod:`planner.solve.stack.offload_joint`, the exact
tail charging each window on its total), a tighter bound whose plan often
meets it (Llama-3 8B at its tighter budgets). What stays relaxed is only when
an offload is credited.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from planner.memory_model import NEED_TOL_BYTES
from planner.solve.giants import for_budget
from planner.solve import dp
from planner.solve.offload import OffloadOptions, OffloadSetup, OffloadWindows, decisions, offload_plan
from planner.solve.problem import Frontiers, Problem, held_needs, key_needs
from planner.solve.solution import Decision, Solution, discards
from planner.solve.stack.multiset import CountWorkLimit
from planner.solve.stack.offload_items import OffloadPoints, Stall, offload_points
from planner.solve.stack.offload_joint import joint_block_options
from planner.solve.stack.relaxation import Stack, find_stack, solve_stack
from planner.solve.stack.tail import TailStall

__all__ = ["OffloadStack", "StackOffloadResult", "better", "evaluate", "fits_budget", "judged", "offload_stack",
           "solve_offload_stack", "stack_first", "stack_items", "with_milp"]

_WORK = 2e7  # as the DP's stack pass (planner.solve.dp): about a second at most


@dataclass
class OffloadStack:
    """Budget-independent: the relaxed points of every module, and the stack they form (or None)."""

    windows: OffloadWindows
    options: dict[int, OffloadOptions]
    points: dict[int, OffloadPoints]  # candidate -> its offload points (those freeing bytes); none where no moment
    # credits its window's offload
    frontiers: Frontiers  # every candidate's points; an offloading one's index its row in ``points``
    stack: Stack | None
    joint: bool = False  # each window's stall on its total (else each module's own: faster, looser)


@dataclass(frozen=True)
class StackOffloadResult:
    """The relaxation's bound, and the best plan found that meets the budget on the full model (or None)."""

    lower: float  # no plan costs less (recompute + stall, ms)
    plan: Solution | None = None  # meets the budget on the full model; "optimal" when it meets the bound too

    @property
    def cost(self) -> float | None:
        return None if self.plan is None else self.plan.overhead_ms


def offload_stack(prob: Problem, windows: OffloadWindows, options: dict[int, OffloadOptions],
                  joint: bool = False) -> OffloadStack:
    """The relaxed points of every candidate (an offloading one's from its op classes and its window's stall).

    ``joint``: price each window's stall on its total where several modules of it may offload (the stack's
    block items, the subtrees before the blocks, the exact tail): a tighter bound, from more points (a module
    sharing its window keeps every option a joint optimum may need). Else each module pays its own stall.
    """
    base = prob.frontiers()
    d, rc, point, fid, max_d = list(base.d), list(base.rc), list(base.point), list(base.fid), list(base.max_d)
    points: dict[int, OffloadPoints] = {}
    memo: dict[tuple, tuple] = {}
    ids: dict[tuple, int] = {}
    useless = _useless_windows(prob, windows)
    offloading = [i for i in options if int(windows.candidate_window[i]) not in useless]
    for i in offloading:
        opt, cand = options[i], prob.candidates[i]
        fw, bw = windows.hidden_ms(int(windows.candidate_window[i]))
        shared = _shares_window(prob, base.starts, windows, options, offloading, i) if joint else 0.0
        key = (base.fid[i], tuple(opt.counts.tolist()), fw, bw, shared)
        if key not in memo:
            cl = cand.classes
            stall = _window_stall(windows, int(windows.candidate_window[i]))
            # its early discard (y + what it recomputes) stays >= 0, as in every engine; where another module
            # may offload beside it, every option a joint optimum of the window may need is kept
            pts = offload_points(cl.class_bytes, cl.class_ms, cl.multiplicity, opt.counts, stall,
                                 least_early=max(0, -cand.y_bytes), shared=shared)
            freed = cand.y_bytes + pts.v
            keep = freed > 0  # a point that frees nothing is never part of a plan
            pts = OffloadPoints(*(a[keep] for a in (pts.v, pts.o, pts.ms, pts.cost, pts.k, pts.f)))
            cost = cand.cost(cl.always_recomputed_ms + pts.ms) + (pts.cost - pts.ms)
            memo[key] = (pts, freed[keep].astype(np.int64), cost)
        points[i], d[i], rc[i] = memo[key]
        point[i] = np.arange(len(d[i]))
        fid[i] = -1 - ids.setdefault(key, len(ids))  # apart from every recompute-only frontier
        max_d[i] = int(d[i][-1]) if len(d[i]) else 0
    fr = Frontiers(d, rc, point, base.starts, base.hulls, fid, max_d, base.giants, {})
    stack = find_stack(fr)
    if stack is not None and any(fr.starts[stack.blocks[0]] <= i <= stack.blocks[-1] for i in fr.giants):
        stack = None  # a block's points would change with the budget
    if joint and stack is not None:  # a block is one window: its options pay the window's stall once, on their total
        joint = joint_block_options(fr.d, fr.rc, fr.starts, points,
                                    _window_stall(windows, int(windows.candidate_window[stack.blocks[0]])),
                                    stack.blocks[0])
        if joint is not None:
            stack.d, stack.rc, stack.choices = joint
    return OffloadStack(windows, options, points, fr, stack, joint)


def _shares_window(prob: Problem, starts: list[int], windows: OffloadWindows, options: dict[int, OffloadOptions],
                   offloading: list[int], i: int) -> float:
    """What the modules of i's window that may be checkpointed beside i (neither inside the other) may offload."""
    j = windows.candidate_window[i]
    return float(sum(int(prob.candidates[k].classes.class_bytes @ options[k].counts) for k in offloading
                     if k != i and windows.candidate_window[k] == j and not starts[i] <= k <= i
                     and not starts[k] <= i <= k))


def _window_stall(windows: OffloadWindows, j: int) -> Stall:
    fw, bw = windows.hidden_ms(j)
    return Stall(1.0 / windows.link.d2h_bytes_per_ms, fw, 1.0 / windows.link.h2d_bytes_per_ms, bw)


def _useless_windows(prob: Problem, windows: OffloadWindows) -> set[int]:
    """Windows whose offload frees memory at no moment that matters: every moment crediting it (key at least its
    credit key) comes after every candidate, and holds no more than some moment before its credit key. Such a
    moment's need is met whenever that earlier one's is (nothing discarded or offloaded is ever taken back
    between them), so the window's offload only adds stall: leaving it out loses no plan (the last block's, in a
    decoder: credited at the forward's end only, below the loss's backward)."""
    keys, base = prob.model.keys, prob.model.base_bytes
    last = max((c.post_pos for c in prob.candidates), default=-1)
    out = set()
    for j, key in enumerate(windows.credit_key.tolist()):
        if key < 0 or key <= last:
            continue
        late = keys >= key
        if not late.any() or (~late).any() and float(base[~late].max()) >= float(base[late].max()):
            out.add(j)
    return out


def solve_offload_stack(prob: Problem, model: OffloadStack, budget_bytes: float, *, mip_rel_gap: float = 1e-6,
                        deadline: float = math.inf, retries: int = 6) -> StackOffloadResult | None:
    """The relaxation's bound at this budget, and the best plan found that meets the budget on the full model;
    None when there is no stack, or the relaxation gave up (work limit, deadline).

    The relaxation's own plan may miss the budget on the full model (an offload counts later there). Then it is
    solved again under the budget lowered by what the plan missed it by, at most ``retries`` times: a plan that
    fits, whose cost the bound may not reach (its gap then says how far it may be from the optimum).
    """
    if model.stack is None:
        return None
    held = held_needs(prob, budget_bytes)
    first = _relaxed(prob, model, budget_bytes, held, mip_rel_gap, deadline)
    if first is None:
        return None
    lower, fr, choices = first
    if choices is None:
        return StackOffloadResult(lower)
    plan = evaluate(prob, model, fr, choices)
    target = budget_bytes
    for _ in range(retries):
        if fits_budget(prob, plan, budget_bytes):
            return StackOffloadResult(lower, judged(plan, lower, mip_rel_gap))
        target -= plan.peak_bytes - budget_bytes + 1.0
        again = _relaxed(prob, model, target, {i: v - (budget_bytes - target) for i, v in held.items()},
                         mip_rel_gap, deadline)
        if again is None or again[2] is None:
            break
        plan = evaluate(prob, model, again[1], again[2])
    fits = fits_budget(prob, plan, budget_bytes)
    return StackOffloadResult(lower, judged(plan, lower, mip_rel_gap) if fits else None)


def fits_budget(prob: Problem, plan: Solution, budget_bytes: float) -> bool:
    """Whether the plan meets the budget as every engine counts it: by its peak, and with an input several
    checkpointed modules hold counted once per holder (the MILP's check, planner.solve.milp)."""
    rows = prob.model.peak_bytes(discards(prob, plan.decisions), shared_once=False,
                                 offloaded=None if plan.offload is None else plan.offload.credits)
    return max(plan.peak_bytes, rows) <= budget_bytes + NEED_TOL_BYTES


_RELAXED = ("count-space relaxation of a stack of identical blocks, offload counted at each module's end; its plan "
            "meets the bound on the full model")


def judged(plan: Solution, lower: float, mip_rel_gap: float, how: str = _RELAXED) -> Solution:
    """The plan, "optimal" when its cost is within ``mip_rel_gap`` of the bound, else "feasible" with its gap."""
    cost = plan.overhead_ms
    gap = min(1.0, max(cost - lower, 0.0) / cost) if cost > 0 else 0.0
    if gap <= mip_rel_gap:
        return replace(plan, lower_bound=lower).with_status("optimal", f"optimal plan found ({how})", gap)
    return replace(plan, lower_bound=lower).with_status("feasible", "best plan of the stack relaxation, with its "
                                                                 "proven gap", gap)


def stack_items(prob: Problem, setup: OffloadSetup, joint: bool = False) -> OffloadStack:
    """The problem's :func:`offload_stack` with ``setup``'s windows and options (each window's stall on its total
    with ``joint``), built once per problem and link."""
    link = setup.windows.link
    name = "offload stack joint" if joint else "offload stack"
    return prob.derived(f"{name} {link.d2h_gbps!r} {link.h2d_gbps!r}",
                        lambda p: offload_stack(p, setup.windows, setup.options, joint=joint))


def stack_first(prob: Problem, setup: OffloadSetup, budget_bytes: float, *, mip_rel_gap: float,
                deadline: float) -> StackOffloadResult | None:
    """The stack relaxation's bound and plan, for stacks of at least ``dp.STACK_FIRST_BLOCKS`` identical blocks
    (as without offload: shorter ones are the MILP's); None when it does not apply or gave up. Each module's own
    stall first; each window's on its total when that plan fits but is not proven (the better of the two)."""
    model = stack_items(prob, setup)
    if model.stack is None or len(model.stack.blocks) < dp.STACK_FIRST_BLOCKS:  # read per call: tests lower it
        return None
    first = solve_offload_stack(prob, model, budget_bytes, mip_rel_gap=mip_rel_gap, deadline=deadline)
    if first is None or first.plan is None or first.plan.status == "optimal":
        return first
    # A plan that meets the budget but not the bound: its modules may share their window's copy link (the
    # modules' own stalls add up to less than the window's). Again with each window's stall on its total: slower,
    # tighter. (A plan missing the budget misses it by where an offload is credited, which that does not change:
    # planner.solve.stack.offload_split is for that.)
    joint = stack_items(prob, setup, joint=True)
    if joint.stack is None:
        return first
    again = solve_offload_stack(prob, joint, budget_bytes, mip_rel_gap=mip_rel_gap, deadline=deadline)
    return better(first, again, mip_rel_gap)


def better(a: StackOffloadResult | None, b: StackOffloadResult | None, mip_rel_gap: float,
           how: str = _RELAXED) -> StackOffloadResult | None:
    """Two relaxations' results as one: the larger bound (both are bounds), the cheaper plan judged against it
    (``how``: how the bound came, for the plan's message)."""
    if a is None or b is None:
        return b if a is None else a
    lower = max(a.lower, b.lower)
    plans = [p for p in (a.plan, b.plan) if p is not None]
    if not plans:
        return StackOffloadResult(lower)
    return StackOffloadResult(lower, judged(min(plans, key=lambda p: p.overhead_ms), lower, mip_rel_gap, how))


def with_milp(stacked: StackOffloadResult, sol: Solution, mip_rel_gap: float) -> Solution:
    """The MILP's answer after the stack's: the cheaper plan, judged against the better of the two bounds."""
    plans = [p for p in (stacked.plan, sol if sol.decisions is not None else None) if p is not None]
    if not plans:
        return sol
    lower = max(stacked.lower, sol.lower_bound if sol.lower_bound is not None else -math.inf)
    best = min(plans, key=lambda p: p.overhead_ms)
    cost = best.overhead_ms
    gap = min(1.0, max(cost - lower, 0.0) / cost) if cost > 0 else 0.0
    if gap <= mip_rel_gap:
        return replace(best, lower_bound=lower).with_status("optimal", f"{best.message}; optimal within the "
                                                                        "better of the stack's and the MILP's bounds",
                                                            gap)
    return replace(best, lower_bound=lower).with_status("feasible", f"{best.message}; gap against the better of the "
                                                                     "stack's and the MILP's bounds", gap)


def _relaxed(prob: Problem, model: OffloadStack, budget_bytes: float, held: dict[int, float], mip_rel_gap: float,
             deadline: float) -> tuple[float, Frontiers, dict[int, int] | None] | None:
    """(bound, the budget's points, the relaxation's plan or None) at ``budget_bytes``; None when it gave up."""
    keyneed = key_needs(prob, budget_bytes)
    fr = for_budget(prob, model.frontiers, keyneed)
    if fr is None:
        return None
    tail = _tail_stall(model, fr) if model.joint else None
    priced = {} if tail is None else dict(tail_stall=tail, plan_cost=lambda choices: _relaxed_cost(tail, choices),
                                          root_options=lambda r: _root_options(model, fr, tail, r))
    try:
        res = solve_stack(fr, model.stack, keyneed, math.inf, eps=0.0, work_limit=_WORK, deadline=deadline,
                          rel_gap=0.4 * mip_rel_gap, held_need=held, **priced)
    except CountWorkLimit:
        return None
    if res is None:
        return None
    return res.lower, fr, res.choices


def evaluate(prob: Problem, model: OffloadStack, fr: Frontiers, choices: dict[int, int]) -> Solution:
    """The plan of ``choices`` (candidate -> index into ``fr``'s points) on the full model (``feasible``): its
    offloads credited at their window's key, each window's stall on its total."""
    decided: dict[str, Decision] = {}
    offloads: dict[str, list[int]] = {}
    for i, j in choices.items():
        cand = prob.candidates[i]
        m = prob.stats.module(cand.fqn)
        if i in model.points:
            pts, row = model.points[i], int(fr.point[i][j])
            save, off = decisions(cand.classes, model.options[i], pts.k[row], pts.f[row])
            early = int(fr.d[i][j]) - int(pts.o[row])  # the offloaded groups count as saved here
            decided[cand.fqn] = (save, cand.act_saved_bytes - early,
                                 m.op_ms - cand.classes.always_recomputed_ms - float(pts.ms[row]))
            if pts.o[row]:
                offloads[cand.fqn] = off
        else:
            f = fr.capped.get(i) or prob.frontier(cand.fqn)
            k = int(fr.point[i][j])
            decided[cand.fqn] = (f.save_list(k), int(f.saved_bytes[k]), float(f.saved_ms[k]))
    return Solution.planned(prob, decided, "feasible", "", 0.0,
                            offload=offload_plan(prob, model.windows, offloads))


def _tail_stall(model: OffloadStack, fr: Frontiers) -> TailStall:
    """The budget's points as the exact tail prices them: per point its offload and its cost without stall,
    per window its stall (:class:`planner.solve.stack.tail.TailStall`)."""
    windows = model.windows
    stalls = [_window_stall(windows, j) for j in range(len(windows))]
    window = np.asarray(windows.candidate_window, dtype=np.int64)
    first = np.full(len(windows), len(fr.d), np.int64)
    np.minimum.at(first, window, np.arange(len(window)))
    offload, plain = [], []
    for i in range(len(fr.d)):
        o = (model.points[i].o[fr.point[i]] if i in model.points else np.zeros(len(fr.d[i]))).astype(np.int64)
        offload.append(o)
        plain.append(np.asarray(fr.rc[i], dtype=np.float64) - stalls[int(window[i])](o))
    return TailStall(window, first, offload, plain, stalls)


def _relaxed_cost(tail: TailStall, choices: dict[int, int]) -> float:
    """A plan's cost with each window's stall on its total (its offload still credited at each module's end)."""
    per_window: dict[int, float] = {}
    plain = 0.0
    for i, j in choices.items():
        plain += float(tail.plain[i][j])
        w = int(tail.window[i])
        per_window[w] = per_window.get(w, 0.0) + float(tail.offload[i][j])
    return plain + math.fsum(float(tail.stall[w](o)) for w, o in per_window.items())


def _root_options(model: OffloadStack, fr: Frontiers, tail: TailStall, r: int):
    """The joint options of a subtree before the blocks, its window's stall on their total, when the whole
    subtree is in one window; None to keep each module's own stall (a lower bound)."""
    inside = tail.window[fr.starts[r]:r + 1]
    if not (inside == inside[-1]).all():
        return None
    return joint_block_options(fr.d, fr.rc, fr.starts, model.points, tail.stall[int(inside[-1])], r)

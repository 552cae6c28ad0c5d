"""The module-level MILP on ``scipy.optimize.milp`` (HiGHS).

Variables, per candidate module c (non-leaf, has ops, allowed by the request):

* ``y_c`` in {0, 1}: c is checkpointed;
* ``k_cq`` in {0..mult_cq}: how many interchangeable op groups of class q
  c recomputes (``k_cq <= mult_cq * y_c``);
* ``S_i`` >= 0, continuous: discarded memory (in units of ``Problem.unit`` bytes) of the first i candidates in
  forward post-order (``S_i = S_{i-1} + D_{c_i}``).

With ``D_c = (IA_c - ACM_c + R_c) y_c + sum_q w_q k_cq`` (memory discarded: what
autograd would save minus what the policy keeps) and ``RC_c = V_c y_c +
sum_q v_q k_cq`` (ms recomputed), the problem is

    minimise   sum_c RC_c
    subject to S_{key(n)} >= base_n - budget    for every module n
               D_c >= 0
               sum of y over any root-to-leaf chain <= 1   (no nesting)

where ``key(n)`` counts candidates finishing before n in forward post-order.
This is PyTorch's ``sac_milp`` memory model with the op-level knapsack inside
the MILP instead of a fitted curve, so every solution is a real op decision.
The running sum S keeps the matrix sparse: each memory row is one bound.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from planner.hull import lower_hull
from planner.knapsack import GroupClasses, best_saved_within, group_classes
from planner.memory_model import MemoryModel, memory_model
from planner.op_policy import Frontier, FrontierTooLarge, module_frontier, op_groups
from planner.stats import Stats

__all__ = ["Candidate", "Problem", "Solution", "prepare", "solve_budget", "solve_min_peak"]

# Frontiers up to this many points are listed; larger modules use the exact
# per-module knapsack MILP to land on a non-dominated point.
_FRONTIER_LIMIT = 50_000
# HiGHS's defaults (1e-7) let a solution miss a need by 1e-7 of the memory unit:
# kilobytes on a large model. Tighter tolerances make the retries below rare.
_TOLERANCES = {"primal_feasibility_tolerance": 1e-9, "mip_feasibility_tolerance": 1e-9}
_RELAX = 1e-6  # needs are first relaxed by this fraction of the memory unit (1000x the tolerance)
# Modules with more free op groups than this (one spanning a whole model) are
# not even tried: listing such a frontier up to the limit costs seconds, and
# it would overflow anyway (a 48-layer Llama's decoder: 2185 groups, 1.5 s).
_FRONTIER_ITEMS = 1024


@dataclass(frozen=True)
class Candidate:
    fqn: str
    post_pos: int
    act_saved_bytes: int  # IA
    classes: GroupClasses
    ops_key: tuple = ()

    @property
    def op_bytes(self) -> int:  # ACM
        return int(self.classes.groups.group_bytes.sum())

    @property
    def op_ms(self) -> float:
        return float(self.classes.groups.group_ms.sum())

    @property
    def max_discard_bytes(self) -> int:
        """The most c can discard: every free op group recomputed."""
        c = self.classes
        return self.y_bytes + (int(c.class_bytes @ c.multiplicity) if len(c.members) else 0)

    @property
    def y_bytes(self) -> int:
        """Discarded bytes when checkpointed and every free group saved."""
        c = self.classes
        return self.act_saved_bytes - (self.op_bytes - c.always_recomputed_bytes)


@dataclass
class Problem:
    """A stats document prepared for planning; reused across budgets."""

    stats: Stats
    model: MemoryModel
    candidates: list[Candidate]
    node_key: np.ndarray  # per module (pre-order): candidates finishing before it
    chains: list[list[int]]  # candidate index chains that may hold at most one checkpoint
    unit: float  # bytes per MILP memory unit: a power of two near the peak, so values are O(1)
    _frontiers: dict[tuple, Frontier | None] = field(default_factory=dict)
    _hulls: dict[tuple, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    _dp: object | None = None  # the DP's budget-independent preparation
    _min_peak: Solution | None = None

    def hull(self, cand: Candidate) -> tuple[tuple[float, float], ...]:
        """Facets of ``cand``'s frontier hull in MILP units (cached per op list)."""
        key = (cand.ops_key, cand.act_saved_bytes)
        if key not in self._hulls:
            m = self.stats.module(cand.fqn)
            self._hulls[key] = _hull(_frontier(self._frontiers, m), cand.act_saved_bytes, self.unit)
        return self._hulls[key]


@dataclass(frozen=True)
class Solution:
    """A solved MILP mapped onto exact op decisions."""

    status: str  # optimal | feasible | infeasible | time_limit | error
    message: str
    peak_bytes: float | None = None
    recompute_ms: float | None = None
    mip_gap: float | None = None
    solve_seconds: float = 0.0
    decisions: dict[str, tuple[list[int], int, float]] | None = None  # fqn -> (save, saved_bytes, saved_ms)
    lower_bound: float | None = None  # the solver's proven bound on recompute, when it gives one


def prepare(
    stats: Stats,
    *,
    world_size: int = 1,
    ac_units: Sequence[str] | None = None,
    fsdp_units: Sequence[str] | None = None,
    include_optimizer_state: bool = False,
    reserve_bytes: float = 0.0,
) -> Problem:
    """Build everything that does not depend on the budget."""
    model = memory_model(stats, world_size=world_size, include_optimizer_state=include_optimizer_state,
                         reserve_bytes=reserve_bytes)
    allowed = _allowed(stats, ac_units, fsdp_units)
    unit = float(2 ** max(0, math.floor(math.log2(max(float(model.base_bytes.max()), 1.0)))))
    last_post = len(stats.fw_post_order) - 1
    post = {f: k for k, f in enumerate(stats.fw_post_order)}
    cands: list[Candidate] = []
    class_cache: dict[tuple, GroupClasses] = {}
    frontiers: dict[tuple, Frontier | None] = {}
    for fqn in stats.fw_post_order:
        m = stats.module(fqn)
        # A module finishing last frees nothing before any module's peak.
        if fqn not in allowed or post[fqn] == last_post:
            continue
        key = _ops_key(m)
        if key not in class_cache:
            class_cache[key] = group_classes(op_groups(m.ops, m.force_store_random))
        classes = class_cache[key]
        cand = Candidate(fqn, post[fqn], m.act_saved_bytes, classes, key)
        if cand.max_discard_bytes > 0:
            cands.append(cand)
    cand_post = np.array([c.post_pos for c in cands], dtype=np.int64)
    node_key = np.searchsorted(cand_post, model.post_pos, side="left")
    return Problem(stats, model, cands, node_key, _chains(stats, [c.fqn for c in cands]), unit, frontiers)


def _frontier(cache: dict[tuple, Frontier | None], m) -> Frontier | None:
    """m's frontier, or None when it is too long to list (then planned from capped parts, or by the MILP)."""
    key = _ops_key(m)
    if key not in cache:
        try:
            cache[key] = module_frontier(m.ops, m.force_store_random, max_points=_FRONTIER_LIMIT,
                                         max_items=_FRONTIER_ITEMS)
        except FrontierTooLarge:
            cache[key] = None
    return cache[key]


def _hull(frontier: Frontier | None, act_saved_bytes: int, unit: float) -> tuple[tuple[float, float], ...]:
    """Facets of the lower convex hull of the frontier's (discarded units, recompute ms) points.

    Every op decision lies on or above this hull, so the facets are valid cuts;
    they give the LP relaxation the exact multiple-choice bound.
    """
    if frontier is None or len(frontier) < 2:
        return ()
    d = (act_saved_bytes - frontier.saved_bytes) / unit
    hx, hy, slopes = lower_hull(d, frontier.recompute_ms)
    return tuple((float(k), float(y - k * x)) for k, x, y in zip(slopes, hx[:-1], hy[:-1]))


def _ops_key(m) -> tuple:
    """Modules with equal op lists (repeated layers) share derived work."""
    return (m.force_store_random, tuple(
        (op.name, op.output_bytes, op.runtime_ms, op.view_like, op.random, op.inplace_parent) for op in m.ops
    ))


def _allowed(stats: Stats, ac_units: Sequence[str] | None, fsdp_units: Sequence[str] | None) -> set[str]:
    names = set(stats.fw_pre_order)
    for field_name, units in (("ac_units", ac_units), ("fsdp_units", fsdp_units)):
        if isinstance(units, (str, bytes)):
            raise ValueError(f"{field_name} must be a list of module fqns, got the string {units!r} "
                             f"(write [{units!r}])")
        for k, f in enumerate(units or ()):
            if f not in names:
                raise ValueError(f"{field_name}[{k}] {f!r} is not a module of the stats")
    checkpointable = {m.fqn for m in stats.modules if not m.is_leaf and m.ops}
    if ac_units is not None:
        for k, f in enumerate(ac_units):
            m = stats.module(f)
            if m.parent is None:
                raise ValueError(f"ac_units[{k}] {f!r} is the root module: it finishes last and frees nothing "
                                 f"before any peak, so it is never checkpointed")
            if m.is_leaf:
                raise ValueError(f"ac_units[{k}] {f!r} is a leaf module; leaf modules are never checkpointed")
            if not m.ops:
                raise ValueError(f"ac_units[{k}] {f!r} has no op stats, so it cannot be checkpointed")
        checkpointable &= set(ac_units)
    # A checkpointed module may not contain an FSDP unit (the unit itself may be checkpointed).
    for unit in fsdp_units or ():
        checkpointable = {f for f in checkpointable if not unit.startswith(f + ".")}
    return checkpointable


def _chains(stats: Stats, cand_fqns: list[str]) -> list[list[int]]:
    """For each deepest candidate, the candidates on its path to the root (if more than one)."""
    idx = {f: i for i, f in enumerate(cand_fqns)}
    has_cand_descendant = set()
    chain_of: dict[str, list[int]] = {}
    for f in cand_fqns:
        chain, p = [idx[f]], stats.module(f).parent
        while p is not None:
            if p in idx:
                chain.append(idx[p])
                has_cand_descendant.add(p)
            p = stats.module(p).parent
        chain_of[f] = chain
    return [c for f, c in chain_of.items() if f not in has_cand_descendant and len(c) > 1]


class _Matrix:
    """The budget-independent part of the MILP: columns y, k, S (and optionally peak P)."""

    def __init__(self, prob: Problem, with_peak: bool):
        cands = prob.candidates
        n_c = len(cands)
        k_off = np.cumsum([0] + [len(c.classes.members) for c in cands])
        n_k = int(k_off[-1])
        self.n_c, self.n_k = n_c, n_k
        self.y0, self.k0, self.s0 = 0, n_c, n_c + n_k
        self.p = self.s0 + n_c if with_peak else None
        n_var = self.s0 + n_c + (1 if with_peak else 0)
        rows, cols, vals, lo, hi = [], [], [], [], []

        def row(entries, lb, ub):
            r = len(lo)
            for c, v in entries:
                rows.append(r), cols.append(c), vals.append(v)
            lo.append(lb), hi.append(ub)

        cost = np.zeros(n_var)
        ub = np.full(n_var, np.inf)
        integrality = np.zeros(n_var)
        for i, cand in enumerate(cands):
            cl = cand.classes
            y = self.y0 + i
            integrality[y], ub[y] = 1, 1
            cost[y] = cl.always_recomputed_ms
            d_entries = [(y, cand.y_bytes / prob.unit)]
            for q in range(len(cl.members)):
                k = self.k0 + k_off[i] + q
                integrality[k], ub[k] = 1, len(cl.members[q])
                cost[k] = cl.class_ms[q]
                row([(k, 1.0), (y, -float(len(cl.members[q])))], -np.inf, 0.0)
                d_entries.append((k, cl.class_bytes[q] / prob.unit))
            # S_i - S_{i-1} - D_c = 0 and D_c >= 0
            s_prev = [] if i == 0 else [(self.s0 + i - 1, 1.0)]
            row([(self.s0 + i, 1.0)] + [(c, -1.0 * v) for c, v in s_prev] + [(c, -v) for c, v in d_entries], 0.0, 0.0)
            row(d_entries, 0.0, np.inf)
            rc_entries = [(y, cl.always_recomputed_ms)] + [
                (self.k0 + k_off[i] + q, cl.class_ms[q]) for q in range(len(cl.members))]
            for slope, intercept in prob.hull(cand):
                # RC - slope * D - intercept * y >= 0, loosened by a hair for float safety
                coef: dict[int, float] = {}
                for c, v in rc_entries:
                    coef[c] = coef.get(c, 0.0) + v
                for c, v in d_entries:
                    coef[c] = coef.get(c, 0.0) - slope * v
                coef[y] = coef.get(y, 0.0) - intercept
                row(list(coef.items()), -1e-9 * (1.0 + abs(intercept)), np.inf)
        for chain in prob.chains:
            row([(self.y0 + i, 1.0) for i in chain], -np.inf, 1.0)
        self.cost, self.ub, self.integrality = cost, ub, integrality
        self.rows, self.cols, self.vals, self.lo, self.hi = rows, cols, vals, lo, hi
        self.n_var = n_var
        self.k_off = k_off

    def constraint(self, extra_rows=()):
        rows, cols, vals = list(self.rows), list(self.cols), list(self.vals)
        lo, hi = list(self.lo), list(self.hi)
        for entries, lb, ub in extra_rows:
            r = len(lo)
            for c, v in entries:
                rows.append(r), cols.append(c), vals.append(v)
            lo.append(lb), hi.append(ub)
        a = coo_array((vals, (rows, cols)), shape=(len(lo), self.n_var)).tocsr()
        return LinearConstraint(a, np.array(lo), np.array(hi))


def _reduced_rows(keys: np.ndarray, values: np.ndarray) -> list[tuple[int, float]]:
    """Per prefix key the largest value, keeping only keys whose value beats every smaller key's."""
    best: dict[int, float] = {}
    for k, v in zip(keys.tolist(), values.tolist()):
        best[k] = max(best.get(k, -np.inf), v)
    out, running = [], -np.inf
    for k in sorted(best):
        if best[k] > running:
            out.append((k, best[k]))
            running = best[k]
    return out


def _reduced_keyneeds(prob: Problem, budget_bytes: float) -> np.ndarray:
    """Per prefix key (candidates finished), the largest need over modules at that key; -inf if none."""
    out = np.full(len(prob.candidates) + 1, -np.inf)
    np.maximum.at(out, prob.node_key, prob.model.base_bytes - budget_bytes)
    return out


def solve_budget(prob: Problem, budget_bytes: float, *, time_limit_s: float, mip_rel_gap: float) -> Solution:
    """Least recompute with peak <= budget_bytes."""
    need = prob.model.base_bytes - budget_bytes
    rows = [(k, v) for k, v in _reduced_rows(prob.node_key, need) if v > 0]
    if not rows:
        return Solution("optimal", "no checkpointing needed", float(prob.model.peak_bytes()), 0.0, 0.0, 0.0, {})
    if rows[0][0] == 0:
        return Solution("infeasible", "modules before any checkpointable module already exceed the budget")
    mat = _Matrix(prob, with_peak=False)
    # First a relaxation: every need lowered by far more than HiGHS's tolerance,
    # so no plan that meets the budget is cut off. Its optimum bounds every
    # plan; if it meets the budget it is optimal. If it misses by a hair, the
    # needs are raised until a plan meets the budget, and the gap is honest.
    margin, bound = -_RELAX * prob.unit, None
    deadline = time.perf_counter() + time_limit_s  # the retries share the time limit
    for attempt in range(6):
        left = deadline - time.perf_counter()
        if attempt > 0 and left <= 0:
            return Solution("time_limit", "time limit reached before a plan met the budget to the byte; "
                                          "raise time_limit_s or use solver='dp' (exact)")
        lb = np.zeros(mat.n_var)
        for k, v in rows:
            lb[mat.s0 + k - 1] = max(lb[mat.s0 + k - 1], (v + margin) / prob.unit)
        sol = _run(prob, mat, mat.cost, lb, mat.constraint(), max(left, 0.01), mip_rel_gap)
        if attempt == 0:
            bound = sol.lower_bound if sol.status in ("optimal", "feasible") else None
        if sol.decisions is None:
            if attempt == 0:
                return sol  # infeasible even relaxed, or stopped before any plan
            return Solution("error", "no plan meets the budget to the byte within the MILP's tolerances; "
                                     "use solver='dp' (exact)")
        if sol.peak_bytes <= budget_bytes:
            return sol if attempt == 0 else _against(sol, bound, mip_rel_gap)
        margin = max(margin, 0.0) + 2 * (sol.peak_bytes - budget_bytes) + 1
    return Solution("error", "no plan meets the budget to the byte within the MILP's tolerances; use solver='dp' (exact)")


def _against(sol: Solution, bound: float | None, mip_rel_gap: float) -> Solution:
    """A plan found only after tightening the needs: optimal only if it is within the gap of the first bound."""
    if bound is None or sol.recompute_ms is None:
        return Solution("feasible", "plan meets the budget after tightening for solver tolerances; gap unknown",
                        sol.peak_bytes, sol.recompute_ms, 1.0, sol.solve_seconds, sol.decisions)
    gap = max(sol.recompute_ms - bound, 0.0) / sol.recompute_ms if sol.recompute_ms > 0 else 0.0
    if gap <= mip_rel_gap:
        return Solution("optimal", sol.message, sol.peak_bytes, sol.recompute_ms, gap, sol.solve_seconds,
                        sol.decisions)
    return Solution("feasible", "plan meets the budget only with needs tightened for the solver's tolerances; "
                    "its gap is against the untightened bound (solver='dp' is exact to the byte)",
                    sol.peak_bytes, sol.recompute_ms, gap, sol.solve_seconds, sol.decisions)


def solve_min_peak(prob: Problem, *, time_limit_s: float) -> Solution:
    """The smallest peak any plan reaches (recompute ignored), by MILP.

    The planner uses the exact DP (:func:`planner.min_peak.solve_min_peak_dp`); this
    is the independent cross-check the tests hold it to.
    """
    mat = _Matrix(prob, with_peak=True)
    cost = np.zeros(mat.n_var)
    cost[mat.p] = 1.0
    extra = []
    for k, v in _reduced_rows(prob.node_key, prob.model.base_bytes):
        entries = [(mat.p, 1.0)] + ([(mat.s0 + k - 1, 1.0)] if k > 0 else [])
        extra.append((entries, v / prob.unit, np.inf))
    lb = np.zeros(mat.n_var)
    lb[mat.p] = -np.inf
    return _run(prob, mat, cost, lb, mat.constraint(extra), time_limit_s, 1e-9)


def _run(prob: Problem, mat: _Matrix, cost, lb, constraint, time_limit_s: float, mip_rel_gap: float) -> Solution:
    with warnings.catch_warnings():  # HiGHS options scipy does not name are passed on verbatim, with a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        res = milp(cost, integrality=mat.integrality, bounds=Bounds(lb, mat.ub), constraints=[constraint],
                   options={"time_limit": time_limit_s, "mip_rel_gap": mip_rel_gap, "presolve": True,
                            **_TOLERANCES})
    status, message = _status(res)
    bound = getattr(res, "mip_dual_bound", None)
    bound = float(bound) if bound is not None and math.isfinite(bound) else None
    if res.x is None or status not in ("optimal", "feasible"):
        return Solution(status, message, lower_bound=bound)
    decisions = _decode(prob, mat, res.x)
    discarded = {f: prob.stats.module(f).act_saved_bytes - saved for f, (_, saved, _) in decisions.items()}
    peak = prob.model.peak_bytes(discarded)
    recompute = math.fsum(prob.stats.module(f).op_ms - saved_ms for f, (_, _, saved_ms) in decisions.items())
    gap = float(res.mip_gap) if getattr(res, "mip_gap", None) is not None else 0.0
    return Solution(status, message, peak, recompute, max(gap, 0.0), 0.0, decisions, bound)


def _status(res) -> tuple[str, str]:
    """The one place solver outcomes become plan statuses."""
    if res.status == 0:
        return "optimal", "optimal plan found"
    if res.status == 1:
        if res.x is not None:
            return "feasible", "time limit reached; best plan found so far, with its proven gap"
        return "time_limit", "time limit reached before any plan was found; raise time_limit_s"
    if res.status == 2:
        return "infeasible", "no plan fits the budget"
    return "error", f"solver failed: {res.message}"


def _decode(prob: Problem, mat: _Matrix, x: np.ndarray) -> dict[str, tuple[list[int], int, float]]:
    """Chosen modules -> non-dominated op decisions at least as good as the solver's."""
    out = {}
    for i, cand in enumerate(prob.candidates):
        if x[mat.y0 + i] < 0.5:
            continue
        cl = cand.classes
        rec = np.rint(x[mat.k0 + mat.k_off[i]: mat.k0 + mat.k_off[i + 1]]).astype(np.int64)
        saved_bytes = cand.op_bytes - cl.always_recomputed_bytes - int(rec @ cl.class_bytes)
        save, saved_bytes, saved_ms = _best_decision(prob, cand, saved_bytes)
        if cand.act_saved_bytes - saved_bytes <= 0:
            continue  # frees nothing: checkpointing it would only cost time
        out[cand.fqn] = (save, saved_bytes, saved_ms)
    return out


def _best_decision(prob: Problem, cand: Candidate, max_saved_bytes: int) -> tuple[list[int], int, float]:
    """The frontier point saving the most runtime within ``max_saved_bytes``."""
    m = prob.stats.module(cand.fqn)
    frontier = _frontier(prob._frontiers, m)
    if frontier is not None:
        k = frontier.best_within(max_saved_bytes)
        return frontier.save_list(k), int(frontier.saved_bytes[k]), float(frontier.saved_ms[k])
    cl = cand.classes
    counts = best_saved_within(cl, max_saved_bytes)
    save = cl.save_list(counts)
    saved_bytes = sum(op.output_bytes for op, s in zip(m.ops, save) if s)
    saved_ms = math.fsum(op.runtime_ms for op, s in zip(m.ops, save) if s)
    return save, saved_bytes, saved_ms

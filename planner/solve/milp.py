"""The module-level MILP on ``scipy.optimize.milp`` (HiGHS).

Variables, per candidate module c (non-leaf, has ops, allowed by the request):

* ``y_c`` in {0, 1}: c is checkpointed;
* ``k_cq`` in {0..mult_cq}: how many interchangeable op groups of class q
  c recomputes (``k_cq <= mult_cq * y_c``);
* ``S_i`` >= 0, continuous: discarded memory (in units of ``Problem.unit`` bytes) of the first i candidates in
  forward post-order (``S_i = S_{i-1} + D_{c_i}``).

With ``D_c = (IA_c - ACM_c + R_c) y_c + sum_q w_q k_cq`` (memory discarded: what
autograd would save minus what the policy keeps) and ``RC_c = V_c y_c +
sum_q v_q k_cq`` (ms recomputed; ``V_c`` includes checkpointing's own overhead), the problem is

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

import numpy as np
from scipy.optimize import Bounds, LinearConstraint
from scipy.sparse import coo_array

from planner.highs import quiet_milp
from planner.ops.knapsack import best_saved_within
from planner.plan_format import PlanStatus
from planner.solve.milp_offload import OffloadColumns, add_offload_columns, credited_windows, decode_offload, need_pairs
from planner.solve.offload import OffloadSetup, offload_setup
from planner.solve.forward_rows import forward_rows_of, with_forward_rows
from planner.solve.milp_rows import add_lazy, discard_entries, forward_missed, forward_moment_rows, lazy_entries
from planner.solve.problem import Candidate, Problem, need_rows
from planner.memory_model import NEED_TOL_BYTES
from planner.solve.solution import Decision, Solution, discards

__all__ = ["HIGHS_TOLERANCES", "BudgetMatrix", "budget_need_rows", "host_rows", "solve_budget", "solve_min_peak"]

# HiGHS's defaults (1e-7) let a solution miss a need by 1e-7 of the memory unit:
# kilobytes on a large model. Tighter tolerances make the retries below rare.
HIGHS_TOLERANCES = {"primal_feasibility_tolerance": 1e-9, "mip_feasibility_tolerance": 1e-9}


class BudgetMatrix:
    """The budget-independent part of the MILP: columns y, k, S (and optionally peak P; with ``offload``, the
    offload columns of :mod:`planner.solve.milp_offload` after them)."""

    def __init__(self, prob: Problem, with_peak: bool, offload: OffloadSetup | None = None):
        cands = prob.candidates
        n_c = len(cands)
        k_off = np.cumsum([0] + [len(c.classes.members) for c in cands])
        n_k = int(k_off[-1])
        self.n_c, self.n_k = n_c, n_k
        self.y0, self.k0, self.s0 = 0, n_c, n_c + n_k
        self.p = self.s0 + n_c if with_peak else None
        n_var = self.s0 + n_c + (1 if with_peak else 0)
        rows, cols, vals, lo, hi = [], [], [], [], []
        running_rows: list[int] = []  # per candidate: the row of S_i - S_{i-1} - D_c = 0

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
            cost[y] = cand.cost(cl.always_recomputed_ms)
            d_entries = [(y, cand.y_bytes / prob.unit)]
            for q in range(len(cl.members)):
                k = self.k0 + k_off[i] + q
                integrality[k], ub[k] = 1, len(cl.members[q])
                cost[k] = cl.class_ms[q] * cand.calls
                row([(k, 1.0), (y, -float(len(cl.members[q])))], -np.inf, 0.0)
                d_entries.append((k, cl.class_bytes[q] / prob.unit))
            # S_i - S_{i-1} - D_c = 0 and D_c >= 0
            s_prev = [] if i == 0 else [(self.s0 + i - 1, 1.0)]
            running_rows.append(len(lo))  # (the split adds its prefix there, per-call offloads their bytes)
            row([(self.s0 + i, 1.0)] + [(c, -1.0 * v) for c, v in s_prev] + [(c, -v) for c, v in d_entries], 0.0, 0.0)
            row(d_entries, 0.0, np.inf)
            rc_entries = [(y, cost[y])] + [(self.k0 + k_off[i] + q, cost[self.k0 + k_off[i] + q])
                                           for q in range(len(cl.members))]
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
        self.running_rows = running_rows
        self.off: OffloadColumns | None = None if offload is None else add_offload_columns(self, prob, offload)

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


def solve_budget(prob: Problem, budget_bytes: float, *, time_limit_s: float, mip_rel_gap: float,
                 offload: OffloadSetup | None = None, host_budget_bytes: float | None = None) -> Solution:
    """Least recompute with peak <= budget_bytes; with ``offload``, least recompute + offload stall, each free
    op group of a checkpointed module saved, recomputed or offloaded (:mod:`planner.solve.milp_offload`), at most
    ``host_budget_bytes`` of them in all (None: no cap)."""
    need = prob.model.base_bytes - budget_bytes
    plain, multi = budget_need_rows(prob, need, offload)
    rows = [(k, j, v) for k, j, v in plain if v > 0]
    multi = [(k, j, terms, v) for k, j, terms, v in multi if v + sum(terms["held"].values()) > 0]
    if not rows and not any(v > 0 for _, _, _, v in multi):
        return Solution.unplanned(prob, "no checkpointing needed")
    if rows and rows[0][:2] == (0, 0):
        return Solution.infeasible("modules before any checkpointable module already exceed the budget")
    mat = BudgetMatrix(prob, with_peak=False, offload=offload)
    forward = forward_moment_rows(prob, mat, need, offload)
    # First the needs as they are, to the byte the DP holds them to (NEED_TOL_BYTES): its optimum bounds
    # every plan, and it is optimal when it meets them. HiGHS's tolerance may let it miss one by a hair;
    # then the needs are raised until a plan meets the budget, and the gap is against the first bound.
    # Never relaxed by more: a plan missing the rows by kilobytes can still fit the budget where
    # checkpointed modules share a held tensor (a plan's peak counts it once, the rows once per holder),
    # and its "optimum" would then be one of a looser problem than the other engines solve (issue 28).
    margin, bound, host_margin = -NEED_TOL_BYTES, None, 0.0
    lazy: dict[int, dict[int, float]] = {}  # moment -> candidate -> what its save list added there beyond the rows
    deadline = time.perf_counter() + time_limit_s  # the retries share the time limit
    for attempt in range(6):
        left = deadline - time.perf_counter()
        if attempt > 0 and left <= 0:
            return Solution.without_plan("time_limit", "time limit reached before a plan met the budget to the "
                                                       "byte; raise time_limit_s or use solver='dp' (exact)")
        lb = np.zeros(mat.n_var)
        extra = [(discard_entries(mat, k, terms, prob.unit, j), (v + margin) / prob.unit, np.inf)
                 for k, j, terms, v in multi]
        extra += [(entries, (v + margin) / prob.unit, np.inf) for entries, v, most in forward if v + margin + most > 0]
        extra += [(lazy_entries(prob, mat, offload, t, culprits), (float(need[t]) + margin) / prob.unit, np.inf)
                  for t, culprits in lazy.items()]
        for k, j, v in rows:
            if j == 0:
                lb[mat.s0 + k - 1] = max(lb[mat.s0 + k - 1], (v + margin) / prob.unit)
            else:  # the running discard and the running offload of the windows credited then
                extra.append((discard_entries(mat, k, {"held": {}}, prob.unit, j), (v + margin) / prob.unit, np.inf))
        extra += host_rows(mat, prob.unit, host_budget_bytes, host_margin)
        sol = _run(prob, mat, mat.cost, lb, mat.constraint(extra), max(left, 0.01), mip_rel_gap)
        if attempt == 0:
            bound = sol.lower_bound if sol.status in ("optimal", "feasible") else None
        if sol.decisions is None:
            if attempt == 0:
                return sol  # infeasible, or stopped before any plan
            return Solution.without_plan("error", _MISSED)
        over = _over_budget(prob, sol, budget_bytes)
        host_over = 0.0 if host_budget_bytes is None or sol.offload is None else \
            sol.offload.host_bytes - host_budget_bytes
        if over <= 0 and host_over <= 0:
            return sol if attempt == 0 else _against(sol, bound, mip_rel_gap)
        if host_over > 0:  # the cap met to HiGHS's tolerance only: tightened by what it missed, as the needs
            host_margin += 2 * host_over + 1
        if over <= 0:
            continue
        if attempt == 0 and not forward_rows_of(prob) and forward_missed(prob, sol, budget_bytes):
            split = with_forward_rows(prob)
            if split is not None:  # the rows of the candidates' own forward moments: exact there
                left = max(deadline - time.perf_counter(), 0.01)
                setup = None if offload is None else offload_setup(split, offload.windows.link)
                return solve_budget(split, budget_bytes, time_limit_s=left, mip_rel_gap=mip_rel_gap, offload=setup,
                                    host_budget_bytes=host_budget_bytes)
        if not add_lazy(prob, sol, budget_bytes, lazy):
            margin = max(margin, 0.0) + 2 * over + 1
    return Solution.without_plan("error", _MISSED)


def host_rows(mat: BudgetMatrix, unit: float, host_budget_bytes: float | None, margin: float = 0.0) -> list:
    """The host memory cap as a row (none without a cap or without offload columns): what all windows offload,
    the last running offload sum, plus every call's offload of the modules offloading per call, at most the cap
    (less ``margin`` bytes)."""
    if host_budget_bytes is None or mat.off is None:
        return []
    entries = ([(mat.off.q(mat.off.n_w), 1.0)] if mat.off.n_w else []) + mat.off.per_call_host
    if not entries:
        return []
    return [(entries, -np.inf, (host_budget_bytes - margin) / unit)]


def _over_budget(prob: Problem, sol: Solution, budget_bytes: float) -> float:
    """How far the plan is over the budget: by its own peak, or by the needs the rows stand for (held inputs once
    per checkpointed module that holds them, as every engine counts them); <= 0 when it meets both."""
    rows_peak = prob.model.peak_bytes(discards(prob, sol.decisions), shared_once=False,
                                      offloaded=None if sol.offload is None else sol.offload.credits)
    return max(sol.peak_bytes, rows_peak - NEED_TOL_BYTES) - budget_bytes


_MISSED = "no plan meets the budget to the byte within the MILP's tolerances; use solver='dp' (exact)"


def _against(sol: Solution, bound: float | None, mip_rel_gap: float) -> Solution:
    """A plan found only after tightening the needs: optimal only if it is within the gap of the first bound."""
    cost = sol.overhead_ms  # the objective: recompute (and offload stall)
    if bound is None or cost is None:
        return sol.with_status("feasible", "plan meets the budget after tightening for solver tolerances; "
                                           "gap unknown", 1.0)
    gap = max(cost - bound, 0.0) / cost if cost > 0 else 0.0
    if gap <= mip_rel_gap:
        return sol.with_status("optimal", sol.message, gap)
    return sol.with_status("feasible", "plan meets the budget only with needs tightened (for the solver's "
                           "tolerances, or for what a checkpointed module's recompute holds beyond the engines' "
                           "figure); its gap is against the untightened bound", gap)


def solve_min_peak(prob: Problem, *, time_limit_s: float, offload: OffloadSetup | None = None,
                   host_budget_bytes: float | None = None) -> Solution:
    """The smallest peak any plan reaches (recompute and stall ignored), by MILP; with ``offload``, plans that
    may offload (at most ``host_budget_bytes`` in all; None: no cap).

    The planner uses the exact DP (:func:`planner.solve.min_peak.solve_min_peak_dp`) without offload; this
    is the independent cross-check the tests hold it to.
    """
    split = with_forward_rows(prob)  # the least peak may lie in a checkpointed module's own forward
    if split is not None:
        prob, offload = split, None if offload is None else offload_setup(split, offload.windows.link)
    mat = BudgetMatrix(prob, with_peak=True, offload=offload)
    cost = np.zeros(mat.n_var)
    cost[mat.p] = 1.0
    plain, multi = budget_need_rows(prob, prob.model.base_bytes, offload)
    extra = [([(mat.p, 1.0)] + discard_entries(mat, k, reps, prob.unit, j), v / prob.unit, np.inf)
             for k, j, reps, v in [(k, j, {"held": {}}, v) for k, j, v in plain] + multi]
    extra += [([(mat.p, 1.0)] + entries, v / prob.unit, np.inf)
              for entries, v, _ in forward_moment_rows(prob, mat, prob.model.base_bytes, offload)]
    extra += host_rows(mat, prob.unit, host_budget_bytes)
    lb = np.zeros(mat.n_var)
    lb[mat.p] = -np.inf
    return _run(prob, mat, cost, lb, mat.constraint(extra), time_limit_s, 1e-9)


def budget_need_rows(prob: Problem, values: np.ndarray, offload: OffloadSetup | None = None
               ) -> tuple[list[tuple[int, int, float]], list[tuple[int, int, dict, float]]]:
    """Rows for "discard at moment t >= values[t]": (key, windows credited, value) bounds on the running sums
    where only they decide (:func:`need_rows`; without ``offload`` no window is credited), and (key, windows
    credited, terms, value) rows, one per moment, where later calls of a module discard too (terms: candidate ->
    calls after its first discarding) or a checkpointed module holds its inputs (terms["held"]: candidate ->
    bytes held then, if it is checkpointed)."""
    reps, extra = prob.repeat_counts(), prob.checkpointed_extra_bytes()
    multi_at = np.zeros(len(values), bool)
    for counts in (*reps.values(), *extra.values()):
        multi_at |= counts > 0
    if offload is None:
        credited = np.zeros(len(values), dtype=np.int64)
        plain = [(k, 0, v) for k, v in need_rows(prob.node_key[~multi_at], values[~multi_at])]
    else:
        credited = credited_windows(offload, prob.model.keys)
        plain = need_pairs(prob.node_key[~multi_at], credited[~multi_at], values[~multi_at])
    multi = []
    for t in np.flatnonzero(multi_at):
        terms: dict = {i: float(c[t]) for i, c in reps.items() if c[t] > 0}
        terms["held"] = {i: float(b[t]) for i, b in extra.items() if b[t] > 0}
        multi.append((int(prob.node_key[t]), int(credited[t]), terms, float(values[t])))
    return plain, multi


def _run(prob: Problem, mat: BudgetMatrix, cost, lb, constraint, time_limit_s: float, mip_rel_gap: float) -> Solution:
    with warnings.catch_warnings():  # HiGHS options scipy does not name are passed on verbatim, with a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        res = quiet_milp(cost, integrality=mat.integrality, bounds=Bounds(lb, mat.ub), constraints=[constraint],
                   options={"time_limit": time_limit_s, "mip_rel_gap": mip_rel_gap, "presolve": True,
                            **HIGHS_TOLERANCES})
    status, message = _status(res)
    bound = getattr(res, "mip_dual_bound", None)
    bound = float(bound) if bound is not None and math.isfinite(bound) else None
    if res.x is None or status not in ("optimal", "feasible"):
        return Solution.without_plan(status, message, lower_bound=bound)
    gap = float(res.mip_gap) if getattr(res, "mip_gap", None) is not None else 0.0
    if mat.off is not None:
        decisions, offload = decode_offload(prob, mat, mat.off, res.x)
        return Solution.planned(prob, decisions, status, message, max(gap, 0.0), bound, offload)
    return Solution.planned(prob, _decode(prob, mat, res.x), status, message, max(gap, 0.0), bound)


def _status(res) -> tuple[PlanStatus, str]:
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


def _decode(prob: Problem, mat: BudgetMatrix, x: np.ndarray) -> dict[str, Decision]:
    """Chosen modules -> non-dominated op decisions at least as good as the solver's."""
    out = {}
    for i, cand in enumerate(prob.candidates):
        if x[mat.y0 + i] < 0.5:
            continue
        cl = cand.classes
        rec = np.rint(x[mat.k0 + mat.k_off[i]: mat.k0 + mat.k_off[i + 1]]).astype(np.int64)
        saved_bytes = cand.op_bytes - cl.always_recomputed_bytes - int(rec @ cl.class_bytes)
        save, saved_bytes, saved_ms = _best_decision(prob, cand, saved_bytes)
        if i in forward_rows_of(prob):  # the frontier's pick only where its own forward holds no more than the solver's
            solved = _counts_decision(prob, cand, rec)
            if _holds_more(prob, cand.fqn, save, solved[0]):
                save, saved_bytes, saved_ms = solved
        if cand.act_saved_bytes - saved_bytes <= 0:
            continue  # frees nothing: checkpointing it would only cost time
        out[cand.fqn] = (save, saved_bytes, saved_ms)
    return out


def _counts_decision(prob: Problem, cand: Candidate, recomputed: np.ndarray) -> Decision:
    """The save list of the solver's own counts (``recomputed`` groups per class)."""
    m, cl = prob.stats.module(cand.fqn), cand.classes
    save = cl.save_list(cl.multiplicity - recomputed)
    saved_bytes = sum(op.output_bytes for op, s in zip(m.ops, save) if s)
    return save, saved_bytes, math.fsum(ms for ms, s in zip(m.recompute_runtimes_ms, save) if s)


def _holds_more(prob: Problem, fqn: str, save: list[int], other: list[int]) -> bool:
    """Whether checkpointed ``fqn`` with ``save`` adds more than with ``other`` at any of its forward moments."""
    model = prob.model
    return bool(np.any(model.forward_excess(fqn, save) > model.forward_excess(fqn, other)))


def _best_decision(prob: Problem, cand: Candidate, max_saved_bytes: int) -> Decision:
    """The frontier point saving the most runtime within ``max_saved_bytes``."""
    m = prob.stats.module(cand.fqn)
    frontier = prob.frontier(cand.fqn)
    if frontier is not None:
        k = frontier.best_within(max_saved_bytes)
        return frontier.save_list(k), int(frontier.saved_bytes[k]), float(frontier.saved_ms[k])
    cl = cand.classes
    counts = best_saved_within(cl, max_saved_bytes)
    save = cl.save_list(counts)
    saved_bytes = sum(op.output_bytes for op, s in zip(m.ops, save) if s)
    saved_ms = math.fsum(ms for ms, s in zip(m.recompute_runtimes_ms, save) if s)
    return save, saved_bytes, saved_ms

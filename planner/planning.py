"""Module-level planning, the one public entry point: which modules to checkpoint and how, under a budget.

``plan()`` and ``sweep()`` validate the request (:class:`planner.PlanOptions`),
prepare the problem once (:func:`planner.solve.problem.prepare`) and pick the
engine per budget: a budget the step already fits is answered at once; one
below the smallest feasible peak (:mod:`planner.solve.min_peak`) is
infeasible; the rest go to the exact DP (:mod:`planner.solve.dp`), and to the
MILP (:mod:`planner.solve.milp`) when the DP does not apply or ``solver='milp'``.
"""

from __future__ import annotations

import gc
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any


from planner.memory_model import GIB, NEED_TOL_BYTES
from planner.options import PlanOptions, plan_options
from planner.plan_assembly import to_plan
from planner.plan_format import Plan
from planner.solve.dp import solve_dp
from planner.solve.milp import solve_budget, solve_min_peak
from planner.solve.min_peak import innermost_peak_bytes, smallest_peak
from planner.solve.offload import host_link, offload_setup
from planner.solve.offload_solve import solve_with_offload
from planner.solve.problem import Problem, prepare
from planner.solve.solution import Solution, discards, needs_peak_bytes
from planner.stats.format import Stats
from planner.stats.loader import load_stats, parse_stats

__all__ = ["plan", "sweep", "min_feasible_budget_gib"]

StatsInput = Stats | Mapping[str, Any] | str | os.PathLike


def plan(stats: StatsInput, memory_budget_gib: float, *, options: PlanOptions | None = None,
         **option_values: Any) -> Plan:
    """Plan selective checkpointing for one memory budget.

    Parameters
    ----------
    stats
        The collected stats: a :class:`planner.Stats`, a decoded document
        (stats v1 or PyTorch's format) or a path to a stats file.
    memory_budget_gib
        Peak memory allowed per rank, in GiB.
    options, **option_values
        A :class:`planner.PlanOptions`, or its fields as keywords:
        ``world_size`` (ranks sharing parameters and gradients), ``ac_units``
        (only these may be checkpointed), ``fsdp_units`` (no checkpointed
        module may contain one), ``time_limit_s`` (one limit for the whole call, the
        analysis of the stats included; on expiry the best plan is
        returned as ``feasible`` with its proven gap; ``feasible`` also comes
        back when the exact DP uses up its work allowance on deep stacks of
        identical blocks), ``mip_rel_gap`` (the gap at which a plan counts as
        optimal, at least 1e-8), ``solver`` (``auto``, ``dp`` or ``milp``),
        ``first_step_only`` (by default a plan holds for every step: the
        optimizer state the stats record is live throughout),
        ``reserve_gib`` (a fixed reserve at every moment), ``offload``
        ('on': saved op outputs of checkpointed modules may go to host
        memory, the plan minimising recompute + copy stall; see
        docs/memory-model.md) and ``host_link_gbps`` (the host link, GB/s
        per direction; by default the stats' ``metadata.host_link_gbps``).

    Returns
    -------
    Plan
        ``optimal``, ``feasible`` (stopped early, with its proven gap), ``infeasible``
        (with ``min_feasible_budget_gib``), ``time_limit`` or ``error``. Optimal is
        among plans meeting the budget as every engine counts it: an input several
        checkpointed modules hold, once per module (docs/memory-model.md); the plan's
        ``peak_bytes`` counts it once, so it may sit that much below the budget.

    Raises
    ------
    ValueError
        If an option is out of range or names an unknown module
        (:class:`planner.StatsError`, a ValueError, for bad stats).
    """
    opts = plan_options(options, **option_values)
    return _plans(_as_stats(stats), _budgets([memory_budget_gib], "memory_budget_gib"), opts, None)[0]


def sweep(stats: StatsInput, budgets_gib: Sequence[float], *, options: PlanOptions | None = None,
          progress: Callable[[int, int, Plan], None] | None = None, **option_values: Any) -> list[Plan]:
    """Plans for several budgets: the memory/recompute Pareto curve.

    The module analysis, op classes, frontiers and the minimum feasible peak
    are computed once and shared by every budget. ``progress(i, n, plan)`` is
    called after each budget. Options as for :func:`plan`; ``time_limit_s`` is one
    budget for the whole sweep (every point shares it): points not reached in time
    come back as ``time_limit``.
    """
    opts = plan_options(options, **option_values)
    return _plans(_as_stats(stats), _budgets(budgets_gib, "budgets_gib"), opts, progress)


def min_feasible_budget_gib(stats: StatsInput, *, options: PlanOptions | None = None, **option_values: Any) -> float:
    """The smallest budget with a plan, in GiB, for these options: what an infeasible plan reports.

    Exact (the smallest peak any plan reaches, :mod:`planner.solve.min_peak`),
    rounded up to a readable figure that still has a plan; no frontier is built.
    """
    opts = plan_options(options, **option_values)
    with _cyclic_gc_paused():
        stats = _as_stats(stats)
        if opts.offload == "on":
            host_link(stats, opts.host_link_gbps)  # ValueError without a link figure, or for stats it cannot plan
        prob = prepare(stats, world_size=opts.world_size, ac_units=opts.ac_units,
                       fsdp_units=opts.fsdp_units, first_step_only=opts.first_step_only,
                       reserve_bytes=opts.reserve_gib * GIB)
        if opts.offload == "on":
            least = _min_feasible_offloading(prob, opts)
            return _min_feasible(prob) if least is None else least
        return _min_feasible(prob)


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off while planning (as it was, after).

    Planning allocates many short-lived objects and hardly any cycles, and every
    full collection those allocations trigger walks every object the caller
    holds: with a parsed 405B stats document live, that was half of preparing a
    plan (0.13 s of CPU instead of 0.06). Reference counting still frees
    everything as it goes; cycles made meanwhile wait for the next collection.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _plans(stats: Stats, budgets: list[float], opts: PlanOptions,
           progress: Callable[[int, int, Plan], None] | None) -> list[Plan]:
    with _cyclic_gc_paused():
        return _plans_gc_paused(stats, budgets, opts, progress)


def _plans_gc_paused(stats: Stats, budgets: list[float], opts: PlanOptions,
                     progress: Callable[[int, int, Plan], None] | None) -> list[Plan]:
    # One time limit for the whole call: the analysis and every budget share it.
    deadline = time.perf_counter() + opts.time_limit_s
    if opts.offload == "on":
        host_link(stats, opts.host_link_gbps)  # the option over the stats' figure; ValueError without either
    prob = prepare(stats, world_size=opts.world_size, ac_units=opts.ac_units, fsdp_units=opts.fsdp_units,
                   first_step_only=opts.first_step_only, reserve_bytes=opts.reserve_gib * GIB)
    baseline_bytes = prob.model.peak_bytes()
    baseline = int(math.ceil(baseline_bytes))
    plans = []
    for i, budget in enumerate(budgets):
        started = time.perf_counter()
        sol = _solve(prob, budget * GIB, baseline_bytes, opts, started, deadline - started)
        min_budget = None
        if sol.status == "infeasible":
            min_budget = _min_feasible(prob) if opts.offload == "off" else _min_feasible_offloading(prob, opts)
        p = to_plan(prob, sol, budget, opts, baseline, time.perf_counter() - started, min_budget)
        plans.append(p)
        if progress:
            progress(i, len(budgets), p)
    return plans


def _solve(prob: Problem, budget_bytes: float, baseline_bytes: float, opts: PlanOptions, started: float,
           time_left_s: float) -> Solution:
    """One budget, in ``time_left_s``; a plan over the budget is solved again.

    The engines count what a checkpointed module holds through its own
    backward (``held_input_bytes``), and the MILP what it holds in its own
    forward, so their plans meet the budget with them. Should one not (the
    DP asked for by name, whose frontiers leave the forward out; or a bug),
    it is solved again under the budget lowered by the excess: a plan that
    fits, ``feasible`` (not proven optimal), with a message saying so. Every
    retry shares the one time limit.
    """
    deadline = started + time_left_s
    target = budget_bytes
    for _ in range(_HELD_RETRIES):
        now = time.perf_counter()
        sol = _solve_once(prob, target, baseline_bytes, opts, now, deadline - now)
        if sol.peak_bytes is None and target != budget_bytes:
            break
        if sol.peak_bytes is None or sol.peak_bytes <= budget_bytes + NEED_TOL_BYTES:
            if target == budget_bytes:
                return sol
            return sol.with_status("feasible", f"{sol.message}; solved under a budget lowered by "
                                   f"{budget_bytes - target:.0f} bytes for what checkpointed modules hold in their "
                                   "own forward or backward (not proven optimal)", sol.mip_gap)
        target -= sol.peak_bytes - budget_bytes + 1
    least = _smallest_peak(prob)  # the plan of least peak may still fit
    if least.peak_bytes is not None and least.peak_bytes <= budget_bytes + NEED_TOL_BYTES:
        return least.with_status("feasible", "the plan of least peak: plans solved under lowered budgets for what "
                                 "checkpointed modules hold in their own forward or backward did not fit", None)
    return Solution.infeasible("no plan found whose held module inputs stay within the budget")


_HELD_RETRIES = 8


def _solve_once(prob: Problem, budget_bytes: float, baseline_bytes: float, opts: PlanOptions, started: float,
                time_left_s: float) -> Solution:
    """One budget, in ``time_left_s``: answered at once when trivial, else by the engine the options ask for."""
    gap = opts.effective_rel_gap
    if baseline_bytes <= budget_bytes:  # nothing to plan: no checkpointing fits, and nothing costs less
        return Solution.unplanned(prob, "no checkpointing needed: the step's peak fits the budget as it is")
    if opts.offload == "on":
        return _solve_offloading(prob, budget_bytes, opts, started, time_left_s)
    # The least peak settles infeasible budgets, exactly; it is not needed where a plan found without a search
    # already fits the budget (then so does the least peak): one DP of 379 candidates, a tenth of a 405B plan.
    if opts.solver in ("auto", "dp") and not _least_fits(prob, budget_bytes) and _least_exceeds(prob, budget_bytes):
        return Solution.infeasible()  # exact and cheap (once per problem): said even when the time is up
    if time_left_s <= 0:
        return Solution.without_plan("time_limit", "time_limit_s ran out before this budget was planned (one "
                                                   "time limit covers the whole call, every budget of a sweep); "
                                                   "raise time_limit_s")
    sol = None
    if opts.solver in ("auto", "dp"):
        sol = solve_dp(prob, budget_bytes, time_limit_s=time_left_s, mip_rel_gap=gap)
        if sol is None and opts.solver == "dp":
            why = ("a module called more than once discards at every call" if prob.repeat_counts()
                   else "a module frontier is too large")
            raise ValueError(f"solver 'dp' does not apply to these stats ({why}); use 'milp'")
    dp_over = None
    if (sol is not None and opts.solver == "auto" and prob.model.forward_ops and sol.peak_bytes is not None
            and sol.peak_bytes > budget_bytes + NEED_TOL_BYTES):
        dp_over, sol = sol, None  # the DP leaves out what a checkpointed module's own forward holds: the MILP has it
    if sol is None:  # the MILP gets what is left of the time limit
        spent = time.perf_counter() - started
        left = time_left_s - spent if spent < time_left_s else min(time_left_s, 1e-3)
        sol = solve_budget(prob, budget_bytes, time_limit_s=left, mip_rel_gap=gap)
        if dp_over is not None and sol.peak_bytes is None and sol.status != "infeasible":
            # none from the MILP (within its tolerances, or in time): the DP's plan, over the budget, goes to
            # _solve's retries under a lowered budget, as the DP asked for by name does
            sol = dp_over
    elif sol.status == "feasible" and opts.solver == "auto":
        sol = _with_milp(prob, sol, budget_bytes, gap, started, time_left_s)
    return sol


def _solve_offloading(prob: Problem, budget_bytes: float, opts: PlanOptions, started: float,
                      time_left_s: float) -> Solution:
    """One budget with offload on: every engine choice goes through :func:`solve_with_offload`."""
    if opts.solver == "dp":
        raise ValueError("solver 'dp' does not plan with offload='on'; use 'auto' or 'milp'")
    if time_left_s <= 0:
        return Solution.without_plan("time_limit", "time_limit_s ran out before this budget was planned (one "
                                                   "time limit covers the whole call, every budget of a sweep); "
                                                   "raise time_limit_s")
    link = host_link(prob.stats, opts.host_link_gbps)
    left = max(time_left_s - (time.perf_counter() - started), 1e-3)
    return solve_with_offload(prob, budget_bytes, link, time_limit_s=left, mip_rel_gap=opts.effective_rel_gap,
                              host_budget_bytes=opts.host_budget_bytes)


def _min_feasible_offloading(prob: Problem, opts: PlanOptions) -> float | None:
    """The smallest budget with a plan that may offload (by the MILP, proven), or None if not proven in time."""
    setup = offload_setup(prob, host_link(prob.stats, opts.host_link_gbps))
    cap = opts.host_budget_bytes
    sol = prob.derived(f"min_peak {id(setup)} {cap!r}",
                       lambda p: solve_min_peak(p, time_limit_s=min(opts.time_limit_s, 30.0), offload=setup,
                                                host_budget_bytes=cap))
    if sol.status != "optimal" or sol.peak_bytes is None or sol.decisions is None:
        return None
    # as the engines count it: a held tensor several checkpointed modules take, once per module
    least = max(sol.peak_bytes, prob.model.peak_bytes(discards(prob, sol.decisions), shared_once=False,
                                                      offloaded=None if sol.offload is None else sol.offload.credits))
    return _round_up(min(least, prob.model.peak_bytes()) / GIB)


def _least_exceeds(prob: Problem, budget_bytes: float) -> bool:
    """Whether the plan of least peak, proven least, needs more than the budget (then no plan fits)."""
    least = _smallest_peak(prob)
    return least.status == "optimal" and needs_peak_bytes(prob, least) > budget_bytes


# Float noise between the least-peak DP's sums and a plan's profile is far below a byte: a plan whose needs sit
# this far within the budget shows that the least peak fits as well.
_FITS_MARGIN_BYTES = 1024.0


def _least_fits(prob: Problem, budget_bytes: float) -> bool:
    """Whether the least peak surely fits the budget, told without computing it (False: not known)."""
    if prob.repeat_counts() or prob.has_derived("min_peak"):  # no bound for these; or known already, and cheap
        return False
    return prob.derived("innermost_peak", innermost_peak_bytes) <= budget_bytes - _FITS_MARGIN_BYTES


def _with_milp(prob: Problem, sol: Solution, budget_bytes: float, gap: float, started: float,
               time_left_s: float) -> Solution:
    """The DP stopped before proving its plan: the MILP gets as long again (within the time limit), and the
    cheaper plan comes back with the better of the two proven bounds, so an unproven plan is never worse than
    the MILP's in that time."""
    spent = time.perf_counter() - started
    left = min(spent, time_left_s - spent)
    if left <= 0.05 or sol.recompute_ms is None:
        return sol
    other = solve_budget(prob, budget_bytes, time_limit_s=left, mip_rel_gap=gap)
    lower = max(sol.recompute_ms * (1.0 - (sol.mip_gap or 0.0)), other.lower_bound or -math.inf)
    best = other if other.recompute_ms is not None and other.recompute_ms < sol.recompute_ms else sol
    proven = max(best.recompute_ms - lower, 0.0) / best.recompute_ms if best.recompute_ms > 0 else 0.0
    if proven <= gap:
        return best.with_status("optimal", f"{best.message}; proven optimal with the other engine's bound", proven)
    return best.with_status("feasible", f"{best.message} (the DP and the MILP side by side; gap from the better "
                            "bound)", proven)


def _smallest_peak(prob: Problem) -> Solution:
    return prob.derived("min_peak", smallest_peak)


def _as_stats(stats: StatsInput) -> Stats:
    """Stats as given, or parsed from a decoded document or a file path (StatsError names any problem)."""
    if isinstance(stats, Stats):
        return stats
    if isinstance(stats, Mapping):
        return parse_stats(stats)
    if isinstance(stats, str) and stats.lstrip().startswith("{"):
        raise TypeError("stats is a str of JSON text, but a str means a path; decode the text first "
                        "(planner.plan(json.loads(text), ...))")
    if isinstance(stats, (str, os.PathLike)):
        return load_stats(stats)
    raise TypeError(f"stats must be a planner.Stats, a decoded stats document (dict) or a path to a stats file, "
                    f"got {type(stats).__name__}")


def _budgets(budgets_gib: Any, name: str) -> list[float]:
    """The budgets as floats; ValueError naming the first that is not a positive number of GiB."""
    if isinstance(budgets_gib, (str, bytes)) or not isinstance(budgets_gib, Sequence):
        raise ValueError(f"{name} must be a list of numbers of GiB, got {budgets_gib!r}")
    budgets = []
    for k, b in enumerate(budgets_gib):
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b <= 0:
            where = name if name == "memory_budget_gib" else f"{name}[{k}]"
            raise ValueError(f"{where} must be a positive number of GiB, got {b!r}")
        budgets.append(float(b))
    if not budgets:
        raise ValueError(f"{name} is empty")
    return budgets


def _min_feasible(prob: Problem) -> float:
    """The smallest budget with a plan, rounded up to a readable figure that still fits: exact unless the inputs
    checkpointed modules hold through their own backward count (then no plan at all may beat the least-peak one)."""
    sol = _smallest_peak(prob)
    least = sol.peak_bytes
    if least is not None and sol.decisions:
        # as the engines count it: a held tensor several checkpointed modules take, once per module (the
        # plan's own peak counts it once), so that a plan is found at the figure given
        least = max(least, prob.model.peak_bytes(discards(prob, sol.decisions), shared_once=False))
    return _round_up(min(prob.model.peak_bytes() if least is None else least, prob.model.peak_bytes()) / GIB)


def _round_up(gib: float, digits: int = 6) -> float:
    """``gib`` rounded up to ``digits`` significant digits: readable, and itself feasible."""
    if gib <= 0:
        return 0.0
    exp = math.floor(math.log10(gib)) - digits + 1
    k = math.ceil(gib / 10.0**exp)
    for kk in (k, k + 1):
        out = float(f"{kk}e{exp}")  # the shortest float for kk * 10**exp, not a product's rounding noise
        if out >= gib:
            return out
    while out < gib:
        out = math.nextafter(out, math.inf)
    return out

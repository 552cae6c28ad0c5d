"""Module-level planning: which modules to checkpoint and how, under a memory budget."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from planner.dp import solve_dp
from planner.min_peak import solve_min_peak_dp
from planner.memory_model import GIB, compute_ms
from planner.milp import Problem, Solution, prepare, solve_budget
from planner.plan_format import Plan, PlannedModule
from planner.loader import load_stats, parse_stats
from planner.stats import MAX_BYTES, Stats
from planner.version import PLANNER_VERSION

__all__ = ["MIN_REL_GAP", "plan", "sweep"]

# The smallest gap a plan claims: the DP treats costs within 1e-9 (relative, plus 1e-9 ms) as equal.
MIN_REL_GAP = 1e-8


def plan(
    stats: Stats | Mapping[str, Any] | str | os.PathLike,
    memory_budget_gib: float,
    *,
    world_size: int = 1,
    ac_units: Sequence[str] | None = None,
    fsdp_units: Sequence[str] | None = None,
    time_limit_s: float = 60.0,
    mip_rel_gap: float = 1e-6,
    include_optimizer_state: bool = False,
    reserve_gib: float = 0.0,
    solver: str = "auto",
) -> Plan:
    """Plan selective checkpointing for one memory budget.

    Parameters
    ----------
    stats
        The collected stats: a :class:`planner.Stats`, a decoded document
        (stats v1 or PyTorch's format) or a path to a stats file.
    memory_budget_gib
        Peak memory allowed per rank, in GiB.
    world_size
        Ranks that parameters and gradients (and, if included, optimizer
        state) are sharded over.
    ac_units
        If given, only these modules may be checkpointed.
    fsdp_units
        FSDP-wrapped modules: no checkpointed module may contain one.
    time_limit_s
        Solver time limit; on expiry the best plan is returned as ``feasible``
        with its proven gap. ``feasible`` also comes back when the exact DP
        uses up its work allowance (deep stacks of identical blocks), again
        with the gap.
    mip_rel_gap
        Relative optimality gap at which the solver stops and calls the plan
        optimal (both engines: the plan's proven gap is then at most this).
        Values below ``MIN_REL_GAP`` (1e-8) count as 1e-8: costs are sums of
        float runtimes, compared with a 1e-9 tolerance.
    include_optimizer_state, reserve_gib
        Opt-in memory terms: the root's optimizer state (sharded) and a fixed
        reserve added at every point of the step. Off by default, so
        PyTorch-format stats plan under PyTorch's model.

    Returns
    -------
    Plan
        ``optimal``, ``feasible`` (stopped early, with its proven gap), ``infeasible``
        (with ``min_feasible_budget_gib``), ``time_limit`` or ``error``.

    Raises
    ------
    ValueError
        If an option is out of range or names an unknown module
        (:class:`planner.StatsError`, a ValueError, for bad stats).
    """
    return _sweep(
        _as_stats(stats), [memory_budget_gib], "memory_budget_gib", world_size=world_size, ac_units=ac_units,
        fsdp_units=fsdp_units, time_limit_s=time_limit_s, mip_rel_gap=mip_rel_gap,
        include_optimizer_state=include_optimizer_state, reserve_gib=reserve_gib, solver=solver, progress=None,
    )[0]


def sweep(
    stats: Stats | Mapping[str, Any] | str | os.PathLike,
    budgets_gib: Sequence[float],
    *,
    world_size: int = 1,
    ac_units: Sequence[str] | None = None,
    fsdp_units: Sequence[str] | None = None,
    time_limit_s: float = 60.0,
    mip_rel_gap: float = 1e-6,
    include_optimizer_state: bool = False,
    reserve_gib: float = 0.0,
    solver: str = "auto",
    progress: Callable[[int, int, Plan], None] | None = None,
) -> list[Plan]:
    """Plans for several budgets: the memory/recompute Pareto curve.

    The module analysis, op classes, frontiers and the minimum feasible peak
    are computed once and shared by every budget. ``progress(i, n, plan)`` is
    called after each budget. Options as for :func:`plan`.
    """
    return _sweep(_as_stats(stats), budgets_gib, "budgets_gib", world_size=world_size, ac_units=ac_units,
                  fsdp_units=fsdp_units, time_limit_s=time_limit_s, mip_rel_gap=mip_rel_gap,
                  include_optimizer_state=include_optimizer_state, reserve_gib=reserve_gib, solver=solver,
                  progress=progress)


def _sweep(stats: Stats, budgets_gib: Sequence[float], budgets_name: str, *, world_size: int,
           ac_units: Sequence[str] | None, fsdp_units: Sequence[str] | None, time_limit_s: float,
           mip_rel_gap: float, include_optimizer_state: bool, reserve_gib: float, solver: str,
           progress: Callable[[int, int, Plan], None] | None) -> list[Plan]:
    budgets = _validate(budgets_gib, budgets_name, world_size, time_limit_s, mip_rel_gap, reserve_gib)
    mip_rel_gap = max(mip_rel_gap, MIN_REL_GAP)
    if solver not in ("auto", "milp", "dp"):
        raise ValueError(f"solver must be 'auto', 'milp' or 'dp', got {solver!r}")
    prob = prepare(stats, world_size=world_size, ac_units=ac_units, fsdp_units=fsdp_units,
                   include_optimizer_state=include_optimizer_state, reserve_bytes=reserve_gib * GIB)
    baseline_bytes = prob.model.peak_bytes()
    baseline = int(math.ceil(baseline_bytes))
    plans = []
    for i, budget in enumerate(budgets):
        started = time.perf_counter()
        sol = None
        if baseline_bytes <= budget * GIB:  # nothing to plan: no checkpointing fits, and nothing costs less
            sol = Solution("optimal", "no checkpointing needed: the step's peak fits the budget as it is",
                           baseline_bytes, 0.0, 0.0, 0.0, {})
        elif solver in ("auto", "dp"):
            lowest = solve_min_peak_dp(prob)  # exact and cheap; cached per problem
            if lowest.peak_bytes > budget * GIB:
                sol = Solution("infeasible", "no plan fits the budget")
            else:
                sol = solve_dp(prob, budget * GIB, time_limit_s=time_limit_s, mip_rel_gap=mip_rel_gap)
        if sol is None and solver == "dp":
            raise ValueError("solver 'dp' does not apply to these stats (a module frontier is too large); use 'milp'")
        if sol is None:  # the MILP gets what is left of the time limit
            spent = time.perf_counter() - started
            left = time_limit_s - spent if spent < time_limit_s else min(time_limit_s, 1e-3)
            sol = solve_budget(prob, budget * GIB, time_limit_s=left, mip_rel_gap=mip_rel_gap)
        min_budget = _min_feasible(prob) if sol.status == "infeasible" else None
        p = _to_plan(prob, sol, budget, world_size, baseline, time.perf_counter() - started, min_budget)
        plans.append(p)
        if progress:
            progress(i, len(budgets), p)
    return plans


def _as_stats(stats: Stats | Mapping[str, Any] | str | os.PathLike) -> Stats:
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


def _validate(budgets_gib, budgets_name, world_size, time_limit_s, mip_rel_gap, reserve_gib) -> list[float]:
    if isinstance(budgets_gib, (str, bytes)) or not isinstance(budgets_gib, Sequence):
        raise ValueError(f"{budgets_name} must be a list of numbers of GiB, got {budgets_gib!r}")
    budgets = []
    for k, b in enumerate(budgets_gib):
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b <= 0:
            where = budgets_name if budgets_name == "memory_budget_gib" else f"{budgets_name}[{k}]"
            raise ValueError(f"{where} must be a positive number of GiB, got {b!r}")
        budgets.append(float(b))
    if not budgets:
        raise ValueError(f"{budgets_name} is empty")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if not isinstance(time_limit_s, (int, float)) or not math.isfinite(time_limit_s) or time_limit_s <= 0:
        raise ValueError(f"time_limit_s must be a positive number of seconds, got {time_limit_s!r}")
    if not isinstance(mip_rel_gap, (int, float)) or not 0 <= mip_rel_gap < 1:
        raise ValueError(f"mip_rel_gap must be in [0, 1), got {mip_rel_gap!r}")
    if (isinstance(reserve_gib, bool) or not isinstance(reserve_gib, (int, float)) or not math.isfinite(reserve_gib)
            or not 0 <= reserve_gib <= MAX_BYTES / GIB):
        raise ValueError(f"reserve_gib must be a number of GiB from 0 to {MAX_BYTES // GIB}, got {reserve_gib!r}")
    return budgets


def _min_feasible(prob: Problem) -> float:
    """The smallest budget with a plan (exact, rounded up to a readable figure that still fits)."""
    return _round_up(solve_min_peak_dp(prob).peak_bytes / GIB)


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


def _to_plan(prob: Problem, sol: Solution, budget: float, world_size: int, baseline: int,
             seconds: float, min_budget: float | None) -> Plan:
    modules = []
    for fqn in prob.stats.fw_pre_order:
        if not sol.decisions or fqn not in sol.decisions:
            continue
        save, saved_bytes, _ = sol.decisions[fqn]
        m = prob.stats.module(fqn)
        total = m.op_bytes
        modules.append(PlannedModule(
            fqn=fqn,
            discard_ratio=1.0 - saved_bytes / total if total else 0.0,
            discarded_bytes=m.act_saved_bytes - saved_bytes,
            saved_bytes=saved_bytes,
            # summed from the save list itself (not total - saved: that leaves float noise where nothing is recomputed)
            recompute_ms=math.fsum(op.runtime_ms for op, s in zip(m.ops, save) if not s),
            save=save,
            op_names=[op.name for op in m.ops],
        ))
    recompute_ms = sol.recompute_ms
    if recompute_ms is not None and modules:
        recompute_ms = math.fsum(pm.recompute_ms for pm in modules)
    message = sol.message
    if sol.status == "infeasible" and min_budget is not None:
        message = f"no plan fits {budget:g} GiB; the smallest budget with a plan is {min_budget:g} GiB"
        if not prob.candidates:
            message += (" (no module can be checkpointed: that takes a non-leaf module with op stats, other than "
                         "the root, that frees memory, is among ac_units when given and encloses no FSDP unit)")
    return Plan(
        status=sol.status,
        message=message,
        memory_budget_gib=budget,
        world_size=world_size,
        peak_bytes=None if sol.peak_bytes is None else int(math.ceil(sol.peak_bytes)),
        recompute_ms=recompute_ms,
        baseline_peak_bytes=baseline,
        compute_ms=compute_ms(prob.stats),
        solve_seconds=seconds,
        mip_gap=sol.mip_gap,
        planner_version=PLANNER_VERSION,
        min_feasible_budget_gib=min_budget,
        modules=modules,
    )

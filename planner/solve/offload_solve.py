"""Planning with offload (``offload='on'``): the one entry point every budget goes through.

The MILP with its offload columns (:mod:`planner.solve.milp_offload`), its plan then trimmed of the offloads
the budget does not need (:func:`trim_offloads`). On stacks of identical blocks faster engines go in front of it:
the count-space stack relaxation (:mod:`planner.solve.stack.offload_stack`), then, where its early credit of
offloads binds, the split (:mod:`planner.solve.stack.offload_split`: the first blocks in count space, the last
ones exactly). Each returns plans built by ``Solution.planned(..., offload=...)`` (so peak, recompute and stall
are derived from their lists) with a bound, or None to leave the budget to the MILP.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from planner.solve.dp import solve_dp
from planner.solve.milp import solve_budget
from planner.solve.offload import HostLinkFigures, offload_plan, offload_setup
from planner.solve.problem import Problem
from planner.solve.solution import Solution, discards, save_lists
from planner.solve.stack.offload_split import split_first
from planner.solve.stack.offload_stack import StackOffloadResult, stack_first, with_milp
from planner.stats.op_format import OpStats

__all__ = ["solve_with_offload", "trim_offloads", "drop_unread_offloads", "unread_ops"]


def solve_with_offload(prob: Problem, budget_bytes: float, link: HostLinkFigures, *, time_limit_s: float,
                       mip_rel_gap: float, host_budget_bytes: float | None = None) -> Solution:
    """Least recompute + offload stall with peak <= ``budget_bytes``: each free op group of a checkpointed module
    saved, recomputed or offloaded over ``link`` (the windows and options: :func:`offload_setup`, built once per
    problem and link), at most ``host_budget_bytes`` offloaded in all (None: no cap).

    The stack engines do not see the cap: their bounds stay bounds (a relaxation of the capped problem), and a
    plan of theirs counts only when, trimmed, it offloads no more than the cap; the MILP holds it as a row."""
    setup = offload_setup(prob, link)
    deadline = time.perf_counter() + time_limit_s
    # stacks of 16+ blocks: the count-space relaxation first (planner.solve.stack.offload_stack)
    # (not with modules offloading per call: the stack engines know the windows only, the MILP both)
    stacked = None if setup.per_call else _capped(
        prob, stack_first(prob, setup, budget_bytes, mip_rel_gap=mip_rel_gap, deadline=deadline), budget_bytes,
        host_budget_bytes)
    if stacked is not None and not _proven(stacked):  # where the early credit binds: the last blocks exactly
        stacked = _capped(prob, split_first(prob, setup, stacked, budget_bytes, mip_rel_gap=mip_rel_gap,
                                            deadline=deadline), budget_bytes, host_budget_bytes)
    if stacked is not None and _proven(stacked):
        return stacked.plan
    left = max(deadline - time.perf_counter(), 0.01)  # the MILP gets what is left, and the stack's bound
    sol = solve_budget(prob, budget_bytes, time_limit_s=left, mip_rel_gap=mip_rel_gap, offload=setup,
                       host_budget_bytes=host_budget_bytes)
    if sol.decisions is None and sol.status in ("time_limit", "error") and host_budget_bytes is not None:
        sol = _without_offload(prob, setup, budget_bytes, sol, mip_rel_gap, deadline)
    return _finished(prob, sol if stacked is None else with_milp(stacked, sol, mip_rel_gap), budget_bytes)


def _credited_times(prob: Problem, off, fqn: str) -> np.ndarray:
    """Per moment, how many times a byte ``fqn`` offloads is off the device: once from its window's credit key
    on; per call (a module called more than once) wherever each call's discard is."""
    model = prob.model
    if fqn in off.calls:
        return (model.keys > model.post_pos[fqn]).astype(float) + model.repeats.get(fqn, 0.0)
    j = int(np.searchsorted(off.windows.end_pos, model.post_pos[fqn], side="left"))
    return (model.keys >= off.windows.credit_key[j]).astype(float)


def _without_offload(prob: Problem, setup, budget_bytes: float, sol: Solution, mip_rel_gap: float,
                     deadline: float) -> Solution:
    """Under a host memory cap, where the MILP found no plan in time: the best plan offloading nothing (the exact
    DP of offload='off', fast on stacks), which meets any cap, "feasible" against the MILP's bound; else ``sol``."""
    off = solve_dp(prob, budget_bytes, time_limit_s=max(deadline - time.perf_counter(), 1.0), mip_rel_gap=mip_rel_gap)
    if off is None or off.decisions is None:
        return sol
    bound = sol.lower_bound
    cost = off.recompute_ms
    gap = 1.0 if bound is None or cost <= 0 else min(1.0, max(cost - bound, 0.0) / cost)
    return Solution.planned(prob, off.decisions, "feasible", "the best plan offloading nothing (the MILP with the "
                            "host memory cap found no plan in time); gap against the MILP's bound", gap, bound,
                            offload_plan(prob, setup.windows, {}))


def unread_ops(ops: Sequence[OpStats], save: Sequence[int]) -> set[int]:
    """The ops of a checkpointed module, with save list ``save`` (1: saved or offloaded), whose outputs the
    compiled backward never reads: no storage of theirs is saved for the backward (``storages``,
    ``saved_by_autograd``) and no taker it recomputes (``compiled_takers``, a taker not saved) needs them.
    Empty when the stats do not say (eager stats: no ``compiled_takers``)."""
    if any(op.compiled_takers is None for op in ops):
        return set()
    needed = [False] * len(ops)
    for k in range(len(ops) - 1, -1, -1):
        op = ops[k]
        needed[k] = op.saved_by_autograd or any(saved for _, _, saved in op.storages or ()) or any(
            needed[j] and not save[j] for j in op.compiled_takers)
    return {k for k, read in enumerate(needed) if not read}


def drop_unread_offloads(prob: Problem, sol: Solution, budget_bytes: float) -> Solution:
    """``sol`` with each offloaded op group no compiled backward reads (:func:`unread_ops`, given the plan's other
    decisions) recomputed instead: the partitioner saves nothing of it, so it would be copied to host memory and
    let go unread; tagged for recompute it is freed after its last forward use, which the discard counts from the
    module's forward end. Its ms count as recomputed, as the plan's figures count every op it does not save
    (nothing recomputes it: an over-estimate). Kept as it was where the plan's peak would rise over the budget (a
    recompute transient the memory model adds)."""
    off = sol.offload
    if off is None or not off.modules or sol.decisions is None:
        return sol
    decisions, lists = dict(sol.decisions), {fqn: list(v) for fqn, v in off.modules.items()}
    cand_of = {c.fqn: c for c in prob.candidates}
    changed = False
    for fqn, offload in lists.items():
        save, saved_bytes, saved_ms = decisions[fqn]
        unread = unread_ops(prob.stats.module(fqn).ops or [], save)
        groups = cand_of[fqn].classes.groups
        new_save = list(save)
        for g, members in enumerate(groups.members):
            if all(offload[k] for k in members) and unread.issuperset(members):
                for k in members:
                    offload[k] = new_save[k] = 0
                saved_bytes -= int(groups.group_bytes[g])
                saved_ms -= float(groups.group_ms[g])
                changed = True
        decisions[fqn] = (new_save, saved_bytes, saved_ms)
    if not changed:
        return sol
    kept = offload_plan(prob, off.windows, {f: v for f, v in lists.items() if any(v)})
    dropped = Solution.planned(prob, decisions, sol.status, sol.message, sol.mip_gap or 0.0, sol.lower_bound, kept)
    return dropped if dropped.peak_bytes <= max(budget_bytes, sol.peak_bytes) else sol


def _finished(prob: Problem, sol: Solution, budget_bytes: float) -> Solution:
    """An engine's plan without the offloads no compiled backward reads, then trimmed (:func:`trim_offloads`)."""
    return trim_offloads(prob, drop_unread_offloads(prob, sol, budget_bytes), budget_bytes)


def _proven(stacked: StackOffloadResult) -> bool:
    return stacked.plan is not None and stacked.plan.status == "optimal"


def _capped(prob: Problem, stacked: StackOffloadResult | None, budget_bytes: float,
            host_budget_bytes: float | None) -> StackOffloadResult | None:
    """A stack engine's answer with its plan trimmed (:func:`trim_offloads`), and dropped (its bound kept) where
    it still offloads more than the host memory cap."""
    if stacked is None or stacked.plan is None:
        return stacked
    plan = _finished(prob, stacked.plan, budget_bytes)
    host = 0 if plan.offload is None else plan.offload.host_bytes
    if host_budget_bytes is not None and host > host_budget_bytes:
        return StackOffloadResult(stacked.lower)
    return StackOffloadResult(stacked.lower, plan)


def trim_offloads(prob: Problem, sol: Solution, budget_bytes: float) -> Solution:
    """``sol`` without the offloads its budget does not need: an offloaded op group whose bytes fit the room
    left at every moment its window's credit covers stays on the device instead (still saved). Recompute is
    unchanged and stall cannot grow (it only grows with a window's bytes), so the plan is as good, with less
    host memory and fewer copies; an engine's ties otherwise offload whatever costs nothing.
    """
    off = sol.offload
    if off is None or not off.modules or sol.decisions is None:
        return sol
    model, windows = prob.model, off.windows
    disc, saves = discards(prob, sol.decisions), save_lists(sol.decisions)
    credits = off.credits
    # the plan's memory as its peak counts it and as the engines' needs do (held inputs once per holder)
    room = budget_bytes - np.maximum(model.profile_bytes(disc, saves=saves, offloaded=credits),
                                     model.profile_bytes(disc, shared_once=False, offloaded=credits))
    cand_of = {c.fqn: c for c in prob.candidates}
    lists = {fqn: list(v) for fqn, v in off.modules.items()}
    for fqn in sorted(lists, key=model.post_pos.__getitem__):
        times = _credited_times(prob, off, fqn)
        at = times > 0
        ops = prob.stats.module(fqn).ops or []
        groups = [g for g in cand_of[fqn].classes.groups.members if lists[fqn][g[0]]]
        for group in sorted(groups, key=lambda g: -sum(ops[k].output_bytes for k in g)):
            nbytes = sum(ops[k].output_bytes for k in group)
            if not at.any() or bool(np.all(nbytes * times[at] <= room[at])):
                for k in group:
                    lists[fqn][k] = 0
                room[at] -= nbytes * times[at]
    kept = offload_plan(prob, windows, {f: v for f, v in lists.items() if any(v)})
    return Solution.planned(prob, sol.decisions, sol.status, sol.message, sol.mip_gap or 0.0, sol.lower_bound,
                            kept)

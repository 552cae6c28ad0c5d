"""Planning with offload (``offload='on'``): the one entry point every budget goes through.

Today it is the MILP with its offload columns (:mod:`planner.solve.milp_offload`), its plan then trimmed of
the offloads the budget does not need (:func:`trim_offloads`). A faster engine (the count-space stack
relaxation) goes in front of the MILP here: it must return a :class:`Solution` built by
``Solution.planned(..., offload=...)`` (so peak, recompute and stall are derived from its lists), or None to
leave the budget to the MILP.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from planner.solve.milp import solve_budget
from planner.solve.offload import HostLinkFigures, offload_plan, offload_setup
from planner.solve.problem import Problem
from planner.solve.solution import Solution, discards, save_lists
from planner.solve.stack.offload_stack import stack_first, with_milp
from planner.stats.op_format import OpStats

__all__ = ["solve_with_offload", "trim_offloads", "drop_unread_offloads", "unread_ops"]


def solve_with_offload(prob: Problem, budget_bytes: float, link: HostLinkFigures, *, time_limit_s: float,
                       mip_rel_gap: float) -> Solution:
    """Least recompute + offload stall with peak <= ``budget_bytes``: each free op group of a checkpointed module
    saved, recomputed or offloaded over ``link`` (the windows and options: :func:`offload_setup`, built once per
    problem and link)."""
    setup = offload_setup(prob, link)
    deadline = time.perf_counter() + time_limit_s
    # stacks of 16+ blocks: the count-space relaxation first (planner.solve.stack.offload_stack)
    stacked = stack_first(prob, setup, budget_bytes, mip_rel_gap=mip_rel_gap, deadline=deadline)
    if stacked is not None and stacked.plan is not None and stacked.plan.status == "optimal":
        return trim_offloads(prob, drop_unread_offloads(prob, stacked.plan, budget_bytes), budget_bytes)
    left = max(deadline - time.perf_counter(), 0.01)  # the MILP gets what is left, and the stack's bound
    sol = solve_budget(prob, budget_bytes, time_limit_s=left, mip_rel_gap=mip_rel_gap, offload=setup)
    sol = sol if stacked is None else with_milp(stacked, sol, mip_rel_gap)
    return trim_offloads(prob, drop_unread_offloads(prob, sol, budget_bytes), budget_bytes)


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
        j = int(np.searchsorted(windows.end_pos, model.post_pos[fqn], side="left"))
        at = model.keys >= windows.credit_key[j]
        ops = prob.stats.module(fqn).ops or []
        groups = [g for g in cand_of[fqn].classes.groups.members if lists[fqn][g[0]]]
        for group in sorted(groups, key=lambda g: -sum(ops[k].output_bytes for k in g)):
            nbytes = sum(ops[k].output_bytes for k in group)
            if not at.any() or nbytes <= float(room[at].min()):
                for k in group:
                    lists[fqn][k] = 0
                room[at] -= nbytes
    kept = offload_plan(prob, windows, {f: v for f, v in lists.items() if any(v)})
    return Solution.planned(prob, sol.decisions, sol.status, sol.message, sol.mip_gap or 0.0, sol.lower_bound,
                            kept)

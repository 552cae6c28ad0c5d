"""Planning with offload (``offload='on'``): the one entry point every budget goes through.

Today it is the MILP with its offload columns (:mod:`planner.solve.milp_offload`). A faster engine (the
count-space stack relaxation) goes in front of it here: it must return a :class:`Solution` built by
``Solution.planned(..., offload=...)`` (so peak, recompute and stall are derived from its lists), or None to
leave the budget to the MILP.
"""

from __future__ import annotations

import time

from planner.solve.milp import solve_budget
from planner.solve.offload import HostLinkFigures, offload_setup
from planner.solve.problem import Problem
from planner.solve.solution import Solution
from planner.solve.stack.offload_stack import stack_first, with_milp

__all__ = ["solve_with_offload"]


def solve_with_offload(prob: Problem, budget_bytes: float, link: HostLinkFigures, *, time_limit_s: float,
                       mip_rel_gap: float) -> Solution:
    """Least recompute + offload stall with peak <= ``budget_bytes``: each free op group of a checkpointed module
    saved, recomputed or offloaded over ``link`` (the windows and options: :func:`offload_setup`, built once per
    problem and link)."""
    setup = offload_setup(prob, link)
    deadline = time.perf_counter() + time_limit_s
    stacked = stack_first(prob, setup, budget_bytes, mip_rel_gap=mip_rel_gap, deadline=deadline)
    if stacked is not None and stacked.plan is not None and stacked.plan.status == "optimal":
        return stacked.plan
    left = max(deadline - time.perf_counter(), 0.01)  # the MILP gets what is left, and the stack's bound
    sol = solve_budget(prob, budget_bytes, time_limit_s=left, mip_rel_gap=mip_rel_gap, offload=setup)
    return sol if stacked is None else with_milp(stacked, sol, mip_rel_gap)

"""The op-level policy: which ops of one module to save, for a fraction of its op memory.

This is what ``optimal_op_policy`` answers for one module on its own (PyTorch's
``sac_milp`` asks a fitted curve the same question); the module-level planner
uses the whole frontier instead.
"""

from __future__ import annotations

import math
from typing import Any

from planner.ops.frontier import FrontierTooLarge, as_op_list, module_frontier
from planner.ops.groups import op_groups
from planner.ops.knapsack import best_saved_within, group_classes

__all__ = ["optimal_op_policy"]

_POLICY_FRONTIER_LIMIT = 200_000


def optimal_op_policy(op_stats: Any, memory_budget: float, *, force_store_random: bool | None = None) -> list[int]:
    """Save (1) / recompute (0) per op, saving the most runtime within the budget.

    Parameters
    ----------
    op_stats
        One module's ops: a list of :class:`OpStats` (or dicts of that shape),
        or PyTorch's ``SACStats`` (object or dict).
    memory_budget
        Fraction in [0, 1] of the module's total op output bytes that may be
        kept: saved bytes <= ``ceil(memory_budget * total)``.
    force_store_random
        Overrides the flag carried by a ``SACStats``; default False for op lists.

    Raises
    ------
    ValueError
        If ``memory_budget`` is outside [0, 1], the ops contradict the SAC
        rules, or the ops that must be saved alone exceed the budget.
    """
    if not isinstance(memory_budget, (int, float)) or not 0 <= memory_budget <= 1:
        raise ValueError(f"memory_budget must be a fraction in [0, 1], got {memory_budget!r}")
    ops, fsr = as_op_list(op_stats, force_store_random)
    total = sum(op.output_bytes for op in ops)
    cap = math.ceil(memory_budget * total)
    try:
        frontier = module_frontier(ops, fsr, max_points=_POLICY_FRONTIER_LIMIT)
    except FrontierTooLarge:
        classes = group_classes(op_groups(ops, fsr))
        counts = best_saved_within(classes, cap)
        if counts is None:
            raise ValueError(_over_budget(memory_budget, cap, classes.always_saved_bytes)) from None
        return classes.save_list(counts)
    k = frontier.best_within(cap)
    if k < 0:
        raise ValueError(_over_budget(memory_budget, cap, int(frontier.saved_bytes[0])))
    return frontier.save_list(k)


def _over_budget(memory_budget: float, cap: int, forced: int) -> str:
    return (f"memory_budget {memory_budget!r} allows {cap} bytes but the ops that must be saved "
            f"take {forced} bytes")

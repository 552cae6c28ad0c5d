"""Modules too long to list (one spanning a whole model): the part of their frontier a budget can use.

A checkpointed candidate c blocks its whole subtree, so the keys from its
subtree's start to c itself see only the discards of candidates before that
start: if their largest possible sum cannot meet a need there, c is never
part of a plan. Otherwise c's discard only helps keys after c, so no plan
uses more of it than the largest need after c, and the frontier capped there
(:func:`planner.ops.frontier.capped_frontier`) holds every point a plan can
use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.memory_model import NEED_TOL_BYTES
from planner.ops.frontier import FrontierTooLarge, capped_frontier
from planner.ops.knapsack import GroupClasses, best_saved_within
from planner.solve.problem import FRONTIER_LIMIT, Frontiers, Problem

__all__ = ["Points", "cheapest_discarding", "for_budget"]


@dataclass
class Points:
    """A few decisions of one module, shaped like a :class:`planner.ops.frontier.Frontier`."""

    saved_bytes: np.ndarray
    saved_ms: np.ndarray
    lists: list[list[int]]

    def __len__(self) -> int:
        return len(self.saved_bytes)

    def save_list(self, k: int) -> list[int]:
        return self.lists[k]


def for_budget(prob: Problem, fr: Frontiers, keyneed: np.ndarray) -> Frontiers | None:
    """``fr`` with its giant candidates' usable points listed for this budget; None if still too many."""
    if not fr.giants:
        return fr
    out = fr.with_points(list(fr.d), list(fr.rc), list(fr.point))
    out.capped = {}
    most = np.concatenate([[0], np.cumsum(np.asarray(fr.max_d, dtype=np.float64))])  # over-estimates: nesting ignored
    for i, fqn in fr.giants.items():
        a = fr.starts[i]
        after = keyneed[i + 1:]
        cap = float(np.max(after))
        if float(np.max(keyneed[a:i + 1])) > most[a] + NEED_TOL_BYTES or cap <= 0:
            continue  # never part of a plan at this budget: no points
        # Less than this discard leaves some key after i short whatever the others discard.
        least = float(np.max(after - most[a] - (most[i + 1:] - most[i + 1])))
        m = prob.stats.module(fqn)
        ia = prob.candidates[i].act_saved_bytes  # what checkpointing it can free
        if least >= cap - NEED_TOL_BYTES:  # one useful point: the cheapest decision discarding at least cap
            f = cheapest_discarding(prob.candidates[i].classes, ia, cap)
        else:
            try:
                f = capped_frontier(m.recompute_ops, m.force_store_random, act_saved_bytes=ia,
                                    max_discard_bytes=cap, max_points=FRONTIER_LIMIT,
                                    groups=prob.candidates[i].classes.groups)
            except FrontierTooLarge:
                return None
        d = ia - f.saved_bytes[::-1]
        keep = d > 0
        rc = prob.candidates[i].cost(m.op_ms - f.saved_ms[::-1])
        out.d[i], out.rc[i] = d[keep].astype(np.int64), rc[keep]
        out.point[i] = np.arange(len(f))[::-1][keep]
        out.capped[i] = f
    return out


def cheapest_discarding(classes: GroupClasses, act_saved_bytes: int, cap: float) -> Points:
    """The decision recomputing least among those discarding at least ``cap`` bytes (no point if there is none).

    One exact integer program over op-group classes (interchangeable groups
    counted): :func:`planner.ops.knapsack.best_saved_within`.
    """
    counts = best_saved_within(classes, math.floor(act_saved_bytes - cap))
    if counts is None:
        return Points(np.zeros(0, np.int64), np.zeros(0), [])
    saved_bytes = classes.always_saved_bytes + int(counts @ classes.class_bytes)
    saved_ms = classes.always_saved_ms + float(counts @ classes.class_ms)
    return Points(np.array([saved_bytes], np.int64), np.array([saved_ms]), [classes.save_list(counts)])

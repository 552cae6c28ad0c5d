"""The exact memory/recompute trade-off of one module: its frontier of non-dominated op decisions.

Ops tied by the SAC conventions form groups (:mod:`planner.ops.groups`);
each group is saved or recomputed as a whole. Choosing which free groups to
save is a 0/1 knapsack (bytes kept vs. runtime not recomputed). It is solved
exactly by building the full Pareto frontier with the Nemhauser-Ullmann list
merge: every non-dominated (saved bytes, saved ms) pair, each with the save
list that realizes it. No curve fitting, no solver tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.ops.groups import FREE, SAVE, OpGroups, op_groups, settle_trivial
from planner.stats.format import OpStats
from planner.stats.torch_format import ops_from_torch

__all__ = ["Frontier", "FrontierTooLarge", "as_op_list", "capped_frontier", "frontier_hull", "max_discard_decision",
           "module_frontier"]


class FrontierTooLarge(RuntimeError):
    """The frontier has more points than the caller allowed."""


def _rounding_to_zero(ms: float, total_ms: float) -> float:
    """0 for a difference within float rounding of the module's total (1e-9 of it), else the difference."""
    return 0.0 if ms <= 1e-9 * abs(total_ms) else ms


@dataclass(frozen=True)
class Frontier:
    """Every non-dominated (saved bytes, saved ms) decision of one module.

    Points are sorted by ``saved_bytes`` ascending; ``saved_ms`` rises
    strictly with it, so ``recompute_ms`` falls strictly.
    """

    saved_bytes: np.ndarray  # int64, includes ops that are always saved
    saved_ms: np.ndarray  # float64
    total_bytes: int
    total_ms: float
    groups: OpGroups
    merge_order: np.ndarray  # indices of the free groups, in merge order
    steps: tuple[tuple[np.ndarray, np.ndarray], ...]  # per merge: (source index, took the group)
    took_recomputes: bool = False  # "took" = recomputed (capped_frontier) instead of saved

    def __len__(self) -> int:
        return len(self.saved_bytes)

    def __repr__(self) -> str:  # one line, not the arrays
        # total - saved leaves float noise (4.441e-16 ms) where nothing is recomputed: shown as 0
        most, least = (_rounding_to_zero(float(self.recompute_ms[k]), self.total_ms) for k in (0, -1))
        return (f"Frontier({len(self)} points over {len(self.groups.members)} op groups: from saving "
                f"{int(self.saved_bytes[0]):,} bytes and recomputing {most:.4g} ms to saving "
                f"{int(self.saved_bytes[-1]):,} of {self.total_bytes:,} bytes and recomputing {least:.4g} ms)")

    @property
    def recompute_ms(self) -> np.ndarray:
        return self.total_ms - self.saved_ms

    def best_within(self, max_saved_bytes: float) -> int:
        """Index of the point saving the most runtime within ``max_saved_bytes``; -1 if none."""
        return int(np.searchsorted(self.saved_bytes, max_saved_bytes, side="right")) - 1

    def save_list(self, k: int) -> list[int]:
        """The per-op 0/1 save decisions realizing point ``k``."""
        g = self.groups
        group_save = np.where(g.fixed == SAVE, 1, 0).astype(np.int8)
        if self.took_recomputes:
            group_save[self.merge_order] = 1
        idx = k
        for step in range(len(self.steps) - 1, -1, -1):
            src, took = self.steps[step]
            if took[idx]:
                group_save[self.merge_order[step]] = 0 if self.took_recomputes else 1
            idx = int(src[idx])
        return g.op_decisions(group_save)


def as_op_list(op_stats: Any, force_store_random: bool | None) -> tuple[list[OpStats], bool]:
    """One module's ops as :class:`OpStats`, from a list (of OpStats or dicts) or PyTorch's ``SACStats``."""
    if isinstance(op_stats, Mapping) or hasattr(op_stats, "func_names"):
        ops, fsr = ops_from_torch(op_stats)
        return ops, fsr if force_store_random is None else force_store_random
    ops = [op if isinstance(op, OpStats) else OpStats.model_validate(op) for op in op_stats]
    return ops, bool(force_store_random)


@dataclass(frozen=True)
class _Items:
    groups: OpGroups  # trivial decisions fixed
    items: np.ndarray  # the free groups, big first
    base_bytes: int  # always-saved bytes
    base_ms: float  # always-saved ms
    total_ms: float


def _knapsack_items(ops: Sequence[OpStats], fsr: bool, groups: OpGroups | None = None) -> _Items:
    """The groups with trivial decisions fixed, the free groups (big first), and the always-saved bytes/ms.

    ``groups``: the ops' groups when the caller has them (settled or not: settling is idempotent)."""
    if groups is None:
        groups = op_groups(ops, fsr)
    always = groups.fixed == SAVE
    base_bytes = int(groups.group_bytes[always].sum())
    base_ms = float(groups.group_ms[always].sum())
    groups, zero_bytes = settle_trivial(groups)
    base_ms += float(groups.group_ms[zero_bytes].sum())
    items = np.flatnonzero(groups.fixed == FREE)
    # Big items first keeps the intermediate lists short.
    items = items[np.lexsort((-groups.group_ms[items], -groups.group_bytes[items]))]
    return _Items(groups, items, base_bytes, base_ms, math.fsum(op.runtime_ms for op in ops))


def _merge(k: _Items, sign: int, max_points: int | None, keep_above: float | None = None):
    """The Nemhauser-Ullmann merge over the free groups.

    ``sign`` +1: start from "save nothing free", each step may save a group;
    -1: start from "save every free group", each step may recompute one.
    Returns (bytes moved, ms moved, steps), points by saved bytes ascending.
    With ``keep_above`` (sign -1), points recomputing more than that many
    bytes collapse to the cheapest one (the others are dominated past a cap).
    """
    tol = 1e-12 * (abs(k.total_ms) + 1.0)
    w = np.zeros(1, dtype=np.int64)  # bytes moved so far
    v = np.zeros(1, dtype=np.float64)  # ms moved so far
    steps = []
    for g in k.items:
        cw = np.concatenate([w, w + k.groups.group_bytes[g]])
        cv = np.concatenate([v, v + k.groups.group_ms[g]])
        src = np.concatenate([np.arange(len(w)), np.arange(len(w))])
        took = np.concatenate([np.zeros(len(w), bool), np.ones(len(w), bool)])
        order = np.lexsort((-sign * cv, sign * cw))  # saved bytes ascending; most saved ms first among equals
        cw, cv, src, took = cw[order], cv[order], src[order], took[order]
        best_before = np.maximum.accumulate(sign * cv)
        keep = np.ones(len(cv), bool)
        keep[1:] = sign * cv[1:] > best_before[:-1] + tol
        cw, cv, src, took = cw[keep], cv[keep], src[keep], took[keep]
        if keep_above is not None:  # recomputed bytes descend: keep the last point at or past the cap on
            first = max(int(np.sum(cw >= keep_above)) - 1, 0)
            cw, cv, src, took = cw[first:], cv[first:], src[first:], took[first:]
        w, v = cw, cv
        steps.append((src, took))
        if max_points is not None and len(w) > max_points:
            raise FrontierTooLarge(f"frontier {'below the cap ' if keep_above is not None else ''}"
                                   f"exceeds {max_points} points")
    return w, v, tuple(steps)


def module_frontier(
    op_stats: Any, force_store_random: bool | None = None, *, max_points: int | None = None,
    max_items: int | None = None, groups: OpGroups | None = None,
) -> Frontier:
    """The exact memory/recompute trade-off frontier of one module's ops.

    ``op_stats`` is a list of :class:`OpStats` (or dicts of that shape), or a
    PyTorch ``SACStats`` object or dict. Every valid decision is dominated by
    (or equal to) a point of the result. Raises :class:`FrontierTooLarge` when
    the list grows past ``max_points``, or at once when there are more than
    ``max_items`` free op groups to decide. ``groups``: the ops' groups, when
    the caller has them already.
    """
    if max_items is not None and groups is not None:  # told from the groups alone: a giant's ops are not read
        free = groups.fixed == FREE
        gb = groups.group_bytes
        n_items = int(np.count_nonzero(free & (gb != 0) & ~((gb > 0) & (groups.group_ms <= 0))))
        if n_items > max_items:  # the groups settle_trivial leaves free: what _knapsack_items would count
            raise FrontierTooLarge(f"{n_items} free op groups exceed {max_items}")
    ops, fsr = as_op_list(op_stats, force_store_random)
    k = _knapsack_items(ops, fsr, groups)
    if max_items is not None and len(k.items) > max_items:
        raise FrontierTooLarge(f"{len(k.items)} free op groups exceed {max_items}")
    w, v, steps = _merge(k, +1, max_points)
    return Frontier(saved_bytes=w + k.base_bytes, saved_ms=v + k.base_ms,
                    total_bytes=int(k.groups.group_bytes.sum()), total_ms=k.total_ms, groups=k.groups,
                    merge_order=k.items, steps=steps)


def capped_frontier(
    op_stats: Any, force_store_random: bool | None = None, *, act_saved_bytes: int, max_discard_bytes: float,
    max_points: int | None = None, groups: OpGroups | None = None,
) -> Frontier:
    """The frontier's points that discard less than ``max_discard_bytes``, and the cheapest one discarding at least that.

    Discard is ``act_saved_bytes`` minus the saved bytes. When no plan can use
    more than ``max_discard_bytes`` of a module's discard, every other point
    is dominated by the cap point, so this is all the module's frontier a plan
    needs; for a module spanning a whole model it is far shorter. The merge
    runs from "save every free group" and recomputes groups one by one, so
    discard only grows along it and partial decisions already past the cap
    collapse to the cheapest one. Raises :class:`FrontierTooLarge` past
    ``max_points``. ``groups`` as for :func:`module_frontier`.
    """
    ops, fsr = as_op_list(op_stats, force_store_random)
    k = _knapsack_items(ops, fsr, groups)
    all_saved = k.base_bytes + int(k.groups.group_bytes[k.items].sum())
    headroom = float(max_discard_bytes) - (act_saved_bytes - all_saved)  # recomputed bytes reaching the cap
    r, c, steps = _merge(k, -1, max_points, keep_above=headroom)
    saved_ms_all = k.base_ms + float(k.groups.group_ms[k.items].sum())
    return Frontier(saved_bytes=all_saved - r, saved_ms=saved_ms_all - c,
                    total_bytes=int(k.groups.group_bytes.sum()), total_ms=k.total_ms, groups=k.groups,
                    merge_order=k.items, steps=steps, took_recomputes=True)


def frontier_hull(op_stats: Any, force_store_random: bool | None = None, *,
                  act_saved_bytes: int, groups: OpGroups | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Lower convex hull of a module's (discarded bytes, recompute ms) decisions, without listing them.

    The hull of 0/1 choices is traced by recomputing groups in increasing ms
    per byte (the fractional knapsack): its vertices are those prefixes.
    Returns the vertices with positive discard, as (bytes, ms) arrays.
    ``groups`` as for :func:`module_frontier`.
    """
    ops, fsr = as_op_list(op_stats, force_store_random)
    k = _knapsack_items(ops, fsr, groups)
    groups, items = k.groups, k.items
    all_saved = k.base_bytes + int(groups.group_bytes[items].sum())
    rc0 = k.total_ms - (float(groups.group_ms[groups.fixed == SAVE].sum()) + float(groups.group_ms[items].sum()))
    gb, gm = groups.group_bytes[items], groups.group_ms[items]
    order = np.argsort(gm / gb, kind="stable")
    d = act_saved_bytes - all_saved + np.concatenate([[0], np.cumsum(gb[order])])
    rc = rc0 + np.concatenate([[0.0], np.cumsum(gm[order])])
    keep = d > 0
    return d[keep].astype(np.int64), rc[keep]


def max_discard_decision(op_stats: Any, force_store_random: bool | None = None) -> tuple[list[int], int, float]:
    """The decision discarding the most, at the least recompute: (save list, saved bytes, saved ms)."""
    ops, fsr = as_op_list(op_stats, force_store_random)
    groups = _knapsack_items(ops, fsr).groups
    save = (groups.fixed == SAVE).astype(np.int8)
    return (groups.op_decisions(save), int(groups.group_bytes[save == 1].sum()),
            float(groups.group_ms[save == 1].sum()))

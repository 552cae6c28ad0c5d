"""Op-level SAC decisions: the exact save/recompute trade-off of one module.

The SAC conventions (PyTorch's and xformers'):

* view-like ops are always recomputed;
* an in-place op shares the decision of the op whose output it mutates, and
  one that mutates a module input (its own parent) is always saved;
* random ops are all saved or all recomputed together (recomputing only some
  would replay the RNG out of step), and all saved when ``force_store_random``.

Ops tied by these rules form *groups*; each group is saved or recomputed as a
whole. Choosing which free groups to save is a 0/1 knapsack (bytes kept vs.
runtime not recomputed). We solve it exactly by building the full Pareto
frontier with the Nemhauser-Ullmann list merge: every non-dominated
(saved bytes, saved ms) pair, each with the save list that realizes it.
No curve fitting, no solver tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.stats import OpStats
from planner.torch_format import ops_from_torch

__all__ = ["OpGroups", "Frontier", "FrontierTooLarge", "capped_frontier", "frontier_hull", "max_discard_decision",
           "op_groups", "module_frontier", "optimal_op_policy"]

FREE, RECOMPUTE, SAVE = -1, 0, 1


class FrontierTooLarge(RuntimeError):
    """The frontier has more points than the caller allowed."""


@dataclass(frozen=True)
class OpGroups:
    """Ops tied together by the SAC conventions."""

    members: tuple[tuple[int, ...], ...]
    group_bytes: np.ndarray  # int64 per group
    group_ms: np.ndarray  # float64 per group
    fixed: np.ndarray  # int8 per group: FREE, RECOMPUTE or SAVE
    n_ops: int

    def op_decisions(self, group_save: np.ndarray) -> list[int]:
        """Per-op 0/1 decisions from one 0/1 decision per group."""
        out = [0] * self.n_ops
        for gi, members in enumerate(self.members):
            if group_save[gi]:
                for op in members:
                    out[op] = 1
        return out


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
    _groups: OpGroups
    _free: np.ndarray  # indices of free groups, in merge order
    _steps: tuple[tuple[np.ndarray, np.ndarray], ...]  # per merge: (source index, took item)
    _recomputes: bool = False  # took = recomputed (capped_frontier) instead of saved

    def __len__(self) -> int:
        return len(self.saved_bytes)

    @property
    def recompute_ms(self) -> np.ndarray:
        return self.total_ms - self.saved_ms

    def best_within(self, max_saved_bytes: float) -> int:
        """Index of the point saving the most runtime within ``max_saved_bytes``; -1 if none."""
        return int(np.searchsorted(self.saved_bytes, max_saved_bytes, side="right")) - 1

    def save_list(self, k: int) -> list[int]:
        """The per-op 0/1 save decisions realizing point ``k``."""
        g = self._groups
        group_save = np.where(g.fixed == SAVE, 1, 0).astype(np.int8)
        if self._recomputes:
            group_save[self._free] = 1
        idx = k
        for step in range(len(self._steps) - 1, -1, -1):
            src, took = self._steps[step]
            if took[idx]:
                group_save[self._free[step]] = 0 if self._recomputes else 1
            idx = int(src[idx])
        return g.op_decisions(group_save)


def _coerce(op_stats: Any, force_store_random: bool | None) -> tuple[list[OpStats], bool]:
    if isinstance(op_stats, Mapping) or hasattr(op_stats, "func_names"):
        ops, fsr = ops_from_torch(op_stats)
        return ops, fsr if force_store_random is None else force_store_random
    ops = [op if isinstance(op, OpStats) else OpStats.model_validate(op) for op in op_stats]
    return ops, bool(force_store_random)


def op_groups(ops: Sequence[OpStats], force_store_random: bool = False) -> OpGroups:
    """Tie ops into groups that share one decision; raise ValueError on contradictory rules."""
    n = len(ops)
    root = list(range(n))

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            root[max(ra, rb)] = min(ra, rb)

    for i, op in enumerate(ops):
        if op.inplace_parent is not None and op.inplace_parent != i:
            union(i, op.inplace_parent)
    rand = [i for i, op in enumerate(ops) if op.random]
    if not force_store_random:
        for a, b in zip(rand, rand[1:]):
            union(a, b)

    gid: dict[int, int] = {}
    members: list[list[int]] = []
    for i in range(n):
        r = find(i)
        if r not in gid:
            gid[r] = len(members)
            members.append([])
        members[gid[r]].append(i)

    fixed = np.full(len(members), FREE, dtype=np.int8)
    why: dict[int, str] = {}
    for i, op in enumerate(ops):
        g = gid[find(i)]
        rules = []
        if op.view_like:
            rules.append((RECOMPUTE, f"op {i} ({op.name}) is view-like, so recomputed"))
        if op.inplace_parent == i:
            rules.append((SAVE, f"op {i} ({op.name}) is in-place on a module input, so saved"))
        if op.random and force_store_random:
            rules.append((SAVE, f"op {i} ({op.name}) is random with force_store_random, so saved"))
        for want, reason in rules:
            if fixed[g] not in (FREE, want):
                raise ValueError(f"contradictory SAC rules: {why[g]}, but {reason}, and both share one decision")
            fixed[g], why[g] = want, reason

    group_bytes = np.array([sum(ops[i].output_bytes for i in m) for m in members], dtype=np.int64)
    group_ms = np.array([math.fsum(ops[i].runtime_ms for i in m) for m in members], dtype=np.float64)
    return OpGroups(tuple(tuple(m) for m in members), group_bytes, group_ms, fixed, n)


def _knapsack_items(ops: Sequence[OpStats], fsr: bool) -> tuple[OpGroups, np.ndarray, int, float]:
    """The groups with trivial decisions fixed, the free groups (big first), and the always-saved bytes/ms."""
    groups = op_groups(ops, fsr)
    always = groups.fixed == SAVE
    base_bytes = int(groups.group_bytes[always].sum())
    base_ms = float(groups.group_ms[always].sum())
    free = groups.fixed == FREE
    # Free groups costing no bytes are always worth saving; free groups saving
    # no runtime are never worth saving. Only the rest are knapsack items.
    zero_cost = free & (groups.group_bytes == 0)
    base_ms += float(groups.group_ms[zero_cost].sum())
    fixed = groups.fixed.copy()
    fixed[zero_cost] = SAVE
    fixed[free & (groups.group_bytes > 0) & (groups.group_ms <= 0)] = RECOMPUTE
    groups = OpGroups(groups.members, groups.group_bytes, groups.group_ms, fixed, groups.n_ops)
    items = np.flatnonzero(fixed == FREE)
    # Big items first keeps the intermediate lists short.
    items = items[np.lexsort((-groups.group_ms[items], -groups.group_bytes[items]))]
    return groups, items, base_bytes, base_ms


def module_frontier(
    op_stats: Any, force_store_random: bool | None = None, *, max_points: int | None = None,
    max_items: int | None = None,
) -> Frontier:
    """The exact memory/recompute trade-off frontier of one module's ops.

    ``op_stats`` is a list of :class:`OpStats` (or dicts of that shape), or a
    PyTorch ``SACStats`` object or dict. Every valid decision is dominated by
    (or equal to) a point of the result. Raises :class:`FrontierTooLarge` when
    the list grows past ``max_points``, or at once when there are more than
    ``max_items`` free op groups to decide.
    """
    ops, fsr = _coerce(op_stats, force_store_random)
    groups, items, base_bytes, base_ms = _knapsack_items(ops, fsr)
    if max_items is not None and len(items) > max_items:
        raise FrontierTooLarge(f"{len(items)} free op groups exceed {max_items}")
    total_ms = math.fsum(op.runtime_ms for op in ops)
    tol = 1e-12 * (abs(total_ms) + 1.0)
    w = np.zeros(1, dtype=np.int64)
    v = np.zeros(1, dtype=np.float64)
    steps = []
    for g in items:
        gw, gv = groups.group_bytes[g], groups.group_ms[g]
        cw = np.concatenate([w, w + gw])
        cv = np.concatenate([v, v + gv])
        src = np.concatenate([np.arange(len(w)), np.arange(len(w))])
        took = np.concatenate([np.zeros(len(w), bool), np.ones(len(w), bool)])
        order = np.lexsort((-cv, cw))
        cw, cv, src, took = cw[order], cv[order], src[order], took[order]
        best_before = np.maximum.accumulate(cv)
        keep = np.ones(len(cv), bool)
        keep[1:] = cv[1:] > best_before[:-1] + tol
        w, v = cw[keep], cv[keep]
        steps.append((src[keep], took[keep]))
        if max_points is not None and len(w) > max_points:
            raise FrontierTooLarge(f"frontier exceeds {max_points} points")
    return Frontier(
        saved_bytes=w + base_bytes,
        saved_ms=v + base_ms,
        total_bytes=int(groups.group_bytes.sum()),
        total_ms=total_ms,
        _groups=groups,
        _free=items,
        _steps=tuple(steps),
    )


def capped_frontier(
    op_stats: Any, force_store_random: bool | None = None, *, act_saved_bytes: int, max_discard_bytes: float,
    max_points: int | None = None,
) -> Frontier:
    """The frontier's points that discard less than ``max_discard_bytes``, and the cheapest one discarding at least that.

    Discard is ``act_saved_bytes`` minus the saved bytes. When no plan can use
    more than ``max_discard_bytes`` of a module's discard, every other point
    is dominated by the cap point, so this is all the module's frontier a plan
    needs; for a module spanning a whole model it is far shorter. The merge
    runs from "save every free group" and recomputes groups one by one, so
    discard only grows along it and partial decisions already past the cap
    collapse to the cheapest one. Raises :class:`FrontierTooLarge` past
    ``max_points``.
    """
    ops, fsr = _coerce(op_stats, force_store_random)
    groups, items, base_bytes, base_ms = _knapsack_items(ops, fsr)
    total_ms = math.fsum(op.runtime_ms for op in ops)
    tol = 1e-12 * (abs(total_ms) + 1.0)
    all_saved = base_bytes + int(groups.group_bytes[items].sum())
    headroom = float(max_discard_bytes) - (act_saved_bytes - all_saved)  # recomputed bytes reaching the cap
    r = np.zeros(1, dtype=np.int64)  # bytes recomputed among the free groups so far
    c = np.zeros(1, dtype=np.float64)  # their ms
    steps = []
    for g in items:
        gw, gv = groups.group_bytes[g], groups.group_ms[g]
        cr = np.concatenate([r, r + gw])
        cc = np.concatenate([c, c + gv])
        src = np.concatenate([np.arange(len(r)), np.arange(len(r))])
        took = np.concatenate([np.zeros(len(r), bool), np.ones(len(r), bool)])
        order = np.lexsort((cc, -cr))  # most recomputed first; cheapest first among equals
        cr, cc, src, took = cr[order], cc[order], src[order], took[order]
        best_after = np.minimum.accumulate(cc)
        keep = np.ones(len(cc), bool)
        keep[1:] = cc[1:] < best_after[:-1] - tol  # more discard for no more recompute dominates
        cr, cc, src, took = cr[keep][::-1], cc[keep][::-1], src[keep][::-1], took[keep][::-1]
        over = int(np.searchsorted(cr, headroom, side="left"))  # first point at or past the cap
        cr, cc, src, took = cr[:over + 1], cc[:over + 1], src[:over + 1], took[:over + 1]
        r, c = cr, cc
        steps.append((src, took))
        if max_points is not None and len(r) > max_points:
            raise FrontierTooLarge(f"frontier below the cap exceeds {max_points} points")
    # points by saved bytes ascending: most recomputed first
    saved_ms_all = base_ms + float(groups.group_ms[items].sum())
    return Frontier(
        saved_bytes=(all_saved - r)[::-1].copy(),
        saved_ms=(saved_ms_all - c)[::-1].copy(),
        total_bytes=int(groups.group_bytes.sum()),
        total_ms=total_ms,
        _groups=groups,
        _free=items,
        _steps=tuple((s[::-1].copy() if i == len(steps) - 1 else s, t[::-1].copy() if i == len(steps) - 1 else t)
                     for i, (s, t) in enumerate(steps)),
        _recomputes=True,
    )


def frontier_hull(op_stats: Any, force_store_random: bool | None = None, *,
                  act_saved_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Lower convex hull of a module's (discarded bytes, recompute ms) decisions, without listing them.

    The hull of 0/1 choices is traced by recomputing groups in increasing ms
    per byte (the fractional knapsack): its vertices are those prefixes.
    Returns the vertices with positive discard, as (bytes, ms) arrays.
    """
    ops, fsr = _coerce(op_stats, force_store_random)
    groups, items, base_bytes, _ = _knapsack_items(ops, fsr)
    all_saved = base_bytes + int(groups.group_bytes[items].sum())
    rc0 = math.fsum(op.runtime_ms for op in ops) - (
        float(groups.group_ms[groups.fixed == SAVE].sum()) + float(groups.group_ms[items].sum()))
    gb, gm = groups.group_bytes[items], groups.group_ms[items]
    order = np.argsort(gm / gb, kind="stable")
    d = act_saved_bytes - all_saved + np.concatenate([[0], np.cumsum(gb[order])])
    rc = rc0 + np.concatenate([[0.0], np.cumsum(gm[order])])
    keep = d > 0
    return d[keep].astype(np.int64), rc[keep]


def max_discard_decision(op_stats: Any, force_store_random: bool | None = None) -> tuple[list[int], int, float]:
    """The decision discarding the most, at the least recompute: (save list, saved bytes, saved ms)."""
    ops, fsr = _coerce(op_stats, force_store_random)
    groups, _, _, _ = _knapsack_items(ops, fsr)
    save = (groups.fixed == SAVE).astype(np.int8)
    return (groups.op_decisions(save), int(groups.group_bytes[save == 1].sum()),
            float(groups.group_ms[save == 1].sum()))


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
    ops, fsr = _coerce(op_stats, force_store_random)
    total = sum(op.output_bytes for op in ops)
    cap = math.ceil(memory_budget * total)
    try:
        frontier = module_frontier(ops, fsr, max_points=_POLICY_FRONTIER_LIMIT)
    except FrontierTooLarge:
        from planner.knapsack import best_saved_within, group_classes

        classes = group_classes(op_groups(ops, fsr))
        counts = best_saved_within(classes, cap)
        if counts is None:
            raise ValueError(_over_budget(memory_budget, cap, classes.always_saved_bytes)) from None
        return classes.save_list(counts)
    k = frontier.best_within(cap)
    if k < 0:
        raise ValueError(_over_budget(memory_budget, cap, int(frontier.saved_bytes[0])))
    return frontier.save_list(k)


_POLICY_FRONTIER_LIMIT = 200_000


def _over_budget(memory_budget: float, cap: int, forced: int) -> str:
    return (f"memory_budget {memory_budget!r} allows {cap} bytes but the ops that must be saved "
            f"take {forced} bytes")

"""Stacks of identical blocks: an exact relaxation in count space, and plans from it.

Deep models are mostly one block repeated. For the DP (:mod:`planner.dp`)
that is the hard case: very many combinations of identical blocks reach
almost the same (discard, recompute), and no bound it can afford separates
them. Here the symmetry is used instead.

**The relaxation.** Let ``k0`` be where the last block of the largest class
of identical subtrees starts. Keep every memory constraint from key ``k0``
on and drop the ones before it. Then the subtrees that finish before ``k0``
matter only through their total discard and recompute, and identical ones
are interchangeable: the N earlier blocks become "n items, each taking a
point of the block's joint frontier", solved exactly over counts
(:func:`planner.counts.min_cost_counts`). What comes after ``k0`` (the last
block, anything after it, and ancestors spanning ``k0``) is enumerated
exactly as a list of options, each needing some total discard from the
earlier subtrees. The optimum of this relaxation is a lower bound on every
plan.

**Plans from it.** The relaxation's optimal counts are dealt out to the
blocks in the order that best keeps the dropped constraints (see
:func:`_deal`). If every one holds, the result is a real plan costing
exactly the bound: optimal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from planner.counts import CountWorkLimit, min_cost_counts
from planner.stack_tail import tail_requirements

__all__ = ["Stack", "StackResult", "find_stack", "solve_stack"]

_MIN_BLOCKS = 3  # identical subtrees needed before the relaxation is worth building
_MAX_OTHER_POINTS = 20_000


@dataclass
class Stack:
    """The budget-independent part: which subtrees are the blocks, and one block's joint options."""

    blocks: list[int]  # roots of the identical blocks, in post-order
    roots: list[int]  # every maximal subtree before the last block, in post-order
    d: np.ndarray  # joint frontier of one block (zero point first), bytes
    rc: np.ndarray  # ms
    choices: list[tuple[tuple[int, int], ...]]  # per point: (candidate, point) pairs, relative to blocks[0]
    _other_options: dict[int, tuple] = field(default_factory=dict)


@dataclass(frozen=True)
class StackResult:
    lower: float  # no plan costs less
    cost: float | None = None  # a real plan's recompute, when one was built
    choices: dict[int, int] | None = None  # candidate -> index into its frontier


def find_stack(fr) -> Stack | None:
    """The stack structure of the candidates in ``fr``, or None when there is none worth using."""
    m = len(fr.d)
    if m == 0:
        return None
    sig = _signatures(fr)
    size = {i: i - fr.starts[i] + 1 for i in range(m)}
    groups: dict[int, list[int]] = {}
    for i in range(m):
        groups.setdefault(sig[i], []).append(i)
    stacks = [g for g in groups.values() if len(g) >= _MIN_BLOCKS]
    if not stacks:
        return None
    best = max(stacks, key=lambda g: (len(g) * size[g[0]], g[-1]))  # the class covering most candidates
    roots, k = [], fr.starts[best[-1]] - 1  # maximal subtrees before the last block
    while k >= 0:
        roots.append(k)
        k = fr.starts[k] - 1
    roots.reverse()
    if [r for r in roots if sig[r] == sig[best[-1]]] != best[:-1]:
        return None  # some copies sit inside larger subtrees: not a stack of blocks
    d, rc, choices = _subtree_options(fr, best[0])
    return Stack(best, roots, d, rc, choices)


def solve_stack(fr, stack: Stack, keyneed: np.ndarray, upper: float, eps: float,
                max_gap: float = math.inf, work_limit: float = 3e6) -> StackResult | None:
    """The relaxation's bound, and a plan meeting it when the dealt-out counts fit every constraint.

    ``eps``: frontier points of a block that another point beats on discard
    for at most ``eps`` more ms are dropped first (the bound is lowered by
    ``eps`` per block to stay valid). ``upper``: a known plan's recompute (or
    inf); the bound is capped there. ``max_gap``: give up when the
    relaxation's optimum lies further than this (relative) above its LP
    bound, as on short stacks, where the DP does better. None when it gave
    up or outgrew ``work_limit``.
    """
    need = np.asarray(keyneed, dtype=np.float64)
    k0 = fr.starts[stack.blocks[-1]]
    members = stack.blocks[:-1]
    others = [r for r in stack.roots if r not in set(members)]
    keep = _absorbed(stack.rc, eps)
    d, rc = stack.d[keep], stack.rc[keep]
    point_of = np.flatnonzero(keep)
    try:
        tail = tail_requirements(fr, k0, need, work_limit=work_limit)
    except CountWorkLimit:
        return None
    lower, best = upper, None
    for free in np.unique(tail.free).tolist():
        sel = np.flatnonzero(tail.free == free)
        x, c, which = _pareto_targets(tail.need[sel], tail.cost[sel], sel)
        try:
            od, orc, och = _others(fr, stack, [r for r in others if r < free], free)
        except CountWorkLimit:
            return None
        x = (x[:, None] - od[None, :]).ravel()  # the other subtrees' discard lowers what the blocks need
        c = (c[:, None] + orc[None, :]).ravel()
        pair = np.stack([np.repeat(which, len(od)), np.tile(np.arange(len(od)), len(which))], axis=1)
        x, c, pair = _pareto_targets(x, c, pair)
        n = sum(1 for r in members if r < free)
        limit = min(upper, best[0] if best else math.inf)
        try:
            sol, bound = min_cost_counts(d, rc, n, x, c, limit, max_gap=max_gap, work_limit=work_limit)
        except CountWorkLimit:
            return None
        if sol is None and bound < limit:
            return None  # gave up: far from the LP bound
        lower = min(lower, bound - n * eps)
        if sol is not None:
            best = (sol.value, sol, pair[sol.target], n, och)
    if best is None:
        return StackResult(lower)
    _, sol, (tail_i, other_i), n, och = best
    choices = _deal(fr, stack, {int(point_of[p]): k for p, k in sol.counts.items()}, members[:n], need)
    choices.update(tail.choices(int(tail_i)))
    choices.update(dict(och[other_i]))
    cost = math.fsum(float(fr.rc[i][j]) for i, j in choices.items())
    if not _fits(fr, choices, need):
        return StackResult(lower)
    return StackResult(min(lower, cost), cost, choices)


def _signatures(fr) -> list[int]:
    """Equal ints for candidates whose subtrees are identical (same frontiers, same shape)."""
    m = len(fr.d)
    table: dict[tuple, int] = {}
    sig = [0] * m
    for i in range(m):  # post-order: children first
        kids, k = [], i - 1
        while k >= fr.starts[i]:
            kids.append(sig[k])
            k = fr.starts[k] - 1
        key = (fr.fid[i], tuple(kids))
        sig[i] = table.setdefault(key, len(table))
    return sig


def _pareto(d: np.ndarray, rc: np.ndarray, keep_from: list) -> tuple[np.ndarray, np.ndarray, list]:
    """Non-dominated (more discard, less recompute) points, by ascending discard."""
    order = np.lexsort((-d, rc))
    d, rc = d[order], rc[order]
    ok = d > np.concatenate([[-1], np.maximum.accumulate(d)[:-1]])
    kept = order[ok]
    d, rc = d[ok], rc[ok]
    back = np.argsort(d, kind="stable")
    return d[back], rc[back], [keep_from[i] for i in kept[back]]


def _subtree_options(fr, c: int):
    """Every non-dominated (discard, recompute) of the decisions inside c's subtree, zero point first."""
    d, rc, ch = np.zeros(1, np.int64), np.zeros(1), [()]
    k = c - 1
    while k >= fr.starts[c]:  # children, last first
        cd, crc, cch = _subtree_options(fr, k)
        d, rc, ch = _pareto((d[:, None] + cd[None, :]).ravel(), (rc[:, None] + crc[None, :]).ravel(),
                            [p + q for p in ch for q in cch])
        k = fr.starts[k] - 1
    return _pareto(np.concatenate([d, fr.d[c]]), np.concatenate([rc, fr.rc[c]]),
                   ch + [((c, j),) for j in range(len(fr.d[c]))])


def _pareto_targets(x: np.ndarray, c: np.ndarray, tag: np.ndarray):
    """Targets no other beats on both need and cost, by ascending need."""
    order = np.lexsort((c, x))
    x, c, tag = x[order], c[order], tag[order]
    ok = c < np.concatenate([[np.inf], np.minimum.accumulate(c)[:-1]])
    return x[ok], c[ok], tag[ok]


def _others(fr, stack: Stack, roots: list[int], key: int):
    """Joint options (discard, recompute, choices) of the non-block subtrees ``roots`` before k0."""
    if key not in stack._other_options:
        d, rc, ch = np.zeros(1, np.int64), np.zeros(1), [()]
        for r in roots:
            od, orc, och = _subtree_options(fr, r)
            if len(d) * len(od) > 50 * _MAX_OTHER_POINTS:
                raise CountWorkLimit
            d, rc, ch = _pareto((d[:, None] + od[None, :]).ravel(), (rc[:, None] + orc[None, :]).ravel(),
                                [p + q for p in ch for q in och])
            if len(d) > _MAX_OTHER_POINTS:
                raise CountWorkLimit
        stack._other_options[key] = (d, rc, ch)
    return stack._other_options[key]


def _absorbed(rc: np.ndarray, eps: float) -> np.ndarray:
    """Points kept when each one that a larger-discard point beats by at most eps ms is dropped."""
    keep = np.zeros(len(rc), bool)
    last = math.inf
    for j in range(len(rc) - 1, -1, -1):
        if last - rc[j] > eps or j == 0:
            keep[j] = True
            last = rc[j]
    return keep


def _deal(fr, stack: Stack, counts: dict[int, int], members: list[int], need: np.ndarray) -> dict[int, int]:
    """The counts dealt out to the blocks ``members``, in the order that best keeps every constraint.

    A block taking point p needs the discard S accumulated before it to be at
    least ``r_p`` (its own constraints, inside and at its end, net of what it
    discards itself by then) and raises S by ``d_p``. With needs growing by
    about the same amount per block, this is the scheduling problem of jobs
    that need a level to start and change it: taking the jobs in decreasing
    ``r_p + d_p`` is optimal (an exchange argument). ``r_p`` is read at the
    last block dealt, where the constraints are tightest.
    """
    if not members:
        return {}
    rep, last = stack.blocks[0], members[-1]
    keys = np.arange(fr.starts[last], last + 2)  # from the block's start to its end
    level = np.where(np.isfinite(need[keys]), need[keys], -np.inf)
    order_key = {}
    for p in counts:
        partial = np.zeros(len(keys))
        for i, j in stack.choices[p]:
            partial[np.flatnonzero(keys > i + last - rep)] += fr.d[i][j]
        order_key[p] = float(np.max(level - partial)) + float(stack.d[p])
    items = sorted((p for p, k in counts.items() for _ in range(k)), key=lambda p: (-order_key[p], -int(stack.d[p]), p))
    out = {}
    for root, p in zip(members, items):
        for i, j in stack.choices[p]:
            out[i + root - rep] = j
    return out


def _fits(fr, choices: dict[int, int], need: np.ndarray) -> bool:
    """Whether the plan meets every memory constraint (the DP's half-byte tolerance)."""
    disc = np.zeros(len(fr.d), np.int64)
    for i, j in choices.items():
        disc[i] += fr.d[i][j]
    s = np.concatenate([[0], np.cumsum(disc)])
    return bool(np.all(s >= need - 0.5))

"""Stacks of identical blocks: an exact relaxation in count space, and plans from it.

Deep models are mostly one block repeated. For the DP (:mod:`planner.solve.dp`)
that is the hard case: very many combinations of identical blocks reach
almost the same (discard, recompute), and no bound it can afford separates
them. Here the symmetry is used instead.

**The relaxation.** Let ``k0`` be where the last block of the largest class
of identical subtrees starts. Keep every memory constraint from key ``k0``
on and drop the ones before it. Then the subtrees that finish before ``k0``
matter only through their total discard and recompute, and identical ones
are interchangeable: the N earlier blocks become "n items, each taking a
point of the block's joint frontier", solved exactly over counts
(:func:`planner.solve.stack.multiset.min_cost_counts`). What comes after ``k0`` (the last
block, anything after it, and ancestors spanning ``k0``) is enumerated
exactly as a list of options, each needing some total discard from the
earlier subtrees. The optimum of this relaxation is a lower bound on every
plan.

**Plans from it.** The relaxation's optimal counts are dealt out to the
blocks in the order that best keeps the dropped constraints (see
:func:`exchange_order`). If every one holds, the result is a real plan
costing exactly the bound: optimal. Near the smallest feasible budget the
dropped constraints bind and the counts often cannot be dealt out; then the
ordered relaxation of :mod:`planner.solve.stack.ordered`, which keeps every block's
own constraints, is solved instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from planner.memory_model import NEED_TOL_BYTES
from planner.solve.points import absorbed
from planner.solve.problem import Frontiers
from planner.solve.stack.multiset import CountWorkLimit, min_cost_counts
from planner.solve.stack.options import back_to_back, block_types, held_table, partial_table, requirements
from planner.solve.stack.ordered import ordered_counts
from planner.solve.stack.tail import TailStall, tail_requirements

__all__ = ["Stack", "StackResult", "exchange_order", "find_stack", "ordered_relaxation", "solve_stack"]

_MIN_BLOCKS = 3  # identical subtrees needed before the relaxation is worth building
_MAX_OTHER_POINTS = 20_000
_MAX_ORDERED_OTHERS = 8  # the ordered relaxation runs once per joint option of the subtrees before the blocks


@dataclass
class Stack:
    """The budget-independent part: which subtrees are the blocks, and one block's joint options."""

    blocks: list[int]  # roots of the identical blocks, in post-order
    roots: list[int]  # every maximal subtree before the last block, in post-order
    d: np.ndarray  # joint frontier of one block (zero point first), bytes
    rc: np.ndarray  # ms
    choices: list[tuple[tuple[int, int], ...]]  # per point: (candidate, point) pairs, relative to blocks[0]
    # caches: the other subtrees' joint options per key, and the ordered relaxation's options per set of
    # candidates holding inputs (planner.solve.stack.options.BlockTypes, or False when it does not apply)
    other_options: dict[int, tuple] = field(default_factory=dict)
    ordered_options: dict[tuple, object] = field(default_factory=dict)
    group_paths: dict = field(default_factory=dict)  # the count search's group relaxation, shared by budgets


@dataclass(frozen=True)
class StackResult:
    lower: float  # no plan costs less
    cost: float | None = None  # a real plan's recompute, when one was built
    choices: dict[int, int] | None = None  # candidate -> index into its frontier


def find_stack(fr: Frontiers) -> Stack | None:
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


def solve_stack(fr: Frontiers, stack: Stack, keyneed: np.ndarray, upper: float, eps: float,
                max_gap: float = math.inf, work_limit: float = 3e6, deadline: float = math.inf,
                rel_gap: float = 0.0, held_need: dict[int, float] | None = None, tail_stall: TailStall | None = None,
                plan_cost: Callable[[dict[int, int]], float] | None = None,
                root_options: Callable[[int], tuple] | None = None) -> StackResult | None:
    """The relaxation's bound, and a plan meeting it when the dealt-out counts fit every constraint.

    ``eps``: frontier points of a block that another point beats on discard
    for at most ``eps`` more ms are dropped first (the bound is lowered by
    ``eps`` per block to stay valid). ``upper``: a known plan's recompute (or
    inf); the bound is capped there. ``max_gap``: give up when the
    relaxation's optimum lies further than this (relative) above its LP
    bound. ``rel_gap``: a plan of the relaxation within this (relative) of
    its bound may stand for its optimum. None when it gave up, outgrew
    ``work_limit`` or passed ``deadline`` (``time.perf_counter()``).

    When the plain relaxation's counts cannot be dealt out (near the smallest
    feasible budget, where every block's own constraints bind), the ordered
    one of :mod:`planner.solve.stack.ordered` keeps those constraints and is tried next.

    ``held_need`` (``problem.held_needs``): what the discard before a candidate's subtree must reach when it
    is checkpointed (it holds its inputs through its own backward). The exact tail, the ordered relaxation
    and the plans' checks keep them; the plain relaxation drops the blocks' (still a lower bound), and its
    counts then fail to deal out where they bind (405B FSDP2 stats at their smallest budget: every layer
    holds its input; the plain optimum 0.6% under the true one).

    With offload, ``tail_stall`` makes the exact tail charge each window's stall on its total
    (:class:`planner.solve.stack.tail.TailStall`), and ``plan_cost`` prices a plan (candidate -> point) as the
    relaxation does (by default the sum of its points' costs), ``root_options`` lists the joint options
    (discard, cost, choices) of a subtree before the blocks as the relaxation prices them.
    """
    need = np.asarray(keyneed, dtype=np.float64)
    held = {i: v for i, v in (held_need or {}).items() if math.isfinite(v)}
    tail_blocks = _tail_blocks(fr, stack, need)
    k0 = fr.starts[stack.blocks[-tail_blocks]]
    members = stack.blocks[:-tail_blocks]
    others = [r for r in stack.roots if r not in set(members)]
    keep = absorbed(stack.rc, eps, keep_first=True)
    d, rc = stack.d[keep], stack.rc[keep]
    point_of = np.flatnonzero(keep)
    try:
        tail = tail_requirements(fr, k0, need, work_limit=work_limit, held_need=held, offload=tail_stall)
        groups = []  # per value of tail.free: what the blocks before it must discard, and at what cost
        for free in np.unique(tail.free).tolist():
            sel = np.flatnonzero(tail.free == free)
            tx, tc, which = _pareto_targets(tail.need[sel], tail.cost[sel], sel)
            od, orc, och = _others(fr, stack, [r for r in others if r < free], free, root_options)
            n = sum(1 for r in members if r < free)
            groups.append(_Group(n, tx, tc, which, od, orc, och))
    except CountWorkLimit:
        return None
    lower, best, starts, unfinished = upper, None, [], False
    for g in groups:
        x = (g.tx[:, None] - g.od[None, :]).ravel()  # the other subtrees' discard lowers what the blocks need
        c = (g.tc[:, None] + g.orc[None, :]).ravel()
        pair = np.stack([np.repeat(g.which, len(g.od)), np.tile(np.arange(len(g.od)), len(g.which))], axis=1)
        x, c, pair = _pareto_targets(x, c, pair)
        limit = min(upper, best[0] if best else math.inf)
        try:
            sol, bound = min_cost_counts(d, rc, g.n, x, c, limit, max_gap=max_gap, rel_gap=rel_gap,
                                         work_limit=work_limit, deadline=deadline, cache=stack.group_paths)
        except CountWorkLimit as stopped:
            if stopped.lower is None:
                return None
            # what it proved before it stopped still bounds this group (the lattice's bound: 405B ws128 at
            # 515.3 GiB, within 2.2e-3 of the plan where the LP's alone is 9e-3 below)
            sol, bound, unfinished = None, stopped.lower, True
        if sol is None and bound < limit and not unfinished:
            return None  # gave up: far from the LP bound
        starts.append(bound)
        lower = min(lower, bound - g.n * eps)
        if sol is not None:
            best = (sol.value, sol, pair[sol.target], g)
    if best is not None:
        _, sol, (tail_i, other_i), g = best
        seq = [int(point_of[p]) for p, k in sol.counts.items() for _ in range(k)]
        choices = _assemble(stack, [stack.choices[p] for p in exchange_order(fr, stack, seq, need, held)],
                            tail.choices(int(tail_i)), g.och[other_i])
        if _fits(fr, choices, need, held):
            cost = _cost(fr, choices) if plan_cost is None else plan_cost(choices)
            return StackResult(min(lower, cost), cost, choices)
    if unfinished:  # a group's optimum is unknown: its bound is what there is
        return StackResult(lower)
    ordered = ordered_relaxation(fr, stack, need, groups, starts, d, rc, point_of, tail, eps, upper, work_limit, deadline,
                                 held, plan_cost)
    if ordered is None:
        return StackResult(lower)
    return StackResult(max(lower, ordered.lower), ordered.cost, ordered.choices)


def _tail_blocks(fr, stack: Stack, need: np.ndarray) -> int:
    """How many of the last blocks the exact tail takes: two when the block before the last needs more than
    anything from the last block on.

    Discard only grows from key to key, so such a need is the tightest constraint, and the relaxation would
    drop it: FSDP2 per-rank stats, whose last block keeps its gathered parameters through the backward and so
    needs less than the one before it (Llama-3 405B FSDP2 x128: the bound 2% under the optimum, 5-13 s a
    plan, where with the block in the tail its counts deal out at once). A shift of the budget moves every
    need alike, so the choice is the same at every budget.
    """
    if len(stack.blocks) < _MIN_BLOCKS + 1:
        return 1
    k0 = fr.starts[stack.blocks[-1]]
    before = need[fr.starts[stack.blocks[-2]]:k0]
    return 2 if len(before) and float(np.max(before)) > float(np.max(need[k0:])) else 1


@dataclass
class _Group:
    n: int  # member blocks before the tail's free point
    tx: np.ndarray  # the tail's targets: discard needed before k0
    tc: np.ndarray  # and the tail's recompute for it
    which: np.ndarray  # index of each target in the tail list
    od: np.ndarray  # the other subtrees' joint options: discard
    orc: np.ndarray  # recompute
    och: list  # choices


def ordered_relaxation(fr, stack: Stack, need, groups, starts, d, rc, point_of, tail, eps, upper, work_limit,
             deadline=math.inf, held_need: dict[int, float] | None = None,
             plan_cost: Callable[[dict[int, int]], float] | None = None):
    """The ordered relaxation (planner.solve.stack.ordered) over every group; None when it does not apply.

    It lists its own options (``stack.ordered_options``: every partial-discard profile
    kept) and absorbs near-duplicates among them with the same ``eps``.
    """
    held_need = held_need or {}
    held = _held_in_first_block(fr, stack, held_need)
    if held not in stack.ordered_options:
        stack.ordered_options[held] = block_types(fr, stack, held=held) or False
    types = stack.ordered_options[held]
    if not types or any(len(g.od) > _MAX_ORDERED_OTHERS for g in groups):
        return None
    # an absorber must hold no inputs the absorbed option does not (else its requirement may be larger)
    kept = np.flatnonzero(absorbed(types.rc, eps, d=types.d, partial=np.hstack([types.partial, -1.0 * types.holds])))
    od, orc, oR, och = types.d[kept], types.rc[kept], types.partial[kept], [types.choices[p] for p in kept]
    holds = types.holds[kept]
    lower, best = math.inf, None
    for g, start in sorted(zip(groups, starts), key=lambda x: x[1]):
        limit = min(upper, best[0] if best else math.inf)
        if start >= limit:
            lower = min(lower, start - g.n * eps)
            continue
        R, delta, lead_R = (requirements(fr, stack, oR, need, g.n, held_need, held, holds, lead=None) if g.n
                            else (np.zeros(len(od)), 0.0, None))
        bound = math.inf
        for o in range(len(g.od)):  # the other subtrees (all before the blocks) set the starting slack
            limit = min(upper, best[0] if best else math.inf)
            try:
                sol, b = ordered_counts(od, orc, R, delta, float(g.od[o]), g.n, g.tx, g.tc + g.orc[o],
                                        limit, start=start, work_limit=work_limit, deadline=deadline, lead_R=lead_R)
            except CountWorkLimit:
                return None
            bound = min(bound, b)
            if sol is not None:
                best = (sol.value, [och[p] for p in sol.sequence], g.which[sol.target], g.och[o])
        lower = min(lower, bound - g.n * eps)
    if best is None:
        return StackResult(min(lower, upper))
    value, seq, tail_i, och = best
    choices = _assemble(stack, seq, tail.choices(int(tail_i)), och)
    if not _fits(fr, choices, need, held_need):
        return StackResult(min(lower, value))
    cost = _cost(fr, choices) if plan_cost is None else plan_cost(choices)
    return StackResult(min(lower, cost), cost, choices)


def _cost(fr, choices: dict[int, int]) -> float:
    return math.fsum(float(fr.rc[i][j]) for i, j in choices.items())


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


def _others(fr, stack: Stack, roots: list[int], key: int, root_options=None):
    """Joint options (discard, recompute, choices) of the non-block subtrees ``roots`` before k0."""
    if fr.giants or key not in stack.other_options:  # a giant lists other points per budget: no cache
        d, rc, ch = np.zeros(1, np.int64), np.zeros(1), [()]
        for r in roots:
            joint = None if root_options is None else root_options(r)
            od, orc, och = _subtree_options(fr, r) if joint is None else joint
            if len(d) * len(od) > 50 * _MAX_OTHER_POINTS:
                raise CountWorkLimit
            d, rc, ch = _pareto((d[:, None] + od[None, :]).ravel(), (rc[:, None] + orc[None, :]).ravel(),
                                [p + q for p in ch for q in och])
            if len(d) > _MAX_OTHER_POINTS:
                raise CountWorkLimit
        if fr.giants:
            return d, rc, ch
        stack.other_options[key] = (d, rc, ch)
    return stack.other_options[key]


def exchange_order(fr, stack: Stack, seq: list[int], need: np.ndarray, held_need: dict | None = None) -> list[int]:
    """The options ``seq`` (one per block) in the order that best keeps every block's constraints.

    A block taking option p needs slack ``T >= R_p`` before it and changes it
    by ``g_p = d_p - delta`` (:mod:`planner.solve.stack.ordered`): gainers first by
    increasing R, then the rest by decreasing ``R + g``, the order that meets
    every constraint whenever any order does (an exchange argument). Blocks
    not back to back: largest discard first.
    """
    if not seq:
        return []
    if not back_to_back(fr, stack):  # (the ordered relaxation's options are not needed to order these)
        return sorted(seq, key=lambda p: (-int(stack.d[p]), p))
    used = sorted(set(seq))
    ch, held = [stack.choices[p] for p in used], _held_in_first_block(fr, stack, held_need or {})
    R, delta, _ = requirements(fr, stack, partial_table(fr, stack, ch), need, len(seq), held_need, held,
                               held_table(ch, held))
    key = {p: ((0, R[i], p) if stack.d[p] >= delta else (1, -(R[i] + stack.d[p] - delta), p))
           for i, p in enumerate(used)}
    return sorted(seq, key=key.__getitem__)


def _assemble(stack: Stack, options: list, tail_choices: dict, other_choices) -> dict[int, int]:
    """Candidate -> frontier index: options[j] (pairs relative to the first block) on block j, then the rest."""
    rep = stack.blocks[0]
    out = {}
    for root, choice in zip(stack.blocks, options):
        for i, j in choice:
            out[i + root - rep] = j
    out.update(tail_choices)
    out.update(dict(other_choices))
    return out


def _fits(fr, choices: dict[int, int], need: np.ndarray, held_need: dict | None = None) -> bool:
    """Whether the plan meets every memory constraint, the held inputs' of the checkpointed candidates too."""
    disc = np.zeros(len(fr.d), np.int64)
    for i, j in choices.items():
        disc[i] += fr.d[i][j]
    s = np.concatenate([[0], np.cumsum(disc)])
    held = held_need or {}
    return bool(np.all(s >= need - NEED_TOL_BYTES)) and all(
        s[fr.starts[i]] >= held[i] - NEED_TOL_BYTES for i in choices if i in held)


def _held_in_first_block(fr, stack: Stack, held_need: dict) -> tuple:
    """The candidates of the first block that hold inputs when checkpointed (the same in every budget)."""
    rep = stack.blocks[0]
    return tuple(i for i in range(fr.starts[rep], rep + 1) if i in held_need)

"""Op groups: ops tied together by the SAC conventions share one save/recompute decision.

The SAC conventions (PyTorch's and xformers'):

* view-like ops are always recomputed;
* an in-place op shares the decision of the op whose output it mutates, and
  one that mutates a module input (its own parent) is always saved; so does
  every op (views aside) between that op and its mutation, which may have
  read the output before it changed;
* random ops are all saved or all recomputed together (recomputing only some
  would replay the RNG out of step), and all saved when ``force_store_random``;
* collectives are always saved (an op marked ``must_save``: see
  :data:`MUST_SAVE_OPS`): recomputing one would communicate again, and every
  rank of its group would have to recompute it in step (torchtitan's
  selective checkpointing keeps them for the same reason).

This module reads only the ops' attributes (``name``, ``output_bytes``,
``runtime_ms``, ``view_like``, ``random``, ``inplace_parent``), so the stats
format can check its documents with it without a cycle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["FREE", "MUST_SAVE_OPS", "RECOMPUTE", "SAVE", "OpGroups", "op_groups", "settle_trivial"]

FREE, RECOMPUTE, SAVE = -1, 0, 1

# The collectives a tensor-parallel step runs inside a module's forward (torch.distributed's functional
# collectives, the ops DTensor's redistributions and the parallel styles' hooks issue: see
# torch/distributed/_functional_collectives.py and torch/distributed/tensor/_redistribute.py), in the names the
# stats give them. The collector marks each such op must_save; this list is what it and apply's policy match.
MUST_SAVE_OPS = frozenset({
    "_c10d_functional.all_reduce", "_c10d_functional.all_reduce_", "_c10d_functional.all_gather_into_tensor",
    "_c10d_functional.reduce_scatter_tensor", "_c10d_functional.all_to_all_single", "_c10d_functional.broadcast",
    "_c10d_functional.wait_tensor", "_c10d_functional._wrap_tensor_autograd", "_c10d_functional_autograd.all_reduce",
    "_c10d_functional_autograd.all_gather_into_tensor", "_c10d_functional_autograd.reduce_scatter_tensor",
    "_c10d_functional_autograd.all_to_all_single", "_dtensor.shard_dim_alltoall",
    "c10d.allreduce_", "c10d.allgather_", "c10d._allgather_base_", "c10d._reduce_scatter_base_",
    "c10d.reduce_scatter_", "c10d.broadcast_",
})


class OpLike(Protocol):
    name: str
    output_bytes: int
    runtime_ms: float
    view_like: bool
    random: bool
    inplace_parent: int | None


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


def op_groups(ops: Sequence[OpLike], force_store_random: bool = False) -> OpGroups:
    """Tie ops into groups that share one decision; raise ValueError on contradictory rules."""
    wants = _wants(ops, force_store_random)
    gid, members = _tie(ops, force_store_random, wants)
    fixed = np.full(len(members), FREE, dtype=np.int8)
    why: dict[int, tuple[int, int]] = {}  # group -> (op, its rule) that fixed it; worded only on a contradiction
    for i, op_wants in wants.items():
        g = gid[i]
        for k, want in enumerate(op_wants):
            if fixed[g] not in (FREE, want):
                first, reason = _rules(why[g][0], ops[why[g][0]], force_store_random)[why[g][1]][1], \
                    _rules(i, ops[i], force_store_random)[k][1]
                raise ValueError(f"contradictory SAC rules: {first}, but {reason}, and both share one decision")
            fixed[g], why[g] = want, (i, k)
    op_bytes = np.array([op.output_bytes for op in ops], dtype=np.int64)
    group_bytes = np.zeros(len(members), dtype=np.int64)
    np.add.at(group_bytes, np.array(gid, dtype=np.int64), op_bytes)  # int64: exact, as the sums it replaces
    group_ms = np.array([ops[m[0]].runtime_ms if len(m) == 1 else math.fsum(ops[i].runtime_ms for i in m)
                         for m in members], dtype=np.float64)
    return OpGroups(tuple(map(tuple, members)), group_bytes, group_ms, fixed, len(ops))


def _wants(ops: Sequence[OpLike], force_store_random: bool) -> dict[int, list[int]]:
    """Op index -> the decisions the SAC conventions force on it, in :func:`_rules`' order (ops with none left
    out): the rules without their wording, which thousands of view-like ops would pay for."""
    out: dict[int, list[int]] = {}
    for i, op in enumerate(ops):
        if op.view_like or op.inplace_parent == i or (op.random and force_store_random) \
                or getattr(op, "must_save", None):
            out[i] = [_RULES[r][0] for r in _applying(i, op, force_store_random)]
    return out


def _tie(ops: Sequence[OpLike], force_store_random: bool,
         wants: dict[int, list[int]]) -> tuple[list[int], list[list[int]]]:
    """Group index per op (union-find over the in-place and random ties), and each group's ops; ``wants`` as
    :func:`_wants` gives them for the same ``force_store_random``."""
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
    # An op between a parent and its in-place mutation may read the parent's output before it changes (a
    # router's top-k weights summed, then divided in place). Recomputed while the parent is saved, it would
    # read the mutated tensor SAC cached: so it shares the parent's decision, where no rule forbids it (a
    # parent that is a view is recomputed anyway).
    forced: dict[int, int] = {}
    for i, op_wants in wants.items():
        for want in op_wants:
            forced[find(i)] = want
    for i, op in enumerate(ops):
        p = op.inplace_parent
        if p is None or p == i or ops[p].view_like:
            continue
        for k in range(p + 1, i):
            a, b = find(k), find(p)
            if ops[k].view_like or a == b or {forced.get(a, FREE), forced.get(b, FREE)} >= {SAVE, RECOMPUTE}:
                continue
            want = max(forced.get(a, FREE), forced.get(b, FREE))
            union(a, b)
            if want != FREE:
                forced[find(a)] = want
    # Every union points the larger root at the smaller, so a group's root is its first op: groups numbered by
    # their roots in order are numbered by first op, as a pass over the ops would number them.
    roots = np.array(root, dtype=np.int64)
    while not np.array_equal(jumped := roots[roots], roots):
        roots = jumped
    firsts, number = np.unique(roots, return_inverse=True)
    gid = number.tolist()
    members: list[list[int]] = [[] for _ in range(len(firsts))]
    for i, g in enumerate(gid):
        members[g].append(i)
    return gid, members


# The SAC conventions that force one op's decision: (the decision, why), in the order they are checked.
_RULES = ((RECOMPUTE, "is view-like, so recomputed"), (SAVE, "is in-place on a module input, so saved"),
          (SAVE, "is random with force_store_random, so saved"), (SAVE, "is a collective, so saved"))


def _applying(i: int, op: OpLike, force_store_random: bool) -> list[int]:
    """Which of :data:`_RULES` force op i's decision."""
    out = []
    if op.view_like:
        out.append(0)
    if op.inplace_parent == i:
        out.append(1)
    if op.random and force_store_random:
        out.append(2)
    if getattr(op, "must_save", None):
        out.append(3)
    return out


def _rules(i: int, op: OpLike, force_store_random: bool) -> list[tuple[int, str]]:
    """The decisions the SAC conventions force on op i, each with its reason."""
    return [(_RULES[r][0], f"op {i} ({op.name}) {_RULES[r][1]}") for r in _applying(i, op, force_store_random)]


def settle_trivial(groups: OpGroups) -> tuple[OpGroups, np.ndarray]:
    """Free groups with an obvious decision fixed: no bytes -> saved, no runtime -> recomputed.

    Both are exact (saving a zero-byte group costs nothing; saving a group
    that takes no time saves nothing). Returns the groups and the mask of
    free zero-byte groups now saved.
    """
    fixed = groups.fixed.copy()
    free = fixed == FREE
    zero_bytes = free & (groups.group_bytes == 0)
    fixed[zero_bytes] = SAVE
    fixed[free & (groups.group_bytes > 0) & (groups.group_ms <= 0)] = RECOMPUTE
    return OpGroups(groups.members, groups.group_bytes, groups.group_ms, fixed, groups.n_ops), zero_bytes

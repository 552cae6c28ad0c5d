"""A checkpointed candidate's own forward moments as linear rows over its op-class counts (the MILP's).

At op j of its forward, checkpointed candidate c holds ``base_j + sum of W_g,j over the op groups g it keeps``
(saved or offloaded; :mod:`planner.ops.forward_moments`: ``base_j`` with every op recomputed, ``W_g,j`` what
keeping group g adds there). A group's ``W`` depends only on its storages (bytes, last live op in the plain
step, last live op with nothing saved), so classes of groups that also share those (the ``signature``) have one
``W`` each, and the forward moment t of op j is met exactly by one row per column j:

    S_{nk(t)} [+ Q_{J(t)}] - const_j y_c + sum_q W_q,j k_cq >= need_t,
    const_j = base_j - most_t + sum of W_g,j over c's fixed-saved and free groups

(``most_t``: the plain step's most live bytes at t; ``k_cq``: recomputed groups of class q). With ``y_c = 0`` it
is the moment's own row. Only the columns where keeping every group would go above ``most_t`` are kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from planner.ops.forward_moments import forward_held_bytes
from planner.ops.groups import FREE, SAVE, OpGroups
from planner.ops.knapsack import GroupClasses, group_classes
from planner.stats.format import ModuleStats

if TYPE_CHECKING:
    from planner.solve.problem import Problem

__all__ = ["MAX_COLUMNS", "ForwardRows", "forward_columns", "forward_rows", "forward_rows_of", "group_signatures",
           "with_forward_rows"]

# a candidate with more forward ops that can go above their moment than this gets no rows (its plans are checked)
MAX_COLUMNS = 512


@dataclass(frozen=True)
class ForwardRows:
    """One candidate's forward-moment rows: per column its key, const_j and per class W_q,j (bytes)."""

    keys: np.ndarray  # int64 per column
    const: np.ndarray  # float64 per column
    class_weights: np.ndarray  # float64, classes x columns


def group_signatures(m: ModuleStats, groups: OpGroups) -> list[tuple]:
    """Per op group: what its ops' storages are (bytes, last live op, last live op with nothing saved), sorted."""
    ops = m.ops or ()
    return [tuple(sorted((nbytes, last, unsaved) for i in members
                         for (nbytes, last, _), unsaved in zip(ops[i].storages or (), ops[i].unsaved_last_ops or ())))
            for members in groups.members]


def forward_columns(m: ModuleStats, plain_most: Mapping[int, float]) -> np.ndarray:
    """The ops of ``m`` (indices) whose forward can hold more than their moment's most when ``m`` is checkpointed
    (every op kept: the most any save list holds there)."""
    ops = m.ops or ()
    held = forward_held_bytes(m, [1] * len(ops))
    most = np.array([plain_most.get(op.forward_key, np.inf) for op in ops], dtype=np.float64)
    return np.flatnonzero(held > most)


def forward_rows(m: ModuleStats, classes: GroupClasses, plain_most: Mapping[int, float]) -> ForwardRows | None:
    """``m``'s rows over ``classes`` (split by :func:`group_signatures`), or None when none can bind."""
    cols = forward_columns(m, plain_most)
    if not len(cols) or len(cols) > MAX_COLUMNS:
        return None
    ops = m.ops or ()
    n = len(ops)
    op_w = np.zeros((n, len(cols)))
    for i, op in enumerate(ops):
        for (nbytes, last, _), unsaved in zip(op.storages or (), op.unsaved_last_ops or ()):
            if last < n:
                op_w[i] += nbytes * (cols > last)
            if unsaved < last:
                op_w[i] += nbytes * ((cols > unsaved) & (cols <= last))
    groups = classes.groups
    group_w = np.array([op_w[list(members)].sum(axis=0) for members in groups.members]).reshape(-1, len(cols))
    base = forward_held_bytes(m, [0] * n)[cols]
    keys = np.array([ops[j].forward_key for j in cols], dtype=np.int64)
    most = np.array([plain_most[k] for k in keys.tolist()], dtype=np.float64)
    kept = (groups.fixed == SAVE) | (groups.fixed == FREE)
    const = base - most + group_w[kept].sum(axis=0)
    weights = np.array([group_w[members[0]] for members in classes.members]).reshape(-1, len(cols))
    return ForwardRows(keys, const, weights)


_ROWS = "forward rows"


def forward_rows_of(prob: Problem) -> dict[int, ForwardRows]:
    """Candidate index -> its forward rows: those of a problem from :func:`with_forward_rows`, else none."""
    return prob.derived(_ROWS, lambda p: {})


def with_forward_rows(prob: Problem) -> Problem | None:
    """``prob`` with the rows of its candidates' own forward moments: the candidates whose forward can go above
    the plain step's get op classes that also share what their groups hold there (:func:`group_signatures`), and
    their rows (:func:`forward_rows_of`). None when no candidate has any (stats without forward moments). Built
    once per problem; the MILP turns to it when a plan without the rows misses the budget in such a forward."""
    def build(p: Problem) -> Problem | None:
        model, cands, rows_of = p.model, list(p.candidates), {}
        split: dict[tuple, GroupClasses] = {}
        for i, c in enumerate(cands):
            m = p.stats.module(c.fqn)
            if c.fqn not in model.forward_ops or not len(forward_columns(m, model.forward_most)):
                continue
            signature = group_signatures(m, c.classes.groups)
            key = (c.ops_key, tuple(signature))
            if key not in split:
                split[key] = group_classes(c.classes.groups, signature)
            rows = forward_rows(m, split[key], model.forward_most)
            if rows is not None:
                cands[i], rows_of[i] = replace(c, classes=split[key]), rows
        # the frontier and hull caches do not depend on the classes: shared; what was derived from them is not
        return replace(p, candidates=cands, _derived={_ROWS: rows_of}) if rows_of else None
    return prob.derived("with forward rows", build)

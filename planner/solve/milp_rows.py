"""Rows the MILP (:mod:`planner.solve.milp`) adds beyond the running sums' bounds, one per moment.

* ``discard_entries``: the discard in effect at a moment (running sums, later calls, held inputs, offloads);
* ``forward_moment_rows``: a checkpointed candidate's own forward moments, exact over its op classes
  (:mod:`planner.solve.forward_rows`; on the problem from ``with_forward_rows`` only);
* ``add_lazy`` / ``lazy_entries``: rows for a plan's module whose recompute held more than the engines' figure
  (not valid cuts: a plan found with them is judged against the first bound).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.memory_model import NEED_TOL_BYTES
from planner.solve.forward_rows import forward_rows_of
from planner.solve.milp_offload import credited_windows
from planner.solve.offload import OffloadSetup
from planner.solve.problem import Problem
from planner.solve.solution import Solution

__all__ = ["add_lazy", "discard_entries", "forward_missed", "forward_moment_rows", "lazy_entries"]


def forward_moment_rows(prob: Problem, mat: Any, values: np.ndarray, offload: OffloadSetup | None = None
                         ) -> list[tuple[list[tuple[int, float]], float, float]]:
    """(entries, value, most) per forward moment t of a candidate with forward rows (:mod:`planner.solve.forward_rows`)
    and per column at its key: the row "discard at t less what the candidate's kept groups hold beyond the
    plain step there >= values[t]"; ``most``: the largest that excess can be (a row with ``value + most <= 0``
    never binds)."""
    if not forward_rows_of(prob):
        return []
    model = prob.model
    forward = np.array([ph == "forward" for ph in model.phases], dtype=bool)
    credited = credited_windows(offload, model.keys) if offload is not None else np.zeros(len(values), np.int64)
    reps = prob.repeat_counts()
    out = []
    for i, rows in forward_rows_of(prob).items():
        cols = mat.k0 + mat.k_off[i] + np.arange(len(prob.candidates[i].classes.members))
        for j, key in enumerate(rows.keys.tolist()):
            const = float(rows.const[j])
            if const <= 0:  # never above the moment's own row
                continue
            weights = [(int(c), float(w) / prob.unit) for c, w in zip(cols, rows.class_weights[:, j]) if w]
            for t in np.flatnonzero(forward & (model.keys == key)).tolist():
                terms: dict = {r: float(c[t]) for r, c in reps.items() if c[t] > 0}
                terms["held"] = {}
                entries = discard_entries(mat, int(prob.node_key[t]), terms, prob.unit, int(credited[t]))
                out.append((entries + [(mat.y0 + i, -const / prob.unit)] + weights, float(values[t]), const))
    return out


def forward_missed(prob: Problem, sol: Solution, budget_bytes: float) -> bool:
    """Whether the plan is over the budget at a moment where a checkpointed module's own forward holds more than
    the step without checkpointing (which the rows without :func:`with_forward_rows` leave out)."""
    over = sol.profile > budget_bytes + NEED_TOL_BYTES
    return any(np.any(prob.model.forward_excess(fqn, save)[over] > 0)
               for fqn, (save, _, _) in sol.decisions.items() if fqn in prob.model.forward_ops)


def add_lazy(prob: Problem, sol: Solution, budget_bytes: float, lazy: dict[int, dict[int, float]]) -> bool:
    """Note, per moment over the budget, what each checkpointed candidate's own save list adds there beyond the
    rows (a recompute holding more than the engines' figure, which is its largest discard's); True if any is new.

    The rows then ask that much of the discards when the candidate is checkpointed, whatever its save list: not
    a valid cut (another save list may hold less), so such a plan is judged against the first bound (``_against``).
    """
    model, index = prob.model, {c.fqn: i for i, c in enumerate(prob.candidates)}
    over = np.flatnonzero(sol.profile > budget_bytes + NEED_TOL_BYTES)
    new = False
    for fqn, (save, _, _) in sol.decisions.items():
        added = model.transient_bytes(fqn, save) - model.transient_bytes(fqn, None)
        if fqn in model.forward_ops and index[fqn] not in forward_rows_of(prob):
            added = added + model.forward_excess(fqn, save)  # a candidate without forward rows (too many ops)
        for t in over[added[over] > 0].tolist():
            known = lazy.setdefault(t, {}).get(index[fqn], 0.0)
            if added[t] > known:
                lazy[t][index[fqn]], new = float(added[t]), True
    return new


def lazy_entries(prob: Problem, mat: Any, offload: OffloadSetup | None, t: int,
                  culprits: dict[int, float]) -> list[tuple[int, float]]:
    """Moment t's row with ``culprits`` (candidate -> bytes) held beside what the rows count there."""
    terms: dict = {i: float(c[t]) for i, c in prob.repeat_counts().items() if c[t] > 0}
    terms["held"] = {i: float(b[t]) for i, b in prob.checkpointed_extra_bytes().items() if b[t] > 0}
    for i, nbytes in culprits.items():
        terms["held"][i] = terms["held"].get(i, 0.0) + nbytes
    credited = 0 if offload is None else int(credited_windows(offload, prob.model.keys[t:t + 1])[0])
    return discard_entries(mat, int(prob.node_key[t]), terms, prob.unit, credited)


def discard_entries(mat: Any, key: int, terms: dict, unit: float, credited: int = 0) -> list[tuple[int, float]]:
    """The discard in effect at a moment, less the inputs held then: the running sum at ``key``, plus
    ``terms[i]`` times candidate i's own discard (``S_i - S_{i-1}``), less ``terms["held"][i] * y_i``; plus the
    running offload of the first ``credited`` windows (with offload)."""
    coef: dict[int, float] = {mat.s0 + key - 1: 1.0} if key > 0 else {}
    if credited and mat.off is not None:
        coef[mat.off.q(credited)] = 1.0
    for i, r in terms.items():
        if i == "held":
            continue
        coef[mat.s0 + i] = coef.get(mat.s0 + i, 0.0) + r
        if i > 0:
            coef[mat.s0 + i - 1] = coef.get(mat.s0 + i - 1, 0.0) - r
    for i, nbytes in terms.get("held", {}).items():
        coef[mat.y0 + i] = coef.get(mat.y0 + i, 0.0) - nbytes / unit
    return list(coef.items())

"""The MILP's offload part (:mod:`planner.solve.milp` with ``offload=``): columns, rows and the decoding.

Added to the MILP's matrix, per candidate c with offloadable groups and class q of its op classes:

* ``f_cq`` in {0..off_cq}: how many of its groups of class q are offloaded (saved, and copied to host
  memory): ``k_cq + f_cq <= mult_cq * y_c``, ``f_cq <= off_cq`` (:func:`planner.solve.offload.offload_options`);
* per window j but the last, ``Q_j`` >= 0, continuous: the bytes (in ``Problem.unit``) windows 0..j offload,
  ``Q_j = Q_{j-1} + sum over c in window j, q of w_q f_cq``;
* per window j, stalls ``sf_j, sb_j >= 0`` costing 1 each: ``sf_j >= (Q_j - Q_{j-1}) / d2h - F_{j+1}``, the
  same with h2d and ``G_{j+1}``.

A checkpointed module's discard D_c is unchanged (offloaded groups count as saved, and ``D_c >= 0`` stays),
so the hull cuts stay valid: (D_c, RC_c) of a decision with offloads is that of the same decision saving them.
A memory row at a moment with key k becomes ``S_{nk(k)} + Q_{J(k)} >= need``, J(k) the windows whose credit
key is at most k (:func:`credited_windows`).

A candidate called more than once offloads per call (``OffloadSetup.per_call``,
:mod:`planner.solve.offload`): its ``f_cq`` join no window sum; ``sum_q w_q f_cq`` joins its running-sum row
(``S_i - S_{i-1} - D_c - sum_q w_q f_cq = 0``), so every row counting its discard, the later calls' included,
counts its offload alike, while ``D_c`` and the hull cuts stay those of the decision saving them; each ``f_cq``
costs ``calls * w_q * (1/d2h + 1/h2d)`` ms (no copy hidden).
"""

from __future__ import annotations

import math

import numpy as np

from planner.solve.offload import OffloadPlan, OffloadSetup, decisions, offload_plan
from planner.solve.problem import Problem

__all__ = ["OffloadColumns", "add_offload_columns", "credited_windows", "decode_offload", "need_pairs"]


class OffloadColumns:
    """Where the offload columns sit in the MILP's matrix."""

    def __init__(self, setup: OffloadSetup, f_col: dict[tuple[int, int], int], q0: int, n_w: int):
        self.setup = setup
        self.f_col = f_col  # (candidate, class) -> column of f
        self.q0 = q0  # Q_0 (then Q_1 .. Q_{n_w - 1}, sf_0.., sb_0..)
        self.n_w = n_w  # windows that may offload: all but the last
        self.per_call_host: list[tuple[int, float]] = []  # per-call f columns and their host bytes (units) each

    def q(self, credited: int) -> int | None:
        """The column of the running offload of the first ``credited`` windows (None for none)."""
        return None if credited <= 0 else self.q0 + credited - 1


def add_offload_columns(mat, prob: Problem, setup: OffloadSetup) -> OffloadColumns:
    """Append the offload columns and their rows to ``mat`` (the MILP's :class:`BudgetMatrix`, built without them)."""
    windows = setup.windows
    n_w = len(windows) - 1
    f_col: dict[tuple[int, int], int] = {}
    cost, ub, integ = [], [], []
    col = mat.n_var
    link = windows.link
    for i, opts in sorted([*setup.options.items(), *setup.per_call.items()]):
        calls = prob.candidates[i].calls if i in setup.per_call else 0
        for q, n in enumerate(opts.counts.tolist()):
            if n:
                f_col[(i, q)] = col
                col += 1
                # per call: both copies of every call are stall (nothing hides them); windows: their sf, sb
                group = float(prob.candidates[i].classes.class_bytes[q])
                cost.append(calls * group * (1 / link.d2h_bytes_per_ms + 1 / link.h2d_bytes_per_ms))
                ub.append(float(n)), integ.append(1.0)
    q0 = col
    cost += [0.0] * n_w + [1.0] * (2 * n_w)  # Q, sf, sb
    ub += [np.inf] * (3 * n_w)
    integ += [0.0] * (3 * n_w)
    mat.n_var = q0 + 3 * n_w
    mat.cost = np.concatenate([mat.cost, cost])
    mat.ub = np.concatenate([mat.ub, ub])
    mat.integrality = np.concatenate([mat.integrality, integ])
    cols = OffloadColumns(setup, f_col, q0, n_w)
    per_window: list[list[tuple[int, float]]] = [[] for _ in range(n_w)]
    for (i, q), c in f_col.items():
        cand = prob.candidates[i]
        mult = float(len(cand.classes.members[q]))
        _row(mat, [(mat.k0 + mat.k_off[i] + q, 1.0), (c, 1.0), (mat.y0 + i, -mult)], -np.inf, 0.0)
        if i in setup.per_call:  # off the device wherever the call's discard is: more of S_i - S_{i-1}
            w = float(cand.classes.class_bytes[q]) / prob.unit
            mat.rows.append(mat.running_rows[i]), mat.cols.append(c), mat.vals.append(-w)
            cols.per_call_host.append((c, cand.calls * w))  # every call's copies are on the host at once
            continue
        per_window[int(windows.candidate_window[i])].append((c, float(cand.classes.class_bytes[q]) / prob.unit))
    for j in range(n_w):
        prev = [] if j == 0 else [(q0 + j - 1, -1.0)]
        _row(mat, [(q0 + j, 1.0)] + prev + [(c, -w) for c, w in per_window[j]], 0.0, 0.0)
        fw, bw = windows.hidden_ms(j)
        for first, per_ms, hidden in ((q0 + n_w, windows.link.d2h_bytes_per_ms, fw),
                                      (q0 + 2 * n_w, windows.link.h2d_bytes_per_ms, bw)):
            ms_per_unit = prob.unit / per_ms
            # stall - (Q_j - Q_{j-1}) * ms per unit >= -hidden
            entries = [(first + j, 1.0), (q0 + j, -ms_per_unit)] + ([(q0 + j - 1, ms_per_unit)] if j else [])
            _row(mat, entries, -hidden, np.inf)
    return cols


def _row(mat, entries, lb: float, ub: float) -> None:
    r = len(mat.lo)
    for c, v in entries:
        mat.rows.append(r), mat.cols.append(c), mat.vals.append(v)
    mat.lo.append(lb), mat.hi.append(ub)


def credited_windows(setup: OffloadSetup, keys: np.ndarray) -> np.ndarray:
    """Per moment, how many windows' offloads are off the device then (windows 0..J-1: credit key <= key)."""
    credit = setup.windows.credit_key[:-1]
    return np.searchsorted(credit, keys, side="right")


def need_pairs(node_key: np.ndarray, credited: np.ndarray, values: np.ndarray) -> list[tuple[int, int, float]]:
    """(candidates finished, windows credited, need): the largest need per pair, without the pairs another
    pair with no more of either and at least its need makes redundant."""
    best: dict[tuple[int, int], float] = {}
    for k, j, v in zip(node_key.tolist(), credited.tolist(), values.tolist()):
        if v > best.get((k, j), -math.inf):
            best[(k, j)] = v
    out: list[tuple[int, int, float]] = []
    width = max((j for _, j in best), default=0) + 1
    most = np.full(width, -math.inf)  # per windows credited: the largest need kept with at most that many
    for (k, j), v in sorted(best.items()):  # by key, then windows: a row is redundant after one it needs less than
        if v > most[: j + 1].max():
            out.append((k, j, v))
            most[j] = max(most[j], v)
    return out


def decode_offload(prob: Problem, mat, cols: OffloadColumns, x: np.ndarray) -> tuple[dict, OffloadPlan]:
    """The checkpointed modules' decisions (fqn -> (save, saved bytes, saved ms)) and their offloads, from the
    solver's counts as they are (no re-picking: a re-picked save list might recompute an offloaded group)."""
    out, offloads = {}, {}
    for i, cand in enumerate(prob.candidates):
        if x[mat.y0 + i] < 0.5:
            continue
        cl = cand.classes
        rec = np.rint(x[mat.k0 + mat.k_off[i]: mat.k0 + mat.k_off[i + 1]]).astype(np.int64)
        off = np.array([int(round(x[cols.f_col[(i, q)]])) if (i, q) in cols.f_col else 0
                        for q in range(len(cl.members))], dtype=np.int64)
        save, offload = decisions(cl, cols.setup.able(i), rec, off)
        m = prob.stats.module(cand.fqn)
        saved_bytes = sum(op.output_bytes for op, s in zip(m.ops, save) if s)
        if cand.act_saved_bytes - saved_bytes <= 0 and not any(offload):
            continue  # frees nothing: checkpointing it would only cost time
        saved_ms = math.fsum(ms for ms, s in zip(m.recompute_runtimes_ms, save) if s)
        out[cand.fqn] = (save, saved_bytes, saved_ms)
        if any(offload):
            offloads[cand.fqn] = offload
    return out, offload_plan(prob, cols.setup.windows, offloads)

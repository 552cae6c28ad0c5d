"""A lower bound on any plan's recompute that trusts none of the planner's engines: a count-space relaxation.

Built here from the problem every engine reads (:func:`planner.solve.problem.prepare`:
the candidates, their frontier points, the needs per moment) and handed to
HiGHS (``scipy.optimize.milp``), whose dual bound no plan can beat:

* the last ``tail_blocks`` blocks (the repeated subtrees, found below any
  module spanning them all) and everything after them are modelled exactly:
  one binary per frontier point of every candidate there, at most one
  checkpoint per root-to-leaf path, every need from the tail's first key on
  (a moment's held inputs and recompute transients once per checkpointed
  holder, later calls' discards, as in :mod:`planner.solve.milp`);
* before the tail every need is dropped, so each subtree there matters only
  through its total discard and recompute: identical subtrees (equal joint
  frontiers, under the same spanning modules) become one integer count per
  point of their joint frontier, the "nothing" point included; a spanning
  module checkpointed leaves every subtree under it at "nothing".

Dropping constraints only lowers the optimum, and a held input of a module
before the tail only tightens a need, so it is left out of the rows that
would count it; a row with a later call of a module before the tail (a
discard that would loosen it) is dropped whole. Needs are loosened by the
byte tolerance the engines allow (``NEED_TOL_BYTES``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint
from scipy.sparse import coo_array

import planner
from planner.highs import quiet_milp
from planner.memory_model import NEED_TOL_BYTES
from planner.solve.giants import for_budget
from planner.solve.problem import Problem, key_needs, prepare

GIB = 2**30


@dataclass
class Bound:
    """HiGHS's dual bound on the relaxation (ms; nan when it has none), what it was built from, and its cost."""

    bound_ms: float
    status: str  # HiGHS's outcome: "optimal", "time limit", "infeasible", or why no bound was built
    tail_blocks: int
    tail_candidates: int
    classes: int
    rows_dropped: int
    seconds: float


def count_space_bound(stats: planner.Stats, budget_gib: float, *, world_size: int = 1, tail_blocks: int = 1,
                      time_limit_s: float = 120.0, mip_rel_gap: float = 1e-7, prob: Problem | None = None) -> Bound:
    """The relaxation's bound at ``budget_gib`` with the last ``tail_blocks`` blocks exact (see the module)."""
    t0 = time.perf_counter()
    prob = prob or prepare(stats, world_size=world_size)
    budget = budget_gib * GIB
    fr = for_budget(prob, prob.frontiers(), key_needs(prob, budget))
    if fr is None:
        return Bound(np.nan, "a spanning module's usable frontier is too long", tail_blocks, 0, 0, 0,
                     time.perf_counter() - t0)
    lp = _Relaxation(prob, fr, _tail_start(fr, tail_blocks))
    dropped = lp.add_needs(prob, budget)
    with np.errstate(all="ignore"):
        res = quiet_milp(np.array(lp.cost), integrality=np.array(lp.integer, dtype=float),
                   bounds=Bounds(np.zeros(len(lp.cost)), np.array(lp.ub, dtype=float)),
                   constraints=LinearConstraint(coo_array((lp.vals, (lp.rows, lp.cols)),
                                                          shape=(len(lp.lo), len(lp.cost))).tocsr(), lp.lo, lp.hi),
                   options={"mip_rel_gap": mip_rel_gap, "time_limit": time_limit_s})
    if res.status == 2:  # no plan of the relaxation, so none of the problem: nothing costs less than +inf
        bound, status = np.inf, "infeasible"
    else:
        bound = float(getattr(res, "mip_dual_bound", np.nan) or np.nan)
        status = {0: "optimal", 1: "time limit"}.get(res.status, f"HiGHS status {res.status}")
    return Bound(bound, status, tail_blocks, len(fr.d) - lp.a, len(lp.class_ids), dropped,
                 time.perf_counter() - t0)


def _tail_start(fr, tail_blocks: int) -> int:
    """The first candidate of the last ``tail_blocks`` blocks: top-level subtrees, looking inside any candidate
    whose subtree holds most of the others (a module spanning the model)."""
    m = len(fr.d)
    roots, k = [], m - 1
    while k >= 0:
        if k - fr.starts[k] > m // 2:
            k -= 1  # spanning: its children are the blocks
            continue
        roots.append(k)
        k = fr.starts[k] - 1
    return fr.starts[roots[min(tail_blocks, len(roots)) - 1]]


class _Relaxation:
    """The variables and rows: integer counts per class point, binaries per tail point, then per tail candidate
    its discard D (GiB) and whether it is checkpointed Y, and P, the discard of everything before the tail."""

    def __init__(self, prob: Problem, fr, a: int):
        self.a, m = a, len(fr.d)
        self.cost, self.ub, self.integer = [], [], []
        self.rows, self.cols, self.vals, self.lo, self.hi = [], [], [], [], []
        spanning = [g for g in range(a, m) if fr.starts[g] < a]
        classes: dict[tuple, list] = {}
        k = a - 1
        while k >= 0:  # the maximal subtrees before the tail
            d, rc = _joint_frontier(fr, k)
            over = tuple(g for g in spanning if fr.starts[g] <= k)
            classes.setdefault((d.tobytes(), rc.tobytes(), over), [d, rc, over, 0])[3] += 1
            k = fr.starts[k] - 1
        self.p = self._var(0.0, np.inf, False)
        self.tail = {c: (self._var(0.0, np.inf, False), self._var(0.0, 1.0, False)) for c in range(a, m)}  # (D, Y)
        self.class_ids = []
        p_terms = [(self.p, 1.0)]
        for d, rc, over, count in classes.values():
            ids = [self._var(float(r), count, True) for r in rc]  # point 0 is "nothing"
            self.class_ids.append(ids)
            self._row([(j, 1.0) for j in ids], count, count)
            p_terms += [(j, -float(x) / GIB) for j, x in zip(ids, d)]
            for g in over:  # g checkpointed: nothing under it is
                self._row([(ids[0], 1.0), (self.tail[g][1], -float(count))], 0.0, np.inf)
        self._row(p_terms, 0.0, 0.0)
        for c in range(a, m):
            ids = [self._var(float(r), 1.0, True) for r in fr.rc[c]]
            dv, yv = self.tail[c]
            self._row([(dv, 1.0)] + [(j, -float(x) / GIB) for j, x in zip(ids, fr.d[c])], 0.0, 0.0)
            self._row([(yv, 1.0)] + [(j, -1.0) for j in ids], 0.0, 0.0)
        for c in range(a, m):  # at most one checkpoint on c and its ancestors
            self._row([(self.tail[q][1], 1.0) for q in range(c, m) if fr.starts[q] <= c], -np.inf, 1.0)

    def _var(self, cost: float, ub: float, integer: bool) -> int:
        self.cost.append(cost)
        self.ub.append(ub)
        self.integer.append(integer)
        return len(self.cost) - 1

    def _row(self, terms, lo: float, hi: float) -> None:
        r = len(self.lo)
        for j, v in terms:
            self.rows.append(r)
            self.cols.append(j)
            self.vals.append(v)
        self.lo.append(lo)
        self.hi.append(hi)

    def add_needs(self, prob: Problem, budget: float) -> int:
        """One row per distinct need from the tail's first key on; how many rows were dropped (see the module)."""
        a, keys = self.a, prob.node_key
        need = (prob.model.base_bytes - budget - NEED_TOL_BYTES) / GIB
        reps, extra = prob.repeat_counts(), prob.checkpointed_extra_bytes()
        best: dict[tuple, float] = {}
        dropped = 0
        for t in np.flatnonzero(keys >= a):
            rep = tuple((i, float(r[t])) for i, r in reps.items() if r[t] > 0)
            if any(i < a for i, _ in rep):
                dropped += 1
                continue
            held = tuple((i, float(e[t]) / GIB) for i, e in extra.items() if e[t] > 0 and i >= a)
            if need[t] + sum(v for _, v in held) <= 0:
                continue  # met by every plan
            sig = (int(keys[t]), rep, held)
            best[sig] = max(best.get(sig, -np.inf), float(need[t]))
        for (key, rep, held), v in best.items():
            terms = [(self.p, 1.0)] + [(self.tail[c][0], 1.0) for c in range(a, key)]
            terms += [(self.tail[i][0], r) for i, r in rep] + [(self.tail[i][1], -e) for i, e in held]
            self._row(terms, v, np.inf)
        return dropped


def _joint_frontier(fr, c: int) -> tuple[np.ndarray, np.ndarray]:
    """Every non-dominated (discard, recompute) of the decisions inside candidate c's subtree; (0, 0) first."""
    d, rc = np.zeros(1, dtype=np.int64), np.zeros(1)
    k = c - 1
    while k >= fr.starts[c]:
        cd, crc = _joint_frontier(fr, k)
        d, rc = _pareto((d[:, None] + cd[None, :]).ravel(), (rc[:, None] + crc[None, :]).ravel())
        k = fr.starts[k] - 1
    d, rc = _pareto(np.concatenate([d, fr.d[c]]), np.concatenate([rc, fr.rc[c]]))
    if d[0] != 0 or rc[0] != 0:  # a free discard dominated "nothing": keep it, a spanning module may need it
        d, rc = np.concatenate([[0], d]), np.concatenate([[0.0], rc])
    return d, rc


def _pareto(d: np.ndarray, rc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    o = np.lexsort((-d, rc))
    d, rc = d[o], rc[o]
    keep = d > np.concatenate([[-1], np.maximum.accumulate(d)[:-1]])
    return d[keep], rc[keep]

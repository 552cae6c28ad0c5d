"""Stacks at tight budgets: the blocks' own memory constraints kept, in count space, through an exchange order.

The count-space relaxation of :mod:`planner.solve.stack.relaxation` drops the constraints of
every block before the last one. Near the smallest feasible budget those are
exactly the ones that bind (each block must leave enough slack for the next),
so its optimum often cannot be dealt out to the blocks.

Here they are kept. Member block j (0-based) taking joint option p must have
``S_j + partial_p(q) >= need(j, q)`` at each of its keys q, where ``S_j`` is
the discard finished before it. With ``T_j = S_j - j * delta`` (``delta``:
how much the needs grow per block) that reads ``T_j >= R_p(j)``; taking
``R_p = min_j R_p(j)`` keeps a relaxation whatever the growth (and loses
nothing when it is linear, as it is for identical blocks). Each block then
moves T by ``g_p = d_p - delta``. For a fixed multiset of options the best
order is known (an exchange argument, as for scheduling jobs that need a
level to start and change it): options with ``g >= 0`` first by increasing
R, then the rest by decreasing ``R + g``. So only counts need choosing: the
options are taken in that order, each any number of times, a copy allowed
when the slack before it meets its R. The first blocks may keep their own R
(``lead_R``) where they are looser than all after them (the first layer of
FSDP2 stats): they take any option, in block order, before the rest.

The search is a dynamic program over (blocks so far, discard so far) with
one Pareto front (more discard for no more recompute) per block count,
pruned by Lagrangian penalties: with ``lam`` the slope of the options' lower
hull around the targets, every plan costs at least its target's
``lower_e`` plus the penalties ``pi_p = rc_p - lam d_p - base >= 0`` of its
options, so no label whose penalties already exceed a guess of the optimum
can lead under it; a second bound (:class:`_LastBlockLine`) keeps the last
block's own R besides the target. The guess grows until a plan lies under
it, which is then the exact optimum of this relaxation.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from planner.memory_model import NEED_TOL_BYTES
from planner.solve.points import lower_hull
from planner.solve.stack.multiset import CountWorkLimit

__all__ = ["OrderedSolution", "ordered_counts"]

_TOL = 1e-12


@dataclass(frozen=True)
class OrderedSolution:
    value: float  # target cost + the options' recompute
    target: int
    sequence: list[int]  # option per member block, in block order


def ordered_counts(d: np.ndarray, rc: np.ndarray, R: np.ndarray, delta: float, s0: float, n: int,
                   need: np.ndarray, cost: np.ndarray, upper: float, *, start: float, first_gap: float = 1e-4,
                   work_limit: float = 2e7, deadline: float = math.inf,
                   lead_R: np.ndarray | None = None) -> tuple[OrderedSolution | None, float]:
    """The cheapest (target, sequence of n options) meeting every block's R and the target, and a lower bound.

    ``d`` (int64 bytes) / ``rc`` (ms) / ``R`` (bytes): the options; ``s0``:
    discard finished before the first block; target e needs
    ``s0 + sum d >= need[e]`` and adds ``cost[e]``. ``start``: a known lower
    bound on the optimum (the plain relaxation's) where the guesses begin.
    ``lead_R`` (lead, options): the first blocks' own R, taken in block order
    before the rest (whose multiset the exchange order deals out).
    Returns ``(solution, its value)`` or ``(None, bound)`` when no sequence
    costs less than ``upper``. Raises :class:`CountWorkLimit` past
    ``work_limit`` label extensions, or when a round would start after
    ``deadline`` (``time.perf_counter()``).
    """
    d = np.asarray(d, dtype=np.int64)
    rc = np.asarray(rc, dtype=np.float64)
    need = np.asarray(need, dtype=np.float64) - s0
    cost = np.asarray(cost, dtype=np.float64)
    if n == 0:
        ok = np.flatnonzero(need <= NEED_TOL_BYTES)
        if len(ok) == 0:
            return None, upper
        e = int(ok[np.argmin(cost[ok])])
        return (OrderedSolution(float(cost[e]), e, []), float(cost[e])) if cost[e] < upper else (None, upper)
    lam, base = _supporting_line(d, rc, need, cost, n)
    pi = np.maximum(rc - lam * d - base, 0.0)
    lower = cost + n * base + lam * np.maximum(need, 0.0)
    floor = float(lower.min())
    g = d - delta
    pos = g >= 0
    # the exchange order: gainers by increasing R, then the rest by decreasing R + g
    order = np.concatenate([np.flatnonzero(pos)[np.argsort(R[pos], kind="stable")],
                            np.flatnonzero(~pos)[np.argsort(-(R[~pos] + g[~pos]), kind="stable")]])
    R = np.asarray(R, dtype=np.float64) - s0  # slack is measured with s0 taken out, as the needs are
    lead_R = np.zeros((0, len(d))) if lead_R is None else np.asarray(lead_R, dtype=np.float64) - s0
    # the last block must not be a lead block: the bound takes its R from the shared ones
    last = _LastBlockLine(d, rc, R, delta, n, need, cost) if len(lead_R) < n else None
    start = max(start, last(0, 0.0)) if last is not None else start
    guess = max(start, floor) + first_gap * max(abs(start), 1e-9)
    spent = 0.0
    while True:
        if time.perf_counter() > deadline:
            raise CountWorkLimit
        cap = min(guess, upper)
        sol, work, exhaustive = _search(d, rc, R, delta, n, need, cost, pi, lam, base, order, cap - floor, cap,
                                        work_limit - spent, deadline, lead_R, last)
        spent += work
        if sol is not None:  # the cheapest under cap, or the cheapest of all when nothing was pruned
            return (sol, sol.value) if sol.value < upper else (None, upper)
        if cap >= upper or exhaustive:
            return None, upper if exhaustive else cap
        guess = start + 2.0 * (guess - start)


class _LastBlockLine:
    """A lower bound on what blocks k.. and the target still cost, from the discard D after k blocks.

    The last block's option q is taken with the target e: together they need
    ``D_(n-1) >= x_qe = max(R_q + (n-1) delta, need_e - d_q)`` (q's own R and
    the target, which q's discard helps meet) and cost ``rc_q + cost_e``.
    The blocks before it are dualized as in :func:`_supporting_line` over
    those pairs: each costs at least ``base + lam d``, so the rest costs at
    least ``(n-1-k) base + min_qe (rc_q + cost_e + lam x_qe) - lam D``. At
    tight budgets the needs grow faster per block than any option discards
    and the slack only shrinks: the last block's R is what binds, and the
    target's Lagrangian alone sat 0.6% under the optimum (405B FSDP2 stats at
    their smallest budget).
    """

    def __init__(self, d, rc, R, delta, n, need, cost):
        self.n, self.base, self.lam, self.floor = n, 0.0, 0.0, -math.inf
        self.mid = self.end = np.zeros(len(d))
        if n < 2:
            return
        x = np.maximum(R[:, None] + (n - 1) * delta, need[None, :] - d[:, None].astype(np.float64)).ravel()
        c = (rc[:, None] + cost[None, :]).ravel()
        ok = np.isfinite(x) & np.isfinite(c)
        if not ok.any():
            return
        xp, cp, _ = _pareto_targets(x[ok], c[ok])
        self.lam, self.base = _supporting_line(d, rc, xp, cp, n - 1)
        self.floor = float(np.min(cp + self.lam * xp))
        # what each option adds over the bound at the start: before the last block, and as the last one
        self.mid = np.maximum(rc - self.base - self.lam * d, 0.0)
        self.end = np.min(np.where(ok, c + self.lam * x, np.inf).reshape(len(d), -1), axis=1) - self.floor

    def __call__(self, k: int, D):
        """The bound for labels with k <= n-1 blocks and discard D (their own cost left out)."""
        return (self.n - 1 - k) * self.base + self.floor - self.lam * D


def _pareto_targets(x: np.ndarray, c: np.ndarray):
    """Targets no other beats on both need and cost, by ascending need."""
    order = np.lexsort((c, x))
    x, c = x[order], c[order]
    ok = c < np.concatenate([[np.inf], np.minimum.accumulate(c)[:-1]])
    return x[ok], c[ok], order[ok]


def _supporting_line(d, rc, need, cost, n) -> tuple[float, float]:
    """(lam, base) with rc >= base + lam d for every option, chosen to make the Lagrangian floor highest.

    The floor ``min_e cost_e + n base + lam max(need_e, 0)`` is concave in
    ``lam`` and piecewise linear with breaks at the slopes of the options'
    lower hull, so its maximum is at one of those slopes (or 0).
    """
    x = d.astype(np.float64)
    _, _, slopes = lower_hull(x, rc)
    best = (-math.inf, 0.0, float(np.min(rc)))
    for lam in np.concatenate([[0.0], np.maximum(slopes, 0.0)]).tolist():
        base = float(np.min(rc - lam * x))
        floor = float(np.min(cost + n * base + lam * np.maximum(need, 0.0)))
        if floor > best[0]:
            best = (floor, lam, base)
    return best[1], best[2]


def _search(d, rc, R, delta, n, need, cost, pi, lam, base, order, room, cap, work_limit, deadline=math.inf,
            lead_R=None, last=None):
    """The cheapest sequence costing less than ``cap``, exactly; None if there is none.

    The first ``len(lead_R)`` blocks take any option, in block order, each meeting its own R; the labels
    after them (one front: only discard and cost matter from there) start the exchange-order pass.
    Raises :class:`CountWorkLimit` past ``work_limit`` label extensions or ``deadline``.
    """
    if room < 0:
        return None, 0.0, False
    use = [int(p) for p in order if pi[p] <= room]
    room2 = cap - last(0, 0.0) if last is not None else math.inf  # an option's penalty past the start (_LastBlockLine)
    if last is not None:
        use = [p for p in use if min(last.mid[p], last.end[p]) <= room2 + _TOL * (1 + abs(cap))]
    exhaustive = len(use) == len(order)  # until a label is dropped for its penalties
    # every block still to come takes this option or a later one: at least the smallest penalty among them
    rest = np.minimum.accumulate(pi[use][::-1])[::-1] if use else np.zeros(0)
    labels = _Labels()
    fronts: list[np.ndarray] = [np.zeros(1, np.int64)] + [np.zeros(0, np.int64) for _ in range(n)]
    work = 0
    tol = _TOL * (1 + abs(cap))
    lead = 0 if lead_R is None else min(len(lead_R), n)
    steps = [(k, t, p, float(lead_R[k][p]), float(rest[0])) for k in range(lead) for t, p in enumerate(use)]
    steps += [(None, t, p, float(R[p]), float(rest[t])) for t, p in enumerate(use)]
    for at, t, p, cut, least in steps:
        if time.perf_counter() > deadline:  # one option's pass is short; a whole search is not
            raise CountWorkLimit
        dp, rp = float(d[p]), float(rc[p])
        for k in (range(lead, n) if at is None else (at,)):
            ids = fronts[k]
            if len(ids) == 0:
                continue
            if last is not None and (last.mid[p] if k < n - 1 else last.end[p]) > room2 + tol:
                exhaustive = False
                continue
            D, C = labels.D, labels.C
            ok = ids[D[ids] - k * delta >= cut - NEED_TOL_BYTES]  # the slack before this copy meets its R
            if len(ok) == 0:
                continue
            nd, nc = D[ok] + dp, C[ok] + rp
            # penalties so far, and the least the blocks after this one will add
            alive = nc - (k + 1) * base - lam * nd + (n - k - 1) * least <= room + tol
            if last is not None and k + 1 < n:  # and the last block's own constraint (_LastBlockLine)
                alive &= nc + last(k + 1, nd) <= cap + tol
            if not alive.all():
                exhaustive = False
                ok, nd, nc = ok[alive], nd[alive], nc[alive]
                if len(ok) == 0:
                    continue
            work += len(ok)
            if work > work_limit:
                raise CountWorkLimit
            fronts[k + 1] = _merge(fronts[k + 1], nd, nc, ok, p, labels)
    D, C, parent, opt = labels.D, labels.C, labels.parent, labels.opt
    ids = fronts[n]
    if len(ids) == 0:
        return None, float(work), exhaustive
    ids = ids[np.argsort(D[ids], kind="stable")]
    suffix = np.concatenate([np.minimum.accumulate(C[ids][::-1])[::-1], [np.inf]])
    j = np.searchsorted(D[ids], need - NEED_TOL_BYTES, side="left")  # first label meeting each target
    total = cost + suffix[j]
    e = int(np.argmin(total))
    if not np.isfinite(total[e]) or not (total[e] < cap or exhaustive):
        return None, float(work), exhaustive
    label = int(ids[j[e] + int(np.argmin(C[ids][j[e]:]))])
    seq = []
    while parent[label] >= 0:
        seq.append(int(opt[label]))
        label = int(parent[label])
    seq.reverse()  # the exchange order is block order
    value = math.fsum([float(rc[p]) for p in seq] + [float(cost[e])])
    if not (value < cap or exhaustive):  # the search's sum and the exact one may differ in the last bits
        return None, float(work), False
    return OrderedSolution(value, e, seq), float(work), exhaustive


class _Labels:
    """Growing arrays of labels: discard, cost, parent label, option (views trimmed to the used length)."""

    def __init__(self):
        self._d, self._c = np.zeros(1024), np.zeros(1024)
        self._parent, self._opt = np.full(1024, -1, np.int64), np.full(1024, -1, np.int64)
        self.n = 1  # label 0: no block yet

    def add(self, d, c, parent, opt) -> np.ndarray:
        end = self.n + len(d)
        if end > len(self._d):
            size = max(end, 2 * len(self._d))
            for name in ("_d", "_c", "_parent", "_opt"):
                old = getattr(self, name)
                grown = np.empty(size, old.dtype)
                grown[: self.n] = old[: self.n]
                setattr(self, name, grown)
        self._d[self.n:end], self._c[self.n:end] = d, c
        self._parent[self.n:end], self._opt[self.n:end] = parent, opt
        ids = np.arange(self.n, end)
        self.n = end
        return ids

    D = property(lambda self: self._d[: self.n])
    C = property(lambda self: self._c[: self.n])
    parent = property(lambda self: self._parent[: self.n])
    opt = property(lambda self: self._opt[: self.n])


def _merge(front: np.ndarray, nd: np.ndarray, nc: np.ndarray, parent: np.ndarray, p: int,
           labels: _Labels) -> np.ndarray:
    """The front with the new labels (discard, cost, parent) of option p merged in: the labels no other beats on
    both discard (more) and cost (less), most discard first. Only the new labels that survive are stored (most do
    not, and storing every one was most of the search's time on 405B FSDP2 stats); ties go to the front's."""
    all_d = np.concatenate([labels.D[front], nd])
    all_c = np.concatenate([labels.C[front], nc])
    order = np.lexsort((all_c, -all_d))  # most discard first, cheapest first among equals
    c = all_c[order]
    keep = np.ones(len(order), bool)
    keep[1:] = c[1:] < np.minimum.accumulate(c)[:-1] - _TOL * (1 + np.abs(c[1:]))
    sel = order[keep]
    old = sel < len(front)
    added = np.sort(sel[~old]) - len(front)
    ids = labels.add(nd[added], nc[added], parent[added], p)
    out = np.empty(len(sel), np.int64)
    out[old] = front[sel[old]]
    out[~old] = ids[np.searchsorted(added, sel[~old] - len(front))]
    return out

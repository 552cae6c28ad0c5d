"""Exact knapsack over identical items: n copies of one frontier, many targets.

The count-space relaxation of a stack of identical blocks (see
:mod:`planner.solve.stack.relaxation`) asks, for a list of targets ``(need_e, cost_e)``,

    min over e of  cost_e + min { sum rc_p over a multiset of n points : sum d_p >= need_e }

where every point comes from the same frontier (the zero point included).
Which block takes which point does not matter, so the search is over counts.

It is solved exactly through the LP. Let ``a`` and ``b`` be the lower-hull
vertices around the LP optimum and ``lam`` the slope between them; every
point then has a penalty ``pi_p = rc_p - lam d_p - (rc_a - lam d_a) >= 0``.
For any multiset, split its n items into a-slots and b-slots (each item goes
to the nearer of the two) and write ``x_p = d_p - d_a`` or ``d_p - d_b``; then

    sum rc = n (rc_a - lam d_a) + lam need_e + sum pi + lam * excess,
    excess = sum d - need_e = x_A + x_B + n d_a + n_b (d_b - d_a) - need_e >= 0.

So a plan costs the LP bound plus its penalties plus ``lam`` per excess byte,
and only multisets with ``sum pi`` below the gap to a known upper bound can
beat it. The a-side and b-side deviations are enumerated separately as
dominance fronts (more discard for at most ``lam`` per byte more penalty
dominates), per item count, then joined for each b-slot count ``n_b``.
Nothing is rounded: discards are exact integers, and a search that finds no
multiset under the upper bound proves there is none.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from planner.solve.points import lower_hull
from planner.solve.stack.completion import CompletionBound
from planner.solve.stack.greedy import greedy_counts
from planner.solve.stack.group import GroupRelaxation, group_relaxation

__all__ = ["CountSolution", "CountWorkLimit", "min_cost_counts"]

_TOL = 1e-12


class CountWorkLimit(Exception):
    """The enumeration outgrew its work allowance; ``lower``: what was proven by then (no solution costs less),
    when anything was."""

    def __init__(self, lower: float | None = None):
        super().__init__()
        self.lower = lower


@dataclass(frozen=True)
class CountSolution:
    value: float  # cost_e + the multiset's recompute
    target: int  # index e of the target met
    counts: dict[int, int]  # point index -> how many items take it


class _Front:
    """Multisets of menu points, as a dominance front per item count.

    A label is a multiset: ``x`` the sum of its discard offsets, ``p`` the sum
    of its penalties. Label i dominates j when ``x_i >= x_j`` and
    ``p_i + lam x_i <= p_j + lam x_j``: whatever is added to both, i has at
    least as much discard for no more cost. ``snap[k]`` lists the front over
    multisets of at most k items (adding a point to a front label of k items
    dominates adding it to what that label dominates, so extending only the
    labels new in round k gives the front of round k + 1).
    """

    def __init__(self, x_menu: np.ndarray, p_menu: np.ndarray, lam: float, cap: float, kmax: int,
                 work_limit: float, may_lead=None):
        self.x = np.zeros(1, np.int64)
        self.p = np.zeros(1)
        self.parent = np.full(1, -1)
        self.edge = np.full(1, -1)
        self.snap = [np.zeros(1, np.int64)]
        self.work = 0
        alive = np.ones(1, bool)
        new = np.zeros(1, np.int64)
        by_p = np.argsort(p_menu, kind="stable")
        p_sorted = p_menu[by_p]
        for _ in range(kmax):
            if len(new) == 0 or len(x_menu) == 0:
                break
            # pairs (label, menu point) within the penalty cap, cheapest points first
            fits = np.searchsorted(p_sorted, cap - self.p[new], side="right")
            total = int(fits.sum())
            self.work += total + len(new)
            if self.work > work_limit:
                raise CountWorkLimit
            row = np.repeat(np.arange(len(new)), fits)
            col = by_p[np.arange(total) - np.repeat(np.cumsum(fits) - fits, fits)]
            cx, cp = self.x[new[row]] + x_menu[col], self.p[new[row]] + p_menu[col]
            if may_lead is not None:  # only what may still complete under the cap (every completion of a
                # label dropped here, and of any label it dominates, costs at least the cap)
                ok = may_lead(cx, cp)
                row, col, cx, cp = row[ok], col[ok], cx[ok], cp[ok]
            cv = cp + lam * cx
            # drop what the current front dominates (cheap: one search per candidate)
            old = np.flatnonzero(alive)
            old = old[np.argsort(self.x[old], kind="stable")]
            ox, ov = self.x[old], self.p[old] + lam * self.x[old]
            o_suffix = np.concatenate([np.minimum.accumulate(ov[::-1])[::-1], [np.inf]])
            ok = o_suffix[np.searchsorted(ox, cx, side="left")] > cv + _TOL * (1.0 + np.abs(cv))
            row, col, cx, cp, cv = row[ok], col[ok], cx[ok], cp[ok], cv[ok]
            # then what the candidates dominate among themselves (equal x in any order: at worst a spare label)
            order = np.argsort(cx)
            row, col, cx, cp, cv = row[order], col[order], cx[order], cp[order], cv[order]
            later = np.concatenate([np.minimum.accumulate(cv[::-1])[::-1][1:], [np.inf]])
            keep = np.flatnonzero(later > cv + _TOL * (1.0 + np.abs(cv)))
            # and the old labels the survivors dominate
            n_suffix = np.concatenate([np.minimum.accumulate(cv[keep][::-1])[::-1], [np.inf]])
            beaten = n_suffix[np.searchsorted(cx[keep], ox, side="left")] < ov - _TOL * (1.0 + np.abs(ov))
            alive[old[beaten]] = False
            n0 = len(self.x)
            self.x = np.concatenate([self.x, cx[keep]])
            self.p = np.concatenate([self.p, cp[keep]])
            self.parent = np.concatenate([self.parent, new[row[keep]]])
            self.edge = np.concatenate([self.edge, col[keep]])
            alive = np.concatenate([alive, np.ones(len(keep), bool)])
            new = np.arange(n0, len(self.x))
            self.snap.append(np.flatnonzero(alive))

    def at(self, k: int) -> np.ndarray:
        return self.snap[min(k, len(self.snap) - 1)]

    def items(self, label: int) -> list[int]:
        out = []
        while self.parent[label] >= 0:
            out.append(int(self.edge[label]))
            label = int(self.parent[label])
        return out


def min_cost_counts(d: np.ndarray, rc: np.ndarray, n: int, need: np.ndarray, cost: np.ndarray, upper: float,
                    *, first_gap: float = 1e-5, max_gap: float = math.inf, rel_gap: float = 0.0,
                    work_limit: float = 2e7, deadline: float = math.inf,
                    cache: dict | None = None) -> tuple[CountSolution | None, float]:
    """The cheapest (target, multiset) pair costing less than ``upper``, and a proven lower bound.

    Returns ``(solution, lower)``: the optimum and its own value, or
    ``(None, lower)`` when no pair costs less than ``lower`` and the search
    stopped there: at ``upper``, or when the guess passed ``max_gap``
    (relative to the LP bound) without a solution.

    ``d`` (int64, bytes) and ``rc`` (ms): the frontier points, the zero point
    among them; ``n`` items each take one point; target e needs
    ``sum d >= need[e]`` and adds ``cost[e]``. The search looks below
    growing guesses (``first_gap`` above the LP bound, four times further
    each round), so a good solution is found without enumerating up to
    ``upper``. Raises :class:`CountWorkLimit` when the enumeration outgrows
    ``work_limit`` label extensions or a round would start after ``deadline``
    (``time.perf_counter()``).

    First the group relaxation (:mod:`planner.solve.stack.group`) lifts the
    LP bound to what landing on the discard lattice costs, and often comes
    with a multiset meeting it: returned at once when within ``rel_gap``
    (relative) of it, the bound returned beside it (with ``rel_gap`` 0, only
    an optimum). ``cache``: its paths, shared by calls on one frontier.
    """
    cost = np.asarray(cost, dtype=np.float64)
    # a point another beats on both discard and recompute is never needed
    order = np.lexsort((-np.asarray(d), rc))
    useful = order[np.asarray(d)[order] > np.concatenate([[-1], np.maximum.accumulate(np.asarray(d)[order])[:-1]])]
    if len(useful) < len(d):
        sol, lower = min_cost_counts(np.asarray(d)[useful], np.asarray(rc)[useful], n, need, cost, upper,
                                     first_gap=first_gap, max_gap=max_gap, rel_gap=rel_gap, work_limit=work_limit,
                                     deadline=deadline, cache=cache)
        if sol is not None:
            sol = CountSolution(sol.value, sol.target, {int(useful[p]): c for p, c in sol.counts.items()})
        return sol, lower
    x = d.astype(np.float64)
    need = np.maximum(np.asarray(need, dtype=np.float64), n * float(x.min()))  # no multiset discards less
    hx, hy, _ = lower_hull(x, rc)
    if n == 0 or len(hx) == 1:  # nothing to choose: every item takes the cheapest point
        low = int(np.argmin(rc))
        ok = np.flatnonzero(need <= n * x[low])
        if len(ok) == 0:
            return None, upper
        e = int(ok[np.argmin(cost[ok])])
        value = float(cost[e] + n * rc[low])
        return (CountSolution(value, e, {low: n} if n else {}), value) if value < upper else (None, upper)
    per_item = np.maximum(need / n, 0.0)
    lp = np.where(per_item > hx[-1], np.inf, cost + n * np.interp(per_item, hx, hy))
    e0 = int(np.argmin(lp))
    if not lp[e0] < upper:
        return None, upper
    s = min(max(int(np.searchsorted(hx, per_item[e0], side="right")) - 1, 0), len(hx) - 2)
    lam = float((hy[s + 1] - hy[s]) / (hx[s + 1] - hx[s]))
    a = int(np.argmin(np.where(x == hx[s], rc, np.inf)))
    b = int(np.argmin(np.where(x == hx[s + 1], rc, np.inf)))
    base = rc - lam * x
    pi = np.maximum(base - base[a], 0.0)
    lower = cost + n * base[a] + lam * need  # a valid bound per target
    floor = float(np.min(lower))
    rounded = _rounded_solution(d, rc, n, need, cost, a, b)  # a real multiset: it bounds what is worth searching
    greedy = greedy_counts(d, rc, n, need, cost, lower, pi, lam, a, b)  # often much closer (the paths cost less)
    if greedy is not None and (rounded is None or greedy[0] < rounded.value):
        rounded = CountSolution(*greedy)
    known = min(upper, rounded.value if rounded is not None else math.inf)
    group = group_relaxation(d, rc, n, need, lower, lam, a, pi, upper=known, cache=cache)
    held = rounded  # the best real multiset in hand
    completion = None
    if group is not None:  # the lattice's own bound, often met by a plan from it
        floor = max(floor, float(np.min(group.bound)))
        if not floor < upper:
            return None, upper
        sol = _group_solution(group, d, rc, n, need, cost)
        if rounded is not None and (sol is None or rounded.value < sol.value):
            sol = rounded
        tol = 1e-12 * (1.0 + abs(floor))
        if sol is not None and sol.value < upper and sol.value <= floor + rel_gap * abs(sol.value) + tol:
            return sol, sol.value if sol.value <= floor + tol else floor
        held = sol
        # the relaxation's own room and allowance (its ties, and the slack of a search of any number of
        # deviations), at least the 3 n ties paths shared from another budget's call may skip
        completion = CompletionBound(group, need, lower, group.room, max(group.off, 3 * n * group.tie))
    if held is not None and not held.value < upper:
        held = None
    return _guesses(d, rc, n, need, cost, lower, pi, lam, a, b, floor, upper, held, first_gap, max_gap, work_limit,
                    deadline, completion)


def _guesses(d, rc, n, need, cost, lower, pi, lam, a, b, floor, upper, held, first_gap, max_gap, work_limit,
             deadline, completion=None) -> tuple[CountSolution | None, float]:
    """The search below growing guesses from ``floor`` (a proven bound), up to ``held`` (a real multiset, or
    None) or ``upper``: min_cost_counts' answer. ``completion``: the group relaxation's cost-to-go, which the
    search prunes its partial multisets with."""
    guess = floor + first_gap * max(abs(floor), 1e-9)
    spent = 0.0
    proven = min(floor, upper)  # the LP's and the lattice's bound, then each guess searched in full
    base = min(float(np.min(lower)), floor)
    while True:
        if time.perf_counter() > deadline:
            raise CountWorkLimit(proven)
        cap = min(guess, upper)
        at_held = held is not None and cap >= held.value
        if at_held:  # the multiset in hand costs no more than the guess: search only below it
            cap = held.value
        try:
            sol, work = _search(d, rc, n, need, cost, lower, pi, lam, a, b, cap, work_limit - spent, completion)
        except CountWorkLimit:
            raise CountWorkLimit(proven) from None
        spent += work
        if sol is not None:
            return sol, sol.value
        if at_held:  # nothing costs less than the multiset in hand: it is the optimum
            return held, held.value
        if cap >= upper or guess - floor > max_gap * abs(floor):
            return None, cap
        proven = cap  # nothing costs less than cap
        # (growing the guess eightfold after cheap rounds saved 8B stacks half their rounds, but overshot into the
        # work limit on a 405B FSDP2 budget the doubling proves: not done)
        # The round's work follows its room over the LP bound (cap - min(lower)), not its gap over the floor: where
        # the lattice lifts the floor far above the LP, rounds doubling only the gap over it all cost the same
        # (8B --world-size 64 at 33.5 GiB: 11 rounds of 0.034-0.067 s to reach a multiset 0.6% above the floor)
        guess = base + 2.0 * (guess - base)


def _rounded_solution(d, rc, n, need, cost, a, b) -> CountSolution | None:
    """The cheapest multiset of the two hull vertices only (the LP's counts rounded up), over every target."""
    w = int(d[b]) - int(d[a])
    if w <= 0:
        return None
    kb = np.maximum(np.ceil((need - n * float(d[a])) / w), 0.0)
    value = np.where(kb <= n, cost + kb * float(rc[b]) + (n - kb) * float(rc[a]), np.inf)
    e = int(np.argmin(value))
    if not math.isfinite(value[e]):
        return None
    k = int(kb[e])
    counts = {p: c for p, c in ((a, n - k), (b, k)) if c > 0}
    if sum(int(d[p]) * c for p, c in counts.items()) < need[e]:
        return None  # float rounding of the count: leave it to the search
    return CountSolution(math.fsum([float(rc[p]) * c for p, c in counts.items()] + [float(cost[e])]), e, counts)


def _group_solution(group: GroupRelaxation, d, rc, n, need, cost, tries: int = 3) -> CountSolution | None:
    """The cheapest multiset built from the group relaxation's paths for its few best targets."""
    best = None
    for e in np.argsort(group.bound, kind="stable")[:tries].tolist():
        counts = group.counts(d, n, float(need[e]))
        if counts is None or sum(int(d[p]) * k for p, k in counts.items()) < need[e]:
            continue
        value = math.fsum([float(rc[p]) * k for p, k in counts.items()] + [float(cost[e])])
        if best is None or value < best.value:
            best = CountSolution(value, e, counts)
    return best


def _search(d, rc, n, need, cost, lower, pi, lam, a, b, cap, work_limit, completion=None):
    """The cheapest solution costing less than ``cap``, exactly; None if there is none."""
    may_lead, ok = None, lower < cap
    if completion is not None:  # targets and partial multisets that may still lead under the cap
        targets = completion.cheapest(cap)
        ok &= completion.bound < cap

        def may_lead(x, p):
            return p + targets.least(x) < cap
    live = np.flatnonzero(ok)
    if len(live) == 0:
        return None, 0.0
    room = float(cap - lower[live].min())  # no solution under cap has more penalty than this
    da, db = int(d[a]), int(d[b])
    w = db - da
    idx = np.arange(len(d))
    near_a = d.astype(np.float64) <= 0.5 * (da + db)
    menu_a = idx[near_a & (idx != a) & (pi <= room)]
    menu_b = idx[~near_a & (idx != b) & (pi <= room)]
    fa = _Front(d[menu_a] - da, pi[menu_a], lam, room, n, work_limit / 2, may_lead)
    fb = _Front(d[menu_b] - db, pi[menu_b], lam, room, n, work_limit / 2, may_lead)
    work = float(fa.work + fb.work)
    x_hi = float(fa.x[fa.snap[-1]].max() + fb.x[fb.snap[-1]].max())
    x_lo = float(fa.x[fa.snap[-1]].min() + fb.x[fb.snap[-1]].min())
    sorted_b: dict[int, tuple] = {}
    best = (math.inf, -1, -1, -1, -1)
    for e in live.tolist():
        r = need[e] - n * da  # what the b-slots and deviations must add over all-a
        slack_ms = cap - lower[e]
        n_lo = max(0, math.ceil((r - x_hi) / w))
        n_hi = min(n, math.floor((r - x_lo + slack_ms / lam) / w)) if lam > 0 else n
        for n_b in range(n_lo, n_hi + 1):
            t = r - n_b * w  # deviations must add at least t
            la = fa.at(n - n_b)
            if n_b not in sorted_b:
                lb = fb.at(n_b)
                lb = lb[np.argsort(fb.x[lb], kind="stable")]
                vb = fb.p[lb] + lam * fb.x[lb]
                sorted_b[n_b] = (lb, fb.x[lb], np.concatenate([np.minimum.accumulate(vb[::-1])[::-1], [np.inf]]), vb)
            lb, xb, suffix, vb = sorted_b[n_b]
            j = np.searchsorted(xb, t - fa.x[la], side="left")
            total = fa.p[la] + lam * fa.x[la] + suffix[j]
            k = int(np.argmin(total))
            value = float(lower[e] + total[k] - lam * t)
            if value < best[0]:
                jb = int(j[k]) + int(np.argmin(vb[j[k]:]))
                best = (value, e, n_b, int(la[k]), int(lb[jb]))
    value, e, n_b, label_a, label_b = best
    if e < 0 or not value < cap:
        return None, work
    counts: dict[int, int] = {}
    dev_a = [int(menu_a[q]) for q in fa.items(label_a)]
    dev_b = [int(menu_b[q]) for q in fb.items(label_b)]
    for p in dev_a + dev_b:
        counts[p] = counts.get(p, 0) + 1
    counts[a] = counts.get(a, 0) + n - n_b - len(dev_a)
    counts[b] = counts.get(b, 0) + n_b - len(dev_b)
    counts = {p: c for p, c in counts.items() if c > 0}
    exact = math.fsum([float(rc[p]) * c for p, c in counts.items()] + [float(cost[e])])
    if not exact < cap:  # the search's sum and the exact one may differ in the last bits
        return None, work
    return CountSolution(exact, e, counts), work

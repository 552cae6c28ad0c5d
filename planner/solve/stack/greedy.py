"""A good multiset of the count problem, found greedily: an upper bound before the exact search.

The exact machinery of :mod:`planner.solve.stack.multiset` (the group relaxation, then the search under it)
follows every path cheaper than the best multiset in hand, so that multiset's cost sets its work. The LP's
counts rounded to the two hull vertices leave up to one lattice step of excess (Llama-3 405B FSDP2 x128 at
506.39 GiB: 7.52 ms over the LP bound, where the optimum is 2.22 ms over it). Here each item may also leave
its vertex for a deviation: with ``n_b`` items near ``b`` the rest near ``a``, the excess is shaved by the
deviations that fit it (or, short of the target, filled by those adding discard), best first. Nothing here is
claimed optimal: the caller checks the multiset like any other.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["greedy_counts"]


def greedy_counts(d: np.ndarray, rc: np.ndarray, n: int, need: np.ndarray, cost: np.ndarray, lower: np.ndarray,
                  pi: np.ndarray, lam: float, a: int, b: int, targets: int = 2,
                  spread: int = 2) -> tuple[float, int, dict[int, int]] | None:
    """The cheapest greedy multiset over the ``targets`` targets of least LP bound and the ``2 spread + 1``
    counts of b-slots around the LP's: (value, target, point -> count), or None."""
    w = int(d[b]) - int(d[a])
    if w <= 0 or n <= 0:
        return None
    d = np.asarray(d, dtype=np.int64)
    near_a = d.astype(np.float64) <= 0.5 * (int(d[a]) + int(d[b]))
    off = d - np.where(near_a, d[a], d[b])  # bytes over the item's own vertex
    side = near_a.astype(np.int64)  # 0: a b-slot, 1: an a-slot
    best = None
    for e in np.argsort(lower, kind="stable")[:targets].tolist():
        short = float(need[e]) - n * float(d[a])  # what the items must add over all-a
        if not math.isfinite(short):
            continue
        nb0 = math.ceil(short / w)
        for nb in range(max(nb0 - spread, 0), min(nb0 + spread, n) + 1):
            for by_ratio in (False, True):
                devs = _shave(off, pi, lam, side, n, nb, nb * w - short, by_ratio)
                if devs is None:
                    continue
                counts = dict(devs)
                used = np.bincount(side[list(devs)], weights=list(devs.values()), minlength=2) if devs else (0, 0)
                for p, k in ((b, nb - int(used[0])), (a, n - nb - int(used[1]))):
                    if k > 0:
                        counts[p] = counts.get(p, 0) + k
                if sum(int(d[p]) * k for p, k in counts.items()) < need[e]:
                    continue  # float rounding of the excess: not a multiset meeting the target
                value = math.fsum([float(rc[p]) * k for p, k in counts.items()] + [float(cost[e])])
                if best is None or value < best[0]:
                    best = (value, e, counts)
    return best


def _shave(off, pi, lam, side, n, nb, excess, by_ratio) -> dict[int, int] | None:
    """Deviations (point -> count) bringing ``excess`` (bytes, maybe negative) to at least 0 and shaving it
    while that pays: adding by least penalty per byte still missing, shaving by most saved (or best ratio)."""
    free = np.array([nb, n - nb], dtype=np.int64)
    devs: dict[int, int] = {}
    moving = off != 0
    for _ in range(2 * n + 2):
        has = moving & (free[side] > 0)
        if excess < 0:
            ok = has & (off > 0)
            if not ok.any():
                return None
            score = np.where(ok, pi / np.maximum(np.minimum(off, -excess), 1), np.inf)
            p, k = int(np.argmin(score)), 1
        else:
            ok = has & (off < 0) & (excess + off >= 0) & (pi + lam * off < 0)
            if not ok.any():
                break
            score = np.where(ok, pi / np.maximum(-off, 1) if by_ratio else pi + lam * off, np.inf)
            p = int(np.argmin(score))
            k = int(min(free[side[p]], excess // -int(off[p])))  # the same point again while it fits
        devs[p] = devs.get(p, 0) + k
        excess += k * int(off[p])
        free[side[p]] -= k
    return devs if excess >= 0 else None

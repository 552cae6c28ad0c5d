"""Sets of (discard, recompute) points: lower convex hulls, and absorbing near-duplicates.

The bounds and cuts of every engine rest on lower hulls; every engine that
trades a hair of optimality for shorter lists absorbs near-duplicate points
the same way.
"""

from __future__ import annotations

import math

import numpy as np

from planner.memory_model import MIB

__all__ = ["absorbed", "hull_vertices", "lower_hull"]


def lower_hull(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vertices of the lower convex hull of the points, left to right.

    Returns ``(x, y, slopes)``: the vertices and the slope of each edge
    between consecutive vertices (one fewer). Of points sharing an x, only
    the lowest can be a vertex.
    """
    order = np.lexsort((ys, xs))
    xs, ys = np.asarray(xs, dtype=np.float64)[order], np.asarray(ys, dtype=np.float64)[order]
    hull: list[int] = []
    px, py = xs.tolist(), ys.tolist()  # Python floats: the same doubles, without numpy's per-scalar cost
    for i in range(len(px)):
        if hull and px[i] == px[hull[-1]]:
            continue
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # drop b if it lies on or above the segment a -> i
            if (py[b] - py[a]) * (px[i] - px[a]) >= (py[i] - py[a]) * (px[b] - px[a]):
                hull.pop()
            else:
                break
        hull.append(i)
    hx, hy = xs[hull], ys[hull]
    return hx, hy, np.diff(hy) / np.diff(hx) if len(hull) > 1 else np.zeros(0)


def hull_vertices(d: np.ndarray, rc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower hull vertices of (0, 0) and the points, without the origin; d in MiB."""
    x = np.concatenate([[0.0], np.asarray(d, dtype=np.float64) / MIB])
    y = np.concatenate([[0.0], np.asarray(rc, dtype=np.float64)])
    hx, hy, _ = lower_hull(x, y)
    return hx[1:], hy[1:]


def absorbed(rc: np.ndarray, eps: float, *, keep_first: bool = False, d: np.ndarray | None = None,
             partial: np.ndarray | None = None) -> np.ndarray:
    """Mask of the points kept when each one that a kept point beats on discard for at most ``eps`` more ms goes.

    Swapping a dropped point for its absorber frees at least as much (at every
    key, with ``partial``: (points, keys) discards finished before each key)
    for at most ``eps`` more, so a plan over the kept points is within ``eps``
    per choice of the best one. Without ``partial`` the points must be a
    frontier (discard and ``rc`` ascending together); ``keep_first`` keeps
    point 0 (a "nothing chosen" option) whatever its neighbours.
    """
    if partial is None:
        keep = np.zeros(len(rc), bool)
        last = math.inf
        for j in range(len(rc) - 1, -1, -1):  # dearest first: the cheapest kept point so far discards more
            if last - rc[j] > eps or (keep_first and j == 0):
                keep[j] = True
                last = rc[j]
        return keep
    order = np.lexsort((d, -rc))  # dearest first: an absorber is kept, never itself absorbed
    cols = np.vstack([np.asarray(d, dtype=np.float64), np.asarray(partial, dtype=np.float64).T])
    kept_cols, kr, kept = np.empty((cols.shape[0], len(order))), np.empty(len(order)), []
    for i in order.tolist():
        v, m = cols[:, i], len(kept)
        if m:
            beats = kr[:m] <= rc[i] + eps
            for r in range(len(v)):  # one row at a time: (kept, keys) reductions cost more
                beats &= kept_cols[r, :m] >= v[r]
            if beats.any():
                continue
        kept_cols[:, m], kr[m] = v, rc[i]
        kept.append(i)
    keep = np.zeros(len(rc), bool)
    keep[kept] = True
    return keep

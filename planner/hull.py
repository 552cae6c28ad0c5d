"""Lower convex hulls of (discard, cost) point sets: the bounds and cuts both solvers use."""

from __future__ import annotations

import numpy as np

__all__ = ["lower_hull"]


def lower_hull(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vertices of the lower convex hull of the points, left to right.

    Returns ``(x, y, slopes)``: the vertices and the slope of each edge
    between consecutive vertices (one fewer). Of points sharing an x, only
    the lowest can be a vertex.
    """
    order = np.lexsort((ys, xs))
    xs, ys = np.asarray(xs, dtype=np.float64)[order], np.asarray(ys, dtype=np.float64)[order]
    hull: list[int] = []
    for i in range(len(xs)):
        if hull and xs[i] == xs[hull[-1]]:
            continue
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # drop b if it lies on or above the segment a -> i
            if (ys[b] - ys[a]) * (xs[i] - xs[a]) >= (ys[i] - ys[a]) * (xs[b] - xs[a]):
                hull.pop()
            else:
                break
        hull.append(i)
    hx, hy = xs[hull], ys[hull]
    return hx, hy, np.diff(hy) / np.diff(hx) if len(hull) > 1 else np.zeros(0)

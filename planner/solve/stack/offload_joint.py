"""A stack block's joint options with offload: one window, one stall on the block's total offload.

A block of the stack is one offload window, and every checkpointed module of
it copies over the same link in the same next window: the window pays
``stall(sum o)``, not each module ``stall(o_c)`` (the stall is convex and 0 at
0, so the sum of the modules' own stalls is at most the window's, and the
difference is what the per-module points leave out: two modules of one layer
each offloading under the window's capacity, together over it).

:func:`joint_block_options` lists the block's joint options (a point per
checkpointed candidate of its subtree, none nested) as 2-D items
``(v = sum of freed bytes, cost = sum of recompute + stall(sum o))``, the ones
no other beats on (more v, no more cost). Children are combined one by one and
an option is dropped only for one that beats it whatever the rest of the block
adds: ``v_A >= v_B`` and ``plain_A + s max(0, o_A - o_B) <= plain_B``, with
``s`` the stall's largest slope (then ``stall(o_A + O) - stall(o_B + O) <= s
max(0, o_A - o_B)`` for any further offload O). Where the block's offload is
credited stays relaxed as before (at each module's end).
"""

from __future__ import annotations

import numpy as np

from planner.solve.stack.offload_items import OffloadPoints, Stall, pareto, undominated

__all__ = ["joint_block_options"]

_MAX_OPTIONS = 50_000  # options of one subtree before pruning; past it the per-module stalls stay (a lower bound)


def joint_block_options(d: list[np.ndarray], rc: list[np.ndarray], starts: list[int],
                        points: dict[int, OffloadPoints], stall: Stall, root: int):
    """(d, rc, choices) of the block at ``root`` as :class:`planner.solve.stack.relaxation.Stack` holds them
    (ascending freed bytes, choices as (candidate, point) pairs), each option paying ``stall`` once on its total
    offload; None when the combinations outgrow ``_MAX_OPTIONS``.

    ``d``, ``rc``: every candidate's points (an offloading one's cost with its own stall, ``stall(o)``);
    ``points``: the offloading candidates' points (``o`` per point, in the same order).
    """
    slope = stall.s_fw + stall.s_bw
    try:
        v, o, plain, ch = _options(d, rc, starts, points, stall, root, slope)
    except _TooMany:
        return None
    cost = plain + stall(o)
    keep = pareto(v, cost)
    return v[keep].astype(np.int64), cost[keep], [ch[i] for i in keep.tolist()]


class _TooMany(Exception):
    pass


def _own(d, rc, points, stall: Stall, c: int):
    """(v, o, cost without stall) of c's own points."""
    v = np.asarray(d[c], dtype=np.int64)
    if c not in points:
        return v, np.zeros(len(v), np.int64), np.asarray(rc[c], dtype=np.float64)
    o = np.asarray(points[c].o, dtype=np.int64)
    return v, o, np.asarray(rc[c], dtype=np.float64) - stall(o)


def _options(d, rc, starts, points, stall: Stall, c: int, slope: float):
    """(v, o, recompute, choices) of c's subtree: c at one of its points, or its children's options combined."""
    v, o, plain, ch = np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1), [()]
    k = c - 1
    while k >= starts[c]:  # children, last first
        kv, ko, kp, kch = _options(d, rc, starts, points, stall, k, slope)
        if len(v) * len(kv) > _MAX_OPTIONS:
            raise _TooMany
        v = (v[:, None] + kv[None, :]).ravel()
        o = (o[:, None] + ko[None, :]).ravel()
        plain = (plain[:, None] + kp[None, :]).ravel()
        ch = [p + q for p in ch for q in kch]
        keep = undominated(v, o, plain, stall)
        v, o, plain, ch = v[keep], o[keep], plain[keep], [ch[i] for i in keep.tolist()]
        k = starts[k] - 1
    ov, oo, op = _own(d, rc, points, stall, c)
    v, o, plain = np.concatenate([v, ov]), np.concatenate([o, oo]), np.concatenate([plain, op])
    ch = ch + [((c, j),) for j in range(len(ov))]
    keep = undominated(v, o, plain, stall)
    return v[keep], o[keep], plain[keep], [ch[i] for i in keep.tolist()]


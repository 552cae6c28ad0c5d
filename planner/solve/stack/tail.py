"""The exact part of the stack relaxation: what the tail of the model needs from the blocks before it.

For the candidates from key ``k0`` on (the last blocks, what follows them,
and ancestors spanning ``k0``), :func:`tail_requirements` lists every
non-dominated pair (t, c): "if the candidates before ``k0`` discard at least
t bytes, the rest can meet every constraint from ``k0`` on at c ms of
recompute". It is the DP of :mod:`planner.solve.dp` run backward over exact
thresholds instead of a grid: at each key the list holds the least
recompute per required discard, a candidate either checkpointed at one of
its frontier points (its discard lowers what is required before it) or
left to its submodules, and every key's need is applied as a floor.

Entries are also tagged with ``free``: candidates before ``k0`` that start at
or after it must stay unchosen (a spanning ancestor was checkpointed).

With offload (``offload``, a :class:`TailStall`), the candidates of one window
share its copy link: an entry also carries the bytes its window offloads so
far (``oc``, of window ``ow``) and each point pays what it adds to the window's
stall, ``stall(oc + o) - stall(oc)``, so the tail's cost holds every window's
stall on its total exactly. Entries are compared only within equal
(``free``, ``ow``): one is dropped for a cheaper one needing no more and
offloading no more in the window (whatever joins the window later then costs
it no more: the stall is convex); once the pass is before a window's first candidate
its entries forget it (nothing more can join it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from planner.solve.problem import Frontiers
from planner.solve.stack.multiset import CountWorkLimit
from planner.solve.trace import TraceTable

__all__ = ["TailList", "TailStall", "tail_requirements"]


@dataclass
class TailList:
    need: np.ndarray  # t: discard required from the candidates before k0
    cost: np.ndarray  # c: recompute of the tail's decisions
    free: np.ndarray  # candidates before k0 starting at or after this stay unchosen
    trace: np.ndarray  # id into the trace table, -1 for no decision
    table: TraceTable

    def choices(self, i: int) -> dict[int, int]:
        """candidate -> frontier index of entry i's decisions."""
        return self.table.choices(int(self.trace[i]))


@dataclass
class TailStall:
    """The offload of the tail's candidates: per candidate its window and per point its offloaded bytes and its
    cost without stall; per window its stall (a function of the window's total offload, 0 at 0)."""

    window: np.ndarray  # per candidate
    first: np.ndarray  # per window: its first candidate (post-order)
    offload: list[np.ndarray]  # per candidate, per point of the budget's frontier: bytes offloaded
    plain: list[np.ndarray]  # per candidate, per point: cost without stall
    stall: list[Callable[[np.ndarray], np.ndarray]]  # per window


class _Builder:
    def __init__(self, fr: Frontiers, k0: int, need: np.ndarray, work_limit: float, held_need: dict,
                 offload: TailStall | None = None):
        self.fr, self.k0, self.need, self.held_need, self.offload = fr, k0, need, held_need, offload
        self.work, self.work_limit = 0, work_limit
        self.table = TraceTable()

    # An entry list is six arrays: need, cost, free, trace id, and a pending
    # (candidate, point) decision (-1 if none) turned into a trace only if the
    # entry survives pruning; with offload two more: the window the entry's
    # offload so far is in (-1 for none) and those bytes.
    def keep(self, e, k: int):
        t, c, f, tr, nc, npt = e[:6]
        if self.offload is None:
            group = f
        else:
            ow, oc = e[6], e[7]
            done = (ow < 0) | (self.offload.first[np.maximum(ow, 0)] >= k)  # no candidate of it is left
            ow, oc = np.where(done, -1, ow), np.where(done, 0, oc)
            group = np.unique(np.stack([f, ow], axis=1), axis=0, return_inverse=True)[1].ravel()
        order = np.lexsort((t, c, group))  # by free group, then cost, then need
        rest = () if self.offload is None else (ow[order], oc[order])
        t, c, f, tr, nc, npt, group = (a[order] for a in (t, c, f, tr, nc, npt, group))
        if self.offload is None:
            keep = _below_every_cheaper(t, group)  # cheaper entries need no less: dominated
        else:  # and offload no more in their window (what joins it later costs them no more: the stall is convex)
            keep = np.ones(len(t), bool)
            for level in np.unique(rest[1]).tolist():
                below = rest[1] <= level
                keep &= ~(rest[1] == level) | _below_every_cheaper(np.where(below, t, np.inf), group)
        t, c, f, tr, nc, npt = (a[keep] for a in (t, c, f, tr, nc, npt))
        new = nc >= 0
        if new.any():
            tr = tr.copy()
            tr[new] = self.table.add(tr[new], nc[new], npt[new])
        none = np.full(len(t), -1)
        return (t, c, f, tr, none, none) + tuple(a[keep] for a in rest)

    def gate(self, e, g: float):
        return (np.maximum(e[0], g),) + tuple(e[1:])

    def take(self, e, r: int):
        """Candidate r checkpointed at each of its points, from every entry."""
        d, rc = self.fr.d[r], self.fr.rc[r]
        self.work += len(e[0]) * len(d)
        if self.work > self.work_limit:
            raise CountWorkLimit
        row = np.repeat(np.arange(len(e[0])), len(d))
        col = np.tile(np.arange(len(d)), len(e[0]))
        start = self.fr.starts[r]
        free = np.minimum(e[2][row], start) if start < self.k0 else e[2][row]
        if self.offload is None:
            return (e[0][row] - d[col], e[1][row] + rc[col], free, e[3][row], np.full(len(row), r), col)
        off, w = self.offload, int(self.offload.window[r])
        before = np.where(e[6][row] == w, e[7][row], 0)  # what r's window offloads after r
        after = before + off.offload[r][col]
        cost = e[1][row] + off.plain[r][col] + (off.stall[w](after) - off.stall[w](before))
        return (e[0][row] - d[col], cost, free, e[3][row], np.full(len(row), r), col, np.full(len(row), w), after)

    def run(self, lo: int, hi: int, e):
        k = hi
        while k > lo:
            r = k - 1
            a = max(self.fr.starts[r], self.k0)
            took = self.take(e, r)
            # checkpointed, r holds its inputs: the discard before its subtree must reach held_need[r] (nothing
            # inside the subtree is chosen, so that is also the discard before k0 when the subtree spans it)
            took = self.gate(took, self.held_need.get(r, -np.inf))
            if a == r:
                e = self.keep(self.gate(_union(e, took), self.need[r]), r)
            else:
                skip = self.keep(self.gate(e, self.need[r]), r)
                below = self.run(a, r, skip)
                took = self.gate(took, float(np.max(self.need[a:r + 1])))
                e = self.keep(_union(below, took), a)
            k = a
        return e


def _below_every_cheaper(t: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Per entry (sorted by group, then cost): whether its t is below every earlier one's of its group. Exact: on
    t's ranks, with each later group shifted below every earlier one, one running minimum serves all groups."""
    if len(t) == 0:
        return np.zeros(0, bool)
    rank = np.unique(t, return_inverse=True)[1].ravel().astype(np.int64)
    _, g = np.unique(group, return_inverse=True)
    g = g.ravel().astype(np.int64)
    key = (int(g.max()) - g) * (int(rank.max()) + 1) + rank
    before = np.concatenate([[np.iinfo(np.int64).max], np.minimum.accumulate(key)[:-1]])
    return key < before


def _union(a, b):
    return tuple(np.concatenate([x, y]) for x, y in zip(a, b))


def tail_requirements(fr: Frontiers, k0: int, need: np.ndarray, *, work_limit: float = 3e6,
                      held_need: dict[int, float] | None = None, offload: TailStall | None = None) -> TailList:
    """Every non-dominated (required discard before k0, recompute) of the decisions from k0 on.

    ``held_need``: candidate -> what the discard before its subtree must reach when it is checkpointed
    (``problem.held_needs``). ``offload``: the points' offload and the windows' stalls, to charge each window's
    stall on its total (the cost is then recompute + stall). Raises
    :class:`planner.solve.stack.multiset.CountWorkLimit` past ``work_limit`` (entry, point) pairs.
    """
    m = len(fr.d)
    b = _Builder(fr, k0, need, work_limit, held_need or {}, offload)
    one = np.ones(1)
    start = (one * need[m], np.zeros(1), np.full(1, k0), np.full(1, -1), np.full(1, -1), np.full(1, -1))
    if offload is not None:
        start += (np.full(1, -1), np.zeros(1, np.int64))
    e = b.run(k0, m, b.keep(start, m))
    return TailList(e[0], e[1], e[2], e[3], b.table)

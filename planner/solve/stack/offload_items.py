"""One checkpointed module's keep / recompute / offload options, projected to (bytes freed, cost) points.

A checkpointed module decides per class of free op groups (``GroupClasses``:
equal bytes and ms, interchangeable) how many it recomputes (``k``) and how
many of the others it offloads (``f``, at most the class's offloadable
groups). With ``w`` and ``r`` a class's bytes and ms:

    v  = sum w (k + f)     bytes freed from the device (recomputed or offloaded), over saving every free group
    o  = sum w f           the offloaded part
    ms = sum r k           recompute

and the option costs ``ms + stall(o)`` with the window's stall (convex,
piecewise linear, 0 up to the link's capacity in the next window's compute).

:func:`offload_points` lists, exactly, every option no other beats on more
``v`` for no more cost. It runs a knapsack over the classes keyed by the
exact offloaded bytes (options with equal ``o`` compare on (v, ms) alone,
whatever classes follow), and bounds ``o``: an option offloading more than
``o_max = a + E + W`` (``a``: where the stall starts; ``E``: the offloadable
bytes of classes whose recompute costs more per byte than the stall's first
slope; ``W``: the largest other offloadable group) offloads a cheap group
lying wholly past ``a``, and recomputing that group instead frees the same
bytes for no more cost and offloads less. So no option past ``o_max`` is
needed, by an optimum of this module alone or of a window it shares (the
window's stall is the sum's, which only grows faster past ``a``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["OffloadPoints", "Stall", "offload_points", "pareto", "undominated"]

_TOL = 1e-12


@dataclass(frozen=True)
class Stall:
    """A window's stall: ``max(0, o s_fw - fw_ms) + max(0, o s_bw - bw_ms)`` (s: ms per byte of each copy)."""

    s_fw: float
    fw_ms: float
    s_bw: float
    bw_ms: float

    def __call__(self, o):
        o = np.asarray(o, dtype=np.float64)
        return np.maximum(0.0, o * self.s_fw - self.fw_ms) + np.maximum(0.0, o * self.s_bw - self.bw_ms)

    def start_and_slope(self) -> tuple[float, float]:
        """(bytes where the stall starts, its slope just past there, ms per byte)."""
        a_fw, a_bw = self.fw_ms / self.s_fw, self.bw_ms / self.s_bw
        if a_fw < a_bw:
            return a_fw, self.s_fw
        if a_bw < a_fw:
            return a_bw, self.s_bw
        return a_fw, self.s_fw + self.s_bw


@dataclass(frozen=True)
class OffloadPoints:
    """A module's undominated options, by ascending v (relative to saving every free group)."""

    v: np.ndarray  # int64 bytes freed
    o: np.ndarray  # int64 bytes offloaded
    ms: np.ndarray  # recompute ms of the free groups
    cost: np.ndarray  # ms + stall(o)
    k: np.ndarray  # (points, classes) groups recomputed per class
    f: np.ndarray  # (points, classes) groups offloaded per class


def offload_points(w: np.ndarray, r: np.ndarray, mult: np.ndarray, offloadable: np.ndarray,
                   stall: Stall, least_early: int = 0, shared: float = 0.0) -> OffloadPoints:
    """Every option of one module no other beats on (more v, no more ms + stall(o)); see the module docstring.

    ``w`` (int bytes), ``r`` (ms), ``mult`` (groups), ``offloadable`` (groups that may be offloaded) per class.
    ``least_early``: options must recompute at least this many bytes, ``v - o >= least_early`` (a checkpointed
    module's early discard stays >= 0: its held inputs less its recompute's bytes). An option that may still
    fall short of it is only dropped for one that has met it (or recomputes as much).

    ``shared``: how many bytes other modules of the window may offload beside this one (the window pays the
    stall on the total): an option is then dropped only for one that beats it whatever the others offload (more
    v, and cheaper on every base from 0 to ``shared``, :func:`undominated`), so the points are every option a
    joint optimum may need, by ascending v (their ``cost`` with this module's own stall).
    """
    w = np.asarray(w, dtype=np.int64)
    r = np.asarray(r, dtype=np.float64)
    n = len(w)
    a, slope = stall.start_and_slope()
    slope_max = stall.s_fw + stall.s_bw
    cheap = r <= slope * w
    able = np.asarray(offloadable, dtype=np.int64)
    o_max = a + float(np.sum((w * able)[~cheap])) + float(np.max(np.where(cheap & (able > 0), w, 0), initial=0))
    v, o, ms = np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1)
    order = np.argsort(-(w * able), kind="stable")  # the most offloadable bytes first: what may follow shrinks fast
    rest = np.concatenate([np.cumsum((w * able)[order][::-1])[::-1][1:], [0]])
    # the most the classes still to come can recompute: an option short of least_early by more never meets it
    reach = np.concatenate([np.cumsum((w * mult)[order][::-1])[::-1][1:], [0]])
    steps = []  # per class, in order: (parent option, recomputed, offloaded) of each option kept
    for q, later, more in zip(order.tolist(), rest.tolist(), reach.tolist()):
        m, top = int(mult[q]), int(able[q])
        pk = np.array([x for x in range(m + 1) for y in range(min(m - x, top) + 1)], np.int64)
        pf = np.array([y for x in range(m + 1) for y in range(min(m - x, top) + 1)], np.int64)
        rows = np.repeat(np.arange(len(v)), len(pk))
        cols = np.tile(np.arange(len(pk)), len(v))
        v = v[rows] + w[q] * (pk[cols] + pf[cols])
        o = o[rows] + w[q] * pf[cols]
        ms = ms[rows] + r[q] * pk[cols]
        alive = np.flatnonzero(v - o + int(more) >= least_early)
        if len(alive) == 0:  # no option recomputes enough
            none = np.zeros(0, np.int64)
            return OffloadPoints(none, none, np.zeros(0), np.zeros(0), np.zeros((0, n), np.int64),
                                 np.zeros((0, n), np.int64))
        keep = alive[_per_v_front(v[alive], o[alive], ms[alive], o_max, slope_max, v[alive] - o[alive] >= least_early)]
        if not shared:  # (it compares options on this module's own stall)
            keep = keep[_beaten_whatever_follows(v[keep], o[keep], ms[keep], stall, min(float(later), o_max),
                                                 v[keep] - o[keep], least_early)]
        v, o, ms = v[keep], o[keep], ms[keep]
        steps.append((q, rows[keep], pk[cols[keep]], pf[cols[keep]]))
    ok = np.flatnonzero(v - o >= least_early)
    if shared:
        keep = ok[undominated(v[ok], o[ok], ms[ok], stall, shared)]
        keep = keep[np.lexsort((ms[keep] + stall(o[keep]), v[keep]))]
    else:
        keep = ok[pareto(v[ok], ms[ok] + stall(o[ok]))]
    k, f = np.zeros((len(keep), n), np.int64), np.zeros((len(keep), n), np.int64)
    at = keep
    for q, parent, pk, pf in reversed(steps):  # back through the classes to each kept option's counts
        k[:, q], f[:, q] = pk[at], pf[at]
        at = parent[at]
    cost = ms[keep] + stall(o[keep])
    return OffloadPoints(v[keep], o[keep], ms[keep], cost, k, f)


def _per_v_front(v: np.ndarray, o: np.ndarray, ms: np.ndarray, o_max: float, slope: float,
                 settled: np.ndarray) -> np.ndarray:
    """Indices of the options within ``o_max`` that no other of equal v beats, whatever follows: B goes when
    some A has ``o_A <= o_B`` and ``ms_A <= ms_B``, or ``o_A > o_B`` and ``ms_A + slope (o_A - o_B) <= ms_B``
    (``slope``: the stall's largest, so A's extra offload costs at most that much more in any completion) and A
    is ``settled`` (recomputes enough already: with more o and equal v it recomputes less than B)."""
    ok = np.flatnonzero(o <= o_max + 0.5)
    order = ok[np.lexsort((ms[ok], o[ok], v[ok]))]  # by v, then least o, then cheapest
    sv, so, sms = v[order], o[order].astype(np.float64), ms[order]
    new = np.concatenate([[True], sv[1:] != sv[:-1]])
    group = np.cumsum(new) - 1
    span = float(np.max(np.abs(sms)) + slope * (np.max(so) if len(so) else 0.0)) + 1.0
    shift = 4.0 * span
    # less or equal o and no more ms, in the same v (a running minimum restarting per group: later groups lie lower)
    t = sms - group * shift
    before = np.concatenate([[np.inf], np.minimum.accumulate(t)[:-1]])
    tol = _TOL * (1.0 + np.abs(sms))
    first = new | (t < before - tol)
    order, sv, so, sms, group, tol = order[first], sv[first], so[first], sms[first], group[first], tol[first]
    # (the survivors' o rises strictly within a v) more o for enough less ms, in the same v: a running minimum
    # from the end over the settled ones, restarting per group
    u = sms + slope * so + group * shift
    after = np.concatenate([np.minimum.accumulate(np.where(settled[order], u, np.inf)[::-1])[::-1][1:], [np.inf]])
    last = np.concatenate([sv[1:] != sv[:-1], [True]])
    keep = last | (u < after - tol)
    return order[keep]


def _beaten_whatever_follows(v, o, ms, stall: Stall, later: float, early: np.ndarray, least: int,
                             levels: int = 32) -> np.ndarray:
    """Indices of the options no other beats on v and on cost, the other's cost at its worst and this one's at
    its best: with at most ``later`` bytes offloaded by what follows, A beats B when ``v_A >= v_B`` and
    ``ms_A + stall(o_A + later) <= ms_B + stall(o_B)`` (then A costs no more than B whatever follows), and A
    is at least as far towards ``least`` early bytes (``early``) as B: it has reached it, or lies on a higher
    one of ``levels`` steps up to it (then every completion B may take, A may take too)."""
    hi = ms + stall(o + later)
    lo = ms + stall(o)
    step = np.full(len(v), levels) if least <= 0 else np.minimum(levels, (early * levels) // least)
    order = np.lexsort((lo, hi, -v))  # most v first; among equals the cheapest at worst first
    h, low, lev = hi[order], lo[order], step[order]
    drop = np.zeros(len(order), bool)
    tol = _TOL * (1.0 + np.abs(low))
    for b in np.unique(lev).tolist():
        beaters = (lev == levels) if b == levels else (lev > b)
        before = np.concatenate([[np.inf], np.minimum.accumulate(np.where(beaters, h, np.inf))[:-1]])
        drop |= (lev == b) & (before <= low + tol)
    return np.sort(order[~drop])


def pareto(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Indices of the points no other beats on more ``x`` for no more ``c``, by ascending x."""
    order = np.lexsort((-x, c))  # cheapest first; among equals the most x first
    xs = x[order].astype(np.float64)
    ok = xs > np.concatenate([[-np.inf], np.maximum.accumulate(xs)[:-1]])
    kept = order[ok]
    return kept[np.argsort(x[kept], kind="stable")]


def undominated(v: np.ndarray, o: np.ndarray, ms: np.ndarray, stall: Stall, others: float = math.inf,
                chunk: int = 512) -> np.ndarray:
    """Indices (ascending) of the options no other beats whatever the rest of their window offloads (0 to
    ``others`` bytes): A beats B when ``v_A >= v_B`` and ``ms_A + stall(o_A + X) - stall(o_B + X) <= ms_B`` for
    every such X. The stall is convex, so that difference moves one way with X: the worst X is ``others`` when
    ``o_A >= o_B`` and 0 otherwise (with ``others`` infinite, the stall's largest slope times ``o_A - o_B``).
    Options are taken in (most v, least ms, least o) order and one goes when an earlier one beats it: the
    relation is transitive, so comparing with every earlier option, dropped or not, keeps exactly the
    undominated ones (and the first of equals)."""
    order = np.lexsort((o, ms, -v))
    so, sm = o[order].astype(np.float64), np.asarray(ms, dtype=np.float64)[order]
    n = len(order)
    dropped = np.zeros(n, bool)
    slope = stall.s_fw + stall.s_bw
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        a, b = so[None, :hi], so[lo:hi, None]  # each earlier A against each B of the chunk
        if math.isinf(others):
            more = slope * np.maximum(a - b, 0.0)
        else:
            more = np.where(a >= b, stall(a + others) - stall(b + others), stall(a) - stall(b))
        worst = sm[None, :hi] + more
        earlier = np.arange(hi)[None, :] < np.arange(lo, hi)[:, None]
        tol = _TOL * (1.0 + np.abs(sm[lo:hi]))
        dropped[lo:hi] = np.any(earlier & (worst <= (sm[lo:hi] + tol)[:, None]), axis=1)
    return np.sort(order[~dropped])

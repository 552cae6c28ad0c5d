"""What completing a partial multiset costs at least: the group relaxation as a search's cost-to-go.

The count search of :mod:`planner.solve.stack.multiset` builds multisets of
deviations (points other than the hull vertices ``a`` and ``b``) item by
item, and keeps a partial one only while it may still lead to a solution
under its cap. Measured over the LP bound alone, that keeps far too much on
collected stats: the lattice (:mod:`planner.solve.stack.group`) lifts the
bound by ~1% of the LP's there (Llama-3 405B, ws128 at 515.3 GiB: LP
527.09 ms, lattice 531.56 ms, optimum 531.56085 ms), and every partial
multiset the LP cannot tell from a good one was extended (0.56 s, then the
work limit).

The group relaxation also bounds what is left to add. Take a partial
multiset L (its items' discards ``x`` bytes over their own vertex, penalty
``p``). The discard of any multiset containing it is, in units ``u`` and
modulo ``G``, ``start + x / u + (the rest's residue steps)``, the vertices
adding nothing (``d_b - d_a`` is a multiple of ``G u``). The rest is at most
n deviations, so its penalty is at least ``dist(r)``, r the residue it
alone would reach from ``start``. So for target e (``X_e`` its need in units,
rounded up, ``t_e = X_e mod G``) every completion costs at least

    lower_e + p + lam (X_e u - need_e) + min over r of [dist(r) + lam u ((r + x / u - t_e) mod G)]
    = lower_e + p + lam (X_e u - need_e) + exc((t_e - x / u) mod G),

``exc`` the same excess table the group relaxation's own bound reads (at
``x = 0`` this is that bound). Residues the paths did not reach cost at least
the relaxation's room (less the n ties a path may skip), so every target's
term is also capped there, and the paths' tie tolerance is taken off as the
relaxation takes it off.
"""

from __future__ import annotations

import numpy as np

from planner.solve.stack.group import GroupRelaxation

__all__ = ["CompletionBound"]


class CompletionBound:
    """The least cost of any multiset containing a partial one, per target, from the group relaxation's paths.

    ``need``, ``lower``: the targets and their LP bounds; ``room``: the relaxation's room (residues it did
    not reach cost at least this much penalty); ``ties``: what its distances may be high by.
    """

    def __init__(self, group: GroupRelaxation, need: np.ndarray, lower: np.ndarray, room: float, ties: float):
        m, u = group.modulus, group.unit
        step = group.lam * u
        ramp = np.arange(m, dtype=np.float64)
        ramp *= step
        g = group.dist + ramp  # inf where not reached
        self.exc = np.minimum.accumulate(g[::-1])[::-1]  # (in place from here: M is up to 2**21 residues)
        np.minimum(self.exc, float(np.min(g)) + step * m, out=self.exc)
        self.exc -= ramp
        x = np.ceil(np.asarray(need, dtype=np.float64) / u)
        self.t = np.mod(x, m).astype(np.int64)
        self.base = np.asarray(lower, dtype=np.float64) + group.lam * (x * u - need) - ties
        self.capped = self.base + room  # unreached residues: at least the room (less the ties it may skip)
        self.bound = group.bound
        self.unit, self.modulus = u, m

    def cheapest(self, cap: float) -> _Targets:
        """The bound over the targets that might still lead under ``cap`` (the others cost at least cap)."""
        live = np.flatnonzero(self.bound < cap)
        return _Targets(self, live)


class _Targets:
    def __init__(self, cb: CompletionBound, live: np.ndarray):
        # targets with the same residue: only the cheapest constant matters
        t, base = cb.t[live], cb.base[live]
        order = np.lexsort((base, t))
        first = np.concatenate([[True], t[order][1:] != t[order][:-1]]) if len(order) else np.zeros(0, bool)
        self.t, self.base = t[order][first], base[order][first]
        self.floor = float(np.min(cb.capped[live])) if len(live) else np.inf
        self.cb = cb
        self.memo = np.full(cb.modulus, np.nan)  # per residue, once worked out: rounds reach the same ones

    def least(self, x: np.ndarray, chunk: int = 1 << 20) -> np.ndarray:
        """Per partial multiset (its discard offsets ``x``, bytes): the least cost, its own penalty left out,
        of any multiset containing it."""
        cb = self.cb
        if len(self.t) == 0:
            return np.full(len(x), self.floor)
        s = np.mod(np.asarray(x, dtype=np.int64) // cb.unit, cb.modulus)
        new = np.unique(s[np.isnan(self.memo[s])])
        rows = max(1, chunk // len(self.t))
        for i in range(0, len(new), rows):
            tt = self.t[None, :] - new[i:i + rows, None]
            tt[tt < 0] += cb.modulus
            self.memo[new[i:i + rows]] = np.minimum(np.min(cb.exc[tt] + self.base[None, :], axis=1), self.floor)
        return self.memo[s]

"""The group relaxation of the count problem: what landing on the discard lattice costs, exactly.

:mod:`planner.solve.stack.multiset` prices a multiset of n points (one per
block) as the LP bound plus its penalties ``pi_p`` plus ``lam`` per byte of
excess discard over the target. On collected stats many points lie exactly
on the LP's line (``pi = 0``): the block's matmul outputs trade bytes for
milliseconds at one rate. Their discards differ by multiples of a large
lattice step ``G`` (16 MiB for a Llama-3-70B layer), so zero-penalty
multisets reach the target only to within ``G``: the excess, not the
penalties, is what separates the integer optimum from the LP bound (1e-4 of
it on such a stack), and enumerating the many zero-penalty multisets to
prove it is hopeless.

Gomory's group relaxation measures it directly. Every discard is a multiple
of ``u`` (the points' gcd); modulo ``G`` every zero-penalty point has the
same residue, so the residue of a multiset's total is ``n r_a`` moved by each
item that takes another point p, by ``delta_p = (d_p - d_a) mod G``. The
excess over a target ``X`` (rounded up to ``u``) is at least
``(residue - X) mod G``. So, for every target at once,

    cost >= LP bound + min over residues r of [ dist(r) + lam * ((r - X) mod G) ],

where ``dist(r)`` is the least penalty of at most n deviations moving the
residue from ``n r_a`` to r: a shortest path on the cycle of ``G / u``
residues (Bellman-Ford, one round per item). Dropping that the zero-penalty
counts must stay in range is the only relaxation; a plan from the path (the
deviations, then zero-penalty points filling up to the target) usually
meets the bound to the last bit, and is then optimal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.solve.stack.cycle import deviation_paths, path_back, rounds_paths

__all__ = ["GroupRelaxation", "group_relaxation"]

# Residues the cycle may have (a divisor of the lattice step is taken past it: a weaker bound, still valid).
_MAX_RESIDUES = 2**21


@dataclass
class GroupRelaxation:
    """Shortest deviation paths on the residue cycle, and the bound they give per target."""

    bound: np.ndarray  # per target: no multiset meeting it costs less (its cost included)
    lam: float
    unit: int  # u: every discard is a multiple
    modulus: int  # G / u residues
    start: int
    delta: np.ndarray  # per point: residue step
    dist: np.ndarray  # per residue: least penalty reaching it
    rounds: list | None  # per round: (residues set, point used), residues ascending; None: any number of rounds
    zero: np.ndarray  # points on the line
    pen: np.ndarray | None = None  # per point: penalty
    use: np.ndarray | None = None  # the deviations searched, one per step
    items: int = 0  # n: no path has more deviations
    tie: float = 0.0
    room: float = math.inf  # residues not reached cost at least this much penalty
    off: float = 0.0  # what the distances may be high by (ties skipped, the any-number search's slack)

    def path(self, end: int) -> list[int] | None:
        """The points of a least-penalty path from the start to residue ``end`` (None if not reached, or, from
        the search of any number of rounds, if none of at most n deviations comes within ties of it).

        A residue improved in round j was reached from one improved in round j - 1 (or the start).
        """
        if not math.isfinite(self.dist[end]):
            return None
        if self.rounds is None:
            return path_back(self.dist, end, self.start, self.delta[self.use], self.pen[self.use], self.use,
                             self.modulus, self.items, self.tie)
        points, node = [], end
        j = next((j for j in range(len(self.rounds) - 1, -1, -1) if self._at(j, node) is not None), -1)
        while j >= 0:
            p = self._at(j, node)
            if p is None:
                return None
            points.append(p)
            node = int((node - self.delta[p]) % self.modulus)
            j -= 1
        return points if node == self.start else None

    def counts(self, d: np.ndarray, n: int, need: float) -> dict[int, int] | None:
        """A multiset (point -> count) meeting ``need`` from the best path for it, zero-penalty points filling up."""
        devs = self.path(self.end(need))
        if devs is None or len(devs) > n:
            return None
        d = np.asarray(d, dtype=np.int64)
        fill = _fill(d[self.zero], n - len(devs), need - int(d[devs].sum()), self.unit * self.modulus)
        if fill is None:
            return None
        out: dict[int, int] = {}
        for p in devs + [int(self.zero[q]) for q in fill]:
            out[p] = out.get(p, 0) + 1
        return out

    def end(self, need: float) -> int:
        """The residue whose path lands cheapest at or above ``need``."""
        x = math.ceil(need / self.unit)
        r = np.flatnonzero(np.isfinite(self.dist))
        return int(r[np.argmin(self.dist[r] + self.lam * self.unit * np.mod(r - x, self.modulus))])

    def _at(self, j: int, node: int) -> int | None:
        """The point that improved ``node`` in round j, if it did."""
        nodes, used = self.rounds[j]
        k = int(np.searchsorted(nodes, node))
        return int(used[k]) if k < len(nodes) and nodes[k] == node else None


def group_relaxation(d: np.ndarray, rc: np.ndarray, n: int, need: np.ndarray, lower: np.ndarray, lam: float,
                     a: int, pi: np.ndarray, upper: float = math.inf, cache: dict | None = None) -> GroupRelaxation | None:
    """The group bound per target (``lower``: the LP bound per target, with ``lam``, ``a`` and ``pi`` of it).

    Bounds at or past ``upper`` (a known multiset's cost) are only said to be at least it: paths costing more
    are not followed. None when it does not apply (nothing on the line but ``a``, or too much work). ``cache``:
    the paths of earlier calls (a sweep's budgets on one segment of the hull share them: only the targets move).
    """
    d = np.asarray(d, dtype=np.int64)
    u = int(np.gcd.reduce(d)) if len(d) else 0
    if u <= 0 or n <= 0 or lam <= 0:
        return None
    zero = np.flatnonzero(pi <= 1e-12 * (1.0 + float(np.max(np.abs(rc)))))  # on the line, up to rounding
    lattice = int(np.gcd.reduce((d[zero] - d[a]) // u)) if len(zero) > 1 else 0
    if lattice <= 1:
        return None
    modulus = _divisor_at_most(lattice, _MAX_RESIDUES)
    step = lam * u
    # no deviations and the worst excess: every useful path costs less; nor does one past the known cost
    room = min(step * modulus, upper - float(np.min(lower)))
    if not room > 0:
        return None
    delta = (d // u - d[a] // u) % modulus
    start = int(n * (int(d[a] // u) % modulus) % modulus)
    use = np.flatnonzero((delta != 0) & (pi < room))
    tie = 1e-12 * (1.0 + float(np.max(np.abs(rc))))
    typical = float(need[int(np.argmin(lower))]) / n
    use = _cheapest_per_step(use, delta, pi, d, typical, tie)
    key = (hash(d.tobytes()), hash(np.asarray(rc).tobytes()), n, a, lam)
    hit = None if cache is None else cache.get(key)
    if hit is not None and hit[0] >= room:  # followed further before: exact wherever this room needs it
        dist, rounds, chosen, slack = hit[1], hit[2], hit[3], hit[4]
    else:  # first any number of deviations over the few no pair undercuts (module cycle)
        dist, slack = deviation_paths(delta[use], pi[use], use, start, modulus, n, room, tie)
        rounds, chosen = None, use
    # improvements below ``tie`` are ignored (shorter paths, whose points leave the rest room), so every
    # distance may be high by n ties: the bound takes them off
    ties = 2 * n * tie
    group, binds = None, False
    if dist is not None:
        if not np.array_equal(chosen, use):
            # Another budget chose other points per residue step (``typical``); the steps are the same and each
            # chosen point is within a tie of its step's least penalty, so the distances are within n ties of
            # this choice's: the bound takes those off too, and the paths take this budget's points (plans
            # over the other budget's points would build plans for its targets).
            rounds, ties = (None if rounds is None else _rechosen(rounds, delta, use)), 3 * n * tie
        group = GroupRelaxation(_bound(dist, lower, need, u, lam, modulus, room, ties + slack), lam, u, modulus,
                                start, delta, dist, rounds, zero, pi, use, n, tie, room, ties + slack)
        if rounds is None and not _floor_met(group, need, room):
            group, binds = None, True
    if group is None:  # at most n deviations, round by round: exact
        dist, rounds = rounds_paths(delta[use], pi[use], use, start, modulus, n, room, tie, undercut=not binds)
        if dist is None:
            return None
        slack, ties = 0.0, 2 * n * tie
        group = GroupRelaxation(_bound(dist, lower, need, u, lam, modulus, room, ties), lam, u, modulus, start,
                                delta, dist, rounds, zero, pi, use, n, tie, room, ties)
    if cache is not None and (hit is None or hit[1] is not dist):
        cache[key] = (room, dist, rounds, use, slack)
    return group


def _bound(dist: np.ndarray, lower: np.ndarray, need: np.ndarray, u: int, lam: float, modulus: int, room: float,
           off: float) -> np.ndarray:
    """Per target: the LP bound, the least excess over the reached residues (or the room, past which no path
    was followed), the rounding of the target to the unit, less ``off`` (the search's ties and slack)."""
    x = np.ceil(np.asarray(need, dtype=np.float64) / u)  # the target in units, rounded up: sums are multiples
    t = np.mod(x, modulus).astype(np.int64)
    lower = np.asarray(lower, dtype=np.float64)
    bound = lower + _excess(dist, lam * u, modulus, t) + lam * (x * u - need) - off
    return np.minimum(bound, lower + room)  # paths past the room: at least that


def _floor_met(group: GroupRelaxation, need: np.ndarray, room: float) -> bool:
    """Whether the least bound (the one the count search starts from) is that of a path of at most n deviations
    (or the room's): then the round-by-round search would find it no higher (within ties and slack).

    The search of any number of deviations gives every residue no more than the least of at most n; where the
    best target's best end has a path of at most n within ties of its distance, the two agree there.
    """
    e = int(np.argmin(group.bound))
    end = group.end(float(need[e]))
    landing = group.lam * group.unit * ((end - math.ceil(float(need[e]) / group.unit)) % group.modulus)
    if float(group.dist[end]) + landing >= room:  # the room's bound: no path counts
        return True
    return group.path(end) is not None


def _excess(dist: np.ndarray, step: float, modulus: int, t: np.ndarray) -> np.ndarray:
    """Per target residue t: min over residues r of dist[r] + step ((r - t) mod modulus).

    Over the reached residues only: those at or past t by a suffix minimum of dist[r] + step r, those before
    it (one turn of the cycle further) by the least of them all.
    """
    r = np.flatnonzero(np.isfinite(dist))
    if len(r) == 0:
        return np.full(len(t), np.inf)
    g = dist[r] + step * r
    suffix = np.concatenate([np.minimum.accumulate(g[::-1])[::-1], [np.inf]])
    after = suffix[np.searchsorted(r, t, side="left")]
    return np.minimum(after, float(g.min()) + step * modulus) - step * t


def _rechosen(rounds: list, delta: np.ndarray, use: np.ndarray) -> list:
    """The rounds with each improving point swapped for the point ``use`` takes for its residue step (kept where
    ``use`` has none: a step past this budget's room)."""
    steps = delta[use]
    order = np.argsort(steps)
    steps, by_step = steps[order], use[order]
    out = []
    for nodes, used in rounds:
        at = np.minimum(np.searchsorted(steps, delta[used]), max(len(steps) - 1, 0))
        same = steps[at] == delta[used] if len(steps) else np.zeros(len(used), bool)
        out.append((nodes, np.where(same, by_step[at] if len(steps) else used, used)))
    return out


def _divisor_at_most(k: int, limit: int) -> int:
    if k <= limit:
        return k
    best = 1
    for q in range(1, math.isqrt(k) + 1):
        if k % q == 0:
            for v in (q, k // q):
                if best < v <= limit:
                    best = v
    return best


def _cheapest_per_step(use: np.ndarray, delta: np.ndarray, pi: np.ndarray, d: np.ndarray, typical: float,
                       tie: float) -> np.ndarray:
    """Of the points moving the residue by the same step, one of least penalty (within ``tie``): the one whose
    discard is nearest ``typical``, so that a path's points leave the rest of the items a reachable target."""
    if len(use) == 0:
        return use
    order = use[np.lexsort((pi[use], delta[use]))]
    step = delta[order]
    head = np.concatenate([[True], step[1:] != step[:-1]])
    least = pi[order][np.cumsum(head) - 1]  # each step's least penalty
    near = order[pi[order] <= least + tie]
    far = np.abs(d[near].astype(np.float64) - typical)
    pick = near[np.lexsort((far, delta[near]))]
    return pick[np.concatenate([[True], delta[pick][1:] != delta[pick][:-1]])]


def _fill(dz: np.ndarray, m: int, need: float, lattice: int, flex: int = 3) -> list[int] | None:
    """m of the points ``dz`` (discards on one lattice) with the least total discard reaching ``need``.

    Totals of m points are ``m min + lattice * offsets``; the smallest reachable offset sum at or above the
    one needed, from m points at the two ends of the range and at most ``flex`` in between.
    """
    lo, hi = int(np.argmin(dz)), int(np.argmax(dz))
    off = (dz - dz[lo]) // lattice
    width = int(off[hi])
    want = max(math.ceil((need - m * int(dz[lo])) / lattice), 0)
    if m == 0:
        return [] if want == 0 else None
    if want > m * width:
        return None
    if width == 0:
        return [lo] * m
    sums: dict[int, tuple] = {0: ()}
    reach = [sums]
    for _ in range(min(flex, m)):  # sums of t in-between points, one list of points per sum
        sums = {s + int(o): items + (q,) for s, items in sums.items() for q, o in enumerate(off.tolist())
                if s + o <= want + width}
        reach.append(sums)
    best: tuple[int, list[int]] | None = None
    for t, sums in enumerate(reach):  # each sum of t points, topped up by whole widths
        for s, items in sums.items():
            k = max(-(-(want - s) // width), 0)
            if k <= m - t and (best is None or s + k * width < best[0]):
                best = (s + k * width, list(items) + [hi] * k + [lo] * (m - t - k))
    if best is None or best[0] > want:  # the ends and a few between may miss a sum more points reach
        exact = _least_reach(off, m, want, width)
        if exact is not None and (best is None or exact[0] < best[0]):
            best = (exact[0], exact[1] + [lo] * (m - len(exact[1])))
    return None if best is None else best[1]


_MAX_REACH = 2e7  # (sum, point) pairs the exact fill may form


def _least_reach(off: np.ndarray, m: int, want: int, width: int) -> tuple[int, list[int]] | None:
    """The least sum at or above ``want`` of at most m offsets ``off`` (their points; the rest take offset 0).

    Breadth first over sums, each reached once with its fewest points: exact. The least such sum is below
    ``want + width`` (drop the largest point of any larger one), so no sum past it is kept. None past
    ``_MAX_REACH``.
    """
    size = want + width
    step = np.unique(off[off > 0])
    if size * max(len(step), 1) > _MAX_REACH:
        return None
    point = np.array([int(np.flatnonzero(off == o)[0]) for o in step.tolist()], dtype=np.int64)
    count = np.full(size, m + 1, dtype=np.int64)
    via = np.full(size, -1, dtype=np.int64)
    count[0] = 0
    front = np.zeros(1, dtype=np.int64)
    for level in range(1, m + 1):
        to = (front[:, None] + step[None, :]).ravel()
        by = np.tile(np.arange(len(step)), len(front))
        ok = to < size
        to, by = to[ok], by[ok]
        fresh = count[to] > level
        to, by = to[fresh], by[fresh]
        if len(to) == 0:
            break
        to, first = np.unique(to, return_index=True)
        count[to], via[to] = level, by[first]
        front = to
    reached = np.flatnonzero(count[want:] <= m)
    if len(reached) == 0:
        return None
    total = want + int(reached[0])
    items, s = [], total
    while s > 0:
        items.append(int(point[via[s]]))
        s -= int(step[via[s]])
    return total, items

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

__all__ = ["GroupRelaxation", "group_relaxation"]

# Residues the cycle may have (a divisor of the lattice step is taken past it: a weaker bound, still valid).
_MAX_RESIDUES = 2**21
_MAX_PAIRS = 1e8  # (residue, deviation) relaxations over all rounds
_CHUNK = 2**14  # (residue, deviation) pairs formed at once


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
    rounds: list  # per round: (residues set, point used), residues ascending
    zero: np.ndarray  # points on the line

    def path(self, end: int) -> list[int] | None:
        """The points of a least-penalty path from the start to residue ``end`` (None if not reached).

        A residue improved in round j was reached from one improved in round j - 1 (or the start).
        """
        if not math.isfinite(self.dist[end]):
            return None
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
        x = math.ceil(need / self.unit)
        r = np.flatnonzero(np.isfinite(self.dist))
        end = int(r[np.argmin(self.dist[r] + self.lam * self.unit * np.mod(r - x, self.modulus))])
        devs = self.path(end)
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
    # improvements below ``tie`` are ignored (shorter paths, whose points leave the rest room), so every
    # distance may be high by n ties: the bound takes them off
    key = (hash(d.tobytes()), hash(np.asarray(rc).tobytes()), n, a, lam)
    hit = None if cache is None else cache.get(key)
    ties = 2 * n * tie
    if hit is not None and hit[0] >= room:  # followed further before: exact wherever this room needs it
        dist, rounds = hit[1], hit[2]
        if not np.array_equal(hit[3], use):
            # Another budget chose other points per residue step (``typical``); the steps are the same and each
            # chosen point is within a tie of its step's least penalty, so the distances are within n ties of
            # this choice's: the bound takes those off too, and the paths take this budget's points (plans
            # over the other budget's points would build plans for its targets).
            rounds, ties = _rechosen(rounds, delta, use), 3 * n * tie
    else:
        dist, rounds = _least_paths(delta[use], pi[use], use, start, modulus, n, room, tie)
        if dist is None:
            return None
        if cache is not None:
            cache[key] = (room, dist, rounds, use)
    x = np.ceil(np.asarray(need, dtype=np.float64) / u)  # the target in units, rounded up: sums are multiples
    t = np.mod(x, modulus).astype(np.int64)
    bound = np.asarray(lower, dtype=np.float64) + _excess(dist, step, modulus, t) + lam * (x * u - need) - ties
    bound = np.minimum(bound, np.asarray(lower, dtype=np.float64) + room)  # paths past the room: at least that
    return GroupRelaxation(bound, lam, u, modulus, start, delta, dist, rounds, zero)


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


def _least_paths(step: np.ndarray, pen: np.ndarray, point: np.ndarray, start: int, modulus: int, n: int,
                 room: float, tie: float):
    """:func:`_paths` over the deviations no pair of others undercuts, where that gives the same distances;
    over them all where it may not.

    Every deviation costs more than ``tie`` (the points off the line), so one undercut by a pair (``p_j + p_k +
    tie <= p_i``, same step) costs more than each of them, and by induction on the penalty every deviation i
    from u to v, kept or not, has ``dist[v] <= dist[u] + p_i + tie`` once the search over the kept ones has
    converged (no improvement left; over the kept ones that is the search's own stopping rule, for i undercut by
    j and k it holds for j then k, the middle residue within the room since ``p_j < p_i``). Along a least path
    of at most n deviations of them all, the found distance is then high by at most n ties, as before; and
    every found distance is the penalty of a real path of no more rounds than it took. So if it converged in at
    most n rounds, the distances are those of the full search (within its ties) and its paths are as short.
    On collected 405B stats two in three deviations are undercut (a step of 64 residues at twice the penalty
    of 32): the search is 3x cheaper. Not converged in n rounds (the kept paths may need more deviations than
    the undercut ones): the full search.
    """
    keep = _undominated(step, pen, modulus, tie)
    if len(keep) < len(step):
        dist, rounds = _paths(step[keep], pen[keep], point[keep], start, modulus, n + 1, room, tie)
        if dist is not None and len(rounds) <= n:
            return dist, rounds
    return _paths(step, pen, point, start, modulus, n, room, tie)


def _undominated(step: np.ndarray, pen: np.ndarray, modulus: int, tie: float) -> np.ndarray:
    """Indices of the deviations (one per step) for which no two others, moving the residue as far together,
    cost at least ``tie`` less."""
    m = len(step)
    if m < 2:  # one deviation: two of itself cost more
        return np.arange(m)
    at = np.full(modulus, -1, dtype=np.int32)  # the deviation per step
    at[step] = np.arange(m, dtype=np.int32)
    gone = np.zeros(m, dtype=bool)
    rows = max(1, _CHUNK * 16 // m)
    for i0 in range(0, m, rows):  # deviations i, every j: the k with step_j + step_k = step_i
        i = np.arange(i0, min(i0 + rows, m))
        rest = step[i][:, None] - step[None, :]
        rest[rest < 0] += modulus
        k = at[rest]
        pair = np.where(k >= 0, pen[None, :] + pen[np.maximum(k, 0)], np.inf)
        gone[i] = (pair + tie <= pen[i][:, None]).any(axis=1)
    return np.flatnonzero(~gone)


def _paths(step: np.ndarray, pen: np.ndarray, point: np.ndarray, start: int, modulus: int, n: int, room: float,
           tie: float):
    """Least penalty per residue over paths of at most n deviations (frontier Bellman-Ford), and each round's
    improvements; (None, None) past the work allowance. No more rounds than needed: fewer than n when nothing
    improved in the last."""
    dist = np.full(modulus, np.inf)
    dist[start] = 0.0
    rounds = []
    changed = np.array([start], dtype=np.int64)
    work = 0
    by_cost = np.argsort(pen, kind="stable")
    step, pen, point = step[by_cost], pen[by_cost], point[by_cost]
    for _ in range(n):
        if len(changed) == 0 or len(step) == 0:
            break
        here = dist[changed]  # this round extends the paths of the last one: their values as they were
        by_here = np.argsort(here, kind="stable")
        changed, here = changed[by_here], here[by_here]
        last = int(np.searchsorted(pen, room - here[0], side="left"))  # every later deviation costs past the room
        work += len(changed) * last
        if work > _MAX_PAIRS:
            return None, None
        hit, by = [], []
        width = max(1, _CHUNK // len(changed))
        for j0 in range(0, last, width):  # a block of deviations at a time, cheapest first
            js = np.arange(j0, min(j0 + width, last))
            rows = int(np.searchsorted(here, room - pen[j0], side="left"))  # the rest cost past the room
            if rows == 0:
                break
            to = changed[:rows, None] + step[js][None, :]
            to[to >= modulus] -= modulus
            cost = here[:rows, None] + pen[js][None, :]
            ok = (cost < dist[to] - tie) & (cost < room)
            if not ok.any():
                continue
            to, cost, col = to[ok], cost[ok], np.nonzero(ok)[1]
            order = np.lexsort((cost, to))  # the cheapest of the block per residue
            to, cost, col = to[order], cost[order], col[order]
            first = np.concatenate([[True], to[1:] != to[:-1]])
            to, cost, col = to[first], cost[first], col[first]
            better = cost < dist[to] - tie
            dist[to[better]] = cost[better]
            hit.append(to[better]), by.append(point[js[col[better]]])
        if not hit:
            break
        to, used = np.concatenate(hit)[::-1], np.concatenate(by)[::-1]
        changed, last = np.unique(to, return_index=True)  # a residue's last improvement is its value
        rounds.append((changed, used[last]))
    return dist, rounds


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

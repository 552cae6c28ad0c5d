"""Least-penalty paths on the residue cycle of :mod:`planner.solve.stack.group`.

A path from the start residue takes deviations (a point off the line: a residue step at a penalty); the
group bound wants, per residue, the least penalty of paths of at most n deviations (one per item). Every
penalty is positive (more than ``tie``: the points on the line move no residue), and on collected stats most
deviations are sums of others: a Llama-3 405B layer's 649 steps are nine, each plus up to four 32-byte
steps at four times the penalty of one. Two searches, the cheap one first:

* over the deviations no pair undercuts by a hair (``tie / 1024``), as many rounds as it takes: the least
  penalty of any number of deviations, below the least of at most n (a valid bound, within ``slack``), and
  equal to it wherever a path of at most n real deviations meets it (:func:`path_back` finds one);
* round by round, at most n: the least penalty of at most n deviations, exactly (within n ties), over the
  deviations no pair undercuts by ``tie`` when that converges within n rounds (the same distances, argued at
  :func:`rounds_paths`), else over them all.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["deviation_paths", "path_back", "rounds_paths"]

_MAX_PAIRS = 1e8  # (residue, deviation) relaxations over all rounds
_CHUNK = 2**14  # (residue, deviation) pairs formed at once
_FINE = 1024  # the unconstrained search's undercut tolerance: tie / _FINE
_STEP = 64  # and its least improvement: tie / _STEP
_SLACK = 8  # its slack is used only while at most _SLACK n ties
# Only for stacks this deep: the fewer the items, the likelier the limit of n binds where the bound is decided
# (Llama-3 8B, 31 items: at a quarter of its budgets, each then searched twice; 70B and 405B, 79 and 125: never)
_DEEP = 64


def deviation_paths(step: np.ndarray, pen: np.ndarray, point: np.ndarray, start: int, modulus: int, n: int,
                    room: float, tie: float):
    """``(dist, slack)``: per residue, at most ``slack`` (besides n ties) below the least penalty of a path of at
    most n deviations, inf past ``room``; ``(None, 0.0)`` when it does not apply or past the work allowance.

    Over the deviations no pair undercuts (``p_j + p_k <= p_i + f``, f = tie / 1024; then ``p_j, p_k < p_i``),
    improvements under ``s = tie / 64`` ignored, to convergence: every kept deviation i from u to v then has
    ``dist[v] <= dist[u] + p_i + s``, and by induction on the penalty every undercut one, replaced by its L
    kept leaves, ``dist[v] <= dist[u] + p_i + L (s + f)``. A path costing C < room has at most
    ``C / (p_min - f)`` leaves in all, so its end's distance is at most ``C + room (s + f) / (p_min - f)``:
    that is the slack (the search follows paths that far past the room, so none costing less is cut off).
    Where it passes ``_SLACK`` n ties (penalties tiny beside the room), or for fewer than ``_DEEP`` items, None.
    """
    if len(step) == 0 or n < _DEEP:
        return None, 0.0
    fine, least = tie / _FINE, tie / _STEP
    slack = room * (least + fine) / (float(pen.min()) - fine)
    if not slack <= _SLACK * n * tie:
        return None, 0.0
    keep = _undominated(step, pen, modulus, -fine)
    hops = int(min(room / float(pen.min()), 4.0 * modulus)) + 2  # no path in the room has more deviations
    # followed ``slack`` past the room: a path costing less than the room is found with its leaves' slack
    dist, rounds = _rounds(step[keep], pen[keep], point[keep], start, modulus, hops, room + slack, least)
    if dist is None or len(rounds) >= hops:
        return None, 0.0
    return dist, slack


def path_back(dist: np.ndarray, end: int, start: int, step: np.ndarray, pen: np.ndarray, point: np.ndarray,
              modulus: int, n: int, tie: float) -> list[int] | None:
    """The points of a path from ``start`` to ``end`` of at most n deviations, each step back taking the dearest
    deviation whose source is within ``tie`` as cheap (fewest deviations, greedily); None past n.

    Each finite distance was set from a residue then at least as cheap by a deviation among ``step`` (the
    searches take theirs from it), so one always qualifies; and each step back lowers the distance by more
    than nothing (every penalty is over ``tie``), so it ends at the start.
    """
    if not math.isfinite(dist[end]):
        return None
    order = np.argsort(-pen, kind="stable")
    step, pen, point = step[order], pen[order], point[order]
    points, node = [], int(end)
    while node != start:
        if len(points) >= n:
            return None
        src = node - step
        src[src < 0] += modulus
        ok = np.flatnonzero(dist[src] + pen <= dist[node] + tie)
        if len(ok) == 0:
            return None
        points.append(int(point[ok[0]]))
        node = int(src[ok[0]])
    return points


def rounds_paths(step: np.ndarray, pen: np.ndarray, point: np.ndarray, start: int, modulus: int, n: int,
                 room: float, tie: float, undercut: bool = True):
    """Least penalty per residue over paths of at most n deviations (frontier Bellman-Ford) and each round's
    improvements (residues ascending, the point that improved each last); (None, None) past the work
    allowance.

    Over the deviations no pair undercuts by ``tie`` (``p_j + p_k + tie <= p_i``) where that search converges
    within n rounds, else over them all. Every deviation costs more than ``tie``, so an undercut one costs
    more than each of its pair, and by induction on the penalty every deviation i from u to v, kept or not,
    has ``dist[v] <= dist[u] + p_i + tie`` once the search over the kept ones has converged (for the kept
    ones that is its stopping rule; for i undercut by j and k it holds for j then k, the middle residue within
    the room since ``p_j < p_i``). Along a least path of at most n deviations the found distance is then high
    by at most n ties, as the full search's; and each found distance is a real path of no more deviations
    than the rounds it took. ``undercut`` False: over them all at once (the limit of n is known to bind).
    """
    keep = _undominated(step, pen, modulus, tie) if undercut else np.arange(len(step))
    if len(keep) < len(step):
        dist, rounds = _rounds(step[keep], pen[keep], point[keep], start, modulus, n + 1, room, tie)
        if dist is not None and len(rounds) <= n:
            return dist, rounds
    return _rounds(step, pen, point, start, modulus, n, room, tie)


def _undominated(step: np.ndarray, pen: np.ndarray, modulus: int, margin: float) -> np.ndarray:
    """Indices of the deviations (one per step) for which no two, moving the residue as far together, cost
    ``margin`` less (a negative margin: no more than a hair more)."""
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
        gone[i] = (pair + margin <= pen[i][:, None]).any(axis=1)
    return np.flatnonzero(~gone)


def _rounds(step: np.ndarray, pen: np.ndarray, point: np.ndarray, start: int, modulus: int, n: int, room: float,
            tie: float):
    """Frontier Bellman-Ford, at most n rounds (fewer when one improves nothing), improvements under ``tie``
    ignored; the distances and each round's improvements, or (None, None) past the work allowance."""
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

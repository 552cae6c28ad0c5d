"""The shortest deviation paths of planner.solve.stack.group against a brute-force search over every deviation."""

import math
import random

import numpy as np
import pytest

from planner.solve.stack.group import group_relaxation

MODULUS = 64  # the zero-penalty points sit 64 bytes apart: the residue cycle
ROOM = 64.0  # lam x bytes per residue x residues: no path costs more than landing a whole turn above the target


def relaxation(steps, pens, n, ends):
    """The group relaxation of a count problem whose off-line points move the residue by ``steps`` at ``pens``
    (lam 1 ms per byte), for targets needing n whole lattice steps and ``ends`` bytes more."""
    d = [0, MODULUS, 2 * MODULUS] + [MODULUS * 3 + s for s in steps]  # residue steps s, gcd 1
    pi = np.array([0.0, 0.0, 0.0] + list(pens))
    rc = np.array(d, dtype=np.float64) + pi
    need = np.array([float(n * MODULUS + e) for e in ends])
    lower = np.zeros(len(ends))
    return group_relaxation(np.array(d, dtype=np.int64), rc, n, need, lower, 1.0, 0, pi)


def brute_dist(steps, pens, n):
    """Least penalty per residue over paths of at most n deviations costing less than the room, every deviation
    tried in every round."""
    dist = np.full(MODULUS, math.inf)
    dist[0] = 0.0
    for _ in range(n):
        nxt = dist.copy()
        for s, p in zip(steps, pens):
            nxt = np.minimum(nxt, np.roll(dist, s) + p)  # residue r + s from r
        dist = nxt
    dist[dist >= ROOM] = math.inf  # no path costing the room is followed
    return dist


def check(steps, pens, n, ends):
    """Every distance between the least penalty of any number of deviations and of at most n; each bound at
    most the exact one (at most n deviations, by brute force), the least as high as the least exact one; each
    path real: at most n deviations landing on its residue at its distance."""
    g = relaxation(steps, pens, n, ends)
    within_n, any_number = brute_dist(steps, pens, n), brute_dist(steps, pens, 2 * MODULUS)
    assert g is not None and g.start == 0 and g.modulus == MODULUS
    reached = np.isfinite(within_n)
    assert np.isfinite(g.dist[reached]).all() and not np.isfinite(g.dist[~np.isfinite(any_number)]).any()
    assert (g.dist[reached] <= within_n[reached] + 1e-9).all()
    assert (g.dist[np.isfinite(g.dist)] >= any_number[np.isfinite(g.dist)] - 1e-9).all()
    landing = (np.arange(MODULUS)[None, :] - np.array(ends)[:, None]) % MODULUS  # bytes above each target
    exact = np.minimum(np.min(within_n[None, :] + landing, axis=1), ROOM)
    assert (g.bound <= exact + 1e-9).all()
    assert g.bound.min() >= exact.min() - 1e-6
    for end in np.flatnonzero(np.isfinite(g.dist)).tolist():
        points = g.path(end)
        if points is None:  # only from the search of any number of deviations, for an end n cannot reach
            assert g.rounds is None and not g.dist[end] >= within_n[end] - 1e-9
            continue
        assert len(points) <= n and sum(int(g.delta[p]) for p in points) % MODULUS == end
        assert math.fsum(pens[p - 3] for p in points) == pytest.approx(g.dist[end], abs=1e-9)
    return g


@pytest.mark.parametrize("seed", range(16))
def test_paths_equal_brute_force(seed):
    # Collected 405B layers have many deviations two cheaper ones undercut (a 64-residue step at twice the
    # penalty of a 32-residue one, and a hair more): half the cases build those in.
    rng = random.Random(seed)
    steps = rng.sample(range(1, MODULUS, 2), 1) + rng.sample(range(2, MODULUS, 2), rng.randrange(1, 6))  # gcd 1
    pens = [round(rng.uniform(0.1, 3.0), 3) for _ in steps]
    if seed % 2:
        for _ in range(4):
            i, j = rng.randrange(len(steps)), rng.randrange(len(steps))
            s = (steps[i] + steps[j]) % MODULUS
            if s and s not in steps:
                steps.append(s)
                pens.append(pens[i] + pens[j] + rng.choice([0.0, 0.001, 0.5]))
    # few items (the limit of n binds) and many (searched as any number of deviations first)
    n = rng.randrange(1, 9) if seed < 6 else rng.randrange(64, 90)
    check(steps, pens, n, rng.sample(range(MODULUS), 4))


def test_undercut_deviations_are_never_searched():
    """Steps 1 and 2, the 2 dearer than two 1s: with 70 deviations allowed the search needs only the 1 (every
    residue within 63 of them; the full search would step by 2 first, then find two 1s cheaper). With 3
    allowed, a target 6 bytes up is reached by three 2s (7.5) or lands 58 bytes past it: the bound is 7.5,
    though six 1s cost 6."""
    g = check([1, 2], [1.0, 2.5], 70, [6, 17, 40])
    assert g.rounds is None or {int(p) for _, used in g.rounds for p in used} == {3}  # point 3: the step of 1
    assert g.path(6) == [3] * 6
    g = check([1, 2], [1.0, 2.5], 3, [6])
    assert g.bound[0] == pytest.approx(7.5) and sorted(g.path(6)) == [4, 4, 4]


def test_a_bound_needing_more_deviations_than_items_is_searched_round_by_round():
    """A 256-residue cycle, steps 1 (1 ms) and 2 (2.5 ms), 64 items, a target 100 residues up: a hundred 1s
    (100 ms) are too many; 36 2s and 28 1s, 118 ms, are the least of 64 (landing 156 past it costs more). The
    search of any number of deviations says 100; the bound must be 118, with its plan's path."""
    d = np.array([0, 256, 512, 768 + 1, 768 + 2], dtype=np.int64)
    pi = np.array([0.0, 0.0, 0.0, 1.0, 2.5])
    g = group_relaxation(d, d + pi, 64, np.array([64 * 256 + 100.0]), np.zeros(1), 1.0, 0, pi)
    assert g.bound[0] == pytest.approx(118.0, abs=1e-6)
    assert sorted(g.path(100)) == [3] * 28 + [4] * 36

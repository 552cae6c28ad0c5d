"""The identical-items knapsack of planner.solve.stack.multiset against brute-force enumeration of multisets."""

import itertools
import math
import random

import numpy as np
import pytest

from planner.solve.stack.multiset import CountWorkLimit, min_cost_counts


def brute(d, rc, n, need, cost):
    """(value, target) of the cheapest target and multiset meeting it, by enumerating every multiset."""
    best = (math.inf, None)
    for combo in itertools.combinations_with_replacement(range(len(d)), n):
        total_d = sum(int(d[p]) for p in combo)
        total_rc = math.fsum(float(rc[p]) for p in combo)
        for e in range(len(need)):
            if total_d >= need[e] and total_rc + cost[e] < best[0] - 1e-12:
                best = (total_rc + cost[e], e)
    return best


def random_case(rng):
    k = rng.randrange(2, 7)
    d = sorted(rng.sample(range(1, 400), k - 1))
    rc = sorted(round(rng.uniform(0.0, 10.0), 3) for _ in range(k - 1))
    if rng.random() < 0.5:  # frontier-like: zero point, more discard costs more
        d, rc = [0] + d, [0.0] + rc
    else:  # any point set
        d, rc = [rng.randrange(0, 400) for _ in range(k)], [round(rng.uniform(0, 10), 3) for _ in range(k)]
    n = rng.randrange(0, 8)
    t = rng.randrange(1, 5)
    need = [rng.randrange(-50, max(d) * max(n, 1) + 50) for _ in range(t)]
    cost = [round(rng.uniform(0, 5), 3) for _ in range(t)]
    return np.array(d, np.int64), np.array(rc), n, np.array(need, np.int64), np.array(cost)


def test_equals_brute_force_on_random_cases():
    rng = random.Random(11)
    solved = none = 0
    for trial in range(400):
        d, rc, n, need, cost = random_case(rng)
        want, _ = brute(d, rc, n, need, cost)
        sol, lower = min_cost_counts(d, rc, n, need, cost, math.inf)
        if want == math.inf:
            assert sol is None, f"trial {trial}"
            none += 1
            continue
        assert sol is not None, f"trial {trial}"
        assert sol.value == pytest.approx(want, abs=1e-9), f"trial {trial}"
        assert lower == sol.value
        # the solution is what it says: n items, meeting its target, at its value
        assert sum(sol.counts.values()) == n
        assert sum(int(d[p]) * c for p, c in sol.counts.items()) >= need[sol.target]
        got = math.fsum([float(rc[p]) * c for p, c in sol.counts.items()] + [float(cost[sol.target])])
        assert got == pytest.approx(sol.value, abs=1e-12)
        solved += 1
    assert solved >= 300 and none >= 5


def test_an_upper_bound_cuts_the_search_and_still_bounds_it():
    rng = random.Random(12)
    checked = 0
    for trial in range(300):
        d, rc, n, need, cost = random_case(rng)
        want, _ = brute(d, rc, n, need, cost)
        if want == math.inf:
            continue
        upper = want * rng.choice([0.9, 1.0, 1.1]) + rng.choice([0.0, 1e-6])
        sol, lower = min_cost_counts(d, rc, n, need, cost, upper)
        if want < upper:
            assert sol is not None and sol.value == pytest.approx(want, abs=1e-9), f"trial {trial}"
        else:
            assert sol is None, f"trial {trial}"
            assert lower <= want + 1e-9  # a proven bound never passes the optimum
        checked += 1
    assert checked >= 200


def test_giving_up_early_returns_a_valid_bound():
    rng = random.Random(13)
    gave_up = 0
    for _ in range(300):
        d, rc, n, need, cost = random_case(rng)
        want, _ = brute(d, rc, n, need, cost)
        sol, lower = min_cost_counts(d, rc, n, need, cost, math.inf, max_gap=1e-4)
        if sol is None and want < math.inf:
            gave_up += 1
            assert lower <= want + 1e-9
        elif sol is not None:
            assert sol.value == pytest.approx(want, abs=1e-9)
    assert gave_up >= 10


def test_running_out_of_work_says_what_it_proved():
    # the bound a search stopped by its work limit carries (issue 28: the lattice's bound on 405B stats, kept
    # where it was dropped) never passes the brute-force optimum
    rng = random.Random(29)
    stopped = 0
    for _ in range(300):
        d, rc, n, need, cost = random_case(rng)
        want, _ = brute(d, rc, n, need, cost)
        try:
            min_cost_counts(d, rc, n, need, cost, math.inf, work_limit=3)
        except CountWorkLimit as e:
            stopped += 1
            assert e.lower is not None and e.lower <= want + 1e-9
    assert stopped >= 10


def test_many_items_near_a_hull_vertex():
    # 20 items; points a few bytes below the hull vertices (the shape of real block frontiers,
    # where tiny ops make near-duplicates): the exact answer still comes back.
    d = np.array([0, 192, 1436, 1439, 1440, 1510, 1511, 1512], np.int64) * 1024 - np.array([0, 0, 8, 4, 0, 4, 8, 0])
    rc = np.array([0.0, 0.338, 3.4195, 3.4211, 3.4221, 3.5811, 3.5816, 3.5826])
    for need in (20 * 192 * 1024 + 5000 * 1024, 20 * 1000 * 1024, 20 * 1500 * 1024):
        sol, _ = min_cost_counts(d, rc, 20, np.array([need]), np.zeros(1), math.inf)
        # reference: a Pareto DP over the 20 items (states: discard so far capped at need -> least ms)
        front = [(0, 0.0)]
        for _ in range(20):
            states = sorted(((min(s + dp_, need), c + rp) for s, c in front
                             for dp_, rp in zip(d.tolist(), rc.tolist())), key=lambda t: (-t[0], t[1]))
            front, low = [], math.inf
            for s_, c in states:  # keep a state only if no state with more discard is as cheap
                if c < low:
                    front.append((s_, c))
                    low = c
        best = {need: min(c for s_, c in front if s_ >= need)}
        assert sol.value == pytest.approx(best[need], abs=1e-9)


def test_work_limit_raises():
    rng = np.random.default_rng(3)
    d = np.sort(rng.integers(1, 10**9, 400))
    rc = np.sort(rng.uniform(0, 10, 400))
    with pytest.raises(CountWorkLimit):
        min_cost_counts(d, rc, 60, np.array([int(d.mean()) * 60 + 12345]), np.zeros(1), math.inf,
                        first_gap=10.0, work_limit=1e4)


def _pareto_dp(d, rc, n, need):
    """The least recompute of n items reaching ``need``: a Pareto DP over the items (states capped at need)."""
    front = [(0, 0.0)]
    for _ in range(n):
        states = sorted(((min(s + dp_, need), c + rp) for s, c in front for dp_, rp in zip(d.tolist(), rc.tolist())),
                        key=lambda t: (-t[0], t[1]))
        front, low = [], math.inf
        for s_, c in states:
            if c < low:
                front.append((s_, c))
                low = c
    return min((c for s_, c in front if s_ >= need), default=math.inf)


@pytest.mark.parametrize("seed", range(6))
def test_points_on_a_lattice_line(seed):
    # The shape of collected layers (issue 28): many points exactly on one line, their discards a whole tensor
    # (the lattice step) apart, a few just off it (small tensors); the LP bound sits below every multiset, and
    # the group relaxation (planner.solve.stack.group) must close the gap exactly.
    rng = random.Random(seed)
    step, lam = 1 << 14, 2.0**-12  # bytes per lattice step, ms per byte (exact in binary)
    on_line = sorted(rng.sample(range(3, 40), 8))
    d = [0] + [q * step - 64 for q in on_line]
    rc = [0.0] + [lam * x + 1.0 for x in d[1:]]
    for _ in range(6):  # off the line: a few bytes less discard, a hair more recompute
        q = rng.choice(on_line)
        d.append(q * step - 64 - rng.choice([32, 96, 4096]))
        rc.append(lam * (q * step - 64) + 1.0 + rng.choice([0.0, 2.0**-9, 2.0**-6]))
    d, rc = np.array(d, np.int64), np.array(rc)
    n = 10
    needs = [rng.randrange(n * 5 * step, n * 35 * step) for _ in range(3)]
    for need in needs:
        want = _pareto_dp(d, rc, n, need)
        for rel_gap in (0.0, 1e-6):
            sol, lower = min_cost_counts(d, rc, n, np.array([need]), np.zeros(1), math.inf, rel_gap=rel_gap)
            assert sol is not None and lower <= want + 1e-9
            assert sol.value <= want * (1 + rel_gap) + 1e-9 and sol.value >= want - 1e-9
            assert sum(sol.counts.values()) == n
            assert sum(int(d[p]) * c for p, c in sol.counts.items()) >= need


def test_the_group_relaxations_plan_fills_the_lattice_exactly():
    """Points on one line at lattice offsets 0, 1, 2, 16, 17, 18 (x 16 bytes), as a Llama-3 405B layer's are
    (its zero-penalty points sit at 0, 1, 2, 16, 17, 18, ... x 16 MiB: bench/RESULTS.md, collected Llama-3 stats,
    306.1 and 166.6 GiB at world size 128). Ten items must reach offset 98 = 4 x 18 + 16 + 5 x 2, which the
    two ends and three points between cannot (their best is 102): the plan built from the group relaxation
    must still meet its bound, with no enumeration (work_limit 1)."""
    lam = 0.001
    d = np.array([0] + [16 * o for o in (1, 2, 16, 17, 18)] + [289], dtype=np.int64)
    rc = lam * d.astype(np.float64)
    rc[-1] += 0.5  # off the line: it makes the discards' gcd 1, so the lattice of 16 shows
    need, cost = np.array([16.0 * 98]), np.zeros(1)
    sol, lower = min_cost_counts(d, rc, 10, need, cost, math.inf, work_limit=1)
    assert sol is not None and sum(int(d[p]) * k for p, k in sol.counts.items()) == 16 * 98
    assert sol.value == pytest.approx(brute(d, rc, 10, need, cost)[0], rel=1e-12)
    assert sol.value == pytest.approx(lam * 16 * 98, rel=1e-12)  # the LP bound: every item on the line


def _few_shaves_per_item(seed, n=60, lattice=50_000):
    """Count problems shaped like a Llama-3 405B layer's (bench/RESULTS.md, issue 28, 405B ws128 at 515.30 GiB):
    two vertices a lattice step apart on the LP's line; below b, shaves of 1-4 bytes at 0.9 of the line's rate,
    at most one per item, and coarser ones; a few deviations adding discard over b or a."""
    rng = np.random.default_rng(seed)
    lam, da, db = 0.01, 3000, 3000 + lattice
    pts = [(0, 0.0), (da, 10.0), (db, 10.0 + lam * lattice)]
    pts += [(db - k, 10.0 + lam * (lattice - k) + 0.9 * lam * k) for k in range(1, 5)]
    for o in (97 * j + k for j in range(1, 60) for k in range(5)):
        pts.append((db - o, 10.0 + lam * (lattice - o) + lam * (0.8 + 0.1 * rng.random()) * o))
    for o in rng.integers(20, 900, 8).tolist():
        pts.append((db + o, 10.0 + lam * (lattice + o) + lam * (1.2 + rng.random()) * o))
    for o in rng.integers(300, 1500, 4).tolist():
        pts.append((da + o, 10.0 + lam * o + lam * (0.85 + 0.2 * rng.random()) * o))
    d, rc = np.array([p[0] for p in pts], np.int64), np.array([p[1] for p in pts])
    need = n * da + int(rng.integers(3, 20)) * lattice + int(rng.integers(0, lattice))
    return d, rc, n, need


@pytest.mark.parametrize("seed", range(3))
def test_few_shaves_per_item_equal_the_milp(seed):
    # The group relaxation's shortest paths take more shaves below b than there are items near b, so its own
    # plan misses its bound; the search under it must prune with the lattice's cost-to-go
    # (planner.solve.stack.completion): pruning with the LP's room alone, these outgrow a work allowance of 1e6
    # label extensions (seeds 0-2). Reference: scipy's MILP (HiGHS) on the counts, its solution checked exactly.
    from scipy.optimize import Bounds, LinearConstraint, milp

    d, rc, n, need = _few_shaves_per_item(seed)
    res = milp(rc, constraints=LinearConstraint(np.vstack([np.ones(len(d)), d.astype(float)]), [n, need], [n, np.inf]),
               integrality=np.ones(len(d)), bounds=Bounds(0, n), options={"mip_rel_gap": 1e-12})
    counts = np.round(res.x).astype(np.int64)
    assert counts.sum() == n and int(counts @ d) >= need
    want = math.fsum((rc * counts).tolist())
    sol, lower = min_cost_counts(d, rc, n, np.array([need]), np.zeros(1), math.inf, work_limit=1e6)
    assert sol is not None and sol.value == pytest.approx(want, rel=1e-12) and lower == sol.value
    assert sum(sol.counts.values()) == n and sum(int(d[p]) * k for p, k in sol.counts.items()) >= need

"""The Lagrangian bound and point fixing the DP relies on, checked by enumeration.

Every claim the DP's pruning makes is checked against every plan of small
random trees: the bound never exceeds a plan's recompute (overall and from
every intermediate DP state), and a plan never uses a point whose penalty
says it cannot beat that plan's own cost. These hold for any duals >= 0, so
random duals are tried as well as the LP's.
"""

import itertools
import math
import random

import numpy as np
import pytest

from planner import plan
from planner.solve.bounds.cost_to_go import CostToGo
from planner.solve.dp import hull_lp, solve_dp
from planner.solve.bounds.lagrange import Lagrange
from planner.solve.problem import key_needs, prepare

from tests.planner.test_plan import GIB, _deep_stats, brute_force, random_stats, realize


def _plans(fr, keyneed):
    """Every feasible plan in DP terms: (cost, {candidate: point index}, discard prefix S_0..S_m)."""
    m = len(fr.d)
    enclosing = [[r for r in range(m) if fr.starts[r] <= i < r] for i in range(m)]
    options = [[None] + list(range(len(fr.d[i]))) for i in range(m)]
    for choice in itertools.product(*options):
        chosen = {i: p for i, p in enumerate(choice) if p is not None}
        if any(r in chosen for i in chosen for r in enclosing[i]):
            continue  # nested checkpoints
        s = np.zeros(m + 1)
        for i in range(m):
            s[i + 1] = s[i] + (float(fr.d[i][chosen[i]]) if i in chosen else 0.0)
        if np.all(s >= keyneed - 1e-6):  # the planner's tolerance (planner.memory_model.NEED_TOL_BYTES)
            yield math.fsum(float(fr.rc[i][p]) for i, p in chosen.items()), chosen, s


def _instances(seed, n, make):
    rng = random.Random(seed)
    for _ in range(n):
        stats = make(rng)
        budget = rng.uniform(0.45, 1.0) * realize(stats, {})[0]
        prob = prepare(stats)
        fr = prob.frontiers()
        if fr is None or not fr.d or math.prod(len(d) + 1 for d in fr.d) > 20_000:
            continue
        yield rng, prob, fr, key_needs(prob, budget)


@pytest.mark.parametrize("make", [random_stats, _deep_stats], ids=["shallow", "deep"])
def test_bound_and_penalties_hold_for_every_plan(make):
    checked = 0
    for rng, prob, fr, keyneed in _instances(11, 60, make):
        status, mu = hull_lp(prob).duals(keyneed)
        plans = list(_plans(fr, keyneed))
        if status == "infeasible":
            assert not plans  # the relaxation is infeasible only if no plan exists
            continue
        assert status == "ok"
        duals = [mu] + [np.array([rng.random() * rng.choice([0, 1e-3, 1]) for _ in mu]) for _ in range(3)]
        for mu_try in duals:
            lag = Lagrange(mu_try, keyneed, fr.starts, fr.d, fr.rc)
            pen = lag.penalties()
            for cost, chosen, s in plans:
                tol = 1e-9 * (1 + cost)
                assert lag.lower <= cost + tol
                for i, p in chosen.items():
                    assert lag.lower + pen[i][p] <= cost + tol
                # from every state the DP holds on the way (keys not inside a chosen subtree)
                for k in range(len(s)):
                    if any(fr.starts[r] < k <= r for r in chosen):
                        continue
                    rest = math.fsum(float(fr.rc[i][p]) for i, p in chosen.items() if i >= k)
                    assert float(lag(k, s[k:k + 1])[0]) <= rest + tol
                checked += 1
        if plans:
            # the LP's duals give the LP optimum, which no plan beats
            best = min(c for c, _, _ in plans)
            assert Lagrange(mu, keyneed, fr.starts, fr.d, fr.rc).lower <= best + 1e-9 * (1 + best)
    assert checked >= 200


def test_tight_gap_request_still_returns_the_optimum():
    """With a loose mip_rel_gap the DP may stop early, but never above the requested gap."""
    rng = random.Random(3)
    compared = 0
    for trial in range(60):
        stats = random_stats(rng)
        budget = rng.uniform(0.55, 1.05) * realize(stats, {})[0]
        expected = brute_force(stats, budget)
        if expected is None:
            continue
        for gap in (1e-6, 0.05):
            p = plan(stats, budget / GIB, solver="dp", mip_rel_gap=gap)
            assert p.status == "optimal", f"trial {trial}"
            assert p.recompute_ms <= expected * (1 + gap) + 1e-9, f"trial {trial}"
            assert p.mip_gap <= gap
            peak, rc = realize(stats, {m.fqn: m.save for m in p.modules})
            assert peak <= budget and rc == pytest.approx(p.recompute_ms, abs=1e-9)
        compared += 1
    assert compared >= 20


@pytest.mark.parametrize("make", [random_stats, _deep_stats], ids=["shallow", "deep"])
def test_gridded_cost_to_go_holds_for_every_plan(make):
    """The grid bound never exceeds what is left to recompute, whatever the bucket width."""
    checked = 0
    for rng, prob, fr, keyneed in _instances(13, 40, make):
        plans = list(_plans(fr, keyneed))
        top = float(max(np.max(keyneed), 0.0))
        bounds = [CostToGo.sized(fr, keyneed, top, 2, cells, 1e6) for cells in (50.0, 1e4, 1e7)]
        for eps in (1.0, 3.0, 97.0):  # widths that are not powers of two, one of them finer than a byte
            bounds.append(CostToGo(fr, keyneed, eps, max(int(math.ceil(top / eps)), 1)))
        for u in bounds:
            for cost, chosen, s in plans:
                for k in range(len(s)):
                    if any(fr.starts[r] < k <= r for r in chosen):
                        continue
                    rest = math.fsum(float(fr.rc[i][p]) for i, p in chosen.items() if i >= k)
                    assert float(u(k, s[k:k + 1])[0]) <= rest + 1e-9 * (1 + rest), (u.eps, k)
                checked += 1
    assert checked >= 200


def test_finishing_after_the_work_limit_keeps_plans_valid_and_gaps_honest(monkeypatch):
    """With no search work allowed, the finishing grid still brackets the true optimum."""
    finishes = []
    sized = CostToGo.sized.__func__

    def spy(cls, *args, **kwargs):
        if "max_grid" in kwargs:
            finishes.append(kwargs["max_grid"])
        return sized(cls, *args, **kwargs)

    monkeypatch.setattr(CostToGo, "sized", classmethod(spy))
    rng = random.Random(17)
    compared = improved = 0
    for trial in range(80):
        stats = random_stats(rng)
        budget = rng.uniform(0.45, 0.95) * realize(stats, {})[0]
        expected = brute_force(stats, budget)
        sol = solve_dp(prepare(stats), budget, work_limit=0, first_gap=1e-9, beam=1)
        if expected is None or sol is None or sol.status == "infeasible":
            continue
        assert sol.status in ("optimal", "feasible")
        peak, rc = realize(stats, {f: save for f, (save, _, _) in sol.decisions.items()})
        assert peak <= budget and rc == pytest.approx(sol.recompute_ms, abs=1e-9)
        tol = 1e-9 * (1 + expected)
        assert sol.recompute_ms >= expected - tol, f"trial {trial}"
        assert sol.recompute_ms * (1 - sol.mip_gap) <= expected + tol, f"trial {trial}"
        unfinished = solve_dp(prepare(stats), budget, work_limit=0, first_gap=1e-9, beam=1, finish_cells=0)
        assert sol.recompute_ms <= unfinished.recompute_ms + tol, f"trial {trial}"
        improved += sol.recompute_ms < unfinished.recompute_ms - tol
        compared += 1
    assert compared >= 20
    assert improved >= 1  # the finishing beam found a cheaper plan somewhere
    assert finishes  # the finishing stage ran

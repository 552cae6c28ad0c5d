"""The ordered count-space relaxation (tight budgets on stacks): brute force over sequences and plans."""

import itertools
import math
import random

import numpy as np
import pytest

import planner.stack as stack_mod
from planner import plan
from planner.stack_order import ordered_counts
from plan_helpers import realize, valid_save
from test_stack import stack_stats

GIB = 2**30


def _brute(d, rc, R, delta, s0, n, need, cost):
    """Cheapest sequence in *any* order: block j may take option p when s0 + discard before it - j delta >= R_p."""
    best = math.inf
    for seq in itertools.product(range(len(d)), repeat=n):
        s, ok = s0, True
        for j, p in enumerate(seq):
            if s - j * delta < R[p] - 1e-6:
                ok = False
                break
            s += d[p]
        if ok:
            for e in range(len(need)):
                if s >= need[e] - 1e-6:
                    best = min(best, cost[e] + sum(rc[p] for p in seq))
    return best


def test_ordered_counts_equal_brute_force_over_every_order():
    # Brute force tries every order of every multiset, so this checks the exchange order too.
    rng = random.Random(3)
    found = 0
    for trial in range(1500):
        n_opt, n = rng.randrange(1, 6), rng.randrange(0, 5)
        d = np.array(sorted(rng.sample(range(0, 60), n_opt)), dtype=np.int64)
        rc = np.cumsum([rng.uniform(0, 3) for _ in range(n_opt)])  # a frontier: more discard costs more
        if rng.random() < 0.3:
            rc = np.array([rng.uniform(0, 5) for _ in range(n_opt)])  # and arbitrary costs
        R = np.array([rng.uniform(-40, 20) for _ in range(n_opt)])
        delta, s0 = rng.uniform(0, 40), rng.uniform(0, 20)
        n_targets = rng.randrange(1, 4)
        need = np.array([rng.uniform(0, 40 * n + 20) for _ in range(n_targets)])
        cost = np.array([rng.uniform(0, 3) for _ in range(n_targets)])
        expected = _brute(d, rc, R, delta, s0, n, need, cost)
        upper = math.inf if rng.random() < 0.7 else expected + rng.uniform(-0.5, 0.5)
        sol, lower = ordered_counts(d, rc, R, delta, s0, n, need, cost, upper, start=0.0)
        if expected < upper:
            assert sol is not None and sol.value == pytest.approx(expected, abs=1e-9), f"trial {trial}"
            s = s0
            for j, p in enumerate(sol.sequence):  # the sequence itself meets every R, in its order
                assert s - j * delta >= R[p] - 1e-6
                s += d[p]
            assert s >= need[sol.target] - 1e-6
            found += 1
        else:
            assert sol is None, f"trial {trial}"
            assert lower <= expected + 1e-9 or not math.isfinite(expected), f"trial {trial}"
    assert found >= 900


def test_tight_budgets_on_stacks_equal_the_exact_milp_and_use_the_ordered_relaxation(monkeypatch):
    # Near the smallest feasible budget every block's own constraints bind; the plain
    # relaxation's counts then often cannot be dealt out, and the ordered one keeps those
    # constraints. Stacks of 8-16 blocks are beyond brute force: the reference is the
    # MILP on scipy.optimize.milp solved to a zero gap (HiGHS, an independent method).
    monkeypatch.setattr("planner.dp._STACK_FIRST_BLOCKS", 3)
    from_ordered = []
    orig = stack_mod._ordered

    def spy(*args, **kwargs):
        res = orig(*args, **kwargs)
        from_ordered.append(res is not None and res.choices is not None)
        return res

    monkeypatch.setattr(stack_mod, "_ordered", spy)
    rng = random.Random(3)
    for trial in range(200):
        stats = stack_stats(rng, rng.randrange(8, 17), n_ops=rng.choice([3, 4]), uniform=True)
        budget = plan(stats, 1e-9).min_feasible_budget_gib * rng.uniform(1.0, 1.03)
        p = plan(stats, budget)
        q = plan(stats, budget, solver="milp", mip_rel_gap=0.0)
        assert p.status == q.status == "optimal", f"trial {trial}: {p.message} / {q.message}"
        assert p.recompute_ms == pytest.approx(q.recompute_ms, rel=1e-9, abs=1e-12), f"trial {trial}"
        peak, rc = realize(stats, {m.fqn: m.save for m in p.modules})
        assert peak <= budget * GIB and rc == pytest.approx(p.recompute_ms, abs=1e-12)
        assert all(valid_save(stats.module(m.fqn).ops, m.save) for m in p.modules)
    assert sum(from_ordered) >= 3  # the ordered relaxation built some of these plans itself

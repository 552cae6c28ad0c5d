"""Modules whose frontier is too long to list (a decoder spanning a whole model): capped frontiers and plans.

Every module is forced down that path (``_FRONTIER_ITEMS`` = 0) on the random
trees of test_plan.py and the stacks of test_stack.py, and the plans must
still equal brute force over the full frontiers.
"""

import math
import random

import numpy as np
import pytest

import planner.solve.giants as giants
from planner import OpStats, plan
from planner.ops.frontier import capped_frontier, frontier_hull, max_discard_decision, module_frontier
from plan_helpers import brute_force, check_plan, random_ops, realize, valid_save
from test_plan import random_stats
from test_stack import stack_stats

GIB = 2**30


def _ops(rng, n):
    while True:
        ops = [OpStats.model_validate(o) for o in random_ops(rng, n)]
        try:
            module_frontier(ops)
            return ops
        except ValueError:  # contradictory SAC rules: not a valid module
            continue


def _saved(ops, save):
    return sum(o.output_bytes for o, s in zip(ops, save) if s), math.fsum(o.runtime_ms for o, s in zip(ops, save) if s)


def test_capped_frontier_is_the_frontier_below_the_cap_plus_the_cheapest_point_past_it():
    rng = random.Random(11)
    for _ in range(150):
        ops = _ops(rng, rng.randrange(1, 9))
        act = sum(o.output_bytes for o in ops) - rng.randrange(0, 300)
        full = module_frontier(ops)
        d_full, rc_full = act - full.saved_bytes, full.recompute_ms
        caps = sorted(set((d_full + rng.choice([-1, 0, 1])).tolist()))
        for cap in [-5.0, 0.0, math.inf, *rng.sample(caps, min(2, len(caps)))]:
            f = capped_frontier(ops, act_saved_bytes=act, max_discard_bytes=cap)
            d, rc = act - f.saved_bytes, f.recompute_ms
            assert sorted(zip(d[d < cap].tolist(), np.round(rc[d < cap], 9).tolist())) == \
                sorted(zip(d_full[d_full < cap].tolist(), np.round(rc_full[d_full < cap], 9).tolist()))
            past = rc_full[d_full >= cap]
            assert len(rc[d >= cap]) == min(len(past), 1)
            if len(past):
                assert rc[d >= cap][0] == pytest.approx(past.min(), abs=1e-9)
            for k in range(len(f)):  # every point is realized by its save list
                save = f.save_list(k)
                assert valid_save(ops, save)
                sb, sm = _saved(ops, save)
                assert sb == f.saved_bytes[k] and sm == pytest.approx(f.saved_ms[k], abs=1e-9)


def test_greedy_hull_lies_under_every_decision_and_reaches_the_largest_discard():
    rng = random.Random(12)
    for _ in range(150):
        ops = _ops(rng, rng.randrange(1, 9))
        act = sum(o.output_bytes for o in ops) - rng.randrange(0, 300)
        full = module_frontier(ops)
        d, rc = act - full.saved_bytes, full.recompute_ms
        hd, hrc = frontier_hull(ops, act_saved_bytes=act)
        pos = d > 0
        if not pos.any():
            assert len(hd) == 0
            continue
        # with the origin (not checkpointing), the hull lies under every point that frees memory
        under = np.interp(d[pos], np.concatenate([[0], hd]), np.concatenate([[0.0], hrc]))
        assert np.all(under <= rc[pos] + 1e-9)
        save, sb, sm = max_discard_decision(ops)
        assert hd[-1] == act - sb == d.max()
        assert full.total_ms - sm == pytest.approx(rc[np.argmax(d)], abs=1e-9)
        assert valid_save(ops, save) and _saved(ops, save) == (sb, pytest.approx(sm, abs=1e-9))


@pytest.fixture
def all_giants(monkeypatch):
    """Every module planned as if its frontier were too long to list; counts which path each budget took."""
    monkeypatch.setattr("planner.solve.problem.FRONTIER_ITEMS", 0)
    seen = {"one point": 0, "capped": 0}
    one, capped = giants.cheapest_discarding, giants.capped_frontier

    def count_one(*a, **k):
        seen["one point"] += 1
        return one(*a, **k)

    def count_capped(*a, **k):
        seen["capped"] += 1
        return capped(*a, **k)

    monkeypatch.setattr(giants, "cheapest_discarding", count_one)
    monkeypatch.setattr(giants, "capped_frontier", count_capped)
    return seen


def _check(stats, budget, expected, p, trial):
    if expected is None:
        assert p.status == "infeasible", f"trial {trial}"
        assert brute_force(stats, p.min_feasible_budget_gib * GIB) is not None  # the reported minimum has a plan
        return False
    assert p.status == "optimal", f"trial {trial}: {p.message}"
    assert p.recompute_ms == pytest.approx(expected, abs=1e-6), f"trial {trial}"
    check_plan(stats, p)
    assert p.peak_bytes <= budget
    return True


def test_plans_from_capped_frontiers_equal_brute_force(all_giants):
    rng = random.Random(2025)
    compared = 0
    for trial in range(80):
        stats = random_stats(rng)
        budget = rng.uniform(0.55, 1.05) * realize(stats, {})[0]
        compared += _check(stats, budget, brute_force(stats, budget), plan(stats, budget / GIB, solver="dp"), trial)
    assert compared >= 30
    assert all_giants["one point"] >= 5 and all_giants["capped"] >= 5  # both paths were taken


def test_stacks_with_spanning_giants_equal_brute_force(all_giants, monkeypatch):
    monkeypatch.setattr("planner.solve.dp.STACK_FIRST_BLOCKS", 3)
    rng = random.Random(77)
    compared = 0
    for trial in range(25):
        stats = stack_stats(rng, 3, spanning=True, peak_at_end=trial % 2 == 0)
        budget = rng.uniform(0.6, 1.0) * realize(stats, {})[0]
        compared += _check(stats, budget, brute_force(stats, budget), plan(stats, budget / GIB, solver="dp"), trial)
    assert compared >= 15

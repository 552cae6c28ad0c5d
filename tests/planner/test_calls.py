"""Modules called more than once (issue 16.7): every call's discard counts over its own span.

The stats describe a module's later calls per moment (``repeat_calls_discarding``,
``repeat_calls_in_backward``); the reference evaluator (plan_helpers.realize,
written from docs/memory-model.md) and brute force check the MILP's plans, and
the DP must decline such stats so ``auto`` lands on the MILP.
"""

import random

import pytest

from planner import Stats, min_feasible_budget_gib, plan
from plan_helpers import brute_force, check_plan, realize
from test_plan import random_stats, with_timeline

GIB = 2**30


def with_later_calls(rng, stats: Stats) -> Stats:
    """``stats`` whose modules with ops are called 2-3 times, later calls discarding at random moments after the
    first call's forward (key past the module) and in their own backward at some others."""
    doc = stats.model_dump()
    post = {f: k for k, f in enumerate(doc["fw_post_order"])}
    shared = [m for m in doc["modules"] if m["ops"] and m["parent"] is not None and rng.random() < 0.6]
    for m in shared:
        m["calls"] = rng.choice([2, 3])
        m["held_input_bytes"] = rng.choice([0, rng.randrange(0, 256)])
    for t in doc["timeline"]:
        for m in shared:
            if t["phase"] != "optimizer" and t["key"] > post[m["fqn"]] and rng.random() < 0.6:
                t.setdefault("repeat_calls_discarding", {})[m["fqn"]] = rng.randrange(1, m["calls"])
            if t["phase"] == "backward" and rng.random() < 0.3:
                t.setdefault("repeat_calls_in_backward", {})[m["fqn"]] = 1
    return Stats.model_validate(doc)


def _repeated(stats: Stats) -> bool:
    return any(t.repeat_calls_discarding for t in stats.timeline)


@pytest.mark.parametrize("solver", ["auto"])  # the DP declines: the MILP plans
def test_every_call_counts_and_plans_equal_brute_force(solver):
    rng = random.Random(1607)
    compared = infeasible = 0
    for trial in range(300):
        stats = with_later_calls(rng, with_timeline(rng, random_stats(rng)))
        if not _repeated(stats):
            continue
        budget = rng.uniform(0.5, 1.0) * realize(stats, {}, 1)[0]
        p = plan(stats, budget / GIB, solver=solver)
        expected = brute_force(stats, budget)
        if expected is None:
            assert p.status == "infeasible", (trial, p.status)
            infeasible += 1
            continue
        assert p.status in ("optimal", "feasible"), (trial, p.status, p.message)
        check_plan(stats, p)  # every call's discard where it is in effect, per the reference evaluator
        assert p.status == "optimal", (trial, p.message)  # held inputs are in the MILP's rows: no re-solve
        assert p.recompute_ms == pytest.approx(expected, abs=1e-6), trial
        compared += 1
    assert compared >= 20 and infeasible >= 1


def test_the_dp_declines_and_says_why():
    rng = random.Random(5)
    stats = next(s for s in (with_later_calls(rng, with_timeline(rng, random_stats(rng))) for _ in range(50))
                 if _repeated(s) and plan(s, 0.8 * realize(s, {}, 1)[0] / GIB, solver="milp").modules)
    with pytest.raises(ValueError, match="called more than once"):
        plan(stats, 0.8 * realize(stats, {}, 1)[0] / GIB, solver="dp")


def test_least_peak_counts_every_call():
    # The smallest budget with a plan (by MILP here) has a plan, and nothing 0.1% below it does (brute force).
    rng = random.Random(77)
    seen = 0
    for _ in range(80):
        stats = with_later_calls(rng, with_timeline(rng, random_stats(rng)))
        if not _repeated(stats) or any(m.held_input_bytes for m in stats.modules):
            continue
        least = min_feasible_budget_gib(stats)
        again = plan(stats, least)
        assert again.status == "optimal", again.message
        check_plan(stats, again)
        assert brute_force(stats, least * GIB * 0.999 - 1) is None
        seen += 1
    assert seen >= 5

"""The plan of every innermost candidate at its largest discard bounds the least peak from above.

``planning`` skips the least-peak DP where that plan already fits the budget, so the bound must hold: checked
against the exact least peak (``solve_min_peak_dp``) on random stacks, with and without a module spanning them.
"""

from __future__ import annotations

import random

import pytest

from planner import plan
from planner.solve.min_peak import innermost_peak_bytes, smallest_peak
from planner.solve.problem import prepare
from planner.solve.solution import needs_peak_bytes
from test_stack import stack_stats


@pytest.mark.parametrize("spanning", [False, True])
def test_innermost_plan_bounds_the_least_peak(spanning):
    rng = random.Random(2807 + spanning)
    above = 0
    for _ in range(12):
        stats = stack_stats(rng, rng.randint(2, 5), spanning=spanning)
        prob = prepare(stats)
        least = smallest_peak(prob)
        assert least.status == "optimal"
        bound = innermost_peak_bytes(prob)
        assert bound >= needs_peak_bytes(prob, least) - 1e-6
        above += bound > needs_peak_bytes(prob, least) + 1.0
        # just below the least peak the budget is infeasible, and says where the smallest budget lies
        p = plan(stats, needs_peak_bytes(prob, least) * (1 - 1e-6) / 2**30)
        assert p.status == "infeasible" and p.min_feasible_budget_gib is not None
    assert above > 0, "the innermost plan is not always the least-peak one: the cases should show it"

"""The host memory cap (``host_budget_gib``): plans offload at most that much in all, in every offload engine,
against brute force over every save / recompute / offload choice with the cap (``offload_helpers``)."""

from __future__ import annotations

import json
import math
import random

import pytest
from offload_helpers import brute_force_offload, evaluate, random_stack
from test_offload_stack import identical_stack

from planner import GIB, min_feasible_budget_gib, plan
from planner.solve.milp import solve_budget
from planner.solve.offload import host_link, offload_setup
from planner.solve.problem import prepare


def test_capped_plans_equal_brute_force():
    """Random 2-3 block stacks: the cap at half (or a quarter) of what the uncapped optimum offloads; the plan
    offloads no more and costs what brute force with the cap finds (more than without it where the cap binds)."""
    rng = random.Random(5)
    compared = binding = 0
    for trial in range(30):
        stats = random_stack(rng, rng.choice([2, 3]))
        gbps = rng.choice([1.0, 3e-4])
        base = evaluate(stats, [], gbps)[0]
        budget = math.floor(rng.uniform(0.6, 0.95) * base)
        free = plan(stats, budget / GIB, offload="on", host_link_gbps=gbps)
        if free.status != "optimal" or not free.host_bytes:
            continue
        cap = math.floor(free.host_bytes * rng.choice([0.25, 0.5]))
        expected = brute_force_offload(stats, budget, gbps, host_budget_bytes=cap)
        p = plan(stats, budget / GIB, offload="on", host_link_gbps=gbps, host_budget_gib=cap / GIB)
        if expected is None:
            assert p.status == "infeasible", (trial, p.message)
            continue
        assert p.status == "optimal", (trial, p.message)
        assert (p.host_bytes or 0) <= cap
        peak, rc, stall = evaluate(stats, [(m.fqn, m.save, m.offload) for m in p.modules], gbps)
        assert peak <= budget and p.step_overhead_ms == pytest.approx(rc + stall, abs=1e-9)
        assert p.step_overhead_ms == pytest.approx(expected, rel=1e-6, abs=1e-9), trial
        compared += 1
        binding += expected > free.step_overhead_ms * (1 + 1e-6) + 1e-9
    assert compared >= 8 and binding >= 3, (compared, binding)


def test_a_one_byte_cap_plans_as_offload_off():
    """No op group is a byte: with a one-byte cap nothing can be offloaded, so the plan is offload='off''s (random
    stacks of offload_helpers at 70% and 80% of their peak, 1 GB/s: offloading alone meets those budgets at no
    cost, recompute-only plans cost 0.5-8.5 ms)."""
    byte = 1 / GIB
    for seed in range(4):
        stats = random_stack(random.Random(seed), 3)
        base = evaluate(stats, [], 1.0)[0]
        for frac in (0.7, 0.8):
            budget = math.floor(frac * base) / GIB
            free = plan(stats, budget, offload="on", host_link_gbps=1.0)
            off = plan(stats, budget)
            on = plan(stats, budget, offload="on", host_link_gbps=1.0, host_budget_gib=byte)
            assert on.status == off.status == "optimal" and on.host_bytes == 0 < free.host_bytes
            assert on.step_overhead_ms == pytest.approx(off.recompute_ms, rel=1e-9) and off.recompute_ms > 0.4
        assert min_feasible_budget_gib(stats, offload="on", host_link_gbps=1.0, host_budget_gib=byte) == \
            min_feasible_budget_gib(stats)


def test_the_stack_engines_keep_the_cap(monkeypatch):
    """On a stack the count-space engines go first; under the cap their plan counts only when it fits it, else
    the MILP (with the cap's row) plans: the same optimum as the MILP's alone, within the cap."""
    monkeypatch.setattr("planner.solve.dp.STACK_FIRST_BLOCKS", 3)
    gbps, checked = 3e-4, 0
    for seed in (0, 1):
        stats = identical_stack(random.Random(seed), 8)
        least = min_feasible_budget_gib(stats)
        budget = least + (plan(stats, 1e6).baseline_peak_bytes / GIB - least) * 0.2
        free = plan(stats, budget, offload="on", host_link_gbps=gbps)
        assert free.status == "optimal" and free.host_bytes > 0
        cap = free.host_bytes // 2
        got = plan(stats, budget, offload="on", host_link_gbps=gbps, host_budget_gib=cap / GIB)
        prob = prepare(stats)
        milp = solve_budget(prob, budget * GIB, time_limit_s=60, mip_rel_gap=1e-9,
                            offload=offload_setup(prob, host_link(stats, gbps)), host_budget_bytes=cap)
        assert got.status == milp.status == "optimal" and got.host_bytes <= cap
        assert got.step_overhead_ms == pytest.approx(milp.overhead_ms, rel=1e-6)
        assert got.step_overhead_ms >= free.step_overhead_ms - 1e-9
        checked += 1
    assert checked == 2


def test_sacplan_plan_with_a_host_cap(tmp_path, capsys):
    from planner.cli import main

    stats = random_stack(random.Random(0), 3)
    path = tmp_path / "stack.json"
    path.write_text(stats.model_dump_json())
    budget = math.floor(0.7 * evaluate(stats, [], 1.0)[0]) / GIB
    args = ["plan", str(path), "--budget-gib", f"{budget:.12g}", "--offload", "on", "--host-link-gbps", "1", "--json"]
    assert main(args) == 0
    free = json.loads(capsys.readouterr().out)["host_bytes"]
    assert free > 0
    assert main(args + ["--host-budget-gib", f"{free / 2 / GIB:.12g}"]) == 0
    assert json.loads(capsys.readouterr().out)["host_bytes"] <= free / 2
    assert main(args + ["--host-budget-gib", "-1"]) != 0
    assert "--host-budget-gib must be a positive number of GiB" in capsys.readouterr().err

"""The MILP with offload (issue 31) against brute force, and offload='off' unchanged.

Brute force and the evaluator (``offload_helpers``) are written from the issue's rules, not from the
planner's code: every save / recompute / offload choice of every op of every module, each plan's peak,
recompute and stall re-derived moment by moment from its save and offload lists.
"""

from __future__ import annotations

import json
import math
import random

import pytest
from offload_helpers import brute_force_offload, evaluate, random_stack
from offload_toy import toy_stats

from planner import GIB, min_feasible_budget_gib, plan, sweep

# link speeds, GB/s, on these tiny stacks (hundreds of bytes per op, ms of compute per block): copies that
# always fit (1 GB/s: 1e6 bytes per ms), that always stall (1e-6, the slowest link taken: 1 byte per ms), and in
# between
SPEEDS = (1.0, 1e-6, 3e-4, 1e-4)


def test_plans_equal_brute_force_over_every_save_recompute_offload_choice():
    rng = random.Random(31)
    compared = offloading = stalling = infeasible = 0
    for trial in range(36):
        stats = random_stack(rng, rng.choice([2, 3]))
        gbps = SPEEDS[trial % len(SPEEDS)]
        base = evaluate(stats, [], gbps)[0]
        budget = math.floor(rng.uniform(0.6, 0.98) * base)
        expected = brute_force_offload(stats, budget, gbps)
        p = plan(stats, budget / GIB, offload="on", host_link_gbps=gbps)
        if expected is None:
            assert p.status == "infeasible", (trial, p.message)
            # the smallest budget it names has a plan (one that may offload), and none has below it (the figure is
            # rounded up to 6 digits: 2e-5 below it is below the least peak)
            least = p.min_feasible_budget_gib
            assert least == min_feasible_budget_gib(stats, offload="on", host_link_gbps=gbps)
            assert plan(stats, least, offload="on", host_link_gbps=gbps).status == "optimal"
            assert brute_force_offload(stats, least * GIB * (1 - 2e-5), gbps) is None
            infeasible += 1
            continue
        assert p.status == "optimal", (trial, p.message)
        peak, rc, stall = evaluate(stats, [(m.fqn, m.save, m.offload) for m in p.modules], gbps)
        assert peak <= budget and p.peak_bytes == math.ceil(peak), trial
        assert p.recompute_ms == pytest.approx(rc, abs=1e-9) and p.offload_stall_ms == pytest.approx(stall, abs=1e-9)
        assert p.step_overhead_ms == pytest.approx(rc + stall, abs=1e-9)
        assert p.step_overhead_ms == pytest.approx(expected, rel=1e-6, abs=1e-9), (trial, gbps)
        assert p.host_bytes == sum(w.offloaded_bytes for w in p.offload_windows) == \
            sum(m.offloaded_bytes or 0 for m in p.modules)
        for m in p.modules:  # every offload is needed: kept on the device instead, any one breaks the budget
            for k, o in enumerate(m.offload or ()):
                if o:
                    rest = [(x.fqn, x.save, x.offload if x is not m else [0 if i == k else v for i, v in
                                                                          enumerate(m.offload)]) for x in p.modules]
                    assert evaluate(stats, rest, gbps)[0] > budget, (trial, m.fqn, k)
        compared += 1
        offloading += p.host_bytes > 0
        stalling += p.offload_stall_ms > 0
    assert compared >= 20 and offloading >= 5 and stalling >= 1 and infeasible >= 1, \
        (compared, offloading, stalling, infeasible)


def test_a_link_too_slow_to_use_plans_the_recompute_of_offload_off():
    rng = random.Random(7)
    for _ in range(6):
        stats = random_stack(rng, 3)
        budget = 0.85 * evaluate(stats, [], 1.0)[0] / GIB
        off, on = plan(stats, budget), plan(stats, budget, offload="on", host_link_gbps=1e-6)
        assert on.status == off.status
        if off.status == "optimal":
            assert on.recompute_ms == pytest.approx(off.recompute_ms, rel=1e-6)
            assert on.step_overhead_ms == pytest.approx(off.recompute_ms, rel=1e-6)


def test_plan_fields_with_offload_on_the_toy():
    # the toy (offload_toy): 21_100 B without checkpointing, at backward key 10
    stats = toy_stats()
    p = plan(stats, 20_500 / GIB, offload="on", host_link_gbps=24)
    assert p.status == "optimal" and p.offload == "on" and p.prefetch_distance == 1
    assert p.host_link_gbps == {"d2h": 24.0, "h2d": 24.0}
    assert [w.end_module for w in p.offload_windows] == ["R.layers.0", "R.layers.1", "R.layers.2", ""]
    assert [(w.forward_ms, w.backward_ms) for w in p.offload_windows] == [(2.0, 4.0), (2.0, 4.0), (1.0, 2.0),
                                                                          (0.0, 0.0)]
    assert p.offload_windows[-1].offloaded_bytes == 0
    w0 = p.offload_windows[0]
    assert w0.d2h_ms == pytest.approx(w0.offloaded_bytes / 24e6) and w0.stall_ms == 0.0
    # the timeline's planned bytes show the offload credit: the plan's peak is its largest moment
    assert max(t.planned_bytes for t in p.timeline) == p.peak_bytes <= 20_500
    doc = p.model_dump(mode="json")
    assert {"offload", "host_bytes", "offload_windows", "step_overhead_ms"} <= set(doc)


def test_offload_off_plans_carry_no_offload_fields():
    stats = toy_stats()
    for p in sweep(stats, [20_300 / GIB, 20_500 / GIB, 1.0]):
        doc = p.model_dump(mode="json")
        assert not {"offload", "host_link_gbps", "host_bytes", "offload_stall_ms", "step_overhead_ms",
                    "offload_windows", "prefetch_distance"} & set(doc)
        assert all("offload" not in m and "offloaded_bytes" not in m for m in doc["modules"])


def test_sacplan_plan_with_offload(tmp_path, capsys):
    from planner.cli import main

    path = tmp_path / "toy.json"
    path.write_text(toy_stats().model_dump_json())
    budget = f"{20_500 / GIB:.12g}"
    assert main(["plan", str(path), "--budget-gib", budget, "--offload", "on", "--host-link-gbps", "24",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["offload"] == "on" and doc["host_link_gbps"] == {"d2h": 24.0, "h2d": 24.0}
    assert len(doc["offload_windows"]) == 4 and doc["prefetch_distance"] == 1
    assert main(["plan", str(path), "--budget-gib", budget, "--offload", "on", "--host-link-gbps", "24"]) == 0
    assert "offloaded GiB" in capsys.readouterr().out
    assert main(["plan", str(path), "--budget-gib", budget, "--offload", "on"]) == 1
    assert "--host-link-gbps is needed with offload 'on'" in capsys.readouterr().err

"""What users print is short and readable (issue 18): plans, planned modules, frontiers."""

from __future__ import annotations

import re
from pathlib import Path

import planner

L4 = Path(__file__).resolve().parents[1] / "data" / "torch_format_transformer_L4.json"


def test_plan_prints_in_a_few_lines_with_its_figures():
    stats = planner.load_stats(L4)
    plan = planner.plan(stats, 4)
    text = str(plan)
    assert repr(plan) == text and len(text.splitlines()) <= 6
    assert text.startswith(f"Plan({plan.status}, budget 4 GiB, world size 1: peak {plan.peak_bytes / 2**30:.4g} GiB")
    assert f"{len(plan.modules)} modules checkpointed" in text
    assert repr(plan.modules[0]) in text and "save=" not in text and "timeline" not in text
    first = plan.modules[0]
    assert repr(first) == (f"PlannedModule({first.fqn}: discard {first.discard_ratio:.3f}, "
                           f"{first.discarded_bytes / 2**30:.4g} GiB freed, recompute {first.recompute_ms:.4g} ms, "
                           f"{sum(first.save)}/{len(first.save)} ops saved)")
    infeasible = planner.plan(stats, 1)
    assert f"smallest budget with a plan {infeasible.min_feasible_budget_gib:g} GiB" in str(infeasible)


def test_frontier_prints_one_line():
    stats = planner.load_stats(L4)
    ops = next(m.ops for m in stats.modules if m.ops and len(m.ops) > 20)
    frontier = planner.module_frontier(ops)
    text = repr(frontier)
    assert "\n" not in text and len(text) < 250
    assert text.startswith(f"Frontier({len(frontier)} points over {len(frontier.groups.members)} op groups")
    assert f"of {frontier.total_bytes:,} bytes" in text


def test_frontier_prints_no_float_noise():
    # L4's attention saves every op at its last point; total - saved was 4.441e-16 ms, not 0 (issue 32)
    stats = planner.load_stats(L4)
    texts = [repr(planner.module_frontier(m.ops)) for m in stats.modules if m.ops]
    assert all(text.endswith("recomputing 0 ms)") for text in texts), [t for t in texts if "e-1" in t]
    assert not any(re.search(r"\de-\d", text) for text in texts)

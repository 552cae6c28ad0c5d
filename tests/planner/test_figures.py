"""Step time and recompute printed on one basis (issue 32): the ops' runtimes, checkpointing's host overhead apart.

Known answers: the split's overhead is each checkpointed module's checkpoint_overhead_ms times its calls (set
here), its ops the recomputed ops' runtimes, read off the plan's save lists; the two add up to the plan's
recompute_ms.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import planner
from planner.cli_plan import plan_table

L4 = Path(__file__).resolve().parents[1] / "data" / "torch_format_transformer_L4.json"


def _with_overhead(overhead_ms: float) -> planner.Stats:
    doc = planner.load_stats(L4).model_dump(mode="json")
    for m in doc["modules"]:
        if m.get("ops"):
            m["checkpoint_overhead_ms"] = overhead_ms
    return planner.parse_stats(doc)


@pytest.mark.parametrize("overhead_ms", [0.0, 0.5, 50.0])
def test_split_adds_up_to_the_plans_recompute(overhead_ms):
    stats = _with_overhead(overhead_ms)
    plan = planner.plan(stats, 4)
    split = planner.recompute_split(stats, plan)
    assert plan.modules
    want_overhead = math.fsum(overhead_ms * stats.module(m.fqn).calls for m in plan.modules)
    want_ops = math.fsum(op.runtime_ms * stats.module(m.fqn).calls for m in plan.modules
                         for op, s in zip(stats.module(m.fqn).recompute_ops, m.save) if not s)
    assert split.overhead_ms == pytest.approx(want_overhead)
    assert split.ops_ms == pytest.approx(want_ops)
    assert split.total_ms == pytest.approx(plan.recompute_ms)
    assert split.ops_share == pytest.approx(want_ops / planner.compute_ms(stats))
    assert split.overhead_dominates is (want_overhead > want_ops)


def test_plan_table_states_the_basis_and_explains_a_dominating_overhead():
    small = _with_overhead(0.001)
    table = plan_table(small, planner.plan(small, 4))
    assert "step             81.118 ms forward + backward: the ops' runtimes alone" in table
    assert "% of the step's 81.118 ms of ops) + host overhead " in table
    assert "host overhead    " not in table  # the kernels dominate: no explanation needed
    large = _with_overhead(50.0)
    table = plan_table(large, planner.plan(large, 4))
    assert "host overhead    checkpointing's own work on the host" in table


def test_without_overhead_the_recompute_is_ops_alone():
    stats = planner.load_stats(L4)  # PyTorch's format: no checkpoint overhead
    plan = planner.plan(stats, 4)
    assert planner.recompute_split(stats, plan).text() == (
        f"{plan.recompute_ms:.3f} ms of ops ({plan.recompute_ms / plan.compute_ms:.1%} of the step's "
        f"{plan.compute_ms:.3f} ms of ops)")
    assert planner.recompute_split(stats, planner.plan(stats, 1)) is None  # infeasible: no recompute figure
